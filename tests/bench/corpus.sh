#!/bin/sh
# tests/bench/corpus.sh OUT — the English text for the tokenizer benchmarks
# (llamad-bench --tokenize, tests/bench/llamacpp.sh), made at bench time from
# files every Debian machine has rather than committed: the license texts of
# base-files in /usr/share/common-licenses (the fixed list below, in that
# order; a missing one is skipped) followed by this repository's README.md
# and docs/*.md (Markdown with code, tables and numbers). On Debian 12 with
# this repository at the time of writing: about 289,000 bytes, 5,400 lines; 75.1 %
# ASCII letters, 19.7 % whitespace, 4.0 % punctuation, 1.2 % digits and 95
# non-ASCII bytes (31 em dashes and a ± in UTF-8) — plain English prose,
# mostly legal; the docs part changes with the repository (see sha256).
#
# Writes OUT (atomically) and prints one summary line:
#   corpus=OUT bytes=N lines=N letters_pct= digits_pct= space_pct= punct_pct=
#   non_ascii_bytes=N sha256=...
# Env: REPEAT=k concatenates the whole text k times (default 1).
set -eu
out=${1:?usage: corpus.sh OUT}
repo=$(cd "$(dirname "$0")/../.." && pwd)
lic=/usr/share/common-licenses
tmp=$out.tmp.$$
: > "$tmp"
for f in GPL-3 GPL-2 GPL-1 LGPL-3 LGPL-2.1 LGPL-2 GFDL-1.3 GFDL-1.2 Apache-2.0 MPL-2.0 MPL-1.1 \
         Artistic BSD CC0-1.0; do
    [ -f "$lic/$f" ] && cat "$lic/$f" >> "$tmp"
done
for f in "$repo"/README.md "$repo"/docs/*.md; do
    [ -f "$f" ] && cat "$f" >> "$tmp"
done
k=${REPEAT:-1}
if [ "$k" -gt 1 ]; then
    cp "$tmp" "$tmp.1"
    i=1
    while [ "$i" -lt "$k" ]; do cat "$tmp.1" >> "$tmp"; i=$((i + 1)); done
    rm -f "$tmp.1"
fi
mv "$tmp" "$out"
LC_ALL=C
export LC_ALL
n=$(wc -c < "$out")
pct() { echo "$1 $n" | awk '{ printf "%.1f", 100 * $1 / $2 }'; }
letters=$(tr -cd 'A-Za-z' < "$out" | wc -c)
digits=$(tr -cd '0-9' < "$out" | wc -c)
space=$(tr -cd ' \t\n\r' < "$out" | wc -c)
punct=$(tr -cd '[:punct:]' < "$out" | wc -c)
high=$(tr -d '\000-\177' < "$out" | wc -c)
echo "corpus=$out bytes=$n lines=$(wc -l < "$out") letters_pct=$(pct "$letters")" \
     "digits_pct=$(pct "$digits") space_pct=$(pct "$space") punct_pct=$(pct "$punct")" \
     "non_ascii_bytes=$high sha256=$(sha256sum "$out" | cut -c1-16)"
