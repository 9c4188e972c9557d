#!/bin/sh
# tests/integration/state_lock.sh — one state directory, one daemon. A
# second llamad with another socket and the same --state-dir refuses to
# start, naming the folder and the first one's pid (before, it started and
# a Drop through it deleted the first daemon's file while that one still
# reported it saved); the first keeps serving and its saved session
# stays; once the first is killed (-9: the kernel drops the lock), a
# daemon starts on the folder and finds the session. A folder of mode 0755
# is used with a warning (its file names show owners and session names).
# Env: BUILD, MODELS.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh
llamactl_frame
state=$dir/state
M="--model $MODELS/stories260K.bin --tokenizer $MODELS/tok512.model --log-level warning"

# shellcheck disable=SC2086  # $M: the words of the model options
"$BUILD/llamad" $M --socket "$dir/a.sock" --state-dir "$state" 2>"$dir/a.log" &
pid=$!
wait_socket "$dir/a.sock" "$pid" "$dir/a.log" 30
"$CTL" --socket "$dir/a.sock" generate -s kept -n 4 --temperature 0 "Hello" >/dev/null || bad "generate on A"
"$CTL" --socket "$dir/a.sock" save kept || bad "save on A"
[ "$(cat "$state/llamad.lock" 2>/dev/null)" = "$pid" ] && ok "the lock file holds A's pid" ||
    bad "lock file: $(cat "$state/llamad.lock" 2>&1)"

# shellcheck disable=SC2086
timeout 60 "$BUILD/llamad" $M --socket "$dir/b.sock" --state-dir "$state" >"$dir/b.out" 2>&1; rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q "$state is in use by another llamad (pid $pid)" "$dir/b.out" &&
   [ ! -S "$dir/b.sock" ]; then
    ok "a second daemon on the same state directory refuses to start (exit $rc), naming it and pid $pid"
else bad "second daemon: exit $rc: $(cat "$dir/b.out")"; fi
"$CTL" --socket "$dir/a.sock" show kept >/dev/null && ok "A still serves its session" || bad "A lost its session"

kill -9 "$pid"; wait "$pid" 2>/dev/null; pid=
# shellcheck disable=SC2086
"$BUILD/llamad" $M --socket "$dir/b.sock" --state-dir "$state" 2>"$dir/b.log" &
pid=$!
wait_socket "$dir/b.sock" "$pid" "$dir/b.log" 30
if "$CTL" --socket "$dir/b.sock" show kept >/dev/null && [ "$(cat "$state/llamad.lock")" = "$pid" ]; then
    ok "after kill -9 of A, a daemon takes the folder and finds the session"
else bad "after A died: $(cat "$dir/b.log"); lock: $(cat "$state/llamad.lock")"; fi
kill "$pid"; wait "$pid"; pid=

# a folder others can read (made by hand, 0755) is used, with a warning:
# its file names say whose sessions are there
mkdir -m 755 "$dir/open"
# shellcheck disable=SC2086
"$BUILD/llamad" $M --socket "$dir/c.sock" --state-dir "$dir/open" 2>"$dir/c.log" &
pid=$!
wait_socket "$dir/c.sock" "$pid" "$dir/c.log" 30
grep -q "state directory $dir/open is mode 0755: other users can list it" "$dir/c.log" &&
    ok "a state directory of mode 0755: warned, with the chmod" || bad "no warning: $(cat "$dir/c.log")"
[ "$fail" -eq 0 ] && echo "PASS state_lock" || exit 1
