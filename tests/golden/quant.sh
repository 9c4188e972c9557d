#!/bin/sh
# Quantized stories260K made by llamad-quantize: Q8_0 gives the reference
# greedy text (first golden block); perplexity on a fixed story: Q8_0 within
# 1 % of f32, Q4_0 within 10 % (a 260K-parameter model loses more to 4 bits
# than large ones do); the numbers are printed. Then the K-quants (below).
# Env: BUILD, MODELS, SHARED.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
SHARED=${SHARED:-../shared}
. tests/tools/daemon.sh
test_frame
BIN="--model $MODELS/stories260K.bin --tokenizer $MODELS/tok512.model"

cat > "$dir/story.txt" <<'TXT'
Once upon a time, there was a little boy named Tom. He liked to play with his red ball in the garden. One day, the ball rolled under a big tree. Tom looked and looked, but he could not find it. His sister Sue came to help. She was very kind. They looked together and found the ball near a small flower. Tom was happy. He said, "Thank you, Sue!" They played with the ball all day and had lots of fun.
TXT
for t in q8_0 q4_0; do
    "$BUILD/llamad-quantize" $BIN --type $t --out "$dir/$t.gguf" >"$dir/q.log" 2>&1 ||
        { bad "llamad-quantize --type $t failed"; cat "$dir/q.log"; }
done

awk '/^--- stdout ---$/ { k++; if (k == 1) { on = 1; next } } /^--- end stdout ---$/ { on = 0 } on' \
    "$SHARED/reference/stories260K_greedy.txt" > "$dir/want"
"$BUILD/llamad" --model "$dir/q8_0.gguf" --prompt "Once upon a time" --temperature 0 \
    --max-tokens 60 --echo > "$dir/got" 2>"$dir/err" || bad "llamad on q8_0.gguf: $(cat "$dir/err")"
cmp -s "$dir/want" "$dir/got" && echo "ok   Q8_0 greedy text = golden (60 tokens)" ||
    { bad "Q8_0 greedy text differs"; diff "$dir/want" "$dir/got" | head -4; }
LLAMAD_CPU_EXACT_Q=1 "$BUILD/llamad" --model "$dir/q8_0.gguf" --prompt "Once upon a time" \
    --temperature 0 --max-tokens 60 --echo > "$dir/got" 2>"$dir/err" || bad "llamad on q8_0.gguf: $(cat "$dir/err")"
cmp -s "$dir/want" "$dir/got" && echo "ok   Q8_0 greedy text = golden with LLAMAD_CPU_EXACT_Q=1" ||
    { bad "Q8_0 greedy text differs (exact)"; diff "$dir/want" "$dir/got" | head -4; }
"$BUILD/llamad" --model "$dir/q4_0.gguf" --prompt "Once upon a time" --temperature 0 \
    --max-tokens 30 > "$dir/got4" 2>"$dir/err" && [ -s "$dir/got4" ] || bad "Q4_0 generation"

ppl() { "$BUILD/llamad-bench" "$@" --perplexity "$dir/story.txt" | sed -n 's/.*perplexity=\([0-9.]*\).*/\1/p'; }
p32=$(ppl $BIN); p8=$(ppl --model "$dir/q8_0.gguf"); p4=$(ppl --model "$dir/q4_0.gguf")
p4x=$(LLAMAD_CPU_EXACT_Q=1 ppl --model "$dir/q4_0.gguf")
echo "perplexity on a fixed story: f32 $p32, Q8_0 $p8, Q4_0 $p4 (exact dot products: $p4x)"
awk -v a="$p32" -v b="$p8" 'BEGIN { exit !(a > 1 && b <= a * 1.01 && b >= a * 0.99) }' ||
    bad "Q8_0 perplexity $p8 not within 1 % of f32 $p32"
awk -v a="$p32" -v b="$p4" 'BEGIN { exit !(a > 1 && b <= a * 1.10) }' ||
    bad "Q4_0 perplexity $p4 not within 10 % of f32 $p32"

# K-quants: stories260K's rows (64, 172) are not whole 256-weight
# super-blocks, so a random stories110M-shaped model cut to one layer (dim
# 768, ffn 2048: every matrix K-quantized) stands in. With
# LLAMAD_CPU_EXACT_Q=1 each K-quant GGUF must give exactly the perplexity
# and greedy text of its own weights dequantized to f32 (llamad-quantize
# --type f32 of it): that matmul is the f32 one on the dequantized rows. By
# default (8-bit activations and integer dot products where the CPU has
# AVX512-VNNI or AVX2) the perplexity must be within 1 % of the dequantized copy's.
# A Q4_K tensor whose rows are not whole super-blocks is refused, naming the
# tensor.
MODELS="$MODELS" "$BUILD/llamad-genmodel" --shape stories110M --layers 1 --out "$dir/hf" \
    >/dev/null 2>&1 || bad "llamad-genmodel stories110M failed"
for t in q4_k q5_k q6_k; do
    "$BUILD/llamad-quantize" --model "$dir/hf" --type $t --out "$dir/$t.gguf" >"$dir/q.log" 2>&1 &&
        "$BUILD/llamad-quantize" --model "$dir/$t.gguf" --type f32 --out "$dir/$t.f32.gguf" \
        >"$dir/q.log" 2>&1 || { bad "llamad-quantize --type $t (or back to f32) failed"; cat "$dir/q.log"; continue; }
    pk=$(LLAMAD_CPU_EXACT_Q=1 ppl --model "$dir/$t.gguf"); pf=$(ppl --model "$dir/$t.f32.gguf")
    for f in $t $t.f32; do
        LLAMAD_CPU_EXACT_Q=1 "$BUILD/llamad" --model "$dir/$f.gguf" --prompt "Once upon a time" \
            --temperature 0 --max-tokens 16 > "$dir/g.$f" 2>"$dir/err" ||
            bad "llamad on $f.gguf: $(cat "$dir/err")"
    done
    [ -n "$pk" ] && [ "$pk" = "$pf" ] && cmp -s "$dir/g.$t" "$dir/g.$t.f32" &&
        echo "ok   $t exact: perplexity $pk and greedy text = its dequantized f32 copy" ||
        bad "$t exact: perplexity $pk vs dequantized f32 $pf, or greedy text differs"
    pd=$(ppl --model "$dir/$t.gguf")
    awk -v a="$pf" -v b="$pd" 'BEGIN { exit !(a > 1 && b <= a * 1.01 && b >= a * 0.99) }' &&
        echo "ok   $t default: perplexity $pd within 1 % of the dequantized copy's $pf" ||
        bad "$t default: perplexity $pd not within 1 % of the dequantized copy's $pf"
done
python3 - "$dir/q4_k.gguf" "$dir/bad.gguf" <<'PY' || bad "could not patch q4_k.gguf"
import struct, sys
b = bytearray(open(sys.argv[1], 'rb').read())
i = b.find(b'token_embd.weight') + len('token_embd.weight')
struct.pack_into('<Q', b, i + 4, 704)   # ne[0] after u32 n_dims
open(sys.argv[2], 'wb').write(b)
PY
if "$BUILD/llamad" --model "$dir/bad.gguf" --prompt x --max-tokens 1 >/dev/null 2>"$dir/err"; then
    bad "a Q4_K tensor with 704-weight rows was accepted"
elif grep -q "token_embd.weight.*Q4_K.*704.*multiple of 256" "$dir/err"; then
    echo "ok   Q4_K rows of 704 weights refused, naming the tensor"
else
    bad "Q4_K 704-weight rows: unexpected message: $(cat "$dir/err")"
fi
[ "$fail" -eq 0 ] && echo "quant: all ok"
exit "$fail"
