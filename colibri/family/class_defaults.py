"""What transformers' config class of a family assumes for a field config.json leaves out.

A config.json written by hand (or by an older tool) may omit fields; transformers then runs the
model with its config class's defaults, so the converter must read the same ones rather than
the generic fallbacks family_registry uses for every family. Each family module holds its own
(the CLASS_DEFAULTS hook of colibri/family/parts.py); tests/test_config_variants.py checks them
against the classes."""
import copy

from colibri.family import parts

ROPE_KEYS = ("rope_parameters", "rope_scaling")  # either spelling counts as given


def defaults(family):
    """{field: default} of the family's config class; empty where colibri reads no defaults of its own."""
    return (parts.hook(family, "CLASS_DEFAULTS") or {}).get(family, {})


def fill(family, cfg):
    """cfg with the family's class defaults for the fields it lacks (a field set to null stays
    null: several classes give null a meaning of its own)."""
    out = dict(cfg)
    for key, value in defaults(family).items():
        if key in out or (key in ROPE_KEYS and any(k in out for k in ROPE_KEYS)):
            continue
        out[key] = copy.deepcopy(value)
    return out
