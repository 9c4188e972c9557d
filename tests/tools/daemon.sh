# tests/tools/daemon.sh — sourced by the shell tests that start llamad.
#
# wait_socket SOCKET PID LOG: wait up to 10 s for the daemon to listen on
# SOCKET; if it does not (or exits first), print FAIL with its log and exit 1.
wait_socket() {
    _i=0
    while [ ! -S "$1" ]; do
        _i=$((_i + 1))
        if [ "$_i" -gt 100 ] || ! kill -0 "$2" 2>/dev/null; then
            echo "FAIL: daemon did not start"
            cat "$3"
            exit 1
        fi
        sleep 0.1
    done
}

# test_frame: what these tests share: a temporary folder $dir, removed at
# exit (or on INT / TERM) after stopping the daemon whose pid is in $pid,
# if any; bad MSG prints a FAIL line and sets fail=1.
test_frame() {
    dir=$(mktemp -d) || exit 1
    pid=
    fail=0
    trap test_cleanup EXIT INT TERM
}
test_cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid"; rm -rf "$dir"; }
bad() { echo "FAIL: $*"; fail=1; }
