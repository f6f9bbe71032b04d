"""`coli list`: the models in the local store, as `ollama list` shows its own: name, size on disk,
when it was converted, and where it lives (a linked container shows its target). Entries without
a colibri.json (an interrupted pull) are listed too, marked, since they hold disk space."""
import os
import time

from colibri.model import store

HELP = "list the models in the local store: name, size on disk, where"
DESCRIPTION = (HELP + ". A model linked into the store shows the directory it links to; an interrupted "
               "pull is listed as incomplete. `coli rm NAME` removes one, `coli pull NAME` adds one.")


def add_arguments(p):
    pass


def human_bytes(n):
    """1000-based, as ollama and df -H print sizes: 98 MB, 4.7 GB."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" or n >= 10 else f"{n:.1f} {unit}"
        n /= 1000


def human_age(seconds):
    s = max(0, int(seconds))
    for size, unit in ((86400 * 365, "year"), (86400 * 30, "month"), (86400 * 7, "week"), (86400, "day"),
                       (3600, "hour"), (60, "minute")):
        if s >= size:
            k = s // size
            return f"{k} {unit}{'s' if k > 1 else ''} ago"
    return "just now"


def tree_bytes(d):
    """Bytes of the files under d; a linked directory counts the files it links to (once each)."""
    total, seen_dirs, seen_files = 0, set(), set()
    for root, dirs, files in os.walk(d, followlinks=True):
        try:
            st = os.stat(root)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in seen_dirs:  # a link loop: walk each directory once
            dirs[:] = []
            continue
        seen_dirs.add((st.st_dev, st.st_ino))
        for f in files:
            try:
                st = os.stat(os.path.join(root, f))
            except OSError:  # a dangling link inside the container
                continue
            if (st.st_dev, st.st_ino) not in seen_files:
                seen_files.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def entries():
    """Every entry of the store's models/ folder (hidden names aside), sorted by name: dicts with
    name, path, link (the target when the entry is a symlink, else None), complete (colibri.json
    there), missing (a link whose target is gone)."""
    root = store.models_dir()
    try:
        names = sorted(n for n in os.listdir(root) if not n.startswith("."))
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for n in names:
        p = root / n
        link = os.readlink(p) if os.path.islink(p) else None
        if link is not None and not os.path.isabs(link):
            link = os.path.normpath(os.path.join(root, link))
        out.append({"name": n, "path": p, "link": link, "complete": (p / "colibri.json").is_file(),
                    "missing": link is not None and not os.path.exists(p)})
    return out


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
