#!/bin/sh
# tests/integration/llamactl_json.sh — llamactl for programs and for people
# coming back to a conversation:
#  - --json on generate / chat / summarize is JSON lines: a token event per
#    token, flushed as it comes (checked against a fake daemon that sends
#    the next event only once the previous line was read), then done;
#  - errors in --json mode are JSON objects on stdout with the usual exit
#    status (daemon errors, no daemon, usage);
#  - show --transcript (text and JSON, --last, --from, --ids) against a real
#    daemon, a session on disk read without restoring it;
#  - chat on a terminal (a pty) re-entering a session prints its last turns
#    (--recap), /history [N] prints turns;
#  - generate | head: llamactl exits 0 without a "Broken pipe" message.
# Env: BUILD (build folder), MODELS.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh
llamactl_frame

# ---- events are flushed one by one (a fake daemon) ---------------------------
python3 - "$CTL" "$dir/fake.sock" <<'PY' && ok "--json generate: one line per event, each flushed before the next event is sent" || bad "streaming JSON lines"
import json, os, select, socket, subprocess, sys, threading

ctl, path = sys.argv[1], sys.argv[2]

sys.path.insert(0, "tests/tools")
from pbwire import field, fields, frame, read_frame, varint

def request(b):  # (id, op field number) of a Request
    m = fields(b)
    return m.get(1, [0])[0], next((n for n in m if n != 1), 0)

def send(conn, rid, body_num, body):
    conn.sendall(frame(field(1, 0, rid) + field(body_num, 2, body)))

read_one = threading.Semaphore(0)
srv = socket.socket(socket.AF_UNIX)
srv.bind(path)
srv.listen(1)

def serve():
    conn, _ = srv.accept()
    while True:
        body = read_frame(conn)
        if body is None:
            return
        rid, op = request(body)
        if op == 2:    # Hello
            send(conn, rid, 3, field(1, 0, 1) + field(5, 0, 512))
        elif op == 3:  # OpenSession
            send(conn, rid, 4, field(1, 2, b"s") + field(18, 0, 1))
        elif op == 5:  # Generate: three tokens, each after the last line was read
            for k, text in enumerate(["Once", " upon", " a"]):
                send(conn, rid, 6, field(1, 2, text.encode()) + field(2, 2, varint(100 + k)))
                if not read_one.acquire(timeout=10):
                    return
            send(conn, rid, 7, field(1, 0, 2) + field(3, 0, 3) + field(6, 0, 8))
            conn.close()
            return

threading.Thread(target=serve, daemon=True).start()
p = subprocess.Popen([ctl, "--socket", path, "--json", "generate", "--session", "s", "-n", "3", "hi"],
                     stdout=subprocess.PIPE)
lines = []
buf = b""
while True:
    r, _, _ = select.select([p.stdout], [], [], 10)
    if not r:
        sys.exit("no line within 10 s: events are not flushed (got %r)" % lines)
    chunk = os.read(p.stdout.fileno(), 4096)
    if not chunk:
        break
    buf += chunk
    while b"\n" in buf:
        line, buf = buf.split(b"\n", 1)
        ev = json.loads(line)
        lines.append(ev)
        if ev["event"] == "token":
            read_one.release()
assert p.wait(10) == 0
want = [("token", "Once", [100]), ("token", " upon", [101]), ("token", " a", [102])]
assert [(e["event"], e["text"], e["tokens"]) for e in lines[:3]] == want, lines
assert lines[3]["event"] == "done" and lines[3]["text"] == "Once upon a", lines
assert lines[3]["generated_tokens"] == 3 and lines[3]["reason"] == "max_tokens", lines
assert len(lines) == 4
PY

# ---- a real daemon ---------------------------------------------------------------
sock=$dir/s
"$BUILD/llamad" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
    --socket "$sock" --state-dir "$dir/state" --log-level warning 2>"$dir/log" &
pid=$!
wait_socket "$sock" "$pid" "$dir/log"
ctl() { "$CTL" --socket "$sock" "$@"; }

# ---- errors are JSON too, exit status unchanged -------------------------------
# jerr FILE KIND CODE: FILE's last line is an error object of KIND and CODE
jerr() {
    python3 - "$@" <<'PY'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
e = json.loads(lines[-1])
assert e["event"] == "error" and e["error"] == sys.argv[2] and e["code"] == int(sys.argv[3]), e
assert e["message"], e
PY
}
ctl --json show nosuch > "$dir/e1" 2>/dev/null; rc=$?
[ "$rc" -eq 1 ] && jerr "$dir/e1" "unknown session" 2 && ok "--json: a daemon error is a JSON object (exit 1)" ||
    bad "--json show nosuch: rc $rc: $(cat "$dir/e1")"
ctl --json generate --session 'bad id' x > "$dir/e2" 2>/dev/null; rc=$?
# a bad session name is caught before sending: a usage error naming it
[ "$rc" -eq 2 ] && jerr "$dir/e2" usage 0 && grep -q "'bad id' is not a session name" "$dir/e2" ||
    bad "--json bad id: rc $rc: $(cat "$dir/e2")"
printf 'bad \377 byte' > "$dir/notutf8"
ctl --json generate --session ok - < "$dir/notutf8" > "$dir/e2b" 2>/dev/null; rc=$?
[ "$rc" -eq 1 ] && jerr "$dir/e2b" "bad request" 1 ||
    bad "--json prompt not UTF-8: rc $rc: $(cat "$dir/e2b")"
"$CTL" --socket "$dir/nothing.sock" --json status > "$dir/e3" 2>"$dir/e3err"; rc=$?
[ "$rc" -eq 3 ] && jerr "$dir/e3" connect 0 && grep -q "is llamad running" "$dir/e3err" &&
    ok "--json: no daemon is a JSON object (exit 3), stderr still says it" ||
    bad "--json without a daemon: rc $rc: $(cat "$dir/e3")"
ctl --json generate --max-tokens 0 x > "$dir/e4" 2>/dev/null; rc=$?
[ "$rc" -eq 2 ] && jerr "$dir/e4" usage 0 && ok "--json: a usage error is a JSON object (exit 2)" ||
    bad "--json usage error: rc $rc: $(cat "$dir/e4")"
echo "" | ctl --json chat --session c > "$dir/e5" 2>/dev/null; rc=$?
[ "$rc" -eq 2 ] && jerr "$dir/e5" usage 0 || bad "--json chat with nothing on stdin: rc $rc: $(cat "$dir/e5")"

# ---- summarize --json: progress, tokens, done ----------------------------------
for i in $(seq 1 60); do
    echo "Lily and Ben went to the park. They played on the swings and saw a big dog. The dog was friendly and they were happy."
    echo
done > "$dir/long.txt"
ctl --json summarize --temperature 0 --max-tokens 20 < "$dir/long.txt" > "$dir/sum" 2>"$dir/sumerr" ||
    bad "summarize --json: $(cat "$dir/sumerr")"
python3 - "$dir/sum" <<'PY' && ok "summarize --json: progress events, the summary's tokens, done" || bad "summarize --json: $(head -c 600 "$dir/sum")"
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
kinds = [e["event"] for e in ev]
assert kinds[-1] == "done" and "progress" in kinds and "token" in kinds, kinds
prog = [e for e in ev if e["event"] == "progress"]
assert prog[0]["part"] == 1 and all(p["parts"] >= 2 for p in prog), prog
last_prog = max(i for i, k in enumerate(kinds) if k == "progress")
assert all(k == "token" for k in kinds[last_prog + 1:-1]), kinds
done = ev[-1]
assert done["parts"] == len(prog) + 1 and done["rounds"] >= 2, done
assert "".join(e["text"] for e in ev if e["event"] == "token") == done["text"], done
PY

# ---- transcripts -----------------------------------------------------------------
ctl generate --session t --temperature 0 -n 6 "Tell me a story." > "$dir/a1" || bad "generate 1"
echo "What next?" | ctl chat --session t --temperature 0 -n 7 > "$dir/a2" || bad "chat 2"
ctl show t --transcript > "$dir/tx" || bad "show --transcript"
python3 - "$dir/tx" "$dir/a1" "$dir/a2" <<'PY' && ok "show --transcript: roles, counts, why answers ended, texts" || bad "show --transcript: $(cat "$dir/tx")"
import sys
tx = open(sys.argv[1]).read()
a1, a2 = (open(f).read().rstrip("\n") for f in sys.argv[2:4])
want = ("session t: 4 turns, template llama2\n\n"
        "[0] user (")
assert tx.startswith(want), tx
blocks = tx.split("\n\n")[1:]
assert blocks[0].split("\n")[1] == "Tell me a story." and blocks[2].split("\n")[1] == "What next?", blocks
assert blocks[1] == "[1] assistant (6 tokens, ended: max_tokens)\n" + a1, (blocks[1], a1)
assert blocks[3] == "[3] assistant (7 tokens, ended: max_tokens)\n" + a2, (blocks[3], a2)
PY
ctl --json show t --last 1 --ids > "$dir/txj" || bad "show --json --last 1"
ctl --json show t --from 2 > "$dir/txj2" || bad "show --json --from 2"
python3 - "$dir/txj" "$dir/txj2" "$dir/a2" <<'PY' && ok "show --json --transcript: --last, --from, --ids" || bad "show --json: $(cat "$dir/txj")"
import json, sys
t, t2 = (json.load(open(f)) for f in sys.argv[1:3])
a2 = open(sys.argv[3]).read().rstrip("\n")
assert t["turns"] == 4 and t["first"] == 3 and len(t["items"]) == 1, t
u = t["items"][0]
assert u["role"] == "assistant" and u["generated"] and u["stop_reason"] == "max_tokens", u
assert u["text"] == a2 and len(u["token_ids"]) == u["tokens"] == 7, u
assert t2["first"] == 2 and [i["index"] for i in t2["items"]] == [2, 3], t2
assert t2["items"][0]["stop_reason"] is None and "token_ids" not in t2["items"][0], t2
PY

# ---- chat on a terminal: re-entry recap and /history ----------------------------
# ptychat ARGS...: llamactl chat ARGS on a pty, typing the lines of $dir/keys
ptychat() { python3 tests/tools/chatpty.py "$CTL" "$sock" "$dir/keys" "$@"; }
printf '/history 1\n/quit\n' > "$dir/keys"
HOME=$dir ptychat --session t --recap 2 > "$dir/pty" 2>&1
python3 - "$dir/pty" "$dir/a2" <<'PY' && ok "chat re-entry prints the last turns; /history N prints turns" || bad "chat on a pty: $(cat "$dir/pty")"
import sys
out = open(sys.argv[1]).read().replace("\r\n", "\n")
a2 = open(sys.argv[2]).read().rstrip("\n")
head, _, rest = out.partition("/history 1")
assert "(2 earlier turns)" in head, head
assert "[2] user (" in head and "What next?" in head, head
assert "[3] assistant (7 tokens, ended: max_tokens)\n" + a2 in head, head
assert "[1] assistant" not in head, head
assert "session t: 4 turns" in rest and "(3 earlier turns)" in rest, rest
assert "[3] assistant" in rest and "[2] user" not in rest, rest
PY
printf '/quit\n' > "$dir/keys"
HOME=$dir ptychat --session t --recap 0 > "$dir/pty0" 2>&1
grep -q "earlier turn\|\[3\] assistant" "$dir/pty0" && bad "--recap 0 still printed turns: $(cat "$dir/pty0")" ||
    ok "chat --recap 0 prints no turns"

# ---- a session on disk: the transcript comes from its file ----------------------
kill "$pid"; wait "$pid"; pid=
"$BUILD/llamad" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
    --socket "$sock" --state-dir "$dir/state" --log-level warning 2>>"$dir/log" &
pid=$!
wait_socket "$sock" "$pid" "$dir/log"
ctl show t --transcript > "$dir/tx2" || bad "show --transcript after a restart"
sed -e '1s/, on disk$//' "$dir/tx2" | cmp -s - "$dir/tx" && head -1 "$dir/tx2" | grep -q ", on disk" &&
    ok "after a restart: the same transcript, read from the state file" ||
    bad "transcript after restart differs: $(cat "$dir/tx2")"
ctl --json show t | grep -q '"location":"disk"' && ok "the transcript did not restore the session" ||
    bad "session t left the disk: $(ctl --json show t)"

# ---- the README's generate --raw with no --max-tokens ------------------------------
# the default reply length is at most half the context: on stories260K
# (512 tokens, max_tokens 512 by default) the answer used to run into the
# context's end and say "context full"
ctl --json generate --raw --temperature 0.8 --seed 5 "Once upon a time" > "$dir/dflt" 2>"$dir/dflt-err"
python3 - "$dir/dflt" <<'PY' && ok "generate --raw with no --max-tokens: 256 tokens (half the context), max_tokens, not the context's end" || bad "default max_tokens: $(tail -c 300 "$dir/dflt") $(cat "$dir/dflt-err")"
import json, sys
d = json.loads(open(sys.argv[1]).read().splitlines()[-1])
# seed 5 writes on past 256 tokens (before: to the context's end)
assert d["event"] == "done" and d["reason"] == "max_tokens", d
assert d["generated_tokens"] == 256, d
PY

# ---- a reader that stops early --------------------------------------------------
{ ctl generate --raw --temperature 0 -n 200 "Once upon a time" 2>"$dir/pipe-err"; echo $? > "$dir/pipe-rc"; } |
    head -c 10 > /dev/null
sleep 0.5
if [ -s "$dir/pipe-err" ] || [ "$(cat "$dir/pipe-rc")" != 0 ]; then
    bad "generate | head: exit $(cat "$dir/pipe-rc"), stderr: $(cat "$dir/pipe-err")"
else
    ok "generate | head -c 10: exit 0, nothing on stderr"
fi

kill "$pid"; wait "$pid"; rc=$?; pid=
[ "$rc" -eq 0 ] || bad "daemon exited $rc on SIGTERM"
[ "$fail" -eq 0 ] && echo "llamactl_json: all ok"
exit "$fail"
