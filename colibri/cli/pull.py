"""`coli pull NAME`: the command; the store itself (sources, checksums, layout) is colibri/model/store.py."""
import sys

from colibri.cli.common import add_storage_flags
from colibri.model import store

HELP = "download a model into the local store and convert it once (smollm2, hf:ORG/REPO[:TAG])"
DESCRIPTION = store.__doc__


def add_arguments(p):
    p.add_argument("name", nargs="?", help="smollm2, or hf:ORG/REPO[:TAG]; without a name, list the pulled models")
    add_storage_flags(p)


def run(args):
    if not args.name:
        names = store.list_models()
        print(f"model store: {store.models_dir()}")
        for n in names:
            print(f"  {n}")
        if not names:
            print("  (empty; try `coli pull smollm2`)")
        return 0
    dest = store.pull(args.name, experts=args.experts, dense=args.dense)
    print(dest)
    short = args.name
    print(f"use it with --model {short} (or --model {dest})", file=sys.stderr)
    return 0
