"""Every subcommand that takes --model, given a model folder broken in each way a user meets:
a clear error that names the problem, a non-zero exit, and never a Python traceback."""
import json
import os
import shutil
from pathlib import Path

import pytest

from launcher_helpers import clean_env, coli, convert_tiny, shard_of


def _missing(d, good):
    return d / "missing", "no such directory"


def _a_file(d, good):
    (d / "model.bin").write_text("not a model")
    return d / "model.bin", "not a container directory"


def _empty(d, good):
    (d / "empty").mkdir()
    return d / "empty", "colibri.json"


def _hf_checkpoint(d, good):
    (d / "hf").mkdir()
    shutil.copyfile(good / "config.json", d / "hf" / "config.json")
    return d / "hf", "coli convert"


def _copy(d, good):
    m = d / "m"
    shutil.copytree(good, m)
    return m


def _manifest_not_json(d, good):
    m = _copy(d, good)
    (m / "colibri.json").write_text('{"format": "colibri-container", ')
    return m, "colibri.json"


def _manifest_not_utf8(d, good):
    m = _copy(d, good)
    (m / "colibri.json").write_bytes(b"\xff\xfe\x00garbage")
    return m, "colibri.json"


def _manifest_is_a_directory(d, good):
    m = _copy(d, good)
    (m / "colibri.json").unlink()
    (m / "colibri.json").mkdir()
    return m, "colibri.json"


def _manifest_lacks_arch_fields(d, good):
    m = _copy(d, good)
    man = json.loads((m / "colibri.json").read_text())
    man["arch"] = {}
    (m / "colibri.json").write_text(json.dumps(man))
    return m, "colibri.json"


def _shard_missing(d, good):
    m = _copy(d, good)
    name = shard_of(m).name
    shard_of(m).unlink()
    return m, name


def _shard_truncated(d, good):
    m = _copy(d, good)
    s = shard_of(m)
    s.write_bytes(s.read_bytes()[:4096])
    return m, s.name


def _shard_header_garbage(d, good):
    m = _copy(d, good)
    s = shard_of(m)
    raw = bytearray(s.read_bytes())
    raw[8:40] = b"\xff" * 32
    s.write_bytes(bytes(raw))
    return m, s.name


BROKEN = [_missing, _a_file, _empty, _hf_checkpoint, _manifest_not_json, _manifest_not_utf8,
          _manifest_is_a_directory, _manifest_lacks_arch_fields, _shard_missing, _shard_truncated,
          _shard_header_garbage]


def _commands(tmp):
    text = tmp / "text.txt"
    text.write_text("hello world " * 20)
    return {
        "info": [], "plan": ["--no-measure"], "doctor": [], "run": ["hello"], "chat": [], "tune": [],
        "serve": ["--port", "0", "--no-kv-persist"], "logits": ["--ids", "1,2", "--out", tmp / "logits.f32"],
        "tokenize": ["hello"], "detokenize": ["1,2"], "perplexity": ["--file", text], "bench": [],
    }


@pytest.fixture(scope="module")
def good(oracle_root, tmp_path_factory):
    return convert_tiny(oracle_root, tmp_path_factory.mktemp("broken") / "good")


@pytest.mark.parametrize("breakage", BROKEN, ids=lambda f: f.__name__.strip("_"))
def test_every_command_refuses_a_broken_model_clearly(breakage, good, tmp_path):
    model, problem = breakage(tmp_path, good)
    env = clean_env(COLI_HOME=tmp_path / "store", COLI_PROFILE_DIR=tmp_path / "profiles")
    failures = []
    for cmd, extra in _commands(tmp_path).items():
        r = coli(cmd, "--model", model, *extra, env=env, input="", timeout=120)
        out = r.stdout + r.stderr
        if r.returncode == 0 or "Traceback" in out or problem not in out:
            failures.append(f"coli {cmd}: exit {r.returncode}, output:\n{out[-1500:]}")
    assert not failures, f"{breakage.__name__}, expected a message naming {problem!r}\n" + "\n".join(failures)


def test_the_sweep_model_itself_works(good, tmp_path):
    """The breakages above start from a model every command accepts."""
    env = clean_env(COLI_HOME=tmp_path / "store", COLI_PROFILE_DIR=tmp_path / "profiles")
    for cmd, extra in (("info", []), ("plan", ["--no-measure"]), ("tokenize", ["hello"])):
        r = coli(cmd, "--model", good, *extra, env=env)
        assert r.returncode == 0 and "Traceback" not in r.stderr, (cmd, r.stderr)
    assert os.path.isdir(good)
    assert Path(good, "colibri.json").is_file()
