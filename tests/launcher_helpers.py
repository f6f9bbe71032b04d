"""Helpers for the launcher tests: run `coli`, convert a tiny model, build synthetic containers."""
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from colibri.convert import safetensors_io  # noqa: E402

# A ChatML template (the tiny oracles ship none); THINK_TEMPLATE opens <think> for the answer.
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
THINK_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n"
                  "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
                  "{% else %}<think>\n{% endif %}{% endif %}")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("COLI_MODEL", "COLI_NO_PROFILE")}
    env.setdefault("COLI_HISTORY", "")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def coli(*args, env=None, input=None, timeout=120, cwd=None):
    """Runs ./coli; returns CompletedProcess with text stdout/stderr."""
    return subprocess.run([sys.executable, str(ROOT / "coli"), *map(str, args)], capture_output=True, text=True,
                          env=env or clean_env(), input=input, timeout=timeout, cwd=cwd)


def convert_tiny(oracle_root, out, family="qwen3_moe", template=CHATML):
    r = coli("convert", Path(oracle_root) / family / "hf", out)
    assert r.returncode == 0, r.stderr
    if template:
        (Path(out) / "chat_template.jinja").write_text(template)
    return Path(out)


def f32_containers(oracle_root, tmp_path_factory, timeout=600):
    """get(variant): the oracle converted once with f32 experts and dense trunk (exact logits)."""
    cache = {}

    def get(variant):
        if variant not in cache:
            out = tmp_path_factory.mktemp(variant) / "c"
            r = coli("convert", Path(oracle_root) / variant / "hf", out, "--experts", "f32", "--dense", "f32",
                     timeout=timeout)
            assert r.returncode == 0, r.stderr
            cache[variant] = out
        return cache[variant]
    return get


def ready_line(model, *flags):
    """The engine's READY fields for model, started with flags and stopped at once."""
    p = subprocess.run([str(ROOT / "build" / "colibri"), "serve", "--model", str(model), *flags], input=b"",
                       capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    line = p.stdout.decode().splitlines()[0]
    assert line.startswith("READY"), line
    return dict(kv.split("=", 1) for kv in line.split()[1:])


def copy_model(src, dst):
    shutil.copytree(src, dst)
    return Path(dst)


def shard_of(model):
    man = json.loads((Path(model) / "colibri.json").read_text())
    return Path(model) / man["shards"][0]


def rewrite_header(path, mutate):
    """Rewrites a shard's header through mutate(header dict); the data bytes stay as they are."""
    raw = Path(path).read_bytes()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen])
    mutate(header)
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * ((-(len(body) + 8)) % 64)
    Path(path).write_bytes(struct.pack("<Q", len(body)) + body + raw[8 + hlen:])


def q_cols(storage, cols):
    return {"q8": -(-cols // 32) * 34, "q4": -(-cols // 32) * 20}[storage]


def write_synthetic(d, layers=4, experts=16, top_k=2, hidden=256, moe_inter=128, vocab=1000, kv_heads=2, heads=4,
                    head_dim=64, max_pos=4096, dense_first=1):
    """A container whose shard is a sparse file: real headers, no real weights (enough for the planner)."""
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    entries, infos = [], {}

    def add(name, storage, rows, cols):
        if storage == "f32":
            dtype, shape, nbytes = "F32", [rows, cols], rows * cols * 4
        else:
            c = q_cols(storage, cols)
            dtype, shape, nbytes = "U8", [rows, c], rows * c
        entries.append((name, dtype, shape, nbytes))
        infos[name] = [storage, rows, cols]

    add("model.embed_tokens.weight", "q8", vocab, hidden)
    kinds = []
    for L in range(layers):
        p = f"model.layers.{L}"
        add(f"{p}.input_layernorm.weight", "f32", 1, hidden)
        add(f"{p}.post_attention_layernorm.weight", "f32", 1, hidden)
        add(f"{p}.self_attn.q_proj.weight", "q8", heads * head_dim, hidden)
        add(f"{p}.self_attn.k_proj.weight", "q8", kv_heads * head_dim, hidden)
        add(f"{p}.self_attn.v_proj.weight", "q8", kv_heads * head_dim, hidden)
        add(f"{p}.self_attn.o_proj.weight", "q8", hidden, heads * head_dim)
        if L < dense_first:
            kinds.append("dense")
            for proj, r, c in (("gate", 4 * hidden, hidden), ("up", 4 * hidden, hidden), ("down", hidden, 4 * hidden)):
                add(f"{p}.mlp.{proj}_proj.weight", "q8", r, c)
        else:
            kinds.append("moe")
            add(f"{p}.mlp.gate.weight", "f32", experts, hidden)
            for e in range(experts):
                for proj, r, c in (("gate", moe_inter, hidden), ("up", moe_inter, hidden), ("down", hidden, moe_inter)):
                    add(f"{p}.mlp.experts.{e}.{proj}_proj.weight", "q4", r, c)
    add("model.norm.weight", "f32", 1, hidden)
    add("lm_head.weight", "q8", vocab, hidden)
    meta = {"format": "colibri", "colibri.tensors": json.dumps(infos, separators=(",", ":"))}
    head, _offsets, total = safetensors_io.build_header(entries, meta)
    shard = d / "model-00001-of-00001.safetensors"
    with open(shard, "wb") as f:
        f.write(head)
        f.truncate(len(head) + total)  # sparse: the planner reads headers only
    arch = {"vocab_size": vocab, "hidden_size": hidden, "num_layers": layers, "num_heads": heads,
            "num_kv_heads": kv_heads, "head_dim": head_dim, "rotary_dim": head_dim,
            "rope_inv_freq": [1.0] * (head_dim // 2), "rope_attention_scaling": 1.0, "rms_norm_eps": 1e-6,
            "max_position_embeddings": max_pos, "hidden_act": "silu", "qk_norm": False,
            "tie_word_embeddings": False, "intermediate_size": 4 * hidden, "num_experts": experts,
            "num_experts_per_tok": top_k, "moe_intermediate_size": moe_inter, "norm_topk_prob": True,
            "q_bias": False, "k_bias": False, "v_bias": False, "o_bias": False, "mlp_bias": False,
            "layer_mlp": kinds}
    man = {"format": "colibri-container", "format_version": 1, "converter_version": "test", "family": "qwen3_moe",
           "arch": arch, "quant": {"experts": "q4", "dense": "q8"}, "bos_token_id": -1, "eos_token_ids": [0],
           "shards": [shard.name], "source": {"files": {}, "model_type": "qwen3_moe"}}
    (d / "colibri.json").write_text(json.dumps(man))
    return d, entries
