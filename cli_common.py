"""Pieces every `coli` subcommand module shares: the user-facing error type and model lookup."""
import os
from pathlib import Path


class UserError(Exception):
    """An error the user can fix; `coli` prints it without a traceback and exits 2."""


def model_arg(parser):
    parser.add_argument("--model", default=os.environ.get("COLI_MODEL"),
                        help="model directory (a converted container); default $COLI_MODEL")


def require_model(args):
    """Returns the container directory named by --model/COLI_MODEL, or raises UserError saying what to do."""
    if not args.model:
        raise UserError("no model given: pass --model DIR or set COLI_MODEL (convert one with `coli convert SRC OUT`)")
    d = Path(args.model)
    if not d.is_dir():
        raise UserError(f"--model {d}: no such directory")
    if not (d / "colibri.json").is_file():
        if (d / "config.json").is_file():
            raise UserError(f"{d} is a Hugging Face checkpoint, not a colibri container; convert it first: "
                            f"coli convert {d} OUT")
        raise UserError(f"{d} is not a colibri container (no colibri.json)")
    return d
