#!/bin/sh
# tests/bench/idle.sh — do idle connections slow the active ones? (make bench)
# One daemon on stories260K; llamad-load with $CONNS generating connections
# for $SECS s, alternately without and with $IDLE idle connections held,
# $ROUNDS times each; the median tok/s of each kind and their ratio. Target:
# with the idle ones at least 80% of without (llamad waits on them in epoll
# and never visits them). Prints one bench=idle_conns line; exit 1 when the
# target is missed. Alternating the runs keeps a slow stretch of a shared
# machine from landing on one kind only.
# Env: BUILD, MODELS, CONNS (64), IDLE (1000), SECS (3), ROUNDS (3).
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
CONNS=${CONNS:-64}
IDLE=${IDLE:-1000}
SECS=${SECS:-3}
ROUNDS=${ROUNDS:-3}
LOAD=$BUILD/llamad-load
dir=$(mktemp -d)
sock=$dir/sock
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$dir"' EXIT

want=$((IDLE + CONNS + 256))
# shellcheck disable=SC3045  # ulimit -n/-H: dash and bash have them
ulimit -n "$want" 2>/dev/null || {
    # shellcheck disable=SC3045
    hard=$(ulimit -H -n); ulimit -n "$hard"
    IDLE=$((hard - CONNS - 256)); [ "$IDLE" -gt 0 ] || IDLE=0
    echo "hard fd limit $hard: idle connections reduced to $IDLE"
}
"$BUILD/llamad" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
    --state-dir none --socket "$sock" --max-connections $((IDLE + CONNS + 64)) \
    --idle-timeout 0 --log-level warning 2>"$dir/log" &
pid=$!
i=0
until "$BUILD/llamactl" --socket "$sock" status >/dev/null 2>&1; do
    i=$((i + 1))
    [ $i -le 100 ] && kill -0 "$pid" 2>/dev/null || { echo "idle bench: daemon did not start"; cat "$dir/log"; exit 1; }
    sleep 0.1
done

run() {  # idle-count: prints tok/s
    "$LOAD" --socket "$sock" --conns "$CONNS" --seconds "$SECS" --idle "$1" >"$dir/out" 2>&1 ||
        { echo "idle bench: llamad-load failed:" >&2; cat "$dir/out" >&2; exit 1; }
    "$LOAD" --socket "$sock" --cleanup >/dev/null
    sed -n 's/.* tok_s=\([0-9.]*\).*/\1/p' "$dir/out" | tail -n 1
}
none=; with=
r=0
while [ $r -lt "$ROUNDS" ]; do
    none="$none $(run 0)"; with="$with $(run "$IDLE")"
    r=$((r + 1))
done
median() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# shellcheck disable=SC2086  # one word per run
m0=$(median $none); m1=$(median $with)
awk -v a="$m1" -v b="$m0" -v n="$CONNS" -v i="$IDLE" -v r0="$none" -v r1="$with" 'BEGIN {
    ratio = b > 0 ? a / b : 0
    gsub(/^ /, "", r0); gsub(/ /, ",", r0); gsub(/^ /, "", r1); gsub(/ /, ",", r1)
    printf "bench=idle_conns conns=%d idle=%d tok_s_without=%s tok_s_with=%s ratio=%.2f runs_without=%s runs_with=%s target=0.80 %s\n",
        n, i, b, a, ratio, r0, r1, (ratio >= 0.8 ? "met" : "MISSED")
    exit (ratio >= 0.8 ? 0 : 1) }'
