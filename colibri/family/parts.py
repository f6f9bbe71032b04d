"""The one lookup from a family to the module of colibri/family/ that owns its parts.

The shared drivers (the converters, normalize.py, specs.py) ask here for a part by its name (a
hook: a function or a table the module defines) instead of testing for a family; a family
without a module, or whose module lacks a hook, gets the shared builders' way. Hooks:

- HF checkpoints: text_config(cfg) (a wrapper config's text model), CLASS_DEFAULTS ({family:
  {field: transformers' config class default}}, keyed by family as one module may serve several;
  class_defaults.fill reads it), config_defaults(cfg) (the release's own spellings and
  defaults), own_arch(cfg, rope_table, f32) (an architecture the module builds whole),
  attn_arch(cfg, rope_table) (per-layer attention facts; rope_table(params, default partial
  rotary factor)), linear_arch(cfg, layers) (a hybrid's linear-attention layers),
  hf_source_tensors(tensors, arch, log) (tensor renames), plan_experts(...) (an expert layout the
  shared paths cannot read).
- GGUF files: GGUF_ARCHS (the general.architecture names it reads -> family), and either
  gguf_config(g, tensors, m, uniform, base) -> (family, HF config) or GGUF_HF_CLASS and
  gguf_config_keys(g, tensors, m, family, cfg, L) (its keys added to the llama-style config
  colibri/convert/gguf.py builds); optional gguf_family(metadata), GGUF_PER_LAYER (blk.N tensor ->
  HF name), GGUF_EXPERTS, GGUF_PERMUTED_QK, GGUF_SPLIT_KV_B, gguf_blocks(cfg),
  gguf_key_halves(cfg), gguf_skipped(g, cfg), gguf_expert_bias_rows(...), gguf_rewrites(cfg,
  name, hf, shape), gguf_finish_sources(cfg, sources), gguf_notes(g, cfg)."""
from colibri.family import (common, deepseek, deepseek_v4, gpt_oss, kimi, llama, mimo, mixtral, mla, olmoe, qwen2,
                            qwen2_moe, qwen3, qwen35)

# family -> the module of its own parts (one module may serve a line of families), in the order
# the GGUF converter lists the architectures it reads
MODULES = {"llama": llama, "qwen2": qwen2, "qwen3": qwen3, "qwen3_moe": qwen3, "glm4_moe": deepseek,
           "deepseek_v3": deepseek, "gpt_oss": gpt_oss, "qwen3_5_moe": qwen35, "olmoe": olmoe,
           "qwen2_moe": qwen2_moe, "mixtral": mixtral, "minimax_m2": mixtral, "kimi_linear": kimi,
           "deepseek_v4": deepseek_v4, "mimo_v2_flash": mimo}


def hook(family, name):
    """The family module's `name`, or None where the family has no such part."""
    return getattr(MODULES.get(family), name, None)


def hf_source_tensors(family, tensors, arch, log):
    """A checkpoint's tensors under the names the layer specs use (the release's own spellings, a
    wrapper's prefixes); the module may also note in arch which of its layouts the checkpoint has."""
    rename = hook(family, "hf_source_tensors")
    return rename(tensors, arch, log) if rename else tensors


def expert_planner(family):
    """plan_experts(p, tensors, take, pre, names, E, I, H) of an expert layout the shared per-expert
    and fused paths cannot read (gpt-oss's interleaved gate_up), or None."""
    return hook(family, "plan_experts")


# ---------------------------------------------------------------- block kinds

def attn_shapes(attn, hidden):
    """Source shape of every tensor an attention spec names, by its kind."""
    shapes = {"mla": mla.mla_shapes, "dsv4": deepseek_v4.attn_shapes}.get(attn["kind"], common.gqa_shapes)
    return shapes(attn, hidden)


def attn_outputs(attn, arch, p, hidden, shape_of):
    """The converter's outputs for an attention block whose tensors are gathered from row ranges
    (KDA, gated DeltaNet, the gated q_proj), or None for the one-tensor-each path:
    (output name, storage class, rows, cols, [(source name, source shape, row ranges)])."""
    if attn["kind"] == "kda":
        return kimi.attn_outputs(attn, hidden, shape_of)
    return qwen35.attn_outputs(attn, arch, p, hidden) if arch.get("attn_output_gate") else None


def hc_shapes(hc, hidden):
    """Source shapes of a hyper-connection block's tensors (DeepSeek-V4's residual streams)."""
    return deepseek_v4.hc_shapes(hc, hidden)


def compress_tensors(attn, hidden):
    """(name, shape, storage class) of an attention block's compressor tensors; none for most."""
    return deepseek_v4.compress_tensors(attn, hidden)


def indexer_shapes(ix, hidden, q_lora):
    """Source shape of every tensor a DSA lightning-indexer spec names."""
    return mla.indexer_shapes(ix, hidden, q_lora)


# ---------------------------------------------------------------- layer specs
# specs.py works from an arch alone (an older manifest's too): these are found by the arch fields
# a family's normalization writes, not by the family.

LINEAR_ATTN = {"gated_deltanet": qwen35.deltanet_spec, "kda": kimi.kda_spec}  # layer_attn -> its spec


def whole_layout(arch):
    """The module that lays out every layer, with layer_specs(arch, norm) and trunk_extra(arch),
    or None for the shared per-layer path."""
    return deepseek_v4 if arch.get("dsv4") else None


def gqa_per_layer(arch):
    """gqa_per_layer(arch, l, p, attn) of an arch whose gqa layers differ one from another, or None."""
    return mimo.gqa_per_layer if arch.get("mimo") else None


def gated_q_names(p):
    """Container names of the query and output-gate halves of a gated q_proj."""
    return qwen35.gated_q_names(p)


def moe_layout(arch):
    """(moe_spec(arch, p) of a MoE block of the module's own, moe_names(p) of the shared block under
    the module's tensor names), by the arch's expert_names; (None, None) for the shared ones."""
    module = {"gpt_oss": gpt_oss, "mixtral": mixtral}.get(arch.get("expert_names"))
    return getattr(module, "moe_spec", None), getattr(module, "moe_names", None)


# ---------------------------------------------------------------- GGUF

# every name colibri/convert/gguf.py asks a module for (tests/test_family_parts.py holds the two equal)
GGUF_HOOKS = ("GGUF_ARCHS", "GGUF_HF_CLASS", "GGUF_PER_LAYER", "GGUF_EXPERTS", "GGUF_PERMUTED_QK", "GGUF_SPLIT_KV_B",
              "gguf_family", "gguf_config", "gguf_config_keys", "gguf_blocks", "gguf_key_halves", "gguf_skipped",
              "gguf_expert_bias_rows", "gguf_rewrites", "gguf_finish_sources", "gguf_notes")
# general.architecture -> family, in MODULES' order
GGUF_ARCHS = {a: f for m in dict.fromkeys(MODULES.values()) for a, f in getattr(m, "GGUF_ARCHS", {}).items()}


def gguf_family(gg_arch, metadata):
    """The family of a GGUF file of a known architecture."""
    family = GGUF_ARCHS[gg_arch]
    override = hook(family, "gguf_family")
    return override(metadata) if override else family


def gguf_module(family):
    """The module that reads the family's GGUF files."""
    return MODULES[family]
