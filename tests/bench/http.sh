#!/bin/sh
# tests/bench/http.sh: what llamad-http costs (make bench-http, not part of
# the routine make bench). On stories260K (greedy, raw template, so every
# run generates the same tokens):
#  - added latency per streamed token: the same 400-token generation
#    streamed through llamactl on llamad's socket and through the gateway
#    (curl, /v1/completions with stream), ROUNDS alternating rounds; the
#    difference of the medians over the tokens;
#  - the gateway's memory with STREAMS streams open at once: its peak RSS
#    (VmHWM) while STREAMS curl clients stream answers of STREAM_TOKENS
#    (100) tokens each from a random-weight stories15M-shape model (slow
#    enough for the streams to overlap), and llamad_http_open_streams seen
#    at its highest.
# Prints key=value lines (bench=http*) and a table.
# Env: BUILD, MODELS, ROUNDS (7), STREAMS (100), STREAM_TOKENS (100).
set -e
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
ROUNDS=${ROUNDS:-7}
STREAMS=${STREAMS:-100}
N=400
dir=$(mktemp -d /tmp/llamad-bench-http.XXXXXX)
trap 'kill $gpid $pid 2>/dev/null; rm -rf "$dir"' EXIT
"$BUILD/llamad" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
    --socket "$dir/l.sock" --state-dir none --template raw --temperature 0 \
    --max-sessions 1024 --max-sessions-per-uid 0 2>"$dir/llamad.log" &
pid=$!
"$BUILD/llamad-http" --socket "$dir/l.sock" --name m --listen "$dir/h.sock" -q 2>"$dir/http.log" &
gpid=$!
for i in $(seq 100); do [ -S "$dir/l.sock" ] && [ -S "$dir/h.sock" ] && break; sleep 0.1; done
ms() { date +%s%N | awk '{ printf "%.3f", $1 / 1e6 }'; }
body='{"model":"m","prompt":"Once upon a time","max_tokens":'$N',"temperature":0,"stream":true}'

native() {
    t0=$(ms)
    "$BUILD/llamactl" --socket "$dir/l.sock" generate --raw -n $N --temperature 0 "Once upon a time" >"$dir/n.out"
    echo "$(ms) $t0" | awk '{ print $1 - $2 }'
}
gateway() {
    t0=$(ms)
    curl -sN --unix-socket "$dir/h.sock" http://x/v1/completions -d "$body" >"$dir/g.out"
    echo "$(ms) $t0" | awk '{ print $1 - $2 }'
}
native >/dev/null; gateway >/dev/null   # warm
: >"$dir/n.ms"; : >"$dir/g.ms"
for r in $(seq "$ROUNDS"); do
    native >>"$dir/n.ms"
    gateway >>"$dir/g.ms"
done
pieces=$(grep -c '^data: {' "$dir/g.out")
med() { sort -n "$1" | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
nm=$(med "$dir/n.ms"); gm=$(med "$dir/g.ms")
added=$(echo "$gm $nm $N" | awk '{ printf "%.4f", ($1 - $2) / $3 }')
echo "bench=http_latency tokens=$N rounds=$ROUNDS native_ms=$nm gateway_ms=$gm pieces=$pieces added_ms_per_token=$added"

# ---- STREAMS streams at once --------------------------------------------------------
# on a slower model (the stories15M shape, random weights), so that the
# streams overlap: STREAMS answers of SN tokens each
kill $gpid $pid; wait $gpid $pid 2>/dev/null || true
m15=$BUILD/bench-models/stories15M
[ -f "$m15/config.json" ] || "$BUILD/llamad-genmodel" --shape stories15M --out "$m15" \
    --tokenizer "$MODELS/tokenizer.model" >/dev/null
SN=${STREAM_TOKENS:-100}
"$BUILD/llamad" --model "$m15" --socket "$dir/l.sock" --state-dir none --template raw \
    --max-sessions 1024 --max-sessions-per-uid 0 2>"$dir/llamad.log" &
pid=$!
"$BUILD/llamad-http" --socket "$dir/l.sock" --name m --listen "$dir/h.sock" -q 2>"$dir/http.log" &
gpid=$!
for i in $(seq 300); do
    curl -s --unix-socket "$dir/h.sock" http://x/metrics 2>/dev/null | grep -q '^llamad_up{model="m"} 1' && break
    sleep 0.1
done
rss0=$(awk '/^VmRSS/ { print $2 }' /proc/$gpid/status)
i=0 pids=
while [ $i -lt "$STREAMS" ]; do
    curl -sN --unix-socket "$dir/h.sock" http://x/v1/completions \
        -d '{"model":"m","prompt":"Story '$i': once upon a time","max_tokens":'$SN',"temperature":0.8,"seed":'$i',"stream":true}' \
        >"$dir/s$i.out" 2>&1 &
    pids="$pids $!"
    i=$((i + 1))
done
top=0
alive() { for p in $pids; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
while alive; do
    o=$(curl -s --unix-socket "$dir/h.sock" http://x/metrics | sed -n 's/^llamad_http_open_streams //p')
    [ "${o:-0}" -gt "$top" ] 2>/dev/null && top=$o
    sleep 0.1
done
for p in $pids; do wait "$p" 2>/dev/null || true; done
hwm=$(awk '/^VmHWM/ { print $2 }' /proc/$gpid/status)
done_n=$(grep -l '^data: \[DONE\]' "$dir"/s*.out | wc -l)
echo "bench=http_streams streams=$STREAMS tokens=$SN open_streams_max=$top completed=$done_n gateway_rss_start_kib=$rss0 gateway_rss_peak_kib=$hwm"
echo
echo "llamad-http on stories260K ($(nproc) cores)"
printf '  %-44s %s\n' "$N tokens streamed, llamactl (native), median" "$nm ms" \
    "$N tokens streamed, llamad-http + curl, median" "$gm ms" \
    "added per streamed token" "$added ms (goal < 0.2)" \
    "$STREAMS streams of $SN tokens (stories15M shape)" "most open at once $top, $done_n completed" \
    "gateway RSS at start / peak" "$(echo "$rss0 $hwm" | awk '{ printf "%.1f / %.1f MiB (goal < 20)", $1 / 1024, $2 / 1024 }')"
