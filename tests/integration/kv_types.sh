#!/bin/sh
# K/V element types across restarts (stories260K): sessions saved by an f32
# daemon (the state files every earlier version wrote) load into an f16
# daemon, converted, and go on generating; saved again they are f16 files,
# about half the bytes of K/V; the same from f16 to q8_0 and from q8_0 back
# to f32. status and show report the type and its bytes. The greedy
# continuation of a converted f16 session equals the f32 daemon's.
# Env: BUILD, MODELS.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh
need_files "$MODELS/stories260K.bin" "$MODELS/tok512.model"
test_frame
CTL=$BUILD/llamactl
SOCK=$dir/s
state=$dir/state

# Prefix sharing off: every state file holds its whole K/V, so that their
# sizes compare the types (shared_blocks.sh tests converted K/V with
# block files; a converted session is saved without them).
start() {  # start TYPE STATE_DIR
    rm -f "$SOCK"
    "$BUILD/llamad" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
        --socket "$SOCK" --state-dir "$2" --kv-type "$1" --threads 1 \
        --prefix-sharing off --log-level info 2>>"$dir/llamad-$1.log" &
    pid=$!
    wait_socket "$SOCK" "$pid" "$dir/llamad-$1.log" 30
}
stop() {
    kill -TERM "$pid" && wait "$pid" || bad "llamad exited with $?"
    pid=
}
gen() {  # gen SESSION TEXT: 40 greedy tokens appended to SESSION
    "$CTL" --socket "$SOCK" generate --session "$1" --raw -n 40 --temperature 0 "$2"
}
fsize() {  # fsize STATE_DIR SESSION: bytes of its state file
    stat -c %s "$1/$(id -u)-$2.session"
}
field() {  # field JSON KEY
    printf '%s\n' "$1" | sed -n "s/.*\"$2\":\"\{0,1\}\([^,\"}]*\).*/\1/p"
}

start f32 "$state"
gen a "Once upon a time" >/dev/null || bad "f32: first generation"
gen b "The little dog" >/dev/null || bad "f32: second session"
st=$("$CTL" --socket "$SOCK" --json status)
[ "$(field "$st" kv_type)" = f32 ] && ok "status: kv_type f32" || bad "status: $st"
stop
cp -r "$state" "$dir/state-f32"

# the f32 daemon's continuation, on a copy of its files
start f32 "$dir/state-f32"
want=$(gen a " and then") || bad "f32: continuation"
stop
s32=$(fsize "$dir/state-f32" a)

start f16 "$state"
got=$(gen a " and then") || bad "f16: continuation of an f32 file"
[ -n "$got" ] && [ "$got" = "$want" ] &&
    ok "an f32 state file loads into an f16 daemon; greedy continuation as f32's" ||
    bad "f16 continuation differs: '$got' vs '$want'"
sh=$("$CTL" --socket "$SOCK" --json show a)
st=$("$CTL" --socket "$SOCK" --json status)
[ "$(field "$st" kv_type)" = f16 ] && ok "status: kv_type f16" || bad "status: $st"
blocks=$(field "$sh" kv_blocks); kvb=$(field "$sh" kv_bytes)
# stories260K: 5 layers x 2 x 16 tokens x kv_dim 32 x 2 bytes = 10,240 a block
[ "$kvb" -eq $((blocks * 10240)) ] && ok "show: $blocks blocks, $kvb bytes of f16" ||
    bad "show: $sh"
gen b " and" >/dev/null || bad "f16: session b"
stop
s16=$(fsize "$state" a)
[ "$s16" -lt $((s32 * 55 / 100)) ] && ok "the same session saved in f16: $s16 bytes, in f32 $s32" ||
    bad "f16 state file $s16 bytes, f32's $s32"

start q8_0 "$state"
gen a " So" >/dev/null && ok "an f16 state file loads into a q8_0 daemon and generates" ||
    bad "q8_0: continuation of an f16 file"
gen b " So" >/dev/null || bad "q8_0: session b"
sh=$("$CTL" --socket "$SOCK" --json show a)
blocks=$(field "$sh" kv_blocks); kvb=$(field "$sh" kv_bytes)
# q8_0 at head_dim 8: 5 x 2 x (16 x 32 codes + 16 x 4 scales x 2 bytes) = 6,400
[ "$kvb" -eq $((blocks * 6400)) ] && ok "show: $blocks blocks, $kvb bytes of q8_0" ||
    bad "show: $sh"
st=$("$CTL" --socket "$SOCK" --json status)
[ "$(field "$st" kv_type)" = q8_0 ] && ok "status: kv_type q8_0" || bad "status: $st"
stop

start f32 "$state"
gen a " The end" >/dev/null && gen b " The end" >/dev/null &&
    ok "q8_0 state files load back into an f32 daemon" || bad "f32: after q8_0"
grep -i "refus\|corrupt\|error" "$dir"/llamad-*.log && bad "errors in the logs"
stop
[ "$fail" -eq 0 ] && echo "PASS kv_types"
exit "$fail"
