"""GGUF `tokenizer.ggml.model = "llama"` (SentencePiece BPE: Llama 2, Mistral, Mixtral) as the
tokenizer.json transformers' LlamaTokenizerFast writes for the same SentencePiece model (stdlib
only).

GGUF keeps SentencePiece's pieces, scores and types but no merges. transformers derives the
merges from the vocabulary (convert_slow_tokenizer's SentencePieceExtractor): every split of a
piece into two pieces of the vocabulary is a merge, ranked by the merged piece's score (higher
first), splits of one piece ordered by the ids of their halves. The rest is the fixed legacy
Llama pipeline: "▁" prepended (unless add_space_prefix is false) and spaces replaced by "▁",
no pre-tokenizer, BPE with byte fallback to the <0xNN> pieces, and the decoder that undoes it.
"""
from colibri.errors import ConvertError

TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"


def merges_from_scores(vocab, scores):
    """SentencePieceExtractor's merges: [(left, right)] for vocab {piece: id}, scores {piece: score}."""
    out = []
    for merged, score in scores.items():
        local = []
        for k in range(1, len(merged)):
            left, right = merged[:k], merged[k:]
            if left in vocab and right in vocab:
                local.append((left, right, score))
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        out.extend(local)
    out.sort(key=lambda m: m[2], reverse=True)  # stable: ties keep the order above
    return [[a, b] for a, b, _ in out]


def build(g, tokens, types):
    """-> (vocab, added tokens, merges, normalizer, pre_tokenizer, decoder, BPE model options)."""
    md = g.metadata
    scores = md.get("tokenizer.ggml.scores")
    if not isinstance(scores, list) or len(scores) != len(tokens) or \
            not all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in scores):
        raise ConvertError(f"{g.path}: a SentencePiece ('llama') vocabulary needs tokenizer.ggml.scores, one number "
                           f"per token ({len(tokens)})")
    vocab, added, ranked = {}, [], {}
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty == TT_UNUSED:
            continue
        if t in vocab:
            raise ConvertError(f"{g.path}: token text {t!r} appears twice (ids {vocab[t]} and {i})")
        vocab[t] = i
        if ty in (TT_CONTROL, TT_UNKNOWN, TT_USER_DEFINED):
            added.append({"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": ty != TT_USER_DEFINED})
        ranked[t] = float(scores[i])  # every piece, as the extractor walks them
    unk_id = md.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < len(tokens) else None
    if not any(types[i] == TT_BYTE for i in range(len(types))):
        raise ConvertError(f"{g.path}: a SentencePiece ('llama') vocabulary without <0xNN> byte pieces is not supported")
    prefix = md.get("tokenizer.ggml.add_space_prefix", True)
    steps = ([{"type": "Prepend", "prepend": SPACE}] if prefix else []) + \
        [{"type": "Replace", "pattern": {"String": " "}, "content": SPACE}]
    normalizer = {"type": "Sequence", "normalizers": steps}
    decoder = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": SPACE}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1 if prefix else 0, "stop": 0}]}
    model = {"unk_token": unk, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False}
    return vocab, added, merges_from_scores(vocab, ranked), normalizer, None, decoder, model
