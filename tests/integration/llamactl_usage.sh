#!/bin/sh
# tests/integration/llamactl_usage.sh — llamactl's command line without a
# daemon: --help lists every command, each command's --help works, usage
# errors exit 2 (and are found before connecting), a socket nobody serves
# exits 3 with a message naming the path.
# Env: BUILD (build folder).
BUILD=${BUILD:-build}
CTL=$BUILD/llamactl
SRC=client/cmd.c
. tests/tools/daemon.sh
need_files "$CTL" "$SRC"
test_frame
NOSOCK=$dir/none/llamad.sock      # nothing listens there
unset LLAMAD_SOCKET

# The commands the brief requires, plus whatever the command table holds:
# lines like   &cmd_chat_entry,   (the entry of client/cmd_chat.c, whose
# .name is "chat"); every command file's entry must be in the table.
want="chat summarize generate sessions show fork drop tokenize status"
table=$(sed -n 's/^[[:space:]]*&cmd_\([a-z_]*\)_entry,.*/\1/p' "$SRC" | tr _ -)
# shellcheck disable=SC2086  # split into words on purpose
cmds=$(printf '%s\n' $want $table | sort -u)
ncmds=$(printf '%s\n' "$table" | grep -c .)
[ "$ncmds" -ge 9 ] || bad "found only $ncmds commands in $SRC: the extraction is broken"
for f in client/cmd_*.c; do
    c=${f#client/cmd_}; c=$(printf '%s' "${c%.c}" | tr _ -)
    grep -q "^[[:space:]]*\.name = \"$c\"," "$f" || bad "$f: no entry named \"$c\""
    printf '%s\n' "$table" | grep -qx -- "$c" || bad "$f: command $c is not in $SRC's table"
done

# ---- global --help, --version ------------------------------------------------
"$CTL" --help >"$dir/help" 2>"$dir/err"; rc=$?
[ "$rc" -eq 0 ] || bad "--help exited $rc"
[ -s "$dir/err" ] && bad "--help wrote to stderr: $(cat "$dir/err")"
for c in $cmds; do
    grep -Eq "^  $c( |\$)" "$dir/help" || bad "--help does not list command $c"
done
for o in --socket --json --verbose --help --version; do
    grep -q -- "$o" "$dir/help" || bad "--help does not mention $o"
done
"$CTL" -h >"$dir/h" 2>&1
cmp -s "$dir/h" "$dir/help" || bad "-h differs from --help"
"$CTL" --version >"$dir/v" 2>&1 || bad "--version failed"
grep -q '^llamactl [0-9]' "$dir/v" || bad "--version printed: $(cat "$dir/v")"
echo "ok   --help lists every command; --version"

# ---- each command's --help ---------------------------------------------------
for c in $cmds; do
    "$CTL" "$c" --help >"$dir/ch" 2>"$dir/err"; rc=$?
    if [ "$rc" -ne 0 ]; then
        bad "$c --help exited $rc: $(cat "$dir/err")"; continue
    fi
    [ -s "$dir/err" ] && bad "$c --help wrote to stderr"
    grep -q "^usage: llamactl $c" "$dir/ch" || bad "$c --help lacks 'usage: llamactl $c'"
    "$CTL" help "$c" >"$dir/ch2" 2>&1 || bad "help $c failed"
    cmp -s "$dir/ch" "$dir/ch2" || bad "'help $c' differs from '$c --help'"
    "$CTL" "$c" -h >"$dir/ch3" 2>&1
    cmp -s "$dir/ch" "$dir/ch3" || bad "$c -h differs"
done
# Options each command must document.
need() {  # command options...
    c=$1; shift
    "$CTL" "$c" --help >"$dir/ch" 2>&1
    for o in "$@"; do
        grep -q -- "$o" "$dir/ch" || bad "$c --help does not mention $o"
    done
}
# shellcheck disable=SC2086  # $SAMPLER: a list of words
SAMPLER="--temperature --top-k --top-p --min-p --repeat-penalty --seed --max-tokens --stop"
# shellcheck disable=SC2086
need chat --session --system --template --recap --context-policy $SAMPLER /fork /drop /system /regen /history /quit /help
# shellcheck disable=SC2086
need summarize --max-tokens --session $SAMPLER
# shellcheck disable=SC2086
need generate --session --raw --context-policy $SAMPLER
need show --transcript --last --from --ids
echo "ok   every command's --help (and 'help CMD', '-h')"

# ---- usage errors: exit 2, message + hint on stderr, nothing on stdout -------
# --socket points nowhere: a usage error must be found before connecting
# (else the exit would be 3).
usage_err() {  # expected-substring args...
    want=$1; shift
    "$CTL" "$@" >"$dir/out" 2>"$dir/err" </dev/null; rc=$?
    if [ "$rc" -ne 2 ]; then
        bad "llamactl $*: exit $rc, expected 2 ($(cat "$dir/err"))"
    elif ! grep -q -e "$want" "$dir/err"; then
        bad "llamactl $*: stderr lacks '$want': $(cat "$dir/err")"
    elif ! grep -q -e "--help" "$dir/err"; then
        bad "llamactl $*: no hint to --help: $(cat "$dir/err")"
    elif [ -s "$dir/out" ]; then
        bad "llamactl $*: wrote to stdout"
    fi
}
usage_err "missing command"
usage_err "missing command" --socket "$NOSOCK"
usage_err "unknown command" --socket "$NOSOCK" frobnicate
usage_err "unrecognized option" --frobnicate status
usage_err "unrecognized option" --socket "$NOSOCK" status --frobnicate
usage_err "unrecognized option" --socket "$NOSOCK" chat --bogus
usage_err "unrecognized option" --socket "$NOSOCK" tokenize --temperature 1 hi
usage_err "requires an argument" --socket "$NOSOCK" generate --max-tokens
usage_err "not a number" --socket "$NOSOCK" generate --temperature warm hi
usage_err "out of range" --socket "$NOSOCK" generate --max-tokens 0 hi
usage_err "not a number" --socket "$NOSOCK" generate --max-tokens -5 hi
usage_err "out of range" --socket "$NOSOCK" chat --top-p 1.5
usage_err "not a number" --socket "$NOSOCK" summarize --seed 1x
usage_err "llama3, llama2 or raw" --socket "$NOSOCK" chat --template chatml
usage_err "missing argument" --socket "$NOSOCK" show
usage_err "missing argument" --socket "$NOSOCK" fork a
usage_err "missing argument" --socket "$NOSOCK" drop
usage_err "unexpected argument" --socket "$NOSOCK" fork a b c
usage_err "unexpected argument" --socket "$NOSOCK" sessions extra
usage_err "unexpected argument" --socket "$NOSOCK" status extra
usage_err "unexpected argument" --socket "$NOSOCK" generate two words
usage_err "unexpected argument" --socket "$NOSOCK" summarize file.txt
usage_err "unknown command" help frobnicate
i=0; stops=""
while [ $i -le 16 ]; do stops="$stops --stop s$i"; i=$((i + 1)); done
# $stops: 17 options, split on purpose
# shellcheck disable=SC2086
usage_err "at most 16" --socket "$NOSOCK" generate $stops hi
echo "ok   usage errors exit 2 before connecting"

# ---- cannot connect: exit 3 naming the socket --------------------------------
no_conn() {  # expected-path args...   (stdin: a line of text)
    path=$1; shift
    echo "some text" | "$CTL" "$@" >"$dir/out" 2>"$dir/err"; rc=$?
    if [ "$rc" -ne 3 ]; then
        bad "llamactl $*: exit $rc, expected 3 ($(cat "$dir/err"))"
    elif ! grep -q "cannot connect to $path: " "$dir/err"; then
        bad "llamactl $*: stderr does not name $path: $(cat "$dir/err")"
    elif [ -s "$dir/out" ]; then
        bad "llamactl $*: wrote to stdout"
    fi
}
for args in "status" "sessions" "show x" "fork a b" "drop x" "tokenize hello" \
            "generate hello" "generate -" "summarize" "chat --session x"; do
    # shellcheck disable=SC2086
    no_conn "$NOSOCK" --socket "$NOSOCK" $args
done
no_conn "$NOSOCK" status --socket "$NOSOCK"            # option after the command
grep -q "No such file or directory" "$dir/err" || bad "no errno text: $(cat "$dir/err")"
LLAMAD_SOCKET=$dir/env.sock no_conn "$dir/env.sock" status
LLAMAD_SOCKET=$dir/env.sock no_conn "$dir/cli.sock" --socket "$dir/cli.sock" status
# a file that is not a listening socket
: >"$dir/plain.sock"
no_conn "$dir/plain.sock" --socket "$dir/plain.sock" status
# the default path
if [ "$(id -u)" -ne 0 ]; then
    mkdir -p "$dir/xdg"
    XDG_RUNTIME_DIR=$dir/xdg no_conn "$dir/xdg/llamad/llamad.sock" status
fi
if [ ! -e /run/llamad/llamad.sock ]; then
    if [ "$(id -u)" -eq 0 ]; then
        XDG_RUNTIME_DIR=$dir/xdg no_conn /run/llamad/llamad.sock status
    else
        env -u XDG_RUNTIME_DIR "$CTL" status >/dev/null 2>"$dir/err"
        grep -q "cannot connect to /run/llamad/llamad.sock" "$dir/err" ||
            bad "without XDG_RUNTIME_DIR: $(cat "$dir/err")"
    fi
fi
echo "ok   no daemon: exit 3 naming the socket"

exit $fail
