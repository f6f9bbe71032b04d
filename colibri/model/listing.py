"""The local store's entries and what they take on disk, for `coli list` and `coli rm`."""
import os

from colibri.model import store


def human_bytes(n):
    """1000-based, as ollama and df -H print sizes: 98 MB, 4.7 GB."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" or n >= 10 else f"{n:.1f} {unit}"
        n /= 1000


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
