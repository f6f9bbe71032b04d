"""A reference MXFP4 quantizer (numpy) and gpt-oss MXFP4 checkpoints built with it: what the
releases ship, made from the tiny oracle model so the tests can convert them (the release
layout: NAME_blocks [E, rows, in/32, 16] with byte j = elements 2j (low nibble) and 2j+1,
NAME_scales [E, rows, in/32] e8m0, rows = output channels)."""
import json
import shutil
from pathlib import Path

import numpy as np

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float64)


def quantize(w):
    """w [..., n] (n % 32 == 0) -> (blocks uint8 [..., n/32, 16], scales uint8 [..., n/32]):
    per 32 values the smallest power-of-two scale that fits the largest magnitude in 6, each
    value to the nearest e2m1 code."""
    w = np.asarray(w, dtype=np.float64)
    g = w.reshape(*w.shape[:-1], w.shape[-1] // 32, 32)
    amax = np.abs(g).max(-1)
    e = np.where(amax > 0, np.ceil(np.log2(np.maximum(amax, 1e-300) / 6.0)), -127).clip(-127, 127)
    v = g / np.exp2(e)[..., None]
    mag = np.abs(v)[..., None] - E2M1
    code = np.abs(mag).argmin(-1).astype(np.uint8)
    code = np.where((v < 0) & (code > 0), code | 8, code).astype(np.uint8)
    blocks = (code[..., 0::2] | (code[..., 1::2] << 4)).astype(np.uint8)
    return blocks, (e + 127).astype(np.uint8)


def dequantize(blocks, scales):
    """The inverse, numpy: [..., G, 16], [..., G] -> float32 [..., G * 32]."""
    lut = np.concatenate([E2M1, -E2M1]).astype(np.float32)
    vals = np.stack([lut[blocks & 15], lut[blocks >> 4]], -1).reshape(*blocks.shape[:-1], 32)
    return (vals * np.exp2(scales.astype(np.float32) - 127)[..., None]).reshape(*scales.shape[:-1], -1)


def mxfp4_checkpoint(hf_dir, out_dir):
    """A copy of the gpt-oss checkpoint hf_dir whose experts are MXFP4 as the releases ship them
    (biases stay bf16), with quantization_config {quant_method: mxfp4}. Returns out_dir."""
    import torch
    from safetensors.torch import load_file, save_file
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    out_dir.mkdir(parents=True)
    for f in hf_dir.iterdir():
        if f.suffix != ".safetensors" and f.name != "config.json":
            shutil.copyfile(f, out_dir / f.name)
    tensors = {}
    for f in sorted(hf_dir.glob("*.safetensors")):
        for k, v in load_file(f).items():
            if k.endswith(("experts.gate_up_proj", "experts.down_proj")):
                # transformers keeps [E, in, out]; the releases store [E, out, in] blocks
                b, s = quantize(v.float().transpose(1, 2).numpy())
                tensors[k + "_blocks"] = torch.from_numpy(np.ascontiguousarray(b))
                tensors[k + "_scales"] = torch.from_numpy(np.ascontiguousarray(s))
            else:
                tensors[k] = v
    save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((hf_dir / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=1))
    return out_dir


def reference_logits(hf_dir, mx_dir, ids):
    """transformers' logits of the MXFP4 checkpoint: the float32 GptOss model with its experts
    dequantized by transformers' own MXFP4 code (integrations.mxfp4.convert_moe_packed_tensors,
    what it runs when it loads a release without GPU kernels), eager paths, one thread."""
    import torch
    import transformers as tf
    from safetensors.torch import load_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    torch.set_num_threads(1)
    model = tf.GptOssForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager",
                                                 experts_implementation="eager").eval()
    packed = load_file(Path(mx_dir) / "model.safetensors")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                p.copy_(convert_moe_packed_tensors(packed[name + "_blocks"], packed[name + "_scales"],
                                                   dtype=torch.float32))
        return model(torch.tensor([ids])).logits[0].float().numpy()
