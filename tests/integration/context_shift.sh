#!/bin/sh
# tests/integration/context_shift.sh — a long answer must not end a
# conversation (context policy shift, stories260K: a 512-token context):
#  - a chat whose first answer fills the context: the answer slides on to
#    max_tokens, and five more turns are answered, each dropping what came
#    before it; every answer says on stderr what went (from Done) and
#    that it stopped at max_tokens; the session stays within the context;
#    the transcript says what went (the earlier turns dropped, the first
#    answer's slid-out tokens);
#  - the cut-answer messages name the real cause: policy error, or what a
#    shift must keep filling the context; a turn too long for the context
#    is refused with a clear error and the daemon goes on serving;
#  - against a fake older daemon (no dropped_* in Done) chat still says a
#    shift happened, from the turn counts; with them it does not ask.
# Env: BUILD (build folder), MODELS.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh
llamactl_frame
sock=$dir/s
"$BUILD/llamad" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
    --socket "$sock" --state-dir "$dir/state" --log-level warning 2>>"$dir/log" &
pid=$!
wait_socket "$sock" "$pid" "$dir/log"
ctl() { "$CTL" --socket "$sock" "$@"; }
field() { sed -n "s/.*\"$2\":\\([0-9]*\\).*/\\1/p" "$1"; }

# ---- a first answer that fills the context, then five more turns -----------
# (-n 512 is more than the context leaves; the default is half the context)
echo "Once upon a time" | ctl chat --session long --temperature 0 -n 512 >"$dir/a0" 2>"$dir/e0"
rc=$?
ctl --json show long >"$dir/s0"
if [ "$rc" -eq 0 ] && [ "$(wc -c <"$dir/a0")" -gt 1000 ] &&
   grep -q "^\[the context was full: the answer's first [0-9]* tokens slid out to make room\]$" "$dir/e0" &&
   grep -q "^\[the answer stopped at max_tokens (512 tokens); -n raises it\]$" "$dir/e0" &&
   ! grep -q "answer was cut" "$dir/e0" && [ "$(field "$dir/s0" tokens)" -le 512 ]; then
    ok "a first answer longer than the context slides on to max_tokens ($(field "$dir/s0" tokens) tokens kept)"
else
    bad "first answer: rc $rc, $(wc -c <"$dir/a0") bytes, stderr: $(cat "$dir/e0"); $(cat "$dir/s0")"
fi
ctl show long --transcript >"$dir/t0"
if grep -q "^\[1\] assistant ([0-9]* tokens, ended: max_tokens, its first [0-9]* tokens slid out of the context)$" "$dir/t0" &&
   ! grep -q "earlier turn" "$dir/t0"; then
    ok "the transcript says how many of the answer's first tokens slid out"
else bad "transcript after the first answer: $(head -5 "$dir/t0")"; fi
i=0; answered=0
while [ "$i" -lt 5 ]; do
    i=$((i + 1))
    echo "And then what happened, part $i?" |
        ctl chat --session long --temperature 0 -n 300 >"$dir/a$i" 2>"$dir/e$i" &&
        [ -s "$dir/a$i" ] &&
        grep -q "^\[the context was full: the oldest turns were dropped ([0-9]* turns, [0-9]* tokens)" "$dir/e$i" &&
        answered=$((answered + 1))
done
ctl --json show long >"$dir/s5"
if [ "$answered" -eq 5 ] && [ "$(field "$dir/s5" tokens)" -le 512 ] &&
   [ "$(field "$dir/s5" turns)" -eq 2 ]; then
    ok "five more turns answered, each dropping the exchange before it (shift said so each time)"
else
    bad "$answered of 5 more turns answered and said: $(cat "$dir"/e[1-5]); $(cat "$dir/s5")"
fi
ctl show long --transcript >"$dir/t5"
grep -q "^\[context shift: 10 earlier turns dropped to make room; [0-9]* tokens removed in all" "$dir/t5" &&
    ok "the transcript says what context shifts dropped (10 earlier turns)" ||
    bad "transcript after five more turns: $(head -3 "$dir/t5")"
# the JSON done object carries what the shift removed
echo "The end?" | ctl --json chat --session long --temperature 0 -n 300 >"$dir/j6" 2>"$dir/je6"
if [ "$(field "$dir/j6" dropped_turns)" -eq 2 ] && [ "$(field "$dir/j6" dropped_tokens)" -gt 0 ] &&
   grep -q '"slid_tokens":[0-9]' "$dir/j6"; then
    ok "--json: done has dropped_turns 2, dropped_tokens $(field "$dir/j6" dropped_tokens), slid_tokens $(field "$dir/j6" slid_tokens)"
else bad "--json done: $(tail -1 "$dir/j6")"; fi

# ---- why an answer was cut --------------------------------------------------------
ctl generate --raw --session strict --context-policy error --temperature 0 -n 600 "Once" \
    >/dev/null 2>"$dir/cut1"
grep -q "the answer was cut: the session's context is full and its context policy is error (--context-policy shift" "$dir/cut1" &&
    ok "policy error: the cut answer says the policy is error and names shift" ||
    bad "policy error cut: $(cat "$dir/cut1")"
# 255 x "cat" (2 tokens each), " a", BOS: exactly 512 tokens, nothing may go
exact=$(python3 -c "print(' '.join(['cat'] * 255) + ' a')")
ctl generate --raw --session exact --context-policy shift --temperature 0 -n 5 "$exact" \
    >/dev/null 2>"$dir/cut2"
grep -q "the answer was cut: what the session must keep (its system prompt and the question) fills its context (512 tokens)" "$dir/cut2" &&
    ok "shift: a question that fills the context: the cut answer says so" ||
    bad "shift, question fills the context: $(cat "$dir/cut2")"

# ---- bad input: a clear error, and the daemon goes on ------------------------------
python3 -c "print(' '.join(['cat'] * 300))" >"$dir/toolong"
ctl chat --session long -n 5 <"$dir/toolong" >/dev/null 2>"$dir/bad1"
rc=$?
ctl --json show long >"$dir/s7"
if [ "$rc" -eq 1 ] && grep -q "the turn needs [0-9]* tokens, more than the 512-token context holds; send a shorter text" "$dir/bad1" &&
   [ "$(field "$dir/s7" turns)" -eq 2 ]; then
    ok "a turn longer than the context: refused, the conversation kept"
else bad "too long a turn: rc $rc: $(cat "$dir/bad1"); $(cat "$dir/s7")"; fi
echo hi | ctl chat --session sys --system "$(python3 -c "print(' '.join(['dog'] * 150))")" \
    -n 5 >/dev/null 2>"$dir/bad2" || bad "a first turn with a long system prompt: $(cat "$dir/bad2")"
python3 -c "print(' '.join(['cat'] * 120))" | ctl chat --session sys -n 5 >/dev/null 2>"$dir/bad2"
grep -q "the turn needs [0-9]* tokens and the system prompt before it [0-9]*: more than the 512-token context holds" "$dir/bad2" &&
    ok "a turn that fits only without the system prompt: the error says so" ||
    bad "turn + system prompt: $(cat "$dir/bad2")"
echo "Hello again" | ctl chat --session long --temperature 0 -n 8 >"$dir/a8" 2>"$dir/e8" && [ -s "$dir/a8" ] &&
    ok "the daemon goes on serving the session" || bad "after the refusals: $(cat "$dir/e8")"

# ---- an older daemon: no dropped_* in Done ----------------------------------------
python3 tests/tools/fake_llamad.py "$dir" 2>"$dir/fake.log" &
pids=$!
i=0
while [ ! -e "$dir/fake.ready" ]; do
    i=$((i + 1))
    [ "$i" -le 100 ] && kill -0 "$pids" 2>/dev/null || { bad "the fake daemon did not start: $(cat "$dir/fake.log")"; exit 1; }
    sleep 0.1
done
echo hi | "$CTL" --socket "$dir/fake.sock" chat --session shift-old >/dev/null 2>"$dir/old"
grep -q "^\[the context was full: the oldest turns were dropped to make room; 4 turns kept\]$" "$dir/old" &&
    ok "an older daemon's Done: chat counts the turns and says a shift happened" ||
    bad "older daemon: $(cat "$dir/old")"
# the fake's GetInfo says fewer turns here too: chat must believe Done
echo hi | "$CTL" --socket "$dir/fake.sock" chat --session shift-new >/dev/null 2>"$dir/new"
if grep -q "^\[the context was full: the oldest turns were dropped (2 turns, 20 tokens) and the answer's first 10 tokens slid out to make room\]$" "$dir/new" &&
   ! grep -q "turns kept" "$dir/new"; then
    ok "a Done with dropped_*: chat says what went, without asking GetInfo"
else bad "Done with the fields: $(cat "$dir/new")"; fi

kill "$pid"; wait "$pid" 2>/dev/null; pid=
[ "$fail" -eq 0 ] && echo "context_shift: all ok"
exit "$fail"
