"""What transformers' config class of each family assumes for a field config.json leaves out.

A config.json written by hand (or by an older tool) may omit fields; transformers then runs the
model with its config class's defaults, so the converter must read the same ones rather than
the generic fallbacks family_registry uses for every family. Values copied from transformers
5.24's configuration_*.py; tests/test_config_variants.py checks them against the classes.
Fields the classes derive from others (num_key_value_heads = num_attention_heads when None)
are not listed: family_registry derives them the same way."""
import copy

DEFAULTS = {
    "olmoe": {"intermediate_size": 2048, "rms_norm_eps": 1e-05, "max_position_embeddings": 4096,
              "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": False},
    "mixtral": {"intermediate_size": 14336, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
                "max_position_embeddings": 131072, "num_local_experts": 8, "num_experts_per_tok": 2},
    "qwen2_moe": {"intermediate_size": 5632, "num_key_value_heads": 16, "rms_norm_eps": 1e-06,
                  "max_position_embeddings": 32768, "num_experts": 60, "num_experts_per_tok": 4,
                  "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632},
    "gpt_oss": {"intermediate_size": 2880, "num_key_value_heads": 8, "head_dim": 64, "rms_norm_eps": 1e-05,
                "max_position_embeddings": 131072, "num_local_experts": 128, "num_experts_per_tok": 4,
                "sliding_window": 128,
                # GptOssConfig.__post_init__, when neither rope_parameters nor rope_scaling is given
                "rope_parameters": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                    "truncate": False, "original_max_position_embeddings": 4096}},
    "qwen3_5_moe": {"num_key_value_heads": 2, "head_dim": 256, "rms_norm_eps": 1e-06, "max_position_embeddings": 32768,
                    "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
                    "shared_expert_intermediate_size": 512},
    # the release's spellings (kimi.config maps them to the usual ones afterwards)
    "kimi_linear": {"intermediate_size": 9216, "rms_norm_eps": 1e-05, "model_max_length": 1048576,
                    "num_experts": 256, "num_experts_per_token": 8, "moe_intermediate_size": 1024,
                    "moe_renormalize": True, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
                    "v_head_dim": 128, "num_shared_experts": 1, "routed_scaling_factor": 2.446,
                    "num_expert_group": 1, "topk_group": 1,
                    # KimiLinearConfig.__post_init__: one dense layer unless mlp_layer_types says otherwise
                    "first_k_dense_replace": 1},
    "minimax_m2": {"intermediate_size": 1536, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-06,
                   "max_position_embeddings": 196608, "num_local_experts": 256, "num_experts_per_tok": 8},
    "mimo_v2_flash": {"intermediate_size": 16384, "num_key_value_heads": 4, "rms_norm_eps": 1e-05,
                      "max_position_embeddings": 131072, "n_routed_experts": 256, "num_experts_per_tok": 8,
                      "moe_intermediate_size": 2048, "norm_topk_prob": True, "n_group": 1, "topk_group": 1},
}
ROPE_KEYS = ("rope_parameters", "rope_scaling")  # either spelling counts as given


def fill(family, cfg):
    """cfg with the family's class defaults for the fields it lacks (a field set to null stays
    null: several classes give null a meaning of its own)."""
    out = dict(cfg)
    for key, value in DEFAULTS.get(family, {}).items():
        if key in out or (key in ROPE_KEYS and any(k in out for k in ROPE_KEYS)):
            continue
        out[key] = copy.deepcopy(value)
    return out
