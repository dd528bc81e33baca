"""The Python binding under mpirun -np 2: results against references built from the codec
objects, bad input refused before any C call, errors carrying gcomp_last_error(), residual
save/load, stats.

Run: timeout 300 mpirun -np 2 /usr/bin/python3 tests/python/test_binding.py
(PYTHONPATH=python, GCOMP_LIBRARY=build/libgcomp.so).
"""
import copy
import os
import pickle
import sys
import tempfile
import threading
import time
import traceback

from mpi4py import MPI
import numpy as np
import torch

import gcomp
from gcomp import _lib
from helpers import raises, rank0_log
import test_lib_lookup

WORLD = MPI.COMM_WORLD
RANK = WORLD.rank
N = 100003  # odd on purpose: ragged ring chunks
log = rank0_log(RANK)


def grad(seed, n=N):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def test_topk_equals_codec_reference():
    """SUM over the sparse gather == each rank's payload from a standalone Codec, decoded and
    added in rank order: the binding hands the C path the right pointer, count and dtype."""
    spec = "topk:ratio=0.01"
    x = grad(10 + RANK)
    with gcomp.Comm(WORLD, codec=spec, min_bytes=0) as comm:
        got = comm.allreduce(x, out=np.empty_like(x), op="sum", key=None)
        assert comm.stats()["last_schedule"] == "sparse-gather", comm.stats()
    with gcomp.Codec(spec, rank=RANK, error_feedback=False) as codec:
        payloads = WORLD.allgather(codec.encode(x))
        ref = np.zeros(N, dtype=np.float32)
        for p in payloads:
            codec.decode_add(p, ref)
    assert np.array_equal(got, ref), "top-k allreduce differs from the codec reference"
    log("topk allreduce == rank-order sum of standalone Codec payloads (bitwise)")


def test_dense_paths():
    x = grad(20 + RANK)
    total = WORLD.allreduce(x.astype(np.float64), op=MPI.SUM)
    with gcomp.Comm(WORLD, codec="none", min_bytes=0) as comm:
        y = comm.allreduce(x.copy(), op="sum")
        assert np.allclose(y, total, rtol=1e-5, atol=1e-5)
        a = comm.allreduce(x.copy(), op="avg")
        assert np.allclose(a, total / WORLD.size, rtol=1e-5, atol=1e-5)
    # error feedback off: the engine keeps a residual even for GCOMP_KEY_NONE (key=None), so
    # with it on, repeated calls would not see the same input
    with gcomp.Comm(WORLD, codec="fp16", min_bytes=0, error_feedback=False) as comm:
        # in place == out of place, numpy == torch, bit for bit
        inplace = comm.allreduce(x.copy(), op="avg")
        out = np.full_like(x, np.nan)
        src = x.copy()
        comm.allreduce(src, out=out, op="avg")
        assert np.array_equal(src, x), "out-of-place allreduce changed its input"
        t = torch.from_numpy(x.copy())
        comm.allreduce(t, op="avg")
        assert np.array_equal(inplace, out) and np.array_equal(inplace, t.numpy())
        # fp16 and bf16 buffers (the result is rounded back to the buffer's type)
        h = comm.allreduce(x.astype(np.float16), op="avg")
        assert np.allclose(h.astype(np.float32), total / WORLD.size, atol=2e-2, rtol=1e-2)
        b = comm.allreduce(torch.from_numpy(x).to(torch.bfloat16), op="avg")
        assert np.allclose(b.float().numpy(), total / WORLD.size, atol=5e-2, rtol=2e-2)
        # the buffer's data is what moves, not a copy: a view of a bigger array works
        big = np.zeros(2 * N, dtype=np.float32)
        big[N:] = x
        comm.allreduce(big[N:], op="avg")
        assert np.array_equal(big[N:], inplace) and not big[:N].any()
    log("none ~= float64 sum; fp16 in place == out of place == torch; f16/bf16 buffers")


def test_bad_input():
    """Refused with a clear exception before any C call: the C entry is replaced by a trap.
    The messages name the call: iallreduce's refusals said "Comm.allreduce" before."""
    comm = gcomp.Comm(WORLD, codec="terngrad")
    real, real_i = _lib.allreduce, _lib.iallreduce

    def trap(*a):
        # the one C call allowed: joining the call with no buffers, so that every rank hears
        # of this rank's refusal (Comm._refuse_call)
        if a[1] is None and a[2] is None:
            return real(*a)
        raise AssertionError("gcomp_allreduce reached with bad input")

    def trap_i(*a):
        raise AssertionError("gcomp_iallreduce reached with bad input")

    _lib.allreduce, _lib.iallreduce = trap, trap_i
    try:
        x = grad(1)
        raises(TypeError, lambda: comm.allreduce(x.astype(np.float64)), "float64")
        raises(TypeError, lambda: comm.allreduce(np.zeros(8, np.int32)), "int32")
        raises(TypeError, lambda: comm.allreduce(torch.zeros(8, dtype=torch.float64)), "float64")
        raises(TypeError, lambda: comm.allreduce([1.0, 2.0]), "list")
        raises(ValueError, lambda: comm.allreduce(x[::2]), "not C-contiguous")
        raises(ValueError, lambda: comm.allreduce(torch.zeros(16, 8).t()), "not contiguous")
        ro = x.copy()
        ro.flags.writeable = False
        e = raises(ValueError, lambda: comm.allreduce(ro), "read-only")
        assert str(e).startswith("Comm.allreduce input:"), str(e)
        raises(ValueError, lambda: comm.allreduce(x, out=np.empty(N - 1, np.float32)), "elements")
        raises(ValueError, lambda: comm.iallreduce(ro), "Comm.iallreduce input: ")
        raises(ValueError, lambda: comm.iallreduce(x, out=np.empty(N - 1, np.float32)),
               "Comm.iallreduce: out has")
        raises(TypeError, lambda: comm.iallreduce(x, out=np.empty(N, np.float16)),
               "Comm.iallreduce: out is float16")
        raises(TypeError, lambda: comm.iallreduce(x.astype(np.float64)), "Comm.iallreduce input")
        raises(TypeError, lambda: comm.allreduce(x, out=np.empty(N, np.float16)), "float16")
        raises(ValueError, lambda: comm.allreduce(x, op="max"), "op")
        raises(ValueError, lambda: comm.allreduce(x, key=-1), "key")
        raises(ValueError, lambda: comm.allreduce(x, key=2 ** 64 - 1), "key")
        raises(NotImplementedError, lambda: comm.allreduce(torch.zeros(8, device="meta")), "meta")
        comm.close()
        raises(ValueError, lambda: comm.allreduce(x), "after close()")
        raises(ValueError, lambda: comm.stats(), "after close()")
        comm.close()  # twice is fine
    finally:
        _lib.allreduce, _lib.iallreduce = real, real_i
    raises(TypeError, lambda: gcomp.Comm(object()), "mpi4py")
    e = raises(gcomp.GcompError, lambda: gcomp.Comm(WORLD, codec="topk:ratio=2"))
    assert e.name == "GCOMP_ERR_INVALID_SPEC" and "ratio=2" in e.detail, (e.name, e.detail)
    e = raises(gcomp.GcompError, lambda: gcomp.Codec("fp16").decode(b"garbage" * 8, 16))
    assert e.name == "GCOMP_ERR_CORRUPT", e.name
    # a C-side error on every rank: ranks disagree on the count
    with gcomp.Comm(WORLD, codec="terngrad", min_bytes=0) as c2:
        e = raises(gcomp.GcompError, lambda: c2.allreduce(grad(2, 70000 + 1000 * RANK)))
        assert e.name == "GCOMP_ERR_MISMATCH", e.name
    # pickled (multiprocessing, concurrent.futures) and copied with its fields, not rebuilt
    # from this thread's gcomp_last_error(), which a later failure has replaced
    raises(gcomp.GcompError, lambda: gcomp.Codec("fp16").decode(b"garbage" * 8, 16))
    for twin in (pickle.loads(pickle.dumps(e)), copy.copy(e), copy.deepcopy(e)):
        assert type(twin) is gcomp.GcompError and str(twin) == str(e), (str(twin), str(e))
        assert (twin.code, twin.name, twin.detail) == (e.code, e.name, e.detail), twin.detail
    log("bad input refused before C; GcompError carries the code name and last_error (%s), "
        "and survives pickle and copy" % e.detail[:60])


def test_residuals():
    def steps(comm, k):
        return [comm.allreduce(grad(100 + 10 * i + RANK), op="avg", key=7) for i in range(k)]

    with gcomp.Comm(WORLD, codec="terngrad", min_bytes=0) as comm:
        steps(comm, 3)
        blob = comm.save_residuals()
        path = os.path.join(tempfile.gettempdir(), "gcomp_py_res_%d_%d" % (os.getpid(), RANK))
        comm.save_residuals_file(path)
        ref = steps(comm, 2)
    for how in ("bytes", "file", "none"):
        with gcomp.Comm(WORLD, codec="terngrad", min_bytes=0) as comm:
            if how == "bytes":
                comm.load_residuals(blob)
            elif how == "file":
                comm.load_residuals_file(path)
            got = steps(comm, 2)
        same = all(np.array_equal(a, b) for a, b in zip(got, ref))
        assert same == (how != "none"), "residual load from %s: same=%s" % (how, same)
    os.unlink(path)
    with gcomp.Comm(WORLD, codec="topk:ratio=0.01") as comm:
        e = raises(gcomp.GcompError, lambda: comm.load_residuals(blob))
        assert e.name == "GCOMP_ERR_MISMATCH", e.name
    raises(TypeError, lambda: gcomp.Comm(WORLD).load_residuals("text"))
    log("residuals: save -> load (bytes and file) gives bit-identical next steps; "
        "another codec refused")


def test_stats_and_gil():
    with gcomp.Comm(WORLD, codec="terngrad", min_bytes=0) as comm:
        x = grad(3, 1 << 21)
        ticks = [0]
        done = threading.Event()

        def spin():
            while not done.is_set():
                ticks[0] += 1

        t = threading.Thread(target=spin)
        t.start()
        for _ in range(3):
            comm.allreduce(x, op="avg", key=1)
        done.set()
        t.join()
        s = comm.stats()
        k = comm.stats(key=1)
        assert s["calls"] == 3 and s["compressed_calls"] == 3 and k["calls"] == 3, s
        assert 0 < s["wire_bytes"] < s["raw_bytes"] / 8, s
        assert s["last_schedule"] == "integer-ring", s
        assert ticks[0] > 0, "the GIL was held through the calls"
        assert comm.config()["codec"] == comm.codec
        comm.stats_reset()
        assert comm.stats()["calls"] == 0
    log("stats: terngrad wire/raw = %.4f; another thread ran %d loops during the calls"
        % (s["wire_bytes"] / s["raw_bytes"], ticks[0]))


def test_codec_roundtrip():
    with gcomp.Codec("fp16") as c:
        x = np.arange(-512, 512, dtype=np.float32) / 4  # exact in fp16
        p = c.encode(x)
        assert len(p) <= c.max_encoded_bytes(x.size)
        assert np.array_equal(c.decode(p, x.size), x)
        bf = c.decode(p, out=torch.empty(x.size, dtype=torch.bfloat16))
        assert torch.equal(bf, torch.from_numpy(x).to(torch.bfloat16))  # both round to nearest even
        acc = np.ones_like(x)
        assert np.array_equal(c.decode_add(p, acc), x + 1)
        assert c.stats()["encode_calls"] == 1
    assert "terngrad" in gcomp.codec_names()
    log("codec objects: fp16 round trip exact, decode into torch bf16, decode_add")


def test_autograd_version():
    """A tensor the library wrote into is marked modified, as torch's in-place ops mark it: a
    backward pass that saved its old values raises instead of using the new ones (silently
    wrong gradients), through allreduce, iallreduce and decode; a leaf that requires grad is
    written without complaint (as torch.distributed.all_reduce writes it)."""
    x = grad(60)
    with gcomp.Comm(WORLD, codec="none", min_bytes=0) as comm, gcomp.Codec("fp16") as codec:
        payload = codec.encode(x)
        calls = (("allreduce", lambda t: comm.allreduce(t)),
                 ("allreduce out", lambda t: comm.allreduce(torch.from_numpy(x.copy()), out=t)),
                 ("iallreduce", lambda t: comm.iallreduce(t).wait()),
                 ("decode", lambda t: codec.decode(payload, out=t)),
                 ("decode_add", lambda t: codec.decode_add(payload, t)))
        for name, call in calls:
            leaf = torch.from_numpy(x.copy()).requires_grad_()
            loss = (leaf * leaf).sum()  # saves leaf for its backward
            version = leaf._version
            call(leaf)
            assert leaf._version > version, "%s: the version counter did not move" % name
            e = raises(RuntimeError, loss.backward)
            assert "modified by an inplace operation" in str(e), (name, e)
    log("allreduce, iallreduce, decode into a tensor saved for backward: backward raises")


def test_iallreduce():
    """Requests in flight give the blocking calls' bits; test() polls, wait() twice is the
    same result; stats complete the calls in flight first; a count mismatch is raised by the
    wait on every rank and the Comm goes on; close() completes what is in flight."""
    xs = [grad(40 + i) for i in range(5)]
    with gcomp.Comm(WORLD, codec="terngrad", min_bytes=0, seed=3) as blocking, \
            gcomp.Comm(WORLD, codec="terngrad", min_bytes=0, seed=3) as nb:
        for step in range(2):  # the second step uses the residuals of the first
            want = [blocking.allreduce(x.copy(), key=i) for i, x in enumerate(xs)]
            bufs = [torch.from_numpy(x.copy()) if i % 2 else x.copy() for i, x in enumerate(xs)]
            reqs = [nb.iallreduce(b, key=i) for i, b in enumerate(bufs)]
            if step == 1:  # stats() completes the calls in flight first: every rank counts them
                assert nb.stats()["compressed_calls"] == 2 * len(xs), nb.stats()
                assert all(r.done for r in reqs), "stats() left requests in flight"
            if step == 0:  # the last call's completion completes the earlier ones (issue order)
                reqs[-1].wait()
                assert all(r.done for r in reqs), "a later wait left earlier Requests not done"
            got = [r.wait() for r in reversed(reqs)][::-1]
            for i in range(len(xs)):
                g = got[i].numpy() if isinstance(got[i], torch.Tensor) else got[i]
                assert g is not None and g.tobytes() == want[i].tobytes(), (step, i)
                assert got[i] is bufs[i] and reqs[i].wait() is bufs[i] and reqs[i].done
        assert nb.stats()["compressed_calls"] == 2 * len(xs)
        out = np.empty_like(xs[0])
        r = nb.iallreduce(xs[0], out=out, key=9, op="avg")
        t0 = time.monotonic()
        while not r.test():
            assert time.monotonic() - t0 < 60, "test() never saw the call complete"
        assert r.wait() is out
        assert out.tobytes() == blocking.allreduce(xs[0].copy(), key=9, op="avg").tobytes()
        bad = nb.iallreduce(xs[0][: 4099 - RANK].copy(), key=10)  # counts differ between ranks
        e = raises(gcomp.GcompError, bad.wait)
        assert e.name == "GCOMP_ERR_MISMATCH" and str(e).startswith("gcomp_iallreduce: "), e
        raises(gcomp.GcompError, bad.wait)  # and again
        # a dropped Request's call is completed by stats() (which counts it on every rank),
        # and so is a failed one, whose error stays on its Request
        nb.iallreduce(xs[1].copy(), key=11)
        bad = nb.iallreduce(xs[0][: 4099 - RANK].copy(), key=13)
        assert nb.stats()["compressed_calls"] == 2 * len(xs) + 2
        assert bad.done
        e = raises(gcomp.GcompError, bad.wait)
        assert e.name == "GCOMP_ERR_MISMATCH", e
        nb.allreduce(xs[2].copy(), key=12)  # the Comm goes on
        assert nb.stats()["compressed_calls"] == 2 * len(xs) + 3
        # a blocking call completes the Requests issued before it; a failed one keeps its error
        first = nb.iallreduce(xs[3].copy(), key=14)
        failed = nb.iallreduce(xs[0][: 4099 - RANK].copy(), key=15)
        nb.allreduce(xs[4].copy(), key=16)
        assert first.done and failed.done, "a blocking call left earlier Requests not done"
        e = raises(gcomp.GcompError, failed.wait)
        # named after the call that failed, not the poll that found it ("gcomp_test: ...")
        assert e.name == "GCOMP_ERR_MISMATCH" and str(e).startswith("gcomp_iallreduce: "), e
        pending = [nb.iallreduce(x.copy(), key=20 + i) for i, x in enumerate(xs[:2])]
    assert all(p.done for p in pending), "close() left requests in flight"
    log("iallreduce: 5 in flight == blocking bit for bit over 2 steps; test(); mismatch raised "
        "by wait on every rank; stats() completes requests, dropped or failed; a later wait or "
        "blocking call makes earlier requests done; close() completes requests")


def after_finalize():
    """Communicators kept past MPI.Finalize(): a call is a GcompError, not an abort of the job
    (Open MPI aborts any MPI call made after MPI_Finalize). Under mpi4py's MPI_THREAD_MULTIPLE
    the unused one's first call decides its progress mode, which asked MPI_Query_thread."""
    used = gcomp.Comm(WORLD, codec="topk:ratio=0.01", min_bytes=0)
    unused = gcomp.Comm(WORLD, codec="fp16", min_bytes=0)
    x = grad(5)
    used.allreduce(x.copy(), key=1)
    MPI.Finalize()
    for comm, call in ((used, lambda c: c.allreduce(x.copy(), key=1)),
                       (unused, lambda c: c.iallreduce(x.copy(), key=1).wait())):
        e = raises(gcomp.GcompError, lambda: call(comm))
        assert e.name == "GCOMP_ERR_INVALID_ARG" and "MPI is finalized" in str(e), e
        comm.close()
    print("rank %d: after MPI.Finalize(): calls of kept communicators raise GcompError" % RANK, flush=True)


def main():
    log("library:", gcomp.library_path)
    for t in (test_topk_equals_codec_reference, test_dense_paths, test_bad_input, test_residuals,
              test_stats_and_gil, test_codec_roundtrip, test_autograd_version, test_iallreduce):
        t()
    if RANK == 0:
        test_lib_lookup.check(gcomp.library_path)  # no MPI in it: one rank is enough
    WORLD.Barrier()
    log("test_binding: OK")
    after_finalize()  # last: MPI is gone after it


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        WORLD.Abort(1)
