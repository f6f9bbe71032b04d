#!/usr/bin/env python3
"""Encode throughput of colibri's C tokenizer against HF `tokenizers`, same text, same run.

Both sides encode the same records (corpus entries, repeated up to --mb megabytes) one at a
time on one thread; the C side is timed inside tok_encode (`tokenize --batch --timing`), the HF
side around Tokenizer.encode. Prints MB/s for each and the ratio. Needs the test venv
(tokenizers) and the tokenizer files from tools/fetch_tokenizers.py.

    .venv/bin/python tools/bench_tokenizer.py [--mb 4] [--bin build/colibri] [--rounds 3]
"""
import argparse
import os
import subprocess
import sys
import time

import fetch_tokenizers  # a sibling: `python tools/bench_tokenizer.py` puts tools/ on the path

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def corpus_records(mb):
    with open(os.path.join(ROOT, "tests", "data", "tokenizer_corpus.txt"), encoding="utf-8") as f:
        entries = [e.strip("\n") for e in f.read().split("\n%%\n")[1:]]
    records, size = [], 0
    while size < mb * 1e6:
        for e in entries:
            records.append(e)
            size += len(e.encode())
    return records


def bench_c(binary, model_dir, records):
    data = b"".join(b"%d\n" % len(r.encode()) + r.encode() for r in records)
    res = subprocess.run([binary, "tokenize", "--model", model_dir, "--batch", "--timing"], input=data,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True)
    stats = dict(kv.split("=") for kv in res.stderr.decode().split()[-2:])
    lines = res.stdout.decode().split("\n")[:-1]
    return float(stats["encode_seconds"]), int(stats["bytes"]), lines


def bench_hf(model_dir, records):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    t0 = time.perf_counter()
    out = [tok.encode(r, add_special_tokens=False).ids for r in records]
    return time.perf_counter() - t0, out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=4.0, help="megabytes of text per tokenizer")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "colibri"))
    ap.add_argument("--rounds", type=int, default=3, help="best of N for each side")
    ap.add_argument("--only", help="one tokenizer name (qwen3, deepseek_v3, gptoss)")
    args = ap.parse_args()
    os.environ["RAYON_NUM_THREADS"] = "1"  # HF: one thread, like the C side
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    if not os.path.exists(args.bin):
        sys.exit("bench_tokenizer: %s not found; run `make` first (or pass --bin)" % args.bin)
    records = corpus_records(args.mb)
    total = sum(len(r.encode()) for r in records)
    print("text: %.2f MB in %d records, best of %d rounds" % (total / 1e6, len(records), args.rounds))
    print("%-12s %10s %10s %8s %s" % ("tokenizer", "C MB/s", "HF MB/s", "C/HF", "ids equal"))
    for name, d in fetch_tokenizers.fetch_all().items():
        if args.only and name != args.only:
            continue
        c_best = hf_best = None
        for _ in range(args.rounds):
            cs, nbytes, lines = bench_c(args.bin, d, records)
            hs, ids = bench_hf(d, records)
            c_best = cs if c_best is None else min(c_best, cs)
            hf_best = hs if hf_best is None else min(hf_best, hs)
        equal = sum(line == ",".join(map(str, i)) for line, i in zip(lines, ids))
        c_mbs, hf_mbs = nbytes / c_best / 1e6, total / hf_best / 1e6
        print("%-12s %10.2f %10.2f %7.2fx %d/%d" % (name, c_mbs, hf_mbs, c_mbs / hf_mbs, equal, len(records)))


if __name__ == "__main__":
    main()
