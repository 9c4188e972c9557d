#!/bin/sh
# tests/integration/socket_fallback.sh — llamactl finds the installed
# service's socket from a login session. A user other than root with
# XDG_RUNTIME_DIR set (every login session) tries its own
# $XDG_RUNTIME_DIR/llamad/llamad.sock, then the system's
# /run/llamad/llamad.sock, going on only when nothing listens (ENOENT,
# ECONNREFUSED). Checked as uid 65534 with XDG_RUNTIME_DIR set:
#   - neither socket: exit 3, the message names both paths;
#   - only the system socket (the case of a user in group llamad after
#     `make install`): it connects there;
#   - both: the user's daemon wins;
#   - the user's socket refuses with EACCES: reported as it is (exit 3,
#     the permission named), no fallback;
#   - $LLAMAD_SOCKET or --socket: that path alone.
# The two daemons differ by model file (status names it).
# Needs root (setpriv, /run/llamad); skipped when not root or when
# /run/llamad/llamad.sock exists (a real service: left alone).
# Env: BUILD, MODELS.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh

SYS_DIR=/run/llamad
SYS=$SYS_DIR/llamad.sock
if [ "$(id -u)" -ne 0 ]; then echo "skipped: not root (cannot switch uids)"; exit 0; fi
command -v setpriv >/dev/null 2>&1 || { echo "FAIL: setpriv (util-linux) is missing"; exit 1; }
# one test at a time on /run/llamad/llamad.sock (the editors' tests too,
# tests/tools/fallback.sh; other checkouts')
if command -v flock >/dev/null 2>&1 && [ -d /run/lock ]; then
    exec 9>>/run/lock/llamad-test-system-socket.lock
    flock -w 300 9 || { echo "skipped: the lock on $SYS is held"; exit 0; }
fi
if [ -e "$SYS" ]; then echo "skipped: $SYS exists (a running service is left alone)"; exit 0; fi
need_files "$BUILD/llamad" "$BUILD/llamactl" "$MODELS/stories260K.bin" "$MODELS/stories260K.gguf" \
    "$MODELS/tok512.model"

test_frame 755
made_sys=
[ -d "$SYS_DIR" ] || { mkdir -m 755 "$SYS_DIR" && made_sys=1; }
cleanup_sys() {
    rm -f "$SYS"
    [ -n "$made_sys" ] && rmdir "$SYS_DIR" 2>/dev/null
    test_cleanup
}
trap cleanup_sys EXIT
cp "$BUILD/llamactl" "$dir/llamactl" && chmod 755 "$dir/llamactl"
xdg=$dir/xdg
mkdir -p "$xdg/llamad" && chown -R 65534:65534 "$xdg" && chmod 700 "$xdg"
USER_SOCK=$xdg/llamad/llamad.sock

# ctl ARGS: llamactl as uid 65534 in a login-like environment; output
# (stdout + stderr) in $out, status in $rc
ctl() {
    out=$(setpriv --reuid=65534 --regid=65534 --clear-groups \
        env -i PATH=/usr/bin:/bin HOME="$dir" XDG_RUNTIME_DIR="$xdg" ${EXTRA_ENV:-} \
        "$dir/llamactl" "$@" 2>&1)
    rc=$?
}
# start NAME SOCKET MODE MODEL...: a daemon; its pid in $pids
start() {
    n=$1 s=$2 m=$3; shift 3
    "$BUILD/llamad" "$@" --socket "$s" --socket-mode "$m" --state-dir none --log-level warning \
        2>"$dir/$n.log" &
    pids="$pids $!"
    wait_socket "$s" "$!" "$dir/$n.log" 30
}

# ---- neither -----------------------------------------------------------------
ctl status
if [ "$rc" -eq 3 ] && echo "$out" | grep -qF "$USER_SOCK" && echo "$out" | grep -qF "$SYS"; then
    ok "no daemon: exit 3, both paths named"
else bad "no daemon: exit $rc, want 3 naming $USER_SOCK and $SYS: $out"; fi

# ---- only the system socket ----------------------------------------------------
start sys "$SYS" 0666 --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model"
ctl status
if [ "$rc" -eq 0 ] && echo "$out" | grep -q "stories260K.bin"; then
    ok "only the system socket: reached it"
else bad "only the system socket: exit $rc: $out"; fi
ctl generate -n 4 --temperature 0 "Once upon a time"
[ "$rc" -eq 0 ] && [ -n "$out" ] && ok "generate through the system socket" ||
    bad "generate through the system socket: exit $rc: $out"
# a stale user socket file (nothing listens: ECONNREFUSED) is passed over too
python3 -c "import socket,sys; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1])" "$USER_SOCK"
chown 65534:65534 "$USER_SOCK"
ctl status
if [ "$rc" -eq 0 ] && echo "$out" | grep -q "stories260K.bin"; then
    ok "a stale user socket (connection refused): the system's reached"
else bad "stale user socket: exit $rc: $out"; fi
rm -f "$USER_SOCK"

# ---- both: the user's wins ---------------------------------------------------------
start user "$USER_SOCK" 0666 --model "$MODELS/stories260K.gguf" --tokenizer "$MODELS/tok512.model"
chown 65534:65534 "$USER_SOCK"
ctl status
if [ "$rc" -eq 0 ] && echo "$out" | grep -q "stories260K.gguf"; then
    ok "both: the user's daemon answered"
else bad "both: exit $rc (want the user's, stories260K.gguf): $out"; fi
# explicit paths are tried alone
EXTRA_ENV="LLAMAD_SOCKET=$SYS" ctl status
echo "$out" | grep -q "stories260K.bin" && ok "LLAMAD_SOCKET: that socket" ||
    bad "LLAMAD_SOCKET=$SYS: $out"
ctl --socket "$dir/none.sock" status
if [ "$rc" -eq 3 ] && ! echo "$out" | grep -qF "$SYS"; then ok "--socket: no fallback"
else bad "--socket to a missing path: exit $rc: $out"; fi

# ---- EACCES on the user's socket: reported, no fallback ----------------------
chown root:root "$USER_SOCK"; chmod 600 "$USER_SOCK"
ctl status
if [ "$rc" -eq 3 ] && echo "$out" | grep -q "Permission denied" && echo "$out" | grep -qF "$USER_SOCK" &&
   ! echo "$out" | grep -q "stories260K.bin"; then
    ok "EACCES on the user's socket: reported, not passed over"
else bad "EACCES: exit $rc: $out"; fi

[ "$fail" -eq 0 ] && echo "PASS socket_fallback" || exit 1
