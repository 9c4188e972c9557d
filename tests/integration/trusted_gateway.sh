#!/bin/sh
# tests/integration/trusted_gateway.sh — a gateway's connection acts for
# another uid (Hello.on_behalf_of_uid) only when its own uid is root or in
# trusted_gateways. The daemon runs as root on a socket anyone may use;
# uid 65534 (nobody, listed by name in the config file) is the gateway,
# 65533 the user it acts for, 65532 another user, 65531 a client that is not
# trusted. Checked: the untrusted client gets PERMISSION_DENIED and keeps
# its own uid (it sees none of 65533's sessions, and what it opens is its
# own, a session of its own when it names one of 65533's); the trusted
# gateway's Hello says the uid it acts as, the sessions it
# opens belong to 65533 (owner_uid), it sees 65533's own sessions and not
# 65532's, 65533 sees the gateway's; 65533's max_sessions_per_uid counts the
# sessions made through the gateway; an on_behalf_of_uid after another
# request, or a second one, is BAD_REQUEST; a non-root gateway may not act
# for root, root may act for anyone; the log line; SIGHUP adding 65531 and
# removing nobody, and a SIGHUP naming an unknown user (refused, the list
# kept); an unknown user at start-up stops it.
#
# Needs root (to switch uids with setpriv). Not root: skipped.
# Client: tests/tools/protoclient.c (several operations on one connection).
# Env: BUILD (build folder), MODELS.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh

if [ "$(id -u)" -ne 0 ]; then
    echo "skipped: not root (cannot switch uids)"
    exit 0
fi
command -v setpriv >/dev/null 2>&1 || { echo "FAIL: setpriv (util-linux) is missing"; exit 1; }
need_files "$BUILD/llamad" "$MODELS/stories260K.bin" "$MODELS/tok512.model"
getent passwd nobody >/dev/null || { echo "skipped: no user nobody"; exit 0; }
GW=$(id -u nobody) X=65533 Y=65532 UNTRUSTED=65531
[ "$GW" -ne "$X" ] && [ "$GW" -ne "$Y" ] && [ "$GW" -ne "$UNTRUSTED" ] ||
    { echo "skipped: nobody's uid $GW is one of the test's"; exit 0; }

test_frame 755
SOCK=$dir/s
build_protoclient "$dir/pc"
chmod 755 "$dir/pc"

# p UID OP ARGS [-- OP ARGS]...: protoclient as UID (0: as we are); output
# in $out, exit status in $rc
p() {
    u=$1; shift
    if [ "$u" -eq 0 ]; then out=$("$dir/pc" "$SOCK" "$@" 2>&1)
    else out=$(setpriv --reuid="$u" --regid="$u" --clear-groups "$dir/pc" "$SOCK" "$@" 2>&1); fi
    rc=$?
}
has() { printf '%s\n' "$out" | grep -q "$1"; }

# ---- an unknown user name stops the start-up ---------------------------------------
printf 'trusted_gateways = nobody no-such-user-llamad\n' >"$dir/bad.conf"
"$BUILD/llamad" --config "$dir/bad.conf" --model "$MODELS/stories260K.bin" \
    --tokenizer "$MODELS/tok512.model" --socket "$dir/bad.sock" --state-dir none \
    >"$dir/bad.log" 2>&1
st=$?
[ "$st" -eq 2 ] && grep -q "bad.conf:1: trusted_gateways = .*no user named 'no-such-user-llamad'" "$dir/bad.log" &&
    ok "an unknown user in trusted_gateways: exit 2, file:line and the name" ||
    bad "unknown user at start-up: exit $st: $(cat "$dir/bad.log")"

# ---- the daemon --------------------------------------------------------------------
printf 'trusted_gateways = nobody\nmax_sessions_per_uid = 3\n' >"$dir/conf"
"$BUILD/llamad" --config "$dir/conf" --model "$MODELS/stories260K.bin" \
    --tokenizer "$MODELS/tok512.model" --socket "$SOCK" --state-dir none --socket-mode 0666 \
    --max-tokens 4 --log-level info 2>"$dir/llamad.log" &
pid=$!
wait_socket "$SOCK" "$pid" "$dir/llamad.log" 30

# 65533 and 65532 make their own sessions
p $X generate x-own "Once upon a time" 4
[ "$rc" -eq 0 ] && ok "uid $X made x-own" || bad "uid $X generate: $out"
p $Y generate y-own "Once upon a time" 4
[ "$rc" -eq 0 ] && ok "uid $Y made y-own" || bad "uid $Y generate: $out"

# ---- not trusted: refused, keeps its own uid -----------------------------------------
p $UNTRUSTED hello-as $X "token:mallory" -- list -- info x-own -- open u-own
if has "^error PERMISSION_DENIED (permission denied): uid $UNTRUSTED is not a trusted gateway (trusted_gateways in llamad.conf)$" &&
   has "^sessions 0$" && has "^error UNKNOWN_SESSION" && has "^session u-own .*owner=$UNTRUSTED "; then
    ok "uid $UNTRUSTED (not trusted): PERMISSION_DENIED; it sees none of uid $X's sessions, opens its own"
else
    bad "untrusted: $out"
fi
p $X info x-own
x_before=$(printf '%s\n' "$out" | grep '^session x-own')
p $UNTRUSTED hello-as $X -- generate x-own "and then" 2
has "^session x-own .*owner=$UNTRUSTED .*created=1" &&
    ok "uid $UNTRUSTED generating in 'x-own' makes its own session of that name" ||
    bad "untrusted generate: $out"
p $X info x-own
[ "$(printf '%s\n' "$out" | grep '^session x-own')" = "$x_before" ] && ok "uid $X's x-own untouched" ||
    bad "uid $X's x-own changed: $out (before: $x_before)"

# ---- trusted: acts for 65533 -----------------------------------------------------------
p $GW hello-as $X "token:alice" -- open x-gw -- list -- info y-own -- generate x-gw "The dog" 4
if has "^hello 1 512 uid=$X$" && has "^session x-gw .*owner=$X .*created=1" &&
   has "^session x-own .*owner=$X " && has "^sessions 2$" && ! has "y-own .*owner" &&
   has "^error UNKNOWN_SESSION.*y-own" && has "^done "; then
    ok "nobody (trusted) acting for uid $X: Hello says uid $X, x-gw owned by $X, sees x-own, not y-own"
else
    bad "trusted gateway: $out"
fi
grep -q "connection [0-9]* (uid $GW): acting for uid $X (token:alice)" "$dir/llamad.log" &&
    ok "logged: acting for uid $X (token:alice)" || bad "no log line: $(grep -i acting "$dir/llamad.log")"
p $X list
has "^session x-gw .*owner=$X " && has "^sessions 2$" && ok "uid $X itself sees x-gw" || bad "uid $X list: $out"
p $Y list
! has "x-gw" && has "^sessions 1$" && ok "uid $Y does not see x-gw" || bad "uid $Y list: $out"
p $GW list
! has "x-gw" && ! has "x-own" && ok "nobody's own connection (no Hello) sees none of them" ||
    bad "gateway's own list: $out"

# ---- 65533's quota (3) counts the gateway's sessions -----------------------------------
p $GW hello-as $X -- open x-gw2 -- open x-gw3
has "^session x-gw2 .*owner=$X .*created=1" && has "^error RESOURCE_EXHAUSTED.*quota of 3" &&
    ok "through the gateway: the third session of uid $X is refused (quota 3)" || bad "quota via gateway: $out"
p $X open x-direct
has "^error RESOURCE_EXHAUSTED.*quota of 3" && ok "uid $X directly: quota reached by the gateway's sessions" ||
    bad "quota direct: $out"
p $X drop x-gw2
[ "$rc" -eq 0 ] && ok "uid $X drops x-gw2, made through the gateway" || bad "drop x-gw2: $out"

# ---- only first, only once; not for root; root may ---------------------------------------
p $GW list -- hello-as $X
has "^error BAD_REQUEST (bad request): on_behalf_of_uid is only accepted in the first request$" &&
    ok "on_behalf_of_uid after another request: BAD_REQUEST" || bad "late hello: $out"
p $GW hello-as $X -- hello-as $Y -- list
has "^hello 1 512 uid=$X$" && has "^error BAD_REQUEST.*first request" && has "x-own" && ! has "y-own" &&
    ok "a second on_behalf_of_uid: BAD_REQUEST, the connection still acts for uid $X" || bad "second hello: $out"
p $GW hello-as 0 -- list
has "^error PERMISSION_DENIED.*may not act for root" && ! has "y-own" &&
    ok "nobody may not act for root" || bad "act for root: $out"
p 0 hello-as $Y "root's own" -- list -- open y-root
has "^hello 1 512 uid=$Y$" && has "y-own" && ! has "x-own" && has "^session y-root .*owner=$Y " &&
    ok "root (not listed) acts for uid $Y" || bad "root acting: $out"
p $X hello-as $X -- list
has "^hello 1 512 uid=$X$" && has "x-own" && ok "an untrusted uid naming itself: accepted, nothing changes" ||
    bad "self: $out"

# ---- SIGHUP: 65531 added, nobody removed; then an unknown name refused ------------------
n_hup=0
hup() {   # hup CONFIG-TEXT: write it, SIGHUP, wait for the reload's log line
    printf "$1" >"$dir/conf"
    n_hup=$((n_hup + 1))
    kill -HUP "$pid"
    _i=0
    while [ "$(grep -c "SIGHUP: " "$dir/llamad.log")" -lt "$n_hup" ] && [ $_i -lt 50 ]; do
        sleep 0.1; _i=$((_i + 1)); done
}
hup "trusted_gateways = $UNTRUSTED\nmax_sessions_per_uid = 3\n"
p $UNTRUSTED hello-as $X -- list
has "^hello 1 512 uid=$X$" && has "x-own" && ok "after SIGHUP: uid $UNTRUSTED is trusted" || bad "after HUP, added: $out"
p $GW hello-as $X -- list
has "^error PERMISSION_DENIED.*uid $GW is not a trusted gateway" && ! has "x-own" &&
    ok "after SIGHUP: nobody is not any more" || bad "after HUP, removed: $out"
hup "trusted_gateways = nobody, no-such-user-llamad\n"
grep -q "SIGHUP: .*no user named 'no-such-user-llamad'; keeping the current settings" "$dir/llamad.log" &&
    ok "SIGHUP naming an unknown user: logged, settings kept" || bad "bad HUP: $(tail -3 "$dir/llamad.log")"
p $UNTRUSTED hello-as $X -- list
has "^hello 1 512 uid=$X$" && ok "uid $UNTRUSTED still trusted after the refused reload" || bad "after bad HUP: $out"
p $GW hello-as $X
has "^error PERMISSION_DENIED" && ok "nobody still not trusted after the refused reload" || bad "after bad HUP, nobody: $out"

# ---- stop ----------------------------------------------------------------------------------
kill -TERM "$pid"
wait "$pid"; st=$?
pid=
[ "$st" -eq 0 ] && ok "llamad exited 0 on SIGTERM" || { bad "llamad exited $st"; cat "$dir/llamad.log"; }
exit $fail
