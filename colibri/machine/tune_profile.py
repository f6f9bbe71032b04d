"""Tuned profiles: the scheduling knobs `coli tune` measured as best, keyed by machine and model.

A profile lives in $COLI_PROFILE_DIR, else $XDG_CACHE_HOME/colibri/profiles, else
~/.cache/colibri/profiles, as <machine-key>-<model-key>.json. The machine key hashes what makes
timings comparable (CPU model, CPU count, total memory); the model key hashes colibri.json, so
a re-converted model with other settings gets a new profile while a moved one keeps it.
"""
import hashlib
import json
import os
from pathlib import Path

PROFILE_VERSION = 1
KNOBS = ("threads", "batch", "spin")  # engine flags a profile may set: scheduling only, never the answer
MAY_BE_ZERO = ("spin",)  # spin 0: sleep at once; every other knob is at least 1


def profile_dir():
    if os.environ.get("COLI_PROFILE_DIR"):
        return Path(os.environ["COLI_PROFILE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "colibri" / "profiles"


def machine_key():
    cpu_model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Model", "Hardware")):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = 0
    try:
        mem_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30))
    except (ValueError, OSError, AttributeError):
        pass
    ident = f"{cpu_model}|{os.cpu_count()}|{mem_gib}"
    return hashlib.sha256(ident.encode()).hexdigest()[:12], ident


def model_key(model_dir):
    data = (Path(model_dir) / "colibri.json").read_bytes()
    return hashlib.sha256(data).hexdigest()[:12]


def path_for(model_dir):
    return profile_dir() / f"{machine_key()[0]}-{model_key(model_dir)}.json"


def load(model_dir):
    """The profile for this machine and model, or None. A damaged file counts as none."""
    try:
        p = path_for(model_dir)
        prof = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(prof, dict) or prof.get("version") != PROFILE_VERSION or not isinstance(prof.get("knobs"), dict):
        return None
    prof["knobs"] = {k: v for k, v in prof["knobs"].items()
                     if k in KNOBS and type(v) is int and (v > 0 or (v == 0 and k in MAY_BE_ZERO))}
    prof["path"] = str(p)
    return prof


def save(model_dir, knobs, measured, extra=None):
    p = path_for(model_dir)
    p.parent.mkdir(parents=True, exist_ok=True)
    prof = {"version": PROFILE_VERSION, "knobs": {k: knobs[k] for k in KNOBS if k in knobs},
            "measured": measured, "machine": machine_key()[1], "model": str(Path(model_dir).resolve()), **(extra or {})}
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(prof, indent=1) + "\n")
    os.replace(tmp, p)  # a reader never sees half a profile
    return p


def remove(model_dir):
    p = path_for(model_dir)
    if p.exists():
        p.unlink()
        return p
    return None
