#!/usr/bin/env python3
"""Circles of object files, and of folders, that call each other.

For every object of the product, nm gives the symbols it defines and those
it uses; an edge a -> b means a uses a symbol b defines. A circle is a
strongly connected component of two or more objects (Tarjan). The same
graph with each object replaced by its top-level folder gives the folders'
circles (one folder's objects calling another's, and back, by any path).

The product is every top-level folder of the build folder but tests/ (and
deb/, the package's own build): a new source folder is checked as soon as
it is built, with no list to update.

With --includes SRC, the #include "folder/..." lines of the product's
sources under SRC (the folders the build has): a folder that includes a
header of another folder has an edge to it. Each folder stands on a floor
that SRC/docs/ARCHITECTURE.md gives (its lines "- floor N: a/ b/ ...");
an include must go to a lower floor. Printed: "include: a/ b/ ..." for a
circle of folders, "up: a/ -> b/" for an include to the same floor or a
higher one, "floor: a/" for a folder no floor names.

Prints one line per circle, "circle: a.o b.o ..." (objects relative to the
build folder) or "circle: folder/ folder/ ..." (folders), each sorted,
circles sorted; nothing when there is none.

usage: circles.py BUILD [--includes SRC]
"""
import collections
import os
import re
import subprocess
import sys

NOT_PRODUCT = ('tests', 'deb')


def objects(build):
    out = []
    for top in sorted(os.listdir(build)):
        if top in NOT_PRODUCT or not os.path.isdir(os.path.join(build, top)):
            continue
        for root, _, files in os.walk(os.path.join(build, top)):
            out += [os.path.join(root, f) for f in files if f.endswith('.o')]
    return sorted(out)


def graph(objs):
    defs, uses = {}, collections.defaultdict(set)
    for o in objs:
        nm = subprocess.run(['nm', o], capture_output=True, text=True, check=True).stdout
        for line in nm.splitlines():
            f = line.split()
            if len(f) == 3 and f[1] in 'TDBRVWC':
                defs.setdefault(f[2], o)
            elif len(f) == 2 and f[0] == 'U':
                uses[o].add(f[1])
    g = {o: set() for o in objs}
    for o in objs:
        for s in uses[o]:
            d = defs.get(s)
            if d and d != o:
                g[o].add(d)
    return g


def folders(g, build):
    """The graph of top-level folders: an edge where an object of one uses
    a symbol an object of another defines."""
    top = {o: os.path.relpath(o, build).split(os.sep)[0] + '/' for o in g}
    f = {t: set() for t in top.values()}
    for o, ds in g.items():
        f[top[o]] |= {top[d] for d in ds if top[d] != top[o]}
    return f


def includes(src, tops):
    """The graph of top-level folders by their sources' #include "x/..."
    lines (a header of the build's own, such as llamad.pb-c.h, names no
    folder and makes no edge)."""
    inc = re.compile(r'^\s*#\s*include\s+"([^"/]+)/')
    f = {t: set() for t in tops}
    for t in tops:
        for root, _, files in os.walk(os.path.join(src, t)):
            for name in files:
                if not name.endswith(('.c', '.cc', '.h', '.cu', '.cuh')):
                    continue
                with open(os.path.join(root, name), errors='replace') as fh:
                    for line in fh:
                        m = inc.match(line)
                        if m and m.group(1) in f and m.group(1) != t:
                            f[t].add(m.group(1))
    return {t + '/': {d + '/' for d in ds} for t, ds in f.items()}


def floors(src):
    """{folder/: N} from the lines "- floor N: a/ b/ ..." of
    SRC/docs/ARCHITECTURE.md."""
    out = {}
    with open(os.path.join(src, 'docs', 'ARCHITECTURE.md')) as fh:
        for line in fh:
            m = re.match(r'^- floor (\d+): (.*)$', line.strip())
            if m:
                for f in m.group(2).split():
                    out[f] = int(m.group(1))
    return out


def circles(g):
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(100000)
    for v in sorted(g):
        if v not in index:
            visit(v)
    return sorted(out)


def main():
    args = sys.argv[1:]
    src = None
    if len(args) == 3 and args[1] == '--includes':
        src = args[2]
        args = args[:1]
    if len(args) != 1:
        sys.exit(__doc__.strip().splitlines()[-1])
    build = args[0]
    objs = objects(build)
    if not objs:
        sys.exit('circles.py: no objects under %s (build first)' % build)
    g = graph(objs)
    for c in circles(g):
        print('circle: ' + ' '.join(os.path.relpath(o, build) for o in c))
    for c in circles(folders(g, build)):
        print('circle: ' + ' '.join(c))
    if src is not None:
        tops = sorted({os.path.relpath(o, build).split(os.sep)[0] for o in objs})
        tops = [t for t in tops if os.path.isdir(os.path.join(src, t))]
        ig = includes(src, tops)
        for c in circles(ig):
            print('include: ' + ' '.join(c))
        fl = floors(src)
        for a in sorted(ig):
            if a not in fl:
                print('floor: ' + a)
                continue
            for b in sorted(ig[a]):
                if b in fl and fl[b] >= fl[a]:
                    print('up: %s -> %s' % (a, b))


if __name__ == '__main__':
    main()
