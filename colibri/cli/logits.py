"""`coli logits`: teacher-forced logits for token ids, the reference check against transformers."""
import subprocess

from colibri import engine_client, launch_opts
from colibri.cli.common import parse_ids
from colibri.limits import DEFAULT_BATCH, DEFAULT_BATCH_AMX, DEFAULT_SPIN
from colibri.model.paths import model_arg, require_model

HELP = "teacher-forced logits for token ids, written as raw float32 [len(ids), vocab]"


def add_arguments(lg):
    model_arg(lg)
    lg.add_argument("--ids", required=True, help="comma-separated token ids")
    lg.add_argument("--out", required=True, help="output file: little-endian float32, len(ids) rows of vocab values, "
                    "row i the logits after reading ids[0..i]")
    lg.add_argument("--mtp-out", dest="mtp_out", metavar="FILE",
                    help="also the MTP head's logits, float32 [len(ids) - 1, vocab]: row i from position i's state and "
                         "ids[i + 1], the prediction of ids[i + 2] (containers with an MTP layer)")
    launch_opts.add_engine_flags(lg, ("ctx", "threads", "batch", "spin", "kv") + launch_opts.STREAM_FLAGS + ("kernels",),
                                 group=None, threads={"help": "compute threads (default: all cores)"},
                                 spin={"help": f"{launch_opts.SPIN_HELP} (default {DEFAULT_SPIN})"},
                                 batch={"help": f"positions per forward pass during prefill (default {DEFAULT_BATCH}, "
                                                f"{DEFAULT_BATCH_AMX} with AMX kernels; 1 = token by token)"},
                                 kv={"help": "KV cache element type (default f32 here: K/V kept exactly, as a reference "
                                             "check needs; f16 or bf16 show what serving computes)"})


def run(args):
    d = require_model(args)
    ids = parse_ids(args.ids)
    launch_opts.check_ctx(args.ctx, launch_opts.manifest(d)["arch"])
    launch_opts.check_cap(args.cap, launch_opts.manifest(d)["arch"])
    launch_opts.check_spin(args.spin)
    exe = engine_client.ensure_built()
    r = subprocess.run([str(exe), "logits", "--model", str(d), "--ids", ",".join(map(str, ids)),
                        "--out", args.out] + (["--mtp-out", args.mtp_out] if args.mtp_out else [])
                       + launch_opts.engine_args(args), env=engine_client.engine_env(args.spin))
    return r.returncode
