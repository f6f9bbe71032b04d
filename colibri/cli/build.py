"""`coli build`: run make for the engine with the right flags and report what was built and which
SIMD kernels it will use (colibri/engine_status.py reads the build state, as `coli info` and doctor do)."""
import json
import os
import shutil
import subprocess
import sys
import time

from colibri import ROOT
from colibri.errors import UserError
from colibri.engine_status import engine_status

HELP = "build the engine (make) and report its version and SIMD kernels"
DESCRIPTION = """Builds build/colibri with make, using all CPUs. The engine picks its kernels at
run time (AVX2+FMA+F16C when the CPU has them, else portable C), so the default build runs on
any x86-64 or ARM machine. Flags are passed through the environment so the Makefile's own
flags (C11, OpenMP, warnings) always stay; a change of flags forces a full rebuild."""

STATE = ROOT / "build" / ".coli_build.json"


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
