"""interpose_mpi4py.py — an mpi4py program that knows nothing of gcomp, run by interpose.sh
under LD_PRELOAD=libgcomp_mpi.so (mpi4py's Comm.Allreduce calls the C MPI_Allreduce).

The reference is numpy on every rank's input (each rank generates them all):
  - float32 sums at or above the threshold (out of place and MPI.IN_PLACE), three steps on
    the same buffers: with --bound exact within float rounding of the float64 sum (passed
    through); otherwise different from it (compressed) yet within the codec's bound, and
    bitwise identical on every rank;
  - float64, int32, MPI.MAX and a small float32 buffer: passed through, bit-exact where the
    reference is exact (integers, max, two ranks), else within float rounding.
Prints "rank R expects compressed=C passed=P no_ef=E" for interpose.sh.
usage: interpose_mpi4py.py --bound exact|fp16|terngrad|topk
"""
import sys

import numpy as np
from mpi4py import MPI

bound = sys.argv[sys.argv.index("--bound") + 1] if "--bound" in sys.argv else "exact"
compress = bound != "exact"
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
n = 40000  # 160000 bytes, above the default threshold
failures = 0
compressed = passed = 0


def check(cond, msg):
    global failures
    if not cond:
        print(f"rank {rank}: FAIL {msg}", file=sys.stderr)
        failures += 1


def inputs(dtype, step=0):
    i = np.arange(n)
    return [(np.sin(0.37 * i + 1.3 * r + 0.7 * step) * (1 + i % 7)).astype(dtype) for r in range(size)]


def same_on_all(a, what):
    h = comm.allgather(a.tobytes())  # pickled gather: not an MPI_Allreduce
    check(all(x == h[0] for x in h), f"{what}: ranks differ")


# float32 sums, three steps on the same buffers (error feedback)
out = np.empty(n, np.float32)
for step in range(3):
    xs = inputs(np.float32, step)
    exact = np.sum(np.array(xs, np.float64), axis=0)
    comm.Allreduce(xs[rank], out, op=MPI.SUM)
    inplace = xs[rank].copy()
    comm.Allreduce(MPI.IN_PLACE, inplace, op=MPI.SUM)
    for what, got in (("float32 sum", out), ("in-place float32 sum", inplace)):
        err = np.max(np.abs(got.astype(np.float64) - exact))
        if not compress:
            # MPI's float sum of 2-4 values: within float rounding of the exact sum
            check(err <= size * 7 * 2.0**-22, f"{what} step {step}: error {err} (pass-through)")
        elif bound == "fp16":
            check(0 < err <= size * size * 7 * 2.0**-10, f"{what} step {step}: fp16 error {err}")
        else:
            check(0 < err <= (2 if step == 0 else 4) * size * 7, f"{what} step {step}: {bound} error {err}")
            if bound == "topk":
                check(np.count_nonzero(got) <= size * int(np.ceil(0.01 * n)), f"{what}: too many non-zeros")
        same_on_all(got, what)
    if compress:
        compressed += 2
    else:
        passed += 2

# pass-through: other types, MAX, small buffers -- bit-exact against MPI's own algorithm is
# what the C test checks with PMPI; here the reference is numpy on the gathered inputs,
# exact for integers, max, and sums of two floats
for dtype, op, count, what in ((np.float64, MPI.SUM, n, "float64 sum"), (np.int32, MPI.SUM, n, "int32 sum"),
                               (np.float32, MPI.MAX, n, "float32 max"), (np.float32, MPI.SUM, 1000, "small float32 sum")):
    xs = [x[:count] for x in inputs(np.float64 if dtype == np.float64 else np.float32)]
    if dtype == np.int32:
        xs = [(x * 100).astype(np.int32) for x in xs]
    got = np.empty(count, dtype)
    comm.Allreduce(xs[rank], got, op=op)
    ref = xs[0].copy()
    for x in xs[1:]:
        ref = np.maximum(ref, x) if op == MPI.MAX else (ref + x).astype(dtype)
    if dtype == np.int32 or op == MPI.MAX or size == 2:
        check(np.array_equal(got, ref), f"{what}: differs from the exact reference")
    else:
        check(np.allclose(got, ref, rtol=1e-6 if dtype == np.float32 else 1e-14, atol=1e-5), f"{what}: far from reference")
    passed += 1

print(f"rank {rank} expects compressed={compressed} passed={passed} no_ef=0", flush=True)
total = comm.allreduce(failures, op=MPI.SUM)  # a Python int: pickled, not MPI_Allreduce
if rank == 0:
    print(f"interpose_mpi4py ({size} ranks, bound {bound}): {'FAILED' if total else 'ok'}", flush=True)
sys.exit(1 if total else 0)
