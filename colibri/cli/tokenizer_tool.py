"""What `coli tokenize` and `coli detokenize` share: the flags, and running the engine's
tokenizer tool with the rest of the command line."""
import argparse
import subprocess

from colibri import engine_client
from colibri.model.paths import model_arg, require_model

TAKES_REST = True  # flags coli does not know belong to the engine's tool


def add_arguments(t):
    model_arg(t)
    t.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the engine's tokenizer tool")


def tokenizer_tool(args, which):
    rest = list(args.rest)  # `coli tokenize TEXT --model M`: the remainder swallowed --model
    for i, a in enumerate(rest):
        if a == "--model" and i + 1 < len(rest):
            args.model = rest[i + 1]
            del rest[i:i + 2]
            break
        if a.startswith("--model="):
            args.model = a.split("=", 1)[1]
            del rest[i]
            break
    args.rest = rest
    d = require_model(args)
    exe = engine_client.ensure_built()
    argv = [str(exe), which, "--model", str(d)] + args.rest
    return subprocess.run(argv, env=engine_client.engine_env()).returncode
