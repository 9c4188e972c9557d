#!/bin/sh
# make bench: engine speed on the tiny real model and on random-weight models
# of realistic shapes (generated once into $BUILD/bench-models). Prints one
# key=value line per model, then a table; then the CUDA backend's benchmark
# (llamad-gpucheck bench) when a GPU is usable. Figures go to docs/PERF.md by
# hand.
# Env: BUILD, MODELS, THREADS (default: all cores), BENCH_SHAPES to override
# the list ("shape:dtype ..."), BENCH_GGUF (more GGUF files for llamad and
# llama.cpp), LLAMA3_GGUF (llama.cpp's Llama 3 vocabulary), BENCH_DECODE=0
# (no decode table of the 1B shape: tests/bench/decode_table.sh).
set -e
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
THREADS=${THREADS:-0}
OUT=$BUILD/bench-models
SHAPES=${BENCH_SHAPES:-"stories15M:f32 stories110M:f32 stories110M:f16"}
mkdir -p "$OUT"
log=$BUILD/bench.log
: > "$log"

echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
"$BUILD/llamad-bench" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
    --threads "$THREADS" --no-bandwidth | tee -a "$log"
for s in $SHAPES; do
    shape=${s%%:*}; dtype=${s##*:}
    dir=$OUT/$shape-$dtype
    if [ ! -f "$dir/config.json" ]; then
        echo "== generating $shape ($dtype) into $dir"
        "$BUILD/llamad-genmodel" --shape "$shape" --dtype "$dtype" --out "$dir" \
            --tokenizer "$MODELS/tokenizer.model"
    fi
    "$BUILD/llamad-bench" --model "$dir" --threads "$THREADS" | tee -a "$log"
done

# quantized GGUF copies of the 110M shape (llamad-quantize from the f16 folder)
for t in q8_0 q4_0 q4_k q5_k q6_k; do
    q=$OUT/stories110M-$t.gguf
    [ -f "$q" ] || "$BUILD/llamad-quantize" --model "$OUT/stories110M-f16" --type $t --out "$q" >/dev/null
    "$BUILD/llamad-bench" --model "$q" --threads "$THREADS" | tee -a "$log"
done

# extra GGUF files (BENCH_GGUF="a.gguf b.gguf", e.g. the Llama 3.2-1B shape in
# Q4_0 and Q8_0): llamad-bench here, llama.cpp on them below
for g in ${BENCH_GGUF:-}; do
    "$BUILD/llamad-bench" --model "$g" --threads "$THREADS" | tee -a "$log"
done

# ---- llama.cpp on the same files (tests/bench/llamacpp.sh) -----------------
# The tokenizer: llamad-bench --tokenize with the Llama 3 tokenizer.json and
# llama.cpp with the same vocabulary as GGUF (LLAMA3_GGUF, default the one
# from the llama.cpp release), on the corpus of tests/bench/corpus.sh; then
# llama.cpp's prefill/decode on the GGUF files llamad-bench ran above.
# Skipped (one "llama.cpp not available" line) when the npm registry is.
echo "== tokenizer: llamad and llama.cpp, Llama 3 vocabulary, one thread"
corpus=$BUILD/bench-corpus.txt
sh tests/bench/corpus.sh "$corpus" | tee -a "$log"
"$BUILD/llamad-bench" --tokenizer "$MODELS/llama3-tokenizer/tokenizer.json" --tokenize "$corpus" |
    tee -a "$log"
echo "== llama.cpp: the same text and GGUF files"
set -- --text "$corpus" --model "$MODELS/stories260K.gguf"
if [ -n "${LLAMA3_GGUF:-}" ]; then set -- "$@" --tokenizer "$LLAMA3_GGUF"; fi
for t in q8_0 q4_0 q4_k q5_k q6_k; do set -- "$@" --model "$OUT/stories110M-$t.gguf"; done
for g in ${BENCH_GGUF:-}; do set -- "$@" --model "$g"; done
{ BUILD=$BUILD MODELS=$MODELS THREADS=$THREADS sh tests/bench/llamacpp.sh "$@" ||
    echo "llama.cpp bench failed ($?)"; } | tee -a "$log"
"$BUILD/llamad-bench" --model "$MODELS/stories260K.gguf" --threads "$THREADS" --no-bandwidth |
    tee -a "$log"

# ---- decode of the Llama 3.2 1B shape in five formats, against llama.cpp ----
# (tests/bench/decode_table.sh; ~15 minutes on 2 cores, ~5.3 GB of files made
# once; BENCH_DECODE=0 skips it)
if [ "${BENCH_DECODE:-1}" != 0 ]; then
    BUILD=$BUILD MODELS=$MODELS THREADS=$THREADS sh tests/bench/decode_table.sh | tee -a "$log"
fi

# ---- the daemon, seen through its socket -----------------------------------
start_daemon() {  # model-args...
    sock=$BUILD/bench.sock
    "$BUILD/llamad" --state-dir none "$@" --socket "$sock" --threads "$THREADS" --log-level warning &
    dpid=$!
    i=0
    while [ ! -S "$sock" ]; do i=$((i + 1)); [ $i -gt 300 ] && exit 1; sleep 0.1; done
}
stop_daemon() { kill "$dpid"; wait "$dpid" || true; }
D=$BUILD/llamad-bench-daemon
. tests/bench/models.sh
bench_110m_ctx4k   # the 110M shape with a 4096-token context: $ctx4k
echo "== daemon: stories110M shape f16, 20-word turn after 1,500 tokens; fork of 1,000 tokens"
start_daemon --model "$ctx4k" --kv-memory 4G
"$D" "$sock" turn --history 1500 --turn 20 --others 8 | tee -a "$log"
"$D" "$sock" fork --history 1000 | tee -a "$log"
stop_daemon
echo "== daemon: stories15M shape f32, aggregate decode"
start_daemon --model "$OUT/stories15M-f32" --kv-memory 1G
for n in 1 4 16; do "$D" "$sock" aggregate --sessions $n --tokens 128 | tee -a "$log"; done
stop_daemon
echo "== daemon: stories110M shape f16, save and restore a 1,000-token session"
state=$BUILD/bench-state
rm -rf "$state"
start_daemon --model "$ctx4k" --kv-memory 4G --state-dir "$state"
"$D" "$sock" persist-save --history 1000 --turn 32 | tee -a "$log"
stop_daemon
start_daemon --model "$ctx4k" --kv-memory 4G --state-dir "$state"
"$D" "$sock" persist-restore --history 1000 --turn 32 | tee -a "$log"
stop_daemon
rm -rf "$state"
# ---- prefix sharing: 32 sessions, one 1,000-token system prompt -------------
BUILD=$BUILD MODELS=$MODELS THREADS=$THREADS sh tests/bench/prefix.sh | tee -a "$log"
echo "== daemon: stories15M shape f32, 16 sessions round-robin: pool for all / for a quarter"
start_daemon --model "$OUT/stories15M-f32" --kv-memory 64M
"$D" "$sock" churn --sessions 16 --rounds 3 --tokens 16 | sed 's/$/ pool=all/' | tee -a "$log"
stop_daemon
start_daemon --model "$OUT/stories15M-f32" --kv-memory 6M --state-dir "$state"
"$D" "$sock" churn --sessions 16 --rounds 3 --tokens 16 | sed 's/$/ pool=quarter evict=ram/' | tee -a "$log"
stop_daemon
start_daemon --model "$OUT/stories15M-f32" --kv-memory 6M --ram-cache 0 --state-dir "$state"
"$D" "$sock" churn --sessions 16 --rounds 3 --tokens 16 | sed 's/$/ pool=quarter evict=disk/' | tee -a "$log"
stop_daemon
rm -rf "$state"
echo "== daemon: stories260K, one stream through the socket and through llamactl vs one-shot"
start_daemon --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model"
"$D" "$sock" stream --tokens 450 | tee -a "$log"
ctl=$("$BUILD/llamactl" --socket "$sock" -v generate --raw --temperature 0 --max-tokens 450 \
    "Once upon a time" 2>&1 >/dev/null | sed -n 's/.*generated \([0-9]*\) tokens in \([0-9.]*\) ms.*/\1 \2/p')
stop_daemon
oneshot=$("$BUILD/llamad" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
    --threads "$THREADS" --prompt "Once upon a time" --temperature 0 --max-tokens 450 -v 2>&1 >/dev/null |
    sed -n 's/.*generated \([0-9]*\) tokens in \([0-9.]*\) ms.*/\1 \2/p')
# both: decode tok/s of the same 450-token greedy generation, prompt excluded
echo "$oneshot $ctl" | awk '{ os = $1 / ($2 / 1000); ctl = $3 / ($4 / 1000);
    printf "bench=protocol oneshot_tok_s=%.1f llamactl_tok_s=%.1f ratio=%.2f\n", os, ctl, ctl / os }' | tee -a "$log"

# ---- K/V element types: accuracy, memory, speed (tests/bench/kv_types.sh) ---
BUILD=$BUILD MODELS=$MODELS THREADS=$THREADS sh tests/bench/kv_types.sh | tee -a "$log"

# ---- idle connections must not slow the active ones (target: 80%) ----------
echo "== daemon: stories260K, 64 generating connections without / with 1,000 idle ones"
idle_missed=0
BUILD=$BUILD MODELS=$MODELS sh tests/bench/idle.sh | tee -a "$log"
grep -q '^bench=idle_conns .* met$' "$log" || idle_missed=1

# ---- one user's 64 generations against another's one (fair_share) ----------
echo "== daemon: stories260K, root's 32-token generation beside uid 65534's 64, fair_share on / off"
BUILD=$BUILD MODELS=$MODELS THREADS=$THREADS sh tests/bench/fair.sh | tee -a "$log"

# ---- transcripts: a 3,000-turn session, in memory and on disk ---------------
echo "== daemon: llama3-tiny shape, GetTranscript of a 3,000-turn session"
tiny=$OUT/llama3-tiny-f32
[ -f "$tiny/config.json" ] || "$BUILD/llamad-genmodel" --shape llama3-tiny --out "$tiny" \
    --tokenizer "$MODELS/llama3-tokenizer/tokenizer.json" >/dev/null
rm -rf "$state"
start_daemon --model "$tiny" --max-session-tokens 32768 --kv-memory 64M --state-dir "$state"
"$D" "$sock" transcript --turns 3000 | tee -a "$log"
stop_daemon
start_daemon --model "$tiny" --max-session-tokens 32768 --kv-memory 64M --state-dir "$state"
"$D" "$sock" transcript-disk | tee -a "$log"
stop_daemon
rm -rf "$state"

# ---- the CUDA backend, when this machine has a usable GPU -----------------
echo "== CUDA backend (7B shape, random weights; skipped without a GPU)"
rc=0
"$BUILD/llamad-gpucheck" bench >"$BUILD/bench-gpu.log" 2>&1 || rc=$?
if [ "$rc" -eq 77 ]; then
    sed 's/^/  /' "$BUILD/bench-gpu.log"
else
    sed 's/^/gpu /' "$BUILD/bench-gpu.log" | tee -a "$log"
    [ "$rc" -eq 0 ] || { echo "llamad-gpucheck bench failed ($rc)"; exit 1; }
fi

echo
grep '^bench=' "$log"
echo
# two roofs: memory (bw GB/s, the median pass around the decode runs; decode's
# "% roof" is the median of each run against the passes around it) and FMA
# (GFLOP/s of all threads; prefill's share of it for f32/f16/bf16 weights)
printf '%-34s %-5s %12s %12s %9s %10s %7s %8s %7s\n' model dtype "prefill t/s" "decode t/s" "bw GB/s" "roof t/s" "% roof" "FMA GF/s" "pf %FMA"
grep '^model=' "$log" | sed 's/[A-Za-z_]*=/ &/g' | awk '{
    delete v
    for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    n = split(v["model"], parts, "/")
    name = parts[n] (v["impl"] != "" ? " [llama.cpp]" : "")
    printf "%-34s %-5s %12s %12s %9s %10s %7s %8s %7s\n", name, v["dtype"], v["prefill_tok_s"], v["decode_tok_s"], v["bw_GB_s"], v["roof_tok_s"], v["roof_pct"], v["fma_GFLOP_s"], v["prefill_fma_pct"] }'
echo
printf '%-10s %-4s %9s %8s %11s %11s %10s\n' tokenizer kind "text B" tokens "encode MB/s" "decode MB/s" "round trip"
grep '^tokenizer=' "$log" | sed 's/[A-Za-z_]*=/ &/g' | awk '{
    delete v
    for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    printf "%-10s %-4s %9s %8s %11s %11s %10s\n", v["impl"] != "" ? "llama.cpp" : "llamad", v["kind"], v["bytes"], v["tokens"], v["encode_MB_s"], v["decode_MB_s"], v["round_trip"] }'
grep '^llama.cpp not available' "$log" || true
[ "$idle_missed" = 0 ] || { echo "idle connections: the 80% target was missed (bench=idle_conns above)"; exit 1; }
