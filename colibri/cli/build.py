"""`coli build`: run make for the engine with the right flags and report what was built and which
SIMD kernels it will use. engine_status() is the build state that `coli info` and doctor show."""
import json
import os
import shutil
import subprocess
import sys
import time

from colibri import ROOT
from colibri.errors import UserError
from colibri.engine_client import RELEASE

HELP = "build the engine (make) and report its version and SIMD kernels"
DESCRIPTION = """Builds build/colibri with make, using all CPUs. The engine picks its kernels at
run time (AVX2+FMA+F16C when the CPU has them, else portable C), so the default build runs on
any x86-64 or ARM machine. Flags are passed through the environment so the Makefile's own
flags (C11, OpenMP, warnings) always stay; a change of flags forces a full rebuild."""

ENGINE = RELEASE
STATE = ROOT / "build" / ".coli_build.json"


def _expected_version():
    from version import VERSION
    return VERSION


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
          "expected_version": _expected_version(), "stale": None, "kernels": None, "kernel_sets": [],
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


def add_arguments(p):
    p.add_argument("--clean", action="store_true", help="rebuild everything from scratch")
    p.add_argument("--debug", action="store_true", help="build with -O0 -g (for gdb), not -O2")
    p.add_argument("--native", action="store_true",
                   help="also let the compiler use every instruction of this CPU (-march=native); the binary "
                        "may not run on other machines")
    p.add_argument("--cc", help="C compiler (default: the Makefile's, gcc)")
    p.add_argument("-j", "--jobs", type=int, help="parallel compile jobs (default: all CPUs)")
    p.add_argument("--dry-run", action="store_true", dest="dry_run", help="print the make command and stop")


def build_command(args):
    """(argv, env changes, settings) for make; the settings are recorded to detect flag changes."""
    if args.jobs is not None and args.jobs < 1:
        raise UserError(f"--jobs {args.jobs}: needs at least 1")
    cflags = "-O0 -g" if args.debug else "-O2"
    if args.native:
        cflags += " -march=native"
    env = {"CFLAGS": cflags}
    if args.cc:
        env["CC"] = args.cc
    settings = dict(env)
    jobs = args.jobs or os.cpu_count() or 1
    argv = ["make", "-C", str(ROOT), f"-j{jobs}", "build/colibri"]
    previous = None
    try:
        previous = json.loads(STATE.read_text())
    except (OSError, ValueError):
        pass
    default = {"CFLAGS": "-O2"}
    if args.clean or (previous or default) != settings:
        argv.insert(3, "-B")  # flags changed: make would think the old binary is up to date
    return argv, env, settings


def run(args):
    argv, env, settings = build_command(args)
    if args.dry_run:
        print(" ".join(f"{k}='{v}'" for k, v in env.items()) + " " + " ".join(argv))
        return 0
    if not shutil.which("make"):
        raise UserError("`make` is not installed; install it (e.g. `apt-get install build-essential`)")
    cc = args.cc or "gcc"
    if not shutil.which(cc):
        raise UserError(f"the C compiler `{cc}` is not installed; install gcc (e.g. `apt-get install build-essential`) "
                        "or pass --cc")
    t0 = time.monotonic()
    r = subprocess.run(argv, env={**os.environ, **env})
    if r.returncode:
        raise UserError(f"make failed (exit code {r.returncode}); the compiler's messages are above")
    STATE.parent.mkdir(exist_ok=True)
    STATE.write_text(json.dumps(settings) + "\n")
    st = engine_status()
    if st["version"] is None:
        raise UserError(f"{st['path']} was built but does not run: {st['error']}")
    print(f"built {st['path']}: colibri {st['version']} in {time.monotonic() - t0:.1f} s "
          f"(CFLAGS {settings['CFLAGS']}{', CC ' + settings['CC'] if 'CC' in settings else ''})")
    print(f"kernels: {st['kernels']}")
    for line in st["kernel_sets"]:
        print(f"  set {line}")
    if st["version"] != st["expected_version"]:
        print(f"warning: the engine says {st['version']} but the launcher is {st['expected_version']}", file=sys.stderr)
    return 0
