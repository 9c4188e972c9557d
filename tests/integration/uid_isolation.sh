#!/bin/sh
# tests/integration/uid_isolation.sh — sessions belong to the uid that made
# them. The daemon runs as root on a socket anyone may use (--socket-mode
# 0666, in a world-readable folder); uid 65534 (nobody) makes a session;
# uid 65533 cannot list, show, fork or drop it (UNKNOWN_SESSION: its name
# simply does not exist for that uid), and making its own session of the
# same name leaves nobody's alone; root sees both.
#
# Needs root (to switch uids with setpriv). Not root: skipped.
# Client: $BUILD/llamactl when it works, else tests/tools/protoclient.c,
# compiled here by build_protoclient (tests/tools/daemon.sh)
# (TEST_CLIENT=protoclient forces it).
# Env: BUILD (build folder), MODELS.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh

if [ "$(id -u)" -ne 0 ]; then
    command -v setpriv >/dev/null 2>&1 || { echo "skipped: no setpriv"; exit 0; }
    echo "skipped: not root (cannot switch uids)"
    exit 0
fi
command -v setpriv >/dev/null 2>&1 || { echo "FAIL: setpriv (util-linux) is missing"; exit 1; }
need_files "$BUILD/llamad" "$MODELS/stories260K.bin" "$MODELS/tok512.model"

test_frame 755   # other uids connect to the socket in it
SOCK=$dir/llamad.sock

# run "$@" as uid $1 (0: as we are)
as_uid() {
    u=$1; shift
    if [ "$u" -eq 0 ]; then "$@"; else setpriv --reuid="$u" --regid="$u" --clear-groups "$@"; fi
}

"$BUILD/llamad" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
    --socket "$SOCK" --state-dir none --socket-mode 0666 --max-tokens 8 --log-level debug 2>"$dir/llamad.log" &
pid=$!
wait_socket "$SOCK" "$pid" "$dir/llamad.log" 30
mode=$(stat -c %a "$SOCK")
[ "$mode" = 666 ] && ok "socket mode 0666" || bad "socket mode is $mode, not 666"

# ---- the client ------------------------------------------------------------
CLIENT=
if [ "${TEST_CLIENT:-}" != protoclient ] && [ -x "$BUILD/llamactl" ]; then
    cp "$BUILD/llamactl" "$dir/llamactl" && chmod 755 "$dir/llamactl"
    out=$("$dir/llamactl" --socket "$SOCK" sessions --json 2>&1)
    case $out in
        \[*) CLIENT=llamactl ;;
        *) echo "note: $BUILD/llamactl does not work here ($out); using protoclient" ;;
    esac
fi
if [ -z "$CLIENT" ]; then
    build_protoclient "$dir/protoclient"
    chmod 755 "$dir/protoclient"
    CLIENT=protoclient
fi
echo "client: $CLIENT"

# c UID OP ARGS: one client command as UID; output (stdout + stderr) in $out,
# exit status in $rc
c() {
    u=$1 op=$2; shift 2
    if [ "$CLIENT" = llamactl ]; then
        L="$dir/llamactl --socket $SOCK"
        case $op in
            generate) out=$(as_uid "$u" $L generate --session "$1" -n 8 --temperature 0 "$2" 2>&1) ;;
            list) out=$(as_uid "$u" $L sessions --json 2>&1) ;;
            show) out=$(as_uid "$u" $L show "$1" 2>&1) ;;
            fork) out=$(as_uid "$u" $L fork "$1" "$2" 2>&1) ;;
            drop) out=$(as_uid "$u" $L drop "$1" 2>&1) ;;
        esac
    else
        P="$dir/protoclient $SOCK"
        case $op in
            generate) out=$(as_uid "$u" $P generate "$1" "$2" 8 2>&1) ;;
            list) out=$(as_uid "$u" $P list 2>&1) ;;
            show) out=$(as_uid "$u" $P info "$1" 2>&1) ;;
            fork) out=$(as_uid "$u" $P fork "$1" "$2" 2>&1) ;;
            drop) out=$(as_uid "$u" $P drop "$1" 2>&1) ;;
        esac
    fi
    rc=$?
}

# what show printed, less the time of last use (it reads "3s ago")
shown() { printf '%s\n' "$out" | grep -vi 'last.use'; }

# expect: the last command failed with UNKNOWN_SESSION
unknown() {
    if [ "$rc" -eq 1 ] && printf '%s\n' "$out" | grep -qi "unknown session"; then
        ok "$1: unknown session"
    else
        bad "$1: expected an unknown-session error, got rc $rc: $out"
    fi
}

NAME=iso-secret
NOBODY=65534 OTHER=65533

# ---- nobody makes a session --------------------------------------------------
c $NOBODY generate $NAME "Once upon a time"
[ "$rc" -eq 0 ] && ok "uid $NOBODY made session $NAME" || bad "uid $NOBODY generate: rc $rc: $out"
c $NOBODY list
printf '%s\n' "$out" | grep -q "$NAME" && ok "uid $NOBODY lists $NAME" || bad "uid $NOBODY list: $out"
c $NOBODY show $NAME
[ "$rc" -eq 0 ] && ok "uid $NOBODY shows $NAME" || bad "uid $NOBODY show: rc $rc: $out"
before=$(shown)

# ---- another uid sees nothing -------------------------------------------------
c $OTHER list
if [ "$rc" -eq 0 ] && ! printf '%s\n' "$out" | grep -q "$NAME"; then
    ok "uid $OTHER: list does not show it"
else
    bad "uid $OTHER list: rc $rc: $out"
fi
c $OTHER show $NAME;         unknown "uid $OTHER show"
c $OTHER fork $NAME stolen;  unknown "uid $OTHER fork"
c $OTHER drop $NAME;         unknown "uid $OTHER drop"
c $OTHER show stolen;        unknown "uid $OTHER: no fork was made"
if [ "$CLIENT" = protoclient ]; then
    out=$(as_uid $OTHER "$dir/protoclient" "$SOCK" status 2>&1)
    printf '%s\n' "$out" | grep -q "^status sessions=0 " &&
        ok "uid $OTHER: status counts none of it" || bad "uid $OTHER status: $out"
fi

# nothing changed for nobody
c $NOBODY show $NAME
[ "$rc" -eq 0 ] && [ "$(shown)" = "$before" ] && ok "uid $NOBODY: $NAME unchanged" ||
    bad "uid $NOBODY show after: rc $rc: $out (before: $before)"

# ---- the same name for another uid is another session -------------------------
c $OTHER generate $NAME "The little dog"
[ "$rc" -eq 0 ] && ok "uid $OTHER made its own $NAME" || bad "uid $OTHER generate: rc $rc: $out"

# ---- root sees both ----------------------------------------------------------
c 0 list
n=$(printf '%s\n' "$out" | grep -o "$NAME" | wc -l)
if printf '%s\n' "$out" | grep -Eq "owner(_uid\")?[=:]$NOBODY" &&
   printf '%s\n' "$out" | grep -Eq "owner(_uid\")?[=:]$OTHER" && [ "$n" -eq 2 ]; then
    ok "root lists both sessions named $NAME (uids $NOBODY and $OTHER)"
else
    bad "root list: $out"
fi

# root's table names the owner of each (nobody's name, the other uid's
# number when it has no name); a user's own table has no OWNER column
if [ "$CLIENT" = llamactl ]; then
    tab=$("$dir/llamactl" --socket "$SOCK" sessions 2>&1)
    own=$(as_uid "$OTHER" "$dir/llamactl" --socket "$SOCK" sessions 2>&1)
    nobody=$(getent passwd "$NOBODY" | cut -d: -f1)
    if printf '%s\n' "$tab" | head -n 1 | grep -q '^OWNER ' &&
       printf '%s\n' "$tab" | grep -Eq "^${nobody:-$NOBODY} +$NAME " &&
       printf '%s\n' "$tab" | grep -Eq "^(${OTHER}|$(getent passwd "$OTHER" | cut -d: -f1)) +$NAME " &&
       ! printf '%s\n' "$own" | grep -q OWNER; then
        ok "root's sessions table has an OWNER column; a user's own has none"
    else bad "sessions tables: root: $tab; uid $OTHER: $own"; fi
fi

# ---- each drops its own ---------------------------------------------------------
c $OTHER drop $NAME
[ "$rc" -eq 0 ] && ok "uid $OTHER dropped its own $NAME" || bad "uid $OTHER drop own: rc $rc: $out"
c $NOBODY show $NAME
[ "$rc" -eq 0 ] && [ "$(shown)" = "$before" ] && ok "uid $NOBODY: $NAME still there" ||
    bad "uid $NOBODY show after the other's drop: rc $rc: $out"
c $NOBODY drop $NAME
[ "$rc" -eq 0 ] && ok "uid $NOBODY dropped $NAME" || bad "uid $NOBODY drop: rc $rc: $out"
c 0 list
printf '%s\n' "$out" | grep -q "$NAME" && bad "root still lists $NAME: $out" || ok "all gone"

# ---- stop -----------------------------------------------------------------------
kill -TERM "$pid"
wait "$pid"; st=$?
pid=
[ "$st" -eq 0 ] && ok "llamad exited 0 on SIGTERM" || { bad "llamad exited $st"; cat "$dir/llamad.log"; }
exit $fail
