#!/bin/sh
# tests/bench/ab.sh OLD NEW — the speed of two builds, alternated in one run
# on one machine: is a change that should not touch speed (a refactoring)
# within the run's own spread? OLD and NEW are build folders (each with
# llamad-bench, llamad, llamad-bench-daemon, llamad-genmodel,
# llamad-quantize). Each of ROUNDS rounds runs every measure with both,
# in the order OLD NEW on odd rounds and NEW OLD on even ones:
#   engine  llamad-bench prefill and decode tok/s on stories260K (f32),
#           the stories15M shape (f32, random weights) and its q4_0 GGUF;
#   text    llamad-bench --tokenize, the Llama 3 tokenizer over
#           tests/bench/corpus.sh's text (MB/s);
#   daemon  llamad-bench-daemon stream: 450 greedy tokens of stories260K
#           through the socket (tok/s).
# Then per figure: each build's median and range over the rounds, and
# NEW/OLD of the medians; "within" when NEW's median lies inside OLD's
# range or the ratio is within 2 %. On a shared machine the ranges are
# wide (+-20 %), so last it counts instructions, which do not move from
# run to run (valgrind's callgrind, one thread): a one-shot greedy
# generation of 64 tokens on stories260K (the forward passes, sampling,
# detokenizing and stop strings apart: --toggle-collect) and the Llama 3
# tokenizer's encode and decode of 30 KB of the corpus.
# Env: ROUNDS (5), THREADS (0: all cores), MODELS (../shared/models),
# WORK (a folder for the models it makes; $NEW/ab), CALLGRIND (1; 0: skip).
set -e
OLD=${1:?usage: tests/bench/ab.sh OLD_BUILD NEW_BUILD}
NEW=${2:?usage: tests/bench/ab.sh OLD_BUILD NEW_BUILD}
ROUNDS=${ROUNDS:-5}
THREADS=${THREADS:-0}
MODELS=${MODELS:-../shared/models}
WORK=${WORK:-$NEW/ab}
mkdir -p "$WORK"
s15=$WORK/stories15M-f32
[ -f "$s15/config.json" ] || "$NEW/llamad-genmodel" --shape stories15M --out "$s15" \
    --tokenizer "$MODELS/tokenizer.model" >/dev/null
q15=$WORK/stories15M-q4_0.gguf
[ -f "$q15" ] || "$NEW/llamad-quantize" --model "$s15" --type q4_0 --out "$q15" >/dev/null
corpus=$WORK/corpus.txt
[ -f "$corpus" ] || sh tests/bench/corpus.sh "$corpus" >/dev/null
out=$WORK/figures
: > "$out"

# fig BUILD NAME KEY LINE: append "NAME BUILD value" for key=value in LINE
fig() {
    v=$(echo "$4" | tr ' ' '\n' | sed -n "s/^$3=//p" | head -1)
    [ -n "$v" ] && echo "$2 $1 $v" >> "$out"
}
measure() {  # BUILD LABEL
    b=$1; l=$2
    for m in "$MODELS/stories260K.bin --tokenizer $MODELS/tok512.model" "$s15" "$q15"; do
        # shellcheck disable=SC2086
        line=$("$b/llamad-bench" --model $m --threads "$THREADS" --no-bandwidth --reps 5 | tail -1)
        name=$(basename "${m%% *}")
        fig "$l" "prefill:$name" prefill_tok_s "$line"
        fig "$l" "decode:$name" decode_tok_s "$line"
    done
    line=$("$b/llamad-bench" --tokenizer "$MODELS/llama3-tokenizer/tokenizer.json" \
        --tokenize "$corpus" --reps 5 | tail -1)
    fig "$l" "tokenize:llama3" encode_MB_s "$line"
    sock=$WORK/ab.sock
    rm -f "$sock"
    "$b/llamad" --state-dir none --model "$MODELS/stories260K.bin" \
        --tokenizer "$MODELS/tok512.model" --socket "$sock" --threads "$THREADS" \
        --log-level warning &
    pid=$!
    i=0
    while [ ! -S "$sock" ]; do i=$((i + 1)); [ $i -gt 300 ] && exit 1; sleep 0.1; done
    line=$("$b/llamad-bench-daemon" "$sock" stream --tokens 450 | tail -1)
    kill "$pid"; wait "$pid" || true
    fig "$l" "stream:stories260K" tok_s "$line"
}
r=1
while [ "$r" -le "$ROUNDS" ]; do
    echo "== round $r of $ROUNDS"
    if [ $((r % 2)) -eq 1 ]; then measure "$OLD" old; measure "$NEW" new
    else measure "$NEW" new; measure "$OLD" old; fi
    r=$((r + 1))
done
echo "== $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
sort -k1,1 -k2,2 -s "$out" | awk '
function med(a, n,  i, j, t) {
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function flush(  mo, mn, lo, hi, i, verdict) {
    if (cur == "") return
    mo = med(o, no); mn = med(nw, nn)
    lo = o[1]; hi = o[no]
    verdict = (mn >= lo && mn <= hi) || (mn / mo > 0.98 && mn / mo < 1.02) ? "within" : "OUTSIDE"
    printf "%-24s old %10.1f [%.1f..%.1f]  new %10.1f [%.1f..%.1f]  new/old %.3f  %s\n",
        cur, mo, lo, hi, mn, nw[1], nw[nn], mn / mo, verdict
}
$1 != cur { flush(); cur = $1; no = nn = 0 }
$2 == "old" { o[++no] = $3 }
$2 == "new" { nw[++nn] = $3 }
END { flush() }'

[ "${CALLGRIND:-1}" = 0 ] && exit 0
command -v valgrind >/dev/null || { echo "(no valgrind: instruction counts skipped)"; exit 0; }
# instr BUILD FUNCTION CMD...: instructions executed inside FUNCTION ('' : all)
instr() {
    b=$1; f=$2; shift 2
    valgrind --tool=callgrind --callgrind-out-file=/dev/null ${f:+--toggle-collect=$f} \
        "$b/$@" 2>&1 | sed -n 's/.*Collected : *//p'
}
head -c 30000 "$corpus" > "$WORK/corpus30k.txt"
echo "== instructions (callgrind), old new new/old"
for f in fwd_run gen_sample gen_accept ''; do
    set -- llamad --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
        --prompt "Once upon a time" -n 64 --temperature 0 --threads 1 --device cpu
    o=$(instr "$OLD" "$f" "$@"); n=$(instr "$NEW" "$f" "$@")
    echo "oneshot:${f:-all} $o $n" | awk '{ printf "%-24s %14d %14d  %.4f\n", $1, $2, $3, $3 / $2 }'
done
for f in bpe_encode tok_decode; do
    set -- llamad-bench --tokenizer "$MODELS/llama3-tokenizer/tokenizer.json" \
        --tokenize "$WORK/corpus30k.txt" --reps 1
    o=$(instr "$OLD" "$f" "$@"); n=$(instr "$NEW" "$f" "$@")
    echo "tokenize:$f $o $n" | awk '{ printf "%-24s %14d %14d  %.4f\n", $1, $2, $3, $3 / $2 }'
done
