"""The Python binding's argument checks under mpirun -np 2 (issue 16's binding bugs): every
buffer, integer, string and state argument that the C API would misread is refused with a
clear exception before any C call (the C entry points are replaced by traps while the bad
calls run), and the good neighbours of each bad value still work.

Run: timeout 300 mpirun -np 2 /usr/bin/python3 tests/python/test_binding_args.py [TEST ...]
(PYTHONPATH=python, GCOMP_LIBRARY=build/libgcomp.so). Names given: only those tests run.
"""
import contextlib
import os
import pathlib
import shutil
import sys
import tempfile
import threading
import time
import traceback

from mpi4py import MPI
import numpy as np
import torch

import gcomp
import gcomp.torch
from gcomp import _lib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import one_rank  # noqa: E402
from helpers import raises, rank0_log  # noqa: E402

WORLD = MPI.COMM_WORLD
RANK = WORLD.rank
log = rank0_log(RANK)


def grad(seed, n=4099):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


@contextlib.contextmanager
def trapped(*names):
    """Replace the named _lib functions by traps: a bad argument must be refused in Python,
    before the C call that would misread it."""
    saved = {n: getattr(_lib, n) for n in names}

    def trap(name):
        def f(*a):
            # allreduce with no buffers is how a refusing rank joins the call, so that every
            # rank hears of it (Comm._refuse_call): the one C call allowed
            if name == "allreduce" and a[1] is None and a[2] is None:
                return saved[name](*a)
            # and a creation with the spec the library refuses (gcomp._join_refused_creation)
            if name == "comm_create_mpi" and a[1]._obj.codec == gcomp._REFUSED_SPEC:
                return saved[name](*a)
            raise AssertionError("%s reached with a bad argument" % name)
        return f

    for n in names:
        setattr(_lib, n, trap(n))
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(_lib, n, f)


TESTS = []


def test(fn):
    TESTS.append(fn)
    return fn


@test
def test_byte_order():
    """A big-endian array ('>f4', '>f2') holds the same numbers in other bytes; the library
    reads native (little-endian) floats, so the old binding reduced garbage without a word.
    Refused everywhere a buffer goes in or out; converting would break in-place semantics."""
    x = grad(1)
    big = x.astype(">f4")
    with gcomp.Comm(WORLD, codec="fp16", min_bytes=0, error_feedback=False) as comm:
        with trapped("allreduce"):
            e = raises(TypeError, lambda: comm.allreduce(big), "byte order")
            assert "astype('<f4')" in str(e), str(e)
            raises(TypeError, lambda: comm.allreduce(x, out=np.empty(x.size, ">f4")), "byte order")
            raises(TypeError, lambda: comm.allreduce(x.astype(">f2")), "astype('<f2')")
        # the same numbers in native order reduce as before
        ref = comm.allreduce(x.copy(), op="avg")
        assert np.array_equal(comm.allreduce(big.astype("<f4"), op="avg"), ref)
    with gcomp.Codec("fp16") as c:
        with trapped("codec_encode", "codec_decode", "codec_decode_add", "codec_residual_set"):
            raises(TypeError, lambda: c.encode(big), "byte order")
        p = c.encode(x)
        with trapped("codec_decode", "codec_decode_add", "codec_residual_set"):
            raises(TypeError, lambda: c.decode(p, out=np.empty(x.size, ">f4")), "byte order")
            raises(TypeError, lambda: c.decode_add(p, np.zeros(x.size, ">f4")), "byte order")
            raises(TypeError, lambda: c.set_residual(3, big), "byte order")
    log("big-endian arrays refused (allreduce in/out, encode, decode, decode_add, residual)")


@test
def test_alignment():
    """A float32 view at an odd byte offset of a uint8 buffer: C requires a float* (a
    uint16_t* for float16/bfloat16) to be aligned to its element size, and compilers vectorise
    on that assumption; the old binding passed such pointers through. Refused, numpy and
    torch; the same numbers at an aligned address reduce."""
    x = grad(2)
    raw = np.zeros(x.nbytes + 8, dtype=np.uint8)
    odd = raw[1:1 + x.nbytes].view(np.float32)  # numpy allows the view, flags.aligned False
    odd[:] = x
    assert odd.ctypes.data % 4 == 1 and not odd.flags.aligned
    half = np.zeros(2 * 64 + 2, dtype=np.uint8)[1:1 + 2 * 64].view(np.float16)
    tbuf = bytearray(x.nbytes + 8)
    tod = torch.frombuffer(tbuf, dtype=torch.float32, offset=1, count=x.size)
    assert tod.data_ptr() % 4 == 1
    tbf = torch.frombuffer(bytearray(130), dtype=torch.bfloat16, offset=1, count=64)
    with gcomp.Comm(WORLD, codec="fp16", min_bytes=0, error_feedback=False) as comm:
        with trapped("allreduce"):
            e = raises(ValueError, lambda: comm.allreduce(odd), "aligned")
            assert "4-byte" in str(e), str(e)
            raises(ValueError, lambda: comm.allreduce(x, out=odd), "aligned")
            raises(ValueError, lambda: comm.allreduce(half), "2-byte")
            raises(ValueError, lambda: comm.allreduce(tod), "aligned")
            raises(ValueError, lambda: comm.allreduce(tbf), "aligned")
        ref = comm.allreduce(x.copy(), op="avg")
        assert np.array_equal(comm.allreduce(odd.copy(), op="avg"), ref)
    with gcomp.Codec("fp16") as c:
        with trapped("codec_encode", "codec_decode", "codec_decode_add", "codec_residual_set"):
            raises(ValueError, lambda: c.encode(odd), "aligned")
            raises(ValueError, lambda: c.decode(b"", out=odd), "aligned")
            raises(ValueError, lambda: c.decode_add(b"", odd), "aligned")
            raises(ValueError, lambda: c.set_residual(3, odd), "aligned")
    log("misaligned buffers refused (numpy float32/float16 views, torch.frombuffer)")


@test
def test_integer_ranges():
    """ctypes wraps an out-of-range int without a word (2**64 -> 0, -1 -> 2**64 - 1, and
    -1 in a gcomp_config field is GCOMP_UNSET: 'take the environment'). Every integer argument
    is range-checked in Python: ValueError out of range, TypeError for a bool, float or str;
    numpy integers are integers."""
    big, i64 = 2 ** 64, 2 ** 63
    with trapped("comm_create_mpi"):
        for kw in (dict(min_bytes=big), dict(min_bytes=-1), dict(min_bytes=i64),
                   dict(seed=-1), dict(seed=i64), dict(timeout_ms=0), dict(timeout_ms=big)):
            e = raises(ValueError, lambda: gcomp.Comm(WORLD, **kw), list(kw)[0])
            assert "range" in str(e), str(e)
        for kw in (dict(min_bytes=1.5), dict(seed="1"), dict(timeout_ms=True),
                   dict(error_feedback="no"), dict(debug=0.0)):
            raises(TypeError, lambda: gcomp.Comm(WORLD, **kw), list(kw)[0])
    with trapped("codec_create"):
        for kw in (dict(seed=-1), dict(seed=big), dict(rank=-1), dict(rank=2 ** 32)):
            raises(ValueError, lambda: gcomp.Codec("fp16", **kw), list(kw)[0])
        # a flag's message says what a flag takes, not "an integer" or "a range"
        e = raises(TypeError, lambda: gcomp.Codec("fp16", error_feedback="yes"), "error_feedback")
        assert "True or False" in str(e), str(e)
    with trapped("comm_create_mpi"):
        for kw in (dict(error_feedback=2), dict(debug=-1)):
            e = raises(ValueError, lambda: gcomp.Comm(WORLD, **kw), list(kw)[0])
            assert "True or False" in str(e), str(e)
    with trapped("comm_create_mpi"):
        raises(TypeError, lambda: gcomp.torch.GcompHookState(start_iter=True), "start_iter")
        raises(ValueError, lambda: gcomp.torch.GcompHookState(start_iter=-1), "start_iter")
        raises(ValueError, lambda: gcomp.torch.GcompHookState(seed=-1), "seed")
    x = grad(3)
    with gcomp.Comm(WORLD, codec="terngrad", min_bytes=np.int64(0), seed=np.uint32(7),
                    timeout_ms=np.int64(60000), error_feedback=np.True_) as comm:
        cfg = comm.config()
        assert (cfg["min_bytes"], cfg["seed"], cfg["timeout_ms"], cfg["error_feedback"]) == \
            (0, 7, 60000, True), cfg
        with trapped("allreduce", "comm_key_stats"):
            for k in (-1, big - 1, big, i64 * 4):
                raises(ValueError, lambda: comm.allreduce(x, key=k), "key")
            for k in (True, 5.0, "5", np.float32(5)):
                raises(TypeError, lambda: comm.allreduce(x, key=k), "key")
            raises(ValueError, lambda: comm.stats(key=-1), "key")
            raises(ValueError, lambda: comm.allreduce(x, op=True), "op")
        comm.allreduce(x, op="avg", key=np.int64(5))  # refused by the old binding
        comm.allreduce(x, op="avg", key=np.uint64(big - 2))
        assert comm.stats(key=np.int32(5))["calls"] == 1 and comm.stats(key=big - 2)["calls"] == 1
    with gcomp.Codec("fp16", seed=np.uint64(big - 1), rank=np.int64(2 ** 32 - 1)) as c:
        with trapped("codec_max_encoded_bytes", "codec_decode", "codec_residual_get",
                     "codec_encode", "codec_residual_reset"):
            for n in (-1, big):
                raises(ValueError, lambda: c.max_encoded_bytes(n), "count")
                raises(ValueError, lambda: c.decode(b"", count=n), "count")
                raises(ValueError, lambda: c.residual(1, n), "count")
            raises(TypeError, lambda: c.decode(b"", count=2.0), "count")
            raises(ValueError, lambda: c.decode(b"", count=1, dtype=True), "dtype")
            raises(ValueError, lambda: c.encode(x, key=-1), "key")
            raises(ValueError, lambda: c.reset_residual(big), "key")
        assert c.max_encoded_bytes(np.int64(10)) == c.max_encoded_bytes(10) > 0
        p = c.encode(x, key=np.int16(3))
        assert np.array_equal(c.decode(p, count=np.int64(x.size)), c.decode(p, x.size))
        assert c.residual(np.uint8(3), np.int64(x.size)).shape == x.shape
    log("integers: out of range -> ValueError, bool/float/str -> TypeError, numpy ints accepted")


@test
def test_empty_spec():
    """codec="" reached C as an empty gcomp_config.codec, which config.c resolves to
    "terngrad" (ignoring GCOMP_CODEC): a typo became the default codec. gcomp_codec_create
    refuses an empty spec; the binding refuses it for both, naming codec=None (the
    environment, then the default) as the way to ask for the default."""
    with trapped("comm_create_mpi", "codec_create"):
        e = raises(ValueError, lambda: gcomp.Comm(WORLD, codec=""), "empty")
        assert "None" in str(e), str(e)
        # a Codec has no default spec: its message must not advise None
        e = raises(ValueError, lambda: gcomp.Codec(""), "empty")
        assert "None" not in str(e), str(e)
        raises(ValueError, lambda: gcomp.torch.GcompHookState(codec=""), "empty")
    with gcomp.Comm(WORLD, codec=None) as comm:  # the default is still reachable
        assert comm.codec.startswith("terngrad") or os.environ.get("GCOMP_CODEC"), comm.codec
    log("empty codec spec refused (Comm, Codec, GcompHookState); codec=None is the default")


@test
def test_nul_in_strings():
    """ctypes' c_char_p ends a string at its first NUL: "fp16\\0topk" reached C as "fp16",
    a path "dir/a\\0b" as "dir/a" (another file). Refused, as Python's open() does."""
    with trapped("comm_create_mpi", "codec_create"):
        e = raises(ValueError, lambda: gcomp.Comm(WORLD, codec="topk:ratio=0.5\0,k=1"), "NUL")
        assert "codec" in str(e), str(e)
        raises(ValueError, lambda: gcomp.Codec("fp16\0+zstd"), "NUL")
        raises(ValueError, lambda: gcomp.Codec("\0"), "NUL")
    d = tempfile.mkdtemp()
    try:
        with gcomp.Comm(WORLD, codec="terngrad", min_bytes=0) as comm:
            comm.allreduce(grad(4), key=1)
            with trapped("comm_residuals_save_file", "comm_residuals_load_file"):
                raises(ValueError, lambda: comm.save_residuals_file(os.path.join(d, "a\0b")), "NUL")
                raises(ValueError, lambda: comm.load_residuals_file(d + "/a\0b"), "NUL")
                raises(TypeError, lambda: comm.save_residuals_file(3), "path")
            assert os.listdir(d) == [], os.listdir(d)
            comm.save_residuals_file(pathlib.Path(d) / "r")  # a path-like is fine
            comm.load_residuals_file(os.fsencode(os.path.join(d, "r")))
        assert os.listdir(d) == ["r"], os.listdir(d)
    finally:
        shutil.rmtree(d)
    log("NUL inside a codec spec or a path refused")


@test
def test_hook_state_load_all_or_nothing():
    """GcompHookState.load_state_dict replaced the residuals first and then failed on a bad
    counter or layout, leaving a state that was neither the old nor the saved one. Every
    field is now checked first; a refused state dict leaves the state as it was (residuals,
    iteration counters, layouts), and a good one is still taken whole."""
    state = gcomp.torch.GcompHookState(codec="terngrad", start_iter=0)
    try:
        def step(i):
            state._call(lambda: state.comm.allreduce(grad(50 + i + RANK), op="avg", key=3))

        step(0)
        state.iter, state._layout = 4, {0: {(4099, "torch.float32", ((4099,),)): 0}}
        saved = state.state_dict()
        step(1)
        state.iter, state.start_iter = 9, 2
        state._layout = {0: {(4099, "torch.float32", ((4099,),)): 0}, 1: {(7,): 2}}
        before = (state._call(state.comm.save_residuals), state.iter, state.start_iter,
                  {i: dict(g) for i, g in state._layout.items()})
        assert before[0] != saved["residuals"], "the test needs residuals that differ"

        def bad(**change):
            sd = dict(saved)
            for k, v in change.items():
                if v is KeyError:
                    del sd[k]
                else:
                    sd[k] = v
            return sd

        cases = [bad(layout="garbage"), bad(layout={0: {("x",): -1}}), bad(layout={-1: {}}),
                 bad(layout={0: {("x",): 2 ** 32}}), bad(layout={"0": {}}),
                 bad(iter=KeyError), bad(iter=-3), bad(iter="7"), bad(start_iter=True),
                 bad(layout=KeyError), bad(version=KeyError), bad(codec="fp16"),
                 bad(residuals=KeyError), bad(residuals=None), bad(residuals=5),
                 bad(residuals=saved["residuals"][:-1]), "not a dict", None,
                 bad(iterr=4), bad(model={})]  # fields no state_dict() writes (were skipped)
        for sd in cases:
            try:
                state.load_state_dict(sd)
            except (ValueError, TypeError, gcomp.GcompError):
                pass
            else:
                raise AssertionError("load_state_dict accepted %r" % (sd,))
            now = (state._call(state.comm.save_residuals), state.iter, state.start_iter,
                   {i: dict(g) for i, g in state._layout.items()})
            assert now == before, "a refused state dict changed the state: %r" % (sd,)
        state.load_state_dict(saved)
        assert state._call(state.comm.save_residuals) == saved["residuals"]
        assert (state.iter, state.start_iter, state._layout) == (4, 0, saved["layout"])
    finally:
        state.close()
    log("GcompHookState.load_state_dict: %d bad state dicts refused, state untouched; a good "
        "one loads" % len(cases))


@test
def test_close_during_call():
    """close() from one thread while another is inside gcomp_allreduce freed the
    communicator under the running call (gcomp_comm_destroy on a communicator in use is
    undefined, like free()). Now close() waits for the call in progress, then frees it, and
    later calls raise ValueError. Rank 1 joins the allreduce 1.5 s late, so rank 0's call is
    surely inside the library when rank 0's main thread closes the Comm (rank 1 closes
    after its call)."""
    x = grad(5, 1 << 18)
    comm = gcomp.Comm(WORLD, codec="fp16", min_bytes=0, error_feedback=False)
    expect = comm.allreduce(x.copy(), op="avg")
    got, times = {}, {}

    def call():
        if RANK == 1:
            time.sleep(1.5)
        try:
            got["y"] = comm.allreduce(x.copy(), op="avg")
        except BaseException as e:  # noqa: B902 - reported below
            got["error"] = e
        times["call"] = time.monotonic()

    t = threading.Thread(target=call)
    t.start()
    if RANK == 0:
        time.sleep(0.5)
    else:
        t.join()
    comm.close()
    times["close"] = time.monotonic()
    t.join()
    assert "error" not in got, "the call in progress failed: %r" % got.get("error")
    assert np.array_equal(got["y"], expect), "the call in progress gave another result"
    assert times["close"] >= times["call"], "close() returned before the call in progress"
    raises(ValueError, lambda: comm.allreduce(x), "after close()")
    raises(ValueError, lambda: comm.rank, "after close()")
    # the same for a Codec: close() waits for an encode in another thread
    c = gcomp.Codec("topk:ratio=0.5")
    big = grad(6, 1 << 22)
    enc = {}
    t = threading.Thread(target=lambda: enc.setdefault("p", c.encode(big)))
    t.start()
    time.sleep(0.01)
    c.close()
    t.join()
    assert "p" in enc and len(enc["p"]) > 0
    raises(ValueError, lambda: c.encode(big), "after close()")
    WORLD.Barrier()
    log("close() during a call in another thread waits for it, then frees (Comm, Codec)")


@test
def test_payload_type():
    """decode_add(5, acc) took bytes(5), five zero bytes, as the payload; only bytes-like
    payloads are taken (decode and decode_add alike)."""
    with gcomp.Codec("fp16") as c:
        acc = np.zeros(8, np.float32)
        with trapped("codec_decode", "codec_decode_add"):
            for bad in (5, "abc", [1, 2], None):
                raises(TypeError, lambda: c.decode_add(bad, acc), "bytes-like")
                raises(TypeError, lambda: c.decode(bad, count=8), "bytes-like")
        p = c.encode(np.ones(8, np.float32))
        assert np.array_equal(c.decode_add(memoryview(p), acc), np.ones(8, np.float32))
        assert np.array_equal(c.decode(bytearray(p), 8), np.ones(8, np.float32))
    log("payloads: only bytes-like objects")


class MyTensor(torch.Tensor):
    """A torch.Tensor subclass from outside torch (the old binding looked at the module)."""


@test
def test_buffer_kinds():
    """Buffers the old binding misread or misjudged: out-of-place with out overlapping the
    input (the ring reads the input after writing the output: neither in place nor out of
    place) -> ValueError; a numpy masked array (the mask was ignored) and a sparse torch
    tensor (no strided data) -> TypeError; a torch.Tensor subclass from another module was
    refused as "not a tensor" -> now reduced like any tensor."""
    x = grad(7)
    n = x.size
    with gcomp.Comm(WORLD, codec="fp16", min_bytes=0, error_feedback=False) as comm:
        ref = comm.allreduce(x.copy(), op="avg")
        big = np.zeros(2 * n, np.float32)
        tb = torch.zeros(2 * n)
        with trapped("allreduce"):
            for lo, hi in ((0, 1), (1, 0), (0, n - 1), (n - 1, 0)):
                big[lo:lo + n] = x
                raises(ValueError, lambda: comm.allreduce(big[lo:lo + n], out=big[hi:hi + n]),
                       "overlaps")
                raises(ValueError, lambda: comm.allreduce(tb[lo:lo + n], out=tb[hi:hi + n]),
                       "overlaps")
            view = tb.numpy()  # a numpy input and a torch out over the same memory
            raises(ValueError, lambda: comm.allreduce(view[1:n + 1], out=tb[:n]), "overlaps")
            masked = np.ma.masked_array(x.copy(), mask=x > 0)
            raises(TypeError, lambda: comm.allreduce(masked), "masked")
            raises(TypeError, lambda: comm.allreduce(torch.from_numpy(x).to_sparse()), "sparse")
        # adjacent, not overlapping: fine; out == input: in place
        big[:n] = x
        comm.allreduce(big[:n], out=big[n:], op="avg")
        assert np.array_equal(big[n:], ref) and np.array_equal(big[:n], x)
        y = x.copy()
        assert np.array_equal(comm.allreduce(y, out=y, op="avg"), ref)
        t = torch.from_numpy(x.copy()).as_subclass(MyTensor)
        comm.allreduce(t, op="avg")
        assert np.array_equal(t.as_subclass(torch.Tensor).numpy(), ref)
    log("buffers: overlapping in/out, masked arrays, sparse tensors refused; tensor "
        "subclasses taken")


@test
def test_nccl_backend_unavailable():
    """Comm(backend="nccl") where it cannot work says why, on every rank, before any
    collective: a library built without NCCL (this machine's build) names
    -DGCOMP_WITH_NCCL=ON; one with NCCL under a torch without CUDA names CUDA. (With both,
    tests/python/test_cuda.py runs the real thing.) Bad backend/device arguments too."""
    with trapped("comm_create_mpi"):
        raises(ValueError, lambda: gcomp.Comm(WORLD, backend="gloo"), "backend")
        raises(ValueError, lambda: gcomp.Comm(WORLD, device="cuda:0"), "backend='nccl'")
    if _lib.comm_create_nccl_rank is None:
        e = raises(NotImplementedError, lambda: gcomp.Comm(WORLD, backend="nccl"), "NCCL")
        assert "GCOMP_WITH_NCCL" in str(e), str(e)
        e = raises(NotImplementedError,
                   lambda: gcomp.torch.GcompHookState(backend="nccl"), "GCOMP_WITH_NCCL")
        what = "built without NCCL"
    elif not torch.cuda.is_available():
        raises(RuntimeError, lambda: gcomp.Comm(WORLD, backend="nccl"), "CUDA")
        what = "no CUDA device"
    else:
        what = "NCCL and CUDA present: see test_cuda.py"
    with gcomp.Comm(WORLD, codec="fp16") as comm:
        assert comm.backend == "mpi" and comm.device is None
        with trapped("allreduce"):
            raises(ValueError, lambda: comm.allreduce(grad(8), stream=0), "stream")
    log("backend='nccl' refused with a reason (%s)" % what)


@test
def test_one_rank_reference():
    """The reference tests/test_python_cuda.py holds CUDA tensors to (tests/python/one_rank.py:
    a codec object's decode(encode(x, key)) per step) equals the MPI engine's one-rank
    compressed allreduce on the CPU, bit for bit, for every codec, float32/float16/bfloat16
    tensors, three steps of error feedback: so CUDA == reference on the GPU means CUDA == CPU."""
    os.environ["GCOMP_TEST_COMPRESS_ONE_RANK"] = "1"  # read when a communicator is created
    try:
        for spec, sched in one_rank.SCHEDULES.items():
            with gcomp.Comm(MPI.COMM_SELF, codec=spec, min_bytes=0, seed=5) as comm:
                for key, dtype in enumerate(one_rank.DTYPES):
                    xs = one_rank.inputs(dtype)
                    ref = one_rank.reference(spec, xs, key=key, seed=5)
                    for i, x in enumerate(xs):
                        y = comm.allreduce(x.clone(), op="avg", key=key)
                        assert one_rank.same_bits(y, ref[i]), (spec, dtype, i)
                st = comm.stats()
                n = len(one_rank.DTYPES) * one_rank.STEPS
                assert st["compressed_calls"] == n and st["last_schedule"] == sched, (spec, st)
    finally:
        del os.environ["GCOMP_TEST_COMPRESS_ONE_RANK"]
    # and the check can fail: without error feedback's residual the second step differs
    xs = one_rank.inputs(torch.float32)
    assert not one_rank.same_bits(one_rank.reference("terngrad", xs[1:2], key=1, seed=5)[0],
                                  one_rank.reference("terngrad", xs, key=1, seed=5)[1])
    log("one-rank reference == MPI engine at one rank (%d codecs x %d dtypes x %d steps)"
        % (len(one_rank.SCHEDULES), len(one_rank.DTYPES), one_rank.STEPS))


@test
def test_one_rank_refuses():
    """A buffer refused in Python on one rank only: that rank joins the call with no buffers,
    so the others get GCOMP_ERR_INVALID_ARG at once (they waited for their timeout before)
    and the communicator stays usable on every rank."""
    comm = gcomp.Comm(WORLD, codec="fp16", timeout_ms=120000)
    x = grad(7)
    for bad, exc in ((x.astype(np.float64), TypeError), (x[::2], ValueError)):
        t0 = time.monotonic()
        if RANK == 0:
            raises(exc, lambda: comm.allreduce(bad))
        else:
            e = raises(gcomp.GcompError, lambda: comm.allreduce(x.copy()), "rank 0 failed before")
            assert e.name == "GCOMP_ERR_INVALID_ARG", e
        assert time.monotonic() - t0 < 30, "a rank waited for the refusing one"
        y = comm.allreduce(x.copy())
        assert np.allclose(y, WORLD.size * x, rtol=1e-2, atol=1e-2)
    comm.close()
    log("a refusal on one rank reaches the others at once; the next call works")


@test
def test_one_rank_refuses_creation():
    """Arguments refused in Python on one rank only, at a collective creation (Comm,
    GcompHookState): that rank joins the creation with a spec the library refuses, so the
    others fail at once (before, they waited for their timeout: gcomp's 300 s for a Comm, the
    process group's 30 min for a hook state), and the next creation works everywhere."""
    good_comm = lambda: gcomp.Comm(WORLD, codec="fp16", timeout_ms=120000)  # noqa: E731
    good_hook = lambda: gcomp.torch.GcompHookState(codec="fp16", timeout_ms=120000)  # noqa: E731
    cases = ((lambda: gcomp.Comm(WORLD, codec=""), good_comm),
             (lambda: gcomp.Comm(WORLD, codec="fp16", min_bytes=-1), good_comm),
             (lambda: gcomp.Comm(WORLD, codec="fp16", backend="gloo"), good_comm),
             (lambda: gcomp.torch.GcompHookState(codec="fp16", start_iter=-1), good_hook),
             (lambda: gcomp.torch.GcompHookState(codec="fp16", momentum=1.5), good_hook),
             # no communicator, no process group: joined over COMM_WORLD and the default group
             # (before: a TypeError there, and a bare AssertionError from torch here, while the
             # others waited)
             (lambda: gcomp.Comm("x", codec="fp16"), good_comm),
             (lambda: gcomp.torch.GcompHookState(codec="fp16", comm="x"), good_hook),
             (lambda: gcomp.torch.GcompHookState(codec="fp16", process_group="x"), good_hook))
    for bad, good in cases:
        t0 = time.monotonic()
        if RANK == 0:
            raises((ValueError, TypeError), bad)
        else:
            e = raises(gcomp.GcompError, good, "rank 0 failed to create")
            assert e.name == "GCOMP_ERR_INVALID_SPEC", e
            # not only "invalid codec spec": the cause may be any argument refused there
            assert "arguments gcomp's Python package refused there" in str(e), e
        assert time.monotonic() - t0 < 30, "a rank waited for the refusing one"
    good_comm().close()
    # an NCCL creation (any spelling of the name) shares NCCL's unique id first: the refusing
    # rank joins that share (test_nccl_share_refusal), never an MPI creation the others are
    # not in
    joined, saved = [], gcomp._join_refused_creation
    shared, saved_share = [], gcomp._cuda.join_refused_share
    gcomp._join_refused_creation = joined.append
    gcomp._cuda.join_refused_share = lambda exc, **kw: shared.append(type(exc).__name__)
    try:
        raises(ValueError, lambda: gcomp.Comm(WORLD, codec="", backend="NCCL"))
        raises(ValueError, lambda: gcomp.torch.GcompHookState(codec="fp16", start_iter=-1, backend="NCCL"))
    finally:
        gcomp._join_refused_creation = saved
        gcomp._cuda.join_refused_share = saved_share
    assert not joined and shared == ["ValueError", "ValueError"], (joined, shared)
    log("a creation refused in Python on one rank (Comm, GcompHookState) fails on every rank at once")


@test
def test_nccl_share_refusal():
    """NCCL's unique id is shared by one allgather of every rank's state: rank 0's id, or a
    rank's failure (rank 0's get_id(), a refusal of its own arguments), which then reaches
    every rank at once; before, rank 0 broadcast the id and a rank that refused its arguments
    left the others in NCCL's creation until their timeout. A rank that never comes makes
    the others give up at the deadline. Runs the share itself over MPI (this machine has no
    CUDA for the creation after it)."""
    from gcomp import _cuda
    uid = bytes(range(128))
    got = _cuda.share_unique_id(lambda: uid, mpi_comm=WORLD)
    assert got == (uid, RANK, WORLD.size), got
    culprit = WORLD.size - 1
    for who, refusal in ((culprit, ValueError("codec '' refused")), (0, None)):
        t0 = time.monotonic()

        def get_id():
            if refusal is None:
                raise RuntimeError("ncclGetUniqueId failed")
            return uid
        mine = refusal if RANK == who else None
        if RANK == who:
            raises(type(refusal) if refusal else RuntimeError,
                   lambda: _cuda.share_unique_id(get_id, mpi_comm=WORLD, refusal=mine),
                   "refused" if refusal else "ncclGetUniqueId")
        else:
            e = raises(RuntimeError, lambda: _cuda.share_unique_id(get_id, mpi_comm=WORLD),
                       "rank %d: %s" % (who, "ValueError: codec" if refusal else "RuntimeError"))
            assert "another rank failed" in str(e), e
        assert time.monotonic() - t0 < 30, "a rank waited for the failing one"
    # a rank that never comes to the share (it could not join over this communicator): the
    # others give up after the deadline instead of waiting for ever in mpi4py's allgather;
    # it comes later, completing their abandoned exchange, and the group is in step again
    t0 = time.monotonic()
    if RANK == culprit:
        time.sleep(3)
        _cuda._mpi_allgather_until(WORLD, ("ok", None), 60)
    else:
        raises(RuntimeError, lambda: _cuda.share_unique_id(lambda: uid, mpi_comm=WORLD, timeout_s=1),
               "not every rank came")
        assert time.monotonic() - t0 < 10, "the share waited past its deadline"
    # through Comm: one rank's codec refused, the others' creation stops at the share too
    # (here without CUDA on every rank: each raises its own reason, none waits)
    bad = RANK == culprit
    raises(ValueError if bad else (RuntimeError, NotImplementedError),
           lambda: gcomp.Comm(WORLD, codec="" if bad else "fp16", backend="nccl"))
    got = _cuda.share_unique_id(lambda: uid, mpi_comm=WORLD)  # the group is in step
    assert got == (uid, RANK, WORLD.size), got
    log("NCCL's unique id share carries a refusal or rank 0's failure to every rank at once")


@test
def test_hook_settings_differ():
    """Ranks whose hook states differ in start_iter, momentum or error feedback are refused
    when the states are built, on every rank, naming the setting (before: some ranks ran
    gcomp while others ran a plain allreduce, until a timeout that named neither)."""
    for kw in (dict(start_iter=3 + RANK), dict(momentum=0.25 * RANK), dict(error_feedback=RANK == 0)):
        name = next(iter(kw))
        raises(ValueError, lambda: gcomp.torch.GcompHookState(codec="fp16", **kw), "differ in " + name)
    gcomp.torch.GcompHookState(codec="fp16", start_iter=3, momentum=0.5).close()
    log("hook states that differ in start_iter, momentum or error feedback -> ValueError on every rank")


@test
def test_handles_not_copied():
    """Codec and Comm own a C handle: copy, deepcopy and pickle are refused (a copy shared
    the handle, which crashed once the original was closed)."""
    import copy
    import pickle
    for obj in (gcomp.Codec("fp16"), gcomp.Comm(WORLD, codec="fp16")):
        for fn in (copy.copy, copy.deepcopy, pickle.dumps):
            raises(TypeError, lambda: fn(obj), "cannot be")
        obj.close()
    log("Codec and Comm refuse copy, deepcopy and pickle")


@test
def test_codec_odd_arguments():
    c = gcomp.Codec("terngrad")
    e = raises(gcomp.GcompError, lambda: c.max_encoded_bytes(2 ** 63), "GCOMP_MAX_COUNT")
    assert e.name == "GCOMP_ERR_INVALID_ARG", e
    raises(ValueError, lambda: c.set_residual(None, grad(1)), "key None")
    raises(ValueError, lambda: c.residual(None, 1), "key None")
    payload = gcomp.Codec("fp16").encode(grad(2))
    raises(TypeError, lambda: c.decode(payload, dtype="float16", out=np.zeros(4099, np.float32)),
           "out is float32")
    # both ways round: a float32 dtype against a float16 out decoded into float16 silently
    raises(TypeError, lambda: c.decode(payload, dtype="float32", out=np.zeros(4099, np.float16)),
           "out is float16")
    raises(ValueError, lambda: c.encode(torch._neg_view(torch.ones(8))), "negated")
    c.close()
    log("Codec: huge count, key None residual, dtype against out, negated views refused")


@test
def test_hook_arguments():
    class Bucket:  # what the hook reads of a DDP bucket before anything else
        def __init__(self, t):
            self.t = t

        def buffer(self):
            return self.t

    raises(TypeError, lambda: gcomp.torch.hook(None, Bucket(torch.zeros(4))), "GcompHookState")
    st = gcomp.torch.GcompHookState(codec="fp16", start_iter=5)
    raises(TypeError, lambda: gcomp.torch.hook(st, Bucket(torch.zeros(4, dtype=torch.float64))),
           "torch.float64")
    # a sparse bucket (nn.Embedding(sparse=True)) too: it ran start_iter plain steps, then failed
    sparse = torch.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (4,))
    raises(TypeError, lambda: gcomp.torch.hook(st, Bucket(sparse)), "sparse_coo gradients")
    st.close()
    log("hook: a wrong state, a float64 bucket and a sparse one refused from the first step")


def main(names):
    log("library:", gcomp.library_path)
    unknown = set(names) - {t.__name__ for t in TESTS}
    assert not unknown, "no such test: %s" % sorted(unknown)
    for t in TESTS:
        if not names or t.__name__ in names:
            t()
    log("test_binding_args: OK")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        WORLD.Abort(1)
