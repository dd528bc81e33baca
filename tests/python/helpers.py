"""Helpers shared by the Python binding tests (test_binding.py, test_binding_args.py under
mpirun, and tests/test_python_cuda.py, which runs without MPI): nothing here imports MPI,
numpy or torch."""


def raises(exc, fn, match=None):
    """fn() must raise exc (with match in its message, when given); returns the exception."""
    try:
        fn()
    except exc as e:
        if match is not None:
            assert match in str(e), "message %r lacks %r" % (str(e), match)
        return e
    raise AssertionError("%s not raised by %s" % (exc.__name__, fn))


def rank0_log(rank):
    """A print() that only rank 0 does, flushed (ranks' lines would interleave)."""
    def log(*a):
        if rank == 0:
            print(*a, flush=True)
    return log
