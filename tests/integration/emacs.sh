#!/bin/sh
# tests/integration/emacs.sh — the Emacs package client/emacs/ (llamad.el,
# llamad-proto.el). It byte-compiles with byte-compile-error-on-warn (a
# warning fails), and its ERT tests (tests/integration/emacs/llamad-test.el)
# pass against real daemons on private sockets: the codec and framing; the
# streamed text equals llamactl's for the same session state; cancel keeps
# the partial answer (GetTranscript); no daemon gives one clear message; a
# daemon killed mid-answer (SIGTERM) is reported, the text kept, and a
# restarted one is reconnected to; text over max_text is refused unsent;
# oversized and malformed reply frames (a fake server) are errors, not
# hangs; fork, session listing, transcript paging (max_frame 1024), the
# session list in pages (60 sessions over 1024-byte frames; fake servers:
# opaque cursors, a list that never ends, one that does not advance), the
# per-project session name (against sha256sum here). Prints the latency the
# package adds per token event (lines "latency: ..."); timing never fails it.
# Last, the sockets tried with none configured (tests/tools/fallback.sh,
# emacs/fallback.el run as uid 65534): the user's, then the system's
# /run/llamad/llamad.sock (as root only; skipped otherwise).
# Needs emacs (Debian: emacs-nox, which make deps installs): fails without.
# Env: BUILD, MODELS, LLAMAD_FLAGS (extra daemon flags), EMACS (default emacs).
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
EMACS=${EMACS:-emacs}
. tests/tools/daemon.sh
. tests/tools/fallback.sh

command -v "$EMACS" >/dev/null 2>&1 || { echo "FAIL: $EMACS not found (make deps installs emacs-nox)"; exit 1; }
need_files "$BUILD/llamad" "$BUILD/llamactl" "$MODELS/stories260K.bin" "$MODELS/tok512.model" \
    client/emacs/llamad.el client/emacs/llamad-proto.el tests/integration/emacs/llamad-test.el
BUILD=$(cd "$BUILD" && pwd)
MODELS=$(cd "$MODELS" && pwd)

test_frame 755   # the fallback checks run Emacs as uid 65534, on files in it
# the daemon a test restarts is Emacs's child: stop it too
trap 'if [ -f "$dir/restarted.pid" ]; then kill "$(cat "$dir/restarted.pid")" 2>/dev/null; fi
    test_cleanup; fallback_cleanup' EXIT

args="--model $MODELS/stories260K.bin --tokenizer $MODELS/tok512.model --log-level warning $LLAMAD_FLAGS"
start() {  # start NAME [FLAGS...]: a daemon on $dir/NAME.sock; its pid in $started
    _n=$1; shift
    # shellcheck disable=SC2086
    "$BUILD/llamad" $args --socket "$dir/$_n.sock" --state-dir none "$@" 2>"$dir/$_n.log" &
    started=$!
    pids="$pids $started"
    wait_socket "$dir/$_n.sock" "$started" "$dir/$_n.log" 30
}
start a; pid_a=$started
start b --max-text 64 --max-frame 1024
start c; pid_c=$started
start d --max-frame 1024

# daemon D: 60 sessions of 40-byte names, more than one 1024-byte frame
# holds: their list comes in pages (made in reverse name order)
paged_sessions "$dir/d.sock" "$dir/list.names"

# a project folder (with .git) whose name needs reducing, and its session
# name by a second formula: the name's [A-Za-z0-9._-] bytes, at most 40, a
# dash, the first 8 hex digits of the SHA-256 of the absolute path
proj="$dir/My Project é.x+y (with a-very_long.name past forty characters)"
mkdir -p "$proj/.git" || exit 1
base=$(basename "$proj" | LC_ALL=C tr -cd 'A-Za-z0-9._-' | cut -c1-40)
hash=$(printf %s "$proj" | sha256sum | cut -c1-8)
[ "$base" = "MyProject.xywitha-very_long.namepastfort" ] || bad "the shell's reduced name is $base"

# byte-compile a copy: any warning is an error
elc=$dir/elc
mkdir "$elc" && cp client/emacs/*.el "$elc/" || exit 1
if "$EMACS" --batch -Q -L "$elc" --eval '(setq byte-compile-error-on-warn t)' \
    -f batch-byte-compile "$elc/llamad-proto.el" "$elc/llamad.el" >"$dir/compile.log" 2>&1 &&
    [ -f "$elc/llamad.elc" ] && [ -f "$elc/llamad-proto.elc" ]; then
    ok "byte-compiles without warnings (byte-compile-error-on-warn)"
else
    bad "byte-compile:"; cat "$dir/compile.log"
fi

# the ERT tests, on the compiled package (every wait in them is bounded)
LLAMAD_TEST_LLAMAD=$BUILD/llamad LLAMAD_TEST_LLAMACTL=$BUILD/llamactl \
LLAMAD_TEST_ARGS="$args" LLAMAD_TEST_DIR=$dir \
LLAMAD_TEST_SOCK_A=$dir/a.sock LLAMAD_TEST_PID_A=$pid_a \
LLAMAD_TEST_SOCK_B=$dir/b.sock \
LLAMAD_TEST_SOCK_C=$dir/c.sock LLAMAD_TEST_PID_C=$pid_c \
LLAMAD_TEST_SOCK_D=$dir/d.sock LLAMAD_TEST_LIST_NAMES=$dir/list.names \
LLAMAD_TEST_PROJECT=$proj LLAMAD_TEST_PROJECT_NAME=$base-$hash \
    timeout 600 "$EMACS" --batch -Q -L "$elc" -l tests/integration/emacs/llamad-test.el \
    -f ert-run-tests-batch-and-exit >"$dir/ert.log" 2>&1
rc=$?
sed -n 's/^LATENCY /latency: /p' "$dir/ert.log"
grep -E '^(cancel|killed|transcript|sessions|no daemon):' "$dir/ert.log"
sed -n 's/^ *passed  *[0-9]*\/[0-9]*  *\(llamad-test-[a-z-]*\).*/ok   ert \1/p' "$dir/ert.log"
if [ "$rc" -ne 0 ] || ! grep -q '^Ran [0-9]* tests, [0-9]* results as expected, 0 unexpected' "$dir/ert.log"; then
    bad "ERT (exit $rc):"
    cat "$dir/ert.log"
fi

# the default sockets, tried in turn (on the compiled package)
cp tests/integration/emacs/fallback.el "$dir/fallback.el" && chmod -R a+rX "$elc" || exit 1
fb_client() {
    fb_as_nobody timeout 60 "$EMACS" --batch -Q -L "$elc" -l "$dir/fallback.el"
}
fallback_checks emacs

[ "$fail" -eq 0 ] && echo "emacs: all ok"
exit "$fail"
