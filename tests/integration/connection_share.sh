#!/bin/sh
# tests/integration/connection_share.sh — no user can take the connections
# everyone needs (daemon/server.c admit): max_connections 48 (the last 3
# kept for root, the daemon's user and trusted gateways),
# max_connections_per_uid 8, idle_timeout 3, trusted_gateways uid 4250.
#
#  - uid 65534 opens 12 connections: 8 are held, 4 get an Error naming
#    max_connections_per_uid (RESOURCE_EXHAUSTED) and are closed;
#  - uids 4242-4246 open 8 each: the 45th connection in all is the last a
#    user other than those may take, the 3 after it get an Error naming
#    the connections kept for root and trusted gateways;
#  - root's `llamactl status` and the trusted gateway's 3 connections
#    (uid 4250) still get in, and are served;
#  - HelloReply.idle_timeout says 3; the idle connections are closed after
#    3 s (none earlier), and then uid 65534 is served again.
#
# Before: nobody's 1,030 idle connections took all of max_connections,
# held forever (idle_timeout 0), and root's status got "connection lost".
# Needs root (setpriv); skipped otherwise. Env: BUILD, MODELS.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh
uid_test_frame
printf 'trusted_gateways = 4250\n' >"$dir/conf"
"$BUILD/llamad" --config "$dir/conf" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
    --socket "$SOCK" --socket-mode 0666 --state-dir none --max-connections 48 \
    --max-connections-per-uid 8 --idle-timeout 3 --log-level info 2>"$dir/llamad.log" &
pid=$!
wait_socket "$SOCK" "$pid" "$dir/llamad.log" 30
cp tests/tools/pbwire.py "$dir/" && chmod 644 "$dir/pbwire.py"
cat >"$dir/hold.py" <<'PY'
# hold.py SOCKET DIR N SECONDS: open N connections, say Hello on each; then
# print "refused R why=WHY" (Errors at once), "idle I" (HelloReply's
# idle_timeout), and after SECONDS, "closed C at T" (connections the daemon
# closed, the earliest, in seconds from the first connect)
import socket, struct, sys, time, select
sys.path.insert(0, sys.argv[2])
from pbwire import field, frame, fields, read_frame
path, n, secs = sys.argv[1], int(sys.argv[3]), float(sys.argv[4])
hello = frame(field(1, 0, 1) + field(2, 2, field(1, 0, 1)))
socks, refused, why, idle = [], 0, "", None
t0 = time.time()
for i in range(n):
    s = socket.socket(socket.AF_UNIX); s.connect(path); socks.append(s)
    try:
        s.sendall(hello)
    except (BrokenPipeError, ConnectionResetError):
        pass   # refused, and closed already: its Error is there to read
held = []
for s in socks:
    s.settimeout(2)
    try:
        r = fields(read_frame(s) or b"")
    except (socket.timeout, ConnectionResetError, TypeError):
        r = {}
    if 2 in r:                      # Error
        refused += 1; why = fields(r[2][0]).get(2, [b""])[0].decode()
    elif 3 in r:
        idle = fields(r[3][0]).get(8, [0])[0]; held.append(s)
print("refused %d why=%s" % (refused, why.replace(" ", "_")))
print("idle %s" % idle, flush=True)
closed, first, n_held = 0, None, len(held)
while time.time() - t0 < secs and closed < n_held:
    r, _, _ = select.select(held, [], [], 0.1)
    for s in r:
        if s.recv(1) == b"":
            closed += 1; held.remove(s); first = first or time.time() - t0
print("closed %d at %.1f" % (closed, first or -1), flush=True)
PY
as() { u=$1; shift; setpriv --reuid="$u" --regid="$u" --clear-groups /usr/bin/python3 "$dir/hold.py" "$SOCK" "$dir" "$@"; }

as 65534 12 6 >"$dir/n.out" &
np=$!
sleep 1
grep -q "^refused 4 why=uid_65534_holds_8_connections,_its_share_(max_connections_per_uid)" "$dir/n.out" &&
    ok "uid 65534's 12 connections: 8 held, 4 refused naming max_connections_per_uid" ||
    bad "uid 65534: $(cat "$dir/n.out")"
grep -q "^idle 3$" "$dir/n.out" && ok "HelloReply.idle_timeout: 3" || bad "idle_timeout: $(cat "$dir/n.out")"
upids=
for u in 4242 4243 4244 4245 4246; do as $u 8 4 >"$dir/$u.out" & upids="$upids $!"; done
sleep 1
total=0; reserve=0
for u in 4242 4243 4244 4245 4246; do
    r=$(sed -n 's/^refused \([0-9]*\).*/\1/p' "$dir/$u.out")
    total=$((total + r))
    grep -q "kept_for_root_and_trusted_gateways" "$dir/$u.out" && reserve=1
done
[ "$total" = 3 ] && [ "$reserve" = 1 ] &&
    ok "five more users' 40: 3 refused, the last 3 of 48 kept for root and trusted gateways" ||
    bad "five users: $total refused (reserve named: $reserve): $(cat "$dir"/42*.out)"
"$BUILD/llamactl" --socket "$SOCK" status >"$dir/status" 2>&1 &&
    ok "root's llamactl status gets in meanwhile" || bad "root's status: $(cat "$dir/status")"
as 4250 2 0.1 >"$dir/gw.out"
grep -q "^refused 0 " "$dir/gw.out" && ok "the trusted gateway's 2 connections get in too" ||
    bad "trusted gateway: $(cat "$dir/gw.out")"
wait $np
set -- $(sed -n 's/^closed \([0-9]*\) at \([0-9.]*\)/\1 \2/p' "$dir/n.out")
[ "$1" = 8 ] && python3 -c "import sys; sys.exit(not 2.9 <= float(sys.argv[1]) <= 5)" "$2" &&
    ok "uid 65534's 8 idle connections closed after $2 s (idle_timeout 3)" || bad "idle: $(cat "$dir/n.out")"
wait $upids
setpriv --reuid=65534 --regid=65534 --clear-groups "$BUILD/llamactl" --socket "$SOCK" status >"$dir/s2" 2>&1 &&
    ok "uid 65534 is served again once its connections have gone" || bad "65534 after: $(cat "$dir/s2")"
[ "$(grep -c 'refusing a connection' "$dir/llamad.log")" -le 2 ] &&
    ok "the refusals are logged at most every 10 s ($(grep -c 'refusing a connection' "$dir/llamad.log") lines for 7)" ||
    bad "log: $(grep 'refusing' "$dir/llamad.log")"

kill $pid
wait $pid
echo "connection_share: $([ "$fail" -eq 0 ] && echo all ok || echo FAILED)"
exit "$fail"
