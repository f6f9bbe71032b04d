#!/usr/bin/env python3
"""Config-variant oracles: tiny checkpoints of the MoE families with the config values the
main oracles (tools/make_oracles.py) leave at one setting: other head geometries, top-k from 1
to 4, windows, RoPE variants, layer patterns, tied embeddings, optional biases and norms. A
checkpoint someone else trained picks its own values; each one here is a value a real config
may hold. Built like the main oracles (make_oracles.build_variant), under .cache/variant_oracles.
Usage: python tools/make_variant_oracles.py [--out DIR] [--only NAME...]
"""
import argparse
import contextlib
import fcntl
import json
import shutil
import sys
import time
from pathlib import Path

import make_oracles as mo

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / ".cache" / "variant_oracles"
TIED = mo.TIED_GAIN

QWEN35_SMALL = dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4,
                    num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16,
                    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
                    layer_types=["linear_attention", "full_attention"])

# name -> make_oracles variant spec (plus `wrapper`: the VL wrapper config's own fields) (family, seed, config overrides of make_oracles.BASE, ...)
VARIANTS = {
    # top-1 (renormalised: weight 1), biased projections with the whole-projection q/k norm over
    # one KV head, no clip, linear RoPE, tied embeddings
    "olmoe_top1_bias": dict(family="olmoe", seed=201, out_gain=TIED, config=dict(
        num_hidden_layers=2, num_key_value_heads=1, num_experts=4, num_experts_per_tok=1, intermediate_size=32,
        norm_topk_prob=True, attention_bias=True, clip_qkv=None, tie_word_embeddings=True,
        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})),
    # eight narrow heads, 16 experts top-4 unnormalised, a tight clip, YaRN
    "olmoe_top4_yarn": dict(family="olmoe", seed=202, config=dict(
        num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=8, num_experts=16, num_experts_per_tok=4,
        intermediate_size=16, clip_qkv=0.5, norm_topk_prob=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 128})),
    # head_dim wider than hidden/heads, one KV head, top-1, a window that binds, tied embeddings
    "mixtral_top1_headdim": dict(family="mixtral", seed=203, out_gain=TIED, config=dict(
        num_hidden_layers=2, num_key_value_heads=1, head_dim=32, num_local_experts=4, num_experts_per_tok=1,
        intermediate_size=32, sliding_window=30, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    # top-3 of 6, narrow heads, a window longer than the sequence (never binds), llama3 RoPE
    "mixtral_top3_llama3": dict(family="mixtral", seed=204, config=dict(
        num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=4, num_local_experts=6,
        num_experts_per_tok=3, intermediate_size=24, sliding_window=200, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    # every second layer sparse, renormalised top-1, no qkv bias, explicit head_dim, one KV head
    "qwen2_moe_step2": dict(family="qwen2_moe", seed=205, config=dict(
        num_hidden_layers=4, num_key_value_heads=1, head_dim=32, intermediate_size=80, num_experts=4,
        num_experts_per_tok=1, moe_intermediate_size=24, shared_expert_intermediate_size=40,
        decoder_sparse_step=2, norm_topk_prob=True, qkv_bias=False)),
    # two dense layers by mlp_only_layers, top-4 of 8, tied embeddings
    "qwen2_moe_top4_tied": dict(family="qwen2_moe", seed=206, out_gain=TIED, config=dict(
        num_hidden_layers=3, num_key_value_heads=2, num_experts=8, num_experts_per_tok=4, moe_intermediate_size=16,
        shared_expert_intermediate_size=64, mlp_only_layers=[0, 2], norm_topk_prob=False, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    # use_sliding_window: the even layers below max_window_layers keep a window of 12 (layer 4 is
    # past the limit), the rest attend to everything
    "qwen2_moe_window": dict(family="qwen2_moe", seed=217, config=dict(
        num_hidden_layers=5, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        shared_expert_intermediate_size=32, use_sliding_window=True, sliding_window=12, max_window_layers=3)),
    # full first, then two sliding layers (window 5), no attention biases, plain RoPE, top-1 of 4,
    # one KV head, its own SwiGLU alpha and limit
    "gpt_oss_top1_nobias": dict(family="gpt_oss", seed=207, config=dict(
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1, head_dim=16, num_local_experts=4,
        num_experts_per_tok=1, intermediate_size=32, sliding_window=5, attention_bias=False,
        swiglu_alpha=1.5, swiglu_limit=2.0, rms_norm_eps=1e-5,
        layer_types=["full_attention", "sliding_attention", "sliding_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    # only sliding layers, a window of 30, top-4 of 16, narrow heads, truncated YaRN, tied embeddings
    "gpt_oss_top4_allsliding": dict(family="gpt_oss", seed=208, out_gain=TIED, config=dict(
        num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, head_dim=8, num_local_experts=16,
        num_experts_per_tok=4, intermediate_size=16, sliding_window=30, tie_word_embeddings=True,
        layer_types=["sliding_attention", "sliding_attention"],
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0, "beta_fast": 16.0,
                         "beta_slow": 2.0, "truncate": True, "original_max_position_embeddings": 64})),
    # full_attention_interval 3 (no layer_types), as many key heads as value heads, a conv of 2,
    # half rotary, the plain mrope layout, top-1, one KV head, tied embeddings
    "qwen3_5_moe_text_interval3": dict(family="qwen3_5_moe", seed=209, model_type="qwen3_5_moe_text",
                                       out_gain=TIED, config=dict(
        num_hidden_layers=3, full_attention_interval=3, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
        num_experts=4, num_experts_per_tok=1, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        linear_num_key_heads=4, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=2, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.5,
                         "mrope_section": [4, 2, 2], "mrope_interleaved": False})),
    # the release wrapper; a full first layer, three value heads per key head, full rotary, top-3
    "qwen3_5_moe_vl_fullfirst": dict(family="qwen3_5_moe", seed=210, wrap="vl", config=dict(
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4,
        num_experts_per_tok=3, moe_intermediate_size=24, shared_expert_intermediate_size=16, rms_norm_eps=1e-5,
        linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=8, linear_value_head_dim=12,
        linear_conv_kernel_dim=4,
        layer_types=["full_attention", "linear_attention", "linear_attention", "linear_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0,
                         "mrope_section": [4, 2, 2], "mrope_interleaved": True})),
    # the wrapper's tie_word_embeddings, which transformers' wrapper model follows, against its
    # text_config's: tied by the wrapper only, then by the text_config only (not tied)
    "qwen3_5_moe_vl_wrapper_tied": dict(family="qwen3_5_moe", seed=232, wrap="vl", out_gain=TIED,
                                        wrapper=dict(tie_word_embeddings=True), config=dict(
        QWEN35_SMALL, tie_word_embeddings=False)),
    "qwen3_5_moe_vl_text_tied": dict(family="qwen3_5_moe", seed=233, wrap="vl", wrapper=dict(tie_word_embeddings=False),
                                     config=dict(QWEN35_SMALL, tie_word_embeddings=True)),
    # q_lora, one routing group, top-3 unnormalised, two shared experts, a kernel-3 conv, the
    # full layer last, no first_k_dense_replace (transformers: one dense layer)
    "kimi_linear_qlora": dict(family="kimi_linear", seed=211, router_tries=24, config=dict(
        num_hidden_layers=3, num_local_experts=8, num_experts_per_tok=3, moe_intermediate_size=16,
        n_shared_experts=2, n_group=1, topk_group=1, routed_scaling_factor=2.0, norm_topk_prob=False,
        q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=16, rms_norm_eps=1e-6,
        linear_attn_config={"full_attn_layers": [3], "kda_layers": [1, 2], "head_dim": 8, "num_heads": 4,
                            "short_conv_kernel_size": 3})),
    # explicit layer lists: a full first layer, a dense layer in the middle; MLA biases, four groups
    "kimi_linear_lists_bias": dict(family="kimi_linear", seed=212, router_tries=24, config=dict(
        num_hidden_layers=4, num_local_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
        n_shared_experts=1, n_group=4, topk_group=2, routed_scaling_factor=1.0, norm_topk_prob=True,
        q_lora_rank=None, kv_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=8,
        attention_bias=True, layer_types=["full_attention", "linear_attention", "linear_attention", "full_attention"],
        mlp_layer_types=["sparse", "dense", "sparse", "sparse"],
        linear_attn_config={"head_dim": 16, "num_heads": 2, "short_conv_kernel_size": 4})),
    # rotary_dim = head_dim (full rotary), top-1 of 4, tied embeddings
    "minimax_m2_fullrot_top1": dict(family="minimax_m2", seed=213, out_gain=TIED, config=dict(
        num_hidden_layers=2, num_key_value_heads=4, head_dim=16, num_local_experts=4, num_experts_per_tok=1,
        intermediate_size=32, rotary_dim=16, tie_word_embeddings=True, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    # partial_rotary_factor instead of rotary_dim, eight heads wider than hidden, top-3 of 8
    "minimax_m2_partial_top3": dict(family="minimax_m2", seed=214, config=dict(
        num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2, head_dim=16, num_local_experts=8,
        num_experts_per_tok=3, intermediate_size=24, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0, "partial_rotary_factor": 0.25})),
    # the config class's layer pattern (full first and every sixth), the hub's sliding_window_size,
    # v heads wider than q/k, its own value scale, every layer sparse, one group, top-k unnormalised
    # and scaled
    "mimo_v2_flash_default_pattern": dict(family="mimo_v2_flash", seed=215, config=dict(
        num_hidden_layers=7, num_key_value_heads=2, head_dim=16, v_head_dim=24, n_routed_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=16, n_group=1, topk_group=1, norm_topk_prob=False,
        routed_scaling_factor=2.0, sliding_window_size=7, attention_value_scale=0.5,
        mlp_layer_types=["sparse"] * 7,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4,
                                               "partial_rotary_factor": 0.25}})),
    # no sliding layer at all (no sinks), two dense layers first, four groups top-3, q/k/v biases
    "mimo_v2_flash_allfull": dict(family="mimo_v2_flash", seed=216, config=dict(
        num_hidden_layers=3, num_key_value_heads=1, head_dim=32, v_head_dim=16, n_routed_experts=8,
        num_experts_per_tok=3, moe_intermediate_size=16, n_group=4, topk_group=2, sliding_window=8,
        attention_bias=True, mlp_layer_types=["dense", "dense", "sparse"],
        layer_types=["full_attention"] * 3,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e5, "partial_rotary_factor": 1.0}})),
    # q heads wider than hidden (as the releases: 64 x 64 > 2880), an explicit YaRN attention factor
    "gpt_oss_wide_yarn": dict(family="gpt_oss", seed=218, config=dict(
        num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2, head_dim=16, num_local_experts=8,
        num_experts_per_tok=2, intermediate_size=24, sliding_window=7, swiglu_limit=3.0,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 16.0, "attention_factor": 1.2,
                         "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 32})),
    # q heads wider than hidden, YaRN over the (default) quarter rotary, alternating layers
    "qwen3_5_moe_text_wide_yarn": dict(family="qwen3_5_moe", seed=219, model_type="qwen3_5_moe_text", config=dict(
        num_hidden_layers=4, full_attention_interval=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000000.0, "factor": 4.0,
                         "original_max_position_embeddings": 128, "mrope_section": [2, 1, 1],
                         "mrope_interleaved": True})),
    # YaRN over rotary_dim 8 of 16
    "minimax_m2_yarn": dict(family="minimax_m2", seed=220, config=dict(
        num_hidden_layers=2, num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
        intermediate_size=16, rotary_dim=8,
        rope_parameters={"rope_type": "yarn", "rope_theta": 5000000.0, "factor": 2.0,
                         "original_max_position_embeddings": 256})),
    # YaRN on the full layers only, plain RoPE on the sliding ones
    "mimo_v2_flash_yarn": dict(family="mimo_v2_flash", seed=229, config=dict(
        num_hidden_layers=3, num_key_value_heads=1, head_dim=32, v_head_dim=16, n_routed_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=16, sliding_window=10,
        layer_types=["full_attention", "sliding_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "yarn", "rope_theta": 5e6, "factor": 4.0,
                                            "original_max_position_embeddings": 64, "partial_rotary_factor": 0.5},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4,
                                               "partial_rotary_factor": 0.5}})),
    # a partial_rotary_factor transformers' model never reads (default RoPE rotates whole heads)
    "mixtral_partial_unread": dict(family="mixtral", seed=234, config=dict(
        num_hidden_layers=2, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, intermediate_size=16,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})),
    "gpt_oss_partial_unread": dict(family="gpt_oss", seed=236, config=dict(
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
        num_experts_per_tok=2, intermediate_size=16, sliding_window=9, layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 150000.0, "partial_rotary_factor": 0.25})),
    # config.json in the older spelling: rope_scaling {"type": ...} beside a top-level rope_theta
    "mixtral_legacy_rope": dict(family="mixtral", seed=230, legacy_rope=True, config=dict(
        num_hidden_layers=2, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, intermediate_size=16,
        rope_parameters={"rope_type": "linear", "rope_theta": 500000.0, "factor": 2.0})),
    "olmoe_legacy_rope": dict(family="olmoe", seed=231, legacy_rope=True, config=dict(
        num_hidden_layers=2, num_key_value_heads=4, num_experts=4, num_experts_per_tok=2, intermediate_size=16,
        rope_parameters={"rope_type": "yarn", "rope_theta": 20000.0, "factor": 4.0,
                         "original_max_position_embeddings": 128})),
    # widths no kernel block divides (hidden 48 / 40, head_dim 12 / 24, expert width 20 / 24), a
    # vocabulary of 333, windows of one position, a single KDA head, rotary_dim 2
    "gpt_oss_h48_window2": dict(family="gpt_oss", seed=301, config=dict(
        vocab_size=333, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=12,
        num_local_experts=4, num_experts_per_tok=2, intermediate_size=20, sliding_window=2,
        layer_types=["sliding_attention", "full_attention"], rope_parameters={"rope_type": "default", "rope_theta": 1e4})),
    "mixtral_h40": dict(family="mixtral", seed=302, config=dict(
        hidden_size=40, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=2, intermediate_size=24)),
    "kimi_linear_h48_one_head": dict(family="kimi_linear", seed=303, router_tries=24, config=dict(
        hidden_size=48, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
        n_shared_experts=1, q_lora_rank=None, kv_lora_rank=20, qk_nope_head_dim=12, qk_rope_head_dim=4, v_head_dim=12,
        linear_attn_config={"full_attn_layers": [2], "kda_layers": [1], "head_dim": 24, "num_heads": 1,
                            "short_conv_kernel_size": 2})),
    "minimax_m2_rotary2": dict(family="minimax_m2", seed=304, config=dict(
        num_hidden_layers=2, num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
        intermediate_size=16, rotary_dim=2)),
    "qwen3_5_moe_text_h48": dict(family="qwen3_5_moe", seed=305, model_type="qwen3_5_moe_text", config=dict(
        hidden_size=48, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=24, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=24, shared_expert_intermediate_size=24, linear_num_key_heads=1,
        linear_num_value_heads=3, linear_key_head_dim=12, linear_value_head_dim=20, linear_conv_kernel_dim=3,
        layer_types=["linear_attention", "full_attention"])),
    "mimo_v2_flash_window2": dict(family="mimo_v2_flash", seed=306, config=dict(
        num_hidden_layers=2, num_key_value_heads=1, head_dim=24, v_head_dim=20, n_routed_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=24, sliding_window=2, mlp_layer_types=["sparse", "sparse"],
        layer_types=["sliding_attention", "full_attention"])),
    "olmoe_h48": dict(family="olmoe", seed=307, config=dict(
        vocab_size=333, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_experts=4,
        num_experts_per_tok=2, intermediate_size=20)),
    "qwen2_moe_h40": dict(family="qwen2_moe", seed=308, config=dict(
        hidden_size=40, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=36,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=20, shared_expert_intermediate_size=28)),
    # an odd int(head_dim x partial) (16 x 0.334, 20 x 0.25, rotary_dim 5): transformers rotates
    # 2 x ceil(dim / 2) dims; v heads wider than q/k without a value scale
    "mimo_v2_flash_odd_rotary": dict(family="mimo_v2_flash", seed=403, config=dict(
        num_hidden_layers=3, num_key_value_heads=2, head_dim=16, v_head_dim=32, n_routed_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=16, sliding_window=5, attention_value_scale=None, attention_bias=True,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"])),
    "qwen3_5_moe_text_odd_rotary": dict(family="qwen3_5_moe", seed=406, model_type="qwen3_5_moe_text", config=dict(
        QWEN35_SMALL, head_dim=20, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                    "partial_rotary_factor": 0.25})),
    "minimax_m2_odd_rotary": dict(family="minimax_m2", seed=407, config=dict(
        num_hidden_layers=2, num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
        intermediate_size=16, rotary_dim=5)),
    # odd widths in the hybrids: three MLA heads with odd latent ranks, three KDA heads of 10;
    # DeltaNet heads of 6 (key) and 10 (value) with a conv of 5
    "kimi_linear_odd_dims": dict(family="kimi_linear", seed=501, router_tries=24, config=dict(
        num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=3, num_local_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=20, n_shared_experts=1, q_lora_rank=18, kv_lora_rank=18, qk_nope_head_dim=10,
        qk_rope_head_dim=6, v_head_dim=14,
        linear_attn_config={"full_attn_layers": [2], "kda_layers": [1], "head_dim": 10, "num_heads": 3,
                            "short_conv_kernel_size": 3})),
    "qwen3_5_moe_text_odd_dims": dict(family="qwen3_5_moe", seed=502, model_type="qwen3_5_moe_text", config=dict(
        QWEN35_SMALL, num_key_value_heads=4, linear_num_key_heads=3, linear_num_value_heads=3, linear_key_head_dim=6,
        linear_value_head_dim=10, linear_conv_kernel_dim=5)),
    # two dense layers first (first_k_dense_replace 2), full layers around a KDA one, q_lora with MLA biases
    "kimi_linear_qlora_bias": dict(family="kimi_linear", seed=401, router_tries=24, config=dict(
        num_hidden_layers=3, num_local_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, n_shared_experts=1,
        n_group=2, topk_group=1, q_lora_rank=20, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=16,
        attention_bias=True, first_k_dense_replace=2,
        linear_attn_config={"full_attn_layers": [1, 3], "kda_layers": [2], "head_dim": 16, "num_heads": 2,
                            "short_conv_kernel_size": 4})),
    # every third layer sparse, the last one dense by mlp_only_layers, renormalised top-2
    "qwen2_moe_step3": dict(family="qwen2_moe", seed=402, config=dict(
        num_hidden_layers=6, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        shared_expert_intermediate_size=24, decoder_sparse_step=3, mlp_only_layers=[5], norm_topk_prob=True)),
    # no sliding layer (the window unused), top-3 of 4
    "gpt_oss_allfull": dict(family="gpt_oss", seed=404, config=dict(
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, head_dim=16, num_local_experts=4,
        num_experts_per_tok=3, intermediate_size=16, sliding_window=4, layer_types=["full_attention", "full_attention"])),
}
# Saved otherwise: f32 / f16 source tensors (converted to f32 containers), several shards
# (layers, and fused expert tensors, split across files), transformers' fused layout
STORAGE = {
    "gpt_oss_f32_sharded": ("gpt_oss_top1_nobias", dict(seed=221, dtype="float32", shard="40KB")),
    "qwen3_5_moe_vl_f16_sharded": ("qwen3_5_moe_vl_fullfirst", dict(seed=222, dtype="float16", shard="40KB")),
    "kimi_linear_f32_sharded": ("kimi_linear_qlora", dict(seed=223, dtype="float32", shard="40KB")),
    "minimax_m2_f16": ("minimax_m2_partial_top3", dict(seed=224, dtype="float16")),
    "mimo_v2_flash_f32_sharded": ("mimo_v2_flash_default_pattern", dict(seed=255, dtype="float32", shard="40KB")),
    "qwen2_moe_f16_sharded": ("qwen2_moe_step2", dict(seed=226, dtype="float16", shard="40KB")),
    "olmoe_f32": ("olmoe_top4_yarn", dict(seed=237, dtype="float32")),
    "mixtral_f16_sharded": ("mixtral_top3_llama3", dict(seed=228, dtype="float16", shard="40KB")),
    # transformers' own layout (save_original_format=False): fused mlp.experts.gate_up_proj / down_proj
    "olmoe_fused": ("olmoe_top4_yarn", dict(seed=238, layout="fused")),
    "qwen2_moe_fused": ("qwen2_moe_step2", dict(seed=239, layout="fused")),
    "kimi_linear_fused": ("kimi_linear_lists_bias", dict(seed=240, layout="fused")),
}
VARIANTS.update({name: dict(VARIANTS[base], **over) for name, (base, over) in STORAGE.items()})


@contextlib.contextmanager
def wrapper_fields(fields):
    """make_oracles builds a VL wrapper config from text_config alone: add the wrapper's own fields."""
    if not fields:
        yield
        return
    plain = mo.model_class

    def model_class(family, wrap=None):
        cfg_cls, model_cls = plain(family, wrap)
        return (lambda **kw: cfg_cls(**kw, **fields)) if wrap == "vl" else cfg_cls, model_cls
    mo.model_class = model_class
    try:
        yield
    finally:
        mo.model_class = plain


def legacy_rope(hf):
    """Rewrite config.json's rope_parameters in the spelling older configs use (rope_scaling
    with "type", rope_theta beside it), and check transformers reads it back the same."""
    import transformers
    path = hf / "config.json"
    cfg = json.loads(path.read_text())
    params = dict(cfg.pop("rope_parameters"))
    want = transformers.AutoConfig.from_pretrained(hf).rope_parameters
    cfg["rope_theta"] = params.pop("rope_theta")
    params["type"] = params.pop("rope_type")
    cfg["rope_scaling"] = params
    path.write_text(json.dumps(cfg, indent=2))
    got = {k: v for k, v in transformers.AutoConfig.from_pretrained(hf).rope_parameters.items() if k != "type"}
    assert got == want, f"{hf}: the legacy spelling reads back as {got}, not {want}"


def generate(out=DEFAULT_OUT, only=None, quiet=False):
    """Build every (or the named) variant that is missing or stale; return the root."""
    out = Path(out)
    names = list(only) if only else list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS)}")
    mo._torch()
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name in names:
            vdir = out / name
            # the spec lives here, outside make_oracles' hash: it joins the stamp
            stamp = dict(mo.stamp_for(name), spec=json.loads(json.dumps(VARIANTS[name])))
            if mo.is_fresh(vdir, stamp):
                continue
            t0 = time.time()
            tmp = out / f".{name}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            with wrapper_fields(VARIANTS[name].get("wrapper")):
                mo.build_variant(name, VARIANTS[name], tmp)
            if VARIANTS[name].get("legacy_rope"):
                legacy_rope(tmp / "hf")
            (tmp / "stamp.json").write_text(json.dumps(stamp))
            shutil.rmtree(vdir, ignore_errors=True)
            tmp.rename(vdir)
            if not quiet:
                print(f"{name:32s} {time.time() - t0:5.1f}s", flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="output root (default .cache/variant_oracles)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="build only these variants")
    a = ap.parse_args(argv)
    print(f"variant oracles ready under {generate(a.out, a.only)}")


if __name__ == "__main__":
    sys.exit(main())
