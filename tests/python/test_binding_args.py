"""The Python binding's argument checks under mpirun -np 2 (issue 16's binding bugs): every
buffer, integer, string and state argument that the C API would misread is refused with a
clear exception before any C call (the C entry points are replaced by traps while the bad
calls run), and the good neighbours of each bad value still work.

Run: timeout 300 mpirun -np 2 /usr/bin/python3 tests/python/test_binding_args.py [TEST ...]
(PYTHONPATH=python, GCOMP_LIBRARY=build/libgcomp.so). Names given: only those tests run.
"""
import contextlib
import sys
import traceback

from mpi4py import MPI
import numpy as np
import torch

import gcomp
from gcomp import _lib

WORLD = MPI.COMM_WORLD
RANK = WORLD.rank


def log(*a):
    if RANK == 0:
        print(*a, flush=True)


def grad(seed, n=4099):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def raises(exc, fn, match=None):
    try:
        fn()
    except exc as e:
        if match is not None:
            assert match in str(e), "message %r lacks %r" % (str(e), match)
        return e
    raise AssertionError("%s not raised by %s" % (exc.__name__, fn))


@contextlib.contextmanager
def trapped(*names):
    """Replace the named _lib functions by traps: a bad argument must be refused in Python,
    before the C call that would misread it."""
    saved = {n: getattr(_lib, n) for n in names}

    def trap(name):
        def f(*a):
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
