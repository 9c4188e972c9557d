#!/bin/sh
# tests/integration/disk_quota.sh — no user can fill the disk with saved
# sessions (disk_share_per_uid). The state directory is an 8 MiB tmpfs,
# disk_share_per_uid 10: 819 KiB a user other than root. uid 65534
# (nobody) opens sessions of ~400 tokens (a state file of ~250 KiB: their
# K/V) and saves them:
#
#  - its saves succeed until its files (state files and the block files
#    of its sessions' K/V) pass its share, then a new session gets
#    STORAGE_QUOTA naming disk_share_per_uid, and so does the Save of a
#    session made before (it stays, in memory); its files stop growing
#    within one session of the share;
#  - root meanwhile opens, saves and reads its sessions as before;
#  - llamactl status says nobody's bytes and share; after nobody drops
#    sessions, it may save and open again;
#  - through llamad-http, a new conversation of nobody over its share is
#    507 in the API's form.
#
# Before: one uid with 256 sessions of 1 MiB system prompts wrote 268 MB.
# Needs root (setpriv, mount); skipped otherwise. Env: BUILD, MODELS.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh
uid_test_frame
N=65534
mkdir "$dir/state"
if ! mount -t tmpfs -o size=8m,mode=0700 tmpfs "$dir/state" 2>"$dir/mount.err"; then
    echo "skipped: cannot mount a tmpfs ($(cat "$dir/mount.err"))"
    exit 0
fi
trap 'kill $gpid $pid 2>/dev/null; umount "$dir/state" 2>/dev/null; test_cleanup' EXIT
"$BUILD/llamad" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
    --socket "$SOCK" --socket-mode 0666 --state-dir "$dir/state" --disk-share-per-uid 10 --save-delay 3600 \
    --log-level info 2>"$dir/llamad.log" &
pid=$!
wait_socket "$SOCK" "$pid" "$dir/llamad.log" 30
"$BUILD/llamad-http" --socket "$SOCK" --name m --listen "$dir/h.sock" --socket-mode 0666 \
    2>"$dir/http.log" &
gpid=$!
for i in $(seq 50); do [ -S "$dir/h.sock" ] && break; sleep 0.1; done
CTL=$BUILD/llamactl
as_n() { setpriv --reuid=$N --regid=$N --clear-groups "$@"; }
python3 -c 'print("Once upon a time there was a cat who liked the sun. " * 20)' >"$dir/sys"
chmod 644 "$dir/sys"

# a session of nobody made first, saved last
echo "Hi" | as_n "$CTL" --socket "$SOCK" chat --session late --system "late $(cat "$dir/sys")" -n 2 \
    --temperature 0 >/dev/null 2>&1 || bad "nobody's first session"
# nobody: a session at a time, each saved, until a save is refused
saved=0 refused=
for i in $(seq 1 16); do
    echo "Hi $i" | as_n "$CTL" --socket "$SOCK" chat --session "q$i" --system "$i $(cat "$dir/sys")" -n 2 \
        --temperature 0 >/dev/null 2>"$dir/gen.err" || { refused="open $i: $(cat "$dir/gen.err")"; break; }
    if as_n "$CTL" --socket "$SOCK" save "q$i" >/dev/null 2>"$dir/save.err"; then
        saved=$((saved + 1))
    else
        refused="save $i: $(cat "$dir/save.err")"
        break
    fi
done
case $refused in
*"storage quota"*disk_share_per_uid*|*"storage_quota"*disk_share_per_uid*)
    ok "nobody saved $saved sessions, then: ${refused%%:*} refused naming disk_share_per_uid" ;;
*)  bad "nobody: $saved saved, then: ${refused:-nothing refused}" ;;
esac
used=$(du -sb "$dir/state" | cut -f1)
share=$((8 * 1024 * 1024 / 10))
per=$((used / (saved > 0 ? saved : 1)))   # a session's state file and block files
[ "$saved" -ge 2 ] && [ "$used" -le $((share + per + 65536)) ] &&
    ok "nobody's files stop within one session of its share ($used bytes, share $share, a session ~$per)" ||
    bad "the state directory holds $used bytes (share $share, a session ~$per)"
out=$(as_n "$CTL" --socket "$SOCK" save late 2>&1)
case $out in *[Ss]torage*quota*disk_share_per_uid*) ok "nobody's unsaved session: its Save refused (STORAGE_QUOTA)" ;;
*) bad "a Save of nobody over its share: $out" ;; esac
as_n "$CTL" --socket "$SOCK" show late >/dev/null 2>&1 && ok "the session stays, in memory" ||
    bad "the unsaved session is gone"
out=$(as_n "$CTL" --socket "$SOCK" generate --session qnew -n 2 "Hi" 2>&1)
case $out in *[Ss]torage*quota*|*STORAGE_QUOTA*|*storage_quota*) ok "a new session of nobody: refused (STORAGE_QUOTA)" ;;
*) bad "a new session of nobody over its share: $out" ;; esac
as_n "$CTL" --socket "$SOCK" status >"$dir/status.n"
grep -q "^disk: .* of saved sessions, .* your share" "$dir/status.n" &&
    ok "nobody's status: $(grep '^disk:' "$dir/status.n" | sed 's/  */ /g')" || bad "status: $(cat "$dir/status.n")"

# root is not held back
"$CTL" --socket "$SOCK" generate --session r1 -n 2 --temperature 0 "Hi" >/dev/null &&
    "$CTL" --socket "$SOCK" save r1 >/dev/null && "$CTL" --socket "$SOCK" show r1 >/dev/null &&
    ok "root opens and saves sessions meanwhile" || bad "root: $("$CTL" --socket "$SOCK" save r1 2>&1)"

# the gateway: a new conversation of nobody is 507
out=$(as_n curl -s -w '\n%{http_code}' --unix-socket "$dir/h.sock" \
    -d '{"model":"m","messages":[{"role":"user","content":"Hello"}]}' http://x/v1/chat/completions)
code=$(printf '%s\n' "$out" | tail -n 1)
[ "$code" = 507 ] && printf '%s' "$out" | grep -q disk_share_per_uid &&
    ok "through llamad-http: 507 naming disk_share_per_uid" || bad "gateway: $out"

# dropping makes room again
for i in $(seq 1 $saved); do as_n "$CTL" --socket "$SOCK" drop "q$i" >/dev/null 2>&1; done
as_n "$CTL" --socket "$SOCK" drop "q$((saved + 1))" >/dev/null 2>&1
as_n "$CTL" --socket "$SOCK" drop late >/dev/null 2>&1
as_n "$CTL" --socket "$SOCK" generate --session again -n 2 --temperature 0 "Hi" >/dev/null 2>&1 &&
    as_n "$CTL" --socket "$SOCK" save again >/dev/null 2>&1 &&
    ok "after dropping its sessions, nobody opens and saves again" ||
    bad "after dropping: $(as_n "$CTL" --socket "$SOCK" save again 2>&1)"
kill -0 "$pid" && ok "llamad serves on" || bad "llamad died: $(tail -5 "$dir/llamad.log")"

kill $gpid $pid
wait $pid
echo "disk_quota: $([ "$fail" -eq 0 ] && echo all ok || echo FAILED)"
exit "$fail"
