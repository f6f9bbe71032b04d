"""`coli serve`: an OpenAI-compatible (and Anthropic Messages, ollama) HTTP server around one
engine. The command is this module; the server itself is colibri/server/app.py, which `coli web`
shares."""
from colibri.server.app import DESCRIPTION, HELP, add_arguments, run  # noqa: F401
