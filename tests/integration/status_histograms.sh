#!/bin/sh
# tests/integration/status_histograms.sh — Status's latency histograms
# (ttft, token_time) against what the generations streamed: after
# generations of several lengths (greedy, through protoclient), one that
# fails before its first token (its prompt does not fit the context),
# ttft counts one
# observation per Generate that streamed a token and token_time one per
# token event after each one's first (the streamed tokens: Done's
# generated_tokens, less the end of sequence, which is not streamed); the
# bounds are the protocol's, the counts per bucket add up to count, the
# sums are positive and no larger than the generations took; a SIGHUP
# keeps them. Read through llamactl status --json, and -v's lines.
# Env: BUILD (build folder), MODELS.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh
llamactl_frame
build_protoclient "$dir/pc"
sock=$dir/s
printf 'log_level = info\n' >"$dir/conf"
"$BUILD/llamad" --config "$dir/conf" --model "$MODELS/stories260K.bin" \
    --tokenizer "$MODELS/tok512.model" --socket "$sock" --state-dir none \
    --max-session-tokens 64 2>"$dir/log" &
pid=$!
wait_socket "$sock" "$pid" "$dir/log" 30

status() { "$CTL" --socket "$sock" status --json >"$dir/st.json" || bad "status --json failed"; }

# before any generation: both empty
status
python3 - "$dir/st.json" <<'PY' && ok "a fresh daemon: both histograms empty, with the protocol's bounds" || bad "fresh status: $(cat "$dir/st.json")"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["ttft"]["le"] == [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30], s["ttft"]
assert s["token_time"]["le"] == [0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1], s["token_time"]
for h in (s["ttft"], s["token_time"]):
    assert h["count"] == 0 and h["sum"] == 0 and h["counts"] == [0] * (len(h["le"]) + 1), h
PY

# generations of 1, 3, 8 and 20 tokens, each in its own session
: >"$dir/done"
t0=$(date +%s.%N)
i=0
for n in 1 3 8 20; do
    i=$((i + 1))
    "$dir/pc" "$sock" generate "h$i" "Once upon a time" "$n" >"$dir/g$i" 2>&1 ||
        bad "generate $n tokens: $(cat "$dir/g$i")"
    grep '^done ' "$dir/g$i" >>"$dir/done"
done
# a second turn in a session that has one
"$dir/pc" "$sock" generate h4 "The dog" 5 >"$dir/g5" 2>&1 || bad "generate again: $(cat "$dir/g5")"
grep '^done ' "$dir/g5" >>"$dir/done"
t1=$(date +%s.%N)
# a Generate that fails before any token: its prompt overflows the 64-token context
long="one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
long="$long $long $long $long"
"$dir/pc" "$sock" generate h9 "$long" 4 >"$dir/g9" 2>&1
grep -q '^error CONTEXT_FULL' "$dir/g9" && ok "a prompt over the context: CONTEXT_FULL, no token" ||
    bad "long prompt: $(cat "$dir/g9")"
grep -q '^token ' "$dir/g9" && bad "the failed Generate streamed: $(cat "$dir/g9")"

# what streamed: each Done's generated, less 1 for an end of sequence
gens=$(wc -l <"$dir/done")
toks=$(awk '{ split($3, g, "="); n += g[2] - ($2 == "STOP_EOS") } END { print n }' "$dir/done")
[ "$gens" -eq 5 ] && [ "$toks" -gt 5 ] && ok "5 generations streamed $toks tokens" ||
    bad "generations: $gens, tokens $toks: $(cat "$dir/done")"

check() {   # check WHAT: the histograms against $gens and $toks
    status
    python3 - "$dir/st.json" "$gens" "$toks" "$t0" "$t1" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
gens, toks, took = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[5]) - float(sys.argv[4])
ttft, tt = s["ttft"], s["token_time"]
assert ttft["count"] == gens, ("ttft count", ttft["count"], gens)
assert tt["count"] == toks - gens, ("token_time count", tt["count"], toks - gens)
for h in (ttft, tt):
    assert len(h["counts"]) == len(h["le"]) + 1, h
    assert sum(h["counts"]) == h["count"], h      # per bucket, not cumulative
    assert 0 < h["sum"] <= took, (h["sum"], took)
PY
}
check && ok "ttft.count = $gens generations, token_time.count = $toks - $gens; buckets add up" ||
    bad "histograms after the generations: $(cat "$dir/st.json")"

# -v says them in a line each
"$CTL" --socket "$sock" -v status >"$dir/v" 2>&1
if grep -Eq "^first token: +$gens generations, mean [0-9.]+ (µs|ms|s), p50 ~[0-9.]+ (µs|ms|s), p99 [~>] ?[0-9.]+ (µs|ms|s)$" "$dir/v" &&
   grep -Eq "^token time: +$((toks - gens)) intervals, mean " "$dir/v"; then
    ok "status -v: the two histograms' lines"
else
    bad "status -v: $(cat "$dir/v")"
fi
"$CTL" --socket "$sock" status >"$dir/plain" 2>&1
grep -Eq "^(first token|token time):" "$dir/plain" && bad "plain status shows histograms: $(cat "$dir/plain")"

# a reload keeps them
kill -HUP "$pid"
i=0
while ! grep -q "SIGHUP: reloaded" "$dir/log" && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
check && ok "SIGHUP keeps the histograms" || bad "after SIGHUP: $(cat "$dir/st.json")"
exit $fail
