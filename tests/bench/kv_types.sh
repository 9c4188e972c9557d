#!/bin/sh
# tests/bench/kv_types.sh — what each K/V element type (f32, f16, q8_0)
# costs and gives, in one run (make bench; figures to docs/PERF.md by hand):
#   - accuracy against f32: llamad-kvq on stories260K (4 windows of 512
#     sampled tokens, greedy 256) and on the random Llama 3.2-1B shape (one
#     window of 256, greedy 64: its flat distributions make ties common);
#   - memory: bytes a token, 2,000-token sessions a GiB of KV (1B shape);
#   - speed on the 1B shape with q8_0 weights: decode at 1,500 tokens of
#     context (llamad-bench), the turn benchmark (20 words after 1,500
#     tokens against the same turn on an empty session), and a 1,000-token
#     session saved, then restored + a turn after a restart (file bytes a
#     token, restore + turn against re-prefilling), beside llama.cpp's
#     llama-server slot file of a 1,000-token prompt (tests/bench/llamacpp.sh).
# Env: BUILD, MODELS, THREADS (default all cores), KVB_SKIP_1B=1 (only the
# stories260K accuracy line; no 1B shape is generated).
set -e
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
THREADS=${THREADS:-0}
OUT=$BUILD/bench-models
mkdir -p "$OUT"
echo "== K/V types: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
"$BUILD/llamad-kvq" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
    --threads "$THREADS"
[ -n "${KVB_SKIP_1B:-}" ] && exit 0

g=$OUT/llama3-1B-q8_0.gguf
if [ ! -f "$g" ]; then
    [ -f "$OUT/llama3-1B-bf16/config.json" ] ||
        "$BUILD/llamad-genmodel" --shape llama3-1B --dtype bf16 --out "$OUT/llama3-1B-bf16" >/dev/null
    "$BUILD/llamad-quantize" --model "$OUT/llama3-1B-bf16" --type q8_0 --out "$g" >/dev/null
fi
"$BUILD/llamad-kvq" --model "$g" --threads "$THREADS" --windows 1 --window 256 --greedy 64
# llama.cpp's slot file (llama-server /slots?action=save) of a 1,000-token
# prompt of the same file, K/V in its default f16 (skipped without llama.cpp)
PROMPT_TOKENS=1000 REPS=1 BUILD=$BUILD THREADS=$THREADS sh tests/bench/llamacpp.sh --no-tokenize \
    --model "$g" | grep 'slot_file_bytes\|not available' || true

sock=$BUILD/bench-kv.sock
state=$BUILD/bench-kv-state
D=$BUILD/llamad-bench-daemon
start() {  # start TYPE
    rm -f "$sock"
    "$BUILD/llamad" --model "$g" --kv-type "$1" --kv-memory 3G --state-dir "$state" \
        --socket "$sock" --threads "$THREADS" --log-level warning &
    dpid=$!
    i=0
    while [ ! -S "$sock" ]; do i=$((i + 1)); [ $i -gt 600 ] && exit 1; sleep 0.1; done
}
stop() { kill "$dpid"; wait "$dpid" || true; }
for t in f32 f16 q8_0; do
    "$BUILD/llamad-bench" --model "$g" --threads "$THREADS" --prompt-tokens 1500 \
        --decode-tokens 32 --reps 1 --no-bandwidth --kv-type "$t"
    rm -rf "$state"
    start "$t"
    st=$("$BUILD/llamactl" --socket "$sock" --json status)
    echo "$st" | sed 's/.*"kv_blocks_total":\([0-9]*\).*"kv_block_tokens":\([0-9]*\),"kv_bytes_total":\([0-9]*\).*/\1 \2 \3/' |
        awk -v t="$t" '{ tok = $3 / ($1 * $2); s = 2000 / $2; s = (s == int(s) ? s : int(s) + 1) * $2;
            printf "bench=kv_memory kv=%s bytes_per_token=%.0f sessions_2000_per_gib=%.2f\n",
                   t, tok, 1073741824 / (s * tok) }'
    "$D" "$sock" turn --history 1500 --turn 20 --others 0 | sed "s/\$/ kv=$t/"
    "$D" "$sock" persist-save --history 1000 --turn 32 | sed "s/\$/ kv=$t/"
    stop
    start "$t"
    "$D" "$sock" persist-restore --history 1000 --turn 32 | sed "s/\$/ kv=$t/"
    stop
done
rm -rf "$state" "$sock"
