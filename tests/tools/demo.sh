#!/bin/sh
# make demo: the main job. Starts llamad on the small default model
# (stories260K) on a private socket, runs real generations through llamactl
# (a raw story continuation, its continuation, a fork), restarts the daemon
# to show the sessions survive, and stops it.
set -e
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
dir=$(mktemp -d)
sock=$dir/llamad.sock
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT INT TERM

start() {
    "$BUILD/llamad" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
        --socket "$sock" --state-dir "$dir/state" --log-level warning &
    pid=$!
    i=0
    until [ -S "$sock" ]; do
        i=$((i + 1)); [ $i -gt 100 ] && { echo "demo: llamad did not start" >&2; exit 1; }
        sleep 0.1
    done
}
start
ctl() { "$BUILD/llamactl" --socket "$sock" "$@"; }

echo "== llamactl generate --raw (greedy): a story from stories260K"
ctl generate --session story --raw --temperature 0 --max-tokens 120 "Once upon a time"
echo
echo "== the same session continues where it stopped (only new tokens are computed)"
ctl generate --session story --temperature 0.8 --seed 7 --max-tokens 60
echo
echo "== fork it and take the copy elsewhere; the original is untouched"
ctl fork story story-b
ctl generate --session story-b --raw --seed 3 --max-tokens 50 " Then a dragon"
echo
ctl sessions
echo
echo "== restart the daemon: the sessions were saved at shutdown and come back on use"
kill "$pid"; wait "$pid"; pid=
start
ctl sessions
ctl generate --session story --temperature 0 --max-tokens 40
echo
ctl status
