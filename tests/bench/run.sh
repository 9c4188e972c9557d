#!/bin/sh
# make bench: engine speed on the tiny real model and on random-weight models
# of realistic shapes (generated once into $BUILD/bench-models). Prints one
# key=value line per model, then a table. Figures go to docs/PERF.md by hand.
# Env: BUILD, MODELS, THREADS (default: all cores), BENCH_SHAPES to override
# the list ("shape:dtype ...").
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

echo
printf '%-22s %-5s %12s %12s %9s %10s %7s\n' model dtype "prefill t/s" "decode t/s" "bw GB/s" "roof t/s" "% roof"
sed 's/[a-z_]*=/ &/g' "$log" | awk '{
    for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    n = split(v["model"], parts, "/")
    printf "%-22s %-5s %12s %12s %9s %10s %7s\n", parts[n], v["dtype"], v["prefill_tok_s"], v["decode_tok_s"], v["bw_GB_s"], v["roof_tok_s"], v["roof_pct"] }'
