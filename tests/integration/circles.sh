#!/bin/sh
# No two object files of the product call each other in a circle, no two
# folders do, and no folder includes a header of its own floor or a higher
# one (the floors of docs/ARCHITECTURE.md's lines "- floor N: ..."), except
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

# two folders whose headers include each other: an include up a floor
mkdir -p "$tmp/d/b/util" "$tmp/d/b/newdir" "$tmp/d/s/util" "$tmp/d/s/newdir"
printf 'int f(void) { return 0; }\n' > "$tmp/f.c"
cc -c "$tmp/f.c" -o "$tmp/d/b/util/f.o" && cc -c "$tmp/f.c" -o "$tmp/d/b/newdir/f.o"
printf '#include "newdir/n.h"\n' > "$tmp/d/s/util/u.h"
printf '#include "util/u.h"\n' > "$tmp/d/s/newdir/n.h"
mkdir -p "$tmp/d/s/docs"
printf -- '- floor 0: util/\n- floor 1: newdir/\n' > "$tmp/d/s/docs/ARCHITECTURE.md"
got=$(python3 tests/tools/circles.py "$tmp/d/b" --includes "$tmp/d/s" | tr '\n' ';')
[ "$got" = "include: newdir/ util/;up: util/ -> newdir/;" ] ||
    { echo "circles.py missed an include circle or an include up a floor: '$got'"; exit 1; }
echo "ok   the finder sees two folders including each other, one of them up a floor"
printf -- '- floor 0: util/\n' > "$tmp/d/s/docs/ARCHITECTURE.md"
got=$(python3 tests/tools/circles.py "$tmp/d/b" --includes "$tmp/d/s" | tr '\n' ';')
[ "$got" = "include: newdir/ util/;floor: newdir/;" ] ||
    { echo "circles.py missed a folder on no floor: '$got'"; exit 1; }
echo "ok   the finder sees a folder that no floor names"

python3 tests/tools/circles.py "$BUILD" --includes . > "$tmp/found"
sed -n 's/^- \(circle\|include\): \([^:]*\):.*/\1: \2/p' docs/ARCHITECTURE.md | sort > "$tmp/named"
sort "$tmp/found" > "$tmp/found.s"
if ! cmp -s "$tmp/found.s" "$tmp/named"; then
    echo "circles found in $BUILD (<) differ from those docs/ARCHITECTURE.md names (>):"
    diff "$tmp/found.s" "$tmp/named" || true
    exit 1
fi
echo "ok   $(wc -l < "$tmp/found.s") circle(s), each named in docs/ARCHITECTURE.md"
echo "circles: all ok"
