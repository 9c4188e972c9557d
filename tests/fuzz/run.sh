#!/bin/sh
# Run every libFuzzer target in $FUZZ_BUILD for $FUZZ_TIME seconds each,
# starting from tests/fuzz/corpus/<target>/ (read-only: new inputs go to
# $FUZZ_BUILD/corpus/<target>/). Prints "ok: fuzz_x" or "FAILED: fuzz_x" per
# target (tests/run.sh counts these lines) with the executions and exec/s;
# a crashing input is saved under $FUZZ_BUILD/crashes/. Exit 1 if any failed.
# Env: FUZZ_BUILD (build-fuzz), FUZZ_TIME (60), MODELS (../shared/models).
FUZZ_BUILD=${FUZZ_BUILD:-build-fuzz}
FUZZ_TIME=${FUZZ_TIME:-60}
MODELS=${MODELS:-../shared/models}
export MODELS
here=$(dirname "$0")
rc=0
mkdir -p "$FUZZ_BUILD/crashes"

max_len() {
    case "$1" in
    fuzz_request) echo 4096 ;;
    fuzz_store) echo 16384 ;;
    fuzz_tokenizer) echo 2048 ;;
    fuzz_gguf) echo 32768 ;;
    *) echo 8192 ;;
    esac
}

for bin in "$FUZZ_BUILD"/fuzz_*; do
    [ -x "$bin" ] || continue
    t=$(basename "$bin")
    work="$FUZZ_BUILD/corpus/$t"
    log="$FUZZ_BUILD/$t.log"
    mkdir -p "$work"
    echo "== $t (${FUZZ_TIME}s)"
    ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        "$bin" -max_total_time="$FUZZ_TIME" -max_len="$(max_len "$t")" \
        -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$FUZZ_BUILD/crashes/$t-" \
        $( [ -f "$here/$t.dict" ] && echo "-dict=$here/$t.dict") \
        "$work" "$here/corpus/$t" >"$log" 2>&1
    r=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
    if [ "$r" -eq 0 ]; then
        echo "ok: $t ($execs runs, $speed exec/s)"
    else
        tail -n 40 "$log"
        echo "FAILED: $t (exit $r; input in $FUZZ_BUILD/crashes/)"
        rc=1
    fi
done
exit $rc
