#!/bin/sh
# tests/golden/stories260K.sh — greedy generations of stories260K, byte for
# byte against llama2.c run.c's output ($SHARED/reference/stories260K_greedy.txt).
#
# run.c's -n counts every position, BOS and the 4 prompt tokens included:
# block 1 (-n 64) is 60 generated tokens, block 2 (default -n 256) is 252.
# Each block is checked from the llama2.c .bin (with --tokenizer tok512.model)
# and from the Hugging Face folder (its own tokenizer.model): 4 runs.
# Env: BUILD (build folder), MODELS, SHARED, LLAMAD_FLAGS (extra llamad flags,
# e.g. --device cuda).
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
SHARED=${SHARED:-../shared}
REF=$SHARED/reference/stories260K_greedy.txt
LLAMAD=$BUILD/llamad

. tests/tools/daemon.sh
need_files "$LLAMAD" "$REF" "$MODELS/stories260K.bin" "$MODELS/tok512.model" \
     "$MODELS/stories260K-hf/config.json"
test_frame

# Block k (1-based) of the reference: the lines between '--- stdout ---'
# and '--- end stdout ---'. run.c ends its output with a newline, as llamad.
block() {
    awk -v want="$1" '
        $0 == "--- stdout ---" { n++; inside = (n == want); next }
        $0 == "--- end stdout ---" { inside = 0; next }
        inside { print }' "$REF"
}

fail=0
for k in 1 2; do
    block "$k" >"$dir/ref$k"
    [ -s "$dir/ref$k" ] || { echo "no block $k in $REF"; exit 1; }
done

check() {  # name ntokens block model-args...
    name=$1 n=$2 k=$3
    shift 3
    # shellcheck disable=SC2086
    "$LLAMAD" "$@" $LLAMAD_FLAGS --prompt "Once upon a time" --temperature 0 --max-tokens "$n" \
        --echo >"$dir/out" 2>"$dir/err"
    rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "FAIL $name: llamad exited $rc"; cat "$dir/err"; fail=1; return
    fi
    if cmp -s "$dir/ref$k" "$dir/out"; then
        echo "ok   $name ($n tokens, $(wc -c <"$dir/out") bytes)"
    else
        echo "FAIL $name: output differs from block $k of $REF"
        diff -u "$dir/ref$k" "$dir/out" | head -40
        fail=1
    fi
}

check "bin -n 60"  60  1 --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model"
check "bin -n 252" 252 2 --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model"
check "hf -n 60"   60  1 --model "$MODELS/stories260K-hf"
check "hf -n 252"  252 2 --model "$MODELS/stories260K-hf"
exit $fail
