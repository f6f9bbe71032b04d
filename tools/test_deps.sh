#!/usr/bin/env bash
# The system packages `make test` needs beyond a C compiler and Python: tmux (the terminal test
# drives `coli chat` in it), Debian's chromium (the dashboard tests), nginx (the scale-out test),
# clang with its fuzzer and sanitizer runtimes (`make fuzz-test`), npm (fetches the real
# tokenizer files). As root with apt it installs what is missing; otherwise it names the one
# command that does and fails at once, before any test runs.
set -euo pipefail
missing=()
command -v tmux >/dev/null || missing+=(tmux)
command -v chromium >/dev/null || missing+=(chromium)
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing+=(nginx)
if ! echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' |
        clang -fsanitize=fuzzer,address,undefined -x c - -o /dev/null 2>/dev/null; then
    missing+=(clang libclang-rt-dev)
fi
command -v npm >/dev/null || missing+=(npm)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "make test: installing ${missing[*]} (apt-get)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    exit 0
fi
echo "make test needs ${missing[*]}: run   sudo apt-get install ${missing[*]}   and try again" >&2
exit 1
