"""What several `coli` subcommands share: the storage flags of the commands that write a
container, and the --ids list of those that take token ids."""
import subprocess

from colibri import engine_client
from colibri.convert import recipes, tensor_types
from colibri.errors import UserError
from colibri.limits import DENSE_STORAGE, EXPERT_STORAGE, STORAGE_ALIASES


def add_storage_flags(p):
    """--experts / --dense / --tensor-type: how `coli convert` and `coli pull` store the weights."""
    alias = lambda name: STORAGE_ALIASES.get(name, name)  # noqa: E731
    also = ", ".join(f"{a} (= {c})" for a, c in STORAGE_ALIASES.items())
    p.add_argument("--experts", default=None, choices=EXPERT_STORAGE, type=alias,
                   help=f"routed-expert storage (default q4; mxfp4 for MXFP4 sources, kept as they ship; also {also})")
    p.add_argument("--dense", default=None, choices=DENSE_STORAGE, type=alias,
                   help=f"dense trunk storage (default q8; also {also})")
    p.add_argument("--tensor-type", action="append", default=[], metavar="CLASS=TYPE",
                   help="store one tensor class in another type than --experts/--dense give it (repeatable); "
                        f"classes: {', '.join(tensor_types.CLASSES)}; `down` is every down projection, `attn_v` every GQA value "
                        "projection")
    p.add_argument("--quant", default=None, choices=sorted(recipes.RECIPES),
                   help="a named setting measured against llama.cpp's quants (docs/kl_pareto.md): "
                        + "; ".join(f"{n}: {r['about']}" for n, r in recipes.RECIPES.items())
                        + ". --experts, --dense and --tensor-type beside it override its parts")


def storage_of(args, log):
    """(experts, dense, tensor types) from --quant and the flags beside it (recipes.resolve)."""
    return recipes.resolve(getattr(args, "quant", None), args.experts, args.dense, tensor_types_of(args), log)


def tensor_types_of(args):
    """--tensor-type values -> {class: storage}, or UserError saying what is wrong with one."""
    try:
        return tensor_types.parse(args.tensor_type)
    except ValueError as e:
        raise UserError(str(e)) from None


def parse_ids(text):
    """--ids 1,2,3 -> [1, 2, 3], or UserError saying what the flag takes."""
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--ids must be comma-separated integers, got '{text}'") from None
    if not ids or min(ids) < 0:
        raise UserError("--ids must list at least one non-negative token id")
    return ids


def tokenize_file(model_dir, path):
    """The ids of a text file as `coli perplexity` scores them (the engine's tokenizer, BOS added)."""
    exe = engine_client.ensure_built()
    r = subprocess.run([str(exe), "tokenize", "--model", str(model_dir), "--ids-only", "--no-special", "--add-special",
                        "--file", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        raise UserError(f"tokenizing {path} failed: {r.stderr.strip() or f'exit code {r.returncode}'}")
    try:
        return [int(x) for x in r.stdout.strip().split(",") if x]
    except ValueError:
        raise UserError(f"the engine's tokenizer printed something other than ids: {r.stdout[:200]!r}") from None
