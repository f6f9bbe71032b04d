"""The launcher as a new user meets it: help, every subcommand with no model, a wrong path, a
non-model directory and a good model; flags refused with reasons; info; build; tune and profiles."""
import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from launcher_helpers import ROOT, clean_env, coli, convert_tiny
from server_helpers import ServerProc

from colibri.machine import tune_profile

MODEL_COMMANDS = ["info", "plan", "doctor", "run", "chat", "tune"]


@pytest.fixture(scope="module")
def model(oracle_root, tmp_path_factory):
    return convert_tiny(oracle_root, tmp_path_factory.mktemp("cli") / "moe")


@pytest.fixture
def profiles(tmp_path):
    return clean_env(COLI_PROFILE_DIR=tmp_path / "profiles")


def test_help_lists_every_command_and_starts_fast():
    t = time.monotonic()
    r = coli("--help")
    took = time.monotonic() - t
    assert r.returncode == 0
    for cmd in ("chat", "run", "info", "plan", "doctor", "tune", "build", "convert"):
        line = next((ln for ln in r.stdout.splitlines() if ln.strip().startswith(cmd + " ")), "")
        assert line and "not implemented" not in line, cmd
    assert took < 10  # generous: a loaded 2-core machine; a heavy import would show up as far more


@pytest.mark.parametrize("cmd,flags", [
    ("serve", ["--ram", "--cap", "--no-direct", "--readahead", "--pin", "--kv-slots"]),
    ("logits", ["--ram", "--cap", "--no-direct", "--readahead", "--pin", "--ctx"]),
    ("perplexity", ["--ram", "--cap", "--no-direct", "--readahead", "--pin"]),
    ("bench", ["--ram", "--cap", "--no-direct", "--readahead", "--pin"]),
    ("plan", ["--json", "--ram", "--ctx", "--kv-slots", "--cap", "--mem-bw", "--disk-bw"]),
    ("doctor", ["--deep", "--json"]),
    ("chat", ["--ram", "--ctx", "--cap", "--temp", "--top-p", "--max-tokens", "--threads", "--think", "--no-think",
              ":reset", ":more", "--no-profile"]),
    ("run", ["--ram", "--ctx", "--cap", "--no-direct", "--readahead", "--pin", "--temp", "--top-p", "--max-tokens", "--threads", "--think", "--no-think"]),
    ("tune", ["--runs", "--tokens", "--show", "--reset"]),
    ("build", ["--clean", "--debug", "--native", "--jobs"]),
    ("info", ["--model"]),
])
def test_subcommand_help_is_complete(cmd, flags):
    r = coli(cmd, "--help")
    assert r.returncode == 0
    for f in flags:
        assert f in r.stdout, (cmd, f)


@pytest.mark.parametrize("cmd", MODEL_COMMANDS)
def test_wrong_path_and_non_model_directories(cmd, tmp_path, oracle_root):
    extra = ["hello"] if cmd == "run" else []
    r = coli(cmd, "--model", tmp_path / "missing", *extra)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "no such directory" in r.stderr + r.stdout
    r = coli(cmd, "--model", tmp_path, *extra)
    assert r.returncode == 2 and "colibri.json" in r.stderr + r.stdout
    r = coli(cmd, "--model", Path(oracle_root) / "qwen3_moe" / "hf", *extra)
    assert r.returncode == 2 and "coli convert" in r.stderr + r.stdout


@pytest.mark.parametrize("cmd", MODEL_COMMANDS)
def test_no_model(cmd):
    r = coli(cmd, "hello") if cmd == "run" else coli(cmd)
    assert "Traceback" not in r.stderr
    text = r.stdout + r.stderr
    assert "--model" in text and "COLI_MODEL" in text
    # the machine-level commands still say something useful without a model
    if cmd in ("info", "plan"):
        assert r.returncode == 0 and "cpu" in r.stdout and "memory" in r.stdout
    elif cmd == "doctor":
        assert r.returncode == 1 and "engine" in r.stdout
    else:
        assert r.returncode == 2


def test_info_for_a_model(model):
    r = coli("info", "--model", model)
    assert r.returncode == 0
    for piece in ("qwen3_moe", "experts", "on disk", "engine       colibri", "kernels", "cpu", "memory", "disk", "gpu"):
        assert piece in r.stdout, piece


def test_info_on_a_damaged_manifest(model, tmp_path):
    import shutil
    d = tmp_path / "m"
    shutil.copytree(model, d)
    man = json.loads((d / "colibri.json").read_text())
    del man["arch"]["num_layers"]
    (d / "colibri.json").write_text(json.dumps(man))
    r = coli("info", "--model", d)
    assert r.returncode == 2 and "damaged" in r.stderr and "coli doctor" in r.stderr


@pytest.mark.parametrize("flags,message", [
    (["--ctx", "100000"], "holds 1 to 512 positions"),
    (["--ctx", "0"], "holds 1 to"),
    (["--cap", "9"], "give 1 to 8 cache slots per layer"),
    (["--cap", "0"], "give 1 to 8 cache slots per layer"),
    (["--ram", "100000"], "in all"),
    (["--ram", "-1"], "positive number of GB"),
    (["--max-tokens", "600"], "give at most 511"),
    (["--max-tokens", "0"], "at least 1"),
    (["--temp", "101"], "0 (greedy) to 100"),
    (["--top-p", "0"], "above 0"),
    (["--min-p", "2"], "0 to 1"),
    (["--threads", "0"], "1 to 1024"),
    (["--batch", "0"], "1 to 65536"),
    (["--think"], "no thinking switch"),
    (["--raw", "--no-think"], "no effect with --raw"),
])
def test_run_refuses_what_the_engine_cannot_honour(model, flags, message):
    r = coli("run", "--model", model, *flags, "hello")
    assert r.returncode == 2, r.stdout
    assert message in r.stderr and "Traceback" not in r.stderr
    assert not r.stdout  # refused before the engine started


def test_run_refuses_max_tokens_the_prompt_leaves_no_room_for(model):
    """--max-tokens that fits the context alone but not after this prompt: the engine's numbers,
    the largest count that fits and, when the model holds more, --ctx; nothing generated."""
    prompt = "Hello " * 110
    r = coli("run", "--model", model, "--raw", "--max-tokens", "100", prompt)
    assert r.returncode == 2 and not r.stdout, r.stderr
    m = re.search(r"maximum context length is 512 tokens, but the request needs (\d+) \((\d+) in the prompt, "
                  r"max_tokens 100\): lower max_tokens to (\d+) or less", r.stderr)
    assert m and int(m[1]) == int(m[2]) + 100 > 512 and int(m[3]) == 512 - int(m[2]), r.stderr
    assert "--ctx" not in r.stderr  # 512 is all this model holds
    r = coli("run", "--model", model, "--raw", "--ctx", "256", "--max-tokens", "100", prompt[:300])
    assert r.returncode == 2 and "raise --ctx (this model holds up to 512 positions)" in r.stderr, r.stderr
    r = coli("run", "--model", model, "--raw", "--stats", prompt)  # no --max-tokens: to the end of the context
    assert r.returncode == 3 and "finish=length" in r.stderr and "the context (512 tokens) is full" in r.stderr


def test_run_accepts_the_full_expert_count(model):
    r = coli("run", "--model", model, "--cap", "8", "--ram", "1", "--max-tokens", "3", "--stats", "--raw", "hi")
    assert r.returncode == 0, r.stderr
    assert "completion_tokens=3" in r.stderr


def test_profile_is_applied_said_and_explicit_flags_win(model, profiles, monkeypatch):
    monkeypatch.setenv("COLI_PROFILE_DIR", profiles["COLI_PROFILE_DIR"])
    path = tune_profile.save(model, {"threads": 1, "batch": 16}, {"decode_tok_s": 100.0})
    r = coli("chat", "--model", model, "--max-tokens", "2", input="hi\n", env=profiles)
    assert r.returncode == 0, r.stderr
    assert f"using the tuned profile threads=1 batch=16 from {path}" in r.stderr
    assert ", 1 threads," in r.stdout  # the engine really runs with it
    r = coli("chat", "--model", model, "--max-tokens", "2", "--threads", "2", input="hi\n", env=profiles)
    assert "batch=16" in r.stderr and "explicit --threads 2 kept" in r.stderr and ", 2 threads," in r.stdout
    r = coli("chat", "--model", model, "--max-tokens", "2", "--no-profile", input="hi\n", env=profiles)
    assert "tuned profile" not in r.stderr
    r = coli("run", "--model", model, "--max-tokens", "2", "--raw", "hi", env={**profiles, "COLI_NO_PROFILE": "1"})
    assert "tuned profile" not in r.stderr
    r = coli("plan", "--model", model, "--no-measure", env=profiles)
    assert "measured by coli tune: 100.0 tok/s" in r.stdout


def test_tune_measures_and_saves_a_profile(model, profiles):
    r = coli("tune", "--model", model, "--runs", "1", "--tokens", "4", "--prompt-tokens", "8", env=profiles)
    assert r.returncode == 0, r.stderr
    assert "threads" in r.stdout and "batch" in r.stdout and "saved" in r.stdout
    assert "not tunable yet" in r.stdout
    files = list(Path(profiles["COLI_PROFILE_DIR"]).glob("*.json"))
    assert len(files) == 1
    prof = json.loads(files[0].read_text())
    assert "spin 0 vs 1000" in r.stdout and "spin 200000 vs" in r.stdout
    assert set(prof["knobs"]) <= {"threads", "batch", "spin"} and prof["measured"]["decode_tok_s"] > 0
    r = coli("tune", "--model", model, "--show", env=profiles)
    assert r.returncode == 0 and str(files[0]) in r.stdout
    r = coli("tune", "--model", model, "--reset", env=profiles)
    assert r.returncode == 0 and not files[0].exists()
    r = coli("tune", "--model", model, "--show", env=profiles)
    assert "no saved profile" in r.stdout


def spin_recording_engine(tmp_path):
    """An engine wrapper that appends the wait settings it was started with to a log, then runs the
    real engine: what the launcher put in the engine's environment, seen from the engine's side."""
    log = tmp_path / "wait.log"
    wrapper = tmp_path / "engine"
    wrapper.write_text(f"#!/bin/sh\necho \"${{GOMP_SPINCOUNT-unset}} ${{OMP_WAIT_POLICY-unset}}\" >> {log}\n"
                       f"exec {ROOT / 'build' / 'colibri'} \"$@\"\n")
    wrapper.chmod(0o755)
    return wrapper, log


def test_spin_reaches_the_engine_from_the_flag_and_the_profile(model, profiles, tmp_path, monkeypatch):
    wrapper, log = spin_recording_engine(tmp_path)
    env = {**profiles, "COLI_ENGINE": str(wrapper), "OMP_WAIT_POLICY": "active"}

    def last_wait():
        return log.read_text().splitlines()[-1]

    r = coli("run", "--model", model, "--max-tokens", "2", "--raw", "hi", env=env)
    assert r.returncode == 0, r.stderr
    assert last_wait() == "unset active"  # the user's own policy wins over the default
    r = coli("run", "--model", model, "--max-tokens", "2", "--raw", "hi", "--spin", "0", env=env)
    assert r.returncode == 0 and last_wait() == "0 unset"  # --spin wins over the environment
    monkeypatch.setenv("COLI_PROFILE_DIR", profiles["COLI_PROFILE_DIR"])
    path = tune_profile.save(model, {"spin": 0}, {"decode_tok_s": 100.0})
    assert tune_profile.load(model)["knobs"] == {"spin": 0}  # 0 is a setting, not a missing one
    r = coli("chat", "--model", model, "--max-tokens", "2", input="hi\n", env=env)
    assert r.returncode == 0 and f"using the tuned profile spin=0 from {path}" in r.stderr and last_wait() == "0 unset"
    r = coli("run", "--model", model, "--max-tokens", "2", "--raw", "hi", "--spin", "20000", env=env)
    assert "tuned profile" not in r.stderr and last_wait() == "20000 unset"  # nothing of it left to apply
    out = tmp_path / "logits.bin"
    r = coli("logits", "--model", model, "--ids", "1,2", "--out", out, "--spin", "300", env=env)
    assert r.returncode == 0, r.stderr
    assert last_wait() == "300 unset"
    r = coli("bench", "--model", model, "--repeat", "1", "--gen-tokens", "2", "--prompt-tokens", "4", "--temp", "0",
             "--spin", "4000", "--json", "--mem-bw", "10", env=env)
    assert r.returncode == 0, r.stderr
    assert last_wait() == "4000 unset" and json.loads(r.stdout)["colibri"]["wait"] == "spin 4000"
    for cmd in (["run", "--raw", "hi"], ["bench"], ["serve", "--port", "0"], ["logits", "--ids", "1", "--out", out]):
        r = coli(cmd[0], "--model", model, *cmd[1:], "--spin", "-1", env=env)
        assert r.returncode == 2 and "--spin -1" in r.stderr, (cmd, r.stderr)


def test_serve_applies_the_profile_and_explicit_flags_win(model, profiles, tmp_path, monkeypatch):
    wrapper, log = spin_recording_engine(tmp_path)
    monkeypatch.setenv("COLI_PROFILE_DIR", profiles["COLI_PROFILE_DIR"])
    path = tune_profile.save(model, {"threads": 1, "spin": 0}, {"decode_tok_s": 100.0})
    env = {"COLI_PROFILE_DIR": profiles["COLI_PROFILE_DIR"], "COLI_ENGINE": str(wrapper)}
    cases = (((), 1, "0 unset", "threads=1 spin=0"),
             (("--threads", "2"), 2, "0 unset", "spin=0 (explicit --threads 2 kept)"),
             (("--no-profile",), None, "1000 unset", None))
    for flags, threads, wait, said in cases:
        srv = ServerProc(model, "--no-kv-persist", *flags, env=env, log_dir=tmp_path)
        try:
            _, _, body = srv.request("GET", "/v1/colibri/runtime")
            engine_threads = json.loads(body)["engine"]["threads"]
        finally:
            srv.stop()
        assert log.read_text().splitlines()[-1] == wait, srv.log()
        if said:
            assert f"using the tuned profile {said} from {path}" in srv.log()
            assert engine_threads == threads
        else:
            assert "tuned profile" not in srv.log()


def test_tune_keeps_only_clear_wins():
    import autotune
    assert autotune.clear_win([1.2, 1.3, 1.25], 0.05)
    assert not autotune.clear_win([1.2, 0.9, 1.25], 0.05)  # one pair slower of three
    assert autotune.clear_win([1.2, 0.9, 1.25, 1.3, 1.2], 0.05)  # all but one of five
    assert not autotune.clear_win([1.02, 1.03, 1.01], 0.05)  # below the threshold


def test_tune_takes_a_longer_spin_only_when_it_holds_up_beside_a_busy_process():
    import autotune
    fast, asked = [1.3, 1.3, 1.3], []

    def loaded(ratio):
        return lambda: asked.append(ratio) or ratio

    assert autotune.judge("spin", 200000, 1000, fast, True, 0.05, loaded(0.02)) == (
        False, "keep 1000: beside one busy process it runs at 0.02x, its threads wait for each other")
    assert autotune.judge("spin", 20000, 1000, fast, True, 0.05, loaded(0.95)) == (True, "take 20000")
    assert asked == [0.02, 0.95]
    assert autotune.judge("spin", 0, 1000, fast, True, 0.05, loaded(0.1)) == (True, "take 0")  # sleeping is safe
    assert autotune.judge("batch", 512, 128, fast, True, 0.05, loaded(0.1)) == (True, "take 512")
    assert autotune.judge("spin", 20000, 1000, [1.01] * 3, True, 0.05, loaded(1.0))[0] is False
    assert "differ" in autotune.judge("spin", 20000, 1000, fast, False, 0.05, loaded(1.0))[1]
    assert asked == [0.02, 0.95]  # only a winning longer spin pays for the loaded run


def test_tune_refuses_bad_settings(model, profiles):
    r = coli("tune", "--model", model, "--prompt-tokens", "500", "--tokens", "100", env=profiles)
    assert r.returncode == 2 and "positions" in r.stderr
    r = coli("tune", "--model", model, "--runs", "0", env=profiles)
    assert r.returncode == 2 and "--runs" in r.stderr


def test_build_dry_run_passes_flags_through_the_environment():
    r = coli("build", "--dry-run", "--debug", "--jobs", "3")
    assert r.returncode == 0
    assert "CFLAGS='-O0 -g'" in r.stdout and "-j3" in r.stdout and "build/colibri" in r.stdout
    assert " -B " in r.stdout  # other flags than the last build: a full rebuild
    r = coli("build", "--dry-run", "--jobs", "0")
    assert r.returncode == 2 and "--jobs" in r.stderr


def test_engine_status_reports_version_and_kernels():
    from colibri.engine_status import engine_status
    st = engine_status()
    assert st["built"], "run make first"
    assert st["version"] == st["expected_version"]
    assert st["kernels"].split()[0] in ("amx", "vnni", "avx512", "avx2", "portable")
    out = subprocess.run([str(ROOT / "build" / "colibri"), "version"], capture_output=True, text=True).stdout
    assert out.split()[1] == st["version"]


def test_model_from_the_environment(model):
    r = coli("info", env=clean_env(COLI_MODEL=model))
    assert r.returncode == 0 and "qwen3_moe" in r.stdout


def test_no_arguments_is_a_usage_error():
    r = coli()
    assert r.returncode == 2  # as for any usage error; 0 would tell a script that something ran
    assert r.stderr.startswith("usage: coli") and "convert" in r.stderr and not r.stdout


@pytest.fixture
def store(model, tmp_path):
    """A model store holding `model` under the pulled name tiny-moe."""
    (tmp_path / "home" / "models").mkdir(parents=True)
    (tmp_path / "home" / "models" / "tiny-moe").symlink_to(model, target_is_directory=True)
    return clean_env(COLI_HOME=tmp_path / "home", COLI_PROFILE_DIR=tmp_path / "profiles")


@pytest.mark.parametrize("cmd,extra", [("plan", ["--no-measure"]), ("doctor", []), ("info", [])])
def test_pulled_names_work_for_every_model_command(store, tmp_path, cmd, extra):
    r = coli(cmd, "--model", "tiny-moe", *extra, env=store, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert str(tmp_path / "home" / "models" / "tiny-moe") in r.stdout
    # a name that is not pulled: refused with what there is, and nothing is downloaded for a read-only command
    r = coli(cmd, "--model", "smollm2", *extra, env=store, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "no such directory or pulled model (pulled: tiny-moe)" in r.stdout + r.stderr
    assert not (tmp_path / "home" / "downloads").exists()


def _tokens(eng, **opts):
    return [ev[1] for ev in eng.generate([1, 2, 3, 4], max_tokens=16, **opts) if ev[0] == "data" and ev[1] >= 0]


def test_top_p_through_the_engine(model):
    """End to end, no statistics: a top_p so small that one token is left gives the greedy
    stream at a high temperature for every seed, while the same temperature with top_p 1 leaves it."""
    from colibri import engine_client
    with engine_client.Engine(model, threads=1) as eng:
        greedy = _tokens(eng, temp=0)
        assert len(greedy) == 16
        for seed in (1, 2, 3, 4, 5):
            assert _tokens(eng, temp=3.0, top_p=1e-6, seed=seed) == greedy, seed
        sampled = [_tokens(eng, temp=3.0, top_p=1.0, seed=seed) for seed in (1, 2, 3, 4, 5)]
    assert any(s != greedy for s in sampled)  # the check above would notice top_p being ignored


def test_tokenize_takes_the_model_after_the_text(model):
    want = coli("tokenize", "--model", model, "hello")
    assert want.returncode == 0 and want.stdout
    for args in (("tokenize", "hello", "--model", model), ("tokenize", "hello", f"--model={model}")):
        r = coli(*args)
        assert r.returncode == 0 and r.stdout == want.stdout, r.stderr
