# shellcheck shell=sh disable=SC2154  # dir, pids, BUILD, MODELS: set by the sourcing script
# tests/tools/fallback.sh — sourced by tests/integration/nvim.sh and
# emacs.sh (after tests/tools/daemon.sh and `test_frame 755`): the socket an
# editor package connects to when none is configured (no socket option, no
# $LLAMAD_SOCKET), against real daemons. The candidates are the user's
# $XDG_RUNTIME_DIR/llamad/llamad.sock (a user other than root) and then the
# system's /run/llamad/llamad.sock; the next one is tried only when nothing
# listens at one (ENOENT, ECONNREFUSED).
#
# fallback_checks LABEL: the cases below, in this order. The sourcing
# script defines fb_client, which runs the editor through fb_as_nobody (uid
# 65534, HOME $dir/nobody, XDG_RUNTIME_DIR $dir/xdg, no $LLAMAD_SOCKET) and
# prints one line: "result: connected PATH MODEL" (the socket it reached,
# the model its daemon's HelloReply names) or "result: error MESSAGE" (what
# the user was told). The two daemons load the same model through two
# names, $dir/fb-user.bin and $dir/fb-system.bin: the HelloReply tells
# them apart.
#   (a)  no user's socket (ENOENT), the system's up: the system's
#   (a2) a dead user's socket (ECONNREFUSED), the system's up: the system's
#   (e)  $LLAMAD_SOCKET naming no socket, the system's up: an error for
#        that path alone (a configured socket is the only one tried)
#   (b)  both up: the user's
#   (d)  the user's folder not searchable (EACCES), both up: that error,
#        for the user's path; the system's is not tried
#   (c)  no user's socket, a dead system's: an error naming both paths
#        with their errors
# The system socket is the real /run/llamad/llamad.sock. Not root (other
# uids cannot be run, /run cannot be written), a socket already there (a
# real service), or another test holding it (a lock, waited for 300 s):
# a "skipped" line, nothing checked. /run/llamad is made only when
# missing; fallback_cleanup (call it from the EXIT trap, after
# test_cleanup has stopped the daemons) removes what was made.
FB_SYS=/run/llamad/llamad.sock
FB_LOCK=/run/lock/llamad-test-system-socket.lock
fb_made_dir=
fb_made_sock=

# (FB_SOCKET set: $LLAMAD_SOCKET, a path without blanks)
fb_as_nobody() {
    setpriv --reuid=65534 --regid=65534 --clear-groups \
        env -u LLAMAD_SOCKET HOME="$dir/nobody" XDG_RUNTIME_DIR="$dir/xdg" \
        ${FB_SOCKET:+LLAMAD_SOCKET=$FB_SOCKET} "$@"
}

# fb_daemon NAME SOCKET: a daemon other uids may use, on model fb-NAME.bin;
# its pid in $fb_started (and in $pids, for the cleanup)
fb_daemon() {
    "$BUILD/llamad" --model "$dir/fb-$1.bin" --tokenizer "$MODELS/tok512.model" --socket "$2" \
        --socket-mode 0666 --state-dir none --log-level warning 2>"$dir/fb-$1.log" &
    fb_started=$!
    pids="$pids $fb_started"
    wait_socket "$2" "$fb_started" "$dir/fb-$1.log" 30
}
fb_stop() {
    kill "$1" 2>/dev/null
    wait "$1" 2>/dev/null
    pids=$(echo " $pids " | sed "s/ $1 / /")
}
# fb_dead PATH: a socket file nobody listens on (connect: ECONNREFUSED;
# writable by all, or connecting would be EACCES)
fb_dead() {
    rm -f "$1"
    python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' "$1" &&
        chmod 666 "$1"
}

# fb_expect LABEL CASE WANT: run fb_client; WANT: user, system (connected
# there, to that daemon), eacces (an error for the user's path, no
# connection), alone (an error for $FB_SOCKET only) or none (an error
# naming both paths and their errors)
fb_expect() {
    fb_client >"$dir/fb-client.out" 2>&1
    _out=$(sed -n 's/^result: //p' "$dir/fb-client.out" | tail -n 1)
    [ -n "$_out" ] || _out="no result line: $(cat "$dir/fb-client.out")"
    _user=$dir/xdg/llamad/llamad.sock
    case $3 in
        user | system)
            if [ "$3" = user ]; then _p=$_user; else _p=$FB_SYS; fi
            case $_out in
                "connected $_p "*fb-"$3".bin*) ok "$1: $2: connects to the $3's socket $_p" ;;
                *) bad "$1: $2: wanted a connection to $_p (fb-$3.bin), got: $_out" ;;
            esac ;;
        eacces)
            case $_out in
                error*"$_user"*)
                    if printf '%s\n' "$_out" | grep -Eqi 'EACCES|permission denied'; then
                        ok "$1: $2: permission denied on the user's socket is reported, not passed over"
                        echo "     $_out"
                    else
                        bad "$1: $2: the error does not say permission denied: $_out"
                    fi ;;
                *) bad "$1: $2: wanted the user's socket's EACCES, got: $_out" ;;
            esac ;;
        alone)
            case $_out in
                error*"$FB_SOCKET"*"$FB_SYS"* | error*"$FB_SYS"*"$FB_SOCKET"*)
                    bad "$1: $2: the system's socket was tried too: $_out" ;;
                error*"$FB_SOCKET"*) ok "$1: $2: only \$LLAMAD_SOCKET is tried" ;;
                *) bad "$1: $2: wanted an error for $FB_SOCKET alone, got: $_out" ;;
            esac ;;
        none)
            case $_out in
                error*"$_user"*"$FB_SYS"*)
                    if printf '%s\n' "$_out" | grep -Eqi 'ENOENT|no such file' &&
                       printf '%s\n' "$_out" | grep -Eqi 'ECONNREFUSED|connection refused'; then
                        ok "$1: $2: the error names both sockets with their errors"
                        echo "     $_out"
                    else
                        bad "$1: $2: the error lacks a path's error: $_out"
                    fi ;;
                *) bad "$1: $2: wanted an error naming $_user and $FB_SYS, got: $_out" ;;
            esac ;;
    esac
}

fallback_checks() {
    if [ "$(id -u)" -ne 0 ]; then
        echo "skipped: $1: socket fallback (not root: cannot run as another uid, nor use /run/llamad)"
        return 0
    fi
    command -v setpriv >/dev/null 2>&1 || { bad "$1: setpriv (util-linux) is missing"; return 0; }
    # one test at a time on /run/llamad/llamad.sock (other checkouts' too)
    if command -v flock >/dev/null 2>&1 && [ -d "${FB_LOCK%/*}" ]; then
        exec 9>>"$FB_LOCK"
        flock -w 300 9 || { echo "skipped: $1: socket fallback ($FB_LOCK is held)"; return 0; }
    fi
    if [ -e "$FB_SYS" ]; then
        echo "skipped: $1: socket fallback ($FB_SYS exists: a real service)"
        return 0
    fi
    if [ ! -d /run/llamad ]; then
        mkdir -m 755 /run/llamad || { bad "$1: cannot make /run/llamad"; return 0; }
        fb_made_dir=1
    elif [ -z "$(find /run/llamad -maxdepth 0 -perm -o+x)" ]; then
        echo "skipped: $1: socket fallback (/run/llamad exists and uid 65534 cannot search it)"
        return 0
    fi
    fb_made_sock=1
    mkdir -p "$dir/nobody" "$dir/xdg/llamad" && chown 65534:65534 "$dir/nobody" &&
        chmod 755 "$dir/xdg" "$dir/xdg/llamad" &&
        ln -s "$(cd "$MODELS" && pwd)/stories260K.bin" "$dir/fb-user.bin" &&
        ln -s "$(cd "$MODELS" && pwd)/stories260K.bin" "$dir/fb-system.bin" ||
        { bad "$1: fallback set-up"; return 0; }
    _user=$dir/xdg/llamad/llamad.sock

    fb_daemon system "$FB_SYS"; _sys_pid=$fb_started
    fb_expect "$1" "(a) only the system's socket" system
    fb_dead "$_user"
    fb_expect "$1" "(a2) a dead user's socket, the system's up" system
    rm -f "$_user"
    FB_SOCKET=$dir/xdg/llamad/configured.sock
    fb_expect "$1" "(e) \$LLAMAD_SOCKET names no socket, the system's up" alone
    FB_SOCKET=
    fb_daemon user "$_user"; _user_pid=$fb_started
    fb_expect "$1" "(b) both sockets up" user
    chmod 700 "$dir/xdg/llamad"
    fb_expect "$1" "(d) the user's socket not reachable (EACCES)" eacces
    chmod 755 "$dir/xdg/llamad"
    fb_stop "$_user_pid"
    fb_stop "$_sys_pid"
    rm -f "$_user"
    fb_dead "$FB_SYS"
    fb_expect "$1" "(c) neither socket up" none
    rm -f "$FB_SYS"
}

fallback_cleanup() {
    [ -n "$fb_made_sock" ] && rm -f "$FB_SYS"
    [ -n "$fb_made_dir" ] && rmdir /run/llamad 2>/dev/null
    return 0
}
