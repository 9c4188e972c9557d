#!/bin/sh
# tests/integration/gateway_limits.sh — llamad-http against callers that
# send too much, too slowly or too often (gateway/conn.c, reqscan.c):
#
#  - a 4 MiB header line: 431 in OpenAI's JSON form, at once, and the
#    gateway's CPU time for it under 0.5 s (before: parsed again from its
#    start on every read, 32 MiB cost 7.4 s and was answered 200);
#    100+ header lines: 431; a header over --max-header-size on /api/:
#    431 in Ollama's form;
#  - a NUL byte in a header: 400 (before: "Bearer TOKEN\0junk" passed as
#    TOKEN); on TCP with --token-file, the right token still 200;
#  - Content-Length with Transfer-Encoding, or twice: 400; a chunked body
#    is read as chunks and answered;
#  - a head trickled a byte each 0.3 s: 408 and closed at --header-timeout
#    (2 s) from its first byte, not later than 3.5 s; a body that stops
#    halfway: 408 too;
#  - --max-caller-connections 8: uid 65534 (nobody) opens 40 idle
#    connections, 8 are held and the rest get 429 in JSON; root's /health
#    meanwhile answers in under 1 s; once nobody's connections have gone,
#    nobody is served again;
#  - twelve chats of nobody one after another, each on a connection of
#    its own: all answered (each connection, a generation's too, is
#    counted out when it closes);
#  - /metrics counts them (llamad_http_connections_refused_total,
#    _cut_total, _heads_refused_total), and llamad_http_connections is
#    back to the one asking once the callers are gone;
#  - the limits' options out of range, not numbers, or negative: refused
#    by name with the range.
#
# Needs python3; the per-caller part needs root (setpriv), else skipped.
# Env: BUILD (build folder), MODELS.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh
need_files "$BUILD/llamad" "$BUILD/llamad-http" "$MODELS/stories260K.bin" "$MODELS/tok512.model"
command -v python3 >/dev/null 2>&1 || { echo "FAIL: python3 is missing"; exit 1; }

test_frame 755
SOCK=$dir/llamad.sock HSOCK=$dir/http.sock
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$BUILD/llamad" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
    --socket "$SOCK" --state-dir none --socket-mode 0666 --max-tokens 4 --temperature 0 \
    2>"$dir/llamad.log" &
pid=$!
wait_socket "$SOCK" "$pid" "$dir/llamad.log" 30
TOK=limits-token-0123456789
printf '%s %s\n' "$TOK" "$(id -u)" >"$dir/tokens"
chmod 0600 "$dir/tokens"
"$BUILD/llamad-http" --socket "$SOCK" --name m --listen "$HSOCK" --socket-mode 0666 \
    --listen "127.0.0.1:$PORT" --token-file "$dir/tokens" --header-timeout 2 \
    --max-caller-connections 8 --max-header-size 16384 -v 2>"$dir/http.log" &
gpid=$!
pids=$gpid
for i in $(seq 50); do [ -S "$HSOCK" ] && break; sleep 0.1; done
[ -S "$HSOCK" ] || { bad "the gateway did not start: $(cat "$dir/http.log")"; exit 1; }

# a raw client: python3 raw.py unix|tcp STEP... (see below); prints what it saw
cat >"$dir/raw.py" <<'EOF'
import json, os, socket, sys, time
where, port, what = sys.argv[1], sys.argv[2], sys.argv[3]
def conn():
    if where == "unix":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.connect(port)
    else:
        s = socket.create_connection(("127.0.0.1", int(port)))
    s.settimeout(10)
    return s
def reply(s):
    data = b""
    try:
        while True:
            b = s.recv(65536)
            if not b: break
            data += b
            if b"\r\n\r\n" in data:
                head, body = data.split(b"\r\n\r\n", 1)
                n = [int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")]
                if n and len(body) >= n[0]: break
    except (socket.timeout, ConnectionResetError, BrokenPipeError):
        pass
    head, _, body = data.partition(b"\r\n\r\n")
    status = head.split(b" ")[1].decode() if head.startswith(b"HTTP/") else "none"
    return status, body.decode(errors="replace")
def cpu():
    f = open("/proc/%s/stat" % os.environ["GPID"]).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
def send_all(s, data):
    try: s.sendall(data)
    except (BrokenPipeError, ConnectionResetError): pass
body = b'{"model":"m","messages":[{"role":"user","content":"Hi"}]}'
if what == "bigheader":
    c0 = cpu(); s = conn()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Big: ")
    t0 = time.time()
    chunk = b"a" * 65536
    for i in range(64):
        send_all(s, chunk)
    st, b = reply(s)
    print(st, "%.2f" % (cpu() - c0), json.loads(b)["error"]["message"] if b.startswith("{") else b[:80])
elif what == "manylines":
    s = conn()
    s.sendall(b"GET /health HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(120)) + b"\r\n")
    st, b = reply(s); print(st, b.strip())
elif what == "ollamahead":
    s = conn()
    s.sendall(b"POST /api/chat HTTP/1.1\r\nX-Big: " + b"b" * 20000 + b"\r\n\r\n")
    st, b = reply(s); print(st, b.strip())
elif what == "nul":
    s = conn()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
              sys.argv[4].encode() + b"\x00junk\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    st, b = reply(s); print(st, b.strip())
elif what == "token":
    s = conn()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
              sys.argv[4].encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    st, b = reply(s); print(st)
elif what == "ambiguous":
    for extra in (b"Transfer-Encoding: chunked\r\n", b"Content-Length: %d\r\n" % len(body)):
        s = conn()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\n" % len(body) + extra + b"\r\n" + body)
        st, b = reply(s); print(st, end=" ")
    print()
elif what == "chunked":
    s = conn()
    half = len(body) // 2
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" +
              b"%x\r\n" % half + body[:half] + b"\r\n" + b"%x\r\n" % (len(body) - half) + body[half:] + b"\r\n0\r\n\r\n")
    st, b = reply(s); print(st, "choices" in b)
elif what == "trickle":
    s = conn(); t0 = time.time(); st = "none"
    head = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"s" * 100 + b"\r\n\r\n"
    for i in range(len(head)):
        try:
            s.send(head[i:i + 1])
        except (BrokenPipeError, ConnectionResetError):
            break
        time.sleep(0.3)
        s.setblocking(False)
        try:
            data = s.recv(4096)
            if data or data == b"":
                st = data.split(b" ")[1].decode() if data.startswith(b"HTTP/") else "closed"
                break
        except BlockingIOError:
            pass
        finally:
            s.setblocking(True)
    print(st, "%.1f" % (time.time() - t0))
elif what == "stalledbody":
    s = conn(); t0 = time.time()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:10])
    st, b = reply(s); print(st, "%.1f" % (time.time() - t0))
elif what == "hold":
    # hold N connections for S seconds; print how many got 429 at once
    n, secs = int(sys.argv[4]), float(sys.argv[5])
    socks = [conn() for i in range(n)]
    time.sleep(0.5)
    refused = 0
    for s in socks:
        s.setblocking(False)
        try:
            d = s.recv(4096)
            if d.startswith(b"HTTP/1.1 429") and b'"error"' in d: refused += 1
        except BlockingIOError:
            pass
    print(refused, flush=True)
    time.sleep(secs)
elif what == "health":
    # N /health requests one after another: the slowest's seconds
    worst = 0
    for i in range(int(sys.argv[4])):
        t0 = time.time(); s = conn()
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        st, b = reply(s)
        if st != "200": worst = 99
        worst = max(worst, time.time() - t0); time.sleep(0.1)
    print("%.3f" % worst)
EOF
raw() { GPID=$gpid python3 "$dir/raw.py" "$@"; }
metric() { curl -s --unix-socket "$HSOCK" http://x/metrics | sed -n "s/^$1 //p"; }

set -- $(raw unix "$HSOCK" bigheader)
[ "$1" = 431 ] && python3 -c "import sys; sys.exit(float(sys.argv[1]) >= 0.5)" "$2" &&
    ok "a 4 MiB header line: 431 ($*), the gateway's CPU for it $2 s" || bad "a 4 MiB header line: $*"
out=$(raw unix "$HSOCK" manylines)
case $out in "431 "*"header lines"*) ok "120 header lines: 431";; *) bad "120 header lines: $out";; esac
out=$(raw unix "$HSOCK" ollamahead)
case $out in "431 "*'"error":"the request head is over 16384 bytes'*) ok "a head over --max-header-size on /api/: 431 in Ollama's form";;
    *) bad "/api/ head: $out";; esac
out=$(raw tcp "$PORT" nul "$TOK")
case $out in "400 "*NUL*) ok "a NUL byte after the bearer token: 400";; *) bad "NUL in a header: $out";; esac
out=$(raw tcp "$PORT" token "$TOK")
[ "$out" = 200 ] && ok "the token alone: 200" || bad "the token: $out"
out=$(raw unix "$HSOCK" ambiguous)
[ "$out" = "400 400 " ] && ok "Content-Length with Transfer-Encoding, or twice: 400" || bad "ambiguous: $out"
out=$(raw unix "$HSOCK" chunked)
[ "$out" = "200 True" ] && ok "a chunked body: read and answered" || bad "chunked: $out"
set -- $(raw unix "$HSOCK" trickle)
[ "$1" = 408 ] && python3 -c "import sys; sys.exit(not 1.9 <= float(sys.argv[1]) <= 3.5)" "$2" &&
    ok "a head trickled a byte each 0.3 s: 408 after $2 s (--header-timeout 2)" || bad "trickle: $*"
set -- $(raw unix "$HSOCK" stalledbody)
[ "$1" = 408 ] && python3 -c "import sys; sys.exit(not 1.9 <= float(sys.argv[1]) <= 3.5)" "$2" &&
    ok "a body that stops halfway: 408 after $2 s" || bad "stalled body: $*"

if [ "$(id -u)" -eq 0 ] && getent passwd nobody >/dev/null && command -v setpriv >/dev/null; then
    N=$(id -u nobody)
    setpriv --reuid="$N" --regid="$N" --clear-groups env GPID=$gpid python3 "$dir/raw.py" unix "$HSOCK" hold 40 4 \
        >"$dir/hold.out" 2>&1 &
    hp=$!
    sleep 1.5
    worst=$(raw unix "$HSOCK" health 5)
    wait $hp
    [ "$(cat "$dir/hold.out")" = 32 ] && ok "nobody's 40 connections: 8 held, 32 answered 429 in JSON" ||
        bad "nobody's 40 connections: $(cat "$dir/hold.out") refused"
    python3 -c "import sys; sys.exit(float(sys.argv[1]) >= 1)" "$worst" &&
        ok "root's /health meanwhile: slowest $worst s" || bad "root's /health: $worst s"
    sleep 0.5
    out=$(setpriv --reuid="$N" --regid="$N" --clear-groups curl -s -o /dev/null -w '%{http_code}' \
        --unix-socket "$HSOCK" http://x/health)
    [ "$out" = 200 ] && ok "nobody is served again once its connections have gone" || bad "nobody after: $out"
    # a connection that carried a generation is counted out when it goes
    # too: twelve chats one after another, each on a connection of its own
    codes=$(for i in $(seq 12); do setpriv --reuid="$N" --regid="$N" --clear-groups curl -s -o /dev/null \
        -w '%{http_code} ' --unix-socket "$HSOCK" -d '{"model":"m","messages":[{"role":"user","content":"Hi"}]}' \
        http://x/v1/chat/completions; done)
    [ "$codes" = "$(printf '200 %.0s' $(seq 12))" ] &&
        ok "twelve chats of nobody one after another (a cap of 8): all 200" || bad "twelve chats: $codes"
    [ "$(metric llamad_http_connections_refused_total)" -ge 32 ] 2>/dev/null &&
        ok "metrics: $(metric llamad_http_connections_refused_total) connections refused" ||
        bad "metrics refused: $(metric llamad_http_connections_refused_total)"
else
    echo "skipped: the per-caller part (needs root and the user nobody)"
fi
[ "$(metric llamad_http_connections_cut_total)" -ge 2 ] 2>/dev/null &&
    [ "$(metric llamad_http_heads_refused_total)" -ge 4 ] 2>/dev/null &&
    ok "metrics: $(metric llamad_http_connections_cut_total) cut, $(metric llamad_http_heads_refused_total) heads refused" ||
    bad "metrics: cut $(metric llamad_http_connections_cut_total), heads $(metric llamad_http_heads_refused_total)"
sleep 0.3
n=$(metric llamad_http_connections)
[ "$n" = 1 ] && ok "every connection gone is counted out (llamad_http_connections: the one asking)" ||
    bad "llamad_http_connections after the callers left: $n"
kill -0 $gpid && ok "the gateway is still up" || bad "the gateway died: $(tail -5 "$dir/http.log")"

kill $gpid $pid
wait $gpid
rc=$?
[ "$rc" = 0 ] && ok "the gateway stops on SIGTERM, exit 0" || bad "the gateway's exit: $rc"

# the limits' options: a value out of range, not a number, or negative
# (strtoul would wrap it) is refused by name, with the range, exit 1
for a in "--max-header-size 512" "--header-timeout 2s" "--max-caller-connections 0" \
         "--max-body -18446744073709551615" "--timeout ''"; do
    eval "\"\$BUILD/llamad-http\" --socket \"\$SOCK\" $a" >"$dir/opt.out" 2>&1
    rc=$? opt=${a%% *}
    if [ "$rc" = 1 ] && grep -q -- "$opt .*: want [0-9]* to [0-9]*" "$dir/opt.out"; then
        ok "$a: refused ($(cat "$dir/opt.out"))"
    else
        bad "$a: exit $rc, $(cat "$dir/opt.out")"
    fi
done
echo "gateway_limits: $([ "$fail" -eq 0 ] && echo all ok || echo FAILED)"
exit "$fail"
