#!/usr/bin/env bash
# Runs fuzz targets one after another: fuzz/run.sh SECONDS TARGET...
# or folds the working corpus into the kept one: fuzz/run.sh merge TARGET...
# Each target fuzzes its kept corpus (fuzz/corpus/<t>/, read-only here) plus a working corpus
# (build/fuzz/corpus/<t>/, where new entries go) and prints executions, new corpus entries and
# findings. Any finding (crash, sanitizer report, leak, timeout, out-of-memory) fails the run
# and names the reproducer; replay it with `build/fuzz/fuzz_<t> FILE` (or the .py target).
set -uo pipefail
cd "$(dirname "$0")/.."
mode=$1; shift
failed=0
for t in "$@"; do
    # a Python target runs as its own executable (libFuzzer's merge re-runs argv[0]), with the
    # fuzz venv's python first on PATH for its #! line
    if [ -f "fuzz/fuzz_$t.py" ]; then cmd=(env "PATH=$PWD/build/fuzz-venv/bin:$PATH" PYTHONPATH=. "fuzz/fuzz_$t.py")
    else cmd=("build/fuzz/fuzz_$t"); fi
    kept="fuzz/corpus/$t" work="build/fuzz/corpus/$t" crashes="build/fuzz/crashes/$t" log="build/fuzz/$t.log"
    mkdir -p "$kept" "$work" "$crashes"
    opts=(-timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "-artifact_prefix=$crashes/")
    [ -f "fuzz/dict/$t.dict" ] && opts+=("-dict=fuzz/dict/$t.dict")
    if [ "$mode" = merge ]; then
        fresh="build/fuzz/merged/$t"
        # the kept entries (named seeds, regress-* reproducers) stay; only working-corpus inputs
        # that add coverage beyond them are added, under libFuzzer's hash names
        # only inputs up to MERGE_MAX_BYTES, so the committed corpus stays small
        small="build/fuzz/merge-in/$t"
        rm -rf "$fresh" "$small" && mkdir -p "$fresh" "$small" && cp "$kept"/* "$fresh"/ 2>/dev/null
        find "$work" -maxdepth 1 -type f -size -"${MERGE_MAX_BYTES:-2048}"c -exec cp {} "$small"/ \;
        if "${cmd[@]}" -merge=1 "${opts[@]}" "$fresh" "$small" >"$log" 2>&1 && grep -q '^MERGE-OUTER: .* new files' "$log" &&
            ! grep -q -E 'Permission denied|not found|Traceback' "$log"; then
            added=$(( $(ls "$fresh" | wc -l) - $(ls "$kept" | wc -l) ))
            cp -n "$fresh"/* "$kept"/
            echo "$t: kept corpus +$added entries, now $(ls "$kept" | wc -l) ($(du -sk "$kept" | cut -f1) KiB)"
        else echo "$t: merge failed, see $log"; failed=1; fi
        continue
    fi
    before=$(ls "$crashes" | wc -l)
    nice "${cmd[@]}" "${opts[@]}" -max_total_time="$mode" "$work" "$kept" >"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    new=$(sed -n 's/^stat::new_units_added: *//p' "$log" | tail -1)
    found=$(( $(ls "$crashes" | wc -l) - before ))
    [ "$rc" -ne 0 ] && [ "$found" -eq 0 ] && found=1
    printf 'fuzz %-17s %9s executions  %5s new corpus entries  %d findings  (corpus %d+%d)\n' \
        "$t" "${execs:-?}" "${new:-?}" "$found" "$(ls "$kept" | wc -l)" "$(ls "$work" | wc -l)"
    if [ "$rc" -ne 0 ]; then
        failed=1
        # the report's first lines: what went wrong and where (CI keeps no build/ to look in)
        grep -m1 -A14 -E 'ERROR: (AddressSanitizer|libFuzzer|LeakSanitizer)|runtime error|Uncaught Python exception' "$log" |
            grep -v -E 'in (fuzzer::|main |__libc_start|_start )' | sed 's/^/    | /'
        repro=$(ls -t "$crashes"/* 2>/dev/null | head -1)
        if [ -n "$repro" ]; then
            echo "    reproducer: $repro (replay: ${cmd[*]} $repro)"
            # small enough to paste back: base64 -d > FILE recreates it
            [ "$(stat -c %s "$repro")" -le 4096 ] && echo "    reproducer base64: $(base64 -w0 "$repro")"
        fi
        echo "    full log: $log"
    fi
done
exit $failed
