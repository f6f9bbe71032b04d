"""Flags the `coli` subcommands that write a container share."""


def add_storage_flags(p):
    """--experts / --dense: how `coli convert` and `coli pull` store the weights."""
    from colibri.limits import DENSE_STORAGE, EXPERT_STORAGE
    p.add_argument("--experts", default=None, choices=EXPERT_STORAGE,
                   help="routed-expert storage (default q4; mxfp4 for MXFP4 sources, kept as they ship)")
    p.add_argument("--dense", default="q8", choices=DENSE_STORAGE, help="dense trunk storage (default q8)")
