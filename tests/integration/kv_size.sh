#!/bin/sh
# tests/integration/kv_size.sh — the KV pool's size, said at start-up. The
# default (kv_memory auto) takes 4 contexts of the model, at least 256 MiB,
# at most a quarter of the available memory (LLAMAD_TEST_MEM_AVAILABLE
# stands for the machine's figure, so the lines do not depend on it); the
# info line says the pool in bytes, tokens, blocks and contexts, and a pool
# under one context is a warning (before: 256 MiB whatever the model, and a
# stories110M-shaped daemon with --kv-memory 16M held 224 of its 1024
# tokens without a word). llamactl status says the same. The larger
# context is a one-layer stories110M shape (6 KiB of K/V a token, 1024
# tokens in f32) from llamad-genmodel. The daemons run with f32 K/V (the
# figures below are f32's) but for one in the default f16, which holds
# twice the tokens in the same bytes.
# Env: BUILD, MODELS.
# shellcheck disable=SC2086  # $S260, $S110: the words of the model options
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh
need_files "$BUILD/llamad-genmodel" "$MODELS/tokenizer.model"
llamactl_frame
S260="--model $MODELS/stories260K.bin --tokenizer $MODELS/tok512.model"
"$BUILD/llamad-genmodel" --shape stories110M --layers 1 --dtype f16 --out "$dir/s110" \
    --tokenizer "$MODELS/tokenizer.model" >"$dir/gen.log" 2>&1 || { cat "$dir/gen.log"; exit 1; }
S110="--model $dir/s110"

# run NAME ARGS...: start llamad with ARGS (and a socket, no state), wait
# until it listens, keep `llamactl status` in $dir/NAME.status, stop it;
# its log in $dir/NAME.log
run() {
    name=$1; shift
    # shellcheck disable=SC2068  # the words of the options
    "$BUILD/llamad" --kv-type f32 $@ --socket "$dir/s" --state-dir none --threads 1 \
        2>"$dir/$name.log" &
    pid=$!
    wait_socket "$dir/s" "$pid" "$dir/$name.log" 60
    "$CTL" --socket "$dir/s" status >"$dir/$name.status" 2>&1 || bad "$name: status failed"
    kill "$pid"; wait "$pid"; pid=
}
# has NAME TEXT: NAME's log holds TEXT (fixed string)
has() { grep -qF -- "$2" "$dir/$1.log"; }

export LLAMAD_TEST_MEM_AVAILABLE=8589934592   # 8 GiB: a quarter is 2 GiB
run small $S260
if has small "info: KV cache: 256 MiB, 209712 tokens (13107 blocks of 16), 409.6 contexts of 512 tokens (kv_memory auto: 4 contexts, at least 256 MiB, at most 1/4 of the 8 GiB available)" &&
   ! has small "warning"; then
    ok "stories260K, auto: 256 MiB (4 contexts are 2.5 MiB), in tokens and contexts"
else bad "stories260K auto: $(cat "$dir/small.log")"; fi
grep -q "kv cache: .*: 209712 tokens, 409.6 contexts$" "$dir/small.status" &&
    ok "llamactl status: tokens and contexts" || bad "status: $(cat "$dir/small.status")"

run s110 $S110 --max-session-tokens 200
has s110 "256 MiB, 43680 tokens (2730 blocks of 16), 218.4 contexts of 200 tokens" &&
    ok "contexts of max_session_tokens" || bad "s110 max_session_tokens: $(cat "$dir/s110.log")"

# a machine with little memory: a quarter of 2 MB is 24 blocks of
# stories260K, 384 tokens, under a context
LLAMAD_TEST_MEM_AVAILABLE=2000000 run tiny $S260
if has tiny "KV cache: 480 KiB, 384 tokens (24 blocks of 16), 0.8 contexts of 512 tokens" &&
   has tiny "warning: KV cache: it holds 384 tokens, less than one context of 512: a session fails with \"the KV cache is full\" after about 384 tokens; set kv_memory (one context takes 640 KiB; auto takes at most 1/4 of the memory) or lower max_session_tokens"; then
    ok "auto cut to a quarter of 2 MB: under one context, warned"
else bad "tiny: $(cat "$dir/tiny.log")"; fi
grep -q "kv cache: .*: 384 tokens, 0.8 contexts (less than one)$" "$dir/tiny.status" &&
    ok "llamactl status: less than one context" || bad "status: $(cat "$dir/tiny.status")"

# an explicit size stays as given, and is warned about under one context
run k4 $S110 --kv-memory 4M
if has k4 "KV cache: 3.9 MiB, 672 tokens (42 blocks of 16), 0.7 contexts of 1024 tokens (kv_memory 4 MiB)" &&
   has k4 "warning: KV cache: it holds 672 tokens, less than one context of 1024" &&
   has k4 "raise kv_memory (one context takes 6 MiB) or lower max_session_tokens"; then
    ok "kv_memory 4M on a 1024-token context: 672 tokens, warned"
else bad "k4: $(cat "$dir/k4.log")"; fi
run k16 $S110 --kv-memory 16M
if has k16 "KV cache: 15.9 MiB, 2720 tokens (170 blocks of 16), 2.7 contexts of 1024 tokens (kv_memory 16 MiB)" &&
   ! has k16 "warning"; then
    ok "kv_memory 16M: 2.7 contexts, no warning"
else bad "k16: $(cat "$dir/k16.log")"; fi
run k16h $S110 --kv-memory 16M --kv-type f16
has k16h "KV cache: 16.0 MiB, 5456 tokens (341 blocks of 16), 5.3 contexts of 1024 tokens" &&
    ok "kv_memory 16M in f16 K/V: twice the tokens" || bad "k16h: $(cat "$dir/k16h.log")"

# --print-config says auto; "auto" is a value of its own
"$BUILD/llamad" $S260 --print-config 2>&1 | grep -qx "kv_memory = auto" &&
    ok "--print-config: kv_memory = auto" || bad "--print-config lacks kv_memory = auto"
"$BUILD/llamad" $S260 --kv-memory 1G --kv-memory auto --print-config 2>&1 | grep -qx "kv_memory = auto" &&
    ok "--kv-memory auto" || bad "--kv-memory auto not taken"
[ "$fail" -eq 0 ] && echo "PASS kv_size" || exit 1
