#!/bin/sh
# tests/integration/http_callers.sh — llamad-http serves each HTTP caller
# as its own user. llamad runs as root; the gateway as nobody (listed in
# trusted_gateways), on a Unix socket anyone may use and on loopback TCP.
# Checked: two callers (uids 65533, 65532) sending the same conversation
# over the Unix socket each get a session of their own (owner_uid), and a
# caller's second turn continues its own session, not the other's; a TCP
# caller is the owner of its socket (/proc/net/tcp); with --token-file a
# TCP caller without or with a wrong token gets 401 and with one is its
# user; nobody calling its own gateway is served as nobody; once llamad no
# longer trusts the gateway (SIGHUP), callers get a 500 saying so and no
# session is made for anyone.
#
# Needs root (setpriv), curl and python3. Not root: skipped.
# Env: BUILD (build folder), MODELS.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh

http_uid_frame
GW=$(id -u nobody) A=65533 B=65532
[ "$GW" -ne "$A" ] && [ "$GW" -ne "$B" ] || { echo "skipped: nobody's uid $GW is one of the test's"; exit 0; }

test_frame 755
mkdir "$dir/gw" && chown "$GW" "$dir/gw"
SOCK=$dir/llamad.sock HSOCK=$dir/gw/http.sock
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
PORT2=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

printf 'trusted_gateways = nobody\n' >"$dir/conf"
"$BUILD/llamad" --config "$dir/conf" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
    --socket "$SOCK" --state-dir none --socket-mode 0666 --max-tokens 6 --temperature 0 \
    --log-level info 2>"$dir/llamad.log" &
pid=$!
wait_socket "$SOCK" "$pid" "$dir/llamad.log" 30
setpriv --reuid="$GW" --regid="$GW" --clear-groups "$BUILD/llamad-http" --socket "$SOCK" --name m \
    --listen "$HSOCK" --listen "127.0.0.1:$PORT" --socket-mode 0666 -v 2>"$dir/http.log" &
gpid=$!
for i in $(seq 50); do [ -S "$HSOCK" ] && break; sleep 0.1; done
[ -S "$HSOCK" ] || { bad "the gateway did not start: $(cat "$dir/http.log")"; kill $pid; exit 1; }
trap 'kill $gpid $pid 2>/dev/null; test_cleanup' EXIT

# as UID, POST BODY to PATH over the Unix socket (or TCP with -t): the
# body in $out, the status in $code
post() {
    u=$1 path=$2 body=$3; shift 3
    out=$(setpriv --reuid="$u" --regid="$u" --clear-groups curl -s -w '\n%{http_code}' "$@" \
        -H 'Content-Type: application/json' -d "$body" "http://x$path" 2>&1)
    code=$(printf '%s\n' "$out" | tail -n 1)
    out=$(printf '%s\n' "$out" | sed '$d')
}
owner_of() {   # the owner uids of the sessions named http-UID-*
    "$BUILD/llamactl" --socket "$SOCK" --json sessions |
        python3 -c 'import json,sys; d=json.load(sys.stdin); print(" ".join(sorted("%s:%s" % (s["session"].split("-")[1], s.get("owner_uid", 0)) for s in d if s["session"].startswith("http-"))))'
}
metric() {
    curl -s --unix-socket "$HSOCK" http://x/metrics | sed -n "s/^$1 //p"
}
answer() { printf '%s' "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])'; }

T1='{"model":"m","messages":[{"role":"user","content":"Once upon a time"}]}'
post $A /v1/chat/completions "$T1" --unix-socket "$HSOCK"
[ "$code" = 200 ] && ok "uid $A over the Unix socket: 200" || bad "uid $A: $code $out"
ansA=$(answer)
post $B /v1/chat/completions "$T1" --unix-socket "$HSOCK"
[ "$code" = 200 ] && ok "uid $B over the Unix socket: 200" || bad "uid $B: $code $out"
[ "$(owner_of)" = "$B:$B $A:$A" ] || [ "$(owner_of)" = "$A:$A $B:$B" ] &&
    ok "each caller's session is its own (names and owner_uid): $(owner_of)" || bad "owners: $(owner_of)"
[ "$(metric llamad_http_conversations_new_total)" = 2 ] && ok "two new conversations" ||
    bad "new: $(metric llamad_http_conversations_new_total)"

# A's second turn continues A's session
T2=$(python3 -c 'import json,sys; print(json.dumps({"model":"m","messages":[{"role":"user","content":"Once upon a time"},{"role":"assistant","content":sys.argv[1]},{"role":"user","content":"And then?"}]}))' "$ansA")
post $A /v1/chat/completions "$T2" --unix-socket "$HSOCK"
[ "$code" = 200 ] && [ "$(metric llamad_http_conversations_continued_total)" = 1 ] &&
    [ "$(owner_of | wc -w)" = 2 ] && ok "uid $A's second turn continues its session" ||
    bad "A turn 2: $code continued=$(metric llamad_http_conversations_continued_total) owners=$(owner_of)"
# B sends the same history (greedy: B's first answer was A's): B's own
# session is continued, A's is not touched
post $B /v1/chat/completions "$T2" --unix-socket "$HSOCK"
[ "$code" = 200 ] && [ "$(metric llamad_http_conversations_continued_total)" = 2 ] &&
    [ "$(owner_of | wc -w)" = 2 ] &&
    ok "uid $B with the same history continues its own session, not uid $A's" ||
    bad "B with A's history: $code continued=$(metric llamad_http_conversations_continued_total) owners=$(owner_of)"

# loopback TCP: the owner of the caller's socket
out=$(setpriv --reuid=$A --regid=$A --clear-groups curl -s -w '\n%{http_code}' -H 'Content-Type: application/json' \
    -d '{"model":"m","messages":[{"role":"user","content":"TCP caller"}]}' "http://127.0.0.1:$PORT/v1/chat/completions")
code=$(printf '%s\n' "$out" | tail -n 1)
n_a=$(owner_of | tr ' ' '\n' | grep -c "^$A:$A$")
[ "$code" = 200 ] && [ "$n_a" -ge 2 ] && ! owner_of | grep -q "$GW:" &&
    ok "a loopback TCP caller is served as the owner of its socket (uid $A)" ||
    bad "TCP caller: $code owners=$(owner_of)"

# nobody calling its own gateway: served as itself
post $GW /v1/chat/completions "$T1" --unix-socket "$HSOCK"
[ "$code" = 200 ] && owner_of | grep -q "$GW:$GW" && ok "the gateway's own user is served as itself" ||
    bad "nobody: $code owners=$(owner_of)"

# tokens
TOK=0123456789abcdef-token-for-b
printf '# tokens\n%s %s\n' "$TOK" "$B" >"$dir/tokens"
chmod 0644 "$dir/tokens"
"$BUILD/llamad-http" --socket "$SOCK" --name m --listen "127.0.0.1:$PORT2" --token-file "$dir/tokens" 2>"$dir/t.log" &&
    bad "a token file others may read was accepted" ||
    { grep -q "readable by others" "$dir/t.log" && ok "a token file readable by others is refused"; }
chmod 0600 "$dir/tokens"
"$BUILD/llamad-http" --socket "$SOCK" --name m --listen "0.0.0.0:$PORT2" 2>"$dir/t.log" &&
    bad "0.0.0.0 accepted without --allow-remote" ||
    { grep -q "not a loopback address" "$dir/t.log" && ok "a non-loopback address is refused without --allow-remote"; }
"$BUILD/llamad-http" --socket "$SOCK" --name m --listen "127.0.0.1:$PORT2" --token-file "$dir/tokens" \
    --listen "$dir/t.sock" 2>"$dir/t.log" &
tpid=$!
for i in $(seq 50); do [ -S "$dir/t.sock" ] && break; sleep 0.1; done
tc() { out=$(curl -s -w '\n%{http_code}' "$@" -H 'Content-Type: application/json' \
    -d '{"model":"m","messages":[{"role":"user","content":"token caller"}]}' "http://127.0.0.1:$PORT2/v1/chat/completions")
    code=$(printf '%s\n' "$out" | tail -n 1); }
tc
[ "$code" = 401 ] && printf '%s' "$out" | grep -q '"message":"a bearer token is required' &&
    ok "TCP without a token: 401 in OpenAI's form" || bad "no token: $out"
h=$(curl -s -w ' %{http_code}' "http://127.0.0.1:$PORT2/health")
r=$(curl -s -w ' %{http_code}' "http://127.0.0.1:$PORT2/")
printf '%s' "$h" | grep -q '"status":"ok"' && [ "${h##* }" = 200 ] &&
    printf '%s' "$r" | grep -q "is running" && [ "${r##* }" = 200 ] &&
    ok "TCP without a token: /health and GET / still answer (health probes send none)" ||
    bad "no token: /health $h, / $r"
tc -H "Authorization: Bearer wrong-token-wrong-token"
[ "$code" = 401 ] && ok "a wrong token: 401" || bad "wrong token: $out"
before=$(owner_of | tr ' ' '\n' | grep -c "^$B:$B$")
tc -H "Authorization: Bearer $TOK"
after=$(owner_of | tr ' ' '\n' | grep -c "^$B:$B$")
[ "$code" = 200 ] && [ "$after" -eq $((before + 1)) ] && ok "the token's user (uid $B) owns the session" ||
    bad "token: $code $out ($before -> $after)"
kill $tpid

# llamad stops trusting the gateway: callers get 500 saying so, nothing is made
printf 'trusted_gateways =\n' >"$dir/conf"
kill -HUP $pid
sleep 0.5
n0=$(owner_of | wc -w)
post $A /v1/chat/completions "$T1" --unix-socket "$HSOCK"
[ "$code" = 500 ] && printf '%s' "$out" | grep -q "not a trusted gateway" && [ "$(owner_of | wc -w)" = "$n0" ] &&
    ok "an untrusted gateway: 500 naming trusted_gateways, no session made" || bad "untrusted: $code $out"
grep -q "refuses to let this gateway act for uid $A" "$dir/http.log" && ok "the gateway logs the refusal" ||
    bad "no log: $(tail -3 "$dir/http.log")"
# outside the journal a line reads as llamad's; into it (JOURNAL_STREAM),
# it carries its syslog priority instead
line=$(grep "refuses to let this gateway act for uid $A" "$dir/http.log" | head -1)
printf '%s\n' "$line" | grep -Eq '^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:]{8} llamad-http (warning|error): ' &&
    ok "a log line outside the journal: date, time, llamad-http, level" || bad "log line: $line"
JOURNAL_STREAM=8:1 "$BUILD/llamad-http" --socket "$SOCK" --name m --listen "$dir/j.sock" 2>"$dir/j.log" &
jpid=$!
for i in $(seq 50); do [ -S "$dir/j.sock" ] && break; sleep 0.1; done
kill $jpid; wait $jpid
grep -q "^<6>llamad-http: listening on $dir/j.sock" "$dir/j.log" &&
    ! grep -Eq '^[0-9]{4}-' "$dir/j.log" && ok "into the journal: the <priority> prefix instead" ||
    bad "journal lines: $(cat "$dir/j.log")"

kill $gpid $pid
wait $gpid 2>/dev/null
echo "http_callers: $([ "$fail" -eq 0 ] && echo all ok || echo FAILED)"
exit "$fail"
