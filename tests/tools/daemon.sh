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
test_cleanup() {
    for _p in $pids $pid; do kill -"${stop_signal:-TERM}" "$_p" 2>/dev/null; done
    for _p in $pids $pid; do wait "$_p" 2>/dev/null; done
    if [ -n "$KEEP" ]; then echo "kept $dir"; else rm -rf "$dir"; fi
}
bad() { echo "FAIL: $*"; fail=1; }
ok() { echo "ok   $*"; }
