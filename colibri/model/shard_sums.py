"""Per-shard checksums of a container: `coli convert` records, for every shard, its size and
the sha256 of each CHUNK-byte piece in colibri.json ("shard_checksums"); `coli verify` and
`coli doctor --deep` read the shards back and name the shard and the byte range of every piece
that differs, so damage is located, not only detected. A container converted before the
checksums existed has none: that is reported, not failed."""
import hashlib
import os

CHUNK = 64 << 20
READ = 8 << 20
KEY = "shard_checksums"


def chunk_sums(path, chunk=CHUNK):
    """{"size", "chunk_bytes", "sha256": [hex of each chunk]} of the file at `path`."""
    sums = []
    with open(path, "rb") as f:
        while True:
            h, left = hashlib.sha256(), chunk
            while left:
                data = f.read(min(READ, left))
                if not data:
                    break
                h.update(data)
                left -= len(data)
            if left == chunk:
                break
            sums.append(h.hexdigest())
            if left:
                break
    return {"size": os.path.getsize(path), "chunk_bytes": chunk, "sha256": sums}


def record(out, shard_names, log=None, chunk=CHUNK):
    """The manifest's shard_checksums for the shards in directory `out`."""
    if log:
        log(f"checksumming {len(shard_names)} shard(s) in {chunk >> 20} MiB pieces")
    return {name: chunk_sums(os.path.join(out, name), chunk) for name in shard_names}


def _range(i, chunk, size):
    return f"bytes {i * chunk}-{min((i + 1) * chunk, size) - 1}"


def verify(model_dir, man):
    """(status, detail lines): "pass", "warn" (no checksums recorded) or "fail", every damaged
    shard named with the byte ranges that differ."""
    recorded = man.get(KEY)
    shards = man.get("shards", [])
    if recorded is None:
        return "warn", [f"colibri.json records no shard checksums (converted by colibri "
                        f"{man.get('converter_version', 'before 0.1')}); the shards cannot be verified"]
    if not isinstance(recorded, dict):
        return "fail", [f"colibri.json: '{KEY}' is not an object"]
    problems, checked = [], 0
    for name in shards:
        want = recorded.get(name)
        path = os.path.join(str(model_dir), name)
        if not isinstance(want, dict) or not isinstance(want.get("sha256"), list) \
                or not isinstance(want.get("chunk_bytes"), int) or want["chunk_bytes"] <= 0:
            problems.append(f"{name}: no valid checksum entry in colibri.json")
            continue
        try:
            got = chunk_sums(path, want["chunk_bytes"])
        except OSError as e:
            problems.append(f"{name}: cannot read ({e.strerror})")
            continue
        checked += 1
        chunk, size = want["chunk_bytes"], want.get("size")
        if got["size"] != size:
            problems.append(f"{name}: {got['size']} bytes, {size} recorded at conversion (truncated or appended)")
        bad = [i for i, (a, b) in enumerate(zip(got["sha256"], want["sha256"])) if a != b]
        if bad:
            ranges = ", ".join(_range(i, chunk, got["size"]) for i in bad[:8])
            more = f" and {len(bad) - 8} more" if len(bad) > 8 else ""
            problems.append(f"{name}: {ranges}{more} differ from the checksums recorded at conversion")
    if problems:
        return "fail", problems
    return "pass", [f"{checked} shard(s) match the checksums recorded at conversion"]


FIX = ("the shard is damaged (disk, copy or download): re-run `coli convert SRC OUT` after deleting the named "
       "shards (the conversion resumes and rewrites them), or copy them again from a good container")
