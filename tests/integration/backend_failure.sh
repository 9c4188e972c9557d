#!/bin/sh
# A backend that fails for good (a sticky GPU error; here injected with
# LLAMAD_TEST_FAIL_AFTER=N, which marks the backend failed at forward pass
# N) makes llamad save the session histories, tell systemd and exit 1, so
# that Restart=on-failure brings it back; restarted, the sessions are there
# and their next turn recomputes the K/V from the tokens.
# Env: BUILD, MODELS.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh
test_frame
args="--model $MODELS/stories260K.bin --tokenizer $MODELS/tok512.model --socket $dir/s
      --state-dir $dir/state --save-delay 3600 --log-level info"
start() {
    # shellcheck disable=SC2086
    "$BUILD/llamad" $args 2>>"$dir/log" &
    pid=$!
    wait_socket "$dir/s" "$pid" "$dir/log"
}
ctl() { "$BUILD/llamactl" --socket "$dir/s" "$@"; }

# a first session, kept, then the failure in the middle of a second turn
start
echo "Hello there" | ctl chat --session keep --max-tokens 8 --temperature 0 >/dev/null || bad "first turn"
kill "$pid"; wait "$pid"; pid=
rm -f "$dir/s"
n=$(grep -c "" "$dir/log")
LLAMAD_TEST_FAIL_AFTER=4 start
echo "Tell me more" | ctl chat --session keep --max-tokens 32 --temperature 0 >"$dir/out" 2>&1
rc=$?
[ "$rc" -ne 0 ] || bad "the turn cut by the failure exited 0"
wait "$pid"; drc=$?; pid=
[ "$drc" -eq 1 ] || bad "daemon exited $drc after the backend failed, expected 1"
tail -n +"$((n + 1))" "$dir/log" | grep -q "backend failed" || bad "no 'backend failed' in the log"
echo "ok   backend failure: the client got an error, the daemon exited 1"

# restarted: the session's history (both user turns) is back and usable
rm -f "$dir/s"
start
echo "And then?" | ctl chat --session keep --max-tokens 8 --temperature 0 >/dev/null || bad "turn after restart"
ctl --json show keep >"$dir/show" || bad "show after restart"
# turns: hello, reply, the cut turn's prompt (+ its partial reply), and then
grep -Eq '"turns": *[56]' "$dir/show" || bad "history not restored: $(cat "$dir/show")"
echo "ok   restarted: the session came back with the cut turn and its next turn ran"
kill "$pid"; wait "$pid"; pid=
[ "$fail" -eq 0 ] && echo "backend_failure: all ok"
exit "$fail"
