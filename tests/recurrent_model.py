"""A Qwen3.5-MoE text model whose gated-DeltaNet layers keep a large recurrent state (16 value
heads of 128 x 128) and whose routed experts are several times a small RAM budget: the sizes at
which a slot's turn-boundary checkpoints of that state matter to the budget. Random weights
(transformers' own init, no oracle reference), converted once and cached under .cache/."""
import hashlib
import json
import shutil
import subprocess
import sys

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
    key = hashlib.sha256(json.dumps([CONFIG, SEED, 1], sort_keys=True).encode()).hexdigest()[:16]
    root = ROOT / ".cache" / "recurrent" / key
    if (root / "container" / "colibri.json").exists():
        return root / "container"
    if root.exists():
        shutil.rmtree(root)
    import torch
    import transformers as tf
    torch.manual_seed(SEED)
    model = tf.Qwen3_5MoeForCausalLM(tf.Qwen3_5MoeTextConfig(**CONFIG)).eval()
    model.to(torch.bfloat16).save_pretrained(root / "hf")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER / name, root / "hf" / name)
    subprocess.run([sys.executable, str(ROOT / "coli"), "convert", str(root / "hf"), str(root / "container"),
                    "--experts", "q4"], check=True, capture_output=True)
    shutil.rmtree(root / "hf")
    return root / "container"


if __name__ == "__main__":
    print(container())
