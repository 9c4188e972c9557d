#!/bin/sh
# tests/integration/deb.sh — the Debian package, as a user gets it:
#  - `make deb` builds it with debhelper (here with CUDA=0, to keep the
#    test short; the CUDA backend builds the same way when nvcc is found);
#    lintian finds no error in it;
#  - dpkg -i installs it: the llamad user and group (sysusers.d), the
#    0700 state directory (tmpfiles.d), the units, the config as a conffile;
#  - the unit's own ExecStart command line, run as the llamad user with the
#    directories systemd would give it (and the sample config pointed at
#    the small model), serves a generation through the installed llamactl,
#    also to another user in group llamad, with XDG_RUNTIME_DIR set, who
#    names no socket (the README's steps);
#  - dpkg --purge removes it.
# Needs root (dpkg -i); skipped otherwise, and when a llamad package is
# installed already (nothing of it is touched). Runs in the plain build
# only: the package builds its own binaries, so a sanitizer build has
# nothing to add. Env: BUILD, MODELS, SHARED.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
SHARED=${SHARED:-../shared}
. tests/tools/daemon.sh

case $BUILD in *asan*|*tsan*) echo "skipped: runs in the plain build only"; exit 0 ;; esac
[ "$(id -u)" -eq 0 ] || { echo "skipped: not root (dpkg -i)"; exit 0; }
if dpkg-query -W -f='${Status}' llamad 2>/dev/null | grep -q "installed"; then
    echo "skipped: a llamad package is installed on this machine already"; exit 0
fi
for c in dpkg-buildpackage lintian setpriv; do
    command -v $c >/dev/null 2>&1 || { echo "FAIL: $c is missing (make deps)"; exit 1; }
done
need_files "$MODELS/stories260K.bin" "$MODELS/tok512.model"
test_frame
installed=
cleanup_deb() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    pid=
    if [ -n "$installed" ]; then
        dpkg --purge llamad >"$dir/purge.log" 2>&1
        rm -rf /var/lib/llamad /run/llamad
    fi
    test_cleanup
}
trap cleanup_deb EXIT

# ---- build and check --------------------------------------------------------
if make --no-print-directory deb BUILD="$BUILD" CUDA=0 >"$dir/build.log" 2>&1; then
    ok "make deb (debhelper, dpkg-buildpackage)"
else
    bad "make deb:"; tail -30 "$dir/build.log"; exit 1
fi
deb=$(ls "$BUILD"/deb/llamad_*_amd64.deb 2>/dev/null | head -1)
[ -f "$deb" ] || { bad "no .deb in $BUILD/deb"; exit 1; }
if lintian --fail-on error "$deb" >"$dir/lintian" 2>&1; then
    ok "lintian: no error ($(grep -c '^W:' "$dir/lintian") warnings)"
    grep '^W:' "$dir/lintian"
else
    bad "lintian:"; cat "$dir/lintian"
fi

# ---- install ------------------------------------------------------------------
if dpkg -i "$deb" >"$dir/install.log" 2>&1; then
    installed=1
    ok "dpkg -i $(basename "$deb")"
else
    installed=1
    bad "dpkg -i:"; cat "$dir/install.log"; exit 1
fi
id llamad >/dev/null 2>&1 && getent group llamad >/dev/null && ok "user and group llamad exist (sysusers.d)" ||
    bad "no llamad user or group after install"
[ "$(stat -c '%a %U' /var/lib/llamad 2>/dev/null)" = "700 llamad" ] && ok "/var/lib/llamad: 0700, owned by llamad" ||
    bad "/var/lib/llamad: $(stat -c '%a %U' /var/lib/llamad 2>&1)"
for f in /usr/bin/llamad /usr/bin/llamactl /usr/bin/llamad-quantize /lib/systemd/system/llamad.service \
         /lib/systemd/system/llamad.socket /usr/share/man/man8/llamad.8.gz; do
    [ -e "$f" ] || bad "not installed: $f"
done
grep -qx 'ListenStream=127.0.0.1:11434' /lib/systemd/system/llamad-http.socket &&
    grep -qx 'ListenStream=/run/llamad/http.sock' /lib/systemd/system/llamad-http.socket &&
    ok "llamad-http.socket: /run/llamad/http.sock and loopback TCP 11434 (Ollama's port)" ||
    bad "llamad-http.socket: $(grep ListenStream /lib/systemd/system/llamad-http.socket 2>&1)"
grep -qx /etc/llamad/llamad.conf /var/lib/dpkg/info/llamad.conffiles && ok "/etc/llamad/llamad.conf is a conffile" ||
    bad "the config is not a conffile"

# ---- the unit's command line, as the llamad user ------------------------------
cmd=$(sed -n 's/^ExecStart=//p' /lib/systemd/system/llamad.service)
case $cmd in /usr/bin/llamad\ *) ;; *) bad "ExecStart is '$cmd'" ;; esac
install -d -o llamad -g llamad -m 0750 /var/lib/llamad/models
install -o llamad -g llamad -m 0640 "$MODELS/stories260K.bin" "$MODELS/tok512.model" /var/lib/llamad/models/
sed -i -e 's|^model = .*|model = /var/lib/llamad/models/stories260K.bin|' \
    -e 's|^#tokenizer = .*|tokenizer = /var/lib/llamad/models/tok512.model|' /etc/llamad/llamad.conf
install -d -o llamad -g llamad -m 0755 /run/llamad          # RuntimeDirectory=llamad
# shellcheck disable=SC2086  # the unit's command line, split as systemd does
STATE_DIRECTORY=/var/lib/llamad RUNTIME_DIRECTORY=/run/llamad \
    setpriv --reuid=llamad --regid=llamad --init-groups $cmd 2>"$dir/llamad.log" &
pid=$!
wait_socket /run/llamad/llamad.sock "$pid" "$dir/llamad.log" 30
out=$(/usr/bin/llamactl --socket /run/llamad/llamad.sock generate --raw --temperature 0 -n 12 "Once upon a time")
want=$(awk '/^--- stdout ---$/ { on = 1; next } on' "$SHARED/reference/stories260K_greedy.txt" | head -1)
case $want in
    "Once upon a time$out"*) ok "the installed daemon, run as llamad by the unit's command line, generates the golden text" ;;
    *) bad "generation: '$out' (golden: '$want')"; cat "$dir/llamad.log" ;;
esac
# the README's next steps: a user added to group llamad, in a login
# session (XDG_RUNTIME_DIR set, its own llamad socket absent), runs
# llamactl without --socket: it falls back to the service's socket
gid=$(getent group llamad | cut -d: -f3)
xdg=$(mktemp -d /tmp/llamad-xdg.XXXXXX) && chown 65534:65534 "$xdg"
out=$(setpriv --reuid=65534 --regid=65534 --groups="$gid" env -i PATH=/usr/bin:/bin HOME="$xdg" \
    XDG_RUNTIME_DIR="$xdg" /usr/bin/llamactl generate --raw --temperature 0 -n 12 "Once upon a time" 2>&1)
rm -rf "$xdg"
case $want in
    "Once upon a time$out"*) ok "a user in group llamad with XDG_RUNTIME_DIR set reaches the service without --socket" ;;
    *) bad "as a member of group llamad, without --socket: '$out'" ;;
esac
/usr/bin/llamactl --socket /run/llamad/llamad.sock status > "$dir/status"
grep -q "state dir: *\/var\/lib\/llamad" "$dir/status" && ok "its state directory is /var/lib/llamad" ||
    bad "status: $(cat "$dir/status")"
[ "$(stat -c %U "/proc/$pid")" = llamad ] || bad "the daemon does not run as llamad"
kill "$pid"; wait "$pid"; rc=$?; pid=
[ "$rc" -eq 0 ] || bad "the daemon exited $rc on SIGTERM"

# ---- purge ----------------------------------------------------------------------
dpkg --purge llamad >"$dir/purge.log" 2>&1 || { bad "dpkg --purge:"; cat "$dir/purge.log"; }
installed=
rm -rf /var/lib/llamad /run/llamad
[ ! -e /usr/bin/llamad ] && [ ! -e /etc/llamad/llamad.conf ] && ok "dpkg --purge removes it" ||
    bad "left after purge: $(ls /usr/bin/llamad /etc/llamad 2>&1)"

[ "$fail" -eq 0 ] && echo "deb: all ok"
exit "$fail"
