# shellcheck shell=sh disable=SC2034  # fail, dir, pid, pids: set for the sourcing script
# tests/tools/daemon.sh — sourced by the shell tests (tests/golden/*.sh,
# tests/integration/*.sh, tests/load/run.sh): their shared frame.
#
# need_files FILE...: exit 1 with "FAIL: missing FILE" unless every FILE exists.
need_files() {
    for _f in "$@"; do
        [ -e "$_f" ] || { echo "FAIL: missing $_f"; exit 1; }
    done
}

# wait_socket SOCKET PID LOG [SECONDS]: wait up to SECONDS (default 10) for
# the daemon to listen on SOCKET; if it does not (or exits first), print FAIL
# with its log and exit 1.
wait_socket() {
    _i=0
    while [ ! -S "$1" ]; do
        _i=$((_i + 1))
        if [ "$_i" -gt $((${4:-10} * 10)) ] || ! kill -0 "$2" 2>/dev/null; then
            echo "FAIL: daemon did not start"
            cat "$3"
            exit 1
        fi
        sleep 0.1
    done
}

# test_frame [MODE]: what these tests share: a temporary folder $dir, removed
# at exit (INT and TERM exit 1) after stopping the daemon whose pid is in
# $pid and the other processes listed in $pids (a listener, a client holding
# connections), with signal $stop_signal (TERM unless set). With MODE (e.g.
# 755) the folder is made under /tmp and given that mode, so that processes
# of other uids reach a socket in it. KEEP=1 keeps the folder (its path is
# printed). bad MSG prints a FAIL line and sets fail=1; ok MSG an ok line.
test_frame() {
    if [ -n "$1" ]; then
        dir=$(mktemp -d /tmp/llamad-test.XXXXXX) && chmod "$1" "$dir" || exit 1
    else
        dir=$(mktemp -d) || exit 1
    fi
    pid=
    pids=
    fail=0
    trap test_cleanup EXIT
    trap 'exit 1' INT TERM
}
# build_protoclient OUT: tests/tools/protoclient.c built into OUT with the
# proto sources it uses (framing, enum names, $BUILD's generated code;
# compiled here, without the sanitizers of a sanitizer build); a FAIL line
# and exit 1 if it cannot be.
build_protoclient() {
    cc -std=c11 -D_GNU_SOURCE -I. -I"$BUILD/proto" tests/tools/protoclient.c proto/frame.c \
        proto/names.c "$BUILD/proto/llamad.pb-c.c" -lprotobuf-c -o "$1" ||
        { echo "FAIL: cannot build tests/tools/protoclient.c"; exit 1; }
}
# llamactl_frame: the frame of a test that drives llamactl against a daemon
# on stories260K: the files it needs (need_files), test_frame, and
# CTL=$BUILD/llamactl.
llamactl_frame() {
    need_files "$BUILD/llamad" "$BUILD/llamactl" "$MODELS/stories260K.bin" "$MODELS/tok512.model"
    test_frame
    CTL=$BUILD/llamactl
}
# uid_test_frame: the frame of a test that plays another user (uid 65534,
# by setpriv) against a root victim: skipped (exit 0) when not root, the
# files of llamactl_frame, test_frame 755 (others reach its socket) and
# SOCK=$dir/s.
uid_test_frame() {
    if [ "$(id -u)" -ne 0 ]; then echo "skipped: not root (cannot switch uids)"; exit 0; fi
    need_files "$BUILD/llamad" "$BUILD/llamactl" "$MODELS/stories260K.bin" "$MODELS/tok512.model"
    test_frame 755
    SOCK=$dir/s
}
# http_uid_frame: the checks of a test where llamad-http serves other
# users: skipped (exit 0) when not root or without the user nobody; FAIL
# without setpriv, curl or python3, or the binaries and model files.
http_uid_frame() {
    if [ "$(id -u)" -ne 0 ]; then echo "skipped: not root (cannot switch uids)"; exit 0; fi
    for _c in setpriv curl python3; do
        command -v $_c >/dev/null 2>&1 || { echo "FAIL: $_c is missing"; exit 1; }
    done
    need_files "$BUILD/llamad" "$BUILD/llamad-http" "$BUILD/llamactl" "$MODELS/stories260K.bin" \
        "$MODELS/tok512.model"
    getent passwd nobody >/dev/null || { echo "skipped: no user nobody"; exit 0; }
}
# victim_ms SOCKET N: the milliseconds N generations of 8 tokens take
# through llamactl, one after another (the victim's side of an attack).
victim_ms() {
    python3 - "$BUILD/llamactl" "$1" "$2" <<'PY'
import subprocess, sys, time
t = time.time()
for i in range(int(sys.argv[3])):
    subprocess.run([sys.argv[1], "--socket", sys.argv[2], "generate", "--raw", "-n", "8",
                    "--temperature", "0", "Once upon a time"], check=True, capture_output=True)
print("%.0f" % ((time.time() - t) * 1000))
PY
}
# paged_sessions SOCKET FILE: 60 sessions of 40-byte names made through
# llamactl, in reverse name order (more than one small frame holds: their
# list comes in pages); their names, one a line, into FILE.
paged_sessions() {
    : >"$2"
    _i=59
    while [ $_i -ge 0 ]; do
        _n=$(printf 'paged-list-session-with-a-long-name-%04d' $_i)
        "$BUILD/llamactl" --socket "$1" generate -s "$_n" -n 1 --temperature 0 hi \
            >/dev/null 2>>"$2.err" || bad "llamactl generate -s $_n: $(tail -1 "$2.err")"
        echo "$_n" >>"$2"
        _i=$((_i - 1))
    done
}
test_cleanup() {
    for _p in $pids $pid; do kill -"${stop_signal:-TERM}" "$_p" 2>/dev/null; done
    for _p in $pids $pid; do wait "$_p" 2>/dev/null; done
    if [ -n "$KEEP" ]; then echo "kept $dir"; else rm -rf "$dir"; fi
}
bad() { echo "FAIL: $*"; fail=1; }
ok() { echo "ok   $*"; }
