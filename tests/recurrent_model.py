"""A Qwen3.5-MoE text model whose gated-DeltaNet layers keep a large recurrent state (16 value
heads of 128 x 128) and whose routed experts are several times a small RAM budget: the sizes at
which a slot's turn-boundary checkpoints of that state matter to the budget. Random weights
(transformers' own init, no oracle reference), converted once and cached under .cache/."""
import streaming_model

ROOT = streaming_model.ROOT
TOKENIZER = ROOT / ".cache" / "oracles" / "qwen3_5_moe" / "hf"  # vocab 320
CONFIG = dict(vocab_size=320, hidden_size=128, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
              head_dim=32, num_experts=32, num_experts_per_tok=4, moe_intermediate_size=512,
              shared_expert_intermediate_size=64, linear_num_key_heads=4, linear_num_value_heads=16,
              linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
              layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
              max_position_embeddings=4096, eos_token_id=0, bos_token_id=None, pad_token_id=None)
SEED = 5


def container():
    return streaming_model.cached_container("recurrent", [CONFIG, SEED, 1], streaming_model.random_hf_model(
        "Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig", CONFIG, SEED, TOKENIZER), convert_args=("--experts", "q4"))


if __name__ == "__main__":
    print(container())
