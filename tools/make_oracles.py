#!/usr/bin/env python3
"""Build tiny random-weight HF checkpoints and record transformers references.

Layout per variant (under --out, default .cache/oracles):
  <variant>/hf/             the checkpoint, as save_pretrained writes it
  <variant>/ref_logits.f32  raw little-endian float32 [T, vocab], row i = logits after ids[0..i]
  <variant>/ref.json        ids, greedy prompt + generated ids, per-position margins
  <variant>/stamp.json      transformers/torch versions + generator hash (skip if unchanged)

References are computed in float32 (eager attention, eager experts) from the saved checkpoint
loaded back.  Usage: python tools/make_oracles.py [--out DIR] [--only NAME...]
"""
import argparse
import copy
import fcntl
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / ".cache" / "oracles"

SEQ_LEN = 96        # teacher-forced reference sequence
PROMPT_LEN = 8      # greedy prompt length
NEW_TOKENS = 20     # greedy tokens recorded
PROMPT_TRIES = 12   # candidate prompts; the most decisive, varied one is kept
DECISIVE = 0.05     # greedy logit/router margin wanted at every recorded step
ROUTER_TRIES = 6    # candidate router draws per MoE layer; the most decisive one is kept
VOCAB = 320
EOS = 0             # "<|endoftext|>", id 0 in the tiny tokenizer
EMBED_STD = 0.3     # embeddings / lm_head (tied or not): logit std ~2.4
OUT_GAIN = 0.25     # o_proj / down_proj / expert down_proj, relative to 1/sqrt(fan_in)
TIED_GAIN = 3.0     # out gain for tied-embedding variants
ROUTER_STD = 0.5    # router (mlp.gate) weights: router logit std ~4, decisive top-k

# Shared small geometry; variants override.
BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
            rms_norm_eps=1e-5, eos_token_id=EOS, bos_token_id=None, pad_token_id=None)
MOE = dict(num_hidden_layers=3, num_key_value_heads=2, head_dim=32, num_experts=8,
           num_experts_per_tok=2, moe_intermediate_size=32, rms_norm_eps=1e-6,
           rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})

# DeepSeek-V3 line: several groups with topk_group < n_group, shared experts, a leading dense
# layer; MLA with q_lora / kv_lora, v_head_dim != qk head dim and YaRN (mscale in the softmax scale).
SIGMOID = dict(num_hidden_layers=3, n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
               n_shared_experts=1, n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True,
               first_k_dense_replace=1, rms_norm_eps=1e-6)
MLA = dict(SIGMOID, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=24,
           rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 1.0,
                            "mscale_all_dim": 1.0, "original_max_position_embeddings": 128,
                            "beta_fast": 32, "beta_slow": 1})
DSA = dict(index_topk=16, index_head_dim=32, index_n_heads=8)

GPT_OSS = dict(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=8,
               num_experts_per_tok=2, intermediate_size=32, sliding_window=12, swiglu_limit=1.0, rms_norm_eps=1e-5,
               layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
               rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                                "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 128})
SINK_STD = 1.0      # attention sinks: comparable to the scores, so they take real weight

# Qwen3.5/3.6 hybrid: gated-DeltaNet layers (key heads shared by value heads, key dim != value
# dim) and gated full-attention layers with partial rotary and an mrope_section; every layer an
# MoE with a sigmoid-gated shared expert. SEQ_LEN spans two of transformers' 64-position chunks.
QWEN35 = dict(num_hidden_layers=4, num_key_value_heads=2, head_dim=32, num_experts=8, num_experts_per_tok=2,
              moe_intermediate_size=32, shared_expert_intermediate_size=48, rms_norm_eps=1e-6,
              linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=24,
              linear_conv_kernel_dim=4,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                               "mrope_section": [2, 1, 1], "mrope_interleaved": True})
# The release wrapper's vision tower, as small as it goes (converted away, never run).
TINY_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4,
                   temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16)

# Kimi-Linear: KDA layers and NoPE MLA layers (1-indexed lists in linear_attn_config, the
# release's spelling), sigmoid group routing with shared experts, a dense first layer.
KIMI = dict(num_hidden_layers=4, num_local_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
            n_group=2, topk_group=1, routed_scaling_factor=1.5, norm_topk_prob=True, first_k_dense_replace=1,
            q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=24, rms_norm_eps=1e-5,
            linear_attn_config={"full_attn_layers": [2, 4], "kda_layers": [1, 3], "head_dim": 16, "num_heads": 4,
                                "short_conv_kernel_size": 4})

# DeepSeek-V4: 4 hyper-connection streams, one shared K=V head with RoPE on its last 8 dims,
# sinks, 2 output groups, a window shorter than the sequence and than prompt + generated tokens,
# a hash-routed first layer, sqrtsoftplus routing, a SwiGLU limit low enough to clamp.
DSV4 = dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1, head_dim=32, q_lora_rank=48,
            qk_rope_head_dim=8, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, intermediate_size=32,
            sliding_window=12, o_groups=2, o_lora_rank=16, swiglu_limit=1.0, rms_norm_eps=1e-6, layer_types=["sliding_attention"] * 3,
            mlp_layer_types=["hash_moe", "moe", "moe"])
# Compressed layers: CSA (rate 4, overlapping windows, an indexer keeping 4 entries, so its
# top-k binds from position 19 on) and HCA (rate 8), YaRN on their RoPE, two hash layers.
DSV4_COMPRESSED = dict(DSV4, num_hidden_layers=4, mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe"],
                       layer_types=["compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention",
                                    "compressed_sparse_attention"],
                       compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
                       index_n_heads=8, index_head_dim=16, index_topk=4,
                       rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                        "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1})

# name -> family, seed, config overrides, save dtype, expert layout, shard size
VARIANTS = {
    "llama": dict(family="llama", seed=11, config={}),
    # tied: logit(current token) ~ |e|^2 dominates unless the layers are louder (else greedy repeats)
    "llama_tied": dict(family="llama", seed=12, out_gain=TIED_GAIN, config=dict(tie_word_embeddings=True)),
    "llama_llama3": dict(family="llama", seed=13, config=dict(rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "llama_linear": dict(family="llama", seed=14, config=dict(rope_parameters={
        "rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})),
    "llama_yarn": dict(family="llama", seed=15, config=dict(rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
        "original_max_position_embeddings": 128})),
    "llama_bias": dict(family="llama", seed=16, config=dict(attention_bias=True, mlp_bias=True)),
    "llama_headdim": dict(family="llama", seed=17, config=dict(head_dim=32)),
    "llama_gqa": dict(family="llama", seed=18, config=dict(num_attention_heads=8, num_key_value_heads=2,
                                                           num_hidden_layers=3)),
    "llama_f32": dict(family="llama", seed=19, dtype="float32",
                      config=dict(num_key_value_heads=2)),
    "qwen2": dict(family="qwen2", seed=21, config=dict(num_key_value_heads=2, rms_norm_eps=1e-6,
                  rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "qwen2_tied": dict(family="qwen2", seed=22, out_gain=TIED_GAIN,
                       config=dict(tie_word_embeddings=True, num_key_value_heads=2)),
    "qwen2_f16": dict(family="qwen2", seed=23, dtype="float16", config=dict(num_key_value_heads=1)),
    "qwen3_moe": dict(family="qwen3_moe", seed=31, config=dict(MOE, norm_topk_prob=True, mlp_only_layers=[0])),
    "qwen3_moe_nonorm": dict(family="qwen3_moe", seed=32, config=dict(MOE, norm_topk_prob=False)),
    "qwen3_moe_fused": dict(family="qwen3_moe", seed=33, layout="fused",
                            config=dict(MOE, norm_topk_prob=True, mlp_only_layers=[0])),
    "qwen3_moe_sparse": dict(family="qwen3_moe", seed=34, shard="48KB",
                             config=dict(MOE, num_hidden_layers=4, decoder_sparse_step=2, norm_topk_prob=True)),
    # GQA with head_dim != hidden/heads, partial rotary (the config's 0.5 default), q/k/v bias, q/k norm
    "glm4_moe": dict(family="glm4_moe", seed=41, config=dict(
        SIGMOID, num_key_value_heads=2, head_dim=48, attention_bias=True, use_qk_norm=True,
        n_shared_experts=2, n_group=2, topk_group=1, num_experts_per_tok=2, routed_scaling_factor=1.5)),
    "deepseek_v3": dict(family="deepseek_v3", seed=53, config=dict(MLA)),
    "deepseek_v3_noqlora": dict(family="deepseek_v3", seed=58, config=dict(
        MLA, q_lora_rank=None, norm_topk_prob=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        attention_bias=True, rope_interleave=False)),  # kv_a / o biases; half-split RoPE
    # DSA: each query past the first index_topk positions attends to its indexer's top 16 keys
    "glm_moe_dsa": dict(family="glm_moe_dsa", seed=71, config=dict(MLA, **DSA)),
    # GLM's cross-layer top-k sharing: layer 1 reuses layer 0's selection
    "glm_moe_dsa_shared": dict(family="glm_moe_dsa", seed=72, config=dict(
        MLA, **DSA, indexer_types=["full", "shared", "full"])),
    "deepseek_v32": dict(family="deepseek_v32", seed=82, config=dict(MLA, **DSA)),
    # q/k RMSNorm over the whole projection, clip_qkv low enough to clip, unnormalised top-k
    "olmoe": dict(family="olmoe", seed=91, config=dict(
        num_hidden_layers=3, num_key_value_heads=2, num_experts=8, num_experts_per_tok=2, intermediate_size=32,
        clip_qkv=1.5, norm_topk_prob=False, rms_norm_eps=1e-5)),
    # sigmoid-gated shared expert, qkv bias, unnormalised top-k, a dense layer (mlp_only_layers)
    "qwen2_moe": dict(family="qwen2_moe", seed=92, config=dict(
        {k: v for k, v in MOE.items() if k != "head_dim"}, num_hidden_layers=4, mlp_only_layers=[1], shared_expert_intermediate_size=48,
        norm_topk_prob=False, qkv_bias=True)),
    # top-2 renormalised, experts under block_sparse_moe.experts.N.w1/w2/w3 in the source files
    "mixtral": dict(family="mixtral", seed=93, config=dict(
        num_hidden_layers=3, num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2,
        intermediate_size=32, rms_norm_eps=1e-5, sliding_window=None)),
    # a window shorter than the sequence and than prompt + generated tokens
    "mixtral_window": dict(family="mixtral", seed=94, config=dict(
        num_hidden_layers=3, num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2,
        intermediate_size=32, rms_norm_eps=1e-5, sliding_window=20)),
    # q/k norms over the whole projection (heads x head_dim != hidden), partial RoPE as rotary_dim,
    # sigmoid routing whose correction bias sits on the MoE block, experts under block_sparse_moe
    "minimax_m2": dict(family="minimax_m2", seed=95, config=dict(
        num_hidden_layers=3, num_key_value_heads=2, head_dim=32, num_local_experts=8, num_experts_per_tok=2,
        intermediate_size=32, rotary_dim=16, rms_norm_eps=1e-6)),
    # sinks, alternating sliding (window 12, shorter than prompt + generated) and full layers,
    # q/k/v/o biases, a biased router (top-k on logits, softmax over the k), expert biases, a
    # SwiGLU limit low enough to clamp, YaRN without truncation
    "gpt_oss": dict(family="gpt_oss", seed=95, config=GPT_OSS),
    # full and sliding layers (a window well inside prompt + generated tokens; sinks, twice the KV
    # heads and their own RoPE theta on the sliding ones), v heads narrower than q/k with the value
    # scale, partial RoPE, a dense first layer, group-limited sigmoid routing without shared experts
    "mimo_v2_flash": dict(family="mimo_v2_flash", seed=96, config=dict(
        num_hidden_layers=4, num_key_value_heads=1, head_dim=48, v_head_dim=32, n_routed_experts=8,
        num_experts_per_tok=2, moe_intermediate_size=32, n_group=2, topk_group=1, sliding_window=12,
        layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"])),
    # the other MiMo shapes: q/k/v biases, v heads as wide as q/k (the kernels' sink path), no value
    # scale (null), a sliding first layer with its own RoPE table as the model's, a dense middle layer
    "mimo_v2_flash_bias": dict(family="mimo_v2_flash", seed=97, config=dict(
        num_hidden_layers=3, num_key_value_heads=1, head_dim=32, v_head_dim=32, n_routed_experts=8,
        num_experts_per_tok=2, moe_intermediate_size=32, n_group=2, topk_group=1, sliding_window=10,
        attention_bias=True, attention_value_scale=None, mlp_layer_types=["sparse", "dense", "sparse"],
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}})),
    # the release format: the vision-language wrapper (text_config, model.language_model.*, model.visual.*)
    "qwen3_5_moe": dict(family="qwen3_5_moe", seed=101, wrap="vl", config=dict(QWEN35)),
    # the text-only config; one key head for two value heads, key dim > value dim, alternating layers
    "qwen3_5_moe_text": dict(family="qwen3_5_moe", seed=102, model_type="qwen3_5_moe_text", config=dict(
        QWEN35, linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=32, linear_value_head_dim=16,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"])),
    # a flipped routing decision lives on in the recurrent state: more router draws for a decisive one
    "kimi_linear": dict(family="kimi_linear", seed=113, router_tries=24, config=dict(KIMI)),
    "deepseek_v4": dict(family="deepseek_v4", seed=121, config=dict(DSV4)),
    "deepseek_v4_compressed": dict(family="deepseek_v4", seed=122, config=dict(DSV4_COMPRESSED)),
    # the other shapes: one residual stream, 3 Sinkhorn steps, one output group, sigmoid scores, an
    # HCA rate (16) and index head (10) that do not divide the head dims, top-3 of the experts
    "deepseek_v4_shapes": dict(family="deepseek_v4", seed=130, config=dict(
        DSV4_COMPRESSED, head_dim=24, index_head_dim=10, hc_mult=1, hc_sinkhorn_iters=3, o_groups=1, o_lora_rank=24,
        scoring_func="sigmoid", sliding_window=7, num_experts_per_tok=3,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16})),
    "glm4_moe_lite": dict(family="glm4_moe_lite", seed=61, config=dict(
        {k: v for k, v in MLA.items() if k != "first_k_dense_replace"}, mlp_layer_types=["dense", "sparse", "sparse"],
        routed_scaling_factor=1.8)),
}

TOKENIZER_TEXT = (
    "The quick brown fox jumps over the lazy dog. colibri streams experts from disk; "
    "def main():\n    return 42\n\nHello, world! Bonjour le monde. 1234567890 "
) * 8


# Hash of the code as imported (a long-lived process must not stamp old code with a new hash).
GENERATOR_HASH = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def _torch():
    import torch
    torch.set_num_threads(1)
    return torch


def model_class(family, wrap=None):
    import transformers as tf
    if family == "qwen3_5_moe":
        return ((tf.Qwen3_5MoeConfig, tf.Qwen3_5MoeForConditionalGeneration) if wrap == "vl"
                else (tf.Qwen3_5MoeTextConfig, tf.Qwen3_5MoeForCausalLM))
    return {"llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
            "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
            "qwen3_moe": (tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM),
            "olmoe": (tf.OlmoeConfig, tf.OlmoeForCausalLM),
            "qwen2_moe": (tf.Qwen2MoeConfig, tf.Qwen2MoeForCausalLM),
            "mixtral": (tf.MixtralConfig, tf.MixtralForCausalLM),
            "glm4_moe": (tf.Glm4MoeConfig, tf.Glm4MoeForCausalLM),
            "glm4_moe_lite": (tf.Glm4MoeLiteConfig, tf.Glm4MoeLiteForCausalLM),
            "deepseek_v3": (tf.DeepseekV3Config, tf.DeepseekV3ForCausalLM),
            "glm_moe_dsa": (tf.GlmMoeDsaConfig, tf.GlmMoeDsaForCausalLM),
            "deepseek_v32": (tf.DeepseekV32Config, tf.DeepseekV32ForCausalLM),
            "minimax_m2": (tf.MiniMaxM2Config, tf.MiniMaxM2ForCausalLM),
            "gpt_oss": (tf.GptOssConfig, tf.GptOssForCausalLM),
            "mimo_v2_flash": (tf.MiMoV2FlashConfig, tf.MiMoV2FlashForCausalLM),
            "kimi_linear": (tf.KimiLinearConfig, tf.KimiLinearForCausalLM),
            "deepseek_v4": (tf.DeepseekV4Config, tf.DeepseekV4ForCausalLM)}[family]


SIGMOID_FAMILIES = ("glm4_moe", "glm4_moe_lite", "deepseek_v3", "glm_moe_dsa", "deepseek_v32", "mimo_v2_flash",
                    "kimi_linear")  # group-limited sigmoid routers
MOE_FAMILIES = ("qwen3_moe", "olmoe", "qwen2_moe", "mixtral", "minimax_m2", "gpt_oss", "qwen3_5_moe",
                "deepseek_v4") + SIGMOID_FAMILIES
SIGMOID_ROUTER_STD = 0.2  # sigmoid routers: logit std ~1.6, scores spread over (0, 1) rather than saturated
BIAS_STD = 0.1      # sigmoid routers' e_score_correction_bias: moves selection, not the weights


def randomize(model, seed, out_gain):
    """Non-trivial weights: fan-in scaled matrices, norms 1+0.1*N, biases 0.1*N."""
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if "rotary_emb" in name:
                continue
            if name.endswith("norm.weight"):
                # a norm initialised to zeros computes x * (1 + w) (Qwen3.5): keep its scale near 1 too
                centre = 0.0 if not p.any() else 1.0
                p.copy_(centre + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name or name == "lm_head.weight":
                p.copy_(EMBED_STD * torch.randn(p.shape, generator=g))
            elif name.endswith(("mlp.gate.weight", "mlp.router.weight")) and not hasattr(
                    model.get_submodule(name[:-len(".weight")]), "tid2eid"):
                pass  # routers: see pick_routers (a hash router's weights only weigh: drawn here)
            elif name.endswith("mlp.gate.weight"):
                p.copy_(SIGMOID_ROUTER_STD * torch.randn(p.shape, generator=g))
            elif name.endswith(".sinks"):
                p.copy_(SINK_STD * torch.randn(p.shape, generator=g))
            elif name.endswith("e_score_correction_bias"):
                p.copy_(BIAS_STD * torch.randn(p.shape, generator=g))
            elif name.endswith("A_log"):  # DeltaNet decay rate ~0.14: the state remembers ~10 positions
                p.copy_(-2.0 + 0.5 * torch.randn(p.shape, generator=g))
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif name.endswith("tid2eid"):  # hash routing: distinct experts per token
                p.copy_(torch.stack([torch.randperm(int(model.config.n_routed_experts), generator=g)[:p.shape[1]]
                                     for _ in range(p.shape[0])]))
            elif name.endswith("hc_scale") or name.endswith("_hc.scale"):  # hyper-connection gains near 1
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                # residual-branch outputs smaller, so no single layer dominates the stream
                gain = out_gain if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight", "down_proj")) else 1.0
                p.copy_(gain * torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)


def routers(model):
    return [m for m in model.modules() if type(m).__name__.lower().endswith("topkrouter")]


def router_bias(mod, args):
    """A sigmoid router's correction bias: its own (DeepSeek), or the MoE block's, which passes it
    in (MiniMax-M2); None for softmax routers."""
    if hasattr(mod, "e_score_correction_bias"):
        return mod.e_score_correction_bias
    return args[1] if len(args) > 1 else None


def is_sigmoid_router(mod):
    return hasattr(mod, "e_score_correction_bias") or type(mod).__name__ == "MiniMaxM2TopKRouter"


def router_scores(mod, x):
    """A sigmoid router's scores (DeepSeek-V4's: sqrt(softplus))."""
    logits = x.reshape(-1, x.shape[-1]).float() @ mod.weight.float().T
    if type(mod).__name__.startswith("DeepseekV4"):
        return _torch().nn.functional.softplus(logits).sqrt()
    return logits.sigmoid()


def sigmoid_group_margin(mod, x, bias):
    """Per position, a lower bound on the router-logit change (each logit moved by at most e: a
    sigmoid score by e/4) that flips the selection, in the units of the softmax routers' margin
    (logit[k-1] - logit[k], which a change e flips at 2e): 4 x the expert margin, 2 x the group
    margin, on the biased scores selection uses."""
    torch = _torch()
    choice = router_scores(mod, x) + bias
    g, k, tg = getattr(mod, "num_group", 1), mod.top_k, getattr(mod, "topk_group", 1)
    margins = []
    if tg < g:
        gs = choice.view(len(choice), g, -1).topk(2, dim=-1).values.sum(-1).sort(dim=-1, descending=True).values
        margins.append(2 * (gs[:, tg - 1] - gs[:, tg]))
        keep = choice.view(len(choice), g, -1).topk(2, dim=-1).values.sum(-1).topk(tg, dim=-1).indices
        mask = torch.zeros(len(choice), g, dtype=torch.bool).scatter_(1, keep, True)
        choice = choice.masked_fill(~mask.repeat_interleave(choice.shape[1] // g, dim=1), float("-inf"))
    s = choice.sort(dim=-1, descending=True).values
    margins.append(4 * (s[:, k - 1] - s[:, k]).nan_to_num(posinf=1e9))
    return torch.stack(margins).min(dim=0).values


def sigmoid_group_effects(mod, x, bias):
    """Positions whose selection the group limit, and the correction bias, change: the oracle
    must exercise both (tests/test_oracles.py checks the counts)."""
    scores = router_scores(mod, x)

    def pick(choice, grouped):
        if grouped and getattr(mod, "topk_group", 1) < getattr(mod, "num_group", 1):
            gs = choice.view(len(choice), mod.num_group, -1).topk(2, dim=-1).values.sum(-1)
            keep = gs.topk(mod.topk_group, dim=-1).indices
            mask = _torch().zeros_like(gs, dtype=_torch().bool).scatter_(1, keep, True)
            choice = choice.masked_fill(~mask.repeat_interleave(choice.shape[1] // mod.num_group, dim=1), float("-inf"))
        return choice.topk(mod.top_k, dim=-1).indices.sort(dim=-1).values

    biased = scores + bias
    chosen = pick(biased, True)
    by_groups = (chosen != pick(biased, False)).any(-1)
    by_bias = (chosen != pick(scores, True)).any(-1)
    return int(by_groups.sum()), int(by_bias.sum())


def is_dsa_indexer(m):
    """GLM-5 / DeepSeek-V3.2's indexer (DeepSeek-V4's compresses its keys: Dsv4IndexMargins)."""
    return type(m).__name__.endswith("Indexer") and hasattr(m, "wq_b")


class IndexMargins:
    """Hook every DSA indexer; per layer, the smallest gap between a query's index_topk-th and
    next index score, relative to that query's largest |score| (positions past index_topk only):
    how far the engine's rounding may move scores before a key selection flips."""

    def __init__(self, model):
        self.gaps = []
        self.handles = [m.register_forward_hook(self._hook, with_kwargs=True) for m in model.modules()
                        if is_dsa_indexer(m)]
        self.handles += [m.scorer.register_forward_hook(self._dsv4_hook(m)) for m in model.modules()
                         if type(m).__name__ == "DeepseekV4Indexer"]

    def _dsv4_hook(self, ix):
        """DeepSeek-V4: the scores of the compressed entries a query may see ((t + 1) // rate)."""
        def hook(mod, args, out):
            K, m, gaps = ix.index_topk, ix.compress_rate, []
            for t in range(out.shape[1]):
                v = out[0, t, :(t + 1) // m].sort(descending=True).values
                if len(v) > K:
                    gaps.append(((v[K - 1] - v[K]) / v.abs().max()).item())
            if gaps:
                self.gaps.append(min(gaps))
        return hook

    def _hook(self, mod, args, kwargs, out):
        torch = _torch()
        x, q_resid, (cos, sin) = args[0], args[1], args[2]
        interleave = "Glm" in type(mod).__name__
        B, S, _ = x.shape
        q = mod.wq_b(q_resid).view(B, S, mod.n_heads, mod.head_dim)
        k = mod.k_norm(mod.wk(x)).unsqueeze(2)
        dr = mod.qk_rope_head_dim
        mods = sys.modules[type(mod).__module__]
        rot = mods.apply_rotary_pos_emb_interleave if interleave else mods.apply_rotary_pos_emb
        qr, kr = rot(q[..., :dr], k[..., :dr], cos, sin, unsqueeze_dim=2)
        q, k = torch.cat([qr, q[..., dr:]], -1), torch.cat([kr, k[..., dr:]], -1).squeeze(2)
        s = torch.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * mod.softmax_scale)
        w = mod.weights_proj(x).float() * mod.n_heads ** -0.5
        score = torch.matmul(w.unsqueeze(-2), s).squeeze(-2)[0]  # [S, S]
        K, gaps = mod.index_topk, []
        for t in range(K, S):
            v = score[t, :t + 1].sort(descending=True).values
            gaps.append(((v[K - 1] - v[K]) / v.abs().max()).item())
        if gaps:
            self.gaps.append(min(gaps))

    def close(self):
        for h in self.handles:
            h.remove()


class RouterMargins:
    """Hook every router; per position, min over MoE layers of its top-k margin: logit[k-1] - logit[k]
    (sorted) for softmax routers, sigmoid_group_margin for group-limited sigmoid ones."""

    def __init__(self, model):
        self.rs = routers(model)
        self.per_layer = []
        self.effects = [0, 0]  # (positions x layers) whose selection groups / the bias changed
        self.handles = [r.register_forward_hook(self._hook) for r in self.rs]

    def _hook(self, mod, args, out):
        bias = router_bias(mod, args)
        if bias is not None:
            self.per_layer.append(sigmoid_group_margin(mod, args[0], bias))
            g, b = sigmoid_group_effects(mod, args[0], bias)
            self.effects = [self.effects[0] + g, self.effects[1] + b]
            return
        logits = out[0].float()
        s = logits.sort(dim=-1, descending=True).values
        self.per_layer.append(s[:, mod.top_k - 1] - s[:, mod.top_k])

    def take(self):
        torch = _torch()
        if not self.rs:
            return None
        m = torch.stack(self.per_layer).min(dim=0).values
        self.per_layer = []
        return m

    def close(self):
        for h in self.handles:
            h.remove()


def forward_logits(model, ids):
    torch = _torch()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def top_margins(logits):
    s = logits.topk(2, dim=-1).values
    return s[:, 0] - s[:, 1]


def round_to(model, dtype):
    """Round weights through the save dtype so margins are measured on what gets saved."""
    torch = _torch()
    dt = getattr(torch, dtype)
    with torch.no_grad():
        for p in list(model.parameters()) + [b for n, b in model.named_buffers() if "rotary_emb" not in n]:
            p.copy_(p.to(dt).float())


INDEX_TRIES = 8  # candidate draws of each DSA indexer's weights_proj; the most decisive one is kept


def pick_routers(model, seed, ids, dtype, tries=ROUTER_TRIES):
    """Draw router weights (and DSA indexer head weights) layer by layer, in the order the forward
    pass meets them, so each measured margin only depends on choices already fixed; keep the
    draw with the largest smallest margin: router top-k (RouterMargins), indexer top-k
    (IndexMargins), so the engine's rounding does not flip a selection."""
    torch = _torch()
    rs = routers(model)
    ixs = [m for m in model.modules() if is_dsa_indexer(m) or type(m).__name__ == "DeepseekV4Indexer"]
    if not rs and not ixs:
        return
    g = torch.Generator().manual_seed(seed + 1000)
    gi = torch.Generator().manual_seed(seed + 4000)
    hook, ihook = RouterMargins(model), IndexMargins(model)
    try:
        for m in model.modules():
            if m in rs:
                i = rs.index(m)
                std = SIGMOID_ROUTER_STD if is_sigmoid_router(m) else ROUTER_STD
                param, draw = m.weight, lambda: std * torch.randn(m.weight.shape, generator=g)
            elif m in ixs:
                i = ixs.index(m)
                w0 = (m.weights_proj if hasattr(m, "weights_proj") else m.q_b_proj).weight  # DeepSeek-V4: its queries
                param, draw = w0, lambda: torch.randn(w0.shape, generator=gi) / w0.shape[-1] ** 0.5
            else:
                continue
            best, best_w = None, None
            for _ in range(tries if m in rs else INDEX_TRIES):
                w = draw().to(getattr(torch, dtype)).float()
                with torch.no_grad():
                    param.copy_(w)
                hook.per_layer, ihook.gaps = [], []
                forward_logits(model, ids)
                margin = hook.per_layer[i].min().item() if m in rs else ihook.gaps[i]
                if best is None or margin > best:
                    best, best_w = margin, w
            with torch.no_grad():
                param.copy_(best_w)
    finally:
        hook.close()
        ihook.close()


def greedy(model, prompt):
    torch = _torch()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False,
                             pad_token_id=EOS)
    return out[0, len(prompt):].tolist()


def gen_margins(model, prompt, gen):
    """Teacher-forced margins of the logits that chose each generated token."""
    hook = RouterMargins(model)
    try:
        logits = forward_logits(model, prompt + gen)
        rm = hook.take()
    finally:
        hook.close()
    sl = slice(len(prompt) - 1, len(prompt) - 1 + len(gen))
    chosen = logits[sl].argmax(-1).tolist()
    return top_margins(logits[sl]), (rm[sl] if rm is not None else None), chosen


def pick_prompt(model, rng_seed):
    """Among candidate prompts, keep the one whose greedy run is most decisive and eos-free."""
    torch = _torch()
    g = torch.Generator().manual_seed(rng_seed + 2000)
    best = None
    for _ in range(PROMPT_TRIES):
        prompt = torch.randint(1, VOCAB, (PROMPT_LEN,), generator=g).tolist()
        gen = greedy(model, prompt)
        lm, rm, _ = gen_margins(model, prompt, gen)
        margin = lm.min().item()
        if rm is not None:
            margin = min(margin, rm.min().item())
        # eos-free first, then decisive, then varied (not one token repeated), then margin
        score = (len(gen) == NEW_TOKENS and EOS not in gen, margin >= DECISIVE,
                 min(len(set(gen)), 8), margin)
        if best is None or score > best[0]:
            best = (score, prompt)
    return best[1]


def write_tokenizer(hf_dir):
    """A tiny byte-level BPE tokenizer.json (+ tokenizer_config.json) matching VOCAB."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TOKENIZER_TEXT], trainer=trainer)
    assert tok.token_to_id("<|endoftext|>") == EOS and tok.get_vocab_size() <= VOCAB
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(hf_dir)


def build_variant(name, spec, vdir):
    torch = _torch()
    import transformers
    family, seed = spec["family"], spec["seed"]
    dtype = spec.get("dtype", "bfloat16")
    layout = spec.get("layout", "hub")
    cfg_cls, model_cls = model_class(family, spec.get("wrap"))
    text = copy.deepcopy({**BASE, **spec["config"]})  # configs mutate rope dicts
    cfg = cfg_cls(text_config=text, vision_config=dict(TINY_VISION)) if spec.get("wrap") == "vl" else cfg_cls(**text)
    torch.manual_seed(seed)
    model = model_cls(cfg).float().eval()
    randomize(model, seed, spec.get("out_gain", OUT_GAIN))
    round_to(model, dtype)
    ids = torch.randint(1, VOCAB, (SEQ_LEN,), generator=torch.Generator().manual_seed(seed + 3000)).tolist()
    pick_routers(model, seed, ids, dtype, spec.get("router_tries", ROUTER_TRIES))
    prompt = pick_prompt(model, seed)
    in_memory = forward_logits(model, ids)

    hf = vdir / "hf"
    hf.mkdir(parents=True)
    save_kw = {"max_shard_size": spec["shard"]} if "shard" in spec else {}
    if layout == "fused":
        save_kw["save_original_format"] = False
    model.to(getattr(torch, dtype)).save_pretrained(hf, **save_kw)
    write_tokenizer(hf)
    del model

    # Reference: the saved checkpoint loaded back in float32, eager paths.
    load_kw = dict(dtype=torch.float32, attn_implementation="eager")
    if family in MOE_FAMILIES:
        load_kw["experts_implementation"] = "eager"
    ref = model_cls.from_pretrained(hf, **load_kw).eval()
    hook, ihook = RouterMargins(ref), IndexMargins(ref)
    try:
        logits = forward_logits(ref, ids)
        rmargin = hook.take()
        effects = hook.effects
    finally:
        hook.close()
        ihook.close()
    drift = (logits - in_memory).abs().max().item()
    assert drift <= 1e-4 * logits.abs().max().item(), f"{name}: save/load changed logits by {drift}"
    gen = greedy(ref, prompt)
    glm, grm, chosen = gen_margins(ref, prompt, gen)

    vdir.joinpath("ref_logits.f32").write_bytes(logits.numpy().astype("<f4").tobytes())
    keys = sorted(p.name for p in hf.iterdir())
    out = {
        "variant": name, "family": family, "model_type": ref.config.model_type,
        "saved_dtype": dtype, "expert_layout": layout if family == "qwen3_moe" else None,
        "sharded": (hf / "model.safetensors.index.json").exists(), "files": keys,
        "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "vocab_size": text["vocab_size"], "eos_token_id": EOS,
        "ids": ids, "logits_shape": [len(ids), text["vocab_size"]],
        "max_abs_logit": logits.abs().max().item(), "logit_std": logits.std().item(),
        "top1": logits.argmax(-1).tolist(), "margin": top_margins(logits).tolist(),
        "router_margin": rmargin.tolist() if rmargin is not None else None,
        "selection_changed_by_groups": effects[0], "selection_changed_by_bias": effects[1],
        "index_margin": min(ihook.gaps) if ihook.gaps else None,
        "prompt_ids": prompt, "generated_ids": gen,
        "gen_margin": glm.tolist(), "gen_router_margin": grm.tolist() if grm is not None else None,
        # teacher-forced argmax differs from generate() only at a near-tie
        "gen_teacher_forced_agrees": chosen == gen,
    }
    vdir.joinpath("ref.json").write_text(json.dumps(out, indent=1))
    return out


def stamp_for(name):
    import torch
    import transformers
    return {"variant": name, "generator": GENERATOR_HASH,
            "transformers": transformers.__version__, "torch": torch.__version__}


def is_fresh(vdir, stamp):
    need = [vdir / "stamp.json", vdir / "ref.json", vdir / "ref_logits.f32", vdir / "hf" / "config.json"]
    if not all(p.exists() for p in need):
        return False
    try:
        return json.loads((vdir / "stamp.json").read_text()) == stamp
    except ValueError:
        return False


def generate(out=DEFAULT_OUT, only=None, quiet=False):
    """Build every (or the named) variant that is missing or stale; return the root."""
    out = Path(out)
    names = list(only) if only else list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown oracle variant(s) {unknown}; known: {', '.join(VARIANTS)}")
    _torch()
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one generator at a time per output root
        for name in names:
            _build_one(out, name, quiet)
    return out


def _build_one(out, name, quiet):
    vdir = out / name
    stamp = stamp_for(name)
    if is_fresh(vdir, stamp):
        return
    t0 = time.time()
    tmp = out / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    info = build_variant(name, VARIANTS[name], tmp)
    (tmp / "stamp.json").write_text(json.dumps(stamp))
    shutil.rmtree(vdir, ignore_errors=True)
    tmp.rename(vdir)
    if not quiet:
        rm = info["router_margin"]
        print(f"{name:18s} {time.time() - t0:5.1f}s  max|logit| {info['max_abs_logit']:.2f}"
              f"  std {info['logit_std']:.2f}  min margin {min(info['margin']):.3f}"
              f"  gen min margin {min(info['gen_margin']):.3f}"
              + (f"  router min margin {min(rm):.3f}" if rm else ""), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="output root (default .cache/oracles)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="build only these variants")
    a = ap.parse_args(argv)
    root = generate(a.out, a.only)
    print(f"oracles ready under {root}")


if __name__ == "__main__":
    sys.exit(main())
