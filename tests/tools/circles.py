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

Prints one line per circle, "circle: a.o b.o ..." (objects relative to the
build folder) or "circle: folder/ folder/ ..." (folders), each sorted,
circles sorted; nothing when there is none.

usage: circles.py BUILD
"""
import collections
import os
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
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    build = sys.argv[1]
    objs = objects(build)
    if not objs:
        sys.exit('circles.py: no objects under %s (build first)' % build)
    g = graph(objs)
    for c in circles(g):
        print('circle: ' + ' '.join(os.path.relpath(o, build) for o in c))
    for c in circles(folders(g, build)):
        print('circle: ' + ' '.join(c))


if __name__ == '__main__':
    main()
