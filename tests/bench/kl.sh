#!/bin/sh
# tests/bench/kl.sh — issue 29, item 3: for each quantized format, the mean
# KL divergence of next-token distributions and the top-1 agreement against
# the f32 forward pass, on a random-weight model (default: the Llama 3
# 1B shape), for llamad's default path, its exact path
# (LLAMAD_CPU_EXACT_Q=1: weights dequantized inside fp32 dot products;
# LLAMAD_CPU_EXACT_BF16=1: bf16 weights against fp32 activations) and
# llama.cpp (llama-perplexity --kl-divergence), all three on the same GGUF
# files, against the same reference, on the same tokens. Not run by make
# test or make bench (the 1B shape takes a long time on few cores); figures
# to docs/PERF.md by hand.
#
#   OUT=DIR LLAMA_CPP_BIN=DIR [BUILD=build] [MODELS=../shared/models] \
#       sh tests/bench/kl.sh
#
# Into OUT (made if missing; files already there are reused, so a second
# run only measures):
#   l-SHAPE-bf16/        llamad-genmodel --shape SHAPE --dtype bf16
#   l-SHAPE-f16.gguf     llamad-quantize --type f16 of it: llama-quantize's input
#   l-SHAPE-f32.gguf     llamad-quantize --type f32 of it: the reference (the
#                        bf16 values exactly)
#   l-SHAPE-FORMAT.gguf  llama-quantize of the f16 file: BF16 (the same
#                        values as the bf16 folder), Q8_0, Q4_0, Q4_K,
#                        Q5_K and Q6_K with --pure (every matrix in that
#                        type; Q4_K is its type Q4_K_S with --pure, Q5_K
#                        Q5_K_S), Q4_K_M and Q5_K_M as llama.cpp mixes
#                        them (no --pure); file names start with a
#                        letter, as llama-quantize takes an output name
#                        starting with a digit for a thread count
#   corpus.txt           tests/bench/corpus.sh's English text
#   l-SHAPE-f32-cCTX.kld llamad's f32 log-probabilities, llama.cpp's
#                        --kl-divergence-base format (llamad-bench --kl-write)
# Every measurement reads that one reference file: llamad-bench --kl-ref
# FILE and llama-perplexity --kl-divergence-base FILE --kl-divergence, so
# the two engines are scored against the same f32 pass of llamad, on the
# same chunks: CTX tokens each (default 512), the second half of each
# scored (positions CTX/2 .. CTX-2), CHUNKS chunks (default: the fewest
# with 1,000 scored positions, 4 of 512). The file stores each
# log-probability within 1.2e-4; the F32 row (the reference model against
# its own file) shows what that costs (mean KL 1e-6 on stories260K, 3e-8
# on the random stories110M shape), and on llama.cpp's side the distance
# between the two engines' f32 passes (llama.cpp keeps K/V in f16). F16
# is the f16 file itself.
#
# Prints, per format, three lines: "kl format=F engine=llamad path=default
# ...", "... path=exact ..." (not for F32 and F16, whose weights the flag
# does not touch; llamad-bench's figures: kl_mean, kl_se,
# kl_median, kl_p99, kl_max, top1_pct, ppl_ref, ppl_test) and "kl format=F
# engine=llama.cpp ..." (the same keys from llama-perplexity's summary,
# which prints 6 decimals), each with the GGUF's bytes; then a table. All
# lines also go to OUT/kl.txt. A format one engine cannot run gets an
# error= line and the rest go on.
#
# Env: OUT (required), LLAMA_CPP_BIN (required: the folder of llama.cpp's
# llama-quantize and llama-perplexity), BUILD, MODELS, SHAPE (a
# llamad-genmodel shape, default llama3-1B; K-quants need rows of whole
# 256-weight super-blocks), LAYERS (override the shape's layers), THREADS
# (default: all cores), CTX, CHUNKS, FORMATS (default "F32 F16 Q8_0 Q4_0
# Q4_K Q5_K Q6_K Q4_K_M Q5_K_M"), LLAMA_CPP_ARGS (more arguments for
# llama-perplexity, e.g. -ngl 0).
#
# A quick run of the whole script (a minute on 2 cores):
#   OUT=/tmp/kl LLAMA_CPP_BIN=../llama.cpp/build/bin SHAPE=stories110M LAYERS=1 \
#       CTX=256 CHUNKS=2 sh tests/bench/kl.sh
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
OUT=${OUT:?set OUT, the folder for the models and files}
LLAMA_CPP_BIN=${LLAMA_CPP_BIN:?set LLAMA_CPP_BIN, the folder of llama-quantize and llama-perplexity}
SHAPE=${SHAPE:-llama3-1B}
LAYERS=${LAYERS:-}
THREADS=${THREADS:-0}
CTX=${CTX:-512}
CHUNKS=${CHUNKS:-0}
FORMATS=${FORMATS:-F32 F16 BF16 Q8_0 Q4_0 Q4_K Q5_K Q6_K Q4_K_M Q5_K_M}
export MODELS
B=$BUILD/llamad-bench
for f in "$B" "$BUILD/llamad-genmodel" "$BUILD/llamad-quantize" "$LLAMA_CPP_BIN/llama-quantize" \
         "$LLAMA_CPP_BIN/llama-perplexity"; do
    [ -x "$f" ] || { echo "kl.sh: $f is missing" >&2; exit 1; }
done
mkdir -p "$OUT" || exit 1
name=l-$SHAPE${LAYERS:+-$LAYERS}
res=$OUT/kl.txt
: > "$res"
say() { echo "$*" | tee -a "$res"; }
# run CMD...: run it, its output to $OUT/last.log; on failure print that log and exit
run() { "$@" > "$OUT/last.log" 2>&1 || { cat "$OUT/last.log" >&2; echo "kl.sh: failed: $*" >&2; exit 1; }; }

echo "== KL divergence: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
bf=$OUT/$name-bf16
[ -f "$bf/config.json" ] ||
    run "$BUILD/llamad-genmodel" --shape "$SHAPE" ${LAYERS:+--layers "$LAYERS"} --dtype bf16 --out "$bf"
for t in f16 f32; do
    [ -f "$OUT/$name-$t.gguf" ] ||
        run "$BUILD/llamad-quantize" --model "$bf" --type $t --out "$OUT/$name-$t.gguf"
done
text=$OUT/corpus.txt
[ -f "$text" ] || run sh tests/bench/corpus.sh "$text"
ref=$OUT/$name-f32-c$CTX.kld
tflag=
[ "$THREADS" -gt 0 ] && tflag="-t $THREADS"
# the reference, written each run (the chunks asked may have changed)
l=$("$B" --model "$OUT/$name-f32.gguf" --kl-write "$ref" --text "$text" --ctx "$CTX" \
    --chunks "$CHUNKS" --threads "$THREADS") || exit 1
say "$l"

# llama.cpp's summary as one key=value line
llamacpp_line() {
    awk -v fmt="$1" -v model="$2" -v ref="$ref" -v bytes="$3" '
        /^Mean    KLD:/ { km = $3; ks = $5 }
        /^Maximum KLD:/ { kx = $3 }
        /^99.0%   KLD:/ { k99 = $3 }
        /^Median  KLD:/ { kmed = $3 }
        /^Same top p:/ { top = $4 }
        /^Mean PPL\(Q\) / { pt = $4 }
        /^Mean PPL\(base\) / { pr = $4 }
        END {
            if (km == "") { print "kl format=" fmt " engine=llama.cpp model=" model " error=no-summary"; exit }
            printf "kl format=%s engine=llama.cpp model=%s bytes=%s ref=%s kl_mean=%s kl_se=%s " \
                   "kl_median=%s kl_p99=%s kl_max=%s top1_pct=%s ppl_ref=%s ppl_test=%s\n",
                   fmt, model, bytes, ref, km, ks, kmed, k99, kx, top, pr, pt
        }'
}

for fmt in $FORMATS; do
    case $fmt in
    F32) g=$OUT/$name-f32.gguf ;;
    F16) g=$OUT/$name-f16.gguf ;;
    *)
        g=$OUT/$name-$fmt.gguf
        # BF16: llama-quantize's BF16 of the f16 file (the bf16 values again);
        # Q4_K, Q5_K: llama-quantize's Q4_K_S, Q5_K_S with --pure
        case $fmt in Q4_K | Q5_K) qt=${fmt}_S ;; *) qt=$fmt ;; esac
        case $fmt in *_M | BF16) pure= ;; *) pure=--pure ;; esac
        # shellcheck disable=SC2086
        [ -f "$g" ] || "$LLAMA_CPP_BIN/llama-quantize" $pure "$OUT/$name-f16.gguf" "$g" "$qt" \
            > "$OUT/last.log" 2>&1 || { say "kl format=$fmt error=llama-quantize"; cat "$OUT/last.log" >&2;
                                        rm -f "$g"; continue; }
        ;;
    esac
    bytes=$(stat -c %s "$g")
    # exact: LLAMAD_CPU_EXACT_Q (quantized weights) and LLAMAD_CPU_EXACT_BF16
    # (bf16 weights: fp32 activations, not bf16 ones); f32 and f16 weights
    # always take fp32 activations
    paths="default exact"
    case $fmt in F32 | F16) paths=default ;; esac
    for path in $paths; do
        if [ "$path" = exact ]; then x=1; else x=0; fi
        if l=$(LLAMAD_CPU_EXACT_Q=$x LLAMAD_CPU_EXACT_BF16=$x "$B" --model "$g" --kl-ref "$ref" \
               --threads "$THREADS" \
               2>"$OUT/last.log"); then
            say "$(echo "$l" | sed "s/^kl /kl format=$fmt engine=llamad bytes=$bytes /")"
        else
            say "kl format=$fmt engine=llamad path=$path error=$(head -c 200 "$OUT/last.log" | tr -s ' \n' '__')"
        fi
    done
    # shellcheck disable=SC2086
    "$LLAMA_CPP_BIN/llama-perplexity" -m "$g" --kl-divergence-base "$ref" --kl-divergence \
        -c "$CTX" $tflag ${LLAMA_CPP_ARGS:-} > "$OUT/last.log" 2>&1
    say "$(llamacpp_line "$fmt" "$g" "$bytes" < "$OUT/last.log")"
done

# the table: per format, mean KL and top-1 % of each engine
echo
awk '
    function v(k,   i) { for (i = 1; i <= NF; i++) if (index($i, k "=") == 1) return substr($i, length(k) + 2); return "" }
    /^kl format=/ && !/error=/ {
        f = v("format"); if (!(f in seen)) { seen[f] = 1; order[++n] = f }
        mb[f] = sprintf("%.1f", v("bytes") / 1e6)
        e = v("engine") == "llama.cpp" ? "llama.cpp" : v("path")
        cell[f, e] = sprintf("%s / %s", v("kl_mean"), v("top1_pct"))
    }
    END {
        printf "%-8s %9s  %-24s %-24s %-24s\n", "format", "MB", "llamad default", "llamad exact", "llama.cpp"
        printf "%-8s %9s  %-24s %-24s %-24s\n", "", "", "KL / top-1 %", "KL / top-1 %", "KL / top-1 %"
        for (i = 1; i <= n; i++) { f = order[i]
            printf "%-8s %9s  %-24s %-24s %-24s\n", f, mb[f], cell[f, "default"], cell[f, "exact"], cell[f, "llama.cpp"] }
    }' "$res" | tee -a "$res"
