"""The per-op decode profile (`--profile`, c/util/op_prof.h): END carries each op's time and the
weight bytes it read per decode step. The bytes are checked against the container's own tensor
sizes (the trunk's classes once per token, top_k of each MoE layer's experts), the times only for
their structure: every op present, none negative, and summing to the step time. With the flag
off nothing of it appears and the tokens and their logprobs are the same."""
import pytest

from launcher_helpers import convert_tiny

from colibri import engine_client
from colibri.model import container_scan

OPS = ("loop", "norm", "attn_proj", "attn_kv", "router", "experts", "mlp", "head", "sampler", "sync")


@pytest.fixture(scope="module")
def moe(oracle_root, tmp_path_factory):
    return convert_tiny(oracle_root, tmp_path_factory.mktemp("prof") / "moe")


def decode(model, threads, extra=(), gen=12):
    out, end = [], None
    with engine_client.Engine(model, threads=threads, extra=list(extra)) as eng:
        for ev in eng.generate([5, 9, 13, 17], max_tokens=gen, ignore_eos=1, temp=0, logprobs=1, top_logprobs=5):
            if ev[0] in ("data", "logprob"):
                out.append(ev[1:])
            elif ev[0] == "end":
                end = ev[1]
    return out, end


@pytest.mark.parametrize("threads", [1, 2])
def test_profile_fields_count_the_weight_bytes_of_each_op(moe, threads):
    _, end = decode(moe, threads, ["--profile"])
    steps = int(end["prof_steps"])
    assert steps == int(end["completion_tokens"]) - 1  # one forward pass per token fed back
    for op in OPS:
        assert float(end[f"prof_{op}_ms"]) >= 0 and float(end[f"prof_{op}_bytes"]) >= 0
    total = sum(float(end[f"prof_{op}_ms"]) for op in OPS)
    assert total == pytest.approx(float(end["prof_token_ms"]), rel=1e-3, abs=1e-3)
    scan = container_scan.scan(moe)
    c, a = scan["classes"], scan["arch"]
    per_expert = scan["expert_bytes"] / (len(a["moe_layers"]) * a["experts"])
    want = {"attn_proj": c["attention"], "mlp": c["dense_mlp"], "head": c["lm_head"], "router": c["router"],
            "experts": len(a["moe_layers"]) * a["top_k"] * per_expert}
    for op, b in want.items():
        assert float(end[f"prof_{op}_bytes"]) == pytest.approx(b), op
    for op in ("loop", "norm", "attn_kv", "sampler", "sync"):
        assert float(end[f"prof_{op}_bytes"]) == 0, op
    # the ops that read weights report a rate, bytes over their time (ms printed to 1e-4)
    for op in want:
        ms, gbs = float(end[f"prof_{op}_ms"]), float(end[f"prof_{op}_gbs"])
        if ms > 1e-4:
            assert want[op] / (ms + 5e-5) / 1e6 - 0.006 <= gbs <= want[op] / (ms - 5e-5) / 1e6 + 0.006, op


@pytest.mark.parametrize("threads", [1, 2])
def test_profile_off_changes_nothing(moe, threads):
    plain, end = decode(moe, threads)
    profiled, pend = decode(moe, threads, ["--profile"])
    assert not any(k.startswith("prof_") for k in end)
    assert len(plain) == 2 * 12 and plain == profiled
