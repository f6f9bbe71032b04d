"""Qwen3.5 / Qwen3.6 MoE (`qwen3_5_moe`): a hybrid of gated-DeltaNet linear-attention layers
(a fixed recurrent state per slot) and full GQA layers (sigmoid output gate, partial rotary,
q/k norm), every layer a softmax top-k MoE with a sigmoid-gated shared expert, and RMSNorms
that compute x * (1 + w). family_registry maps a config with these helpers.

Releases ship the vision-language wrapper: config.json holds the text model under
`text_config` and the weights live under `model.language_model.*`, beside the vision tower
(`model.visual.*`) and the multi-token-prediction head (`mtp.*`). The text model and its MTP
head are converted (the head drafts with `--draft mtp`); images are not supported."""
from colibri.errors import ConvertError

# transformers' config class defaults for fields config.json leaves out (class_defaults.fill)
CLASS_DEFAULTS = {
    "qwen3_5_moe": {"num_key_value_heads": 2, "head_dim": 256, "rms_norm_eps": 1e-06, "max_position_embeddings": 32768,
                    "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
                    "shared_expert_intermediate_size": 512}}

TEXT_PREFIX, VISION_PREFIX, MTP_PREFIX = "model.language_model.", "model.visual.", "mtp."


def text_config(cfg):
    """The text model's config: the wrapper's text_config (keys the wrapper sets at top level
    fill in what it lacks; tie_word_embeddings is the wrapper's), or cfg itself for a text-only
    config."""
    tc = cfg.get("text_config")
    if not isinstance(tc, dict):
        return cfg
    out = {k: v for k, v in cfg.items() if k not in ("text_config", "vision_config")}
    out.update(tc)
    out["model_type"] = cfg.get("model_type")
    # the wrapper model ties its lm_head by its own flag (Qwen3_5MoeConfig, default false); the
    # text_config's is not read
    out["tie_word_embeddings"] = bool(cfg.get("tie_word_embeddings", False))
    return out


def linear_arch(cfg, layers):
    """The hybrid pattern and the DeltaNet geometry; raises ValueError on an unusable config."""
    types = cfg.get("layer_types")
    if types is None:
        every = int(cfg.get("full_attention_interval", 4))
        types = ["linear_attention" if (i + 1) % every else "full_attention" for i in range(layers)]
    if len(types) != layers or set(types) - {"linear_attention", "full_attention"}:
        raise ValueError(f"layer_types must name 'linear_attention' or 'full_attention' for each of the {layers} layers")
    if cfg.get("attention_bias"):
        raise ValueError("attention_bias with the gated q_proj is not supported")
    nk, nv = int(cfg.get("linear_num_key_heads", 16)), int(cfg.get("linear_num_value_heads", 32))
    if nv % nk:
        raise ValueError(f"linear_num_value_heads {nv} is not a multiple of linear_num_key_heads {nk}")
    return {
        "layer_attn": ["gated_deltanet" if t == "linear_attention" else "gqa" for t in types],
        "linear_k_heads": nk, "linear_v_heads": nv,
        "linear_k_head_dim": int(cfg.get("linear_key_head_dim", 128)),
        "linear_v_head_dim": int(cfg.get("linear_value_head_dim", 128)),
        "linear_conv_kernel": int(cfg.get("linear_conv_kernel_dim", 4)),
        "attn_output_gate": True,
        "norm_offset": 1.0,  # the checkpoint's norms store w, they compute x * (1 + w)
        # one MTP layer (mtp.*, renamed by text_tensors), a full-attention layer with its own KV;
        # more are stacked on one fc and norm pair, which the engine's per-layer heads do not match
        "num_nextn_predict_layers": 1 if int(cfg.get("mtp_num_hidden_layers") or 0) == 1 else 0,
        "mtp_layer_attn": "gqa",
    }


def deltanet_state_bytes(arch):
    nk, nv = arch["linear_k_heads"], arch["linear_v_heads"]
    dk, dv, K = arch["linear_k_head_dim"], arch["linear_v_head_dim"], arch["linear_conv_kernel"]
    return 4 * ((K - 1) * (2 * nk * dk + nv * dv) + nv * dk * dv)


def deltanet_spec(arch, p):
    a = f"{p}.linear_attn"
    return {"kind": "gated_deltanet", "k_heads": arch["linear_k_heads"], "v_heads": arch["linear_v_heads"],
            "k_head_dim": arch["linear_k_head_dim"], "v_head_dim": arch["linear_v_head_dim"],
            "conv_kernel": arch["linear_conv_kernel"], "norm_eps": arch["rms_norm_eps"],
            "state": {"kv_values_per_pos": 0, "fixed_bytes": deltanet_state_bytes(arch), "truncatable": False},
            "tensors": {"qkv": f"{a}.in_proj_qkv.weight", "z": f"{a}.in_proj_z.weight", "b": f"{a}.in_proj_b.weight",
                        "a": f"{a}.in_proj_a.weight", "conv": f"{a}.conv1d.weight", "A_log": f"{a}.A_log",
                        "dt_bias": f"{a}.dt_bias", "norm": f"{a}.norm.weight", "out": f"{a}.out_proj.weight"}}


def gated_q_names(p):
    """Container names of the query and output-gate halves of q_proj (split by the converter)."""
    return f"{p}.self_attn.q_proj.query.weight", f"{p}.self_attn.q_proj.gate.weight"


def attn_outputs(spec, arch, p, H):
    """The converter's outputs for one attention block of this family, or None for the generic
    path: (output name, storage class, rows, cols, [(source name, source shape, row ranges)])."""
    t = spec["tensors"]
    if spec["kind"] == "gated_deltanet":
        nk, nv, dk, dv, K = (spec[x] for x in ("k_heads", "v_heads", "k_head_dim", "v_head_dim", "conv_kernel"))
        cd = 2 * nk * dk + nv * dv
        shapes = {"qkv": ("dense", [cd, H]), "z": ("dense", [nv * dv, H]), "out": ("dense", [H, nv * dv]),
                  "b": ("f32", [nv, H]), "a": ("f32", [nv, H]), "conv": ("f32", [cd, 1, K]),
                  "A_log": ("f32", [nv]), "dt_bias": ("f32", [nv]), "norm": ("f32", [dv])}
        out = []
        for key, name in t.items():
            klass, shape = shapes[key]
            rows = 1 if len(shape) == 1 else shape[0]
            out.append((name, klass, rows, shape[-1], [(name, shape, [(0, rows)])]))
        return out
    if "gate" not in t:
        return None
    nh, nkv, hd = spec["heads"], spec["kv_heads"], spec["head_dim"]
    src, shape = f"{p}.self_attn.q_proj.weight", [2 * nh * hd, H]  # heads x (query hd, gate hd)
    out = [(t["q"], "dense", nh * hd, H, [(src, shape, [(2 * h * hd, hd) for h in range(nh)])]),
           (t["gate"], "dense", nh * hd, H, [(src, shape, [((2 * h + 1) * hd, hd) for h in range(nh)])])]
    shapes = {"k": [nkv * hd, H], "v": [nkv * hd, H], "o": [H, nh * hd], "q_norm": [hd], "k_norm": [hd]}
    for key in ("k", "v", "o", "q_norm", "k_norm"):
        s = shapes[key]
        rows = 1 if len(s) == 1 else s[0]
        out.append((t[key], "dense" if len(s) == 2 else "f32", rows, s[-1], [(t[key], s, [(0, rows)])]))
    return out


# the MTP head's own parts under the names of the DeepSeek-V3 layout (colibri/convert/mtp_spec.py)
MTP_PARTS = {"fc.weight": "eh_proj.weight", "pre_fc_norm_embedding.weight": "enorm.weight",
             "pre_fc_norm_hidden.weight": "hnorm.weight", "norm.weight": "shared_head.norm.weight"}


def mtp_name(name, layers):
    """An mtp.* tensor's name in the DeepSeek-V3 layout, the MTP layer at index `layers`:
    mtp.layers.0.X -> model.layers.L.X, mtp.fc -> eh_proj, the pre-fc norms -> enorm/hnorm,
    mtp.norm -> shared_head.norm. None for a name outside that layout."""
    rest = name[len(MTP_PREFIX):]
    if rest in MTP_PARTS:
        return f"model.layers.{layers}.{MTP_PARTS[rest]}"
    if rest.startswith("layers.0."):
        return f"model.layers.{layers}.{rest[len('layers.0.'):]}"
    return None


def text_tensors(tensors, log, layers, mtp_layers):
    """The wrapper's text-model tensors under the text model's own names (model.layers.*), and
    the MTP head's (mtp.*) in the DeepSeek-V3 layout when the config declares its one layer
    (mtp_layers); the vision tower, and a head of another shape, are left out, and the log
    says so."""
    out, vision, mtp = {}, 0, []
    for name, t in tensors.items():
        if name.startswith(VISION_PREFIX):
            vision += 1
        elif name.startswith(MTP_PREFIX):
            mtp.append(name)
        else:
            out["model." + name[len(TEXT_PREFIX):] if name.startswith(TEXT_PREFIX) else name] = t
    renamed = {n: mtp_name(n, layers) for n in mtp}
    if mtp and mtp_layers == 1 and None not in renamed.values():
        out.update({renamed[n]: tensors[n] for n in mtp})
    elif mtp:
        log(f"note: the multi-token-prediction head ({len(mtp)} tensors under {MTP_PREFIX}*) is not converted: "
            f"only a head of one layer (mtp_num_hidden_layers 1) in the released layout is")
    if vision:
        log(f"note: the vision tower ({vision} tensors under {VISION_PREFIX}*) is not converted: "
            "colibri runs the text model only, images and video are not supported")
    return out


def hf_source_tensors(tensors, arch, log):
    """The converter's renames (colibri/family/parts.py): the text model's own names."""
    return text_tensors(tensors, log, arch["num_layers"], arch.get("num_nextn_predict_layers", 0))


# ---------------------------------------------------------------- GGUF
# GGUF import of llama.cpp's `qwen35moe` (Qwen3.5 / Qwen3.6 MoE, gated DeltaNet hybrid): its
# metadata as the qwen3_5_moe_text config, its tensor names back to the HF names the specs
# above read, and llama.cpp's rewrites undone (their values through colibri/convert/gguf_undo.py).
#
# What llama.cpp's converter (Qwen3_5MoeTextModel) does, and how it is read back:
# - A_log is stored as -exp(A_log) (ssm_a): written back into a scratch file as the float32
#   whose exp it is.
# - With fewer key than value heads, the value heads are reordered from grouped (by key head) to
#   tiled: the V rows of attn_qkv, the rows of attn_gate / ssm_alpha / ssm_beta, the V channels of
#   ssm_conv1d are read in HF order row by row; ssm_a, ssm_dt.bias and the columns of ssm_out go
#   through the scratch file: a column order cuts through a row's blocks, so ssm_out is dequantized
#   there (by the engine, from any block type the importer reads: Q4_K, Q6_K, Q5_0, ...), its
#   columns put back, and re-quantized to the requested --dense type like any float tensor.
# - The conv is squeezed to [channels, kernel]: declared [channels, 1, kernel] again.
# - Every norm but the DeltaNet one (ssm_norm) is stored as 1 + w: w comes back through the
#   scratch file (exact in float32: the subtraction of 1 is exact).
# - The hybrid pattern is full_attention_interval (every n-th layer full attention).
# - The multi-token-prediction head is written as nextn_predict_layers extra blocks after the
#   text model's: blk.L holds the MTP layer under the trunk's names, and its fc and norms as
#   nextn.eh_proj / nextn.enorm / nextn.hnorm / nextn.shared_head_norm (norms as 1 + w too). One
#   such block converts as the HF path's mtp.* (model.layers.L, the DeepSeek layout); files with
#   more are converted without them (gguf_skipped lists them, gguf_notes logs it).

GGUF_ARCHS = {"qwen35moe": "qwen3_5_moe"}

GGUF_PER_LAYER = {
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "attn_qkv.weight": "linear_attn.in_proj_qkv.weight", "attn_gate.weight": "linear_attn.in_proj_z.weight",
    "ssm_alpha.weight": "linear_attn.in_proj_a.weight", "ssm_beta.weight": "linear_attn.in_proj_b.weight",
    "ssm_conv1d.weight": "linear_attn.conv1d.weight", "ssm_a": "linear_attn.A_log",
    "ssm_dt.bias": "linear_attn.dt_bias", "ssm_norm.weight": "linear_attn.norm.weight",
    "ssm_out.weight": "linear_attn.out_proj.weight",
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
    "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
    "nextn.eh_proj.weight": "eh_proj.weight", "nextn.enorm.weight": "enorm.weight", "nextn.hnorm.weight": "hnorm.weight",
    "nextn.shared_head_norm.weight": "shared_head.norm.weight",
}


def gguf_config(g, tensors, m, uniform, base):
    """(family, HF config) of a qwen35moe file; base holds the keys every MoE import shares."""
    blocks = m.need("block_count", int)
    nextn = m.get("nextn_predict_layers", 0, kind=int) or 0
    L = blocks - nextn  # the MTP layers come last
    if L < 1:
        raise ConvertError(f"{g.path}: {m.arch}.block_count {blocks} leaves no layer besides the "
                           f"{blocks - L} multi-token-prediction layers")
    heads, kv = uniform(m, "attention.head_count", blocks), uniform(m, "attention.head_count_kv", blocks)
    head_dim = m.need("attention.key_length", int)
    rot = m.need("rope.dimension_count", int)
    every = m.need("full_attention_interval", int)
    nk, nv = m.need("ssm.group_count", int), m.need("ssm.time_step_rank", int)
    inner = m.need("ssm.inner_size", int)
    if not every or not nk or nv % nk or inner % nv:
        raise ConvertError(f"{g.path}: {nv} value heads over {nk} key heads (inner size {inner}), "
                           f"full attention every {every} layers: not a valid DeltaNet geometry")
    experts, used = m.need("expert_count", int), m.need("expert_used_count", int)
    cfg = dict(base, architectures=["Qwen3_5MoeForCausalLM"], model_type="qwen3_5_moe_text", num_hidden_layers=L,
               num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, attention_bias=False,
               layer_types=["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(L)],
               linear_conv_kernel_dim=m.need("ssm.conv_kernel", int), linear_key_head_dim=m.need("ssm.state_size", int),
               linear_num_key_heads=nk, linear_num_value_heads=nv, linear_value_head_dim=inner // nv,
               num_experts=experts, num_experts_per_tok=used,
               intermediate_size=uniform(m, "feed_forward_length", blocks) if f"{m.arch}.feed_forward_length" in g.metadata else 0,
               moe_intermediate_size=m.need("expert_feed_forward_length", int),
               shared_expert_intermediate_size=m.need("expert_shared_feed_forward_length", int),
               rope_parameters={"rope_type": "default", "rope_theta": float(m.get("rope.freq_base", 10000.0, kind=float)),
                                "partial_rotary_factor": rot / head_dim})
    if nextn:
        cfg["mtp_num_hidden_layers"] = nextn  # as the HF config names it: one converts, more are left out
    for l in range(L):
        info = tensors.get(f"blk.{l}.ffn_up_exps.weight")
        if info is None or len(info.shape) != 3 or info.shape[2] != experts:
            raise ConvertError(f"{g.path}: blk.{l}.ffn_up_exps.weight must hold {experts} experts "
                               f"({m.arch}.expert_count); it is {None if info is None else list(info.shape)}")
    return "qwen3_5_moe", cfg


def gguf_blocks(cfg):
    """The blk.N layers converted: the text model's, and one MTP layer where the file has exactly one."""
    return cfg["num_hidden_layers"] + (cfg.get("mtp_num_hidden_layers") == 1)


def gguf_skipped(g, cfg):
    """The GGUF tensors not converted: MTP layers past the one the engine runs (blk.N, N >= gguf_blocks)."""
    n = gguf_blocks(cfg)
    return [t for t in g.tensors if t.startswith("blk.") and t.split(".")[1].isdigit() and int(t.split(".")[1]) >= n]


def _hf_heads(nk, nv):
    """GGUF head index of each HF value head: HF head k*r + j sits at tiled position j*nk + k."""
    r = nv // nk
    return [(h % r) * nk + h // r for h in range(nv)]


def _rows(heads, hd, start=0):
    return [start + heads[h] * hd + i for h in range(len(heads)) for i in range(hd)]


def gguf_rewrites(cfg, name, hf, shape):
    """How tensor `name` is read back: (HF shape, rows, scratch) where rows lists the GGUF row
    of each HF row (None: in order) and scratch is (op, indices) for undone(): op 'log_neg',
    'minus_one', 'cols' (a column order) or None (the elements in another order;
    colibri/convert/gguf_undo.py)."""
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    heads = _hf_heads(nk, nv)
    tiled = nk != nv
    kind = name.split(".", 2)[2] if name.startswith("blk.") else name
    if kind == "ssm_conv1d.weight":
        qk = 2 * nk * dk
        return [shape[0], 1, shape[1]], (list(range(qk)) + _rows(heads, dv, qk)) if tiled else None, None
    if kind == "attn_qkv.weight" and tiled:
        qk = 2 * nk * dk
        return shape, list(range(qk)) + _rows(heads, dv, qk), None
    if kind == "attn_gate.weight" and tiled:
        return shape, _rows(heads, dv), None
    if kind in ("ssm_alpha.weight", "ssm_beta.weight") and tiled:
        return shape, _rows(heads, 1), None
    if kind == "ssm_a":
        return shape, None, ("log_neg", heads)
    if kind == "ssm_dt.bias":
        return shape, None, (None, heads) if tiled else None
    if kind == "ssm_out.weight" and tiled:
        return shape, None, ("cols", _rows(heads, dv))
    if hf.endswith("norm.weight") and kind != "ssm_norm.weight":
        return shape, None, ("minus_one", None)
    return shape, None, None


def gguf_finish_sources(cfg, sources):
    """The planner splits each full-attention q_proj (heads x (query, gate)) into two outputs;
    each is read as rows of the GGUF attn_q, which llama.cpp stores unchanged."""
    nh, hd = cfg["num_attention_heads"], cfg["head_dim"]
    for hf in [n for n in sources if n.endswith(".self_attn.q_proj.weight")]:
        info, row0, _ = sources[hf]
        query, gate = gated_q_names(hf[:-len(".self_attn.q_proj.weight")])
        for name, half in ((query, 0), (gate, 1)):
            sources[name] = (info, row0, ("rows", [(2 * h + half) * hd + i for h in range(nh) for i in range(hd)]))


def gguf_notes(g, cfg):
    """What the log tells about a file's parts that are not converted."""
    mtp = gguf_skipped(g, cfg)
    if not mtp:
        return []
    return [f"note: the multi-token-prediction head ({len(mtp)} tensors in {cfg['mtp_num_hidden_layers']} blocks "
            f"after layer {cfg['num_hidden_layers'] - 1}) is not converted: the engine runs one MTP layer"]
