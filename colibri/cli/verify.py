"""`coli verify --model DIR [--json]`: read every shard of a container back and compare it with
the per-shard checksums `coli convert` recorded in colibri.json (colibri/model/shard_sums.py).
Exit code 0 when every shard matches (or the container predates checksums, which is said), 2
when a shard differs: the message names the shard and the byte ranges."""
import json
import sys

from colibri.errors import UserError
from colibri.model.paths import model_arg, model_path
from colibri.model import container_scan as cs
from colibri.model import shard_sums

HELP = "check every shard of a model against the checksums recorded at conversion"
DESCRIPTION = HELP + (". Damaged shards are named with the byte ranges that differ; exit code 0 when all match "
                      "(or none were recorded), 2 when a shard differs.")


def add_arguments(p):
    model_arg(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args):
    if not args.model:
        raise UserError("no model given; pass --model DIR (or set COLI_MODEL)")
    d = model_path(args.model)
    try:
        man = cs.read_manifest(d)
    except cs.ContainerError as e:
        raise UserError(str(e)) from None
    status, lines = shard_sums.verify(d, man)
    code = 2 if status == "fail" else 0
    if args.json:
        print(json.dumps({"model": str(d), "status": status, "detail": lines, "exit_code": code}, indent=1))
        return code
    out = sys.stdout if status == "pass" else sys.stderr
    for ln in lines:
        print(f"{'damaged: ' if status == 'fail' else ''}{ln}", file=out)
    if status == "fail":
        print(f"fix: {shard_sums.FIX}", file=sys.stderr)
    elif status == "warn":
        print("nothing was checked; re-convert with this colibri (`coli convert SRC OUT`) to record checksums",
              file=sys.stderr)
    return code
