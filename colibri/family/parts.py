"""The one lookup from a family to the modules of colibri/family/ that own its parts.

A registry flag names a layout (hybrid: gated_deltanet, expert_names: mixtral, ...); the module
that owns that layout is found here, so the shared drivers (the converters, normalize.py,
specs.py) ask for a part by its name instead of testing for a family. A family whose flags name
no module of its own has no parts: the shared builders do everything."""
import family_registry
from colibri.family import (common, deepseek, deepseek_v4, gpt_oss, kimi, llama, mimo, mixtral, olmoe, qwen2,
                            qwen2_moe, qwen3, qwen35)

# registry flag -> {its value: the module that owns that layout}, in the order their parts apply
BY_FLAG = {
    "hybrid": {"gated_deltanet": qwen35, "kda": kimi},
    "attn_layout": {"dsv4": deepseek_v4, "mimo": mimo},
    "expert_names": {"mixtral": mixtral, "gpt_oss": gpt_oss},
}


def modules(family):
    """The modules whose layouts the family's registry flags name."""
    fam = family_registry.FAMILIES.get(family, {})
    return [by[fam[flag]] for flag, by in BY_FLAG.items() if fam.get(flag) in by]


def hooks(family, name):
    """Every function `name` the family's modules define, in BY_FLAG's order."""
    return [getattr(m, name) for m in modules(family) if hasattr(m, name)]


def hf_source_tensors(family, tensors, arch, log):
    """A checkpoint's tensors under the names the layer specs use: each module's renames (the
    release's own spellings, a wrapper's prefixes) in turn; one may also note in arch which of
    its layouts the checkpoint has."""
    for rename in hooks(family, "hf_source_tensors"):
        tensors = rename(tensors, arch, log)
    return tensors


# ---------------------------------------------------------------- block kinds

def attn_shapes(attn, hidden):
    """Source shape of every tensor an attention spec names, by its kind."""
    shapes = {"mla": deepseek.mla_shapes, "dsv4": deepseek_v4.attn_shapes}.get(attn["kind"], common.gqa_shapes)
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
    return deepseek.indexer_shapes(ix, hidden, q_lora)


def expert_planner(arch):
    """plan_experts(p, tensors, take, pre, names, E, I, H) of an expert layout the shared per-expert
    and fused paths cannot read (gpt-oss's interleaved gate_up), or None."""
    return getattr(BY_FLAG["expert_names"].get(arch.get("expert_names")), "plan_experts", None)


# ---------------------------------------------------------------- GGUF
# The module that reads each family's llama.cpp files. Each declares GGUF_ARCHS (the
# general.architecture names it reads -> family) and either gguf_config(g, tensors, m, uniform,
# base) -> (family, HF config), or GGUF_HF_CLASS and gguf_llama_config(g, tensors, m, family,
# cfg, L), its additions to the llama-style config colibri/convert/gguf.py builds. Optional:
# gguf_family(metadata) (the family a file of its architecture is), GGUF_PER_LAYER (blk.N tensor ->
# HF name), GGUF_EXPERTS, GGUF_PERMUTED_QK (llama.cpp permuted the Q/K rows), GGUF_SPLIT_KV_B,
# gguf_blocks(cfg), gguf_key_halves(cfg), gguf_skipped(g, cfg), gguf_expert_bias_rows(...),
# gguf_rewrites(cfg, name, hf, shape), gguf_finish_sources(cfg, sources), gguf_notes(g, cfg).
GGUF_BY_FAMILY = {"llama": llama, "qwen2": qwen2, "qwen3": qwen3, "qwen3_moe": qwen3, "glm4_moe": deepseek,
                  "deepseek_v3": deepseek, "gpt_oss": gpt_oss, "qwen3_5_moe": qwen35, "olmoe": olmoe,
                  "qwen2_moe": qwen2_moe, "mixtral": mixtral}
# general.architecture -> family, in the order the converter lists what it reads
GGUF_ARCHS = {a: f for m in dict.fromkeys(GGUF_BY_FAMILY.values()) for a, f in m.GGUF_ARCHS.items()}


def gguf_family(gg_arch, metadata):
    """The family of a GGUF file of a known architecture."""
    family = GGUF_ARCHS[gg_arch]
    override = getattr(GGUF_BY_FAMILY[family], "gguf_family", None)
    return override(metadata) if override else family


def gguf_module(family):
    """The module that reads the family's GGUF files."""
    return GGUF_BY_FAMILY[family]
