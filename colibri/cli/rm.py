"""`coli rm NAME...`: remove models from the local store, after asking (--yes skips the question).

Only entries of the store's models/ folder are removed, by the names `coli list` shows (or the
hf:ORG/REPO[:TAG] they were pulled as). A linked entry loses the link only: the directory it
points to is left alone, and the message says so. A pulled model's download (the GGUF file or
checkpoint in downloads/, kept so a pull converts again without fetching) goes with it unless
another model was made from it or --keep-download is given. A model a running engine or server
uses is refused (`coli ps` shows them). Nothing is removed until every name has been checked."""
import difflib
import json
import os
import shutil
import sys

from colibri.errors import UserError
from colibri.model.listing import entries, human_bytes, tree_bytes
from colibri.model.processes import processes
from colibri.model import store

HELP = "remove models from the local store (asks first; --yes skips the question)"
DESCRIPTION = (HELP + ". A model linked into the store loses the link only; a pulled model's download goes "
               "with it (--keep-download keeps it). Without a terminal, --yes is required.")


def add_arguments(p):
    p.add_argument("name", nargs="+", metavar="NAME", help="a name `coli list` shows (smollm2, hf--ORG--REPO) or the "
                   "hf:ORG/REPO[:TAG] it was pulled as")
    p.add_argument("--yes", "-y", action="store_true", help="remove without asking")
    p.add_argument("--keep-download", action="store_true",
                   help="keep the downloaded source in the store's downloads/ (a later pull then converts "
                        "without fetching again)")


def find_entry(name, listed):
    """The store entry `name` means, or UserError saying why it is none."""
    root = store.models_dir()
    by_name = {e["name"]: e for e in listed}
    if "/" in name and not name.startswith("hf:"):  # a path: only one that names a store entry
        parent = os.path.dirname(os.path.abspath(name.rstrip("/") or "/"))
        base = os.path.basename(name.rstrip("/"))
        if os.path.realpath(parent) == os.path.realpath(root) and base in by_name:
            return by_name[base]
        raise UserError(f"{name} is not in the model store ({root}): `coli rm` removes only what `coli list` "
                        "shows; delete other directories yourself")
    key = store.store_name(name)
    if key in by_name:
        return by_name[key]
    if key in ("", ".", "..") or os.sep in key:
        raise UserError(f"'{name}' is not a model name; `coli list` shows the names in the store")
    head = f"'{name}' is not in the model store ({', '.join(by_name) or 'it is empty'})"
    near = difflib.get_close_matches(key, list(by_name), n=1, cutoff=0.75)
    if near:
        raise UserError(f"{head}; did you mean {near[0]}?")
    if name in store.BUILTIN or name.startswith("hf:"):
        raise UserError(f"{head}: {name} was never pulled, so there is nothing to remove")
    raise UserError(f"{head}; `coli list` shows the names")


def download_of(e, listed):
    """The downloads/ folder a pulled model was converted from, when nothing else in the store was
    made from it: (path, bytes), else None."""
    if e["link"] is not None:
        return None
    try:
        source = json.loads((e["path"] / ".coli_pull.json").read_text())["source"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    downloads = store.store_root() / "downloads"

    def top(src):  # downloads/<folder> holding src, or None when src lies elsewhere
        rel = os.path.relpath(os.path.abspath(str(src)), os.path.abspath(downloads))
        first = rel.split(os.sep)[0]
        return None if first in ("", ".", "..") else downloads / first

    folder = top(source)
    if folder is None or not os.path.lexists(folder):
        return None
    for other in listed:
        if other is e or other["link"] is not None:
            continue
        try:
            if top(json.loads((other["path"] / ".coli_pull.json").read_text())["source"]) == folder:
                return None
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return folder, (0 if os.path.islink(folder) else tree_bytes(folder))


def users(path):
    """The running colibri processes whose model is `path`: a link is in use only when run through it."""
    try:
        procs = processes()
    except UserError:  # no /proc: nothing to check against
        return []
    mine = os.path.normpath(os.path.abspath(path))
    real = None if os.path.islink(path) else os.path.realpath(path)
    hits = [p for p in procs if p["model"] and (os.path.normpath(p["model"]) == mine
                                                or (real is not None and os.path.realpath(p["model"]) == real))]
    return sorted(hits, key=lambda p: p["pid"])


def remove(path):
    """Deletes a store entry without following links: a link is unlinked, a directory's own links
    inside are unlinked too (shutil.rmtree never descends through them)."""
    if os.path.islink(path) or not os.path.isdir(path):
        os.unlink(path)
    else:
        shutil.rmtree(path)


def run(args):
    listed = entries()
    plan = []
    for name in dict.fromkeys(args.name):
        e = find_entry(name, listed)
        if any(p[0] is e for p in plan):
            continue
        busy = users(e["path"])
        if busy:
            who = ", ".join(f"pid {p['pid']} ({'coli ' + p['sub'] if p['kind'] == 'coli' else 'engine'})"
                            for p in busy)
            raise UserError(f"{e['name']} is in use by {who}; stop it first (`coli ps` lists them), then remove it")
        plan.append((e, None if args.keep_download else download_of(e, listed)))
    lines = []
    for e, dl in plan:
        if e["link"] is not None:
            lines.append(f"{e['path']}: a link to {e['link']}; only the link is removed, not the files it points to")
        else:
            size = human_bytes(tree_bytes(e["path"]) if e["path"].is_dir() else os.path.getsize(e["path"]))
            lines.append(f"{e['path']} ({size})")
        if dl is not None:
            lines.append(f"{dl[0]} ({human_bytes(dl[1])}, the download it was converted from; "
                         "--keep-download keeps it)")
    if not args.yes:
        if sys.stdin is None or not sys.stdin.isatty():
            raise UserError("would remove " + "; ".join(lines) + ". Nothing was removed: pass --yes to confirm "
                            "without a terminal")
        print("this removes:\n" + "\n".join("  " + ln for ln in lines), file=sys.stderr)
        print("remove? [y/N] ", end="", file=sys.stderr, flush=True)
        answer = sys.stdin.readline().strip().lower()
        if answer not in ("y", "yes"):
            print("nothing removed", file=sys.stderr)
            return 1
    for e, dl in plan:
        remove(e["path"])
        if e["link"] is not None:
            print(f"removed {e['name']}: the link {e['path']} (its target {e['link']} is left in place)")
        else:
            print(f"removed {e['name']} ({e['path']})")
        if dl is not None:
            remove(dl[0])
            print(f"removed its download {dl[0]}")
    return 0
