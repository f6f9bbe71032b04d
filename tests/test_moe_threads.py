"""MoE layers give the same logits on any thread count: with one thread the selected experts run
one after another; with two they run in parallel, one expert per thread, where the layer's work
pays for a parallel region (the 200-position case here) and up to c/experts/moe_exec.c's
PAR_EXPERT_ROWS (position, choice) rows a pass, and past it each expert's matmuls are split;
the bits must not change (placement changes speed, never the answer)."""
import subprocess

import pytest

from launcher_helpers import convert_tiny

from colibri import engine_client


@pytest.fixture(scope="module")
def tiny(oracle_root, tmp_path_factory):
    return convert_tiny(oracle_root, tmp_path_factory.mktemp("moe_threads") / "moe")


def logits(model, ids, threads, out, extra=()):
    r = subprocess.run([str(engine_client.ensure_built()), "logits", "--model", str(model), "--ids",
                        ",".join(map(str, ids)), "--out", str(out), "--threads", str(threads), *extra],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out.read_bytes()


@pytest.mark.parametrize("n", [1, 3, 200])  # 200 positions: 128-position passes of 256 rows, in parallel
def test_threads_do_not_change_moe_logits(tiny, tmp_path, n):
    ids = [(7 * i + 3) % 200 + 1 for i in range(n)]
    one = logits(tiny, ids, 1, tmp_path / "one.f32")
    two = logits(tiny, ids, 2, tmp_path / "two.f32")
    assert len(one) > 0 and one == two


def test_threads_do_not_change_moe_logits_past_the_parallel_rows(oracle_root, tmp_path):
    """400 positions of a top-3 model in one 512-position pass: 1200 rows, past PAR_EXPERT_ROWS
    (1024), so two threads split each expert's matmuls instead."""
    model = convert_tiny(oracle_root, tmp_path / "ds", family="deepseek_v3")
    ids = [(7 * i + 3) % 200 + 1 for i in range(400)]
    one = logits(model, ids, 1, tmp_path / "one.f32", ("--batch", "512"))
    two = logits(model, ids, 2, tmp_path / "two.f32", ("--batch", "512"))
    assert len(one) > 0 and one == two
