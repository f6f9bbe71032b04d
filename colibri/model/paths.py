"""What a --model value names: the flag itself, the directory or pulled name it resolves to, and
the checks every command makes before the engine reads the container."""
import difflib
import os
from pathlib import Path

from colibri.errors import UserError
from colibri.model import container_scan
from colibri.model import store as model_store  # short names: the local model store


def model_arg(parser):
    parser.add_argument("--model", default=os.environ.get("COLI_MODEL"),
                        help="model directory (a converted container) or a pulled name such as smollm2; "
                             "default $COLI_MODEL")


def model_path(name, fetch=False):
    """The path a --model value names: the directory (or file) itself when it exists, else the
    container of a pulled name in the model store (pulled now when fetch is true and the name
    is one `coli pull` knows). A name found nowhere comes back unchanged, for the caller to refuse."""
    p = Path(name)
    if os.path.lexists(p):
        return p
    found = model_store.resolve_model(name, fetch=fetch)
    return Path(found) if found is not None else p


def missing_model_message(name):
    """What a --model found nowhere says: the closest pulled or built-in name when one is close
    (a typo is likelier than a model nobody has), else how to pull one."""
    pulled = model_store.list_models()
    head = f"--model {name}: no such directory or pulled model (pulled: {', '.join(pulled) or 'none'})"
    if name in model_store.BUILTIN:
        return f"{head}; `coli pull {name}` fetches it"
    known = pulled + [b for b in model_store.BUILTIN if b not in pulled]
    near = difflib.get_close_matches(name, known, n=1, cutoff=0.75) if "/" not in name else []
    if near:
        return f"{head}; did you mean {near[0]}?"
    return f"{head}; `coli pull smollm2` fetches a small one, `coli pull hf:ORG/REPO` any other"


def require_model(args, fetch=True):
    """Returns the container directory named by --model/COLI_MODEL, or raises UserError saying what to do.
    fetch: pull a known name that is not in the store yet (read-only commands pass False).
    Checks what every command needs before the engine starts: a readable manifest, and shards that
    exist with headers the engine will accept (headers only, no weights are read)."""
    if not args.model:
        raise UserError("no model given: pass --model DIR (or a pulled name such as --model smollm2) or set "
                        "COLI_MODEL; `coli pull smollm2` fetches a small one, `coli convert SRC OUT` converts yours")
    d = model_path(args.model, fetch=fetch)
    if not os.path.lexists(d):
        raise UserError(missing_model_message(args.model))
    if not d.is_dir():
        raise UserError(f"--model {d} is a file, not a container directory; pass the directory holding colibri.json")
    if not os.path.lexists(d / "colibri.json") and (d / "config.json").is_file():
        raise UserError(f"{d} is a Hugging Face checkpoint, not a colibri container; convert it first: "
                        f"coli convert {d} OUT")
    try:
        container_scan.scan(d)
        check_arch(d)
    except container_scan.ContainerError as e:
        raise UserError(str(e)) from None
    except OSError as e:  # an unreadable manifest or shard
        raise UserError(f"{e.filename or d}: {e.strerror or e}; check the model directory's permissions") from None
    return d


# the geometry every command reads before the engine does (c/model/model_load.c checks the rest)
ARCH_KEYS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
             "max_position_embeddings")


def check_arch(d):
    arch = container_scan.read_manifest(d)["arch"]
    bad = [k for k in ARCH_KEYS if not (isinstance(arch.get(k), int) and not isinstance(arch.get(k), bool)
                                        and arch[k] >= 1)]
    if bad:
        raise UserError(f"{d / 'colibri.json'} is damaged: arch.{bad[0]} is missing or not a positive integer"
                        f"{f' (and {len(bad) - 1} more)' if len(bad) > 1 else ''}; re-run coli convert "
                        f"(`coli doctor --model {d}` checks the rest)")
