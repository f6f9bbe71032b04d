"""The manifest's `mtp` entries: how the engine runs a checkpoint's multi-token-prediction layers
(`--draft mtp`). DeepSeek-V3 and the GLM MoE releases store each MTP layer at index
num_hidden_layers and up, as a decoder layer like the last one plus the MTP-only parts the
DeepSeek-V3 report names: `enorm` (RMSNorm of the next token's embedding), `hnorm` (RMSNorm of
the main model's last hidden state), `eh_proj` (the concatenation [enorm; hnorm] projected back
to the hidden size) and `shared_head.norm`; `embed_tokens` and `shared_head.head` are optional
copies of the trunk's (the trunk's are used when absent). Qwen3.5 / Qwen3.6 store the same parts
under `mtp.*` (colibri/family/qwen35.py renames them to this layout)."""
from colibri.family import common as family_common
from colibri.family import specs as family_specs


def spec_tensor_names(block, names):
    """Appends every tensor name a block spec (and its sub-blocks) gives to names."""
    for key, v in block.items():
        if key == "tensors":
            names.extend(v.values())
        elif key == "expert_tensors":
            names.extend(t.replace("{e}", str(e)) for t in v.values() for e in range(block["experts"]))
        elif isinstance(v, dict):
            spec_tensor_names(v, names)
    return names


def mtp_layer_specs(arch, n):
    """The family's layer specs for the n MTP layers at index num_layers and up. Per-layer lists
    (layer_mlp, ...) go on as the last layer, since an MTP layer is built like it, except that it
    runs its own DSA indexer (its slot holds no earlier layer's selection to share) and, in a
    hybrid, the attention kind the family names (arch mtp_layer_attn: Qwen3.5's is full GQA).
    Raises IndexError, KeyError or TypeError where the config's per-layer lists stop at the trunk."""
    L = arch["num_layers"]
    own = {"indexer_types": "full", "layer_attn": arch.get("mtp_layer_attn")}
    longer = {k: v + ([own[k]] if own.get(k) else v[-1:]) * n for k, v in arch.items()
              if isinstance(v, list) and len(v) == L and k != "rope_inv_freq"}
    return family_specs.layer_specs(dict(arch, num_layers=L + n, **longer))[L:]


def mtp_specs(arch, mtp_layers, written, log):
    """One entry per kept MTP layer, or None (logged) when a layer lacks a part the engine needs:
    it then stays kept but not run. written: the names this conversion writes."""
    if not mtp_layers:
        return None
    try:
        specs = mtp_layer_specs(arch, len(mtp_layers))
    except (IndexError, KeyError, TypeError) as e:
        log(f"note: no layer spec for the MTP layer(s) {mtp_layers} ({e!r}); kept, but `--draft mtp` cannot run them")
        return None
    out = []
    for layer, spec in zip(mtp_layers, specs):
        p = f"model.layers.{layer}."
        eps = spec["attn_norm"]["eps"]
        norm = {n: dict(family_common.norm(arch, p + n + ".weight"), eps=eps)  # the trunk's kind: (1 + w) in Qwen3.5
                for n in ("enorm", "hnorm", "shared_head.norm")}
        entry = {"layer": layer, "spec": spec, "enorm": norm["enorm"], "hnorm": norm["hnorm"],
                 "head_norm": norm["shared_head.norm"], "eh_proj": p + "eh_proj.weight",
                 "embed": p + "embed_tokens.weight" if p + "embed_tokens.weight" in written else None,
                 "head": p + "shared_head.head.weight" if p + "shared_head.head.weight" in written else None}
        names = spec_tensor_names(spec, [entry["eh_proj"]] + [n["tensors"]["weight"] for n in norm.values()])
        missing = sorted(set(names) - set(written))
        if missing:
            log(f"note: MTP layer {layer} lacks {', '.join(missing[:3])}; it is kept but `--draft mtp` cannot run it")
            return None
        out.append(entry)
    return out
