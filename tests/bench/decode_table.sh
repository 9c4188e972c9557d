#!/bin/sh
# tests/bench/decode_table.sh — decode and prefill of the Llama 3.2 1B shape
# (random weights, the Llama 3 tokenizer) in the formats people download,
# llamad against llama.cpp on the same GGUF files, alternating: the table of
# issue 39 (docs/PERF.md). Run by `make bench`; alone:
#
#   BUILD=build MODELS=../shared/models sh tests/bench/decode_table.sh
#
# Files (made once into $BUILD/bench-models/llama3-1B/, ~5.3 GB):
# llamad-genmodel's f16 folder written as f16.gguf by llamad-quantize (the
# folder is then removed), q8_0, q4_0 and q4_k by llamad-quantize, and
# Q4_K_M by llama.cpp's own quantizer (llama_model_quantize through
# tests/bench/llamacpp.sh --quantize: the mix llama-quantize writes).
#
# Each round runs every format with llamad-bench, then with llama.cpp
# (tests/bench/llamacpp.sh: release v0.5.0, de3ff81), one after the other:
# prefill of 128 tokens on an empty cache, decode of 64 tokens after 128
# (llama-bench -p 128 -n 64 -d 128), f16 K/V on both, $THREADS threads and 1;
# then one round of decode after 4,096 tokens with $THREADS threads. The
# table gives per format and thread count the medians over the rounds of
# llamad's and llama.cpp's tok/s, of their per-round ratio, and of
# llamad-bench's % of the memory roof (its decode against the bandwidth
# probes right before and after it).
#
# The prebuilt library is the release's CPU build for every x86-64 level
# (here libggml-cpu-zen4.so); on f16 weights it is slower than the same
# commit built for this CPU (cmake -DGGML_NATIVE=ON: decode 1.2-1.4 times,
# prefill twice as fast here). LLAMA_BENCH=path/to/llama-bench measures
# such a build instead, with its own llama-bench (-p 128 -n 64 -d D -r 1,
# f16 K/V, its defaults otherwise).
#
# Env: BUILD, MODELS, THREADS (0: all cores), DECODE_ROUNDS (3),
# DECODE_FORMATS ("f16 q8_0 q4_0 q4_k Q4_K_M"), DECODE_DEEP (4096; 0 skips),
# LLAMA_BENCH (unset: the prebuilt library through llamacpp.sh).
set -u
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
THREADS=${THREADS:-0}
ROUNDS=${DECODE_ROUNDS:-3}
FORMATS=${DECODE_FORMATS:-"f16 q8_0 q4_0 q4_k Q4_K_M"}
DEEP=${DECODE_DEEP:-4096}
[ "$THREADS" -gt 0 ] 2>/dev/null || THREADS=$(nproc)
dir=$BUILD/bench-models/llama3-1B
log=$BUILD/bench-decode.log
mkdir -p "$dir" || exit 1
: > "$log"

# ---- the files --------------------------------------------------------------
if [ ! -f "$dir/f16.gguf" ]; then
    echo "== decode table: generating the Llama 3.2 1B shape (f16) into $dir"
    rm -rf "$dir/hf"
    "$BUILD/llamad-genmodel" --shape llama3-1B --dtype f16 --out "$dir/hf" \
        --tokenizer "$MODELS/llama3-tokenizer/tokenizer.json" >/dev/null &&
        "$BUILD/llamad-quantize" --model "$dir/hf" --type f16 --out "$dir/f16.gguf.tmp" >/dev/null &&
        mv "$dir/f16.gguf.tmp" "$dir/f16.gguf" || { echo "decode table: no f16 file"; exit 1; }
    rm -rf "$dir/hf"
fi
have=''
for f in $FORMATS; do
    out=$dir/$f.gguf
    if [ ! -f "$out" ]; then
        echo "== decode table: making $f"
        case $f in
        f16) ;;
        Q*) BUILD=$BUILD THREADS=$THREADS sh tests/bench/llamacpp.sh --quantize "$dir/f16.gguf" \
                "$out.tmp" "$(echo "$f" | tr 'A-Z' 'a-z')" | grep -v '^== llama.cpp' ;;
        *) "$BUILD/llamad-quantize" --model "$dir/f16.gguf" --type "$f" --out "$out.tmp" >/dev/null ;;
        esac
        [ -f "$out.tmp" ] && mv "$out.tmp" "$out"
    fi
    if [ -f "$out" ]; then have="$have $f"; else echo "decode table: no $f file (skipped)"; fi
done

# ---- the runs ---------------------------------------------------------------
run() {  # threads depth round format
    f=$dir/$4.gguf
    "$BUILD/llamad-bench" --model "$f" --threads "$1" --prompt-tokens 128 --decode-tokens 64 \
        --depth "$2" --reps 1 --kv-type f16 | sed "s/\$/ round=$3 fmt=$4/" >> "$log"
    if [ -n "${LLAMA_BENCH:-}" ]; then
        # its CSV: the pp line, then the tg line; avg_ts is the second last
        "$LLAMA_BENCH" -m "$f" -t "$1" -p 128 -n 64 -d "$2" -r 1 -o csv 2>/dev/null |
            tr -d '"' | awk -F, -v t="$1" -v d="$2" -v r="$3" -v fm="$4" '
                NR == 2 { pf = $(NF - 1) } NR == 3 { dec = $(NF - 1) }
                END { if (dec != "") printf "model=%s threads=%s depth=%s prefill_tok_s=%.1f " \
                      "decode_tok_s=%.1f impl=llama-bench round=%s fmt=%s\n", fm, t, d, pf, dec, r, fm }' \
            >> "$log"
        return
    fi
    BUILD=$BUILD MODELS=$MODELS THREADS=$1 REPS=1 sh tests/bench/llamacpp.sh --no-tokenize \
        --depth "$2" --decode-tokens 64 --model "$f" | grep -E '^(model=|llama.cpp not)' |
        sed "/^model=/s/\$/ round=$3 fmt=$4/" >> "$log"
}
tlist=$THREADS
[ "$THREADS" = 1 ] || tlist="$THREADS 1"
for t in $tlist; do
    r=1
    while [ "$r" -le "$ROUNDS" ]; do
        echo "== decode table: $t threads, round $r of $ROUNDS"
        for f in $have; do run "$t" 128 "$r" "$f"; done
        r=$((r + 1))
    done
done
if [ "$DEEP" -gt 0 ]; then
    echo "== decode table: $THREADS threads, decode after $DEEP tokens"
    for f in $have; do run "$THREADS" "$DEEP" 1 "$f"; done
fi

# ---- the table --------------------------------------------------------------
grep -m1 '^llama.cpp not available' "$log"
echo "== Llama 3.2 1B shape: decode of 64 tokens after -d (tok/s), prefill of 128 (tok/s);"
echo "   medians over the rounds; ratio = llamad / llama.cpp v0.5.0 (de3ff81), per round;"
echo "   llama.cpp: ${LLAMA_BENCH:-the prebuilt library (tests/bench/llamacpp.sh)}"
grep '^model=' "$log" | awk '
function med(s,    n, a, i, j, x) {
    n = split(substr(s, 2), a, " ")
    if (n == 0) return ""
    for (i = 2; i <= n; i++) { x = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{
    delete v
    for (i = 1; i <= NF; i++) { k = $i; sub(/=.*/, "", k); x = $i; sub(/^[^=]*=/, "", x); v[k] = x }
    key = v["fmt"] SUBSEP v["threads"] SUBSEP v["depth"]
    rk = key SUBSEP v["round"]
    if (!(key in seen)) { seen[key] = 1; order[++nk] = key }
    if (v["impl"] != "") { cd[rk] = v["decode_tok_s"]; cp[rk] = v["prefill_tok_s"] }
    else { ld[rk] = v["decode_tok_s"]; lp[rk] = v["prefill_tok_s"]; roof[rk] = v["roof_pct"] }
    rounds[rk] = 1
}
END {
    printf "%-7s %7s %5s %10s %10s %7s %7s %10s %10s %7s\n", "format", "threads", "-d", "llamad", "llama.cpp", "ratio", "% roof", "pf llamad", "pf l.cpp", "pf x"
    for (i = 1; i <= nk; i++) {
        key = order[i]; split(key, p, SUBSEP)
        sld = scd = sr = srf = slp = scp = spr = ""
        for (rk in rounds) {
            if (index(rk, key SUBSEP) != 1) continue
            if (rk in ld) { sld = sld " " ld[rk]; srf = srf " " roof[rk]; slp = slp " " lp[rk] }
            if (rk in cd) { scd = scd " " cd[rk]; scp = scp " " cp[rk] }
            if ((rk in ld) && (rk in cd) && cd[rk] > 0) sr = sr " " ld[rk] / cd[rk]
            if ((rk in lp) && (rk in cp) && cp[rk] > 0) spr = spr " " lp[rk] / cp[rk]
        }
        r = med(sr); pr = med(spr)
        printf "%-7s %7s %5s %10s %10s %7s %7s %10s %10s %7s\n", p[1], p[2], p[3], med(sld), med(scd),
            r == "" ? "-" : sprintf("%.2fx", r), med(srf), med(slp), med(scp),
            pr == "" ? "-" : sprintf("%.2fx", pr)
    }
}'
