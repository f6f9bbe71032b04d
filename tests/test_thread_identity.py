"""Logits are the same bytes on 1, 2 and 3 threads, token by token (--batch 1: every matmul is a
decode-shaped one, q/k/v and gate/up fused into one pass each, kernels/ops.c matmul_fused) and
in batched prefill: how the work is split over threads, and how idle threads wait (GOMP_SPINCOUNT,
--spin), changes speed, never the answer."""
import subprocess

import pytest

from launcher_helpers import convert_tiny

from colibri import engine_client


@pytest.fixture(scope="module", params=["llama", "qwen3_moe"])
def model(request, oracle_root, tmp_path_factory):
    return convert_tiny(oracle_root, tmp_path_factory.mktemp("threads") / request.param, family=request.param)


def logits(model, ids, threads, out, extra=(), spin=None):
    r = subprocess.run([str(engine_client.ensure_built()), "logits", "--model", str(model), "--ids",
                        ",".join(map(str, ids)), "--out", str(out), "--threads", str(threads), *extra],
                       capture_output=True, text=True, timeout=300, env=engine_client.engine_env(spin))
    assert r.returncode == 0, r.stderr
    return out.read_bytes()


@pytest.mark.parametrize("batch", ["1", "128"])
def test_logits_are_the_same_bytes_on_any_thread_count(model, tmp_path, batch):
    ids = [(11 * i + 5) % 250 + 1 for i in range(24)]
    runs = [logits(model, ids, n, tmp_path / f"{n}.f32", ("--batch", batch)) for n in (1, 2, 3)]
    assert len(runs[0]) > 0
    assert runs[0] == runs[1] == runs[2]


def test_logits_are_the_same_bytes_under_every_wait_policy(model, tmp_path):
    ids = [(7 * i + 3) % 250 + 1 for i in range(12)]
    runs = [logits(model, ids, 2, tmp_path / f"spin{s}.f32", ("--batch", "4"), spin=s) for s in (0, 1000, 200000)]
    assert len(runs[0]) > 0 and runs[0] == runs[1] == runs[2]
