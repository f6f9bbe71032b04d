"""Hardware discovery and the RAM / disk tier plan (`coli plan [--json]`); also the planner API
that `coli info`, doctor, chat and the flag checks import.

The plan reads safetensors headers only (container_scan) and the machine (machine_probe); no
weights are loaded. Stdlib only; bandwidth is measured only by `coli plan`.
"""
import json
import os
from pathlib import Path

from colibri.errors import UserError
from colibri.model.paths import check_arch, missing_model_message, model_arg, model_path
from colibri.limits import DEFAULT_BATCH, RUNTIME_BASE, default_batch
# discovery lives in machine_probe; the planner API re-exports it
from colibri.machine.probe import (BUDGET_SHARE, cpu_info, disk_info, discover, gpu_info, measure_disk_bw,  # noqa: F401
                           fmt_bytes, machine_lines, measure_memory_bw, memory_info)
from colibri.family import specs as family_specs
from colibri import launch_opts
from colibri.model import container_scan
import family_registry

HELP = "plan RAM and disk use for a model on this machine (reads headers only)"
DESCRIPTION = """Discovers this machine (cores, RAM, cgroup limits, free disk, GPUs), reads the
model's safetensors headers (dense bytes, expert bytes per layer, expert count) and plans the
memory tiers: dense trunk + runtime + KV cache x slots + expert cache, cache slots per layer,
projected expert hit rate, the expected bottleneck and a tok/s range from disk and memory
bandwidth (measured quickly unless given with --mem-bw/--disk-bw). The split is the one the engine
makes for the same budget (its READY line reports it): dense trunk, KV and working memory
resident, routed experts streamed through the cache."""

GB = 1e9


# ---------------------------------------------------------------- the engine's budget split
# These mirror c/engine/engine_stream.c (engine_runtime_bytes) and c/experts/ram_budget.c (ram_budget_split)
# so that `coli plan` prints the split the engine will use; tests/test_budget_agreement.py
# holds them equal to the engine's READY fields.

def _spec_max(layers, block, key):
    """The largest integer value of key in the layer specs' block (attn or mlp); 0 when none."""
    best = 0
    for spec in layers or []:
        b = spec.get(block) if isinstance(spec, dict) else None
        v = b.get(key) if isinstance(b, dict) else None
        if isinstance(v, int) and not isinstance(v, bool) and v > best:
            best = v
    return best


KV_ATT_KT, KV_ATT_PT = 24, 32  # c/kernels/kv_kernels.h: the attention kernels' position and prefetch tiles


def attend_scratch_floats(heads, hd, ctx):
    """c/engine/engine_stream.c attend_scratch_floats: one thread's attention scratch at most (blocks of
    up to 64 query rows, a group's heads at least, fewer past 4M floats of scores)."""
    R = max(heads, 64)
    full = (R + 15) * (ctx + R + KV_ATT_KT)
    bound = max((4 << 20) + 15 * ctx + (R + 15) * (R + KV_ATT_KT), (heads + 15) * (ctx + heads + KV_ATT_KT))
    return min(full, bound) + hd * (R + 15 + KV_ATT_KT + KV_ATT_PT) + 4 * (R + 15)


def _indexer_max(layers, key):
    """c/engine/engine_stream.c indexer_max: the largest value of key in the layers' DSA indexer objects."""
    best = 0
    for layer in layers or []:
        ix = (layer.get("attn") or {}).get("indexer") if isinstance(layer, dict) else None
        v = ix.get(key) if isinstance(ix, dict) else None
        if isinstance(v, int) and not isinstance(v, bool):
            best = max(best, v)
    return best


def mla_chunk_bytes(layers, batch, ctx):
    """c/engine/engine_stream.c mla_chunk_bytes: latent attention's chunk buffers, the expanded keys and
    values of a prompt's first chunks or the absorbed queries and outputs, the indexer's selection."""
    nh, kl = _spec_max(layers, "attn", "heads"), _spec_max(layers, "attn", "kv_lora_rank")
    if not kl:
        return 0
    dn, dr = _spec_max(layers, "attn", "qk_nope_head_dim"), _spec_max(layers, "attn", "qk_rope_head_dim")
    dv, hd, n_all = _spec_max(layers, "attn", "v_head_dim"), kl + dr, 2 * batch
    xd = max(dn + dr, dv)  # an expanded head's K and V rows, zero-padded
    expanded = n_all * nh * 2 * xd + 128 * (2 * kl + dr + nh * (dn + dv)) + batch * nh * xd + batch // 4 + 1
    absorbed = 2 * max(nh * hd, 1 << 20) + batch * (kl + dv)
    ql = _spec_max(layers, "attn", "q_lora_rank")
    chunk = 4 * batch * (nh * (dn + dr) + nh * dv + hd + ql) + 2 * batch * nh * dv
    ih, ihd = _indexer_max(layers, "heads"), _indexer_max(layers, "head_dim")
    # the selection, the indexer's queries, weights and keys of a chunk, a decode query's scores
    keep = batch * ctx + 4 * (batch * (ih * ihd + ih + ihd) + ctx) if _indexer_max(layers, "topk") else 0
    return chunk + 4 * max(expanded, absorbed) + keep


def _pos_floats(man):
    """c/engine/engine_stream.c pos_floats: working floats per prefill position."""
    a, layers = man["arch"], man.get("layers")
    H = int(a.get("hidden_size") or 0)
    qd = max(_spec_max(layers, "attn", "heads") * _spec_max(layers, "attn", "head_dim"), H)
    W = max(_spec_max(layers, "mlp", "width"), H)
    K, E = _spec_max(layers, "mlp", "top_k"), _spec_max(layers, "mlp", "experts")
    return 3 * H + 4 * qd + 2 * W + H + (K + 1) * H + E + 16 * K + qd + W


def _pass_floats(man):
    """c/engine/engine_stream.c pass_floats: the floats one more prefill pass position holds (its
    residual, normed and output rows, hyper-connection streams, an MoE layer's input, K outputs,
    scores and choices, the widest MLP's gate and up rows); attention runs a batch at a time."""
    a, layers = man["arch"], man.get("layers")
    H, K, E = int(a.get("hidden_size") or 0), _spec_max(layers, "mlp", "top_k"), _spec_max(layers, "mlp", "experts")
    shared = max([int(((spec.get("mlp") or {}).get("shared") or {}).get("width") or 0)
                  for spec in layers or [] if isinstance(spec, dict)] or [0])
    W = max(_spec_max(layers, "mlp", "width"), shared)
    hc = (man.get("trunk") or {}).get("hc_head")
    S = int(hc.get("n") or 1) if isinstance(hc, dict) else 1
    return (S + 2) * H + (H + S + S * S if isinstance(hc, dict) else 0) + (K + 1) * H + E + 4 * K + 2 * W


def pass_pos_bytes(man, ctx, logits_rows=0):
    """c/engine/engine_stream.c engine_pass_pos_bytes: what one more prefill pass position holds
    (its working floats, a DSA indexer's selection row of ctx bytes, its logits for `coli logits`)."""
    keep = ctx if _indexer_max(man.get("layers"), "topk") else 0
    return 4 * _pass_floats(man) + keep + (4 * int(man["arch"].get("vocab_size") or 0) if logits_rows else 0)


def runtime_bytes(man, ctx, batch=DEFAULT_BATCH, threads=1, logits_rows=0, tokenizer_bytes=0, streams=1):
    """Engine working memory besides weights and KV: per-position scratch of one prefill chunk,
    per-thread attention scores and rows, each decoding stream's logits and sampler buffers
    (`streams`: --parallel, which defaults to the KV slots), the parsed tokenizer."""
    a, layers = man["arch"], man.get("layers")
    H, V = int(a.get("hidden_size") or 0), int(a.get("vocab_size") or 0)
    qd = max(_spec_max(layers, "attn", "heads") * _spec_max(layers, "attn", "head_dim"), H)
    W = max(_spec_max(layers, "mlp", "width"), H)
    r = RUNTIME_BASE + 4 * max(batch, 1) * _pos_floats(man)
    heads = _spec_max(layers, "attn", "heads")
    mla_hd = _spec_max(layers, "attn", "kv_lora_rank") + _spec_max(layers, "attn", "qk_rope_head_dim")
    hd = max(_spec_max(layers, "attn", "head_dim"), mla_hd)  # MLA: one shared head of kl + dr
    topk = _indexer_max(layers, "topk")  # a DSA selection's gathered rows, the copy its top-k selects on
    gathered = 4 * mla_hd * min(topk, ctx) + 4 * ctx if topk else 0
    # scratch slot 4: MLA's absorption (a head's W_uk rows, dequantized) or the DSA indexer's transposed query
    # (c/kernels/dsa_score.c dsa_score_scratch)
    kl_pad = (_spec_max(layers, "attn", "kv_lora_rank") + 31) // 32 * 32
    idx_q = 4 * _indexer_max(layers, "head_dim") * ((_indexer_max(layers, "heads") + 15) // 16 * 16)
    absorb = max(4 * _spec_max(layers, "attn", "qk_nope_head_dim") * kl_pad, idx_q)
    r += threads * (4 * attend_scratch_floats(heads, hd, ctx) + 4 * 8 * max(qd, W) + gathered + absorb)
    r += mla_chunk_bytes(layers, max(batch, 1), ctx)
    streams = max(streams, 1)
    r += streams * 7 * V * 4  # each stream's logits and sampler buffers (c/engine/sampler.h)
    if streams > 1:
        r += streams * 4 * V  # one batched decode step's logits
    r += 4 * V * min(logits_rows, max(batch, 1))  # one chunk of teacher-forced logits
    return r + tokenizer_bytes * 8  # the tokenizer parse peak


MASK_CACHE_MAX = 64 << 20  # c/experts/ram_budget.h GRAMMAR_MASK_CACHE_MAX
MASK_CACHE_SHARE = 16      # the mask cache takes 1/16 of what the budget has beyond its minimum
KV_MAX_CHECKPOINTS = 4     # c/model/model.h: turn-boundary checkpoints a slot keeps


def grammar_reserve(vocab, runs):
    """c/grammar/grammar_mask.c grammar_reserve_bytes: the grammar's vocabulary trie (150 bytes a token,
    at 8 bytes of text a token) and, per run in flight, two masks and 1 MiB of DFA transitions."""
    mask = (vocab + 31) // 32 * 4
    return vocab * 150 + 65536 * 4 + max(runs, 1) * (2 * mask + (1 << 20))


def checkpoint_bytes(scan, ctx, kv=None):
    """c/model/kv.c kv_checkpoint_bytes: one turn-boundary checkpoint of a slot (every layer's fixed
    recurrent state and every ring of a windowed layer), or 0 when the slot needs none."""
    kv = kv or family_registry.KV_DEFAULT
    fixed = ring = 0
    truncatable = True
    for st in scan.get("kv_layers") or []:
        per_pos, f, trunc, window = family_specs.layer_state({"attn": {"state": st}}, kv)
        fixed += f
        if 0 < window < ctx:
            ring += per_pos * window
        truncatable = truncatable and bool(trunc)
    return 0 if (truncatable or not fixed) and not ring else fixed + ring


def kv_writer_reserve(slot_bytes, checkpoint):
    """c/kv/kv_writer.c kv_writer_reserve, with --kv-dir: the records queued for the writer or being
    written (at most 2 whole ones: a slot of ctx positions, 4 checkpoints) plus one image of a slot."""
    record = 24 + slot_bytes + KV_MAX_CHECKPOINTS * (4 + checkpoint)
    return 2 * record + slot_bytes + KV_MAX_CHECKPOINTS * checkpoint


def budget_split(scan, ram, kv, runtime, cap=None, checkpoints=0, grammar=0, persist=0, prefill=0,
                 prefill_auto=False, mtp=False):
    """The engine's split of a RAM budget (bytes; None or 0: no budget, every expert mapped):
    dense trunk + KV + runtime + state checkpoints + grammar + KV writer + the prefill pass's
    activations past one batch (prefill) fixed, the grammar's mask cache
    elastic (a 16th of the budget beyond its minimum, at most 64 MiB), the expert cache in whole
    slots of the rest. An automatic pass (prefill_auto) shrinks to fit, so it is no part of the
    minimum. Returns streaming, dense, cap (slots per MoE layer), cache (bytes), mask_cache,
    min_ram (smallest budget that fits) and fits. mtp: the MTP head drafts, and its routed experts
    are the expert store's last layers (c/engine/engine_stream.c), out of the dense trunk."""
    ex, mx = scan["experts"], scan.get("mtp_experts") or {}
    dense = scan["tensor_bytes"] - scan["expert_bytes"] + scan["dense_f32_bytes"]
    n, E, slot = ex["layers"], ex["per_layer"] if ex["layers"] else 0, ex["slot_bytes"]
    if mtp and mx.get("layers"):
        dense -= mx["bytes"] - mx["f32_bytes"]
        n, E, slot = n + mx["layers"], max(E, mx["per_layer"]), max(slot, mx["slot_bytes"])
    fixed = dense + kv + runtime + checkpoints + grammar + persist + prefill
    floor = fixed - (prefill if prefill_auto else 0)
    per_cap = n * slot
    mask_max = MASK_CACHE_MAX if grammar else 0
    out = {"streaming": bool(ram or cap), "dense": dense, "kv": kv, "runtime": runtime, "cap": E, "cache": 0,
           "checkpoints": checkpoints, "grammar": grammar, "persist": persist, "mask_cache": mask_max,
           "slot_bytes": slot, "moe_layers": n, "experts": E, "fits": True}
    if not out["streaming"]:
        out["min_ram"] = floor + E * per_cap
        return out
    out["min_ram"] = floor + ((cap or 1) if E else 0) * per_cap
    if ram and ram < out["min_ram"]:
        out["fits"] = False
        return out
    if ram:
        out["mask_cache"] = min(mask_max, (ram - out["min_ram"]) // MASK_CACHE_SHARE)
    if E and not cap and ram:
        out["cap"] = min(E, (ram - fixed - out["mask_cache"]) // per_cap)
    if cap:
        out["cap"] = cap
    out["cache"] = out["cap"] * per_cap if E else 0
    if not E:
        out["cap"] = 0
    return out


PREFILL_PASS_MAX = 4096  # c/model/model.h: an automatic pass covers a whole prompt up to this


DRAFT_DEFAULT_MAX = 8  # c/engine/draft.h


def draft_reserve(scan, ctx, slots, draft, draft_max, kv=None):
    """(bytes, why off) of speculative decoding as c/engine/engine_stream.c reserves them: each
    stream's verify-pass logits and the recurrent state it saves before a verify pass, and with
    --draft mtp each slot's MTP head (its one-layer KV, a verify pass's states, its logits). A
    sliding window or a per-position state that cannot be cut back turns drafting off (engine.c)."""
    if draft in (None, "off"):
        return 0, None
    man, ctx_states = scan["manifest"], [family_specs.layer_state(s, kv or _kv_default()) for s in
                                         scan["manifest"].get("layers") or []]
    for per_pos, _fixed, truncatable, window in ctx_states:
        if (not truncatable and per_pos) or 0 < window < ctx:
            return 0, "recurrent_state" if not truncatable else "sliding_window"
    k = draft_max or DRAFT_DEFAULT_MAX
    a = man["arch"]
    H, V = int(a.get("hidden_size") or 0), int(a.get("vocab_size") or 0)
    total = slots * ((k + 1) * V * 4 + checkpoint_bytes(scan, ctx, kv))
    if draft == "mtp":
        heads = man.get("mtp") or []
        if not heads:
            raise UserError("--draft mtp: this model has no multi-token-prediction layers; plan --draft lookup or off")
        total += slots * (family_specs.kv_slot_bytes([heads[0]["spec"]], ctx, kv or _kv_default())
                          + ((k + 3) * H + V) * 4)
    return total, None


def prefill_pass(split, budget, ctx, batch, per_pos, moe_layers, given=None):
    """c/engine/engine_stream.c prefill_pass_open and c/experts/ram_budget.c ram_budget_pass: the
    positions of one prefill pass and why. Streaming experts: the whole prompt (ctx rounded up to
    whole batches, at most PREFILL_PASS_MAX), shortened to the whole batches past the first that
    half of the budget beyond its minimum and the mask cache holds; resident experts: one batch. Returns
    (positions, why, bytes past one batch); given: --prefill-pass."""
    if given and given % batch:
        raise UserError(f"--prefill-pass {given} must be a multiple of the prefill batch {batch} (--batch)")
    if not split["streaming"] or not moe_layers:
        return batch, "resident", 0
    if given:
        return given, "flag", (given - batch) * per_pos
    want = -(-min(ctx, PREFILL_PASS_MAX) // batch) * batch
    why = "prompt" if ctx <= PREFILL_PASS_MAX else "cap"
    if budget and want > batch and per_pos:
        extra = max(budget - split["min_ram"] - split["mask_cache"], 0) // 2 // per_pos // batch
        if extra < want // batch - 1:
            want, why = (extra + 1) * batch, "budget"
    return want, why, (want - batch) * per_pos


def zipf_mass(c, n, s=1.0):
    """Share of accesses that go to the c most popular of n items under Zipf(s) popularity."""
    if n <= 0:
        return 1.0
    h = lambda k: sum(1.0 / (i ** s) for i in range(1, k + 1))  # noqa: E731
    return h(min(c, n)) / h(n)


def default_ctx(scan):
    """The engine's default context: min(model maximum, the registry's default)."""
    fam_default = 4096
    try:
        import family_registry
        fam_default = family_registry.FAMILIES.get(scan["family"], {}).get("default_ctx", fam_default)
    except ImportError:
        pass
    return min(scan["arch"]["max_ctx"] or fam_default, fam_default)


def _kv_default():
    return family_registry.KV_DEFAULT


def kv_state(scan, ctx, kv=None):
    """(bytes per token, fixed bytes, bytes of one slot of ctx positions) from the layers' state
    descriptors in the manifest (container_scan reads them), for KV element type kv (default:
    the engine's). A windowed layer counts only its window."""
    kv = kv or family_registry.KV_DEFAULT
    values = scan.get("kv_values_per_token")
    per_token = (values * family_registry.KV_TYPES[kv] + scan.get("kv_f32_bytes_per_token", 0) if values is not None
                 else scan["kv_bytes_per_token"])
    fixed = scan.get("kv_fixed_bytes", 0)
    layers = scan.get("kv_layers")
    slot = family_specs.kv_slot_bytes([{"attn": {"state": s}} for s in layers], ctx, kv) if layers \
        else per_token * ctx + fixed + 4 * ctx  # + the token id each position keeps
    return per_token, fixed, slot


def plan(scan, machine, ram=None, ctx=None, kv_slots=1, cap=None, mem_bw=None, disk_bw=None,
         batch=None, threads=None, measured_tok_s=None, kv_type=None, batch_given=False, kv_persist=False,
         prefill=None, draft=None, draft_max=None):
    """The tier plan as a dict. ram in bytes (None: the default budget); bandwidths in GB/s;
    batch None: the engine's default for this machine's kernel set; kv_persist: the engine
    saves its slots (--kv-dir), so its writer's bound is reserved; draft: --draft (lookup, mtp),
    whose buffers the engine reserves in the runtime (draft_reserve)."""
    if batch is None:
        batch = default_batch(machine["cpu"].get("engine_kernels"))
    a, ex = scan["arch"], scan["experts"]
    mem = machine["memory"]
    ctx = ctx or default_ctx(scan)
    threads = threads or machine["cpu"]["usable"]
    budget = ram if ram is not None else mem["default_budget"]
    kv_per_token, kv_fixed, kv_slot = kv_state(scan, ctx, kv_type)
    kv = kv_slot * kv_slots
    man = scan["manifest"]
    draft_bytes, draft_off = draft_reserve(scan, ctx, kv_slots, draft, draft_max, kv_type)
    mtp = draft == "mtp" and not draft_off
    runtime_at = lambda b: runtime_bytes(man, ctx, b, threads, tokenizer_bytes=scan["tokenizer_bytes"],  # noqa: E731
                                         streams=kv_slots) + draft_bytes
    runtime = runtime_at(batch)
    ckpt = kv_slots * KV_MAX_CHECKPOINTS * checkpoint_bytes(scan, ctx, kv_type)
    grammar = grammar_reserve(a["vocab"] or 0, kv_slots) if scan["tokenizer_bytes"] else 0
    writer = kv_writer_reserve(kv_slot, checkpoint_bytes(scan, ctx, kv_type)) if kv_persist else 0
    split_at = lambda r: budget_split(scan, budget, kv, r, cap, ckpt, grammar, writer, mtp=mtp)  # noqa: E731
    split = split_at(runtime)
    if budget and not split["fits"] and not batch_given:
        # the engine takes a smaller prefill batch before it refuses (c/engine/engine_stream.c)
        at1 = split_at(runtime_at(1))
        if not at1["fits"]:
            split = at1  # the engine refuses with the numbers at batch 1
        while at1["fits"] and not split["fits"]:
            batch //= 2
            runtime = runtime_at(batch)
            split = split_at(runtime)
    n_moe = split["moe_layers"]
    pass_n, pass_why, pass_bytes = batch, "resident", 0
    if budget and split["fits"]:
        pass_n, pass_why, pass_bytes = prefill_pass(split, budget, ctx, batch, pass_pos_bytes(man, ctx), n_moe, prefill)
        if pass_bytes:
            split = budget_split(scan, budget, kv, runtime, cap, ckpt, grammar, writer, pass_bytes, not prefill, mtp=mtp)
    dense = split["dense"]
    n_moe, E, k = split["moe_layers"], split["experts"], a["top_k"]
    expert_each = ex["bytes_each"]
    notes, problems = [], []
    if draft_off:
        notes.append(f"--draft {draft}: off, the model's {draft_off.replace('_', ' ')} cannot be cut back")
    elif draft_bytes:
        notes.append(f"--draft {draft}: {draft_bytes / 1e6:.1f} MB of the runtime are its verify buffers"
                     + (" and the MTP head's KV; the head's experts stream as one more MoE layer" if mtp else ""))
    mask_cache = split["mask_cache"] if split["fits"] else 0
    fixed = dense + kv + runtime + ckpt + grammar + writer + pass_bytes + mask_cache
    if budget is None:
        problems.append("available memory is unknown; pass --ram GB")
    elif not split["fits"]:
        slots_needed = f" + {cap} expert slots per MoE layer (--cap {cap})" if cap else \
            (" + one expert slot per MoE layer" if E else "")
        problems.append(f"dense weights + KV + runtime + checkpoints + grammar{slots_needed} need "
                        f"{split['min_ram'] / GB:.2f} GB but the budget is {budget / GB:.2f} GB: the engine refuses "
                        "to start; lower --ctx or --kv-slots, or raise --ram")
    slots = split["cap"] if split["fits"] and budget is not None else 0
    hit_lo = slots / E if E else 1.0
    hit_hi = zipf_mass(slots, E) if E else 1.0
    cache_used = split["cache"] if split["fits"] else 0

    # Bytes and work per decoded token
    embed = scan["classes"].get("embed", 0)
    dense_read = scan["dense_bytes"] - (embed if "lm_head" in scan["classes"] else 0)
    active_experts = k * n_moe
    expert_read = active_experts * expert_each
    kv_read = (kv_slot - kv_fixed) // 2 + kv_fixed  # an average position halfway through the context
    el = scan["class_elements"]
    dense_el = sum(v for c, v in el.items() if c != "expert") - (el.get("embed", 0) if "lm_head" in el else 0)
    flops = 2 * (dense_el + active_experts * ex["elements_each"]) + 4 * (a["heads"] or 0) * (a["head_dim"] or 0) * \
        (ctx // 2) * (a["layers"] or 0)
    cpu = machine["cpu"]
    lanes = {"avx512": 16, "avx2": 8, "neon": 4}.get(cpu["simd"], 1)
    ghz = (cpu["mhz"] or 2000) / 1000
    peak = min(cpu["physical_cores"], threads) * ghz * 1e9 * lanes * 2 * 2  # 2 FMA ports, 2 flops per FMA
    compute_rate = peak * 0.25  # quantized kernels reach a fraction of peak: an assumption, said in the notes

    def tok_s(hit, m_bw, d_bw):
        t_mem = (dense_read + kv_read + hit * expert_read) / (m_bw * GB) if m_bw else None
        t_disk = ((1 - hit) * expert_read) / (d_bw * GB) if d_bw else (0.0 if hit >= 1 else None)
        t_comp = flops / compute_rate
        parts = {"memory": t_mem, "disk": t_disk, "compute": t_comp}
        if any(v is None for v in parts.values()):
            return None, None, parts
        return 1 / sum(parts.values()), 1 / max(parts.values()), parts

    def projection(h_lo, h_hi):
        lo, _, parts_lo = tok_s(h_lo, mem_bw, disk_bw)
        _, hi, parts_hi = tok_s(h_hi, mem_bw, disk_bw)
        known = {k: v for k, v in parts_hi.items() if v is not None}
        bottleneck = max(known, key=known.get) if known else None
        if parts_lo["disk"] is None and h_lo < 1:
            bottleneck = "disk (bandwidth unknown)"
        return {"tok_s_low": lo, "tok_s_high": hi, "bottleneck": bottleneck,
                "seconds_per_token": {k: v for k, v in parts_hi.items()}}

    planned = projection(hit_lo, hit_hi)
    if E and split["fits"] and budget is not None:
        planned["summary"] = ("every routed expert fits in the cache: after the first reads they are served from RAM"
                              if slots >= E else
                              f"{slots} of {E} experts per layer stay in RAM; the rest stream from disk on demand")
    if measured_tok_s:
        planned["measured_decode_tok_s"] = measured_tok_s
    notes.append("compute is estimated as 25% of the cores' peak float32 FMA rate "
                 f"({min(cpu['physical_cores'], threads)} cores x {ghz:.2f} GHz x {lanes} lanes x 4)")
    if E:
        notes.append("hit rate range: uniform routing (slots/experts) to Zipf(1)-skewed routing")
    notes.append("tok/s range: no overlap of disk, memory and compute (low) to full overlap (high); per-token "
                 "fixed costs (thread hand-offs, framing) are left out, and they dominate for tiny models")
    return {
        "budget": budget, "budget_source": "--ram" if ram is not None else f"{int(BUDGET_SHARE * 100)}% of usable memory",
        "ctx": ctx, "kv_slots": kv_slots, "threads": threads, "batch": batch,
        "tiers": {"dense": dense, "runtime": runtime, "kv": kv, "checkpoints": ckpt, "grammar": grammar, "kv_writer": writer,
                  "prefill_pass": pass_bytes, "mask_cache": mask_cache, "expert_cache": cache_used,
                  "free": (budget - fixed - cache_used) if budget is not None else None},
        "kv_bytes_per_token_per_slot": kv_per_token, "kv_fixed_bytes_per_slot": kv_fixed,
        "kv_type": kv_type or _kv_default(),
        "experts": {"per_layer": E, "moe_layers": n_moe, "top_k": k, "bytes_each": expert_each,
                    "cache_slots_per_layer": slots, "hit_rate_low": hit_lo, "hit_rate_high": hit_hi,
                    "all_resident": bool(E) and slots >= E},
        "per_token": {"dense_bytes": dense_read, "expert_bytes": expert_read, "kv_bytes": kv_read, "flops": flops},
        "bandwidth": {"memory_gbps": mem_bw, "disk_gbps": disk_bw, "compute_gflops": compute_rate / 1e9},
        "planned": planned,
        # the engine's READY fields for this budget (tests/test_budget_agreement.py)
        "engine_split": {"ram_budget": budget or 0, "dense_bytes": dense, "kv_bytes": kv, "runtime_bytes": runtime,
                         "checkpoint_bytes": ckpt, "grammar_bytes": grammar, "kv_writer_bytes": writer,
                         "mask_cache_bytes": split["mask_cache"],
                         "expert_cache_bytes": split["cache"], "cap": split["cap"] if split["fits"] else None,
                         "experts": E if n_moe else 0, "moe_layers": n_moe, "batch": batch,
                         "prefill_pass": pass_n, "prefill_pass_why": pass_why, "prefill_pass_bytes": pass_bytes},
        "problems": problems,
        "min_ram": split["min_ram"],
        "notes": notes,
    }


# ---------------------------------------------------------------- text output

def _rate(v):
    return "?" if v is None else f"{v:.1f}" if v >= 1 else f"{v:.2f}"


def format_plan(res):
    m, s, p = res["machine"], res["model"], res["plan"]
    out = ["machine"] + ["  " + ln for ln in machine_lines(m)]
    bw = res["bandwidth"]
    out.append(f"  bandwidth  memory {_rate(bw['memory_gbps'])} GB/s ({bw['memory_source']}), "
               f"disk {_rate(bw['disk_gbps'])} GB/s ({bw['disk_source']})")
    if s is None:
        out.append("")
        out.append("no model given: pass --model DIR or set COLI_MODEL for the tier plan")
        return "\n".join(out)
    a, ex = s["arch"], s["experts"]
    out += ["", "model", f"  {s['dir']}  ({s['family']}, {a['layers']} layers, vocab {a['vocab']}, "
            f"max context {a['max_ctx']})",
            f"  on disk    {fmt_bytes(s['file_bytes'])} in {len(s['shards'])} shard(s), {s['tensor_count']} tensors",
            f"  dense      {fmt_bytes(s['dense_bytes'])}  ("
            + ", ".join(f"{c} {fmt_bytes(b)}" for c, b in s["classes"].items() if c not in ("expert", "mtp")) + ")"]
    if ex["count"]:
        out.append(f"  experts    {fmt_bytes(s['expert_bytes'])}: {ex['per_layer']} per layer x {ex['layers']} MoE layers, "
                   f"{fmt_bytes(ex['bytes_each'])} each, top-{a['top_k']} per token")
    else:
        out.append("  experts    none (a dense model: every weight is read for every token)")
    t = p["tiers"]
    out += ["", f"plan  (budget {fmt_bytes(p['budget'])} from {p['budget_source']}; context {p['ctx']} x "
                f"{p['kv_slots']} KV slot(s); {p['threads']} threads)",
            f"  {'tier':<14}{'bytes':>12}",
            f"  {'dense trunk':<14}{fmt_bytes(t['dense']):>12}",
            f"  {'runtime':<14}{fmt_bytes(t['runtime']):>12}   (working memory)",
            f"  {'KV cache':<14}{fmt_bytes(t['kv']):>12}   ({p['kv_type']}: {fmt_bytes(p['kv_bytes_per_token_per_slot'])} per token per slot"
            f"{', ' + fmt_bytes(p['kv_fixed_bytes_per_slot']) + ' fixed' if p['kv_fixed_bytes_per_slot'] else ''})",
            f"  {'checkpoints':<14}{fmt_bytes(t['checkpoints']):>12}   "
            + (f"(up to {KV_MAX_CHECKPOINTS} turn-boundary copies of recurrent state and rings per slot)"
               if t["checkpoints"] else "(none: every layer can be cut at any prefix)"),
            f"  {'grammar':<14}{fmt_bytes(t['grammar']):>12}   "
            + ("(vocabulary trie and matcher scratch, built on the first grammar request)" if t["grammar"]
               else "(none: no tokenizer.json, so no grammar requests)"),
            *([f"  {'KV writer':<14}{fmt_bytes(t['kv_writer']):>12}   (--kv-dir: records queued for the disk, "
               "two whole slots' worth, and one slot's image)"] if t.get("kv_writer") else []),
            *([f"  {'prefill pass':<14}{fmt_bytes(t['prefill_pass']):>12}   ({p['engine_split']['prefill_pass']} "
               "positions a pass, each streamed expert read once per pass; the activations past one batch)"]
              if t.get("prefill_pass") else []),
            f"  {'mask cache':<14}{fmt_bytes(t['mask_cache']):>12}   "
            + (f"(elastic: 1/{MASK_CACHE_SHARE} of the budget beyond its minimum, at most "
               f"{fmt_bytes(MASK_CACHE_MAX)}; masks past it are rebuilt)" if t["grammar"] else ""),
            f"  {'expert cache':<14}{fmt_bytes(t['expert_cache']):>12}",
            f"  {'left free':<14}{fmt_bytes(t['free']):>12}"]
    pe = p["experts"]
    if pe["per_layer"]:
        out.append(f"  cache slots per layer {pe['cache_slots_per_layer']} of {pe['per_layer']}"
                   + ("  (every expert resident)" if pe["all_resident"] else "")
                   + f"; projected hit rate {pe['hit_rate_low']:.0%}-{pe['hit_rate_high']:.0%}")
    pl = p["planned"]
    out.append(f"  projected    {_rate(pl['tok_s_low'])}-{_rate(pl['tok_s_high'])} tok/s, bottleneck: {pl['bottleneck']}")
    if pl.get("summary"):
        out.append(f"  {pl['summary']}")
    if pl.get("measured_decode_tok_s"):
        out.append(f"  measured by coli tune: {pl['measured_decode_tok_s']:.1f} tok/s decode")
    for prob in p["problems"]:
        out.append(f"problem: {prob}")
    out += ["", "notes"] + [f"  {n}" for n in p["notes"]]
    return "\n".join(out)


# ---------------------------------------------------------------- command

def add_arguments(p):
    model_arg(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    launch_opts.add_engine_flags(
        p, ("ram", "ctx", "kv-slots", "cap", "kv", "threads", "batch", "prefill-pass", "draft", "draft-max"), group=None,
        ram={"help": "RAM budget in GB (default: 90%% of usable memory, cgroup limits included)"},
        ctx={"help": "context length to plan for (default: min(model max, 4096))"},
        kv_slots={"default": 1, "help": "KV slots (concurrent conversations, default 1)"},
        cap={"help": "expert cache slots per layer to plan with (default: as many as fit)"},
        threads={"help": "compute threads to plan with (default: usable CPUs)"})
    p.add_argument("--kv-persist", action="store_true", dest="kv_persist",
                   help="plan for an engine that saves its KV slots (--kv-dir; coli serve does by default)")
    p.add_argument("--mem-bw", type=float, dest="mem_bw", metavar="GB/s", help="memory read bandwidth (default: measured)")
    p.add_argument("--disk-bw", type=float, dest="disk_bw", metavar="GB/s",
                   help="disk read bandwidth with O_DIRECT (default: measured on the model's shards)")
    p.add_argument("--no-measure", action="store_true", dest="no_measure",
                   help="do not time memory or disk; use only --mem-bw/--disk-bw")


def check_plan_args(args, scan):
    """Refuses values the plan cannot honour, with the reason (never clamps)."""
    if args.ram is not None and args.ram <= 0:
        raise UserError(f"--ram {args.ram:g}: needs a positive number of GB")
    if not 1 <= args.kv_slots <= 16:
        raise UserError(f"--kv-slots {args.kv_slots}: the engine has 1 to 16 KV slots")
    if getattr(args, "batch", None) is not None and not 1 <= args.batch <= 65536:
        raise UserError(f"--batch {args.batch}: the engine takes 1 to 65536")
    if getattr(args, "prefill_pass", None) is not None and args.prefill_pass < 0:
        raise UserError(f"--prefill-pass {args.prefill_pass}: needs 0 (automatic) or a multiple of --batch")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads {args.threads}: needs at least 1")
    if getattr(args, "draft_max", None) is not None and not 1 <= args.draft_max <= 64:
        raise UserError(f"--draft-max {args.draft_max}: needs 1 to 64 tokens")
    for flag, v in (("--mem-bw", args.mem_bw), ("--disk-bw", args.disk_bw)):
        if v is not None and v <= 0:
            raise UserError(f"{flag} {v:g}: needs a positive GB/s")
    if scan is None:
        return
    launch_opts.check_ctx(args.ctx, {"max_position_embeddings": scan["arch"]["max_ctx"]})
    E = scan["experts"]["per_layer"]
    if args.cap is not None:
        if not E:
            raise UserError("--cap: this model has no routed experts to cache")
        if not 1 <= args.cap <= E:
            raise UserError(f"--cap {args.cap}: the model has {E} experts per layer; give 1 to {E}")


def build(args):
    """Everything `coli plan` prints, as one dict (the JSON output)."""
    # a pulled name (--model smollm2) means its container in the model store; the plan only
    # reads headers, so a name not pulled yet is refused with the pull command, not fetched
    model_dir = str(model_path(args.model)) if args.model else None
    scan = None
    if model_dir:
        if not os.path.lexists(model_dir):
            raise UserError(missing_model_message(args.model))
        if not Path(model_dir).is_dir():
            raise UserError(f"--model {model_dir} is a file, not a container directory; pass the directory "
                            "holding colibri.json")
        try:
            scan = container_scan.scan(model_dir)
        except container_scan.ContainerError as e:
            hint = f" (`coli doctor --deep --model {model_dir}` checks everything)" \
                if (Path(model_dir) / "colibri.json").is_file() else ""
            raise UserError(f"{e}{hint}") from None
        check_arch(Path(model_dir))
    check_plan_args(args, scan)
    machine = discover(model_dir)
    mem_bw, mem_src = args.mem_bw, "given"
    if mem_bw is None:
        mem_bw, mem_src = (None, "not measured (--no-measure)") if args.no_measure else \
            (measure_memory_bw(), "measured: one-thread scan, a floor")
    disk_bw, disk_src = args.disk_bw, "given"
    if disk_bw is None:
        if args.no_measure:
            disk_src = "not measured (--no-measure)"
        elif scan is None:
            disk_src = "not measured: no model files to read"
        else:
            disk_bw, mode, note = measure_disk_bw([os.path.join(model_dir, s["file"]) for s in scan["shards"]])
            disk_src = f"measured: {note}" if disk_bw else f"unknown: {note}"
    res = {"machine": machine, "model": scan,
           "bandwidth": {"memory_gbps": mem_bw, "memory_source": mem_src, "disk_gbps": disk_bw, "disk_source": disk_src},
           "plan": None}
    if scan is not None:
        measured = None
        try:
            from colibri.machine import tune_profile
            prof = tune_profile.load(model_dir)
            measured = (prof or {}).get("measured", {}).get("decode_tok_s")
        except ImportError:
            pass
        res["plan"] = plan(scan, machine, ram=int(args.ram * GB) if args.ram else None, ctx=args.ctx,
                           kv_slots=args.kv_slots, cap=args.cap, mem_bw=mem_bw, disk_bw=disk_bw,
                           threads=args.threads, measured_tok_s=measured, kv_type=args.kv,
                           kv_persist=getattr(args, "kv_persist", False), batch=getattr(args, "batch", None),
                           batch_given=getattr(args, "batch", None) is not None,
                           prefill=getattr(args, "prefill_pass", None), draft=getattr(args, "draft", None),
                           draft_max=getattr(args, "draft_max", None))
    return res


def run(args):
    res = build(args)
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        print(format_plan(res))
    return 0
