"""What this machine has and how fast it reads: cores, SIMD, memory (cgroup v1/v2 limits
included), free disk, GPUs (nvidia-smi / rocm-smi), and quick memory / O_DIRECT disk timings.
Used by the planner (resource_plan.py), `coli info`, doctor and the flag checks. Stdlib only.
"""
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

GB = 1e9


def fmt_bytes(n):
    """A byte count as the machine and budget reports print it (2.50 GB, 512.00 MB, ...)."""
    if n is None:
        return "?"
    for unit, size in (("GB", GB), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


UNLIMITED = 1 << 60  # cgroup "no limit" values are near 2^63
BUDGET_SHARE = 0.9   # of available memory: the rest stays for the OS, the launcher and page tables


# ---------------------------------------------------------------- discovery

def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def cpu_info():
    text = _read("/proc/cpuinfo") or ""
    logical = os.cpu_count() or 1
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = logical
    cores, model, mhz, flags = set(), None, None, set()
    phys = None
    for line in text.splitlines():
        key, _, val = line.partition(":")
        key, val = key.strip(), val.strip()
        if key == "physical id":
            phys = val
        elif key == "core id":
            cores.add((phys, val))
        elif key in ("model name", "Model", "Hardware") and not model:
            model = val
        elif key == "cpu MHz" and mhz is None:
            try:
                mhz = float(val)
            except ValueError:
                pass
        elif key in ("flags", "Features") and not flags:
            flags = set(val.split())
    physical = len(cores) or logical
    max_khz = _read("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    if max_khz and max_khz.strip().isdigit():
        mhz = int(max_khz) / 1000
    quota = cgroup_cpu_quota()
    simd = ("avx512" if "avx512f" in flags else "avx2" if {"avx2", "fma", "f16c"} <= flags
            else "neon" if ("asimd" in flags or "neon" in flags) else "portable")
    # what c/kernels/quant.c kernels_init picks
    kernels = ("avx512" if simd == "avx512" and {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma", "f16c"} <= flags
               else "avx2" if {"avx2", "fma", "f16c"} <= flags else "portable")
    if kernels == "avx512" and "avx512_vnni" in flags:
        kernels = "vnni"
    if kernels == "vnni" and {"amx_tile", "amx_int8"} <= flags:
        kernels = "amx"  # unless the OS refuses the tile state; the engine then runs vnni
    return {"model": model or "unknown", "logical": logical, "physical_cores": min(physical, logical),
            "usable": usable, "quota_cpus": quota, "mhz": mhz, "simd": simd, "engine_kernels": kernels}


def _cgroup_paths():
    """(version, controller dir) candidates for this process's memory and cpu cgroup."""
    out = []
    for line in (_read("/proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, ctrls, rel = parts
        if ctrls == "":
            out.append((2, "/sys/fs/cgroup" + rel.rstrip("/"), None))
        else:
            for c in ctrls.split(","):
                out.append((1, f"/sys/fs/cgroup/{c}" + rel.rstrip("/"), c))
    return out


def _walk_up(path, root):
    p = Path(path)
    while True:
        yield p
        if str(p) == root or p.parent == p or not str(p.parent).startswith(root):
            return
        p = p.parent


def _int_file(path):
    v = _read(path)
    if v is None:
        return None
    v = v.strip()
    if v == "max":
        return UNLIMITED
    try:
        return int(v)
    except ValueError:
        return None


def cgroup_memory():
    """{'version', 'limit', 'usage'} of the tightest memory limit over this cgroup and its parents
    (v2 memory.max, v1 memory.limit_in_bytes); limit None when there is none."""
    best = None
    for ver, base, ctrl in _cgroup_paths():
        if ver == 1 and ctrl != "memory":
            continue
        root = "/sys/fs/cgroup" if ver == 2 else "/sys/fs/cgroup/memory"
        names = ("memory.max", "memory.current") if ver == 2 else ("memory.limit_in_bytes", "memory.usage_in_bytes")
        # inside a cgroup namespace the own path may not exist: fall back to the mount root
        for d in list(_walk_up(base, root)) + [Path(root)]:
            limit = _int_file(d / names[0])
            if limit is None or limit >= UNLIMITED:
                continue
            usage = _int_file(d / names[1]) or 0
            if best is None or limit - usage < best["limit"] - best["usage"]:
                best = {"version": ver, "limit": limit, "usage": usage}
    return best or {"version": None, "limit": None, "usage": None}


def cgroup_cpu_quota():
    for ver, base, ctrl in _cgroup_paths():
        if ver == 2:
            v = _read(base + "/cpu.max") or _read("/sys/fs/cgroup/cpu.max")
            if v and not v.startswith("max"):
                q, p = v.split()[:2]
                return round(int(q) / int(p), 2)
        elif ctrl == "cpu":
            for d in (base, "/sys/fs/cgroup/cpu"):
                q, p = _int_file(d + "/cpu.cfs_quota_us"), _int_file(d + "/cpu.cfs_period_us")
                if q and p and q > 0:
                    return round(q / p, 2)
    return None


def memory_info():
    mem = {}
    for line in (_read("/proc/meminfo") or "").splitlines():
        k, _, v = line.partition(":")
        parts = v.split()
        if parts and parts[0].isdigit():
            mem[k] = int(parts[0]) * 1024
    total = mem.get("MemTotal")
    avail = mem.get("MemAvailable", mem.get("MemFree"))
    cg = cgroup_memory()
    usable = avail
    if cg["limit"] is not None:
        room = max(cg["limit"] - cg["usage"], 0)
        usable = room if usable is None else min(usable, room)
        total = cg["limit"] if total is None else min(total, cg["limit"])
    overcommit = _read("/proc/sys/vm/overcommit_memory")
    return {"total": total, "available": avail, "cgroup": cg, "usable": usable,
            "default_budget": int(usable * BUDGET_SHARE) if usable else None,
            "overcommit": int(overcommit) if overcommit and overcommit.strip().isdigit() else None}


def _fs_type(path):
    best, fstype = "", None
    real = os.path.realpath(path)
    for line in (_read("/proc/mounts") or "").splitlines():
        parts = line.split()
        if len(parts) >= 3 and (real == parts[1] or real.startswith(parts[1].rstrip("/") + "/")):
            if len(parts[1]) >= len(best):
                best, fstype = parts[1], parts[2]
    return fstype


def disk_info(path):
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        st = os.statvfs(p)
    except OSError:
        return {"path": str(path), "free": None, "total": None, "fs": None}
    return {"path": str(path), "free": st.f_bavail * st.f_frsize, "total": st.f_blocks * st.f_frsize,
            "fs": _fs_type(p)}


def _run_tool(argv, timeout=5):
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None


def gpu_info():
    """GPUs reported by nvidia-smi / rocm-smi when they are installed (the engine does not use them yet)."""
    gpus = []
    if shutil.which("nvidia-smi"):
        out = _run_tool(["nvidia-smi", "--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits"])
        for line in (out or "").splitlines():
            parts = [x.strip() for x in line.split(",")]
            if len(parts) == 3:
                try:
                    gpus.append({"vendor": "nvidia", "name": parts[0], "vram": int(float(parts[1])) << 20,
                                 "vram_free": int(float(parts[2])) << 20})
                except ValueError:
                    pass
    if shutil.which("rocm-smi"):
        out = _run_tool(["rocm-smi", "--showproductname", "--showmeminfo", "vram", "--json"])
        try:
            data = json.loads(out) if out else {}
        except json.JSONDecodeError:
            data = {}
        for card, info in data.items():
            if not isinstance(info, dict):
                continue
            total = next((v for k, v in info.items() if "Total Memory" in k), None)
            used = next((v for k, v in info.items() if "Used Memory" in k), None)
            try:
                gpus.append({"vendor": "amd", "name": info.get("Card series", card), "vram": int(total),
                             "vram_free": int(total) - int(used or 0)})
            except (TypeError, ValueError):
                pass
    return gpus


def discover(disk_path=None, gpus=True):
    return {"cpu": cpu_info(), "memory": memory_info(), "disk": disk_info(disk_path or os.getcwd()),
            "gpus": gpu_info() if gpus else []}


# ---------------------------------------------------------------- bandwidth

def measure_memory_bw(size=256 << 20, reps=3):
    """Single-thread sequential read rate (GB/s): memchr over a buffer that has no match.
    The engine reads with all cores, so this is a floor rather than the machine's peak."""
    avail = memory_info()["usable"] or size * 8
    size = max(16 << 20, min(size, avail // 8))
    buf = bytearray(size)
    buf[::4096] = b"\0" * len(range(0, size, 4096))  # touch every page before timing
    best = None
    for _ in range(reps):
        t = time.perf_counter()
        buf.find(b"\x01")
        dt = time.perf_counter() - t
        best = dt if best is None else min(best, dt)
    return size / best / GB if best else None


def measure_disk_bw(paths, limit_bytes=512 << 20, limit_s=1.5, min_bytes=16 << 20):
    """Sequential O_DIRECT read rate (GB/s) over the given files (largest first).
    Returns (gbps or None, mode, note); page-cached buffered reads are not reported as disk speed."""
    files = sorted((p for p in paths if os.path.isfile(p)), key=os.path.getsize, reverse=True)
    if not files or sum(os.path.getsize(p) for p in files) < min_bytes:
        return None, None, f"the model's files are under {min_bytes >> 20} MiB, too small to time; pass --disk-bw GB/s"
    if not hasattr(os, "O_DIRECT"):
        return None, None, "this platform has no O_DIRECT; pass --disk-bw GB/s"
    import mmap
    block = 4 << 20
    buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT needs
    done, t0 = 0, time.perf_counter()
    try:
        for p in files:
            try:
                fd = os.open(p, os.O_RDONLY | os.O_DIRECT)
            except OSError as e:
                return None, None, f"O_DIRECT open failed ({e.strerror}); pass --disk-bw GB/s"
            try:
                off, size = 0, os.path.getsize(p)
                while off + block <= size and done < limit_bytes and time.perf_counter() - t0 < limit_s:
                    n = os.preadv(fd, [buf], off)
                    if n <= 0:
                        break
                    done += n
                    off += n
            except OSError as e:
                return None, None, f"O_DIRECT read failed ({e.strerror}); pass --disk-bw GB/s"
            finally:
                os.close(fd)
            if done >= limit_bytes or time.perf_counter() - t0 >= limit_s:
                break
    finally:
        buf.close()
    dt = time.perf_counter() - t0
    if done < min_bytes:
        return None, None, "too little data read to time; pass --disk-bw GB/s"
    return done / dt / GB, "o_direct", f"{done >> 20} MiB read with O_DIRECT"


def machine_lines(m):
    """discover()'s result as the lines `coli info` and `coli plan` print."""
    cpu, mem, disk = m["cpu"], m["memory"], m["disk"]
    out = [f"cpu          {cpu['model']}: {cpu['physical_cores']} physical cores, {cpu['logical']} logical"
           + (f", {cpu['usable']} usable" if cpu["usable"] != cpu["logical"] else "")
           + (f", cgroup quota {cpu['quota_cpus']} CPUs" if cpu["quota_cpus"] else "")
           + f"; SIMD {cpu['simd']} (engine kernels: {cpu['engine_kernels']})"]
    cg = mem["cgroup"]
    lim = f", cgroup v{cg['version']} limit {fmt_bytes(cg['limit'])} ({fmt_bytes(cg['usage'])} used)" if cg["limit"] else ""
    out.append(f"memory       {fmt_bytes(mem['total'])} total, {fmt_bytes(mem['available'])} available{lim}")
    out.append(f"disk         {fmt_bytes(disk['free'])} free of {fmt_bytes(disk['total'])}"
               + (f" ({disk['fs']})" if disk["fs"] else "") + f" at {disk['path']}")
    if m["gpus"]:
        for g in m["gpus"]:
            out.append(f"gpu          {g['name']}: {fmt_bytes(g['vram'])} VRAM ({fmt_bytes(g['vram_free'])} free);"
                       " not used: the engine has no GPU backend yet")
    else:
        out.append("gpu          none found (nvidia-smi / rocm-smi)")
    return out
