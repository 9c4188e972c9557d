#!/bin/sh
# tests/integration/http_gateway.sh — llamad-http as programs nobody here
# wrote see it: the official OpenAI and Ollama npm clients (pinned in
# tests/http/package-lock.json, installed by tests/http/install.sh into
# $BUILD/http-node: a failed install fails this test) and curl.
# Two llamads on stories260K: "stories" (state dir), and "slow"
# (LLAMAD_TEST_STEP_DELAY_MS, no state) whose streams last long enough to
# be aborted; one llamad-http serves both (-m) on a Unix socket and on
# loopback TCP (a free port). Checks:
#  - tests/http/openai.mjs, ollama.mjs and long_chat.mjs (their headers
#    list their checks);
#  - curl on the Unix socket (--unix-socket): health, a chat answer; the
#    socket beside llamad's (http.sock) when no --listen is given;
#  - SSE framing (every event "data: JSON", a blank line after each, the
#    last "data: [DONE]"), Ollama's NDJSON (every line JSON, done only on
#    the last), their Content-Types;
#  - errors in each API's JSON form: 405 with Allow on a wrong method, 404
#    on an unknown path, 400 naming the problem for malformed JSON and for a
#    field of the wrong type, 413 for a body over --max-body;
#  - --listen on a non-loopback address refused without --allow-remote and
#    --token-file; a token file readable by others, or with a short token,
#    refused; with --token-file, 401 (WWW-Authenticate: Bearer) without a
#    token or with a wrong one, 200 with the right one; the Unix socket
#    needs none;
#  - --help names every option of main.c's getopt table, and only those;
#  - /health, /metrics (Prometheus text: llamad_up, llamad's counters, the
#    gateway's own);
#  - the gateway restarting: its index read back from llamad's sessions,
#    a conversation continues as it was
#  - llamad restarting under a running gateway: 503 with a JSON error
#    while it is down (llamad_up 0, /api/ps without it), answers again on
#    the same socket afterwards, a conversation continued across it;
#  - each gateway started stops on SIGTERM with exit status 0 (under
#    ASan, make test-asan: with nothing leaked).
# Env: BUILD (build folder), MODELS.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh
need_files "$BUILD/llamad" "$BUILD/llamactl" "$BUILD/llamad-http" "$MODELS/stories260K.bin" \
    "$MODELS/tok512.model"
NODEDIR=$BUILD/http-node
sh tests/http/install.sh "$NODEDIR" || exit 1
test_frame
GW=$BUILD/llamad-http
CTL=$BUILD/llamactl
SOCK=$dir/s
SLOW=$dir/slow
HSOCK=$dir/h.sock
MAXBODY=65536
checks=0

start_llamad() {
    "$BUILD/llamad" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
        --socket "$SOCK" --state-dir "$dir/state" --log-level warning 2>>"$dir/llamad.log" &
    pid=$!
    wait_socket "$SOCK" "$pid" "$dir/llamad.log"
}
start_llamad
LLAMAD_TEST_STEP_DELAY_MS=20 "$BUILD/llamad" --model "$MODELS/stories260K.bin" \
    --tokenizer "$MODELS/tok512.model" --socket "$SLOW" --state-dir none --log-level warning \
    2>>"$dir/slow.log" &
slow_pid=$!
pids="$slow_pid"
wait_socket "$SLOW" "$slow_pid" "$dir/slow.log"

# free_port: a loopback TCP port nobody listens on now
free_port() {
    node -e 'const s = require("net").createServer().listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); })'
}
# start_gw LOG SOCKET ARGS...: llamad-http with ARGS in the background (its
# pid in $gw_pid, added to $pids), waiting for its Unix socket SOCKET
# (listed after any TCP --listen, so that both are bound)
start_gw() {
    _log=$1 _sock=$2
    shift 2
    "$GW" "$@" 2>>"$_log" &
    gw_pid=$!
    pids="$pids $gw_pid"
    _i=0
    while [ ! -S "$_sock" ]; do
        _i=$((_i + 1))
        if [ "$_i" -gt 100 ] || ! kill -0 "$gw_pid" 2>/dev/null; then return 1; fi
        sleep 0.1
    done
}
# stop_gw PID LOG WHAT: SIGTERM to the gateway PID; ok if it exits 0 and
# says "stopped" in LOG (under ASan a leak makes the exit status non-zero)
stop_gw() {
    kill "$1"; wait "$1"; _rc=$?
    checks=$((checks + 1))
    if [ "$_rc" -eq 0 ] && grep -q 'stopped$' "$2"; then ok "$3: SIGTERM stops it, exit 0"
    else bad "$3: exit $_rc after SIGTERM: $(grep -v '^<' "$2" | head -20)"; fi
}
# the gateway on a free port (another program may take it first: 3 tries)
tries=0
while :; do
    PORT=$(free_port)
    start_gw "$dir/gw.log" "$HSOCK" -m "stories=$SOCK" -m "slow=$SLOW" --listen "127.0.0.1:$PORT" \
        --listen "$HSOCK" --max-body "$MAXBODY" && break
    tries=$((tries + 1))
    if [ "$tries" -ge 3 ]; then echo "FAIL: llamad-http did not start"; cat "$dir/gw.log"; exit 1; fi
done
main_gw=$gw_pid
URL=http://127.0.0.1:$PORT
echo "llamad-http on $URL and $HSOCK; llamads on $SOCK, $SLOW (slowed)"

# ---- the npm clients -----------------------------------------------------------------
for js in openai ollama long_chat; do
    echo "-- tests/http/$js.mjs"
    if GW_URL=$URL GW_MODEL=stories GW_SOCKET=$SOCK GW_SLOW_MODEL=slow GW_SLOW_SOCKET=$SLOW LLAMACTL=$CTL \
        timeout 300 node "$NODEDIR/$js.mjs" >"$dir/$js.out" 2>&1; then
        cat "$dir/$js.out"
    else
        cat "$dir/$js.out"
        bad "tests/http/$js.mjs failed (exit status or FAIL lines above)"
    fi
    n=$(grep -c '^ok ' "$dir/$js.out")
    checks=$((checks + n))
done
echo "-- curl"
# llamactl sessions: the gateway's conversations counted, listed with --all
"$CTL" --socket "$SOCK" sessions >"$dir/ls" 2>&1
"$CTL" --socket "$SOCK" sessions --all >"$dir/ls-all" 2>&1
nh=$(grep -c '^http-' "$dir/ls-all")
checks=$((checks + 1))
if [ "$nh" -gt 0 ] && ! grep -q '^http-' "$dir/ls" &&
    grep -qx "(and $nh conversations of llamad-http: --all lists them)" "$dir/ls"; then
    ok "llamactl sessions: the gateway's $nh conversations counted on a last line; --all lists them"
else
    bad "llamactl sessions: $(tail -3 "$dir/ls"); --all: $nh http- sessions"
fi

# ---- helpers ------------------------------------------------------------------------
# req [CURL ARGS...]: the status code; the body in $dir/body, headers in $dir/hdr
req() {
    curl -s -o "$dir/body" -D "$dir/hdr" -w '%{http_code}' --max-time 30 "$@"
}
# jtest FILE EXPR: whether the JavaScript EXPR holds for j, FILE parsed as JSON
jtest() {
    node -e 'const fs = require("fs"); let j; try { j = JSON.parse(fs.readFileSync(process.argv[1], "utf8")); }
        catch (e) { process.exit(1); } process.exit((0, eval)("(j) => (" + process.argv[2] + ")")(j) ? 0 : 1);' "$1" "$2"
}
# expect WHAT STATUS GOT JS: ok when GOT is STATUS and the body satisfies JS
expect() {
    checks=$((checks + 1))
    if [ "$3" = "$2" ] && jtest "$dir/body" "$4"; then ok "$1"; else bad "$1: status $3, body $(head -c 400 "$dir/body")"; fi
}
header() { tr -d '\r' <"$dir/hdr" | sed -n "s/^$1: //Ip" | head -1; }
# the JSON error forms: OpenAI's {"error":{"message","type",...}}, Ollama's {"error":"..."}
OAI_ERR='typeof j.error === "object" && typeof j.error.message === "string" && typeof j.error.type === "string" && "param" in j.error && "code" in j.error'
OLL_ERR='typeof j.error === "string" && Object.keys(j).length === 1'
chat='{"model":"stories","messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":8,"temperature":0}'

# ---- the Unix socket --------------------------------------------------------------------
st=$(req --unix-socket "$HSOCK" http://gw/health)
expect "GET /health on the Unix socket: {\"status\":\"ok\"}" 200 "$st" 'j.status === "ok"'
st=$(req --unix-socket "$HSOCK" http://gw/v1/chat/completions -H 'Content-Type: application/json' -d "$chat")
expect "a chat completion over the Unix socket" 200 "$st" \
    'j.object === "chat.completion" && j.choices[0].message.content.length > 0 && j.usage.completion_tokens === 8'
# no --listen: the socket beside llamad's, named after it
start_gw "$dir/gw-default.log" "$dir/http.sock" --socket "$SOCK"
st=$(req --unix-socket "$dir/http.sock" http://gw/v1/models)
expect "no --listen: http.sock beside llamad's socket, serving --name's default (llamad)" 200 "$st" \
    'j.data.length === 1 && j.data[0].id === "llamad"'
stop_gw "$gw_pid" "$dir/gw-default.log" "llamad-http without --listen"
# --instances: a model per DIR/NAME.conf, served from NAME.sock beside --socket
mkdir -p "$dir/conf.d"
: >"$dir/conf.d/llamad.conf"; : >"$dir/conf.d/slow.conf"; : >"$dir/conf.d/notes.txt"
ln -s "$SLOW" "$dir/slow.sock"
start_gw "$dir/gw-inst.log" "$dir/inst.sock" --socket "$SOCK" --instances="$dir/conf.d" --listen "$dir/inst.sock"
st=$(req --unix-socket "$dir/inst.sock" http://gw/v1/models)
expect "--instances: llamad (--socket) and slow (conf.d/slow.conf); llamad.conf and notes.txt are not models" 200 "$st" \
    'j.data.map((m) => m.id).join(",") === "llamad,slow"'
st=$(req --unix-socket "$dir/inst.sock" http://gw/v1/chat/completions -d '{"model":"slow","messages":[{"role":"user","content":"hi"}],"max_tokens":3}')
expect "--instances: a request for slow is answered by the llamad at slow.sock" 200 "$st" 'j.usage.completion_tokens === 3'
stop_gw "$gw_pid" "$dir/gw-inst.log" "llamad-http --instances"

# ---- streamed framing -------------------------------------------------------------------
sse='{"model":"stories","messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":10,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}'
st=$(req -N "$URL/v1/chat/completions" -d "$sse")
checks=$((checks + 1))
if [ "$st" = 200 ] && node -e '
    const die = (m) => { console.log(m); process.exit(1); }; process.on("uncaughtException", (e) => die(e.message));
    const t = require("fs").readFileSync(process.argv[1], "utf8");
    if (!t.endsWith("\n\n")) die("the stream does not end with a blank line");
    const ev = t.slice(0, -2).split("\n\n");
    if (ev.at(-1) !== "data: [DONE]") die("the last event is not data: [DONE]: " + ev.at(-1));
    let text = "", usage = null;
    for (const e of ev.slice(0, -1)) {
        if (!e.startsWith("data: ") || e.includes("\n")) die("not one data line: " + e);
        const o = JSON.parse(e.slice(6));
        if (o.object !== "chat.completion.chunk") die("object " + o.object);
        if (o.usage) usage = o.usage; else text += o.choices[0].delta.content || "";
    }
    if (!usage || usage.completion_tokens !== 10 || !text) die("no usage or no text");
    console.log(ev.length + " events");' "$dir/body" >"$dir/sse.out" 2>&1 &&
    header Content-Type | grep -q '^text/event-stream'; then
    ok "SSE: each event one \"data: JSON\" line and a blank line, the last data: [DONE] ($(cat "$dir/sse.out")), text/event-stream"
else
    bad "SSE framing: status $st, $(header Content-Type), $(tail -3 "$dir/sse.out"); body: $(head -c 600 "$dir/body")"
fi
for route in chat generate; do
    if [ $route = chat ]; then
        body='{"model":"stories","messages":[{"role":"user","content":"Once upon a time"}],"options":{"num_predict":10,"temperature":0}}'
    else
        body='{"model":"stories","prompt":"Once upon a time","options":{"num_predict":10,"temperature":0}}'
    fi
    st=$(req -N "$URL/api/$route" -d "$body")
    checks=$((checks + 1))
    if [ "$st" = 200 ] && node -e '
        const die = (m) => { console.log(m); process.exit(1); }; process.on("uncaughtException", (e) => die(e.message));
        const t = require("fs").readFileSync(process.argv[1], "utf8");
        if (!t.endsWith("\n")) die("the last line is not ended");
        const ls = t.slice(0, -1).split("\n").map((l) => JSON.parse(l));
        ls.forEach((o, i) => { if (o.done !== (i === ls.length - 1)) die("done on line " + i); });
        if (ls.at(-1).eval_count !== 10) die("eval_count " + ls.at(-1).eval_count);
        console.log(ls.length + " lines");' "$dir/body" >"$dir/nd.out" 2>&1 &&
        header Content-Type | grep -q '^application/x-ndjson'; then
        ok "Ollama /api/$route streams by default: NDJSON, every line JSON, done on the last only ($(cat "$dir/nd.out"))"
    else
        bad "/api/$route NDJSON: status $st, $(header Content-Type), $(tail -3 "$dir/nd.out"); body: $(head -c 600 "$dir/body")"
    fi
done

# ---- errors -------------------------------------------------------------------------------
st=$(req "$URL/v1/chat/completions")
expect "GET /v1/chat/completions: 405, OpenAI's error form" 405 "$st" "$OAI_ERR && j.error.message.includes('POST')"
allow=$(header Allow); checks=$((checks + 1))
[ "$allow" = POST ] && ok "405 says Allow: POST" || bad "405 Allow: '$allow'"
st=$(req -X POST "$URL/api/tags")
expect "POST /api/tags: 405, Ollama's error form" 405 "$st" "$OLL_ERR && j.error.includes('GET')"
st=$(req "$URL/v1/nothing-here")
expect "unknown path /v1/nothing-here: 404 naming it, OpenAI's form, type not_found_error" 404 "$st" \
    "$OAI_ERR && j.error.type === 'not_found_error' && j.error.message.includes('/v1/nothing-here')"
st=$(req "$URL/api/nothing-here")
expect "unknown path /api/nothing-here: 404 in Ollama's form" 404 "$st" "$OLL_ERR && j.error.includes('/api/nothing-here')"
st=$(req "$URL/v1/chat/completions" -d '{"model": "stories", "messages": [')
expect "malformed JSON: 400 saying the body is not JSON" 400 "$st" \
    "$OAI_ERR && j.error.type === 'invalid_request_error' && j.error.message.includes('not JSON')"
st=$(req "$URL/api/chat" -d '{"model": "stories",, }')
expect "malformed JSON on /api/chat: 400 in Ollama's form" 400 "$st" "$OLL_ERR && j.error.includes('not JSON')"
st=$(req "$URL/v1/chat/completions" -d '{"model":"stories","messages":[{"role":"user","content":"hi"}],"temperature":"hot"}')
expect "\"temperature\": \"hot\": 400 naming temperature" 400 "$st" "$OAI_ERR && j.error.message.includes(\"'temperature'\")"
st=$(req "$URL/v1/chat/completions" -d '{"model":"stories","messages":"hi"}')
expect "\"messages\": \"hi\": 400 naming messages" 400 "$st" "$OAI_ERR && j.error.message.includes(\"'messages'\")"
st=$(req "$URL/v1/completions" -d '{"model":"stories","prompt":"x","max_tokens":"many"}')
expect "\"max_tokens\": \"many\": 400 naming max_tokens" 400 "$st" "$OAI_ERR && j.error.message.includes(\"'max_tokens'\")"
# a body over --max-body
node -e 'process.stdout.write(JSON.stringify({ model: "stories", messages: [{ role: "user", content: "x".repeat(Number(process.argv[1]) * 2) }] }))' \
    "$MAXBODY" >"$dir/big.json"
st=$(req "$URL/v1/chat/completions" -H 'Content-Type: application/json' --data-binary @"$dir/big.json")
checks=$((checks + 1))
if [ "$st" != 413 ]; then
    bad "a body of $(wc -c <"$dir/big.json") bytes over --max-body $MAXBODY: status $st"
elif jtest "$dir/body" 'true'; then
    jtest "$dir/body" "$OAI_ERR" && ok "a body over --max-body: 413 with OpenAI's error form" ||
        bad "413's JSON body is not OpenAI's error form: $(head -c 300 "$dir/body")"
else
    bad "a body over --max-body: 413 but not JSON: $(head -c 300 "$dir/body")"
fi
st=$(req "$URL/api/chat" -H 'Content-Type: application/json' --data-binary @"$dir/big.json")
expect "a body over --max-body on /api/chat: 413 in Ollama's form, naming --max-body" 413 "$st" \
    "$OLL_ERR && j.error.includes('--max-body')"
st=$(req --unix-socket "$HSOCK" http://gw/v1/chat/completions -H 'Expect:' --data-binary @"$dir/big.json")
expect "the same over the Unix socket without Expect: 100-continue: 413, OpenAI's form" 413 "$st" "$OAI_ERR"
st=$(req "$URL/v1/chat/completions" -d "$chat")
expect "after the 413s the gateway answers" 200 "$st" 'j.usage.completion_tokens === 8'
st=$(req -H 'Transfer-Encoding: chunked' "$URL/v1/chat/completions" --data-binary @"$dir/big.json")
checks=$((checks + 1))
[ "$st" = 413 ] && ok "a chunked body over --max-body: 413 (libevent's own count; its HTML page)" ||
    bad "a chunked body over --max-body: status $st"

# ---- options: remote listening and tokens ----------------------------------------------
# refused ARGS...: llamad-http with ARGS, which should exit at once (a
# gateway that starts instead is stopped after 5 s: exit status 124)
refused() { timeout 5 "$GW" "$@"; }
refused  --socket "$SOCK" --listen "0.0.0.0:$(free_port)" >"$dir/remote.out" 2>&1; rc=$?
checks=$((checks + 1))
[ "$rc" -ne 0 ] && grep -q 'not a loopback address' "$dir/remote.out" &&
    ok "--listen 0.0.0.0:PORT is refused without --allow-remote (exit $rc: $(cat "$dir/remote.out"))" ||
    bad "--listen 0.0.0.0 without --allow-remote: exit $rc, $(cat "$dir/remote.out")"
refused  --socket "$SOCK" --listen "0.0.0.0:$(free_port)" --allow-remote >"$dir/remote.out" 2>&1; rc=$?
checks=$((checks + 1))
[ "$rc" -ne 0 ] && grep -q 'needs --token-file' "$dir/remote.out" &&
    ok "--allow-remote without --token-file is refused" || bad "--allow-remote alone: exit $rc, $(cat "$dir/remote.out")"
TOKEN=tok-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
printf '# callers\n%s %s\n' "$TOKEN" "$(id -u)" >"$dir/tokens"
chmod 0644 "$dir/tokens"
refused  --socket "$SOCK" --listen "127.0.0.1:$(free_port)" --token-file "$dir/tokens" >"$dir/tok.out" 2>&1; rc=$?
checks=$((checks + 1))
[ "$rc" -ne 0 ] && grep -q 'readable by others' "$dir/tok.out" && ok "a token file readable by others is refused" ||
    bad "token file mode 0644: exit $rc, $(cat "$dir/tok.out")"
printf 'short-token %s\n' "$(id -u)" >"$dir/short"
chmod 0600 "$dir/short" "$dir/tokens"
refused  --socket "$SOCK" --listen "127.0.0.1:$(free_port)" --token-file "$dir/short" >"$dir/tok.out" 2>&1; rc=$?
checks=$((checks + 1))
[ "$rc" -ne 0 ] && grep -q 'fewer than 16' "$dir/tok.out" && ok "a token of fewer than 16 characters is refused" ||
    bad "short token: exit $rc, $(cat "$dir/tok.out")"
tries=0
while :; do
    TPORT=$(free_port)
    start_gw "$dir/gw-tok.log" "$dir/tok.sock" --socket "$SOCK" --name stories --listen "0.0.0.0:$TPORT" \
        --allow-remote --token-file "$dir/tokens" --listen "$dir/tok.sock" && break
    tries=$((tries + 1))
    [ "$tries" -ge 3 ] && { bad "llamad-http with --token-file did not start: $(cat "$dir/gw-tok.log")"; break; }
done
tok_pid=$gw_pid
st=$(req "http://127.0.0.1:$TPORT/v1/models")
expect "--token-file: no Authorization: 401 in OpenAI's form, type authentication_error" 401 "$st" \
    "$OAI_ERR && j.error.type === 'authentication_error'"
checks=$((checks + 1))
[ "$(header WWW-Authenticate)" = Bearer ] && ok "401 says WWW-Authenticate: Bearer" ||
    bad "401 WWW-Authenticate: '$(header WWW-Authenticate)'"
st=$(req -H "Authorization: Bearer ${TOKEN}x" "http://127.0.0.1:$TPORT/v1/models")
expect "--token-file: a wrong bearer token: 401" 401 "$st" "$OAI_ERR && j.error.message.includes('not known')"
st=$(req -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$TPORT/api/tags")
expect "--token-file: the right token: /api/tags answers" 200 "$st" 'j.models[0].name === "stories:latest"'
st=$(req -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$TPORT/v1/chat/completions" -d "$chat")
expect "--token-file: the right token: a chat answer" 200 "$st" 'j.choices[0].message.content.length > 0'
st=$(req --unix-socket "$dir/tok.sock" http://gw/v1/chat/completions -d "$chat")
expect "--token-file: the Unix socket needs no token (the peer's uid)" 200 "$st" 'j.usage.completion_tokens === 8'
stop_gw "$tok_pid" "$dir/gw-tok.log" "llamad-http with --token-file"

# ---- --help, /health, /metrics --------------------------------------------------------------
"$GW" --help >"$dir/help" 2>&1; rc=$?
# the long options of main.c's getopt_long table, and its short ones
longs=$(sed -n '/struct option opts\[\]/,/{ 0 }/p' gateway/main.c | sed -n 's/.*{ "\([a-z-]*\)".*/\1/p')
shorts=$(sed -n 's/.*getopt_long(argc, argv, "\([^"]*\)".*/\1/p' gateway/main.c | tr -d ':' | sed 's/./& /g')
missing=
for o in $longs; do grep -q -- "--$o\([^a-z-]\|$\)" "$dir/help" || missing="$missing --$o"; done
for o in $shorts; do grep -q -- "-$o, --" "$dir/help" || missing="$missing -$o"; done
extra=
for o in $(grep -o -- '--[a-z][a-z-]*' "$dir/help" | sort -u); do
    case " $(echo "$longs" | tr '\n' ' ') " in *" ${o#--} "*) ;; *) extra="$extra $o" ;; esac
done
checks=$((checks + 1))
if [ "$rc" -eq 0 ] && [ "$(echo "$longs" | wc -w)" -ge 10 ] && [ -z "$missing" ] && [ -z "$extra" ]; then
    ok "--help names all $(echo "$longs" | wc -w) long and $(echo "$shorts" | wc -w) short options of the getopt table, and no other"
else
    bad "--help (exit $rc): not named:$missing; named but not in the table:$extra"
fi
"$GW" --version >"$dir/version" 2>&1; checks=$((checks + 1))
grep -q '^llamad-http [0-9]' "$dir/version" && ok "--version: $(cat "$dir/version")" || bad "--version: $(cat "$dir/version")"
"$GW" --no-such-option >/dev/null 2>&1; rc=$?; checks=$((checks + 1))
[ "$rc" -eq 2 ] && ok "an unknown option: exit 2" || bad "an unknown option: exit $rc"
st=$(req "$URL/health")
expect "GET /health on TCP" 200 "$st" 'j.status === "ok"'
st=$(req "$URL/metrics")
checks=$((checks + 1))
if [ "$st" = 200 ] && header Content-Type | grep -q '^text/plain; version=0.0.4' &&
    grep -q '^llamad_up{model="stories"} 1$' "$dir/body" && grep -q '^llamad_up{model="slow"} 1$' "$dir/body" &&
    grep -q '^llamad_generated_tokens_total{model="stories"} [1-9]' "$dir/body" &&
    grep -q '^# TYPE llamad_http_requests_total counter$' "$dir/body" &&
    grep -q '^llamad_http_requests_total [1-9]' "$dir/body" &&
    grep -q '^llamad_http_client_errors_total [1-9]' "$dir/body" &&
    ! grep -v '^#' "$dir/body" | grep -v '^[a-z_]*\({[^}]*}\)\? [-+0-9.eE]*\(Inf\)\?$' | grep -q .; then
    ok "GET /metrics: Prometheus text; llamad_up 1 for both models, llamad's and the gateway's counters"
else
    bad "/metrics: status $st, $(header Content-Type): $(grep -v '^#' "$dir/body" | head -20)"
fi

# ---- a client that goes away while waiting for an answer not streamed ------------------------
mval() { curl -s --unix-socket "$HSOCK" http://x/metrics | sed -n "s/^$1 //p"; }
c0=$(mval llamad_http_cancelled_total)
g0=$("$CTL" --socket "$SLOW" --json status | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).counters.generated_tokens||0))')
curl -s --max-time 1 --unix-socket "$HSOCK" http://x/v1/completions \
    -d '{"model":"slow","prompt":"Once upon a time","max_tokens":400}' >/dev/null 2>&1
sleep 1.5
c1=$(mval llamad_http_cancelled_total)
g1=$("$CTL" --socket "$SLOW" --json status | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).counters.generated_tokens||0))')
checks=$((checks + 1))
if [ "$c1" -eq $((c0 + 1)) ] && [ $((g1 - g0)) -lt 300 ]; then
    ok "a client gone while waiting for a whole answer cancels it ($((g1 - g0)) of 400 tokens generated)"
else
    bad "non-streamed client gone: cancelled $c0 -> $c1, tokens generated $((g1 - g0))"
fi

# ---- llamad restarting under the gateway -------------------------------------------------------
t1='{"model":"stories","messages":[{"role":"user","content":"Tim the cat was sleepy."}],"max_tokens":12,"temperature":0}'
st=$(req "$URL/v1/chat/completions" -d "$t1")
a1=$(node -e 'console.log(JSON.stringify(JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).choices[0].message.content))' "$dir/body")
kill "$pid"; wait "$pid" 2>/dev/null
st=$(req "$URL/v1/chat/completions" -d "$chat")
expect "llamad stopped: 503 in OpenAI's form (type server_error) naming its socket" 503 "$st" \
    "$OAI_ERR && j.error.type === 'server_error' && j.error.message.includes('$SOCK')"
st=$(req "$URL/api/generate" -d '{"model":"stories","prompt":"hi","stream":false}')
expect "llamad stopped: /api/generate 503 in Ollama's form" 503 "$st" "$OLL_ERR"
st=$(req "$URL/api/ps")
expect "llamad stopped: /api/ps lists only the model whose llamad answers" 200 "$st" \
    'j.models.length === 1 && j.models[0].name === "slow:latest"'
st=$(req "$URL/metrics"); checks=$((checks + 1))
grep -q '^llamad_up{model="stories"} 0$' "$dir/body" && grep -q '^llamad_up{model="slow"} 1$' "$dir/body" &&
    ok "llamad stopped: /metrics says llamad_up 0 for it, 1 for the other" ||
    bad "/metrics while llamad is down: $(grep llamad_up "$dir/body")"
start_llamad
st=$(req "$URL/v1/chat/completions" -d "$chat")
expect "llamad started again on the same socket: the gateway (not restarted) answers" 200 "$st" \
    'j.usage.completion_tokens === 8'
# prefilled: llamad's count of tokens it ran through the model (max_tokens 1
# below, so that no decoding adds to it): cached_tokens must be the prompt
# tokens less what it computed for the request
prefilled() {
    "$CTL" --socket "$SOCK" --json status | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).counters.prefilled_tokens||0))'
}
before=$(curl -s "$URL/metrics" | sed -n 's/^llamad_http_conversations_continued_total //p')
t2="{\"model\":\"stories\",\"messages\":[{\"role\":\"user\",\"content\":\"Tim the cat was sleepy.\"},{\"role\":\"assistant\",\"content\":$a1},{\"role\":\"user\",\"content\":\"Where did he sleep?\"}],\"max_tokens\":1,\"temperature\":0}"
p0=$(prefilled)
st=$(req "$URL/v1/chat/completions" -d "$t2")
p1=$(prefilled)
after=$(curl -s "$URL/metrics" | sed -n 's/^llamad_http_conversations_continued_total //p')
expect "a conversation begun before the restart continues its saved session (cached tokens = prompt - $((p1 - p0)) llamad computed; continued $before -> $after)" \
    200 "$st" "j.usage.prompt_tokens_details.cached_tokens >= 12 && j.usage.prompt_tokens_details.cached_tokens === j.usage.prompt_tokens - $((p1 - p0)) && $after === $before + 1"
checks=$((checks + 1))
kill -0 "$main_gw" 2>/dev/null && ok "the gateway ran through it all (pid $main_gw)" || bad "the gateway is gone"
# after aborted streams, errors, 413s and a llamad restart
stop_gw "$main_gw" "$dir/gw.log" "llamad-http after all of the above"

# ---- the gateway restarting: its index is read back from llamad ------------------------------
a2=$(node -e 'console.log(JSON.stringify(JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).choices[0].message.content))' "$dir/body")
rm -f "$HSOCK"
start_gw "$dir/gw2.log" "$HSOCK" -m "stories=$SOCK" -m "slow=$SLOW" --listen "127.0.0.1:$PORT" --listen "$HSOCK" ||
    { bad "the gateway did not start again"; cat "$dir/gw2.log"; }
t3="{\"model\":\"stories\",\"messages\":[{\"role\":\"user\",\"content\":\"Tim the cat was sleepy.\"},{\"role\":\"assistant\",\"content\":$a1},{\"role\":\"user\",\"content\":\"Where did he sleep?\"},{\"role\":\"assistant\",\"content\":$a2},{\"role\":\"user\",\"content\":\"And then?\"}],\"max_tokens\":1,\"temperature\":0}"
p0=$(prefilled)
st=$(req "$URL/v1/chat/completions" -d "$t3")
p1=$(prefilled)
m=$(curl -s "$URL/metrics")
cont=$(echo "$m" | sed -n 's/^llamad_http_conversations_continued_total //p')
new=$(echo "$m" | sed -n 's/^llamad_http_conversations_new_total //p')
expect "a new gateway continues a conversation of the old one (index read back: continued $cont, new $new; cached = prompt - $((p1 - p0)) computed)" \
    200 "$st" "j.usage.prompt_tokens_details.cached_tokens >= 20 && j.usage.prompt_tokens_details.cached_tokens === j.usage.prompt_tokens - $((p1 - p0)) && $cont === 1 && $new === 0"
stop_gw "$gw_pid" "$dir/gw2.log" "the restarted llamad-http"

echo "http_gateway: $checks checks"
if [ "$fail" -ne 0 ]; then
    echo "--- llamad-http's log"; tail -20 "$dir/gw.log"
fi
exit "$fail"
