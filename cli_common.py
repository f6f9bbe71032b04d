"""Pieces every `coli` subcommand module shares: the user-facing error type and model lookup."""
import os
from pathlib import Path


class UserError(Exception):
    """An error the user can fix; `coli` prints it without a traceback and exits 2."""


def model_arg(parser):
    parser.add_argument("--model", default=os.environ.get("COLI_MODEL"),
                        help="model directory (a converted container) or a pulled name such as smollm2; "
                             "default $COLI_MODEL")


def require_model(args):
    """Returns the container directory named by --model/COLI_MODEL, or raises UserError saying what to do."""
    if not args.model:
        raise UserError("no model given: pass --model DIR (or a pulled name such as --model smollm2) or set "
                        "COLI_MODEL; `coli pull smollm2` fetches a small one, `coli convert SRC OUT` converts yours")
    d = Path(args.model)
    if not d.is_dir():
        import model_store  # short names: the local model store, pulled on first use
        found = model_store.resolve_model(args.model, fetch=True)
        if found is None:
            pulled = ", ".join(model_store.list_models()) or "none"
            raise UserError(f"--model {d}: no such directory or pulled model (pulled: {pulled}); "
                            "`coli pull smollm2` fetches one")
        d = Path(found)
    if not (d / "colibri.json").is_file():
        if (d / "config.json").is_file():
            raise UserError(f"{d} is a Hugging Face checkpoint, not a colibri container; convert it first: "
                            f"coli convert {d} OUT")
        raise UserError(f"{d} is not a colibri container (no colibri.json)")
    return d
