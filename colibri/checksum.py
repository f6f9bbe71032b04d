"""sha256 of a file, read in 8 MiB pieces: the converter records its sources' sums in
colibri.json, the model store checks downloads against pinned and published sums."""
import hashlib


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(8 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
