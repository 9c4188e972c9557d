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
llamactl_frame
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
# each shift is said, once, on stderr; the first turn had room
nshift=$(cat "$dir"/longerr[2-5] | grep -c '^\[the context was full: the oldest turns were dropped')
if ! grep -q 'context was full' "$dir/longerr1" && [ "$nshift" -ge 1 ]; then
    ok "chat says when the oldest turns were dropped ($nshift of turns 2-5)"
else bad "shift notes: first turn: $(cat "$dir/longerr1"); later: $nshift"; fi
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

# ---- chat on a terminal -----------------------------------------------------------
# a pty for llamactl chat: tests/tools/chatpty.py (a keys file; "@restart"
# restarts the daemon with $dir/restart)
{
    echo "kill \$(cat '$dir/pid'); while kill -0 \$(cat '$dir/pid') 2>/dev/null; do sleep 0.1; done"
    echo "'$BUILD/llamad' --model '$MODELS/stories260K.bin' --tokenizer '$MODELS/tok512.model' \\"
    echo "    --socket '$sock' --state-dir '$dir/state' --log-level warning 2>>'$dir/log' &"
    echo "echo \$! > '$dir/pid'"
    echo "i=0; while [ ! -S '$sock' ] && [ \$i -lt 100 ]; do sleep 0.1; i=\$((i + 1)); done"
} > "$dir/restart"
echo "$pid" > "$dir/pid"
tty() { RESTART=$dir/restart python3 tests/tools/chatpty.py "$CTL" "$sock" "$dir/keys" "$@"; }

# a paste of three lines is one message, one turn
printf '%s\n' '\e[200~line one\rline two\rline three\e[201~' > "$dir/keys"
TERM=xterm tty --session paste -n 4 --temperature 0 > "$dir/t1" 2>&1
ctl --json show paste --transcript > "$dir/t1j"
python3 - "$dir/t1j" <<'PY' && ok "a bracketed paste of three lines is one turn" || bad "paste: $(cat "$dir/t1j" "$dir/t1")"
import json, sys
t = json.load(open(sys.argv[1]))
assert t["turns"] == 2, t
assert t["items"][0]["text"] == "line one\nline two\nline three", t["items"][0]
PY
grep -q "\[paste 1: 3 lines\]" "$dir/t1" || bad "the paste's placeholder was not shown: $(cat "$dir/t1")"
# labels and colour on a terminal; none of the colour with NO_COLOR
printf 'Hello there\n' > "$dir/keys"
TERM=xterm tty --session lab -n 4 --temperature 0 > "$dir/t2" 2>&1
grep -q "$(printf '\033')\[1;36massistant:" "$dir/t2" && ok "on a terminal: a coloured 'assistant:' label" ||
    bad "no coloured label: $(cat -v "$dir/t2")"
NO_COLOR=1 TERM=xterm tty --session lab -n 4 --temperature 0 > "$dir/t3" 2>&1
if grep -q "assistant: " "$dir/t3" && ! grep -q "$(printf '\033')\[1;3" "$dir/t3"; then
    ok "NO_COLOR: the labels without colour"
else bad "NO_COLOR: $(cat -v "$dir/t3")"; fi
# stdout piped (chat | tee log): the log has both sides, no colour
printf 'Hello there\nAnd then?\n' > "$dir/keys"
OUT=$dir/log.txt TERM=xterm tty --session piped -n 4 --temperature 0 > "$dir/t4" 2>&1
if grep -q "^user: Hello there$" "$dir/log.txt" && grep -q "^user: And then?$" "$dir/log.txt" &&
   [ "$(grep -c '^assistant: ' "$dir/log.txt")" -eq 2 ] && ! grep -q "$(printf '\033')" "$dir/log.txt"; then
    ok "chat with stdout piped: the log holds both sides, without colour"
else bad "piped log: $(cat -v "$dir/log.txt")"; fi
# (`chat | tee log`, as llamactl(1) shows): the prompt is on the terminal,
# once per message and at the end, not in the log
if [ "$(grep -o 'piped> ' "$dir/t4" | wc -l)" -eq 3 ] && ! grep -q 'piped>' "$dir/log.txt"; then
    ok "chat with stdout piped: the prompt shows on the terminal, not in the log"
else bad "piped: prompts on the terminal: $(cat -v "$dir/t4")"; fi
# /quit (or Ctrl-D) before any message: the session this chat made is not
# kept; one that existed before stays, empty or not
printf '/quit\n' > "$dir/keys"
TERM=xterm tty --session unused > "$dir/t6" 2>&1
if ! ctl show unused > /dev/null 2>&1 && grep -q "nothing was said in the new session unused" "$dir/t6"; then
    ok "/quit before any message: the new session is not kept (and chat says so)"
else bad "/quit before a message: $(ctl show unused 2>&1); $(cat -v "$dir/t6")"; fi
printf '' > "$dir/keys"
TERM=xterm tty --session piped > "$dir/t7" 2>&1
ctl show piped > /dev/null 2>&1 && ok "Ctrl-D at once in an existing session: it stays" ||
    bad "an existing session was dropped: $(cat -v "$dir/t7")"

# the daemon restarts between two turns: chat reconnects for the next one
printf 'Hello there\n@restart\nAnd then?\n' > "$dir/keys"
TERM=xterm tty --session rc -n 4 --temperature 0 > "$dir/t5" 2>&1
pid=$(cat "$dir/pid")
turns=$(ctl --json show rc | sed -n 's/.*"turns":\([0-9]*\).*/\1/p')
if grep -q "reconnected" "$dir/t5" && grep -q "\[exit 0\]" "$dir/t5" && [ "$turns" = 4 ]; then
    ok "chat reconnects after the daemon restarts (4 turns in the session)"
else bad "reconnect: turns $turns: $(cat "$dir/t5")"; fi

# the daemon closes the connection for idling (idle_timeout 2) between two
# turns: chat connects again without a word, the session goes on
"$BUILD/llamad" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
    --socket "$dir/idle.sock" --state-dir none --idle-timeout 2 --log-level debug 2>"$dir/idle.log" &
ipid=$!
wait_socket "$dir/idle.sock" "$ipid" "$dir/idle.log"
printf 'Hello there\n@sleep 3.5\nAnd then?\n' > "$dir/keys"
TERM=xterm python3 tests/tools/chatpty.py "$CTL" "$dir/idle.sock" "$dir/keys" --session idle -n 4 \
    --temperature 0 > "$dir/t8" 2>&1
turns=$("$CTL" --socket "$dir/idle.sock" --json show idle | sed -n 's/.*"turns":\([0-9]*\).*/\1/p')
if grep -q "idle for 2 s; closing" "$dir/idle.log" && ! grep -q "reconnect\|lost" "$dir/t8" &&
    grep -q "\[exit 0\]" "$dir/t8" && [ "$turns" = 4 ]; then
    ok "chat after the daemon closed its idle connection: connected again quietly (4 turns)"
else bad "idle close: turns $turns: $(cat "$dir/t8"); log: $(grep idle "$dir/idle.log")"; fi
kill $ipid

# ---- summarize shows progress when stderr is a terminal ----------------------------
for i in $(seq 1 60); do
    echo "Lily and Ben went to the park. They played on the swings and saw a big dog."
    echo
done > "$dir/long.txt"
python3 - "$CTL" "$sock" "$dir/long.txt" > "$dir/sumtty" <<'PY'
import os, pty, subprocess, sys
master, slave = pty.openpty()
p = subprocess.run([sys.argv[1], "--socket", sys.argv[2], "summarize", "--temperature", "0", "-n", "16"],
                   stdin=open(sys.argv[3]), stdout=subprocess.DEVNULL, stderr=slave, timeout=120)
os.close(slave)
out = b""
while True:
    try:
        chunk = os.read(master, 65536)
    except OSError:
        break
    if not chunk:
        break
    out += chunk
sys.stdout.write(out.decode("utf-8", "replace"))
PY
grep -q "part 1/" "$dir/sumtty" && ok "summarize: progress on a terminal's stderr" || bad "summarize progress: $(cat "$dir/sumtty")"
ctl summarize --temperature 0 -n 16 < "$dir/long.txt" > /dev/null 2>"$dir/sumerr"
[ -s "$dir/sumerr" ] && bad "summarize printed to a stderr that is not a terminal: $(cat "$dir/sumerr")"

kill "$pid"; wait "$pid" 2>/dev/null; pid=
[ "$fail" -eq 0 ] && echo "llamactl_chat: all ok"
exit "$fail"
