"""`coli convert FILE.gguf OUT`: a llama.cpp GGUF file -> colibri container (stdlib only).

The GGUF metadata becomes an HF-style config.json (so colibri.family.normalize.normalize_arch applies as
for any checkpoint; a family's own keys and tensor names come from its module, found through
colibri/family/parts.py), the GGUF tensors are mapped to HF names and handed to convert_hf's planner
and shard writer, and the engine's convert-jobs moves the bytes with GGUF block types as
sources (c/kernels/gguf_quants.c). The tokenizer is rebuilt from tokenizer.ggml.* as a tokenizer.json
that HF `tokenizers` and the engine both read; the chat template goes to tokenizer_config.json.

Storage choice per tensor: a GGUF block that colibri can hold without float re-quantization
is kept (Q8_0 -> q8 and Q4_1 -> q4 are byte copies, Q4_0 -> q4 and Q5_0 -> q8 exact
re-encodings, Q4_K -> q4 keeps the nibbles with f16 sub-block scales), so a 4-bit source is
never widened to q8 or q6 (that would add size and error), and without --experts a Q8_0
expert stays q8 rather than taking the default q4. The 1-3-bit K-quants and i-quants
(Q2_K, Q3_K, IQ1_S .. IQ4_XS, what the dynamic quants of the large MoEs use) are stored as
they are, one storage type each (q2_k, iq2_xxs, ...; docs/container.md), and the engine runs
them with their own kernels (c/kernels/lowbit*.c). Q5_K and Q6_K (the attention, head and
embedding tensors of the dynamic quants) are kept the same way (q5_k, q6_k) where q6 is asked
for: the same size as q6, and no re-quantization error; Q4_K, Q5_K and Q6_K also where a K-quant
at least as wide is asked for by name (q4_k keeps Q4_K, q6_k all three). Elsewhere they are re-quantized to the
requested type, as Q5_1 always is: at the default q8 a decode step reads 1.3x the bytes, but on
today's kernels it is faster (a decode step's q6_k dot runs at half q8's rate; docs/benchmarks.md).
--experts/--dense bf16 or f32 always dequantize.

A model split by llama.cpp's gguf-split (PREFIX-00001-of-0000N.gguf, given by its first part)
is read as one file: the first part's metadata, every part's tensors. One GGUF model becomes
shards of about 2 GiB cut between layers (a layer and its experts stay in one shard), so an
interrupted conversion resumes shard by shard.

llama.cpp stores llama's Q and K projections with the rows of each head interleaved for its
rotary layout; they are put back in HF order (one convert job per row).

"""
import json
import os
import struct
from pathlib import Path

import family_registry
from colibri.checksum import sha256_file
from colibri.convert import gguf_kv_b, gguf_spm, gguf_undo, mtp_spec
from colibri.convert import hf as convert_hf
from colibri.convert.gguf_names import name_tables
from colibri.convert.gguf_reader import GGML_TYPES, GGUFError, read_gguf
from colibri.errors import ConvertError
from colibri.limits import WRITABLE_LOWBIT, fitted_storage, row_bytes
from version import VERSION
from colibri.family import common as family_common
from colibri.family import normalize as family_normalize
from colibri.family import parts as family_parts

ARCHS = family_parts.GGUF_ARCHS  # general.architecture -> family: every kind of file this reads
LOW_BIT = ("Q2_K", "Q3_K", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS")
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "MXFP4") + LOW_BIT
FOUR_BIT = ("Q4_0", "Q4_1", "Q4_K")   # kept as q4 when q4, q6 or q8 is asked for
KEPT_K = ("Q5_K", "Q6_K")             # kept as q5_k/q6_k when q6 is asked for
K_WIDTHS = ("Q4_K", "Q5_K", "Q6_K")   # kept as they are when a K-quant at least as wide is asked for
EXACT_Q8 = ("Q8_0", "Q5_0")           # kept as q8 when q8 is asked for
# LOW_BIT blocks are kept as they are (storage q2_k, iq1_s, ...) when any block type is asked for

# token types (llama.cpp's llama_token_type)
TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE = 1, 2, 3, 4, 5, 6
# texts llama.cpp also treats as end of generation when they are control tokens
EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>",
             "<|end_of_text|>", "<end_of_utterance>", "<|return|>", "<|call|>")

_BYTELEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
_BYTELEVEL_NO_REGEX = dict(_BYTELEVEL, use_regex=False)


def _split(pattern):
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}


_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_LLAMA3_RE = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2_RE = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN35_RE = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
              r"|\s+(?!\S)|\s+")
_O200K_RE = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
             r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
             r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DSV3_RES = (r"\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
             "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
             "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+")


def _seq(*steps):
    return {"type": "Sequence", "pretokenizers": list(steps)}


# tokenizer.ggml.pre -> (pre_tokenizer, normalizer, ignore_merges), as the HF originals of each
# family declare them (llama.cpp names the family; its own regexes are rewrites of these).
PRE_TOKENIZERS = {}
for _n in ("gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "trillion"):
    PRE_TOKENIZERS[_n] = (_BYTELEVEL, None, False)
for _n in ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"):
    PRE_TOKENIZERS[_n] = (_seq({"type": "Digits", "individual_digits": True}, _BYTELEVEL), None, False)
for _n in ("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"):
    PRE_TOKENIZERS[_n] = (_seq(_split(_LLAMA3_RE), _BYTELEVEL_NO_REGEX), None, True)
for _n in ("dbrx", "smaug-bpe"):
    PRE_TOKENIZERS[_n] = (_seq(_split(_LLAMA3_RE), _BYTELEVEL_NO_REGEX), None, False)
for _n in ("qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"):
    PRE_TOKENIZERS[_n] = (_seq(_split(_QWEN2_RE), dict(_BYTELEVEL_NO_REGEX, trim_offsets=False)), {"type": "NFC"}, False)
PRE_TOKENIZERS["qwen35"] = (_seq(_split(_QWEN35_RE), dict(_BYTELEVEL_NO_REGEX, trim_offsets=False)), {"type": "NFC"}, False)
PRE_TOKENIZERS["deepseek-v3"] = (_seq(*[_split(r) for r in _DSV3_RES], _BYTELEVEL_NO_REGEX), None, False)
for _n in ("gpt-4o", "llama4"):
    PRE_TOKENIZERS[_n] = (_seq(_split(_O200K_RE), _BYTELEVEL_NO_REGEX), None, True)


class _Meta:
    """Typed access to GGUF metadata with errors that name the key."""

    def __init__(self, g, arch):
        self.g, self.arch = g, arch

    def get(self, key, default=None, kind=None, prefix=True):
        k = f"{self.arch}.{key}" if prefix else key
        v = self.g.metadata.get(k, default)
        if v is None:
            return None
        if kind is int and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise ConvertError(f"{self.g.path}: metadata {k} = {v!r} is not a non-negative integer")
        if kind is float and (not isinstance(v, (int, float)) or isinstance(v, bool)):
            raise ConvertError(f"{self.g.path}: metadata {k} = {v!r} is not a number")
        return v

    def need(self, key, kind):
        v = self.get(key, kind=kind)
        if v is None:
            raise ConvertError(f"{self.g.path}: GGUF metadata lacks {self.arch}.{key}")
        return v


def _uniform(meta, key, n_layers):
    """A per-layer value that GGUF may store as an array; colibri needs it uniform."""
    v = meta.g.metadata.get(f"{meta.arch}.{key}")
    if isinstance(v, list):
        if len(set(v)) != 1 or len(v) != n_layers:
            raise ConvertError(f"{meta.g.path}: {meta.arch}.{key} varies by layer ({v[:8]}...); not supported")
        return v[0]
    return meta.need(key, int)


def build_config(g, tensors):
    """GGUF metadata -> HF config.json dict."""
    gg_arch = g.metadata.get("general.architecture")
    if gg_arch not in ARCHS:
        raise ConvertError(f"{g.path}: GGUF architecture '{gg_arch}' is not supported "
                           f"(supported: {', '.join(ARCHS)})")
    family = family_parts.gguf_family(gg_arch, g.metadata)
    reader = family_parts.gguf_module(family)
    m = _Meta(g, gg_arch)
    L = m.need("block_count", int)
    H = m.need("embedding_length", int)
    emb = tensors.get("token_embd.weight")
    if emb is None or len(emb.shape) != 2:
        raise ConvertError(f"{g.path}: no 2-D token_embd.weight tensor")
    if hasattr(reader, "gguf_config"):  # the family's module builds the whole config
        base = {"hidden_size": H, "hidden_act": "silu", "rms_norm_eps": float(m.need("attention.layer_norm_rms_epsilon", float)),
                "max_position_embeddings": m.get("context_length", 4096, kind=int), "vocab_size": emb.shape[1],
                "tie_word_embeddings": "output.weight" not in tensors, "torch_dtype": "float32"}
        family, cfg = reader.gguf_config(g, tensors, m, _uniform, base)
        return family, _special_ids(g, cfg)
    heads = _uniform(m, "attention.head_count", L)
    kv = _uniform(m, "attention.head_count_kv", L) if f"{gg_arch}.attention.head_count_kv" in g.metadata else heads
    if heads < 1 or kv < 1 or heads % kv:
        raise ConvertError(f"{g.path}: {heads} attention heads and {kv} KV heads are not a valid grouping")
    head_dim = m.get("attention.key_length", kind=int) or H // heads
    vdim = m.get("attention.value_length", kind=int)
    if vdim and vdim != head_dim:
        raise ConvertError(f"{g.path}: key length {head_dim} != value length {vdim}; not supported")
    rot = m.get("rope.dimension_count", kind=int)
    if rot and rot != head_dim:
        raise ConvertError(f"{g.path}: partial rotary embedding ({rot} of {head_dim} dims) is not supported for {gg_arch}")
    cfg = {
        "architectures": [reader.GGUF_HF_CLASS[family]],
        "model_type": family,
        "hidden_size": H,
        "num_hidden_layers": L,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "intermediate_size": _uniform(m, "feed_forward_length", L) if f"{gg_arch}.feed_forward_length" in g.metadata else 0,
        "hidden_act": "silu",
        "rms_norm_eps": float(m.need("attention.layer_norm_rms_epsilon", float)),
        "rope_theta": float(m.get("rope.freq_base", 10000.0, kind=float)),
        "max_position_embeddings": m.get("context_length", 4096, kind=int),
        "vocab_size": emb.shape[1],
        "tie_word_embeddings": "output.weight" not in tensors,
        "torch_dtype": "float32",
    }
    scaling = m.get("rope.scaling.type") or ("linear" if m.get("rope.scale_linear") else None)
    if scaling == "linear":
        cfg["rope_scaling"] = {"rope_type": "linear",
                               "factor": float(m.get("rope.scaling.factor") or m.get("rope.scale_linear", kind=float))}
    elif scaling == "yarn":
        cfg["rope_scaling"] = {"rope_type": "yarn", "factor": float(m.need("rope.scaling.factor", float)),
                               "original_max_position_embeddings": m.need("rope.scaling.original_context_length", int)}
    elif scaling not in (None, "none"):
        raise ConvertError(f"{g.path}: rope scaling '{scaling}' is not supported")
    if hasattr(reader, "gguf_config_keys"):  # the family's own keys (biases, experts, norms)
        reader.gguf_config_keys(g, tensors, m, family, cfg, L)
    return family, _special_ids(g, cfg)


def _special_ids(g, cfg):
    tok = g.metadata
    for key, name in (("bos_token_id", "bos"), ("eos_token_id", "eos")):
        v = tok.get(f"tokenizer.ggml.{name}_token_id")
        if isinstance(v, int):
            cfg[key] = v
    return cfg


def _row_perm(rows, n_head):
    """HF row order of a llama.cpp-permuted Q/K weight: HF row h*hd + s*hd/2 + j lives in GGUF
    row h*hd + 2j + s (llama.cpp's permute reshapes (n_head, 2, hd/2) -> (n_head, hd/2, 2))."""
    hd = rows // n_head
    half = hd // 2
    out = []
    for r in range(rows):
        h, i = divmod(r, hd)
        s, j = divmod(i, half)
        out.append(h * hd + 2 * j + s)
    return out


def storage_for(gtype, qtype, default=False):
    """The colibri storage for a tensor of GGUF type gtype whose class asks for qtype; with
    default (the class's type was not chosen by the user), a Q8_0 block is kept as q8 too: the
    file's author chose it, and re-quantizing it to the default q4 would only add error."""
    if default and qtype == "q4" and gtype == "Q8_0":
        return "q8"
    if qtype in ("q8", "q6", "q4") and gtype in FOUR_BIT:
        return "q4"
    if gtype in KEPT_K and qtype == "q6":
        return gtype.lower()  # byte for byte: no error added, no more bytes
    if gtype in K_WIDTHS and qtype.upper() in K_WIDTHS and K_WIDTHS.index(gtype) <= K_WIDTHS.index(qtype.upper()):
        return gtype.lower()  # its own type, or a wider K-quant: widening would add bytes, not accuracy
    if qtype in ("q8", "q6", "q4", *WRITABLE_LOWBIT) and gtype in LOW_BIT:
        return gtype.lower()  # byte for byte: re-quantizing a low-bit block only adds error (and size)
    if qtype == "q8" and gtype in EXACT_Q8:
        return "q8"
    return qtype


def _gguf_row_bytes(info):
    _, block, size = GGML_TYPES[info.type]
    return info.shape[0] // block * size


def map_tensors(g, family, cfg):
    """GGUF tensors -> (table for convert_hf.plan_tensors, sources: HF name -> (info, first row, permute heads))."""
    reader = family_parts.gguf_module(family)
    L = reader.gguf_blocks(cfg) if hasattr(reader, "gguf_blocks") else cfg["num_hidden_layers"]
    names, per_layer, expert_prefix, experts = name_tables(family)
    table, sources, unknown = {}, {}, []
    permuted_qk = getattr(reader, "GGUF_PERMUTED_QK", False)  # llama.cpp permuted the Q/K rows
    splits_kv_b = getattr(reader, "GGUF_SPLIT_KV_B", False)  # MLA's kv_b_proj as attn_k_b + attn_v_b
    bias_rows = getattr(reader, "gguf_expert_bias_rows", None)
    rewrites = getattr(reader, "gguf_rewrites", None)
    split_kv_b = {}
    skipped = set(reader.gguf_skipped(g, cfg)) if hasattr(reader, "gguf_skipped") else set()
    for name, info in g.tensors.items():
        if name == "rope_freqs.weight" or name in skipped:
            continue  # read by rope_inv_freq_override; a part the family does not convert
        if info.type_name not in SUPPORTED_TYPES:
            raise ConvertError(f"{g.path}: tensor '{name}' is {info.type_name}; supported GGUF types: "
                               f"{', '.join(SUPPORTED_TYPES)}")
        path = g.file_of(info)
        shape = list(reversed(info.shape))
        hf, permute = names.get(name), None
        if hf is None and name.startswith("blk."):
            parts = name.split(".", 2)
            if len(parts) == 3 and parts[1].isdigit() and int(parts[1]) < L:
                pre = f"model.layers.{parts[1]}"
                if splits_kv_b and parts[2] in ("attn_k_b.weight", "attn_v_b.weight"):
                    split_kv_b.setdefault(int(parts[1]), {})[parts[2][5]] = info
                    continue
                if parts[2] in per_layer:
                    hf = f"{pre}.{per_layer[parts[2]]}"
                    if permuted_qk and parts[2] in ("attn_q.weight", "attn_k.weight"):
                        permute = cfg["num_attention_heads"] if parts[2] == "attn_q.weight" else cfg["num_key_value_heads"]
                    if permuted_qk and parts[2] in ("attn_q.bias", "attn_k.bias"):
                        raise ConvertError(f"{g.path}: llama GGUF with Q/K biases is not supported yet "
                                           "(their elements are permuted; see docs)")
                elif bias_rows and bias_rows(parts[2], shape, pre, path, table, sources, info):
                    continue
                elif parts[2] in experts:
                    if len(shape) != 3:
                        raise ConvertError(f"{g.path}: expert tensor '{name}' is not 3-D ({shape})")
                    E, rows, cols = shape
                    for e in range(E):
                        hn = f"{pre}.{expert_prefix}.{e}.{experts[parts[2]]}.weight"
                        table[hn] = dict(file=path, dtype="F32", shape=[rows, cols], offset=0)
                        sources[hn] = (info, e * rows, None)
                    continue
        if hf is None:
            unknown.append(name)
            continue
        if len(shape) > 2:
            raise ConvertError(f"{g.path}: tensor '{name}' has {len(shape)} dimensions where 1 or 2 are expected")
        if hf.endswith("shared_expert_gate.weight") and len(shape) == 1:
            shape = [1, shape[0]]  # a one-row matrix, which llama.cpp may store as a vector
        if rewrites:  # llama.cpp's rewrites of the family's tensors, read back (gguf_undo.py)
            shape, rows, how = rewrites(cfg, name, hf, shape)
            permute = ("rows", rows) if rows else ("scratch", how) if how else None
        # dtype is a placeholder for the planner's checks: the real source type is in `sources`
        table[hf] = dict(file=path, dtype="F32", shape=shape, offset=0)
        sources[hf] = (info, 0, permute)
    for l, kv in sorted(split_kv_b.items()):
        hn = f"model.layers.{l}.self_attn.kv_b_proj.weight"
        if set(kv) != {"k", "v"}:
            raise ConvertError(f"{g.path}: layer {l} needs attn_k_b and attn_v_b together (one of them is missing)")
        if hn in table:
            continue  # early MLA files keep attn_kv_b beside its split copies: the same weights
        k, v = kv["k"], kv["v"]
        nh, kl, dn, dv = cfg["num_attention_heads"], cfg["kv_lora_rank"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
        if list(k.shape) != [dn, kl, nh] or list(v.shape) != [kl, dv, nh]:
            raise ConvertError(f"{g.path}: blk.{l}.attn_k_b {k.shape} / attn_v_b {v.shape} do not match "
                               f"qk_nope {dn}, v_head_dim {dv}, kv_lora_rank {kl}, {nh} heads")
        table[hn] = dict(file=g.file_of(v), dtype="F32", shape=[nh * (dn + dv), kl], offset=0)
        sources[hn] = (v, 0, ("split_kv_b", l, k))
    if hasattr(reader, "gguf_finish_sources"):
        reader.gguf_finish_sources(cfg, sources)
    if unknown:
        more = f" (and {len(unknown) - 5} more)" if len(unknown) > 5 else ""
        raise ConvertError(f"{g.path}: GGUF tensors the {family} layout does not use: {', '.join(unknown[:5])}{more}; "
                           "refusing to drop weights silently")
    return table, sources


def rope_inv_freq_override(g, arch):
    """llama 3.x GGUFs carry their RoPE scaling as rope_freqs.weight (a divisor per frequency)."""
    info = g.tensors.get("rope_freqs.weight")
    if info is None:
        return None
    half = arch["head_dim"] // 2
    if info.type_name != "F32" or info.n_elements != half:
        raise ConvertError(f"{g.path}: rope_freqs.weight must be F32 with {half} values")
    with open(g.file_of(info), "rb") as f:
        f.seek(info.offset)
        factors = struct.unpack(f"<{half}f", f.read(4 * half))
    base = float(g.metadata.get(f"{g.metadata['general.architecture']}.rope.freq_base", 10000.0))
    dim = arch["head_dim"]
    return [family_common.float32(1.0 / (base ** (2 * i / dim)) / factors[i]) for i in range(half)]


# ---------------------------------------------------------------- tokenizer

def build_tokenizer(g):
    """tokenizer.ggml.* -> (tokenizer.json dict, special token texts dict, eos ids)."""
    md = g.metadata
    model = md.get("tokenizer.ggml.model")
    if model is None:
        raise ConvertError(f"{g.path}: the GGUF file has no tokenizer (tokenizer.ggml.model missing)")
    if model not in ("gpt2", "llama"):
        raise ConvertError(f"{g.path}: tokenizer.ggml.model '{model}' is not supported (only 'gpt2', byte-level BPE, "
                           "and 'llama', SentencePiece BPE)")
    tokens = md.get("tokenizer.ggml.tokens")
    types = md.get("tokenizer.ggml.token_type") or [TT_NORMAL] * len(tokens or [])
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise ConvertError(f"{g.path}: tokenizer.ggml.tokens must be a non-empty list of strings")
    if len(types) != len(tokens):
        raise ConvertError(f"{g.path}: {len(types)} token types for {len(tokens)} tokens")
    if model == "llama":
        vocab, added, merge_pairs, normalizer, pretok, decoder, bpe = gguf_spm.build(g, tokens, types)
        # llama.cpp adds BOS for SentencePiece vocabularies unless the file says otherwise
        return _finish_tokenizer(g, tokens, types, vocab, added, merge_pairs, normalizer, pretok, decoder, bpe,
                                 default_bos=True)
    pre = md.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise ConvertError(f"{g.path}: pre-tokenizer '{pre}' (tokenizer.ggml.pre) is not supported; supported: "
                           f"{', '.join(sorted(PRE_TOKENIZERS))}")
    pretok, normalizer, ignore_merges = PRE_TOKENIZERS[pre]
    merges = md.get("tokenizer.ggml.merges")
    if not isinstance(merges, list) or not all(isinstance(t, str) for t in merges):
        raise ConvertError(f"{g.path}: tokenizer.ggml.merges must be a list of strings")
    vocab, added = {}, []
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty == TT_UNUSED:
            continue  # llama.cpp's [PADn] fillers up to the embedding size
        if t in vocab:
            if ty in (TT_CONTROL, TT_USER_DEFINED):
                raise ConvertError(f"{g.path}: token text {t!r} appears twice (ids {vocab[t]} and {i})")
            continue  # HF keeps the first id for a duplicated text
        vocab[t] = i
        if ty in (TT_CONTROL, TT_USER_DEFINED):
            added.append({"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": ty == TT_CONTROL})
    merge_pairs = []
    for k, mg in enumerate(merges):
        sp = mg.find(" ", 1)  # llama.cpp splits at the first space after the first character
        if sp < 0:
            raise ConvertError(f"{g.path}: tokenizer.ggml.merges[{k}] {mg[:40]!r} is not 'a b'")
        a, b = mg[:sp], mg[sp + 1:]
        if a not in vocab or b not in vocab or a + b not in vocab:
            raise ConvertError(f"{g.path}: tokenizer.ggml.merges[{k}] {mg[:60]!r} names tokens that are not in "
                               "the vocabulary; the tokenizer is inconsistent")
        merge_pairs.append([a, b])
    decoder = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    bpe = {"unk_token": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": ignore_merges}
    return _finish_tokenizer(g, tokens, types, vocab, added, merge_pairs, normalizer, pretok, decoder, bpe)


def _finish_tokenizer(g, tokens, types, vocab, added, merge_pairs, normalizer, pretok, decoder, bpe, default_bos=False):
    """The parts both vocabulary kinds share: special tokens, the post-processor, end-of-generation ids."""
    md = g.metadata

    def tok_text(key):
        v = md.get(f"tokenizer.ggml.{key}_token_id")
        if isinstance(v, int) and 0 <= v < len(tokens) and types[v] != TT_UNUSED:
            return v, tokens[v]
        return None, None

    bos_id, bos = tok_text("bos")
    eos_id, eos = tok_text("eos")
    add_bos = bool(md.get("tokenizer.ggml.add_bos_token", default_bos)) and bos is not None
    add_eos = bool(md.get("tokenizer.ggml.add_eos_token", False)) and eos is not None
    if add_bos or add_eos:
        single = ([{"SpecialToken": {"id": bos, "type_id": 0}}] if add_bos else []) + \
                 [{"Sequence": {"id": "A", "type_id": 0}}] + \
                 ([{"SpecialToken": {"id": eos, "type_id": 0}}] if add_eos else [])
        pair = single + [dict(p) if "SpecialToken" in p else {"Sequence": {"id": "B", "type_id": 1}} for p in single]
        specials = {}
        for on, tid, txt in ((add_bos, bos_id, bos), (add_eos, eos_id, eos)):
            if on:
                specials[txt] = {"id": txt, "ids": [tid], "tokens": [txt]}
        post = {"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials}
    elif decoder.get("type") == "ByteLevel":
        post = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    else:
        post = None
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pretok,
        "post_processor": post,
        "decoder": decoder,
        "model": {"type": "BPE", "dropout": None, "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  **bpe, "vocab": vocab, "merges": merge_pairs},
    }
    eos_ids = [] if eos_id is None else [eos_id]
    for key in ("eot", "eom"):
        v, _ = tok_text(key)
        if v is not None and v not in eos_ids:
            eos_ids.append(v)
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty == TT_CONTROL and t in EOG_TEXTS and i not in eos_ids:
            eos_ids.append(i)
    specials = {"bos_token": bos, "eos_token": eos, "add_bos_token": add_bos, "add_eos_token": add_eos}
    for key in ("unknown", "padding"):
        _, txt = tok_text(key)
        if txt is not None:
            specials["unk_token" if key == "unknown" else "pad_token"] = txt
    return tokenizer, specials, eos_ids, bos_id


def chat_templates(g):
    md = g.metadata
    out = {}
    if isinstance(md.get("tokenizer.chat_template"), str):
        out["default"] = md["tokenizer.chat_template"]
    names = md.get("tokenizer.chat_templates")
    for n in names if isinstance(names, list) else []:
        t = md.get(f"tokenizer.chat_template.{n}")
        if isinstance(n, str) and isinstance(t, str):
            out[n] = t
    if not out:
        return None
    if list(out) == ["default"]:
        return out["default"]
    return [{"name": k, "template": v} for k, v in out.items()]


KV_B_SCRATCH = "kv_b_key_halves.f32.tmp"  # deepseek2's transposed attn_k_b, removed once the shards are written
SHARD_BYTES = 2 << 30  # one GGUF file is cut into ~2 GiB shards so an interrupted conversion resumes


def shard_anchors(planner):
    """Gives each output an anchor naming its shard: consecutive layers (by planner order)
    grouped up to SHARD_BYTES, so a layer and its experts never straddle two shards.
    convert_hf.layout_shards groups and names shards by anchor."""
    sizes = {}
    for o in planner.outputs:
        key = o["order"][0]
        sizes[key] = sizes.get(key, 0) + o["rows"] * row_bytes(o["qtype"], o["cols"])
    group, acc, anchor_of = 0, 0, {}
    for key in sorted(sizes):
        if acc and acc + sizes[key] > SHARD_BYTES:
            group, acc = group + 1, 0
        acc += sizes[key]
        anchor_of[key] = f"part{group}"
    for o in planner.outputs:
        o["anchor"] = anchor_of[o["order"][0]]
    return [f"part{g}" for g in range(group + 1)]


def write_json(path, obj):
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


# ---------------------------------------------------------------- conversion

def convert(src_path, out_dir, experts=None, dense="q8", log=print, imatrix=None, tensor_types=None):
    src, out = Path(src_path), Path(out_dir)
    convert_hf.check_storage(experts, dense, tensor_types)
    try:
        g = read_gguf(src)
    except GGUFError as e:
        raise ConvertError(str(e)) from None
    family, cfg = build_config(g, g.tensors)
    try:
        fam, arch = family_normalize.normalize_arch(cfg)
    except ValueError as e:
        raise ConvertError(f"{src}: {e}") from None
    inv = rope_inv_freq_override(g, arch)
    if inv is not None:
        arch["rope_inv_freq"] = inv
    tokenizer, specials, eos_ids, bos_id = build_tokenizer(g)
    table, sources = map_tensors(g, family, cfg)
    experts_default = experts is None
    if experts is None:
        experts = convert_hf.default_experts(any(t.type == 39 and "exps" in n for n, t in g.tensors.items()))
    arch["_family"] = fam
    planner = convert_hf.plan_tensors(arch, table, experts, dense, tensor_types)
    del arch["_family"]
    trunk, layers = convert_hf.block_specs(arch, planner)
    kept = {}
    scratch = out / KV_B_SCRATCH
    reader = family_parts.gguf_module(family)
    halves = hasattr(reader, "gguf_key_halves") and reader.gguf_key_halves(cfg)
    key_halves = gguf_kv_b.key_half_offsets(g, cfg) if halves else {}
    rewritten = []
    for o in planner.outputs:
        info, row0, permute = sources[o["name"]]
        gt = info.type_name
        split = isinstance(permute, tuple) and permute[0] == "split_kv_b"
        undo = isinstance(permute, tuple) and permute[0] == "scratch"
        if split or undo:  # kv_b_proj from attn_k_b (transposed into the scratch file) and attn_v_b
            gt = "F32"
        if o["qtype"] != "f32":
            o["qtype"] = storage_for(gt, o["qtype"], default=experts_default and o["klass"] == "expert" and not o["override"])
        o["blocks_kept"] = o["qtype"] == gt.lower()  # copied byte for byte: no --imatrix to weigh
        dt = info.type_name if info.type_name in ("F32", "F16", "BF16") else f"GGUF_{info.type_name}"
        rb = _gguf_row_bytes(info)
        base = info.offset + row0 * rb
        if split:
            dn, dv, kl = cfg["qk_nope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
            k0 = key_halves[permute[1]]
            o["parts"] = []
            for h in range(cfg["num_attention_heads"]):
                o["parts"] += [(str(scratch.resolve()), k0 + h * dn * kl * 4, "F32", dn),
                               (g.file_of(info), base + h * dv * rb, dt, dv)]
        elif undo:  # values llama.cpp rewrote: computed here, read from the scratch file
            gguf_undo.check(g, info, permute[1])
            off = sum(p[3] * p[4] for p in rewritten) * 4
            rewritten.append((off, info, permute[1], o["rows"], o["cols"]))
            o["parts"] = [(str((out / gguf_undo.SCRATCH).resolve()), off, "F32", o["rows"])]
        elif isinstance(permute, tuple):  # rows in another order (qwen35moe's tiled value heads)
            o["parts"] = [(o["parts"][0][0], base + r * rb, dt, 1) for r in permute[1]]
        elif permute:
            o["parts"] = [(o["parts"][0][0], base + r * rb, dt, 1) for r in _row_perm(o["rows"], permute)]
        else:
            o["parts"] = [(o["parts"][0][0], base, dt, o["rows"])]
        kept.setdefault(f"{gt} -> {o['qtype']}", 0)
        kept[f"{gt} -> {o['qtype']}"] += 1
    shards = convert_hf.layout_shards(planner, shard_anchors(planner))
    parts = [Path(p) for p in g.parts]  # one file, or every part of a split model
    stats = {p.name: p.stat() for p in parts}
    settings = {"converter_version": VERSION, "format_version": convert_hf.FORMAT_VERSION,
                **convert_hf.storage_settings(experts, dense, tensor_types),
                "source": {n: [st.st_size, int(st.st_mtime)] for n, st in stats.items()}}
    calibration = convert_hf.calibrate(settings, planner, family, imatrix)
    state = convert_hf.start_conversion(out, settings, len(shards), log)
    if state is None:
        return out
    name = g.metadata.get("general.name") or src.name
    split = f" in {len(parts)} parts" if len(parts) > 1 else ""
    log(f"converting {name} ({family_registry.FAMILIES[fam]['display']}, GGUF v{g.version}, {len(g.tensors)} tensors"
        f"{split}): {convert_hf.storage_line(experts, dense, tensor_types)}")
    log("  storage: " + ", ".join(f"{k} x{v}" for k, v in sorted(kept.items())))
    convert_hf.log_fallbacks(planner, log)
    if key_halves:
        log("transposing attn_k_b back into kv_b_proj")
        gguf_kv_b.write_kv_b_key_halves(g, cfg, scratch)
    for note in reader.gguf_notes(g, cfg) if hasattr(reader, "gguf_notes") else ():
        log(note)
    if rewritten:
        log("undoing llama.cpp's rewrites of the DeltaNet tensors and norms")
        gguf_undo.write_scratch(g, out / gguf_undo.SCRATCH, rewritten)
    try:
        convert_hf.write_calibrated_shards(out, shards, state, calibration, log)
    finally:
        scratch.unlink(missing_ok=True)
        (out / gguf_undo.SCRATCH).unlink(missing_ok=True)
    write_json(out / "config.json", cfg)
    write_json(out / "tokenizer.json", tokenizer)
    tcfg = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
            "model_max_length": cfg["max_position_embeddings"]}
    tcfg.update({k: v for k, v in specials.items() if v is not None})
    tmpl = chat_templates(g)
    if tmpl is not None:
        tcfg["chat_template"] = tmpl
    write_json(out / "tokenizer_config.json", tcfg)
    gen = {"bos_token_id": bos_id, "eos_token_id": eos_ids[0] if len(eos_ids) == 1 else eos_ids}
    write_json(out / "generation_config.json", {k: v for k, v in gen.items() if v is not None and v != []})
    log("checksumming the source")
    convert_hf.write_manifest(
        out, family=fam, arch=arch, trunk=trunk, layers=layers, experts=experts, dense=dense, tensor_types=tensor_types,
        bos=bos_id if bos_id is not None else -1, eos=eos_ids, shards=shards, quant_extra={"from_gguf": kept},
        mtp_layers=planner.mtp, mtp=mtp_spec.mtp_specs(arch, planner.mtp, convert_hf.written_names(planner), log), log=log,
        source={"files": {p.name: sha256_file(p) for p in parts}, "model_type": cfg["model_type"],
                "gguf": {"version": g.version, "architecture": g.metadata.get("general.architecture"),
                         "name": g.metadata.get("general.name"), "file_type": g.metadata.get("general.file_type")}})
    log(f"wrote {out}")
    return out
