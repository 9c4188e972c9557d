#!/bin/sh
# Install the Debian packages given as arguments when any is missing:
# apt-get as root, sudo otherwise. Prints nothing when all are present.
missing=""
for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "deps: installing$missing" >&2
if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq || exit 1
$SUDO apt-get install -y -qq --no-install-recommends $missing || {
    echo "deps: apt-get install failed for:$missing" >&2; exit 1; }
