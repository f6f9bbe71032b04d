"""The launcher's internals, one folder per concern: server/ (the HTTP gateway's parts),
chat_template/ (the Jinja2 subset that renders prompts), convert/ (checkpoint → container),
cli/ (one module per `coli` subcommand), model/ (the local store and container checks),
machine/ (hardware probes and tuned profiles), engine_client (the engine protocol, Python side).
The top-level modules (coli, openai_server.py, resource_plan.py, ...) are the entry points."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the checkout: build/, c/, web/ are found from here
