#!/bin/sh
# tests/integration/partial_frames.sh — unfinished frames cannot take the
# daemon's memory, and a trickle is not activity. Against one daemon
# (stories260K slowed to 20 ms a step, socket mode 0666, --frame-timeout 2,
# --idle-timeout 5),
# the attacker being uid 65534 and the victim root:
#   - 20 connections each announce a 16 MiB frame, send what the daemon
#     reads of it for 2.5 s and stall: the daemon's RSS grows by less than
#     40 MiB (the budget: max_frame + 1 MiB for one uid, 4 x max_frame for
#     all; before, every connection buffered its 15 MiB: 326 MB), and the
#     victim's generations go on being answered meanwhile (their latency
#     is printed, as a ratio to the same generations unloaded);
#   - two 12 MiB frames of one uid sent side by side (24 MiB, over its
#     budget) are both read and answered: a frame, once admitted, claims
#     its whole length, so two cannot wait for each other;
#   - a connection that sends 1 byte of a 100-byte frame every 0.5 s is
#     closed with an error frame after --frame-timeout (2 s + 0), and one
#     that trickles a frame whose deadline is far (4 MiB: 2 + 16 s) is
#     closed as idle after --idle-timeout (5 s): bytes of an unfinished
#     frame are not a request (before, each byte restarted the timer);
#   - a connection with a request in flight longer than --idle-timeout
#     (a 6 s generation) is not idle.
# Needs root (setpriv); skipped otherwise. Env: BUILD, MODELS.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh
uid_test_frame
LLAMAD_TEST_STEP_DELAY_MS=20 "$BUILD/llamad" --model "$MODELS/stories260K.bin" \
    --tokenizer "$MODELS/tok512.model" --socket "$SOCK" --socket-mode 0666 --state-dir none \
    --frame-timeout 2 --idle-timeout 5 --log-level info 2>"$dir/llamad.log" &
pid=$!
wait_socket "$SOCK" "$pid" "$dir/llamad.log" 30
CTL=$BUILD/llamactl
rss() { awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status"; }
t0=$(victim_ms "$SOCK" 5) || bad "victim generations, unloaded"
base=$(rss)

# ---- 20 stalled 16 MiB frames of one uid ------------------------------------
cat > "$dir/attack.py" <<'PY'
import socket, struct, sys, time
socks = []
for i in range(20):
    s = socket.socket(socket.AF_UNIX)
    s.connect(sys.argv[1])
    s.setblocking(False)
    s.send(struct.pack(">I", 16 << 20))
    socks.append(s)
chunk = b"\x08" * 65536
sent = 0
end = time.time() + 2.5   # then held: the idle timeout (5 s) closes them later
while time.time() < end:
    moved = 0
    for s in socks:
        try:
            moved += s.send(chunk)
        except BlockingIOError:
            pass
    sent += moved
    if not moved:
        time.sleep(0.05)
print(sent, flush=True)
print("ready", flush=True)
time.sleep(float(sys.argv[2]))
PY
chmod 644 "$dir/attack.py"
setpriv --reuid=65534 --regid=65534 --clear-groups /usr/bin/python3 "$dir/attack.py" "$SOCK" 30 \
    > "$dir/attack.out" 2>&1 &
apid=$!
pids="$pids $apid"
i=0
until grep -q '^ready$' "$dir/attack.out" || [ $i -ge 100 ]; do i=$((i + 1)); sleep 0.1; done
sent=$(head -n 1 "$dir/attack.out")
case $sent in
    ''|*[!0-9]*) bad "the attacker did not run: $(cat "$dir/attack.out")"; sent=0 ;;
esac
under=$(rss)
t1=$(victim_ms "$SOCK" 5) || bad "victim generations under the attack"
kill "$apid" 2>/dev/null; wait "$apid" 2>/dev/null
grow=$(( (under - base) / 1024 ))
echo "attack: $sent bytes sent by 20 connections; rss ${base} kB -> ${under} kB (+${grow} MiB)"
echo "victim: 5 generations ${t0} ms unloaded, ${t1} ms under the attack ($(awk -v a="$t1" -v b="$t0" 'BEGIN { printf "%.2f", a / b }')x)"
san=; grep -qaE "__asan_init|__tsan_init" "$BUILD/llamad" && san=1   # its allocator's overhead
[ "$sent" -gt $((8 << 20)) ] && [ "$grow" -ge 8 ] && { [ -n "$san" ] || [ "$grow" -lt 40 ]; } &&
    ok "20 stalled 16 MiB frames ($sent bytes sent): RSS +$grow MiB (< 40)" ||
    bad "RSS grew by $grow MiB ($sent bytes sent)"
[ -n "$t1" ] && ok "the victim was served during the attack" || bad "victim not served"

# ---- two large frames of one uid, together over its budget: both read -------------
out=$(timeout 90 python3 tests/tools/two_frames.py "$SOCK" 2>&1) &&
    ok "two 12 MiB frames of one uid, sent side by side: $out" ||
    bad "two large frames of one uid: $out"

# ---- a trickle: the frame deadline, then the idle timeout -------------------------
python3 - "$SOCK" <<'PY' && ok "a frame trickled a byte each 0.5 s: closed with an error after ~2 s" || bad "trickle: frame deadline"
import socket, struct, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.send(struct.pack(">I", 100))
t = time.time()
s.settimeout(0.5)
got = b""
while time.time() - t < 15:
    try:
        s.send(b"\x08")
    except OSError:
        break
    try:
        d = s.recv(4096)
        if not d:
            break
        got += d
    except socket.timeout:
        pass
    except ConnectionResetError:
        # the daemon closed with our last byte unread: what it sent
        # before closing was read first, so the error frame is in got
        break
dt = time.time() - t
assert 1.5 <= dt <= 9 and b"not completed in time" in got, (dt, got)
PY
python3 - "$SOCK" <<'PY' && ok "a frame with a far deadline trickled: closed as idle after ~5 s" || bad "trickle: idle"
import socket, struct, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.send(struct.pack(">I", 4 << 20))
t = time.time()
s.settimeout(0.5)
while time.time() - t < 15:
    try:
        s.send(b"\x08")
        if s.recv(4096) == b"":
            break
    except socket.timeout:
        pass
    except OSError:
        break
dt = time.time() - t
assert 4.5 <= dt <= 12, dt
PY
# a request in flight longer than the idle timeout (300 tokens at 20 ms)
out=$("$CTL" --socket "$SOCK" generate --raw -n 300 --temperature 0 "Once upon a time" 2>&1); rc=$?
[ "$rc" -eq 0 ] && [ ${#out} -gt 200 ] && ok "a 6 s generation on a 5 s idle timeout is not idle" ||
    bad "long generation: rc $rc: $out"
kill -0 "$pid" 2>/dev/null && ok "the daemon serves on" || bad "the daemon died: $(tail -5 "$dir/llamad.log")"
[ "$fail" -eq 0 ] && echo "PASS partial_frames" || exit 1
