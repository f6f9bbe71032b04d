"""`coli list`: the models in the local store, as `ollama list` shows its own: name, size on disk,
when it was converted, and where it lives (a linked container shows its target). Entries without
a colibri.json (an interrupted pull) are listed too, marked, since they hold disk space."""
import os
import time

from colibri.model import store
from colibri.model.listing import entries, human_bytes, tree_bytes

HELP = "list the models in the local store: name, size on disk, where"
DESCRIPTION = (HELP + ". A model linked into the store shows the directory it links to; an interrupted "
               "pull is listed as incomplete. `coli rm NAME` removes one, `coli pull NAME` adds one.")


def add_arguments(p):
    pass


def human_age(seconds):
    s = max(0, int(seconds))
    for size, unit in ((86400 * 365, "year"), (86400 * 30, "month"), (86400 * 7, "week"), (86400, "day"),
                       (3600, "hour"), (60, "minute")):
        if s >= size:
            k = s // size
            return f"{k} {unit}{'s' if k > 1 else ''} ago"
    return "just now"


def describe(e):
    """The WHERE column: the path, the target of a link, and what is wrong with an entry."""
    where = f"{e['path']} -> {e['link']}" if e["link"] else str(e["path"])
    if e["missing"]:
        return where + "  (the link's target is gone; `coli rm " + e["name"] + "` removes the link)"
    if not e["path"].is_dir():
        return where + "  (not a directory)"
    if not e["complete"]:
        resume = f"`coli pull {e['name']}` resumes it, " if e["name"] in store.BUILTIN else ""
        return where + (f"  (incomplete: no colibri.json, an interrupted pull or convert; {resume}"
                        f"`coli rm {e['name']}` removes it)")
    return where


def run(args):
    rows = []
    for e in entries():
        manifest = e["path"] / "colibri.json"
        try:
            modified = human_age(time.time() - manifest.stat().st_mtime) if e["complete"] else "-"
        except OSError:
            modified = "-"
        size = "-" if e["missing"] else human_bytes(tree_bytes(e["path"]) if e["path"].is_dir()
                                                      else os.path.getsize(e["path"]))
        rows.append((e["name"], size, modified, describe(e)))
    if not rows:
        print(f"no models in the store ({store.models_dir()}); `coli pull smollm2` fetches a small one "
              f"({store.BUILTIN['smollm2']['about']}), `coli pull hf:ORG/REPO` any other")
        return 0
    head = ("NAME", "SIZE", "MODIFIED", "WHERE")
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(3)]
    for r in [head] + rows:
        print(f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}".rstrip())
    return 0
