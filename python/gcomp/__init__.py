"""gcomp: compressed gradient allreduce, from Python.

A thin ctypes binding over libgcomp.so (no compiled extension). See gcomp._lib for how the
library is found (GCOMP_LIBRARY, next to the package, the checkout's build tree, the system).

    from mpi4py import MPI            # initialises MPI with MPI_THREAD_MULTIPLE
    import gcomp
    comm = gcomp.Comm(MPI.COMM_WORLD, codec="terngrad")
    comm.allreduce(grad, op="avg", key=0)        # numpy array or CPU torch tensor, in place
    comm.allreduce(grad, out=result, key=0)      # out of place
    comm.stats()                                 # dict of counters
    comm.close()

    gpu = gcomp.Comm(codec="terngrad", backend="nccl")   # CUDA tensors over NCCL
    gpu.allreduce(cuda_grad, op="avg", key=0)    # ordered on torch.cuda.current_stream()

Buffers (gcomp._buffers): C-contiguous, dense float32 or float16 numpy arrays in native byte
order, or contiguous float32, float16 or bfloat16 torch tensors (CPU, or CUDA with a CUDA
path: an NCCL Comm, or an MPI one that stages them); either at an address aligned to the
element size (4 or 2 bytes, as C requires of a float * or uint16_t *). Scalars are checked
against the C ranges (gcomp._args): ctypes would wrap them. Anything else is refused with
TypeError/ValueError before the C library sees it; Comm.allreduce then joins the call with no
buffers, so the other ranks get GcompError (GCOMP_ERR_INVALID_ARG) at once instead of waiting
for their timeout, and the Comm stays usable. Failures inside the library raise GcompError carrying
the code name and gcomp_last_error(). A closed Comm or Codec raises ValueError, like a closed
file; close() waits for a call another thread has in progress. python/README.md has the
whole story, the CUDA path and the DDP hook included.
"""
import atexit
import contextlib
import itertools
import ctypes
import os
import sys
import threading
import weakref

from . import _args, _buffers, _cuda, _lib

__all__ = ["GcompError", "Codec", "Comm", "Request", "init_mpi", "codec_names", "F32", "F16", "BF16",
           "SUM", "AVG", "KEY_NONE", "library_path"]

F32, F16, BF16 = _buffers.F32, _buffers.F16, _buffers.BF16
SUM, AVG = 0, 1
KEY_NONE = (1 << 64) - 1
library_path = _lib.path

_SCHEDULES = {i: _lib.schedule_name(i).decode() for i in range(7)}


class GcompError(RuntimeError):
    """A gcomp C call failed. .code is the gcomp_result value, .name its enum name
    (e.g. "GCOMP_ERR_INVALID_SPEC"), .detail the text of gcomp_last_error()."""

    def __init__(self, code, what):
        self.code = int(code)
        self.name = _lib.result_name(code).decode()
        self.detail = _lib.last_error().decode(errors="replace")
        super().__init__("%s: %s: %s" % (what, self.name, self.detail))

    def __reduce__(self):
        # pickle and copy rebuild the error from its fields: __init__ would read this
        # thread's gcomp_last_error() again (multiprocessing, concurrent.futures)
        return (_rebuilt_error, (type(self), self.code, self.name, self.detail, self.args),
                self.__dict__)


def _rebuilt_error(cls, code, name, detail, args):
    e = cls.__new__(cls)
    RuntimeError.__init__(e, *args)
    e.code, e.name, e.detail = code, name, detail
    return e


def _check(rc, what):
    if rc != 0:
        raise GcompError(rc, what)


def codec_names():
    """Names of the registered codecs (built-in and user-registered)."""
    names, i = [], 0
    while True:
        n = _lib.codec_name_at(i)
        if n is None:
            return names
        names.append(n.decode())
        i += 1


# ---- buffers (see _buffers) ------------------------------------------------------------------

_DTYPE_NAMES = _buffers.DTYPE_NAMES


def _host_buf(x, what, writable):
    """A buffer for a call that takes host memory only (the Codec object's)."""
    b = _buffers.buf(x, what, writable)
    if b.device is not None:
        raise NotImplementedError(
            "%s: a tensor on %s; gcomp.Codec works on host memory (the C codec API takes device "
            "pointers, the Python Codec does not wrap them): pass x.cpu()" % (what, b.device))
    return b


_key = _args.key_arg


def _choice(what, v, table):
    """v looked up in table (names, and the C enum values as ints); a bool is neither."""
    try:
        if not _args._is_bool(v):
            return table[v.lower() if isinstance(v, str) else v]
    except (KeyError, TypeError):
        pass
    raise ValueError("%s must be one of %s, got %r"
                     % (what, ", ".join(repr(k) for k in table if isinstance(k, str)), v))


def _op(op):
    return _choice("op", op, {"sum": SUM, "avg": AVG, SUM: SUM, AVG: AVG})


def _dtype_arg(dtype):
    return _choice("dtype", dtype, {"float32": F32, "float16": F16, "bfloat16": BF16,
                                    F32: F32, F16: F16, BF16: BF16})


def _stats_dict(s, fields):
    d = {n: getattr(s, n) for n, _ in fields}
    if "last_schedule" in d:
        d["last_schedule"] = _SCHEDULES.get(d["last_schedule"], str(d["last_schedule"]))
    return d


def _payload(payload):
    """A payload as bytes. bytes(5) would be five zero bytes: only bytes-like objects."""
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise TypeError("payload must be bytes-like (bytes, bytearray, memoryview), got %s"
                        % type(payload).__name__)
    return bytes(payload)


# ---- handles -------------------------------------------------------------------------------

class _Handle:
    """A C handle used under a lock. gcomp_codec_destroy and gcomp_comm_destroy on an object
    another thread is using are undefined (like free()), so every C call holds the object's
    lock (an RLock: a method may call another) and close() takes it too: close() waits for
    the call in progress, later calls raise ValueError. Calls of one object from several
    threads thereby run one at a time."""

    _what = "gcomp object"

    def _init_handle(self):
        self._h = None
        self._lock = threading.RLock()

    @contextlib.contextmanager
    def _use(self):
        with self._lock:
            if self._h is None:
                raise ValueError("%s used after close()" % self._what)
            yield self._h

    def _release(self, free, block=True):
        """Free the handle with free(h) unless already freed. block=False (the exit handler):
        give up, leaving it to the process's end, when another thread is inside a call (it
        would otherwise wait for that call's timeout). Returns whether it is freed."""
        lock = getattr(self, "_lock", None)
        if lock is None or not lock.acquire(blocking=block):
            return False
        try:
            if self._h is not None:
                free(self._h)
                self._h = None
            return True
        finally:
            lock.release()

    @property
    def closed(self):
        return getattr(self, "_h", None) is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # A copy would share the C handle (and free it twice): refuse, as file objects do.
    def __copy__(self):
        raise TypeError("%s cannot be copied: it owns a C handle (create another)" % self._what)

    def __deepcopy__(self, memo):
        raise TypeError("%s cannot be copied: it owns a C handle (create another)" % self._what)

    def __reduce_ex__(self, protocol):
        raise TypeError("%s cannot be pickled: it owns a C handle (create another)" % self._what)


# ---- codecs --------------------------------------------------------------------------------

class Codec(_Handle):
    """A codec chain without a communicator, e.g. Codec("topk:ratio=0.01").

    encode() returns the payload as bytes; decode() returns a new float32 numpy array (or
    fills `out`); decode_add() accumulates into a float32 array. Calls from several threads
    run one at a time (see _Handle)."""

    _what = "gcomp.Codec"

    def __init__(self, spec, seed=0, rank=0, error_feedback=True):
        self._init_handle()
        spec_bytes = _args.spec_arg("spec", spec)
        opts = _lib.CodecOptions(_args.int_arg("seed", seed, 0, _args.UINT64_MAX),
                                 _args.int_arg("rank", rank, 0, _args.UINT32_MAX),
                                 _args.bool_arg("error_feedback", error_feedback))
        h = ctypes.c_void_p()
        _check(_lib.codec_create(spec_bytes, ctypes.byref(opts), ctypes.byref(h)),
               "gcomp_codec_create(%r)" % spec)
        self._h = h

    @property
    def spec(self):
        with self._use() as h:
            return _lib.codec_spec(h).decode()

    def max_encoded_bytes(self, count):
        count = _args.count_arg("count", count)
        with self._use() as h:
            n = _lib.codec_max_encoded_bytes(h, count)
            if n == 0:  # too large a count (or a user codec's bound): the library said why
                raise GcompError(1, "gcomp_codec_max_encoded_bytes")  # GCOMP_ERR_INVALID_ARG
            return n

    def encode(self, x, key=None):
        b = _host_buf(x, "Codec.encode", writable=False)
        k = _key(key)
        with self._use() as h:
            cap = _lib.codec_max_encoded_bytes(h, b.count)
            dst = ctypes.create_string_buffer(max(cap, 1))
            written = ctypes.c_size_t()
            _check(_lib.codec_encode(h, k, b.ptr, b.count, b.dtype, dst, cap,
                                     ctypes.byref(written)), "gcomp_codec_encode")
        return dst.raw[:written.value]

    def decode(self, payload, count=None, dtype=None, out=None):
        """Decode payload into `out` (overwritten) or a new numpy array of `count` elements of
        dtype (default float32; float16 too). With out, a dtype given must be out's."""
        data = _payload(payload)
        if out is None:
            import numpy as np
            if count is None:
                raise ValueError("decode: give count or out")
            dt = _dtype_arg("float32" if dtype is None else dtype)
            if dt == BF16:
                raise ValueError("decode: numpy has no bfloat16; pass a torch.bfloat16 out")
            out = np.empty(_args.count_arg("count", count), dtype=_DTYPE_NAMES[dt])
        b = _host_buf(out, "Codec.decode out", writable=True)
        if dtype is not None and _dtype_arg(dtype) != b.dtype:  # out decides; say so
            raise TypeError("decode: dtype %r but out is %s (out's dtype is the one decoded to)"
                            % (dtype, _DTYPE_NAMES[b.dtype]))
        if count is not None and _args.count_arg("count", count) != b.count:
            raise ValueError("decode: count %d != out's %d elements" % (count, b.count))
        with self._use() as h:
            rc = _lib.codec_decode(h, data, len(data), b.ptr, b.count, b.dtype)
            error = GcompError(rc, "gcomp_codec_decode") if rc != 0 else None  # last_error now
        _buffers.mark_written(b)
        if error is not None:
            raise error
        return out

    def decode_add(self, payload, acc):
        """Decode payload and add it into acc (a float32 array or tensor) in place."""
        data = _payload(payload)
        b = _host_buf(acc, "Codec.decode_add acc", writable=True)
        if b.dtype != F32:
            raise TypeError("decode_add: acc must be float32, got %s" % _DTYPE_NAMES[b.dtype])
        with self._use() as h:
            rc = _lib.codec_decode_add(h, data, len(data), b.ptr, b.count)
            error = GcompError(rc, "gcomp_codec_decode_add") if rc != 0 else None  # last_error now
        _buffers.mark_written(b)
        if error is not None:
            raise error
        return acc

    def residual(self, key, count):
        import numpy as np
        if key is None:  # GCOMP_KEY_NONE: no error feedback, so no residual to read
            raise ValueError("residual: key None means no error feedback; name a key")
        k = _key(key)
        out = np.empty(_args.count_arg("count", count), dtype=np.float32)
        with self._use() as h:
            _check(_lib.codec_residual_get(h, k, out.ctypes.data, out.size),
                   "gcomp_codec_residual_get")
        return out

    def set_residual(self, key, values):
        b = _host_buf(values, "Codec.set_residual", writable=False)
        if b.dtype != F32:
            raise TypeError("set_residual: values must be float32")
        if key is None:  # GCOMP_KEY_NONE: no error feedback, so no residual to set
            raise ValueError("set_residual: key None means no error feedback; name a key")
        k = _key(key)
        with self._use() as h:
            _check(_lib.codec_residual_set(h, k, b.ptr, b.count), "gcomp_codec_residual_set")

    def reset_residual(self, key):
        k = _key(key)
        with self._use() as h:
            _check(_lib.codec_residual_reset(h, k), "gcomp_codec_residual_reset")

    def stats(self):
        s = _lib.CodecStats()
        with self._use() as h:
            _check(_lib.codec_stats(h, ctypes.byref(s)), "gcomp_codec_stats_get")
        return _stats_dict(s, _lib.CodecStats._fields_)

    def stats_reset(self):
        with self._use() as h:
            _check(_lib.codec_stats_reset(h), "gcomp_codec_stats_reset")

    def close(self):
        """Free the codec object; waits for a call in progress in another thread."""
        self._release(lambda h: _lib.codec_destroy(h))

    def __del__(self):
        self._release(lambda h: _lib.codec_destroy(h))


# ---- MPI and communicators -----------------------------------------------------------------

def init_mpi():
    """Initialise MPI through mpi4py if nobody has (mpi4py asks for MPI_THREAD_MULTIPLE by
    default, which the DDP hook's worker thread needs) and return mpi4py's MPI module."""
    from mpi4py import MPI  # importing initialises MPI (mpi4py.rc.initialize)
    if not MPI.Is_initialized():
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    return MPI


def _mpi_handle(mpi_comm):
    MPI = init_mpi()
    if not isinstance(mpi_comm, MPI.Comm):
        raise TypeError("expected an mpi4py communicator (MPI.Comm), got %s"
                        % type(mpi_comm).__name__)
    if mpi_comm == MPI.COMM_NULL:
        raise ValueError("MPI.COMM_NULL is not a communicator")
    if MPI.Get_library_version().find("Open MPI") < 0:
        raise NotImplementedError("gcomp's Python binding passes MPI_Comm as a pointer, which "
                                  "is Open MPI's ABI; this MPI is: "
                                  + MPI.Get_library_version().splitlines()[0])
    return MPI._handleof(mpi_comm)


_live_comms = weakref.WeakSet()
_comm_seq = itertools.count()


@atexit.register
def _close_all():
    # Python's atexit handlers run before mpi4py's MPI_Finalize (registered with Py_AtExit):
    # free every communicator's MPI duplicate while MPI still exists. One that a (daemon)
    # thread is still inside a call of is left alone: waiting could last its timeout.
    # in creation order, so that a GCOMP_STATS_FILE shared by several Comms ends up holding
    # the last-created one's stats on every rank
    for c in sorted(_live_comms, key=lambda c: getattr(c, "_seq", 0)):
        c._release(c._free, block=False)


class Comm(_Handle):
    """A gcomp communicator (collective to create), over MPI for host buffers or over NCCL
    for CUDA tensors.

    Comm(mpi_comm=None, codec=None, min_bytes=None, error_feedback=None, seed=None,
         timeout_ms=None, debug=None, backend="mpi", group=None, device=None)

    backend="mpi": over mpi_comm, an mpi4py communicator (default MPI.COMM_WORLD); reduces
    numpy arrays and CPU tensors.
    backend="nccl": over NCCL on one CUDA device (device: None = the current one, or an int,
    "cuda:N", torch.device); reduces CUDA tensors of that device. Rank 0 gets NCCL's unique id
    and shares it over mpi_comm when given, else over the torch process group `group` (None:
    the default group, torch.distributed.init_process_group must have run); the ranks are
    that group's. Needs a library built with NCCL (gcomp_comm_create_nccl_rank).

    Settings left None are filled from GCOMP_* environment variables, then the library
    defaults (see gcomp.h's gcomp_config). Calls from several threads run one at a time (see
    _Handle); being collective, they must still be issued in the same order on every rank."""

    _what = "gcomp.Comm"

    def __init__(self, mpi_comm=None, codec=None, min_bytes=None, error_feedback=None, seed=None,
                 timeout_ms=None, debug=None, backend="mpi", group=None, device=None):
        self._init_handle()
        self._pending = []  # Requests not completed yet, in issue order (they own buffers)
        self._device = None  # the CUDA device of an NCCL communicator
        self._devices = set()  # the CUDA devices calls have used (see _settled)
        self._mpi_comm = None  # the mpi4py communicator it was built over (None: a torch group)
        try:
            cfg = _config(codec, min_bytes, error_feedback, seed, timeout_ms, debug)
            backend = _choice("backend", backend, {"mpi": "mpi", "nccl": "nccl"})
            if backend == "mpi" and (group is not None or device is not None):
                raise ValueError("group and device are for backend='nccl'; an MPI Comm runs "
                                 "over mpi_comm on host memory")
            if backend == "mpi" and mpi_comm is not None and _lib.comm_create_mpi is not None:
                _mpi_handle(mpi_comm)  # refused here, where the other ranks can be told
        except (TypeError, ValueError) as exc:
            # an NCCL Comm's creation shares NCCL's unique id first: join that share instead
            if isinstance(backend, str) and backend.lower() == "nccl":
                _cuda.join_refused_share(exc, group=group, mpi_comm=_share_comm(mpi_comm),
                                         device=device, timeout_s=_share_timeout_s(timeout_ms))
            else:
                _join_refused_creation(mpi_comm)
            raise
        if backend == "nccl":
            self._create_nccl(cfg, mpi_comm, group, device, _share_timeout_s(timeout_ms))
        else:
            self._create_mpi(cfg, mpi_comm)
        self.backend = backend
        self._seq = next(_comm_seq)
        _live_comms.add(self)

    def _create_mpi(self, cfg, mpi_comm):
        if _lib.comm_create_mpi is None:
            raise NotImplementedError("%s was built without MPI (gcomp_comm_create_mpi missing)"
                                      % _lib.path)
        MPI = init_mpi()
        self._mpi_comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        handle = _mpi_handle(self._mpi_comm)
        h = ctypes.c_void_p()
        rc = _lib.comm_create_mpi(handle, ctypes.byref(cfg), ctypes.byref(h))
        if rc != 0:
            err = GcompError(rc, "gcomp_comm_create_mpi")
            if err.name == "GCOMP_ERR_INVALID_SPEC" and "failed to create its communicator" in err.detail:
                # a rank that refused its arguments in Python joins with a refused spec
                # (_join_refused_creation): the codec is only one of the two causes
                err.args = (err.args[0] + " (from Python: that rank's codec spec, or arguments "
                            "gcomp's Python package refused there; see its exception)",)
            raise err
        self._h = h

    def _create_nccl(self, cfg, mpi_comm, group, device, share_timeout_s):
        try:
            torch, dev = self._nccl_args(mpi_comm, group, device)
        except (TypeError, ValueError, RuntimeError, NotImplementedError) as exc:
            # the other ranks may be sharing the unique id already: fail them at once
            _cuda.join_refused_share(exc, group=group, mpi_comm=_share_comm(mpi_comm),
                                     device=device, timeout_s=share_timeout_s)
            raise

        def unique_id():
            uid = ctypes.create_string_buffer(_cuda.UNIQUE_ID_BYTES)
            _check(_lib.nccl_get_unique_id(uid), "gcomp_nccl_get_unique_id")
            return uid.raw

        with torch.cuda.device(dev):  # NCCL binds its communicator to the current device
            uid, rank, size = _cuda.share_unique_id(unique_id, group=group, mpi_comm=mpi_comm,
                                                    timeout_s=share_timeout_s)
            h = ctypes.c_void_p()
            _check(_lib.comm_create_nccl_rank(uid, size, rank, ctypes.byref(cfg), ctypes.byref(h)),
                   "gcomp_comm_create_nccl_rank")
        self._h = h
        self._device = dev
        self._devices.add(dev)

    def _nccl_args(self, mpi_comm, group, device):
        """(torch, the CUDA device) of an NCCL Comm, or this rank's refusal of its arguments."""
        if _lib.comm_create_nccl_rank is None or _lib.nccl_get_unique_id is None:
            raise NotImplementedError(
                "gcomp.Comm(backend='nccl'): %s was built without NCCL (gcomp_comm_create_nccl_"
                "rank / gcomp_nccl_get_unique_id missing); configure gcomp with "
                "-DGCOMP_WITH_NCCL=ON where CUDA and NCCL are installed" % _lib.path)
        if mpi_comm is not None and group is not None:
            raise ValueError("backend='nccl': pass mpi_comm or group (where the unique id is "
                             "shared), not both")
        if mpi_comm is not None:
            init_mpi()
            _mpi_handle(mpi_comm)  # the same checks as for an MPI Comm
            self._mpi_comm = mpi_comm
        torch = _cuda.torch_with_cuda("gcomp.Comm(backend='nccl')")
        return torch, _cuda.device_arg(torch, device)

    @property
    def device(self):
        """The CUDA device (torch.device) of an NCCL Comm; None for an MPI Comm."""
        return self._device

    @property
    def rank(self):
        with self._use() as h:
            return _lib.comm_rank(h)

    @property
    def size(self):
        with self._use() as h:
            return _lib.comm_size(h)

    @property
    def codec(self):
        with self._use() as h:
            return _lib.comm_codec(h).decode()

    def allreduce(self, x, out=None, op="sum", key=None, stream=None):
        """Reduce x over all ranks into out (default: x itself, in place) and return out.

        Collective: every rank calls it with the same count, dtype, op and codec. key names
        the tensor for error feedback (an int; None: no error feedback). The GIL is released
        while the library works.
        Host buffers (MPI Comm only): blocking, out holds the result on return.
        CUDA tensors (an NCCL Comm: on its device; an MPI Comm: any one device, staged
        through host memory by the library): the call is ordered on `stream` (None: torch's
        current stream of the tensors' device; or a torch.cuda.Stream, or a raw cudaStream_t
        int): like torch's collectives, the result is ready for work enqueued on that stream
        after the call (synchronise it before reading the result from the host)."""
        s, r, o, k = self._call_args(x, out, op, key, stream, "allreduce")
        try:
            self._allreduce_into(s, r, o, k, stream)
        finally:  # even a failed call may have written into out
            _buffers.mark_written(r)
        return x if out is None else out

    def _allreduce_into(self, s, r, o, k, stream):
        if s.device is None:
            with self._use() as h:
                self._after_blocking(_lib.allreduce(h, s.ptr, r.ptr, s.count, s.dtype, o, k, None),
                                     "gcomp_allreduce")
        else:
            torch = sys.modules["torch"]  # imported: x is a torch tensor
            self._devices.add(s.device)
            with torch.cuda.device(s.device):  # the library takes the current device's memory
                handle, tstream = _cuda.stream_arg(torch, s.device, stream)
                with self._use() as h:
                    # cudaStream_t 0 is the legacy default stream, torch's default: NULL
                    self._after_blocking(_lib.allreduce(h, s.ptr, r.ptr, s.count, s.dtype, o, k,
                                                        handle or None), "gcomp_allreduce")
                _cuda.record_stream((s, r), tstream, torch)

    def iallreduce(self, x, out=None, op="sum", key=None):
        """Start an allreduce and return a Request at once; its wait() returns out (default:
        x, reduced in place) when the call is done, its test() says whether it is.

        Host buffers only (numpy arrays, CPU tensors; CUDA tensors: allreduce). The same
        arguments, checks and collective rules as allreduce: every rank issues the same calls
        in the same order. The library's progress thread runs the calls one after another
        while Python goes on (with mpi4py's MPI_THREAD_MULTIPLE, which gcomp.init_mpi asks
        for; with a lower thread level they run inside test() and wait()). x and out must not
        be touched until the request completes: the Request keeps them alive. A failure is
        raised by the wait() or test() that completes the request. stats(), stats_reset(),
        the residual methods and close() first complete the requests in flight (their
        errors stay on their Requests)."""
        _need(_lib.iallreduce, "gcomp_iallreduce")
        s, r, o, k = self._call_args(x, out, op, key, None, "iallreduce")
        req = ctypes.c_void_p()
        with self._use() as h:
            _check(_lib.iallreduce(h, s.ptr, r.ptr, s.count, s.dtype, o, k, None,
                                   ctypes.byref(req)), "gcomp_iallreduce")
            request = Request(self, req, (x, out), x if out is None else out)
            self._pending.append(request)
        _buffers.mark_written(r)
        return request

    def _after_blocking(self, rc, what):
        """After a blocking call (under _use()): the calls issued before it have completed, in
        issue order, so their Requests are completed now (done is True at once, their errors
        kept for their wait()); then this call's own error, if any, is raised."""
        error = GcompError(rc, what) if rc != 0 else None  # before a poll reads last_error again
        self._poll_issued_before(None)
        if error is not None:
            raise error

    def _poll_issued_before(self, request):
        """Poll the pending Requests issued before request (all of them for None), whose calls
        have completed since calls complete in issue order: they are done at once, a failed
        one's error kept for its wait()."""
        pending = list(self._pending)
        for earlier in pending[:pending.index(request)] if request is not None else pending:
            earlier._poll()

    def _complete_in_flight(self):
        """Complete the requests in flight, in issue order, as close() does: stats and
        residuals are then read after the same calls on every rank, whether or not their
        Requests were waited for or kept. A failed call's error stays on its Request (raised by
        its wait()). Called inside the _use() that then reads or writes them, so that no other
        thread's call slips in between."""
        with self._use():
            for r in list(self._pending):
                r._wait_locked()

    def _call_args(self, x, out, op, key, stream, call):
        """The checked buffers, op and key of an allreduce or iallreduce (call: which one, for
        the messages; iallreduce takes host buffers only); what is refused here is refused on
        every rank (_refuse_call)."""
        try:
            s, r = self._bufs(x, out, "Comm." + call)
            o, k = _op(op), _key(key)
            if s.device is None and stream is not None:
                raise ValueError("Comm.allreduce: stream goes with CUDA tensors; these buffers "
                                 "are in host memory")
            if call == "iallreduce" and s.device is not None:
                raise NotImplementedError("Comm.iallreduce: CUDA tensors go through allreduce "
                                          "(its stream orders them); iallreduce takes host "
                                          "buffers")
        except (TypeError, ValueError, NotImplementedError):
            self._refuse_call()
            raise
        return s, r, o, k

    def _refuse_call(self):
        """This rank's arguments were refused before any C call; the other ranks may have
        called the library with theirs and would wait for this one until their timeout. Join
        the call with no buffer instead: the library then reports this rank's failure on
        every rank (GCOMP_ERR_INVALID_ARG, "rank R failed before the call started") and the
        communicator stays usable. Best effort: a closed Comm has no call to join."""
        if self.closed:
            return
        with self._use() as h:
            _lib.allreduce(h, None, None, 1, F32, SUM, KEY_NONE, None)
            self._poll_issued_before(None)

    def _bufs(self, x, out, what):
        """The checked input and output of an allreduce, on the memory this Comm takes; what
        names the call in the messages ("Comm.allreduce", "Comm.iallreduce")."""
        s = _buffers.buf(x, what + " input", writable=out is None)
        r = s if out is None else _buffers.buf(out, what + " out", writable=True)
        if r is not s:
            if r.count != s.count:
                raise ValueError("%s: out has %d elements, input %d" % (what, r.count, s.count))
            if r.dtype != s.dtype:
                raise TypeError("%s: out is %s, input %s"
                                % (what, _DTYPE_NAMES[r.dtype], _DTYPE_NAMES[s.dtype]))
            if s.overlaps(r):
                # the schedules read the input after writing parts of the output
                raise ValueError("%s: out overlaps the input without being it; reduce in "
                                 "place (out=None) or into separate memory" % what)
        if s.device != r.device:
            raise ValueError("%s: the input is in %s, out in %s: pass both on the same device"
                             % (what, _where(s), _where(r)))
        if self._device is not None and s.device != self._device:
            raise ValueError("%s: the buffers are in %s, but this NCCL Comm "
                             "reduces tensors on %s (NCCL moves device memory of its own "
                             "device only): pass x.to(%r), or use an MPI Comm for host buffers"
                             % (what, _where(s), self._device, str(self._device)))
        return s, r

    @contextlib.contextmanager
    def _settled(self):
        """Stats and residuals are read and written after the devices have finished the
        calls enqueued so far on the caller's streams (host buffers' calls are complete when
        they return), with the Comm's device (NCCL), or the one its calls used, current."""
        if not self._devices:
            yield
            return
        torch = sys.modules["torch"]
        for d in self._devices:
            torch.cuda.synchronize(d)
        with torch.cuda.device(self._device or next(iter(self._devices))):
            yield

    def stats(self, key=None):
        """Counters of all calls (key None) or of one key, as a dict."""
        s = _lib.CommStats()
        k = None if key is None else _key(key)
        with self._settled(), self._use() as h:
            self._complete_in_flight()
            if k is None:
                _check(_lib.comm_stats_get(h, ctypes.byref(s)), "gcomp_comm_stats_get")
            else:
                _check(_lib.comm_key_stats(h, k, ctypes.byref(s)), "gcomp_comm_key_stats_get")
        return _stats_dict(s, _lib.CommStats._fields_)

    def stats_reset(self):
        with self._settled(), self._use() as h:
            self._complete_in_flight()
            _check(_lib.comm_stats_reset(h), "gcomp_comm_stats_reset")

    def save_residuals(self):
        """The communicator's residuals (every key) as bytes, in the library's versioned
        checkpoint format."""
        with self._settled(), self._use() as h:
            self._complete_in_flight()
            return _residuals_save(h)

    def load_residuals(self, data):
        """Replace the communicator's residuals by a save_residuals() blob. The library checks
        the codec, keys and counts and refuses a mismatch (GcompError)."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError("load_residuals: expected bytes, got %s" % type(data).__name__)
        data = bytes(data)
        with self._settled(), self._use() as h:
            self._complete_in_flight()
            _residuals_load(h, data)

    def save_residuals_file(self, path):
        """save_residuals() into a file (written to a temporary file renamed over path)."""
        _need(_lib.comm_residuals_save_file, "gcomp_comm_residuals_save_file")
        path = _args.path_arg("path", path)
        with self._settled(), self._use() as h:
            self._complete_in_flight()
            _check(_lib.comm_residuals_save_file(h, path), "gcomp_comm_residuals_save_file")

    def load_residuals_file(self, path):
        _need(_lib.comm_residuals_load_file, "gcomp_comm_residuals_load_file")
        path = _args.path_arg("path", path)
        with self._settled(), self._use() as h:
            self._complete_in_flight()
            _check(_lib.comm_residuals_load_file(h, path), "gcomp_comm_residuals_load_file")

    def config(self):
        """The resolved configuration (after the environment and defaults), as a dict."""
        _need(_lib.comm_config_get, "gcomp_comm_config_get")
        c = _lib.Config()
        with self._use() as h:
            _check(_lib.comm_config_get(h, ctypes.byref(c)), "gcomp_comm_config_get")
            d = {n: getattr(c, n) for n, _ in _lib.Config._fields_}
            d["codec"] = d["codec"].decode()  # owned by the communicator: copy while alive
        d["error_feedback"] = bool(d["error_feedback"])
        d["debug"] = bool(d["debug"])
        return d

    def _free(self, h):
        for request in list(self._pending):  # issued calls finish; their buffers stay alive
            request._wait_locked()
        _write_stats_file(self)
        _lib.comm_destroy(h)
        _live_comms.discard(self)

    def close(self):
        """Free the communicator (not collective); waits for a call in progress in another
        thread. Later calls raise ValueError. With GCOMP_STATS_FILE set, first writes this
        Comm's stats() there (see _write_stats_file)."""
        self._release(self._free)

    destroy = close

    def __del__(self):
        try:
            self._release(self._free)
        except Exception:  # interpreter shutdown: nothing left to report to
            pass


class Request:
    """An allreduce in flight, from Comm.iallreduce. test() -> whether it has completed;
    wait() -> its output once it has. A failure of the call (GcompError) is raised by the
    test() or wait() that completes it, and again by every later wait(). Calls of one Comm
    complete in the order they were issued, so waiting for the last one waits for them all.
    done is True once the call is known to have completed: by this Request's test() or wait(),
    or by the completion of a later call of the Comm (a Request's wait or test, a blocking
    allreduce), or by stats(), the residual methods or close()."""

    def __init__(self, comm, req, keep, result):
        self._comm = comm
        self._req = req  # the C request; None once completed
        self._keep = keep  # the buffers the library reads and writes until then
        self._result = result
        self._error = None

    @property
    def done(self):
        return self._req is None

    def test(self):
        """True (and the call's error raised, if any) when the call has completed."""
        if self._req is not None:
            with self._comm._lock:
                if self._req is not None:  # not completed meanwhile by close() in another thread
                    with self._comm._use():
                        self._poll()
        if self._error is not None:
            raise self._error
        return self._req is None

    def wait(self):
        """Block (the GIL released) until the call has completed; return its output."""
        if self._req is not None:
            with self._comm._lock:
                if self._req is not None:  # not completed meanwhile by close() in another thread
                    with self._comm._use():
                        self._wait_locked()
        if self._error is not None:
            raise self._error
        return self._result

    def _poll(self):
        """gcomp_test, under the Comm's lock: completes the Request if the call has."""
        if self._req is not None:
            flag = ctypes.c_int(0)
            rc = _lib.request_test(ctypes.byref(self._req), ctypes.byref(flag))
            if flag.value or rc != 0:
                self._finish(rc)

    def _finish(self, rc):
        # gcomp_last_error() is this thread's: read it now. The error names the call that
        # failed, gcomp_iallreduce, whichever completion (gcomp_test or gcomp_wait, this
        # Request's or a later call's poll) found it
        self._error = GcompError(rc, "gcomp_iallreduce") if rc != 0 else None
        self._req = None
        self._keep = None
        if self in self._comm._pending:
            self._comm._poll_issued_before(self)
            self._comm._pending.remove(self)

    def _wait_locked(self):
        """wait()'s C call, under the Comm's lock (also Comm.close(): calls in flight finish,
        or fail, before the communicator goes)."""
        if self._req is not None:
            self._finish(_lib.request_wait(ctypes.byref(self._req)))


def _where(b):
    return "host memory" if b.device is None else str(b.device)


# The spec a rank whose arguments were refused in Python joins a creation with: no codec has
# this name, so the library refuses it, and the refusal reaches every rank.
_REFUSED_SPEC = b"(arguments refused in Python on this rank)"


def _share_timeout_s(timeout_ms):
    """The deadline of NCCL's unique id share over MPI, in seconds: the Comm's timeout_ms
    where it is a valid one, else GCOMP_TIMEOUT_MS, else the library's default (300 s)."""
    for v in (timeout_ms, os.environ.get("GCOMP_TIMEOUT_MS")):
        if isinstance(v, bool):
            continue
        try:
            v = int(v)
        except (TypeError, ValueError):
            continue
        if v >= 1:
            return v / 1000.0
    return 300.0


def _share_comm(mpi_comm):
    """mpi_comm when it is an mpi4py communicator a refusing rank can share over, else None
    (the torch process group is tried)."""
    try:
        if mpi_comm is not None:
            _mpi_handle(mpi_comm)
            return mpi_comm
    except Exception:  # noqa: B902 - not a communicator: nothing to share over
        pass
    return None


def _join_refused_creation(mpi_comm):
    """This rank refused its own arguments to a collective creation over MPI (Comm,
    GcompHookState) before reaching it; the other ranks may be in it already and would wait
    for this one until their timeout. Join it with a spec the library refuses instead: the
    creation then fails on every rank at once. An mpi_comm that is no mpi4py communicator at
    all joins over COMM_WORLD, the default the other ranks most likely use. Best effort:
    nothing to join without MPI, or for MPI.COMM_NULL (the rank is outside the communicator
    the others create over), and the caller raises its own error either way."""
    try:
        if _lib.comm_create_mpi is None:
            return
        MPI = init_mpi()
        if mpi_comm is not None and not isinstance(mpi_comm, MPI.Comm):
            mpi_comm = None
        handle = _mpi_handle(MPI.COMM_WORLD if mpi_comm is None else mpi_comm)
        cfg = _lib.config_default()
        cfg.codec = _REFUSED_SPEC
        h = ctypes.c_void_p()
        if _lib.comm_create_mpi(handle, ctypes.byref(cfg), ctypes.byref(h)) == 0:
            _lib.comm_destroy(h)  # not reached: the spec is refused
    except Exception:  # noqa: B902 - the caller's error is the one to raise
        pass


def _config(codec, min_bytes, error_feedback, seed, timeout_ms, debug):
    """A gcomp_config from the keyword arguments (None: unset), checked against config.c's
    ranges; -1 would be GCOMP_UNSET (the environment) in C. The struct keeps the codec's
    bytes alive (_codec_bytes) until the creating call has copied them."""
    cfg = _lib.config_default()
    if codec is not None:
        cfg._codec_bytes = _args.spec_arg("codec", codec, none_is_default=True)
        cfg.codec = cfg._codec_bytes
    if min_bytes is not None:
        cfg.min_bytes = _args.int_arg("min_bytes", min_bytes, 0, _args.INT64_MAX)
    if error_feedback is not None:
        cfg.error_feedback = _args.bool_arg("error_feedback", error_feedback)
    if seed is not None:
        cfg.seed = _args.int_arg("seed", seed, 0, _args.INT64_MAX)
    if timeout_ms is not None:
        cfg.timeout_ms = _args.int_arg("timeout_ms", timeout_ms, 1, _args.INT64_MAX)
    if debug is not None:
        cfg.debug = _args.bool_arg("debug", debug)
    return cfg


def _write_stats_file(comm):
    """GCOMP_STATS_FILE, as the interposer (docs/INTERPOSE.md) writes it: one JSON file per
    rank, "%r" in the path replaced by the MPI_COMM_WORLD rank (without MPI: the torch
    process group's rank, else the Comm's), else ".rank<N>" appended.
    Holds rank, size, codec and this Comm's stats() (counters since the last stats_reset()),
    among them raw_bytes, wire_bytes and baseline_bytes as the interposer's file. Written when
    the Comm closes (close(), or at exit: in the order the Comms were created); the Comm
    closed last in a process overwrites what the others wrote.
    bench/sweep --cmd reads it. Best effort: a failure is reported on stderr, never raised."""
    path = os.environ.get("GCOMP_STATS_FILE")
    if not path:
        return
    import json
    try:
        wrank = _world_rank(comm)
        path = path.replace("%r", str(wrank)) if "%r" in path else "%s.rank%d" % (path, wrank)
        d = dict(rank=wrank, size=comm.size, codec=comm.codec, source="gcomp.Comm")
        d.update(comm.stats())
        with open(path, "w") as f:
            json.dump(d, f)
            f.write("\n")
    except Exception as exc:  # noqa: B902 - a stats file must not break the program
        print("gcomp: cannot write GCOMP_STATS_FILE %r: %s" % (path, exc), file=sys.stderr)


def _world_rank(comm):
    # only an MPI someone initialised: importing mpi4py here would initialise MPI
    MPI = getattr(sys.modules.get("mpi4py"), "MPI", None)
    if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized():
        return MPI.COMM_WORLD.Get_rank()
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return comm.rank


# ---- residual checkpoints ------------------------------------------------------------------
# Optional symbols: a library older than the checkpoint API loads, and these say what is
# missing instead of failing at import.

def _need(fn, name):
    if fn is None:
        raise NotImplementedError("%s is not exported by %s (an older library than this "
                                  "package)" % (name, _lib.path))


def _residuals_save(h):
    _need(_lib.comm_residuals_save, "gcomp_comm_residuals_save")
    n = ctypes.c_size_t()
    _check(_lib.comm_residuals_save(h, None, 0, ctypes.byref(n)), "gcomp_comm_residuals_save")
    buf = ctypes.create_string_buffer(n.value)
    _check(_lib.comm_residuals_save(h, buf, n.value, ctypes.byref(n)), "gcomp_comm_residuals_save")
    return buf.raw[:n.value]


def _residuals_load(h, data):
    _need(_lib.comm_residuals_load, "gcomp_comm_residuals_load")
    _check(_lib.comm_residuals_load(h, data, len(data)), "gcomp_comm_residuals_load")
