#!/bin/sh
# tests/integration/install.sh — `make install` as a packager uses it:
#  - PREFIX and SYSCONFDIR reach the units (ExecStart, --config) and the man
#    pages (the .proto's path); the tree holds the binaries (llamad-quantize
#    too), units, sysusers.d and tmpfiles.d entries, the sample config, the
#    .proto and the editor packages;
#  - systemd-analyze verify accepts the installed units (their command and
#    man pages found), and `systemd-analyze security --offline=yes` rates
#    the service at most 1.5 ("SAFE"/"OK");
#  - systemd-sysusers and systemd-tmpfiles, on a scratch root, make the
#    llamad user and its 0700 state directory;
#  - DESTDIR with PREFIX=/usr: the same files under /usr; the gateway's
#    socket unit listens on its Unix socket and loopback TCP 11434, and the
#    installed llamad-http, started on those by systemd-socket-activate,
#    answers the Ollama npm client with its default host;
#  - `make uninstall` leaves nothing behind.
# Env: BUILD (build folder; its binaries must be built), MODELS.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh
need_files "$BUILD/llamad" "$BUILD/llamactl" "$BUILD/llamad-quantize"
for c in systemd-analyze systemd-sysusers systemd-tmpfiles; do
    command -v $c >/dev/null 2>&1 || { echo "FAIL: $c is missing (package systemd)"; exit 1; }
done
test_frame
mk() { make --no-print-directory -s BUILD="$BUILD" NOBUILD=1 SYSTEM_SETUP=no "$@" >"$dir/make.log" 2>&1 || { bad "make $*:"; cat "$dir/make.log"; }; }

# ---- PREFIX in a scratch folder: the units run what was installed -----------
P=$dir/usr E=$dir/etc
mk install PREFIX="$P" SYSCONFDIR="$E"
for f in bin/llamad bin/llamactl bin/llamad-quantize bin/llamad-http lib/systemd/system/llamad.service \
         lib/systemd/system/llamad.socket lib/systemd/system/llamad-http.service \
         lib/systemd/system/llamad-http.socket lib/systemd/system/llamad@.service \
         lib/systemd/system/llamad@.socket share/man/man8/llamad-http.8 \
         lib/sysusers.d/llamad.conf lib/tmpfiles.d/llamad.conf \
         share/llamad/llamad.proto share/man/man8/llamad.8 share/man/man1/llamactl.1 \
         share/man/man5/llamad.conf.5 share/man/man7/llamad-protocol.7 \
         share/nvim/site/pack/llamad/start/llamad/plugin/llamad.lua \
         share/emacs/site-lisp/llamad.el; do
    [ -f "$P/$f" ] || bad "not installed: PREFIX/$f"
done
[ -f "$E/llamad/llamad.conf" ] || bad "no sample config in SYSCONFDIR"
grep -qx "ExecStart=$P/bin/llamad --config $E/llamad/llamad.conf" "$P/lib/systemd/system/llamad.service" &&
    ok "ExecStart names PREFIX's llamad and SYSCONFDIR's config" ||
    bad "ExecStart: $(grep ExecStart "$P/lib/systemd/system/llamad.service")"
grep -q "$P/share/llamad/llamad.proto" "$P/share/man/man7/llamad-protocol.7" &&
    ! grep -q "/usr/local/" "$P/share/man/man7/llamad-protocol.7" &&
    ok "llamad-protocol(7) names the installed .proto" || bad "llamad-protocol(7) FILES: wrong path"
if SYSTEMD_UNIT_PATH="$P/lib/systemd/system:" MANPATH="$P/share/man" \
    systemd-analyze verify llamad.service llamad.socket llamad-http.service llamad-http.socket \
        llamad@small.service llamad@small.socket >"$dir/verify" 2>&1 && [ ! -s "$dir/verify" ]; then
    ok "systemd-analyze verify: no complaint about the installed units"
else
    bad "systemd-analyze verify:"; cat "$dir/verify"
fi
# exposure UNIT MAX: systemd-analyze security's score of the installed UNIT
# is at most MAX
exposure() {
    systemd-analyze security --offline=yes "$P/lib/systemd/system/$1" >"$dir/sec" 2>&1
    score=$(sed -n "s/.*Overall exposure level for $1: \([0-9.]*\).*/\1/p" "$dir/sec")
    if [ -n "$score" ] && awk -v s="$score" -v m="$2" 'BEGIN { exit !(s <= m) }'; then
        ok "systemd-analyze security --offline=yes $1: exposure $score (at most $2)"
    else
        bad "systemd-analyze security $1: exposure '$score':"; cat "$dir/sec"
    fi
}
exposure llamad.service 1.5
# llamad@NAME: llamad's units with NAME's config, socket and state folder
u=$P/lib/systemd/system/llamad@.service
grep -qx "ExecStart=$P/bin/llamad --config $E/llamad/%i.conf" "$u" && grep -qx "StateDirectory=llamad/%i" "$u" &&
    grep -qx "ListenStream=/run/llamad/%i.sock" "$P/lib/systemd/system/llamad@.socket" &&
    grep -qx "Service=llamad@%i.service" "$P/lib/systemd/system/llamad@.socket" &&
    ok "llamad@.service, llamad@.socket: the instance's config, state folder and socket" ||
    bad "llamad@ units: $(grep -E 'ExecStart|StateDirectory' "$u")"
grep -qx "ExecStart=$P/bin/llamad-http --instances" "$P/lib/systemd/system/llamad-http.service" &&
    ok "llamad-http.service runs PREFIX's llamad-http" || bad "llamad-http.service ExecStart"
exposure llamad-http.service 2.0
# the user, the group and the state directory, made on a scratch root
R=$dir/root
mkdir -p "$R/etc" "$R/var/lib"
systemd-sysusers --root="$R" "$P/lib/sysusers.d/llamad.conf" >"$dir/sysusers" 2>&1 &&
    grep -q "^llamad:" "$R/etc/passwd" && grep -q "^llamad:" "$R/etc/group" &&
    ok "sysusers.d: user and group llamad" || { bad "systemd-sysusers:"; cat "$dir/sysusers"; }
systemd-tmpfiles --root="$R" --create "$P/lib/tmpfiles.d/llamad.conf" >"$dir/tmpfiles" 2>&1
mode=$(stat -c %a "$R/var/lib/llamad" 2>/dev/null)
[ "$mode" = 700 ] && [ -d "$R/var/lib/llamad/models" ] && ok "tmpfiles.d: /var/lib/llamad 0700 and its models folder" ||
    { bad "systemd-tmpfiles: mode '$mode'"; cat "$dir/tmpfiles"; }
# the installed client runs and its man page renders
"$P/bin/llamactl" --version | grep -q '^llamactl ' || bad "installed llamactl does not run"
mandoc -Tascii "$P/share/man/man8/llamad.8" 2>/dev/null | grep -q "Llama" || bad "llamad(8) does not render"
# uninstall: nothing left but the folders that were there before
mk uninstall PREFIX="$P" SYSCONFDIR="$E"
left=$(find "$P" "$E" -type f 2>/dev/null)
[ -z "$left" ] && ok "make uninstall removes every file" || bad "left after uninstall: $left"
# a changed config stays
mk install PREFIX="$P" SYSCONFDIR="$E"
echo "threads = 1" >> "$E/llamad/llamad.conf"
mk uninstall PREFIX="$P" SYSCONFDIR="$E"
[ -f "$E/llamad/llamad.conf" ] && ok "uninstall keeps a changed config" || bad "uninstall removed a changed config"

# ---- DESTDIR with PREFIX=/usr: a package's tree ------------------------------
D=$dir/dest
mk install DESTDIR="$D" PREFIX=/usr
grep -qx "ExecStart=/usr/bin/llamad --config /etc/llamad/llamad.conf" "$D/usr/lib/systemd/system/llamad.service" &&
    [ -x "$D/usr/bin/llamad-quantize" ] && [ -f "$D/etc/llamad/llamad.conf" ] &&
    grep -q "/usr/share/llamad/llamad.proto" "$D/usr/share/man/man7/llamad-protocol.7" &&
    ok "DESTDIR=... PREFIX=/usr: /usr/bin/llamad in the unit, the files under DESTDIR" ||
    bad "DESTDIR install: $(grep ExecStart "$D/usr/lib/systemd/system/llamad.service")"
# the installed gateway socket: the Unix socket and loopback TCP 11434,
# Ollama's port; started by systemd-socket-activate on those (as systemd
# would), the Ollama npm client with its default host reaches it
hs=$D/usr/lib/systemd/system/llamad-http.socket
listens=$(sed -n 's/^ListenStream=//p' "$hs" | tr '\n' ' ')
if [ "$listens" = "/run/llamad/http.sock 127.0.0.1:11434 " ]; then
    ok "llamad-http.socket listens on /run/llamad/http.sock and 127.0.0.1:11434"
else
    bad "llamad-http.socket's ListenStream lines: $listens"
fi
if ! command -v systemd-socket-activate >/dev/null 2>&1; then
    bad "systemd-socket-activate is missing (Debian package systemd)"
elif node -e 'require("net").createServer().once("error", () => process.exit(1)).listen(11434, "127.0.0.1", function () { this.close(); })'; then
    sh tests/http/install.sh "$BUILD/http-node" >"$dir/npm.log" 2>&1 || { bad "npm clients:"; cat "$dir/npm.log"; }
    "$BUILD/llamad" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
        --socket "$dir/s" --state-dir none --log-level warning 2>"$dir/llamad.log" &
    lpid=$!
    wait_socket "$dir/s" "$lpid" "$dir/llamad.log"
    env -u NOTIFY_SOCKET systemd-socket-activate -l "$dir/http.sock" -l 127.0.0.1:11434 \
        "$D/usr/bin/llamad-http" -m "llamad=$dir/s" 2>"$dir/gw.log" &
    gpid=$!
    sleep 0.5
    if GW_URL=http://127.0.0.1:11434 GW_MODEL=llamad timeout 60 node "$BUILD/http-node/default_host.mjs" \
        >"$dir/node.out" 2>&1; then
        ok "the installed llamad-http on the socket unit's addresses: $(grep -c '^ok' "$dir/node.out") checks of the Ollama client with its default host"
    else
        bad "the Ollama client with its default host:"; cat "$dir/node.out"; tail -5 "$dir/gw.log"
    fi
    curl -s --unix-socket "$dir/http.sock" http://x/health | grep -q '"ok"' &&
        ok "and /health on the unit's Unix socket" || bad "/health on the Unix socket"
    kill "$gpid" "$lpid"; wait "$gpid" "$lpid" 2>/dev/null
else
    bad "127.0.0.1:11434 is taken on this machine (Ollama?): the default-host check cannot run"
fi
mk uninstall DESTDIR="$D" PREFIX=/usr
left=$(find "$D" -type f 2>/dev/null)
[ -z "$left" ] || bad "left after DESTDIR uninstall: $left"

[ "$fail" -eq 0 ] && echo "install: all ok"
exit "$fail"
