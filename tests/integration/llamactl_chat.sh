#!/bin/sh
# tests/integration/llamactl_chat.sh — what a person chatting meets:
#  - long conversations: a session `llamactl chat` creates drops its oldest
#    turns when full (context policy shift) instead of failing; the policy
#    is chosen with --context-policy (also for an existing session); the
#    context-full error says how to fix it; a raw session under shift keeps
#    the prompt of the generation running;
#  - chat on a terminal (a pty): a bracketed paste of several lines is one
#    turn; speaker labels, colour only on a terminal and without NO_COLOR;
#    with stdout piped the log holds both sides; chat reconnects for the
#    next turn after the daemon restarts;
#  - summarize shows progress on stderr when stderr is a terminal.
# Env: BUILD (build folder), MODELS.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh
need_files "$BUILD/llamad" "$BUILD/llamactl" "$MODELS/stories260K.bin" "$MODELS/tok512.model"
test_frame
CTL=$BUILD/llamactl
sock=$dir/s
start() {
    "$BUILD/llamad" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
        --socket "$sock" --state-dir "$dir/state" --log-level warning 2>>"$dir/log" &
    pid=$!
    wait_socket "$sock" "$pid" "$dir/log"
}
start
ctl() { "$CTL" --socket "$sock" "$@"; }
policy() { ctl --json show "$1" | sed -n 's/.*"context_policy":"\([a-z]*\)".*/\1/p'; }

# ---- long conversations ---------------------------------------------------------
i=0; okc=0
while [ "$i" -lt 5 ]; do
    i=$((i + 1))
    echo "Tell me a long story about a cat and a dog, number $i." |
        ctl chat --session long --temperature 0 -n 200 > "$dir/long$i" 2>"$dir/longerr$i" && okc=$((okc + 1))
done
tokens=$(ctl --json show long | sed -n 's/.*"tokens":\([0-9]*\).*/\1/p')
if [ "$okc" -eq 5 ] && [ "$(policy long)" = shift ] && [ "$tokens" -le 512 ]; then
    ok "five chat turns of 200 tokens in a 512-token context: all answered (shift; $tokens tokens kept)"
else
    bad "long chat: $okc of 5 answered, policy $(policy long), $tokens tokens: $(cat "$dir"/longerr*)"
fi
echo "hi" | ctl chat --session strict --context-policy error -n 5 --temperature 0 > /dev/null ||
    bad "chat --context-policy error"
[ "$(policy strict)" = error ] && ok "chat --context-policy error is kept" || bad "strict: $(policy strict)"
ctl generate --session strict --context-policy shift -n 1 --temperature 0 "x" > /dev/null &&
    [ "$(policy strict)" = shift ] && ok "--context-policy changes an existing session's" ||
    bad "policy of strict after --context-policy shift: $(policy strict)"
ctl generate --session strict --context-policy nonsense x > /dev/null 2>&1
[ $? -eq 2 ] || bad "--context-policy nonsense is not a usage error"
# the error names the fix
ctl generate --session full --context-policy error --raw -n 600 --temperature 0 "Once" > /dev/null 2>"$dir/fullerr"
grep -q -- "--context-policy shift" "$dir/fullerr" && ok "an answer cut by a full context names --context-policy shift" ||
    bad "context full: $(cat "$dir/fullerr")"
ctl generate --session full --raw -n 5 "Once upon a time" > /dev/null 2>"$dir/fullerr2"
grep -q "context policy shift" "$dir/fullerr2" && ok "a turn refused by a full context names the fix" ||
    bad "refused turn: $(cat "$dir/fullerr2")"

kill "$pid"; wait "$pid"; rc=$?; pid=
[ "$rc" -eq 0 ] || bad "daemon exited $rc on SIGTERM"
[ "$fail" -eq 0 ] && echo "llamactl_chat: all ok"
exit "$fail"
