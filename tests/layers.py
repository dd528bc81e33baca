#!/usr/bin/python3
"""tests/layers.py SRC_DIR OBJ_DIR — the library's layering holds (docs/ARCHITECTURE.md):

  - no cycle among the files of src/ and codecs/, counting both a call (a symbol one object file
    uses and another defines, read with nm) and an #include as an edge;
  - sched_*.c include no codec header (they reach codecs through the vtable);
  - codecs/ include only include/ and codecs/.

Prints what is wrong and exits 1, or prints '1 passed, 0 failed'.
"""
import collections
import glob
import os
import re
import subprocess
import sys

src, objdir = sys.argv[1], sys.argv[2]
os.chdir(src)
edges = collections.defaultdict(set)
defined, used = {}, collections.defaultdict(set)
for o in glob.glob(os.path.join(objdir, "**", "*.o"), recursive=True):
    unit = os.path.relpath(o, objdir)[:-2]  # src/engine.c
    for line in subprocess.run(["nm", o], capture_output=True, text=True, check=True).stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TDRB":
            defined[parts[2]] = unit
        elif len(parts) == 2 and parts[0] == "U":
            used[unit].add(parts[1])
for unit, syms in used.items():
    for s in syms:
        if s in defined and defined[s] != unit:
            edges[unit].add(defined[s])
problems = []
for f in sorted(glob.glob("src/*.[ch]") + glob.glob("codecs/*.[ch]")):
    for inc in re.findall(r'#include "([^"]+)"', open(f).read()):
        for cand in (os.path.join(os.path.dirname(f), inc), inc, os.path.join("src", inc)):
            if os.path.exists(cand):
                target = os.path.normpath(cand)
                edges[f].add(target)
                if f.startswith("codecs/") and not (target.startswith("codecs/") or target.startswith("include/")):
                    problems.append("%s includes %s (codecs/ may include only include/ and codecs/)" % (f, target))
                break
        if f.startswith("src/sched_") and f.endswith(".c") and inc.startswith("codecs/"):
            problems.append("%s includes the codec header %s" % (f, inc))


def cycles(g):
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, found, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
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
                found.append(sorted(comp))

    for v in list(g):
        if v not in index:
            visit(v)
    return found


for comp in cycles(edges):
    problems.append("cycle of calls/includes: " + " <-> ".join(comp))
if not defined:
    problems.append("no object files under %s" % objdir)
for p in problems:
    print("FAIL:", p)
print("layers: %d files, %d edges: %s" % (len(edges), sum(len(v) for v in edges.values()),
                                           "0 passed, 1 failed" if problems else "1 passed, 0 failed"))
sys.exit(1 if problems else 0)
