#!/bin/sh
# Greedy generation through llamactl equals the reference implementation's
# output (both golden blocks), and the everyday commands work end to end
# against a real daemon: chat from a pipe, sessions, show, fork, drop.
# Env: BUILD, MODELS, SHARED, LLAMAD_FLAGS (extra daemon flags, e.g. --device cuda).
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh
SHARED=${SHARED:-../shared}
GOLD=$SHARED/reference/stories260K_greedy.txt
test_frame
sock=$dir/s

# shellcheck disable=SC2086
"$BUILD/llamad" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
    --socket "$sock" --state-dir "$dir/state" --log-level warning $LLAMAD_FLAGS 2>"$dir/log" &
pid=$!
wait_socket "$sock" "$pid" "$dir/log"
ctl() { "$BUILD/llamactl" --socket "$sock" "$@"; }

# block N of the golden file: the text between its stdout markers
block() {
    awk -v n="$1" '/^--- stdout ---$/ { k++; if (k == n) { on = 1; next } }
                   /^--- end stdout ---$/ { on = 0 } on' "$GOLD"
}
for spec in 1:60 2:252; do
    n=${spec%%:*}; toks=${spec##*:}
    block "$n" > "$dir/want"
    printf 'Once upon a time' > "$dir/got"
    ctl generate --raw --temperature 0 --max-tokens "$toks" "Once upon a time" >> "$dir/got" \
        || bad "generate exited $?"
    if cmp -s "$dir/want" "$dir/got"; then echo "ok   llamactl greedy = golden block $n ($toks tokens)"
    else bad "golden block $n differs:"; diff "$dir/want" "$dir/got" | head -5; fi
done

# a session through the shell: two piped chat turns, then inspect, fork, drop
echo "Hello there" | ctl chat --session work --max-tokens 8 --temperature 0 > "$dir/c1" || bad "chat 1"
echo "And then?" | ctl chat --session work --max-tokens 8 --temperature 0 > "$dir/c2" || bad "chat 2"
[ -s "$dir/c1" ] && [ -s "$dir/c2" ] || bad "chat printed nothing"
ctl --json show work > "$dir/show" || bad "show"
grep -q '"turns": *4' "$dir/show" || bad "show: expected 4 turns: $(cat "$dir/show")"
ctl fork work work2 || bad "fork"
ctl fork work work2 2>"$dir/fe"; rc=$?
[ "$rc" -eq 1 ] && grep -q "^llamactl: session exists: 'work2' is taken: fork to another name" "$dir/fe" ||
    bad "fork onto an existing session: rc $rc: $(cat "$dir/fe")"
ctl --json sessions > "$dir/list" || bad "sessions"
grep -q '"work2"' "$dir/list" && grep -q '"work"' "$dir/list" || bad "sessions: $(cat "$dir/list")"
ctl drop work2 || bad "drop"
ctl show work2 > /dev/null 2>&1; rc=$?
[ "$rc" -eq 1 ] || bad "show of a dropped session exited $rc, expected 1"
echo "ok   chat from a pipe, show, fork, sessions, drop"

# --json: JSON lines, a token event per token, then done; the events' text
# and the done line's text are the golden text's start
block 1 > "$dir/want"
ctl --json generate --raw --temperature 0 --max-tokens 60 "Once upon a time" > "$dir/j1" ||
    bad "--json generate exited $?"
echo "Hello there" | ctl --json chat --session js --max-tokens 5 --temperature 0 > "$dir/j2" ||
    bad "--json chat exited $?"
python3 - "$dir/j1" "$dir/j2" "$dir/want" <<'PY' && echo "ok   --json generate and chat" || bad "--json output"
import json, sys
def events(path):
    ev = [json.loads(line) for line in open(path)]  # every line one object
    toks = [e for e in ev if e["event"] == "token"]
    assert ev[-1]["event"] == "done" and len(toks) == len(ev) - 1, ev
    assert "".join(e["text"] for e in toks) == ev[-1]["text"], ev
    return toks, ev[-1]
want = open(sys.argv[3]).read().rstrip("\n")  # the block ends with a newline
toks, g = events(sys.argv[1])
assert g["session"] is None, g
assert "Once upon a time" + g["text"] == want, (g["text"], want)
assert g["generated_tokens"] == 60 and g["reason"] == "max_tokens", g
assert len(toks) == 60 and all(len(e["tokens"]) == 1 for e in toks), toks
toks, c = events(sys.argv[2])
assert c["session"] == "js" and c["generated_tokens"] <= 5 and c["text"], c
PY

kill "$pid"; wait "$pid"; rc=$?; pid=
[ "$rc" -eq 0 ] || bad "daemon exited $rc on SIGTERM"
[ "$fail" -eq 0 ] && echo "llamactl_golden: all ok"
exit "$fail"
