"""The sampling a front end uses where the request (or the command line) leaves a knob unset:
the checkpoint's own value from generation_config.json where it names one (field by field, as
vLLM reads it), else llama-server's defaults, which suit small local models far better than
OpenAI's bare temperature 1. Keys are SUBMIT options (docs/protocol.md)."""
import json
from pathlib import Path

# llama-server's defaults (common/common.h): temperature 0.8, top-k 40, top-p 0.95, min-p 0.05,
# no repetition penalty.
LOCAL_DEFAULTS = {"temp": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0}
LOCAL_SOURCE = "llama-server defaults"
GEN_CONFIG = "generation_config.json"

# generation_config.json field -> (SUBMIT option, is it valid)
_FIELDS = {
    "temperature": ("temp", lambda v: 0 <= v <= 100),
    "top_k": ("top_k", lambda v: float(v).is_integer() and 0 <= v <= 1 << 30),
    "top_p": ("top_p", lambda v: 0 < v <= 1),
    "min_p": ("min_p", lambda v: 0 <= v <= 1),
    "repetition_penalty": ("repeat_penalty", lambda v: 0 < v <= 100),
}

# How the API and `coli info` name each option.
API_NAMES = {"temp": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
             "repeat_penalty": "repetition_penalty"}


def read_generation_config(model_dir):
    """The checkpoint's generation_config.json as a dict; {} when it is missing or unreadable."""
    path = Path(model_dir) / GEN_CONFIG
    try:
        gc = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        return {}
    return gc if isinstance(gc, dict) else {}


def model_defaults(model_dir):
    """({option: value}, {option: where it came from}) for this model."""
    gc = read_generation_config(model_dir)
    values, sources = dict(LOCAL_DEFAULTS), {k: LOCAL_SOURCE for k in LOCAL_DEFAULTS}
    for name, (opt, ok) in _FIELDS.items():
        v = gc.get(name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not ok(v):
            continue  # absent or unusable: the local default stands
        values[opt] = int(v) if opt == "top_k" else float(v)
        sources[opt] = GEN_CONFIG
    return values, sources


def as_api(values, sources=None):
    """The defaults under their API names, for /v1/models and the like."""
    out = {API_NAMES.get(k, k): v for k, v in values.items()}
    if sources is not None:
        out["source"] = {API_NAMES.get(k, k): s for k, s in sources.items()}
    return out


def describe(values, sources):
    """One line for `coli info` and the chat banner: the values, then where they came from."""
    shown = ", ".join(f"{API_NAMES.get(k, k)} {values[k]:g}" for k in values)
    origins = {}
    for k, s in sources.items():
        origins.setdefault(s, []).append(API_NAMES.get(k, k))
    if len(origins) == 1:
        return f"{shown} ({next(iter(origins))})"
    return f"{shown} (" + "; ".join(f"{', '.join(ks)} from {s}" for s, ks in origins.items()) + ")"
