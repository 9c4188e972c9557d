#!/bin/sh
# Out of file descriptors: with a hard open-file limit of 64 and 100 clients
# connected, accept() fails with EMFILE. llamad must not spin on it (the
# event thread pauses the listener; CPU time stays low), must log it at most
# once per 10 s rather than flood the log, and must serve again as soon as
# connections close.
# Env: BUILD, MODELS.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh
test_frame

(
    # shellcheck disable=SC3045  # ulimit -n: dash and bash have it
    ulimit -n 64 || exit 1
    exec "$BUILD/llamad" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
        --socket "$dir/s" --state-dir none --max-connections 200 --log-level info
) 2>"$dir/log" &
pid=$!
wait_socket "$dir/s" "$pid" "$dir/log"

# 100 idle clients, held until $dir/release appears
python3 - "$dir/s" "$dir/release" <<'PY' &
import os, socket, sys, time
socks = []
for _ in range(100):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1])
    socks.append(s)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
PY
pids=$!   # stopped at exit if the test fails before releasing them
sleep 1
ticks() { awk '{ print $14 + $15 }' "/proc/$pid/stat"; }
t0=$(ticks); sleep 2; t1=$(ticks)
hz=$(getconf CLK_TCK)
used=$(( (t1 - t0) * 100 / hz ))   # percent of one core over 2 s, x2
[ "$used" -lt 40 ] || bad "the daemon used $((used / 2))% of a core while out of descriptors"
n=$(grep -c "accept:" "$dir/log")
[ "$n" -ge 1 ] && [ "$n" -le 2 ] || bad "expected one or two accept warnings in 3 s, got $n"
grep -q "max_connections 200 is more than the open-file limit" "$dir/log" ||
    bad "no warning that max_connections exceeds the open-file limit"
echo "ok   out of descriptors: $((used / 2))% of a core, $n log line(s)"

touch "$dir/release"; wait "$pids"; pids=
"$BUILD/llamactl" --socket "$dir/s" generate --raw --temperature 0 --max-tokens 5 "Once" \
    >/dev/null || bad "no service after the clients left"
echo "ok   serving again once the clients left"
[ "$fail" -eq 0 ] && echo "fd_limit: all ok"
exit "$fail"
