"""`coli ps`: the colibri processes of the current user on this machine, as `ollama ps` shows the
loaded models: each `coli` command (serve, web, chat, run, ...) with the engines it started
indented under it, the model each one runs, the address a server listens on, resident memory
and uptime.

colibri.model.processes.py finds them in /proc; this module prints them."""
import sys

from colibri.model.processes import boot_clock, model_name, processes
from colibri.model.listing import human_bytes

HELP = "the running colibri servers and engines: pid, model, address, RSS, uptime"
DESCRIPTION = (HELP + ". Each `coli` command is shown with the engines it started under it; "
               "a server's address is the TCP socket it listens on.")


def add_arguments(p):
    pass


def human_uptime(seconds):
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _address(host, port):
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def run(args):
    procs = processes()
    if not procs:
        print("no colibri servers or engines are running (`coli serve --model NAME` starts one)")
        return 0
    by_pid = {p["pid"]: p for p in procs}
    children = {}
    for p in procs:
        children.setdefault(p["ppid"] if p["ppid"] in by_pid else None, []).append(p)
    now = boot_clock()
    rows = []

    def walk(parent, depth):
        for p in sorted(children.get(parent, []), key=lambda q: q["pid"]):
            what = (f"coli {p['sub']}".rstrip() if p["kind"] == "coli" else
                    "engine" if p["sub"] == "serve" else f"engine {p['sub']}")
            model = p["model"]
            if model is None and p["kind"] == "coli":  # the engine knows the resolved path
                model = next((c["model"] for c in children.get(p["pid"], []) if c["model"]), None)
            rows.append((str(p["pid"]), "  " * depth + what, model_name(model),
                         ", ".join(_address(h, port) for h, port in p["listen"]) or "-",
                         human_bytes(p["rss"]) if p["rss"] is not None else "-",
                         human_uptime(now - p["started"]) if now is not None and p["started"] is not None else "-"))
            walk(p["pid"], depth + 1)
    walk(None, 0)
    head = ("PID", "COMMAND", "MODEL", "ADDRESS", "RSS", "UPTIME")
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(f"{c:>{w}}" if i == 4 else f"{c:<{w}}" for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    sys.stdout.flush()
    return 0
