#!/usr/bin/env python3
"""The dependency graph between the crate's top-level modules, and its cycles.

Each file under src/ belongs to the top-level module of its first path component
(src/fusion/cache/mod.rs to `fusion`, src/error.rs to `error`; lib.rs's inline modules
to themselves). An edge A -> B is a `crate::B` path (also inside `use crate::{..}`)
in A's code, comments left out. With --no-tests, test code is left out too (tests.rs
and testutil.rs files, and a `#[cfg(test)] mod tests { .. }` block to the end of its
file). Prints the edges, then the strongly connected components of more than one
module (the cycles), and with -v the files behind each edge inside a cycle.

    scripts/module-graph.py [--no-tests] [-v]
"""
import collections
import os
import re
import sys

ROOT = 'src'
NO_TESTS = '--no-tests' in sys.argv
VERBOSE = '-v' in sys.argv


def strip(src):
    src = re.sub(r'//[^\n]*', '', src)
    if NO_TESTS:
        src = re.sub(r'#\[cfg\(test\)\]\s*mod \w+ \{.*', '', src, flags=re.S)
    return src


def group_heads(src, at):
    """The first identifier of each item of the `{..}` group starting at `at`."""
    heads, depth, cur, expect = [], 0, '', True
    for ch in src[at + 1:]:
        if ch == '{':
            depth += 1
        elif ch == '}':
            if depth == 0:
                break
            depth -= 1
        elif depth == 0 and ch == ',':
            expect, cur = True, ''
            continue
        if depth == 0 and expect:
            if ch.isalnum() or ch == '_':
                cur += ch
            elif cur:
                heads.append(cur)
                expect, cur = False, ''
    if cur:
        heads.append(cur)
    return heads


def uses(src):
    out = set()
    for m in re.finditer(r'crate::(\{|\w+)', src):
        if m.group(1) == '{':
            out.update(group_heads(src, m.start(1)))
        else:
            out.add(m.group(1))
    return out


def main():
    lib = open(os.path.join(ROOT, 'lib.rs')).read()
    tops = set()
    for f in os.listdir(ROOT):
        if f.endswith('.rs') and f not in ('lib.rs', 'main.rs'):
            tops.add(f[:-3])
        elif os.path.isdir(os.path.join(ROOT, f)) and f != 'bin':
            tops.add(f)
    inline = {m.group(1): m.group(2) for m in
              re.finditer(r'^pub mod (\w+) \{(.*?)^\}', lib, re.M | re.S)}
    tops.update(inline)
    edges, where = collections.defaultdict(set), collections.defaultdict(set)
    for d, _, files in os.walk(ROOT):
        for f in files:
            if not f.endswith('.rs') or (NO_TESTS and f in ('tests.rs', 'testutil.rs')):
                continue
            rel = os.path.relpath(os.path.join(d, f), ROOT)
            top = rel.split('/')[0].removesuffix('.rs')
            if top in ('lib', 'bin'):
                continue
            for u in uses(strip(open(os.path.join(d, f)).read())):
                if u in tops and u != top:
                    edges[top].add(u)
                    where[(top, u)].add(rel)
    for name, body in inline.items():
        for u in uses(strip(body)):
            if u in tops and u != name:
                edges[name].add(u)
                where[(name, u)].add('lib.rs')
    # Tarjan's strongly connected components.
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
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
            comps.append(sorted(comp))

    for v in sorted(tops):
        if v not in index:
            visit(v)
    for v in sorted(edges):
        print(f'{v} -> {", ".join(sorted(edges[v]))}')
    cycles = [c for c in comps if len(c) > 1]
    print('cycles:', '; '.join(' '.join(c) for c in cycles) if cycles else 'none')
    if VERBOSE:
        for c in cycles:
            for a in c:
                for b in c:
                    if b in edges[a]:
                        print(f'  {a} -> {b}: {", ".join(sorted(where[(a, b)]))}')
    return 1 if cycles else 0


if __name__ == '__main__':
    sys.exit(main())
