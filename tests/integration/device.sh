#!/bin/sh
# --device: `cuda` without a usable GPU is a start-up error that says why
# (one-shot and daemon: exit 1 before listening, no text, no socket);
# `auto` then runs on the CPU, saying why in the log, and `llamactl status`
# names the backend in use; `cpu` never tries CUDA. Where a GPU is usable
# the same script expects `cuda` and `auto` to take it.
# Env: BUILD, MODELS (paths without spaces).
# shellcheck disable=SC2086
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh
test_frame
# llamad on the tiny model; a plain command, so that with & $! is llamad's pid
LLAMAD="$BUILD/llamad --model $MODELS/stories260K.bin --tokenizer $MODELS/tok512.model"

# one-shot: is a GPU usable here? if not, the error must say why
$LLAMAD --device cuda --prompt "Once" --max-tokens 2 >"$dir/out" 2>"$dir/err"; rc=$?
if [ "$rc" -eq 0 ]; then
    gpu=1
    echo "ok   --device cuda: a GPU is usable here"
else
    gpu=0
    [ "$rc" -eq 1 ] || bad "--device cuda without a GPU exited $rc, expected 1"
    grep -qE '^llamad: --device cuda: (no usable CUDA device \(.+\)|this llamad was built without the CUDA backend|CUDA device)' \
        "$dir/err" || bad "--device cuda error: $(cat "$dir/err")"
    [ -s "$dir/out" ] && bad "--device cuda without a GPU printed text: $(cat "$dir/out")"
    echo "ok   --device cuda without a GPU: exit 1, $(head -1 "$dir/err")"

    # the daemon: exits 1 before it listens, the log saying why
    $LLAMAD --device cuda --socket "$dir/s0" --state-dir "$dir/st0" 2>"$dir/log0" & p=$!
    i=0
    while kill -0 "$p" 2>/dev/null && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    kill -0 "$p" 2>/dev/null && { kill "$p"; bad "llamad --device cuda without a GPU still runs after 10 s"; }
    wait "$p"; rc=$?
    [ "$rc" -eq 1 ] || bad "llamad --device cuda without a GPU exited $rc, expected 1"
    [ -e "$dir/s0" ] && bad "llamad --device cuda without a GPU left its socket"
    grep -q 'error: --device cuda: ' "$dir/log0" || bad "llamad --device cuda log: $(cat "$dir/log0")"
    echo "ok   llamad --device cuda without a GPU: exit 1 before listening"
fi

# auto and cpu: serve, and status names the backend
for dev in auto cpu; do
    $LLAMAD --device "$dev" --socket "$dir/s-$dev" --state-dir "$dir/st-$dev" --log-level info \
        2>"$dir/log-$dev" & pid=$!
    wait_socket "$dir/s-$dev" "$pid" "$dir/log-$dev"
    "$BUILD/llamactl" --socket "$dir/s-$dev" status >"$dir/status-$dev" || bad "status ($dev)"
    want=cpu
    [ "$gpu" -eq 1 ] && [ "$dev" = auto ] && want=cuda
    grep -q "^backend: *$want," "$dir/status-$dev" ||
        bad "--device $dev: status says '$(grep '^backend' "$dir/status-$dev")', expected $want"
    "$BUILD/llamactl" --socket "$dir/s-$dev" generate --raw --max-tokens 3 "Once" >"$dir/gen-$dev" ||
        bad "generate on --device $dev"
    [ -s "$dir/gen-$dev" ] || bad "generate on --device $dev printed nothing"
    kill "$pid"; wait "$pid"; rc=$?; pid=
    [ "$rc" -eq 0 ] || bad "llamad --device $dev exited $rc on SIGTERM"
    echo "ok   --device $dev: $(grep '^backend' "$dir/status-$dev")"
done
if [ "$gpu" -eq 0 ]; then
    grep -q 'device auto: using the CPU (.\{4,\})' "$dir/log-auto" ||
        bad "--device auto did not log why it took the CPU: $(cat "$dir/log-auto")"
fi
grep -qi 'cuda' "$dir/log-cpu" && bad "--device cpu: the log mentions CUDA: $(grep -i cuda "$dir/log-cpu")"

[ "$fail" -eq 0 ] && echo "device: all ok"
exit "$fail"
