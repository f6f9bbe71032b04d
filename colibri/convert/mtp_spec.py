"""The manifest's `mtp` entries: how the engine runs a checkpoint's multi-token-prediction layers
(`--draft mtp`). DeepSeek-V3 and the GLM MoE releases store each MTP layer at index
num_hidden_layers and up, as a decoder layer like the last one plus the MTP-only parts the
DeepSeek-V3 report names: `enorm` (RMSNorm of the next token's embedding), `hnorm` (RMSNorm of
the main model's last hidden state), `eh_proj` (the concatenation [enorm; hnorm] projected back
to the hidden size) and `shared_head.norm`; `embed_tokens` and `shared_head.head` are optional
copies of the trunk's (the trunk's are used when absent)."""
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


def mtp_specs(arch, mtp_layers, written, log):
    """One entry per kept MTP layer, or None (logged) when a layer lacks a part the engine needs:
    it then stays kept but not run. written: the names this conversion writes."""
    if not mtp_layers:
        return None
    L = arch["num_layers"]
    n = len(mtp_layers)
    # per-layer lists (layer_mlp, ...) go on as the last layer: an MTP layer is built like it; it
    # runs its own DSA indexer (its slot holds no earlier layer's selection to share)
    longer = {k: v + (["full"] if k == "indexer_types" else v[-1:]) * n for k, v in arch.items()
              if isinstance(v, list) and len(v) == L and k != "rope_inv_freq"}
    try:  # the family's own spec for layer index L and up
        specs = family_specs.layer_specs(dict(arch, num_layers=L + n, **longer))[L:]
    except (IndexError, KeyError, TypeError) as e:  # per-layer lists in the config stop at L
        log(f"note: no layer spec for the MTP layer(s) {mtp_layers} ({e!r}); kept, but `--draft mtp` cannot run them")
        return None
    out = []
    for layer, spec in zip(mtp_layers, specs):
        p = f"model.layers.{layer}."
        eps = spec["attn_norm"]["eps"]
        norm = {n: {"kind": "rmsnorm", "eps": eps, "tensors": {"weight": p + n + ".weight"}}
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
