#!/bin/sh
# No two object files of the product call each other in a circle, except
# the circles docs/ARCHITECTURE.md names and justifies (its lines
# "- circle: a.o b.o ..."). tests/tools/circles.py finds them from nm over
# $BUILD; first it must find the circle of two scratch objects made here,
# so a broken finder cannot pass.
BUILD=${BUILD:-build}
set -e
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

mkdir -p "$tmp/b/util"
printf 'int pong(int);\nint ping(int n) { return n ? pong(n - 1) : 0; }\n' > "$tmp/a.c"
printf 'int ping(int);\nint pong(int n) { return n ? ping(n - 1) : 1; }\n' > "$tmp/b.c"
cc -c "$tmp/a.c" -o "$tmp/b/util/a.o" && cc -c "$tmp/b.c" -o "$tmp/b/util/b.o"
got=$(python3 tests/tools/circles.py "$tmp/b")
[ "$got" = "circle: util/a.o util/b.o" ] || { echo "circles.py missed a known circle: '$got'"; exit 1; }
echo "ok   the finder sees a circle of two scratch objects"

python3 tests/tools/circles.py "$BUILD" > "$tmp/found"
sed -n 's/^- circle: \([^:]*\):.*/circle: \1/p' docs/ARCHITECTURE.md | sort > "$tmp/named"
sort "$tmp/found" > "$tmp/found.s"
if ! cmp -s "$tmp/found.s" "$tmp/named"; then
    echo "circles found in $BUILD (<) differ from those docs/ARCHITECTURE.md names (>):"
    diff "$tmp/found.s" "$tmp/named" || true
    exit 1
fi
echo "ok   $(wc -l < "$tmp/found.s") circle(s), each named in docs/ARCHITECTURE.md"
echo "circles: all ok"
