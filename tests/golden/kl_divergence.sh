#!/bin/sh
# llamad-bench --kl-ref and --kl-write (tests/bench/kl.c) on stories260K,
# chunks of 256 tokens of five short stories (3 chunks, 381 scored
# positions):
#   - f32 against itself: KL exactly 0, top-1 100 %, equal perplexities
#     (4.2099 when written; between 3 and 6);
#   - Q8_0 (llamad-quantize) against f32, default and exact paths: KL
#     above 0 and below 0.01 (0.0008 when written), top-1 >= 95 %,
#     perplexity within 1 %;
#   - the logits file of --kl-write, read by python3 alone: header
#     (magic, n_ctx, n_vocab, n_chunk), size, tokens (BOS first, in the
#     vocabulary), each record (scale in (0, 16/65535], its top at 65535,
#     the decoded probabilities summing to 1) and the perplexity decoded
#     from the records at the next tokens, against the writer's;
#   - the file read back (--kl-ref FILE) by the model that wrote it: KL
#     within 1e-5 of 0, top-1 100 %, no log-probability off by more than
#     the format's half step (16/65535/2, + fp32 rounding); Q8_0 against
#     the file within 2 % of Q8_0 against the model; a truncated file is
#     refused.
# Not here (CI has no llama.cpp build), checked by hand when kl.c changes
# (docs/PERF.md, "KL divergence"; KEEP=1 keeps $dir, with f32.kld and
# story.txt): llama.cpp's llama-perplexity reads the file, e.g.
#   llama-perplexity -m stories260K.gguf --kl-divergence-base $dir/f32.kld \
#       --kl-divergence -c 256 -t 1
# gives "Mean KLD: 0.000002" and "Same top p: 100.000 %", and a file it
# writes (the same command with -f story.txt and without --kl-divergence)
# holds the same header and tokens as --kl-write's.
# Env: BUILD, MODELS.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh
need_files "$BUILD/llamad-bench" "$BUILD/llamad-quantize" "$MODELS/stories260K.gguf" \
    "$MODELS/stories260K.bin" "$MODELS/tok512.model"
test_frame
B=$BUILD/llamad-bench
F32=$MODELS/stories260K.gguf
cat > "$dir/story.txt" <<'TXT'
Once upon a time, there was a little boy named Tom. He liked to play with his red ball in the garden. One day, the ball rolled under a big tree. Tom looked and looked, but he could not find it. His sister Sue came to help. She was very kind. They looked together and found the ball near a small flower. Tom was happy. He said, "Thank you, Sue!" They played with the ball all day and had lots of fun.
Lily had a little cat named Mittens. Mittens was soft and white, and she liked to sleep in the sun. One morning, Lily could not find Mittens anywhere. She looked under the bed and behind the door. Then she heard a small sound from the kitchen. Mittens was inside a box of toys! Lily laughed and gave her a big hug. "You are a silly cat," she said. Mittens purred and went back to sleep.
Ben and Mia went to the park with their mom. The sun was warm and the sky was blue. Ben wanted to go on the swing, and Mia wanted to slide. They took turns and shared. Then they saw a dog with a long tail. The dog ran to them and wagged its tail. Mom said they could pet the dog. The dog was friendly and licked Ben's hand. Ben and Mia smiled. It was a good day at the park.
There was a big bear who lived in the woods. The bear was hungry and wanted some honey. He walked to a tall tree where the bees lived. The bees were busy and did not want to share. The bear said, "Please, can I have a little honey?" The bees thought about it and said yes. The bear was very happy. He said thank you and went home to eat his honey with his friend the bird.
Anna had a new red dress. She wanted to show it to her friend Jack. She ran to his house, but it started to rain. Anna was sad because her dress got wet. Jack gave her a towel and a cup of warm milk. They sat by the window and watched the rain. Soon the sun came out again, and they saw a big rainbow in the sky. Anna forgot about her dress and laughed with Jack.
TXT
# kl ARGS...: llamad-bench ARGS over the stories, chunks of 256 tokens
kl() { "$B" "$@" --text "$dir/story.txt" --ctx 256 --threads 1; }
# val LINE KEY: the value of KEY= in a key=value line
val() { echo "$1" | sed -n "s/.* $2=\([^ ]*\).*/\1/p"; }
# check NAME LINE AWK-CONDITION (over k, t, m, r, p, d: kl_mean, top1_pct,
# kl_max, ppl_ref, ppl_test, dlogp_max; q: positions)
check() {
    k=$(val "$2" kl_mean); t=$(val "$2" top1_pct); m=$(val "$2" kl_max)
    r=$(val "$2" ppl_ref); p=$(val "$2" ppl_test); d=$(val "$2" dlogp_max); q=$(val "$2" positions)
    if [ -n "$k" ] && awk -v k="$k" -v t="$t" -v m="$m" -v r="$r" -v p="$p" -v d="$d" -v q="$q" \
        "BEGIN { exit !($3) }"; then
        ok "$1: kl_mean=$k kl_max=$m top1_pct=$t ppl_ref=$r ppl_test=$p dlogp_max=$d"
    else
        bad "$1: not ($3): $2"
    fi
}

l=$(kl --model "$F32" --kl-ref "$F32") || bad "--kl-ref f32 itself failed"
check "f32 against itself" "$l" 'q == 381 && r > 3 && r < 6 && k == 0 && m == 0 && t == 100 && r == p && d == 0'

"$BUILD/llamad-quantize" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
    --type q8_0 --out "$dir/q8_0.gguf" >"$dir/q.log" 2>&1 || { bad "llamad-quantize failed"; cat "$dir/q.log"; }
l8=$(kl --model "$dir/q8_0.gguf" --kl-ref "$F32") || bad "--kl-ref q8_0 failed"
check "Q8_0 against f32" "$l8" \
    'k > 0 && k < 0.01 && t >= 95 && p > r * 0.99 && p < r * 1.01'
l=$(LLAMAD_CPU_EXACT_Q=1 kl --model "$dir/q8_0.gguf" --kl-ref "$F32") || bad "--kl-ref q8_0 exact failed"
case $l in *" path=exact "*) ;; *) bad "LLAMAD_CPU_EXACT_Q=1 not said: $l" ;; esac
check "Q8_0 against f32, exact path" "$l" 'k > 0 && k < 0.01 && t >= 95 && p > r * 0.99 && p < r * 1.01'

w=$(kl --model "$F32" --kl-write "$dir/f32.kld") || bad "--kl-write failed"
echo "$w"
if python3 - "$dir/f32.kld" "$(val "$w" ppl)" > "$dir/py.log" 2>&1 <<'PY'
import math, struct, sys
b = open(sys.argv[1], 'rb').read()
assert b[:8] == b'_logits_', b[:8]
ctx, vocab, chunks = struct.unpack_from('<Iii', b, 8)
assert (ctx, vocab, chunks) == (256, 512, 3), (ctx, vocab, chunks)
first = ctx // 2
scored = ctx - 1 - first
nv = 2 * ((vocab + 1) // 2) + 4
toks = struct.unpack_from('<%di' % (ctx * chunks), b, 20)
size = 20 + 4 * ctx * chunks + chunks * scored * nv * 2
assert len(b) == size, (len(b), size)
assert toks[0] == 1 and all(0 <= t < vocab for t in toks), 'tokens'
off = 20 + 4 * ctx * chunks
nll = 0.0
for c in range(chunks):
    for j in range(first, ctx - 1):
        scale, min_lp = struct.unpack_from('<ff', b, off)
        q = struct.unpack_from('<%dH' % vocab, b, off + 8)
        assert 0 < scale <= 16 / 65535 * 1.000001 and min_lp < 0, (scale, min_lp)
        assert max(q) == 65535, max(q)
        s = sum(math.exp(scale * x + min_lp) for x in q if x)
        assert abs(s - 1) < 1e-3, s
        nll -= scale * q[toks[c * ctx + j + 1]] + min_lp
        off += nv * 2
ppl = math.exp(nll / (chunks * scored))
assert abs(ppl / float(sys.argv[2]) - 1) < 1e-3, (ppl, sys.argv[2])
print('file: %d bytes, n_ctx %d, n_vocab %d, n_chunk %d, decoded perplexity %.4f' %
      (len(b), ctx, vocab, chunks, ppl))
PY
then ok "the logits file (python3): $(cat "$dir/py.log")"
else bad "the logits file (python3): $(cat "$dir/py.log")"
fi

l=$("$B" --model "$F32" --kl-ref "$dir/f32.kld" --threads 1) || bad "--kl-ref FILE failed"
check "f32 against its own file" "$l" \
    'q == 381 && k < 1e-5 && k > -1e-5 && t == 100 && d > 0 && d <= 1.25e-4 && p > r * 0.999 && p < r * 1.001'
l=$("$B" --model "$dir/q8_0.gguf" --kl-ref "$dir/f32.kld" --threads 1) || bad "--kl-ref q8_0 FILE failed"
k8=$(val "$l8" kl_mean)
check "Q8_0 against the file" "$l" "k > $k8 * 0.98 && k < $k8 * 1.02"
head -c 396282 "$dir/f32.kld" > "$dir/short.kld"
if "$B" --model "$F32" --kl-ref "$dir/short.kld" >/dev/null 2>"$dir/err"; then
    bad "a truncated logits file was read"
elif grep -q "396282 bytes, not the 396284" "$dir/err"; then
    ok "a truncated logits file is refused: $(cat "$dir/err")"
else
    bad "truncated logits file: unexpected message: $(cat "$dir/err")"
fi
[ "$fail" -eq 0 ] && echo "kl_divergence: all ok"
exit "$fail"
