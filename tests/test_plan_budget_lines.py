"""The planner counts what the engine allocates besides weights, KV and scratch: each slot's
turn-boundary checkpoints (recurrent state, sliding-window rings), the grammar's vocabulary trie,
and the grammar's mask cache, which is elastic and sized from the budget. Each is its own line
of `coli plan`, and the engine's READY line reports the same bytes (test_budget_agreement)."""
import json

from launcher_helpers import coli, write_synthetic

from colibri.model import container_scan
import resource_plan

MB = 1e6


def scan_with(layers=(), tokenizer_bytes=0, vocab=1000, tmp=None):
    """A synthetic container's scan with the given per-layer state descriptors and tokenizer."""
    d, _ = write_synthetic(tmp, layers=4, experts=16, vocab=vocab)
    s = container_scan.scan(d)
    s["kv_layers"] = list(layers) or s["kv_layers"]
    s["tokenizer_bytes"] = tokenizer_bytes
    return s


GQA = {"kv_values_per_pos": 256, "truncatable": True}
WINDOW = {"kv_values_per_pos": 256, "truncatable": True, "window": 128}
RECURRENT = {"fixed_bytes": 1 << 20, "truncatable": False}


def test_checkpoint_bytes_follow_the_state_descriptors(tmp_path):
    plain = scan_with([GQA] * 4, tmp=tmp_path / "a")
    assert resource_plan.checkpoint_bytes(plain, 4096) == 0  # any prefix is reusable: no checkpoints
    windowed = scan_with([WINDOW, GQA, WINDOW, GQA], tmp=tmp_path / "b")
    ring = 256 * 2 * 128  # f16 values x window
    assert resource_plan.checkpoint_bytes(windowed, 4096) == 2 * ring
    assert resource_plan.checkpoint_bytes(windowed, 100) == 0  # the window never wraps at this context
    hybrid = scan_with([RECURRENT, RECURRENT, RECURRENT, GQA], tmp=tmp_path / "c")
    assert resource_plan.checkpoint_bytes(hybrid, 4096) == 3 << 20


def test_checkpoints_are_counted_per_slot_and_take_from_the_expert_cache(tmp_path):
    s = scan_with([RECURRENT, RECURRENT, RECURRENT, GQA], tmp=tmp_path / "m")
    from test_launcher_plan import machine
    floor = resource_plan.plan(s, machine(), ram=int(1e12), ctx=512, kv_slots=4, cap=1, threads=2)["min_ram"]
    per_cap = s["experts"]["slot_bytes"] * s["experts"]["layers"]
    kw = dict(ram=floor + 3 * per_cap, ctx=512, mem_bw=20, disk_bw=2, threads=2)  # 4 slots: 3 or 4 expert slots
    one, four = (resource_plan.plan(s, machine(), kv_slots=n, **kw) for n in (1, 4))
    assert one["tiers"]["checkpoints"] == resource_plan.KV_MAX_CHECKPOINTS * (3 << 20)
    assert four["tiers"]["checkpoints"] == 4 * one["tiers"]["checkpoints"]
    assert four["engine_split"]["checkpoint_bytes"] == four["tiers"]["checkpoints"]
    assert four["tiers"]["expert_cache"] < one["tiers"]["expert_cache"]
    t = four["tiers"]
    assert sum(t[k] for k in ("dense", "runtime", "kv", "checkpoints", "grammar", "mask_cache", "expert_cache",
                              "free")) == four["budget"]


def test_grammar_is_counted_only_with_a_tokenizer_and_grows_with_the_vocabulary(tmp_path):
    from test_launcher_plan import machine
    kw = dict(ram=int(500 * MB), ctx=256, mem_bw=20, disk_bw=2, threads=2)
    none = resource_plan.plan(scan_with(tmp=tmp_path / "a"), machine(), **kw)
    assert none["tiers"]["grammar"] == 0 and none["tiers"]["mask_cache"] == 0
    small = resource_plan.plan(scan_with(tokenizer_bytes=1000, vocab=1000, tmp=tmp_path / "b"), machine(), **kw)
    big = resource_plan.plan(scan_with(tokenizer_bytes=1000, vocab=152000, tmp=tmp_path / "c"), machine(), **kw)
    assert 0 < small["tiers"]["grammar"] < big["tiers"]["grammar"]
    assert big["tiers"]["grammar"] == resource_plan.grammar_reserve(152000, 1) > 150 * 152000


def test_the_mask_cache_is_sized_from_the_budget(tmp_path):
    from test_launcher_plan import machine
    s = scan_with(tokenizer_bytes=1000, tmp=tmp_path / "m")
    floor = resource_plan.plan(s, machine(), ram=int(1e12), ctx=256, cap=1, threads=2)["min_ram"]
    at = lambda ram: resource_plan.plan(s, machine(), ram=ram, ctx=256, mem_bw=20, disk_bw=2, threads=2)  # noqa: E731
    assert at(floor)["tiers"]["mask_cache"] == 0  # the smallest budget keeps no mask: each is rebuilt
    spare = int(32 * MB)
    assert at(floor + spare)["tiers"]["mask_cache"] == spare // resource_plan.MASK_CACHE_SHARE
    assert at(int(1e12))["tiers"]["mask_cache"] == resource_plan.MASK_CACHE_MAX  # bounded however large
    split = resource_plan.budget_split(s, None, 0, 0, grammar=1)
    assert split["mask_cache"] == resource_plan.MASK_CACHE_MAX  # no budget: the bound alone


def test_plan_text_shows_each_line(tmp_path):
    d, _ = write_synthetic(tmp_path / "m", layers=4, experts=16)
    (d / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}))
    r = coli("plan", "--model", d, "--no-measure", "--ram", "0.5", "--ctx", "256")
    assert r.returncode == 0, r.stderr
    lines = {ln.split()[0]: ln for ln in r.stdout.splitlines() if ln.startswith("  ") and ln.split()}
    assert "(none: every layer can be cut at any prefix)" in lines["checkpoints"]
    assert "vocabulary trie" in lines["grammar"]
    assert "elastic: 1/16 of the budget beyond its minimum" in lines["mask"]


def test_the_start_up_budget_line_names_what_is_counted():
    from colibri import launch_opts
    info = {"ram_budget": "1000000000", "dense_bytes": "100000000", "kv_bytes": "2000000", "runtime_bytes": "30000000",
            "checkpoint_bytes": "52000000", "grammar_bytes": "27000000", "mask_cache_bytes": "0",
            "expert_cache_bytes": "500000000", "cap": "10", "experts": "64", "batch": "128"}
    line = launch_opts.budget_line(info)
    assert "checkpoints 52.00 MB + grammar 27.00 MB + expert cache 500.00 MB" in line
    assert "mask cache" not in line  # a zero line is left out
