"""Mixtral's expert layout (`expert_names: mixtral`, also MiniMax-M2's): experts under
block_sparse_moe.experts.N.w1/w3/w2 and the router at block_sparse_moe.gate, as the releases
save them."""


def hf_source_tensors(tensors, arch, log):
    """The tensors as they are; a checkpoint in transformers' own layout (save_original_format=False:
    mlp.gate, fused experts) reads through the shared MoE names instead."""
    if arch.get("expert_names") == "mixtral" and not any(".block_sparse_moe." in n for n in tensors):
        del arch["expert_names"]
    return tensors
