#!/bin/sh
# tests/integration/systemd.sh — llamad under systemd's protocols, without
# systemd itself:
#  (a) sd_notify: READY=1 on $NOTIFY_SOCKET once the socket listens (the
#      listener tries to connect the moment READY=1 arrives), after the
#      loading STATUS; STOPPING=1 on SIGTERM; exit 0.
#  (b) socket activation with systemd-socket-activate: the daemon starts on
#      the first connection, serves Hello and a generation on the passed
#      socket, and leaves the socket file it did not create.
#  (c) the watchdog: WATCHDOG=1 with WATCHDOG_USEC=1000000 and WATCHDOG_PID
#      = the daemon's pid; none when WATCHDOG_PID names another process.
#  (d) SIGHUP rereads --config: max_tokens and log_level change, the daemon
#      keeps serving and logs "reloaded"; a bad value on reload is refused
#      and the old settings stay; a bad value at start is refused with
#      FILE:LINE and exit status 2.
# The datagram listener is python3; the client is tests/tools/protoclient.c,
# compiled here from sources by build_protoclient (tests/tools/daemon.sh;
# not $BUILD/libllamad-proto.a, which may be built with sanitizers).
# Env: BUILD (build folder), MODELS.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
LLAMAD=$BUILD/llamad
MODEL="--model $MODELS/stories260K.bin --tokenizer $MODELS/tok512.model --state-dir none"

. tests/tools/daemon.sh
need_files "$LLAMAD" "$MODELS/stories260K.bin" "$MODELS/tok512.model"
command -v python3 >/dev/null 2>&1 || { echo "FAIL: python3 is missing"; exit 1; }

test_frame   # the daemons, listeners and activators started go in $pids

build_protoclient "$dir/pc"
pc() { "$dir/pc" "$@" 2>&1; }

# wait_for FILE PATTERN SECONDS: 0 once grep finds PATTERN in FILE
wait_for() {
    i=0
    while ! grep -q "$2" "$1" 2>/dev/null; do
        i=$((i + 1))
        [ $i -gt $(($3 * 20)) ] && return 1
        sleep 0.05
    done
    return 0
}

# wait_exit PID SECONDS: the exit status of PID (a child of this shell), or
# 124 after killing it when it outlives SECONDS
wait_exit() {
    i=0
    while kill -0 "$1" 2>/dev/null; do
        i=$((i + 1))
        if [ $i -gt $(($2 * 20)) ]; then kill -KILL "$1"; wait "$1"; return 124; fi
        sleep 0.05
    done
    wait "$1"
}

# The datagram listener: every line of every datagram to $2; on READY=1 it
# first tries to connect to the daemon's socket $3 and notes the result.
cat >"$dir/listen.py" <<'EOF'
import socket, sys
path, out, daemon = sys.argv[1], sys.argv[2], sys.argv[3]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
with open(out, "a", buffering=1) as f:
    while True:
        data = s.recv(65536).decode("utf-8", "replace")
        for line in data.split("\n"):
            if line == "READY=1":
                c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    c.connect(daemon)
                    line += " listening=yes"
                except OSError as e:
                    line += " listening=no (%s)" % e
                c.close()
            if line:
                f.write(line + "\n")
EOF

# listen NAME DAEMON_SOCKET: start a listener on $dir/NAME.notify writing
# $dir/NAME.msgs; sets $lpid
listen() {
    : >"$dir/$1.msgs"
    python3 "$dir/listen.py" "$dir/$1.notify" "$dir/$1.msgs" "$2" &
    lpid=$!
    pids="$pids $lpid"
    i=0
    while [ ! -S "$dir/$1.notify" ]; do
        i=$((i + 1))
        [ $i -gt 200 ] && { echo "FAIL: the notify listener did not start"; exit 1; }
        sleep 0.05
    done
}

# ---- (a) READY / STOPPING -------------------------------------------------------
echo "== (a) sd_notify"
listen a "$dir/a.sock"
NOTIFY_SOCKET=$dir/a.notify "$LLAMAD" $MODEL --socket "$dir/a.sock" 2>"$dir/a.log" &
dpid=$!
pids="$pids $dpid"
if wait_for "$dir/a.msgs" "^READY=1" 20; then
    grep -q "^READY=1 listening=yes" "$dir/a.msgs" &&
        ok "READY=1 arrived with the socket already listening" ||
        bad "READY=1 before the socket listened: $(grep READY "$dir/a.msgs")"
    first_status=$(grep -n "^STATUS=loading" "$dir/a.msgs" | head -n 1 | cut -d: -f1)
    ready=$(grep -n "^READY=1" "$dir/a.msgs" | head -n 1 | cut -d: -f1)
    [ -n "$first_status" ] && [ "$first_status" -lt "$ready" ] &&
        ok "STATUS=loading came before READY=1" || bad "no STATUS=loading before READY=1"
    grep -q "^STATUS=serving" "$dir/a.msgs" && ok "STATUS=serving with READY" ||
        bad "no serving status: $(cat "$dir/a.msgs")"
else
    bad "no READY=1 within 20 s"; cat "$dir/a.msgs" "$dir/a.log"
fi
out=$(pc "$dir/a.sock" hello)
[ "$out" = "hello 1 512" ] && ok "Hello answered" || bad "hello: $out"
kill -TERM "$dpid"
wait_exit "$dpid" 20; st=$?
[ "$st" -eq 0 ] && ok "exit 0 on SIGTERM" || { bad "exit status $st"; cat "$dir/a.log"; }
wait_for "$dir/a.msgs" "^STOPPING=1" 5 && ok "STOPPING=1 on SIGTERM" ||
    bad "no STOPPING=1: $(cat "$dir/a.msgs")"
[ ! -e "$dir/a.sock" ] && ok "the socket it made is gone" || bad "$dir/a.sock left behind"
kill "$lpid" 2>/dev/null

# ---- (b) socket activation --------------------------------------------------------
echo "== (b) socket activation"
if ! command -v systemd-socket-activate >/dev/null 2>&1; then
    if [ "$(id -u)" -eq 0 ]; then
        bad "systemd-socket-activate is missing (Debian package systemd)"
    else
        echo "skipped (b): no systemd-socket-activate"
    fi
else
    # systemd-socket-activate listens, then execs llamad (same pid) on the
    # first connection, with LISTEN_FDS=1 and LISTEN_PID set
    env -u NOTIFY_SOCKET systemd-socket-activate -l "$dir/b.sock" \
        "$LLAMAD" $MODEL 2>"$dir/b.log" &
    apid=$!
    pids="$pids $apid"
    i=0
    while [ ! -S "$dir/b.sock" ] && [ $i -lt 200 ]; do i=$((i + 1)); sleep 0.05; done
    sleep 0.2
    case $(tr '\0' ' ' </proc/$apid/cmdline 2>/dev/null) in
        *systemd-socket-activate*) ok "nothing started before the first connection" ;;
        *) bad "llamad ran before any connection" ;;
    esac
    out=$(pc "$dir/b.sock" hello)
    [ "$out" = "hello 1 512" ] && ok "Hello through the activated socket" || bad "hello: $out"
    case $(tr '\0' ' ' </proc/$apid/cmdline 2>/dev/null) in
        *llamad*) ok "llamad runs in the activator's place (pid $apid)" ;;
        *) bad "llamad is not what runs as pid $apid" ;;
    esac
    grep -q "socket passed by systemd" "$dir/b.log" && ok "llamad took the passed socket" ||
        bad "llamad did not say it took the passed socket"
    pc "$dir/b.sock" open act raw >/dev/null
    out=$(pc "$dir/b.sock" generate act "Once upon a time" 12)
    printf '%s\n' "$out" | grep -q "^done STOP_MAX_TOKENS generated=12 " &&
        ok "a generation through the activated socket" || bad "generate: $out"
    kill -TERM "$apid"
    wait_exit "$apid" 20; st=$?
    [ "$st" -eq 0 ] && ok "exit 0 on SIGTERM" || { bad "exit status $st"; cat "$dir/b.log"; }
    [ -S "$dir/b.sock" ] && ok "the passed socket's file is left to its owner" ||
        bad "llamad removed a socket it did not create"
fi

# ---- (c) watchdog ---------------------------------------------------------------------
echo "== (c) watchdog"
listen c "$dir/c.sock"
# exec keeps the shell's pid, so WATCHDOG_PID=$$ names llamad
NOTIFY_SOCKET=$dir/c.notify WATCHDOG_USEC=1000000 \
    sh -c 'export WATCHDOG_PID=$$; exec "$0" "$@"' "$LLAMAD" $MODEL --socket "$dir/c.sock" \
    2>"$dir/c.log" &
dpid=$!
pids="$pids $dpid"
wait_for "$dir/c.msgs" "^READY=1" 20 || bad "no READY=1"
if wait_for "$dir/c.msgs" "^WATCHDOG=1" 3; then
    sleep 1.2
    n=$(grep -c "^WATCHDOG=1" "$dir/c.msgs")
    [ "$n" -ge 2 ] && ok "WATCHDOG=1 keeps coming ($n so far)" || bad "only $n WATCHDOG=1"
else
    bad "no WATCHDOG=1 within 3 s: $(cat "$dir/c.msgs")"
fi
kill -TERM "$dpid"
wait_exit "$dpid" 20; st=$?
[ "$st" -eq 0 ] && ok "exit 0" || bad "exit status $st"
kill "$lpid" 2>/dev/null

# WATCHDOG_PID of another process: the watchdog is not for llamad
listen c2 "$dir/c2.sock"
NOTIFY_SOCKET=$dir/c2.notify WATCHDOG_USEC=200000 WATCHDOG_PID=1 \
    "$LLAMAD" $MODEL --socket "$dir/c2.sock" 2>"$dir/c2.log" &
dpid=$!
pids="$pids $dpid"
wait_for "$dir/c2.msgs" "^READY=1" 20 || bad "no READY=1"
sleep 0.6
grep -q "^WATCHDOG=1" "$dir/c2.msgs" && bad "WATCHDOG=1 sent for another pid's watchdog" ||
    ok "no WATCHDOG=1 when WATCHDOG_PID is another process"
kill -TERM "$dpid"
wait_exit "$dpid" 20 || bad "exit status $?"
kill "$lpid" 2>/dev/null

# ---- (d) SIGHUP and the config file -------------------------------------------------------
echo "== (d) SIGHUP"
conf=$dir/llamad.conf
write_conf() {  # max_tokens log_level
    cat >"$conf" <<EOF
# test configuration
model = $MODELS/stories260K.bin
tokenizer = $MODELS/tok512.model
socket = $dir/d.sock
max_tokens = $1
log_level = $2
state_dir = none
EOF
}
write_conf 8 info
"$LLAMAD" --config "$conf" 2>"$dir/d.log" &
dpid=$!
pids="$pids $dpid"
i=0
while [ ! -S "$dir/d.sock" ] && [ $i -lt 400 ]; do i=$((i + 1)); sleep 0.05; done
pc "$dir/d.sock" open hup raw >/dev/null
out=$(pc "$dir/d.sock" generate hup "Once upon a time")
printf '%s\n' "$out" | grep -q "^done STOP_MAX_TOKENS generated=8 " &&
    ok "max_tokens = 8 from the file" || bad "before reload: $out"
grep -q "debug:" "$dir/d.log" && bad "debug lines at log_level info"

write_conf 3 debug
kill -HUP "$dpid"
wait_for "$dir/d.log" "reloaded" 5 && ok "SIGHUP: logged reloaded" ||
    { bad "no 'reloaded' in the log"; cat "$dir/d.log"; }
out=$(pc "$dir/d.sock" generate hup " The end.")
printf '%s\n' "$out" | grep -q "^done STOP_MAX_TOKENS generated=3 " &&
    ok "max_tokens = 3 after SIGHUP" || bad "after reload: $out"
grep -q "debug:" "$dir/d.log" && ok "log_level debug after SIGHUP" ||
    bad "no debug lines after the reload to log_level debug"
out=$(pc "$dir/d.sock" info hup)
printf '%s\n' "$out" | grep -q "^session hup tokens=" && ok "the session survived the reload" ||
    bad "info after reload: $out"

# a bad value on reload: refused, the old settings stay
sed -i 's/^max_tokens = 3$/max_tokens = many/' "$conf"
kill -HUP "$dpid"
wait_for "$dir/d.log" "SIGHUP: .*llamad.conf:5: max_tokens" 5 && ok "SIGHUP with a bad value: refused with file:line" ||
    { bad "a bad value on reload was not reported"; tail -n 5 "$dir/d.log"; }
out=$(pc "$dir/d.sock" generate hup " Again.")
printf '%s\n' "$out" | grep -q "^done STOP_MAX_TOKENS generated=3 " &&
    ok "still serving with the old settings" || bad "after a bad reload: $out"
kill -TERM "$dpid"
wait_exit "$dpid" 20; st=$?
[ "$st" -eq 0 ] && ok "exit 0" || bad "exit status $st"

# a bad value at start
write_conf 8 info
sed -i 's/^log_level = info$/log_level = loud/' "$conf"
"$LLAMAD" --config "$conf" >"$dir/bad.out" 2>&1; st=$?
[ "$st" -eq 2 ] && ok "a bad value at start: exit 2" || bad "a bad value at start: exit $st"
grep -q "llamad.conf:6:" "$dir/bad.out" && ok "the error names file:line ($(cat "$dir/bad.out"))" ||
    bad "the error does not name file:line: $(cat "$dir/bad.out")"
[ ! -e "$dir/d.sock" ] || bad "a refused start left a socket"

exit $fail
