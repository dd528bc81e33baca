#!/usr/bin/env python3
"""Check which tensors each of the interposer's residual keys held during a Horovod run.

    mpirun -np 4 -x HOROVOD_TIMELINE=/tmp/tl.json -x LD_PRELOAD=.../libgcomp_mpi.so \
        -x GCOMP_CODEC=terngrad -x GCOMP_DEBUG=1 -x GCOMP_INTERPOSE_EF_KEY=sequence \
        /usr/bin/python3 examples/horovod_fashion_mnist.py 2> /tmp/err.log
    examples/horovod_key_check.py /tmp/tl.json /tmp/err.log

Horovod's timeline (HOROVOD_TIMELINE, written by rank 0) names the tensors of every
allreduce it runs, in order, with their shapes: the tensors of one fused call open their
MPI_ALLREDUCE activity together. With GCOMP_DEBUG set, the interposer prints a line per
compressed MPI_Allreduce (buffer, count, residual key). Both are rank 0's, in the same order,
so the N-th float32 allreduce of at least --min-floats elements in the timeline is the N-th
compressed call: this script pairs them (checking that the counts agree), then prints for
every residual key the compositions (ordered tensor lists) it held and for every (buffer,
count) the same. A key that held more than one composition fed one tensor's error into
another: the exit status is then 1 (2 if the two logs do not pair up).
"""
import argparse
import collections
import re
import sys

EVENT = re.compile(r'\{"(?:name": "process_name", "ph": "M", "pid": (\d+), "args": \{"name": "([^"]*)"\}'
                   r'|ph": "([BE])"(?:, "name": "([A-Z_]+)")?, "ts": \d+, "pid": (\d+)'
                   r'(?:, "args": \{"dtype": "(\w+)", "shape": "\[([0-9, ]*)\]"\})?)')
CALL = re.compile(r"gcomp_mpi: rank 0: MPI_Allreduce (0x[0-9a-f]+|\(nil\)) (\d+) floats: key ([0-9a-f]+)")


def fused_calls(timeline, min_floats):
    """[(tensor names, total elements)] of the float32 allreduces, in order."""
    names, sizes, dtypes = {}, {}, {}
    groups, group, prev_open = [], None, False
    for m in EVENT.finditer(open(timeline, errors="replace").read()):
        if m.group(1):
            names[int(m.group(1))] = m.group(2)
            continue
        ph, what, pid = m.group(3), m.group(4), int(m.group(5))
        if m.group(6):  # the end of the whole operation carries the tensor's dtype and shape
            n = 1
            for d in filter(None, m.group(7).replace(" ", "").split(",")):
                n *= int(d)
            sizes[pid], dtypes[pid] = n, m.group(6)
        opens = ph == "B" and what == "MPI_ALLREDUCE"
        if opens:
            if not prev_open:
                group = []
                groups.append(group)
            group.append(pid)
        prev_open = opens
    out = []
    for g in groups:
        if any(p not in sizes for p in g) or any(dtypes[p] != "float32" for p in g):
            continue
        total = sum(sizes[p] for p in g)
        if total >= min_floats:
            out.append((tuple(names.get(p, str(p)) for p in g), total))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("timeline")
    p.add_argument("stderr_log", help="the run's stderr, with the interposer's GCOMP_DEBUG lines")
    p.add_argument("--min-floats", type=int, default=16384,
                   help="the interposer's threshold in floats (GCOMP_MIN_BYTES / 4) [16384]")
    a = p.parse_args()
    fused = fused_calls(a.timeline, a.min_floats)
    calls = [(m.group(1), int(m.group(2)), m.group(3))
             for m in map(CALL.search, open(a.stderr_log, errors="replace")) if m]
    if len(fused) != len(calls):
        print("the timeline has %d float32 allreduces of >= %d elements, the interposer logged %d "
              "compressed calls: they do not pair up" % (len(fused), a.min_floats, len(calls)))
        return 2
    by_key, by_buffer = collections.defaultdict(collections.Counter), collections.defaultdict(collections.Counter)
    for (comp, total), (buf, count, key) in zip(fused, calls):
        if total != count:
            print("call with %d floats paired with a timeline allreduce of %d: the logs do not pair up"
                  % (count, total))
            return 2
        by_key[key][comp] += 1
        by_buffer[(buf, count)][comp] += 1
    short = lambda comp: "[" + ", ".join(c.replace("allreduce.", "") for c in comp) + "]"
    print("%d compressed calls; %d residual keys; %d (buffer, count) pairs\n" % (len(calls), len(by_key), len(by_buffer)))
    print("residual key      calls  compositions held")
    mixed = 0
    for key, comps in sorted(by_key.items(), key=lambda kv: -sum(kv[1].values())):
        if key == "ffffffffffffffff":
            label = "(no EF)"
        else:
            mixed += len(comps) > 1
            label = "MIXED " if len(comps) > 1 else ""
        print("%-16s %6d  %s%s" % (key, sum(comps.values()), label,
                                   "; ".join("%s x%d" % (short(c), n) for c, n in comps.most_common())))
    print("\n(buffer, count)            calls  compositions")
    for (buf, count), comps in sorted(by_buffer.items(), key=lambda kv: -sum(kv[1].values())):
        print("%-14s %8d %6d  %s" % (buf, count, sum(comps.values()),
                                     "; ".join("%s x%d" % (short(c), n) for c, n in comps.most_common())))
    print("\n%s" % ("every residual key held one composition" if not mixed else
                    "%d residual key(s) held more than one composition" % mixed))
    return 1 if mixed else 0


if __name__ == "__main__":
    sys.exit(main())
