"""The colibri processes of the current user on this machine, for `coli ps` and for `coli rm`
(which refuses a model one of them runs).

Nothing records these processes in a file that could go stale: they are found in /proc. A
launcher is a process running the `coli` script (`python3 coli serve ...`); an engine is the
`colibri` binary (build/colibri, or the $COLI_ENGINE build), its model from its --model flag.
A server's address is the listening TCP socket the process holds (so `--port 0` shows the port
it got). Linux only; elsewhere processes() raises UserError saying so."""

import os
import re
import socket
import struct

from colibri.errors import UserError
from colibri.model import store

PROC = "/proc"
ENGINE_NAME = re.compile(r"colibri(_[A-Za-z0-9]+)?")  # build/colibri, build/colibri_asan


def _read(pid, name, binary=False):
    try:
        with open(os.path.join(PROC, str(pid), name), "rb") as f:
            data = f.read()
    except OSError:  # gone meanwhile, or not readable
        return None
    return data if binary else data.decode(errors="replace")


def _flag(argv, name):
    """The value of --name V or --name=V in argv (the last one wins, as argparse does)."""
    val = None
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            val = argv[i + 1]
        elif a.startswith(name + "="):
            val = a[len(name) + 1:]
    return val


def classify(argv):
    """('engine', tool) for the engine binary, ('coli', subcommand) for the launcher, else None."""
    if not argv:
        return None
    if ENGINE_NAME.fullmatch(os.path.basename(argv[0])):
        sub = argv[1] if len(argv) > 1 and not argv[1].startswith("-") else "serve"
        return ("engine", sub)
    i = 0  # `./coli ...` runs as `python3 ./coli ...` (maybe `python3 -u coli`); a wrapper may exec it as argv[0]
    if os.path.basename(argv[0]).startswith("python"):
        i = 1
        while i < len(argv) and argv[i].startswith("-"):
            i += 1
    if i < len(argv) and os.path.basename(argv[i]) == "coli":
        sub = next((a for a in argv[i + 1:] if not a.startswith("-")), None)
        return ("coli", sub or "")
    return None


def _listening(pid):
    """[(host, port)] of the TCP sockets in LISTEN state that the process holds."""
    inodes = set()
    fd_dir = os.path.join(PROC, str(pid), "fd")
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return []
    for fd in fds:
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    if not inodes:
        return []
    found = []
    for table, family in (("net/tcp", socket.AF_INET), ("net/tcp6", socket.AF_INET6)):
        for line in (_read(pid, table) or "").splitlines()[1:]:
            f = line.split()
            if len(f) < 10 or f[3] != "0A" or f[9] not in inodes:  # 0A: TCP_LISTEN
                continue
            addr, port = f[1].split(":")
            # the kernel prints each 32-bit word of the address in host byte order
            raw = b"".join(struct.pack("=I", int(addr[i:i + 8], 16)) for i in range(0, len(addr), 8))
            host = socket.inet_ntop(family, raw)
            found.append((host, int(port, 16)))
    return sorted(set(found), key=lambda hp: hp[1])


def boot_clock():
    try:
        with open(os.path.join(PROC, "uptime")) as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _model_path(pid, argv, environ, engine):
    """The absolute path of the model the process runs, or None. A launcher's short name is looked
    up in the model store it sees ($COLI_HOME in its own environment)."""
    name = _flag(argv, "--model") or (None if engine else environ.get("COLI_MODEL"))
    if not name:
        return None
    cwd = _read_link(pid, "cwd")
    path = os.path.join(cwd, name) if cwd and not os.path.isabs(name) else name
    if engine or os.path.lexists(path):
        return os.path.normpath(path)
    if "/" in name and not name.startswith("hf:"):
        return os.path.normpath(path)
    home = environ.get("COLI_HOME")
    root = os.path.join(os.path.expanduser(home), "models") if home else os.path.join(
        os.path.expanduser("~"), ".cache", "colibri", "models")
    return os.path.join(root, store.store_name(name))


def _read_link(pid, name):
    try:
        return os.readlink(os.path.join(PROC, str(pid), name))
    except OSError:
        return None


def processes():
    """The current user's colibri launchers and engines: dicts with pid, ppid, kind ('coli' or
    'engine'), sub (the subcommand or engine tool), model (absolute path or None), listen
    [(host, port)], rss (bytes or None), started (seconds since boot or None)."""
    if not os.path.isdir(PROC):
        raise UserError(f"{PROC} is not mounted: `coli ps` reads the process table there (Linux only)")
    uid, me = os.getuid(), os.getpid()
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out = []
    for entry in os.listdir(PROC):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        try:
            if os.stat(os.path.join(PROC, entry)).st_uid != uid:
                continue
        except OSError:
            continue
        raw = _read(pid, "cmdline", binary=True)
        argv = [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]] if raw else []
        kind = classify(argv)
        if kind is None:
            continue
        stat = _read(pid, "stat") or ""
        fields = stat[stat.rfind(")") + 2:].split()
        ppid = int(fields[1]) if len(fields) > 1 else None
        started = int(fields[19]) / tick if len(fields) > 19 else None
        status = _read(pid, "status") or ""
        m = re.search(r"^VmRSS:\s+(\d+)\s+kB", status, re.M)
        env_raw = _read(pid, "environ", binary=True) or b""
        environ = dict(kv.decode(errors="replace").partition("=")[::2] for kv in env_raw.split(b"\0") if b"=" in kv)
        out.append({"pid": pid, "ppid": ppid, "kind": kind[0], "sub": kind[1],
                    "model": _model_path(pid, argv, environ, kind[0] == "engine"),
                    "listen": _listening(pid) if kind[0] == "coli" else [],
                    "rss": int(m.group(1)) * 1024 if m else None, "started": started})
    return out


def model_name(path):
    """A model in this store by its store name (a link into the store counts), else its path."""
    if not path:
        return "-"
    root = store.models_dir()
    if os.path.dirname(path) == os.path.normpath(os.path.abspath(root)):
        return os.path.basename(path)
    real = os.path.realpath(path)
    try:
        for n in sorted(os.listdir(root)):
            if not n.startswith(".") and os.path.realpath(root / n) == real:
                return n
    except OSError:
        pass
    return path
