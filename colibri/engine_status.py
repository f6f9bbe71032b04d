"""What the built engine is, without building it: its version, the kernels it chooses on this
CPU, and whether a source changed since (`coli build`, `coli info` and doctor say it)."""
import subprocess

from colibri import ROOT
from colibri.engine_client import RELEASE
from version import VERSION

ENGINE = RELEASE


def cpu_kernels():
    """The kernels c/kernels/quant.c kernels_init will choose on this CPU, from /proc/cpuinfo flags."""
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    avx512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma", "f16c"} <= flags
    if avx512 and {"amx_tile", "amx_int8", "avx512_vnni"} <= flags:  # if the kernel grants the tiles
        return "amx", "AMX-INT8 tiles + AVX-512 VNNI"
    if avx512 and "avx512_vnni" in flags:
        return "vnni", "AVX-512 VNNI"
    if avx512:
        return "avx512", "AVX-512 F/BW/VL/DQ"
    if {"avx2", "fma", "f16c"} <= flags:
        return "avx2", "AVX2+FMA+F16C"
    missing = sorted({"avx2", "fma", "f16c"} - flags)
    return "portable", ("no " + "/".join(missing).upper()) if flags else "CPU flags unknown"


def engine_status():
    """{'path', 'built', 'version', 'expected_version', 'stale', 'kernels', 'error'} without building."""
    st = {"path": str(ENGINE.relative_to(ROOT)), "built": ENGINE.exists(), "version": None,
          "expected_version": VERSION, "stale": None, "kernels": None, "kernel_sets": [],
          "error": None}
    kern, why = cpu_kernels()
    st["kernels"] = f"{kern} ({why}; chosen at start)"
    if not st["built"]:
        return st
    try:
        r = subprocess.run([str(ENGINE), "version"], capture_output=True, text=True, timeout=10)
        lines = r.stdout.splitlines()
        out = lines[0].split() if lines else []
        if r.returncode == 0 and len(out) >= 2 and out[0] == "colibri":
            st["version"] = out[1]
            reported = [w.split("=", 1)[1] for w in out[2:] if w.startswith("kernels=")]
            if reported:
                st["kernels"] = f"{reported[0]} (reported by the engine)"
            # "set NAME[ (not on this CPU)]: complete|portable ENTRY,...": each set's portable fallbacks
            st["kernel_sets"] = [ln[4:] for ln in lines[1:] if ln.startswith("set ")]
        else:
            st["error"] = (r.stderr or r.stdout).strip() or f"exit code {r.returncode}"
    except (OSError, subprocess.TimeoutExpired) as e:
        st["error"] = str(e)
    built_at = ENGINE.stat().st_mtime
    sources = [p for pat in ("c/*/*.c", "c/*/*.h", "Makefile") for p in ROOT.glob(pat)]
    newer = [p for p in sources if p.stat().st_mtime > built_at]
    if newer:
        st["stale"] = str(max(newer, key=lambda p: p.stat().st_mtime).relative_to(ROOT))
    return st
