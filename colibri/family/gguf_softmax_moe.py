"""The GGUF metadata checks every softmax top-k MoE family shares (olmoe.py, qwen2_moe.py,
mixtral.py read their own keys after these): the expert counts, which layers are sparse, the
expert width against the expert tensors' own shape, and the sliding window.

The expert width is expert_feed_forward_length where written, else feed_forward_length (where
that is the experts' width, not the dense layers'); none of these families renormalizes the
top-k weights unless the registry says so (renorm), and a file that says expert_weights_norm
keeps its word."""
from colibri.errors import ConvertError


def width(g, tensors, name, L, what):
    """The expert (or shared expert) width from the first layer that has tensor `name` (GGUF
    shape [cols, rows(, experts)]: the row count of an up projection)."""
    for l in range(L):
        info = tensors.get(f"blk.{l}.{name}")
        if info is not None:
            return info.shape[1]
    raise ConvertError(f"{g.path}: no layer has {name}; cannot tell the {what} width")


def moe_layers(g, tensors, m, family, cfg, L, dense_layers=False, windowed=False):
    """The shared part of a softmax MoE's config: (experts, used, sparse layers, dense layers,
    expert width, expert_weights_norm). dense_layers: the family may keep dense layers (their width
    is feed_forward_length, not the experts'); windowed: it may slide its attention window."""
    experts = m.need("expert_count", int)
    used = m.need("expert_used_count", int)
    if not 0 < used <= experts:
        raise ConvertError(f"{g.path}: {m.arch}.expert_used_count {used} must be between 1 and expert_count {experts}")
    sparse = [l for l in range(L) if f"blk.{l}.ffn_gate_inp.weight" in tensors]
    dense = [l for l in range(L) if l not in sparse]
    if not sparse:
        raise ConvertError(f"{g.path}: {m.arch}.expert_count is {experts} but no layer has a router (ffn_gate_inp)")
    if dense and not dense_layers:
        raise ConvertError(f"{g.path}: layers {dense} have no router (ffn_gate_inp); every {family} layer is sparse")
    got = width(g, tensors, "ffn_up_exps.weight", L, "expert")
    # a family with dense layers has their width as feed_forward_length, not the experts'
    w = m.get("expert_feed_forward_length", kind=int) or \
        (cfg["intermediate_size"] if not dense_layers else 0) or got
    if got != w:
        raise ConvertError(f"{g.path}: the expert tensors are {got} wide, the metadata says {w}")
    for l in sparse:
        info = tensors.get(f"blk.{l}.ffn_up_exps.weight")
        if info is None or len(info.shape) != 3 or info.shape[2] != experts:
            raise ConvertError(f"{g.path}: blk.{l}.ffn_up_exps.weight must hold {experts} experts "
                               f"({m.arch}.expert_count); it is {None if info is None else list(info.shape)}")
    norm = m.get("expert_weights_norm")
    window = m.get("attention.sliding_window", kind=int)
    if window and not windowed:
        raise ConvertError(f"{g.path}: {m.arch}.attention.sliding_window {window}: sliding-window attention is "
                           f"not supported for {family}")
    if window:  # every layer attends to its last `window` positions
        cfg["sliding_window"] = window
    return experts, used, sparse, dense, w, norm
