"""A GLM-5-shaped latent-attention model (glm_moe_dsa): 64 heads over a 512-wide latent with a
64-dim shared rotary key, a DSA indexer keeping 64 positions, and a narrow trunk, so that
attention's working memory (a prompt's expanded keys and values, the absorbed queries, the
gathered rows of a selection) is most of what the engine holds: the sizes at which the RAM budget's
latent-attention terms matter. Random weights (transformers' own init, no oracle reference),
converted once and cached under .cache/."""
import streaming_model

ROOT = streaming_model.ROOT
TOKENIZER = ROOT / ".cache" / "oracles" / "glm_moe_dsa" / "hf"  # vocab 320
CONFIG = dict(vocab_size=320, hidden_size=128, intermediate_size=128, moe_intermediate_size=64, num_hidden_layers=2,
              first_k_dense_replace=1, mlp_layer_types=["dense", "sparse"], num_attention_heads=64,
              num_key_value_heads=64, q_lora_rank=128, kv_lora_rank=512, qk_nope_head_dim=64, qk_rope_head_dim=64,
              qk_head_dim=128, head_dim=64, v_head_dim=64, index_topk=64, index_n_heads=4, index_head_dim=64,
              indexer_types=["full", "full"], layer_types=["indexed_attention", "indexed_attention"],
              n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1, n_shared_experts=1,
              max_position_embeddings=4096, eos_token_id=0, bos_token_id=None, pad_token_id=None,
              tie_word_embeddings=False)
SEED = 7


def container():
    return streaming_model.cached_container("wide_mla", [CONFIG, SEED, 1], streaming_model.random_hf_model(
        "GlmMoeDsaForCausalLM", "GlmMoeDsaConfig", CONFIG, SEED, TOKENIZER), convert_args=())


if __name__ == "__main__":
    print(container())
