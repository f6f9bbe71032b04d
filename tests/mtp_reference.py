"""A multi-token-prediction head written in torch from the DeepSeek-V3 report (section 2.2), over
a transformers model: RMSNorm of the next token's embedding and of the main model's last hidden
state (before the final norm), concatenated, projected by eh_proj, one decoder layer of the
family (transformers' own class, loaded with the MTP layer's weights), then shared_head.norm and
the head (the layer's shared_head.head where the checkpoint has one, else the model's).

Qwen3.5 / Qwen3.6 (vLLM's qwen3_next_mtp.py, the published implementation) store the same head
under `mtp.*`: pre_fc_norm_embedding and pre_fc_norm_hidden (enorm, hnorm), fc (eh_proj), one
full-attention decoder layer (mtp.layers.0) and norm (shared_head.norm); every norm computes
x * (1 + w), and the head is the model's."""
import json
from pathlib import Path

import numpy as np
import torch

MTP_ONLY = ("enorm", "hnorm", "eh_proj", "shared_head", "embed_tokens")
QWEN35_PARTS = {"pre_fc_norm_embedding": "enorm", "pre_fc_norm_hidden": "hnorm", "fc": "eh_proj",
                "norm": "shared_head.norm"}


def is_qwen35(cfg):
    return str(cfg.get("model_type", "")).startswith("qwen3_5")


def qwen35_as_deepseek(t):
    """A Qwen3.5 checkpoint's mtp.* tensors under the DeepSeek-V3 layout's layer-relative names."""
    out = {}
    for k, v in t.items():
        if k.startswith("mtp.layers.0."):
            out[k[len("mtp.layers.0."):]] = v
        elif k.startswith("mtp.") and k[4:].rsplit(".", 1)[0] in QWEN35_PARTS:
            part, leaf = k[4:].rsplit(".", 1)
            out[f"{QWEN35_PARTS[part]}.{leaf}"] = v
    return out


def _layer_weights(t, prefix, layer, n_experts):
    """The MTP layer's decoder weights as transformers' layer class names them (experts fused)."""
    w = {k[len(prefix):]: v.float() for k, v in t.items() if k.startswith(prefix)}
    sd = {k: v for k, v in w.items() if k.split(".")[0] not in MTP_ONLY}
    experts = getattr(getattr(layer, "mlp", None), "experts", None)
    if "mlp.experts.0.gate_proj.weight" in sd and hasattr(experts, "gate_up_proj"):
        gate = [sd.pop(f"mlp.experts.{e}.gate_proj.weight") for e in range(n_experts)]
        up = [sd.pop(f"mlp.experts.{e}.up_proj.weight") for e in range(n_experts)]
        sd["mlp.experts.gate_up_proj"] = torch.stack([torch.cat([g, u], 0) for g, u in zip(gate, up)])
        sd["mlp.experts.down_proj"] = torch.stack([sd.pop(f"mlp.experts.{e}.down_proj.weight") for e in range(n_experts)])
    return w, sd


def mtp_logits(hf_dir, ids):
    """[len(ids) - 1][vocab]: row i predicts ids[i + 2] from position i's state and ids[i + 1]."""
    import transformers
    from safetensors.torch import load_file
    hf_dir = Path(hf_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        hf_dir, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager").eval()
    cfg = model.config
    L = cfg.num_hidden_layers
    t = {}
    for f in sorted(hf_dir.glob("*.safetensors")):
        t.update(load_file(f))
    qwen35 = is_qwen35(cfg.to_dict())
    if qwen35:  # the layer is a full-attention one, whatever the trunk's last layer is
        full = max(i for i, k in enumerate(cfg.layer_types) if k == "full_attention")
        layer = type(model.model.layers[full])(cfg, full).float().eval()
        w, sd = _layer_weights(qwen35_as_deepseek(t), "", layer, int(cfg.num_experts))
    else:
        layer = type(model.model.layers[-1])(cfg, L - 1).float().eval()  # built as the last layer is
        w, sd = _layer_weights(t, f"model.layers.{L}.", layer, int(getattr(cfg, "n_routed_experts", 0) or 0))
    layer.load_state_dict(sd)
    offset = 1.0 if qwen35 else 0.0

    def rms(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps) * (g + offset)
    got = {}
    hook = model.model.layers[-1].register_forward_hook(
        lambda m, i, o: got.__setitem__("h", o[0] if isinstance(o, tuple) else o))
    with torch.no_grad():
        x = torch.tensor([ids])
        model(x)
        hook.remove()
        h = got["h"][0, :-1]
        emb = model.model.embed_tokens(x[0, 1:])
        z = torch.cat([rms(emb, w["enorm.weight"]), rms(h, w["hnorm.weight"])], -1) @ w["eh_proj.weight"].T
        T = z.shape[0]
        pos = torch.arange(T)[None]
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
        rope_pos = pos[None].expand(3, 1, -1) if qwen35 else pos  # Qwen3.5's multimodal rotary: text ids thrice
        out = layer(z[None], attention_mask=mask, position_ids=pos, position_embeddings=model.model.rotary_emb(z[None], rope_pos))
        out = out[0] if isinstance(out, tuple) else out
        head = w.get("shared_head.head.weight", model.lm_head.weight)
        return (rms(out[0], w["shared_head.norm.weight"]) @ head.T).numpy().astype(np.float32)


def add_mtp_layer(src, dst, seed=0, bigram=None):
    """Copies the HF checkpoint src to dst with one MTP layer at index L: the last layer's weights
    perturbed, and random MTP projections and norms. bigram: {token: next} makes a head that
    ignores the main state and proposes bigram[t] after t (its layer adds nothing: o_proj and
    the MLP's down projections zero), so drafts get accepted where the main model repeats."""
    import shutil
    from safetensors.torch import load_file, save_file
    src, dst = Path(src), Path(dst)
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    if is_qwen35(cfg):
        assert bigram is None, "a Qwen3.5 head has no own output projection to make bigrams with"
        return _add_qwen35_mtp(dst, cfg, seed)
    L, H = cfg["num_hidden_layers"], cfg["hidden_size"]
    (dst / "config.json").write_text(json.dumps(dict(cfg, num_nextn_predict_layers=1)))
    t = load_file(dst / "model.safetensors")
    g = torch.Generator().manual_seed(seed)
    last, new = f"model.layers.{L - 1}.", f"model.layers.{L}."
    dt = next(iter(t.values())).dtype
    extra = {new + k[len(last):]: (v.float() * (1 + 0.2 * torch.randn(v.shape, generator=g))).to(v.dtype)
             for k, v in t.items() if k.startswith(last)}
    extra[new + "eh_proj.weight"] = (0.15 * torch.randn(H, 2 * H, generator=g)).to(dt)
    for n in ("enorm", "hnorm", "shared_head.norm"):
        extra[new + n + ".weight"] = (1 + 0.1 * torch.randn(H, generator=g)).to(dt)
    if bigram is not None:
        for k in extra:
            if k.endswith(("o_proj.weight", "down_proj.weight")):
                extra[k] = torch.zeros_like(extra[k])
        extra[new + "eh_proj.weight"] = torch.cat([torch.eye(H), torch.zeros(H, H)], 1).to(dt)
        extra[new + "enorm.weight"] = torch.ones(H, dtype=dt)
        extra[new + "shared_head.norm.weight"] = torch.ones(H, dtype=dt)
        emb = t["model.embed_tokens.weight"].float()
        unit = emb * torch.rsqrt(emb.pow(2).mean(-1, keepdim=True) + cfg["rms_norm_eps"])
        head = torch.zeros(cfg["vocab_size"], H)
        for a, b in bigram.items():
            head[b] += unit[a]
        extra[new + "shared_head.head.weight"] = head.to(dt)
    save_file({**t, **extra}, dst / "model.safetensors")
    return dst


def _add_qwen35_mtp(dst, cfg, seed):
    """Qwen3.5's layout: mtp.layers.0 from the last full-attention layer's weights, perturbed, and
    random fc and (1 + w) norms."""
    from safetensors.torch import load_file, save_file
    H = cfg["hidden_size"]
    (dst / "config.json").write_text(json.dumps(dict(cfg, mtp_num_hidden_layers=1)))
    t = load_file(dst / "model.safetensors")
    g = torch.Generator().manual_seed(seed)
    full = max(i for i, k in enumerate(cfg["layer_types"]) if k == "full_attention")
    last = f"model.layers.{full}."
    dt = next(iter(t.values())).dtype
    extra = {"mtp.layers.0." + k[len(last):]: (v.float() * (1 + 0.2 * torch.randn(v.shape, generator=g))).to(v.dtype)
             for k, v in t.items() if k.startswith(last)}
    extra["mtp.fc.weight"] = (0.15 * torch.randn(H, 2 * H, generator=g)).to(dt)
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        extra[f"mtp.{n}.weight"] = (0.1 * torch.randn(H, generator=g)).to(dt)
    save_file({**t, **extra}, dst / "model.safetensors")
    return dst
