#!/bin/sh
# Socket permissions and group: with --socket-mode 0660 --socket-group
# nogroup, a process of another uid that is in group nogroup can talk to
# llamad, one that is not gets EACCES at connect; with the default mode
# (0660, the daemon's group) neither can. Needs root (setpriv); else skipped.
# Env: BUILD, MODELS.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh
if [ "$(id -u)" -ne 0 ]; then echo "skipped: not root (cannot switch uids)"; exit 0; fi
command -v setpriv >/dev/null 2>&1 || { echo "FAIL: setpriv (util-linux) is missing"; exit 1; }
PY=/usr/bin/python3   # the system one: other uids can run it
[ -x "$PY" ] || { echo "FAIL: $PY is missing"; exit 1; }
gid=$(getent group nogroup | cut -d: -f3)
[ -n "$gid" ] || { echo "skipped: no group nogroup"; exit 0; }
test_frame 755   # other uids connect to the socket in it

start() {  # socket-args...
    rm -f "$dir/s"
    "$BUILD/llamad" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
        --socket "$dir/s" --state-dir none "$@" 2>>"$dir/log" &
    pid=$!
    wait_socket "$dir/s" "$pid" "$dir/log"
}
stop() { kill "$pid"; wait "$pid"; pid=; }
# connect as uid:gid; prints ok or the errno name
try() {
    setpriv --reuid="$1" --regid="$2" --clear-groups "$PY" -c '
import errno, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(sys.argv[1]); print("ok")
except OSError as e:
    print(errno.errorcode.get(e.errno, str(e.errno)))' "$dir/s"
}

start --socket-mode 0660 --socket-group nogroup
mode=$(stat -c %a "$dir/s"); grp=$(stat -c %G "$dir/s")
[ "$mode" = 660 ] && [ "$grp" = nogroup ] || bad "socket is $mode $grp, expected 660 nogroup"
r=$(try 65533 "$gid"); [ "$r" = ok ] || bad "a member of nogroup could not connect: $r"
r=$(try 65533 65533); [ "$r" = EACCES ] || bad "a non-member connected or failed otherwise: $r"
# llamactl says which group to join
if [ -x "$BUILD/llamactl" ]; then
    cp "$BUILD/llamactl" "$dir/llamactl" && chmod 755 "$dir/llamactl"
    out=$(USER=someone setpriv --reuid=65533 --regid=65533 --clear-groups "$dir/llamactl" \
          --socket "$dir/s" status 2>&1); rc=$?
    [ "$rc" -eq 3 ] && printf '%s\n' "$out" | grep -q "group nogroup" &&
        printf '%s\n' "$out" | grep -q "usermod -aG nogroup someone" &&
        echo "ok   llamactl: permission denied names the socket's group and how to join it" ||
        bad "llamactl as a non-member: rc $rc: $out"
fi
stop
echo "ok   --socket-mode 0660 --socket-group nogroup: members connect, others get EACCES"

start
r=$(try 65533 "$gid"); [ "$r" = EACCES ] || bad "default mode: another uid connected: $r"
# the daemon's own group is root's here: never advise joining it
if [ -x "$BUILD/llamactl" ] && [ "$(stat -c %g "$dir/s")" = 0 ]; then
    out=$(USER=someone setpriv --reuid=65533 --regid=65533 --clear-groups "$dir/llamactl" \
          --socket "$dir/s" status 2>&1); rc=$?
    [ "$rc" -eq 3 ] && printf '%s\n' "$out" | grep -q "set socket_group = GROUP" &&
        ! printf '%s\n' "$out" | grep -q "usermod" &&
        echo "ok   llamactl: a socket of group root gets socket_group advice, not usermod" ||
        bad "llamactl, socket of group root: rc $rc: $out"
fi
stop
echo "ok   default 0660 and the daemon's own group: another uid gets EACCES"
[ "$fail" -eq 0 ] && echo "socket_access: all ok"
exit "$fail"
