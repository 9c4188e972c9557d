#!/bin/sh
# tests/integration/nvim.sh — the Neovim plugin (client/nvim) end to end: a
# headless Neovim loads it from a pack folder, as installed
# (site/pack/llamad/start/llamad), and tests/integration/nvim/test.lua
# drives it against real daemons: streamed text = llamactl's, cancel,
# no daemon, a daemon killed mid-stream and restarted, max_text, fake
# daemons sending bad frames (nvim/fake_server.py), fork, sessions,
# transcript paging, the per-project session name, the session list in
# pages (60 sessions over 1024-byte frames; fake daemons: opaque cursors,
# a list that never ends, one that does not advance), responsiveness, and the
# latency figures (printed, never asserted). The protobuf module is checked
# first on its own (nvim/pb_test.lua). Last, the sockets tried with none
# configured (tests/tools/fallback.sh, nvim/fallback.lua run as uid 65534):
# the user's, then the system's /run/llamad/llamad.sock (as root only;
# skipped otherwise).
# Env: BUILD, MODELS, NVIM (the nvim binary, default nvim).
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
NVIM=${NVIM:-nvim}
. tests/tools/daemon.sh
. tests/tools/fallback.sh

command -v "$NVIM" >/dev/null 2>&1 || { echo "FAIL: $NVIM not found (make deps installs neovim)"; exit 1; }
command -v python3 >/dev/null 2>&1 || { echo "FAIL: python3 not found"; exit 1; }
need_files "$BUILD/llamad" "$BUILD/llamactl" "$MODELS/stories260K.bin" "$MODELS/tok512.model"
"$NVIM" --version | head -1

test_frame 755   # the fallback checks run Neovim as uid 65534, on files in it
trap 'test_cleanup; fallback_cleanup' EXIT
root=$(pwd)
abs() { case $1 in /*) echo "$1" ;; *) echo "$root/$1" ;; esac; }

# the plugin, installed as a package; nothing else of the user's is read
site=$dir/data/nvim/site/pack/llamad/start
mkdir -p "$site" "$dir/config" && cp -R client/nvim "$site/llamad" || exit 1
export XDG_DATA_HOME="$dir/data" XDG_CONFIG_HOME="$dir/config" XDG_CACHE_HOME="$dir/cache"
nv() { timeout "${NVIM_TIMEOUT:-300}" "$NVIM" --headless -u NORC -i NONE -n "$@" </dev/null; }
nv -c "helptags $site/llamad/doc" -c 'qall!' >"$dir/helptags.log" 2>&1 && [ -s "$site/llamad/doc/tags" ] ||
    { echo "FAIL: helptags"; cat "$dir/helptags.log"; exit 1; }

# the wire format alone
nv -c "luafile tests/integration/nvim/pb_test.lua" >"$dir/pb.out" 2>&1; rc=$?
cat "$dir/pb.out"
if [ "$rc" -ne 0 ] || ! grep -q '^pb: all ok$' "$dir/pb.out"; then bad "pb_test.lua exited $rc"; fi

# daemon A: the defaults; daemon B: small text and frame limits; daemon D
# (below): small frames, for the session list
daemon() { # SOCKET LOG [FLAGS...]
    _s=$1; _l=$2; shift 2
    # shellcheck disable=SC2086
    "$BUILD/llamad" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
        --socket "$_s" --state-dir none --log-level warning $LLAMAD_FLAGS "$@" 2>"$_l" &
}
daemon "$dir/a.sock" "$dir/a.log"; pid=$!
daemon "$dir/b.sock" "$dir/b.log" --max-text 600 --max-frame 1024; pids=$!
wait_socket "$dir/a.sock" "$pid" "$dir/a.log" 30
wait_socket "$dir/b.sock" "$pids" "$dir/b.log" 30
daemon "$dir/d.sock" "$dir/d.log" --max-frame 1024; pid_d=$!; pids="$pids $pid_d"
wait_socket "$dir/d.sock" "$pid_d" "$dir/d.log" 30

# daemon D: 60 sessions of 40-byte names, more than one 1024-byte frame
# holds: their list comes in pages (made in reverse name order)
paged_sessions "$dir/d.sock" "$dir/list.names"

mkdir "$dir/fake"
python3 tests/integration/nvim/fake_server.py "$dir/fake" 2>"$dir/fake.log" &
pids="$pids $!"
i=0; while [ ! -e "$dir/fake/ready" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
[ -e "$dir/fake/ready" ] || { echo "FAIL: fake_server.py did not start"; cat "$dir/fake.log"; exit 1; }

# a project (a .git folder above the file) and a folder without one; the
# names the plugin must give them: base name reduced to [A-Za-z0-9._-],
# 40 bytes at most, "-", 8 hex digits of sha256 of the absolute path
proj="$dir/My Project+été-$(printf 'x%.0s' $(seq 50))"
mkdir -p "$proj/.git" "$proj/src/deep" "$dir/plain dir"
proj=$(cd "$proj" && pwd -P); plain=$(cd "$dir/plain dir" && pwd -P)
name_of() {
    printf '%s-%s' "$(basename "$1" | LC_ALL=C tr -cd 'A-Za-z0-9._-' | cut -c1-40)" \
        "$(printf '%s' "$1" | sha256sum | cut -c1-8)"
}
: >"$proj/src/deep/file.txt"

T_DIR=$dir T_SOCK=$dir/a.sock T_SMALL=$dir/b.sock T_FAKE=$dir/fake T_PIDS=$dir/c.pids
T_LLAMAD=$(abs "$BUILD/llamad") T_LLAMACTL=$(abs "$BUILD/llamactl")
T_MODEL=$(abs "$MODELS/stories260K.bin") T_TOK=$(abs "$MODELS/tok512.model")
T_PROJ_FILE=$proj/src/deep/file.txt T_PROJ_NAME=$(name_of "$proj")
T_PLAIN_DIR=$plain T_PLAIN_NAME=$(name_of "$plain")
T_LIST=$dir/d.sock T_LIST_NAMES=$dir/list.names
LLAMAD_SOCKET=$dir/default.sock
export T_DIR T_SOCK T_SMALL T_FAKE T_PIDS T_LLAMAD T_LLAMACTL T_MODEL T_TOK T_PROJ_FILE T_PROJ_NAME \
    T_PLAIN_DIR T_PLAIN_NAME T_LIST T_LIST_NAMES LLAMAD_SOCKET
: >"$T_PIDS"
nv -c "luafile tests/integration/nvim/test.lua" >"$dir/test.out" 2>"$dir/test.err"; rc=$?
cat "$dir/test.out"
# daemons the test started (daemon C), if still running
pids="$pids $(cat "$T_PIDS")"
if [ "$rc" -ne 0 ] || ! grep -q '^test.lua: all ok$' "$dir/test.out"; then
    bad "test.lua exited $rc"
    [ -s "$dir/test.err" ] && { echo "--- nvim stderr"; cat "$dir/test.err"; }
    for l in a b c d; do [ -s "$dir/$l.log" ] && { echo "--- daemon $l log"; cat "$dir/$l.log"; }; done
fi
grep -q '^FAIL' "$dir/test.out" && fail=1

# the default sockets, tried in turn
cp tests/integration/nvim/fallback.lua "$dir/fallback.lua" && chmod -R a+rX "$dir/data" || exit 1
fb_client() {
    fb_as_nobody XDG_DATA_HOME="$dir/data" XDG_CONFIG_HOME="$dir/nobody/config" \
        XDG_CACHE_HOME="$dir/nobody/cache" XDG_STATE_HOME="$dir/nobody/state" \
        timeout 60 "$NVIM" --headless -u NORC -i NONE -n -c "luafile $dir/fallback.lua" </dev/null
}
fallback_checks nvim
[ "$fail" -eq 0 ] && echo "nvim: all ok"
exit "$fail"
