"""GGUF SentencePiece vocabularies (tokenizer.ggml.model "llama": Llama 2, Mistral, Mixtral) rebuilt
as the tokenizer.json transformers writes for them: the real Llama 2 tokenizer's pieces, types and
scores as llama.cpp stores them, turned back into a tokenizer.json whose merges are the original's
and which encodes and decodes like the original in HF tokenizers and in the engine."""
import json
from pathlib import Path

import pytest

import fetch_tokenizers
from colibri.convert import gguf as convert_gguf
from colibri.convert import gguf_spm
from colibri.errors import ConvertError
from test_gguf_common import CTokenizer
from test_gguf_convert import CORPUS

T = gguf_spm


class _Meta:
    def __init__(self, md):
        self.metadata, self.path = md, "test.gguf"


def spm_fields(tok_json):
    """(tokens, types, scores) as llama.cpp's LlamaModel writes a SentencePiece vocabulary. Merged
    pieces score by the rank of the merge that makes them (SentencePiece BPE scores fall with the
    merge order); single characters, bytes and control pieces score below every merge."""
    vocab = tok_json["model"]["vocab"]
    inv = {i: t for t, i in vocab.items()}
    rank = {}
    for r, m in enumerate(tok_json["model"]["merges"]):
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        rank.setdefault(a + b, r)
    specials = {t["id"]: t for t in tok_json["added_tokens"]}
    tokens, types, scores = [], [], []
    for i in range(len(inv)):
        t = inv[i]
        tokens.append(t)
        if i in specials:
            types.append(T.TT_UNKNOWN if t == "<unk>" else T.TT_CONTROL)
        elif len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
            types.append(T.TT_BYTE)
        else:
            types.append(T.TT_NORMAL)
        scores.append(-float(rank[t]) if t in rank else -1e9)
    return tokens, types, scores


@pytest.fixture(scope="module")
def llama2():
    try:
        d = Path(fetch_tokenizers.fetch("llama2"))
    except fetch_tokenizers.FetchError as e:
        pytest.fail(str(e), pytrace=False)
    return d, json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))


def metadata(tok_json, **extra):
    tokens, types, scores = spm_fields(tok_json)
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.scores": scores, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0, **extra}


def test_merges_are_derived_as_transformers_does(llama2):
    _, tj = llama2
    rebuilt, specials, eos, bos = convert_gguf.build_tokenizer(_Meta(metadata(tj)))
    want = [m.split(" ", 1) if isinstance(m, str) else m for m in tj["model"]["merges"]]
    assert rebuilt["model"]["merges"] == want
    assert rebuilt["model"]["vocab"] == tj["model"]["vocab"]
    assert (specials["bos_token"], specials["eos_token"], specials["unk_token"], bos, eos) == ("<s>", "</s>", "<unk>", 1, [2])
    for key in ("normalizer", "pre_tokenizer", "decoder"):
        assert rebuilt[key] == tj[key], key
    for key in ("single", "special_tokens"):  # BOS first (pairs of sequences are never encoded here)
        assert rebuilt["post_processor"][key] == tj["post_processor"][key], key


def test_rebuilt_tokenizer_encodes_and_decodes_like_the_original(llama2, tmp_path):
    from tokenizers import Tokenizer
    d, tj = llama2
    rebuilt, *_ = convert_gguf.build_tokenizer(_Meta(metadata(tj)))
    (tmp_path / "tokenizer.json").write_text(json.dumps(rebuilt, ensure_ascii=False), encoding="utf-8")
    orig = Tokenizer.from_file(str(d / "tokenizer.json"))
    mine = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    engine = CTokenizer(tmp_path / "tokenizer.json")
    for text in CORPUS + ["  two leading spaces", "<s>special</s> after", "Ünïcödé 你好 🦙", "tab\tand\nnewline"]:
        for add in (False, True):
            want = orig.encode(text, add_special_tokens=add).ids
            assert mine.encode(text, add_special_tokens=add).ids == want, text
            assert engine.encode(text, add_special=add) == want, text
        assert mine.decode(want, skip_special_tokens=False) == orig.decode(want, skip_special_tokens=False)


def test_spm_needs_scores_and_byte_pieces(llama2):
    _, tj = llama2
    md = metadata(tj)
    del md["tokenizer.ggml.scores"]
    with pytest.raises(ConvertError, match="needs tokenizer.ggml.scores"):
        convert_gguf.build_tokenizer(_Meta(md))
    md = metadata(tj)
    md["tokenizer.ggml.token_type"] = [T.TT_NORMAL if t == T.TT_BYTE else t for t in md["tokenizer.ggml.token_type"]]
    with pytest.raises(ConvertError, match="without <0xNN> byte pieces"):
        convert_gguf.build_tokenizer(_Meta(md))


def test_no_space_prefix(llama2):
    _, tj = llama2
    rebuilt, *_ = convert_gguf.build_tokenizer(_Meta(metadata(tj, **{"tokenizer.ggml.add_space_prefix": False})))
    assert [s["type"] for s in rebuilt["normalizer"]["normalizers"]] == ["Replace"]
    assert rebuilt["decoder"]["decoders"][-1]["start"] == 0
