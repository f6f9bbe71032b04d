"""A scripted stand-in for `build/colibri serve`, for server tests that need an engine to
misbehave on cue. It speaks just enough of docs/protocol.md: READY, then for every SUBMIT an
ACCEPT, `max_tokens` DATA frames of "a" and an END.

    fake_engine.py MODE --model DIR [engine flags...]

MODE:
  ok         behave
  odd        answer the first SUBMIT with an ACCEPT whose counts are not numbers
  garbage    answer the first SUBMIT with a DATA frame whose size is not a number
  slow:S     wait S seconds before every DATA frame
  silent     accept, then never answer again (stays alive)
"""
import sys
import time


def emit(data):
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def main():
    mode = sys.argv[1]
    emit(b"READY family=fake vocab=320 ctx=512 slots=4 layers=1 kernels=none threads=1 tokenizer=1\n")
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
        stdin.read(size)
        opts = dict(p.split("=", 1) for p in parts[3:])
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
