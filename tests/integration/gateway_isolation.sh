#!/bin/sh
# tests/integration/gateway_isolation.sh — a caller of llamad-http reaches
# its own sessions only, whatever another user names its sessions. llamad
# and the gateway run as root (as the man page shows); uid 65534 (nobody)
# plants sessions in every way a name can be planted, then root's
# conversations must never land in them:
#
#   1. nobody opens http-0-planted on llamad's socket with one exchange;
#      a fresh gateway (it reads sessions back at its first request) gets
#      root's request with that history plus a secret: nobody's session
#      is untouched, root gets a session of its own (before: the secret
#      went into nobody's session).
#   2. nobody sends X-Llamad-Session: http-0-x through the gateway: 400
#      (the gateway's names are its own), no such session is made.
#   3. nobody names a session of its own (X-Llamad-Session: shared-name);
#      root sends the same header: root gets its own session of that name.
#   4. nobody copies the name of root's gateway conversation (made on
#      llamad's socket with other turns); a restarted gateway continues
#      root's conversation in root's session, nobody's copy untouched.
#   5. nobody's own ListSessions, as a connection acting for itself (what
#      the gateway does), lists nobody's sessions only; so does root's
#      gateway connection (root's, acting for root): root's own only.
#   6. Status and /metrics count nobody's own work for nobody (no
#      connections, errors, RSS, gateway totals), every user's for root.
#
# Needs root (setpriv), curl and python3. Not root: skipped.
# Env: BUILD (build folder), MODELS.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh

http_uid_frame
N=$(id -u nobody)

test_frame 755
build_protoclient "$dir/pc"
SOCK=$dir/llamad.sock HSOCK=$dir/http.sock
"$BUILD/llamad" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
    --socket "$SOCK" --state-dir none --socket-mode 0666 --max-tokens 6 --temperature 0 \
    2>"$dir/llamad.log" &
pid=$!
wait_socket "$SOCK" "$pid" "$dir/llamad.log" 30
gpid=
start_gateway() {
    [ -n "$gpid" ] && { kill "$gpid"; wait "$gpid" 2>/dev/null; }
    rm -f "$HSOCK"
    "$BUILD/llamad-http" --socket "$SOCK" --name m --listen "$HSOCK" --socket-mode 0666 -v \
        2>>"$dir/http.log" &
    gpid=$!
    for i in $(seq 50); do [ -S "$HSOCK" ] && break; sleep 0.1; done
    [ -S "$HSOCK" ] || { bad "the gateway did not start: $(cat "$dir/http.log")"; exit 1; }
}
trap 'kill $gpid $pid 2>/dev/null; test_cleanup' EXIT
start_gateway

as_nobody() { setpriv --reuid="$N" --regid="$N" --clear-groups "$@"; }
# as UID (root: 0), POST a chat BODY: body in $out, status in $code
post() {
    u=$1 body=$2; shift 2
    if [ "$u" = 0 ]; then run=""; else run="setpriv --reuid=$u --regid=$u --clear-groups"; fi
    out=$($run curl -s -w '\n%{http_code}' --unix-socket "$HSOCK" "$@" \
        -H 'Content-Type: application/json' -d "$body" http://x/v1/chat/completions 2>&1)
    code=$(printf '%s\n' "$out" | tail -n 1)
    out=$(printf '%s\n' "$out" | sed '$d')
}
# transcript NAME [UID]: the session's turns' texts, one a line, as UID (root)
transcript() {
    if [ "${2:-0}" = 0 ]; then run=""; else run="setpriv --reuid=$2 --regid=$2 --clear-groups"; fi
    $run "$BUILD/llamactl" --socket "$SOCK" --json show --transcript "$1" |
        python3 -c 'import json,sys; [print(t.get("text","")) for t in json.load(sys.stdin)["items"]]'
}
# owners PREFIX: "NAME:OWNER" of every session whose name starts with PREFIX (root sees all)
owners() {
    "$BUILD/llamactl" --socket "$SOCK" --json sessions |
        python3 -c 'import json,sys; print(" ".join(sorted("%s:%s" % (s["session"], s.get("owner_uid", 0)) for s in json.load(sys.stdin) if s["session"].startswith(sys.argv[1]))))' "$1"
}
chat() {   # the chat body of messages "role:text" ...
    python3 -c 'import json,sys; print(json.dumps({"model":"m","max_tokens":4,"messages":[{"role":a.split(":",1)[0],"content":a.split(":",1)[1]} for a in sys.argv[1:]]}))' "$@"
}

# 1. a planted http-0-* session with one exchange
as_nobody "$dir/pc" "$SOCK" open http-0-planted llama2 -- append http-0-planted user "hello" -- \
    append http-0-planted assistant "hi there" >"$dir/plant.out" ||
    bad "nobody could not plant: $(cat "$dir/plant.out")"
before=$(transcript http-0-planted "$N" | wc -l)
start_gateway
post 0 "$(chat "user:hello" "assistant:hi there" "user:my bank pin is 4711")"
[ "$code" = 200 ] && ok "root's request: 200" || bad "root: $code $out"
after=$(transcript http-0-planted "$N")
if printf '%s' "$after" | grep -q 4711 || [ "$(printf '%s\n' "$after" | wc -l)" != "$before" ]; then
    bad "nobody's planted session took root's turn: $after"
else
    ok "nobody's planted http-0-planted is untouched ($before turns)"
fi
mine=$(owners http-0- | tr ' ' '\n' | grep -v '^http-0-planted:' | grep ":0$" | head -1)
[ -n "$mine" ] && transcript "${mine%:0}" | grep -q 4711 &&
    ok "root's secret is in root's own session (${mine%:0})" || bad "root's session: $(owners http-)"
ROOTCONV=${mine%:0}

# 2. X-Llamad-Session in the gateway's namespace
post "$N" "$(chat "user:hello")" -H "X-Llamad-Session: http-0-x"
[ "$code" = 400 ] && printf '%s' "$out" | grep -q "gateway's own" &&
    ok "X-Llamad-Session: http-0-x is refused (400)" || bad "http-0-x: $code $out"
[ -z "$(owners http-0-x)" ] && ok "no session http-0-x was made" || bad "made: $(owners http-0-x)"

# 3. an explicit name both use
post "$N" "$(chat "user:nobody's line")" -H "X-Llamad-Session: shared-name"
[ "$code" = 200 ] || bad "nobody's explicit session: $code $out"
post 0 "$(chat "user:root's line 4711")" -H "X-Llamad-Session: shared-name"
[ "$code" = 200 ] || bad "root's explicit session: $code $out"
[ "$(owners shared-name)" = "shared-name:0 shared-name:$N" ] &&
    ok "X-Llamad-Session shared-name: one session for each caller" || bad "owners: $(owners shared-name)"
transcript shared-name "$N" | grep -q 4711 && bad "root's turn reached nobody's shared-name" ||
    ok "root's explicit session is root's, not nobody's"

# 4. nobody copies the name of root's conversation; the gateway restarts
as_nobody "$dir/pc" "$SOCK" open "$ROOTCONV" llama2 -- append "$ROOTCONV" user "hello" -- \
    append "$ROOTCONV" assistant "hi there" -- append "$ROOTCONV" user "my bank pin is 4711" \
    >"$dir/copy.out" || bad "nobody could not copy the name: $(cat "$dir/copy.out")"
nb=$(transcript "$ROOTCONV" "$N" | wc -l)
ans=$(transcript "$ROOTCONV" | tail -n 1)
start_gateway
post 0 "$(chat "user:hello" "assistant:hi there" "user:my bank pin is 4711" "assistant:$ans" "user:and the code 9922")"
[ "$code" = 200 ] || bad "root's next turn: $code $out"
transcript "$ROOTCONV" "$N" | grep -q 9922 && bad "root's next turn went into nobody's copy" ||
    { [ "$(transcript "$ROOTCONV" "$N" | wc -l)" = "$nb" ] && ok "nobody's copy of root's name is untouched"; }
transcript "$ROOTCONV" | grep -q 9922 && ok "root's conversation continued in root's session" ||
    bad "root's session: $(transcript "$ROOTCONV")"

# 5. what a connection acting for a uid lists
"$dir/pc" "$SOCK" hello-as 0 -- list >"$dir/list0"
grep -q "owner=$N" "$dir/list0" && bad "root acting for root lists nobody's: $(cat "$dir/list0")" ||
    ok "a connection acting for root lists root's sessions only"
"$dir/pc" "$SOCK" list >"$dir/listall"
grep -q "owner=$N" "$dir/listall" && ok "root's own connection still lists every user's" ||
    bad "root's list: $(cat "$dir/listall")"
"$dir/pc" "$SOCK" hello-as 0 -- info http-0-planted >"$dir/info0"
grep -q "UNKNOWN_SESSION\|unknown_session" "$dir/info0" &&
    ok "a connection acting for root does not find nobody's http-0-planted by name" ||
    bad "root acting for root: $(cat "$dir/info0")"

# 6. what Status and /metrics count: root (and llamad's own user) every
#    user's work, anyone else its own
st() {   # st UID KEY: a field of `llamactl --json status` as UID (null: not sent)
    if [ "$1" = 0 ]; then run=""; else run="setpriv --reuid=$1 --regid=$1 --clear-groups"; fi
    $run "$BUILD/llamactl" --socket "$SOCK" --json status |
        python3 -c 'import json,sys; d=json.load(sys.stdin); v=d
for k in sys.argv[1].split("."): v=v.get(k) if isinstance(v, dict) else None
print("null" if v is None else json.dumps(v))' "$2"
}
n_own=$(owners "" | tr ' ' '\n' | grep -c ":$N$")
[ "$(st "$N" own)" = true ] && [ "$(st "$N" sessions)" = "$n_own" ] &&
    [ "$(st "$N" connections)" = null ] && [ "$(st "$N" counters.errors)" = null ] &&
    [ "$(st "$N" counters.requests)" != null ] && [ "$(st "$N" rss_bytes)" = null ] &&
    ok "nobody's status: its own $n_own sessions and requests; connections, errors, RSS not sent" ||
    bad "nobody's status: own $(st "$N" own) sessions $(st "$N" sessions)/$n_own connections $(st "$N" connections) errors $(st "$N" counters.errors)"
[ "$(st 0 own)" = null ] && [ "$(st 0 connections)" != null ] && [ "$(st 0 sessions)" -gt "$n_own" ] &&
    ok "root's status: every user's ($(st 0 sessions) sessions)" || bad "root's status: $(st 0 own) $(st 0 sessions)"
metrics_as() {
    if [ "$1" = 0 ]; then run=""; else run="setpriv --reuid=$1 --regid=$1 --clear-groups"; fi
    $run curl -s --unix-socket "$HSOCK" http://x/metrics
}
metrics_as "$N" >"$dir/m.nobody"
metrics_as 0 >"$dir/m.root"
if ! grep -q '^llamad_http_requests_total' "$dir/m.nobody" && ! grep -q '^llamad_connections{' "$dir/m.nobody" &&
    grep -q "^llamad_sessions{model=\"m\"} $n_own\$" "$dir/m.nobody" &&
    grep -q '^llamad_http_requests_total' "$dir/m.root" && grep -q '^llamad_connections{' "$dir/m.root"; then
    ok "/metrics: nobody sees its own $n_own sessions, not the gateway's or llamad's totals; root sees them"
else
    bad "/metrics per caller: nobody: $(grep -c '^llamad' "$dir/m.nobody") lines, $(grep '^llamad_sessions' "$dir/m.nobody"); root: $(grep -c '^llamad' "$dir/m.root")"
fi

kill $gpid $pid
wait $gpid 2>/dev/null
echo "gateway_isolation: $([ "$fail" -eq 0 ] && echo all ok || echo FAILED)"
exit "$fail"
