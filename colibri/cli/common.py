"""What several `coli` subcommands share: the storage flags of the commands that write a
container, and the --ids list of those that take token ids."""
from colibri.errors import UserError
from colibri.limits import DENSE_STORAGE, EXPERT_STORAGE


def add_storage_flags(p):
    """--experts / --dense: how `coli convert` and `coli pull` store the weights."""
    p.add_argument("--experts", default=None, choices=EXPERT_STORAGE,
                   help="routed-expert storage (default q4; mxfp4 for MXFP4 sources, kept as they ship)")
    p.add_argument("--dense", default="q8", choices=DENSE_STORAGE, help="dense trunk storage (default q8)")


def parse_ids(text):
    """--ids 1,2,3 -> [1, 2, 3], or UserError saying what the flag takes."""
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--ids must be comma-separated integers, got '{text}'") from None
    if not ids or min(ids) < 0:
        raise UserError("--ids must list at least one non-negative token id")
    return ids
