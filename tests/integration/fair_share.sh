#!/bin/sh
# tests/integration/fair_share.sh — one user cannot take the whole KV cache
# (or session table) from the others by default. A daemon with a small
# pool (--kv-memory 6M of f32 K/V: 307 blocks of 16 tokens on stories260K), nowhere
# to evict to (--ram-cache 0, no state directory), the defaults otherwise:
#   - uid 65534 fills sessions of ~467 tokens (30 blocks each): five fit
#     in its half of the pool (max_kv_share_per_uid 50: 153 blocks), the
#     sixth fails with RESOURCE_EXHAUSTED naming the share; before, it
#     took all ten the pool holds; the sixth is refused before it takes
#     any block (steps of 16 tokens here: before, it was prefilled up to
#     the share and kept 3 blocks, which then crowded out the next
#     session's 2);
#   - root, meanwhile, still gets four such sessions of its own;
#   - the session quota (max_sessions_per_uid 256) refuses uid 65534's
#     257th session, naming the quota, and does not apply to root; with a
#     state directory and a quota of 2, saved sessions count after a
#     restart, and dropping one on disk makes room.
# Needs root (setpriv); skipped otherwise. Env: BUILD, MODELS.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh
uid_test_frame
"$BUILD/llamad" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" --socket "$SOCK" \
    --socket-mode 0666 --state-dir none --kv-memory 6M --kv-type f32 --ram-cache 0 \
    --step-tokens 16 --log-level warning \
    2>"$dir/llamad.log" &
pid=$!
wait_socket "$SOCK" "$pid" "$dir/llamad.log" 30
cp "$BUILD/llamactl" "$dir/llamactl" && chmod 755 "$dir/llamactl"
# as UID ARGS...: llamactl as that uid (0: root); output in $out, status in $rc
as() {
    u=$1; shift
    if [ "$u" -eq 0 ]; then out=$("$dir/llamactl" --socket "$SOCK" "$@" 2>&1); rc=$?
    else out=$(setpriv --reuid="$u" --regid="$u" --clear-groups "$dir/llamactl" --socket "$SOCK" "$@" 2>&1); rc=$?; fi
}
# a 452-token prompt (tokenize says so), its name first so that no two
# share a block (prefix sharing), and 16 tokens of answer: 469 tokens, 30
# blocks, whatever the answer
long=$(python3 -c 'print("Once upon a time, " * 90)')
fill() {  # uid name: a session of ~469 tokens
    as "$1" generate --raw -s "$2" -n 16 --temperature 0 "$2 $long"
}
okn=0
for k in 1 2 3 4 5; do fill 65534 "n$k"; [ "$rc" -eq 0 ] && okn=$((okn + 1)); done
fill 65534 n6
if [ "$okn" -eq 5 ] && [ "$rc" -eq 1 ] && echo "$out" | grep -q "holds its share of the KV cache"; then
    ok "uid 65534: five 469-token sessions, the sixth refused for its share"
else bad "uid 65534: $okn of 5 filled; the sixth: rc $rc: $out"; fi
as 65534 show --json n6
cached=$(printf '%s' "$out" | python3 -c 'import json, sys; print(json.load(sys.stdin)["cached_tokens"])' 2>&1)
[ "$cached" = 0 ] && ok "the sixth holds no K/V: refused before its prompt took blocks" ||
    bad "the sixth holds $cached cached tokens: $out"
# one that begins as n1 shares its 28 whole prompt blocks, which count once
# toward the share: 150 + 2 of the 153 blocks
as 65534 generate --raw -s n1b -n 16 --temperature 0 "n1 $long"
[ "$rc" -eq 0 ] && ok "uid 65534: a session beginning as n1 fits: shared blocks count once" ||
    bad "uid 65534: a session sharing n1's prompt: rc $rc: $out"
okr=0
for k in 1 2 3 4 5; do fill 0 "r$k"; [ "$rc" -eq 0 ] && okr=$((okr + 1)); done
[ "$okr" -eq 5 ] && ok "root still gets five such sessions" || bad "root got $okr of 5: $out"

# the session quota: 256 for uid 65534, none for root (OpenSession frames)
cat > "$dir/open.py" <<'PY'
import socket, sys
sys.path.insert(0, sys.argv[3])
from pbwire import field, fields, frame, read_frame
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
refused = None
for k in range(int(sys.argv[2])):
    s.sendall(frame(field(1, 0, k + 1) + field(3, 2, field(1, 2, b"q%d" % k))))
    r = fields(read_frame(s))
    if 2 in r:   # an Error
        refused = (k, fields(r[2][0])[2][0].decode())
        break
print(refused)
PY
chmod 644 "$dir/open.py"
cp tests/tools/pbwire.py "$dir/" && chmod 644 "$dir/pbwire.py"
q=$(setpriv --reuid=65534 --regid=65534 --clear-groups /usr/bin/python3 "$dir/open.py" "$SOCK" 300 "$dir")
case $q in
    "(249, "*"quota of 256 sessions"*) ok "uid 65534: its 257th session refused by the quota (it held 7 already)" ;;
    *) bad "quota: $q" ;;
esac
r=$(python3 "$dir/open.py" "$SOCK" 300 "$dir")
[ "$r" = None ] && ok "root: 300 more sessions, no quota" || bad "root quota: $r"
kill -0 "$pid" && ok "the daemon serves on" || bad "the daemon died"
kill "$pid"; wait "$pid"; pid=

# the quota counts saved sessions too (on disk after a restart): a daemon
# with a state directory and --max-sessions-per-uid 2
start() {
    "$BUILD/llamad" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
        --socket "$SOCK" --socket-mode 0666 --state-dir "$dir/state" --max-sessions-per-uid 2 \
        --log-level warning 2>>"$dir/llamad.log" &
    pid=$!
    wait_socket "$SOCK" "$pid" "$dir/llamad.log" 30
}
start
as 65534 generate --raw -s a -n 4 --temperature 0 "Once"; r1=$rc
as 65534 generate --raw -s b -n 4 --temperature 0 "Once"; r2=$rc
as 65534 generate --raw -s c -n 4 --temperature 0 "Once"
[ "$r1$r2" = 00 ] && [ "$rc" -eq 1 ] && echo "$out" | grep -q "quota of 2 sessions" &&
    ok "uid 65534: a third session refused by a quota of 2" || bad "quota of 2: $r1 $r2 $rc: $out"
as 65534 save --all
kill "$pid"; wait "$pid"; pid=
start
as 65534 generate --raw -s d -n 4 --temperature 0 "Once"
[ "$rc" -eq 1 ] && echo "$out" | grep -q "quota" && ok "after a restart its saved sessions still count" ||
    bad "quota after restart: rc $rc: $out"
as 65534 drop a
as 65534 generate --raw -s d -n 4 --temperature 0 "Once"
[ "$rc" -eq 0 ] && ok "dropping one of them (on disk) makes room" || bad "after a drop: rc $rc: $out"
[ "$fail" -eq 0 ] && echo "PASS fair_share" || exit 1
