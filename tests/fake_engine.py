#!/usr/bin/env python3
"""A scripted stand-in for `build/colibri serve`, for server tests that need an engine to
misbehave on cue. It speaks just enough of docs/protocol.md: READY, then for every SUBMIT an
ACCEPT, `max_tokens` DATA frames of "a" and an END.

    fake_engine.py MODE --model DIR [engine flags...]
    COLI_ENGINE=fake_engine.py COLI_FAKE_MODE=MODE coli serve ...   (`serve` as MODE reads it from there)

MODE:
  ok         behave
  odd        answer the first SUBMIT with an ACCEPT whose counts are not numbers
  garbage    answer the first SUBMIT with a DATA frame whose size is not a number
  slow:S     wait S seconds before every DATA frame
  silent     accept, then never answer again (stays alive)
  loading    never finish loading: no READY, ignore SIGTERM, sleep (a model that takes long to load)
  script     answer turn i with the i-th reply of the JSON list in COLI_FAKE_REPLIES (a list of
             DATA pieces each, cycling), END finish=stop; every SUBMIT's options and payload are
             appended as one JSON line to COLI_FAKE_LOG when set
  harmony    answer every SUBMIT with HARMONY (gpt-oss's analysis + final messages, one token a
             frame; the special tokens only with render_special=1, as the engine does) and append
             the SUBMIT options and payload as one JSON line to $COLI_FAKE_LOG
  moe        a streaming-MoE engine (the READY / END / ROUTING fields of docs/protocol.md) for the
             dashboard tests: READY with the expert fields of the model in --model, a scripted answer
             (REPLY, at most max_tokens pieces, COLI_FAKE_DELAY s apart), a ROUTING frame when SUBMIT
             asks routing=1, END with the tier and I/O stats, and .coli_usage updated after each turn;
             every SUBMIT's options and payload are appended to $COLI_FAKE_LOG when set
"""
import json
import os
import struct
import sys
import time

# Reasoning, Markdown and an HTML payload that a dashboard must show as text.
REPLY = ["<think>", "Checking ", "the experts.", "</think>", "Hello ", "**bold** ", "and ", "`code`", ".\n\n",
         "- one\n", "- two\n\n", "<img src=x onerror=alert(1)>", "\n\n```\nx = 1\n```\n"]


# What gpt-oss writes after `<|start|>assistant`, token by token (`True`: a special token).
HARMONY = [("<|channel|>", True), ("analysis", False), ("<|message|>", True), ("The user", False),
           (" greets.", False), ("<|end|>", True), ("<|start|>", True), ("assistant", False),
           ("<|channel|>", True), ("final", False), ("<|message|>", True), ("Hello", False), ("!", False)]


def harmony_turn(rid, opts, payload):
    with open(os.environ["COLI_FAKE_LOG"], "a", encoding="utf-8") as f:
        f.write(json.dumps({"opts": opts, "payload": payload.decode("utf-8", "replace")}) + "\n")
    emit(f"ACCEPT {rid} 3 0\n".encode())
    n = 0
    for text, special in HARMONY:
        n += 1
        data = text.encode() if opts.get("render_special") == "1" or not special else b""
        emit(f"DATA {rid} 97 {len(data)}\n".encode() + data)
    emit(f"END {rid} prompt_tokens=3 completion_tokens={n} reused_tokens=0 ttft_ms=0.1 prefill_tok_s=1 "
         f"decode_tok_s=1 finish=stop hit_rate=1.000 bytes_read=0 rss_mb=1\n".encode())


def emit(data):
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def moe_shape():
    """(MoE layers, experts per layer) of the model named by --model."""
    d = sys.argv[sys.argv.index("--model") + 1]
    with open(os.path.join(d, "colibri.json"), encoding="utf-8") as f:
        arch = json.load(f)["arch"]
    return sum(1 for k in arch["layer_mlp"] if k == "moe"), int(arch["num_experts"])


def routed(turn, layer, experts):
    """The experts turn `turn` routes to in `layer`: two per layer moving with every turn in a
    small model; in a large one eight, skewed towards a few hot experts per layer like real routing."""
    if experts <= 16:
        return sorted({(turn + layer) % experts, (3 * turn + 2 * layer + 1) % experts})
    x = (turn * 7919 + layer * 104729 + 1) & 0x7FFFFFFF
    picks = set()
    while len(picks) < 8:
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        u = x / 0x7FFFFFFF
        picks.add((int(experts * u ** 3) + layer * 37) % experts)  # u^3: low ranks are hot
    return sorted(picks)


USAGE = {}
DELAY = float(os.environ.get("COLI_FAKE_DELAY", "0"))  # seconds before each DATA frame, so a page sees a stream


def write_usage(counts, layers, experts):
    """.coli_usage next to colibri.json, as the engine keeps it (tmp + rename)."""
    d = sys.argv[sys.argv.index("--model") + 1]
    total = USAGE.setdefault("counts", [0] * len(counts))
    for i, c in enumerate(counts):
        total[i] += c
    USAGE["turns"] = USAGE.get("turns", 0) + 1
    rows = [total[i * experts:(i + 1) * experts] for i in range(layers)]
    tmp = os.path.join(d, ".coli_usage.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"version": 1, "layers": layers, "experts": experts, "turns": USAGE["turns"], "counts": rows}, f)
    os.replace(tmp, os.path.join(d, ".coli_usage"))


def moe_turn(rid, opts, turn, shape, payload=b""):
    log = os.environ.get("COLI_FAKE_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps({"opts": opts, "payload": payload.decode("utf-8", "replace")}) + "\n")
    n = int(opts.get("max_tokens", "64"))
    n = len(REPLY) if n < 0 else min(n, len(REPLY))
    emit(f"ACCEPT {rid} 3 0\n".encode())
    for piece in REPLY[:n]:
        time.sleep(DELAY)
        data = piece.encode()
        emit(f"DATA {rid} 97 {len(data)}\n".encode() + data)
    layers, experts = shape
    if opts.get("routing") == "1":
        counts = [0] * (layers * experts)
        for layer in range(layers):
            for e in routed(turn, layer, experts):
                counts[layer * experts + e] = 3 + n
        body = struct.pack(f"<{len(counts)}I", *counts)
        shown = layers + int(os.environ.get("COLI_FAKE_BAD_ROUTING", "0"))  # a shape that disagrees with the body
        emit(f"ROUTING {rid} {shown} {experts} {len(body)}\n".encode() + body)
        write_usage(counts, layers, experts)
    cached = min(layers * experts, 2 * layers * (turn + 1))
    emit(f"END {rid} prompt_tokens=3 completion_tokens={n} reused_tokens=0 ttft_ms=12.5 prefill_tok_s=240 "
         f"decode_tok_s=50 finish=stop hit_rate=0.750 bytes_read=4096 rss_mb=64 hits=6 misses=2 read_gbps=1.25 "
         f"io_wait_ms=3.5 compute_ms=20.0 peak_rss_mb=70 experts_pinned=1 experts_cached={cached} "
         f"experts_total={layers * experts}\n".encode())


def script_turn(rid, opts, payload, turn):
    log = os.environ.get("COLI_FAKE_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps({"opts": opts, "payload": payload.decode("utf-8", "replace")}) + "\n")
    with open(os.environ["COLI_FAKE_REPLIES"], encoding="utf-8") as f:
        replies = json.load(f)
    pieces = replies[turn % len(replies)]
    emit(f"ACCEPT {rid} 3 0\n".encode())
    for piece in pieces:
        data = piece.encode()
        emit(f"DATA {rid} 97 {len(data)}\n".encode() + data)
    emit(f"END {rid} prompt_tokens=3 completion_tokens={len(pieces)} reused_tokens=0 ttft_ms=0.1 prefill_tok_s=1 "
         f"decode_tok_s=1 finish=stop hit_rate=1.000 bytes_read=0 rss_mb=1\n".encode())


def main():
    mode = sys.argv[1]
    if mode == "serve":
        mode = os.environ.get("COLI_FAKE_MODE", "ok")
    if mode == "loading":
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(60)
    shape = moe_shape() if mode == "moe" else None
    if shape:
        layers, experts = shape
        emit(f"READY family=fake vocab=320 ctx=512 slots=4 layers=3 kernels=none threads=1 tokenizer=1 "
             f"ram_budget=1073741824 dense_bytes=1000 kv_bytes=1000 runtime_bytes=1000 expert_cache_bytes=8192 "
             f"cap={max(1, experts // 2)} experts={experts} moe_layers={layers} expert_bytes=1024 pinned=1 "
             f"direct=0 readahead=1\n".encode())
    else:
        emit(b"READY family=fake vocab=320 ctx=512 slots=4 layers=1 kernels=none threads=1 tokenizer=1\n")
    turn = 0
    stdin = sys.stdin.buffer
    first = True
    while True:
        line = stdin.readline()
        if not line:
            return
        parts = line.decode().split()
        if not parts or parts[0] != "SUBMIT":
            continue  # STOP / CANCEL: every fake turn ends by itself
        rid, size = parts[1], int(parts[2])
        payload = stdin.read(size)
        opts = dict(p.split("=", 1) for p in parts[3:])
        if mode == "script":
            script_turn(rid, opts, payload, turn)
            turn += 1
            continue
        if mode == "harmony":
            harmony_turn(rid, opts, payload)
            continue
        if shape:
            moe_turn(rid, opts, turn, shape, payload)
            turn += 1
            continue
        n = int(opts.get("max_tokens", "4"))
        if n < 0:
            n = 4
        if mode == "odd" and first:
            emit(f"ACCEPT {rid} many few\n".encode())
        elif mode == "garbage" and first:
            emit(f"ACCEPT {rid} 3 0\nDATA {rid} 7 lots\n".encode())
        else:
            emit(f"ACCEPT {rid} 3 0\n".encode())
            if mode == "silent":
                time.sleep(3600)
            for _ in range(n):
                if mode.startswith("slow:"):
                    time.sleep(float(mode[5:]))
                emit(f"DATA {rid} 97 1\na".encode())
            emit(f"END {rid} prompt_tokens=3 completion_tokens={n} reused_tokens=0 ttft_ms=0.1 prefill_tok_s=1 "
                 f"decode_tok_s=1 finish=length hit_rate=1.000 bytes_read=0 rss_mb=1\n".encode())
        first = False


if __name__ == "__main__":
    main()
