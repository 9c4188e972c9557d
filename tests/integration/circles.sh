#!/bin/sh
# No two object files of the product call each other in a circle, except
# the circles docs/ARCHITECTURE.md names and justifies (its lines
# "- circle: a.o b.o ..."). tests/tools/circles.py finds them from nm over
# $BUILD (every folder of it but tests/), and the circles of folders that
# the same calls make; first it must find the circles of scratch objects
# made here, so a broken finder cannot pass.
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

# no two objects in a circle, but their folders are: util/ calls newdir/
# (a folder no list names) and newdir/ calls back into util/
mkdir -p "$tmp/c/util" "$tmp/c/newdir"
printf 'int up(void);\nint a(void) { return up(); }\n' > "$tmp/ca.c"
printf 'int up(void) { return 1; }\n' > "$tmp/cu.c"
printf 'int b(void) { return 2; }\n' > "$tmp/cb.c"
printf 'int b(void);\nint down(void) { return b(); }\n' > "$tmp/cd.c"
cc -c "$tmp/ca.c" -o "$tmp/c/util/a.o" && cc -c "$tmp/cu.c" -o "$tmp/c/newdir/u.o"
cc -c "$tmp/cb.c" -o "$tmp/c/util/b.o" && cc -c "$tmp/cd.c" -o "$tmp/c/newdir/d.o"
got=$(python3 tests/tools/circles.py "$tmp/c")
[ "$got" = "circle: newdir/ util/" ] || { echo "circles.py missed a circle of folders: '$got'"; exit 1; }
echo "ok   the finder sees a circle of two folders, one of them new"

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
