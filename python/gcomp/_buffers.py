"""Checked views of the caller's buffers: what the C API gets as (pointer, count, dtype).

Accepted: numpy arrays (float32, float16) and torch tensors (float32, float16, bfloat16) that
are C-contiguous, dense, in native byte order and aligned to their element size; torch tensors
on the CPU or on a CUDA device (which calls take them is the caller's business: Comm checks
its communicator's device). Everything else is a TypeError (what it is) or ValueError (how it
is laid out), raised before any C call, naming the argument and the fix.
"""
import sys

F32, F16, BF16 = 0, 1, 2  # gcomp_dtype

NP_DTYPES = {"float32": F32, "float16": F16}
TORCH_DTYPES = {"torch.float32": F32, "torch.float16": F16, "torch.bfloat16": BF16}
DTYPE_NAMES = {F32: "float32", F16: "float16", BF16: "bfloat16"}
DTYPE_SIZES = {F32: 4, F16: 2, BF16: 2}


class Buf:
    """A checked buffer: pointer, element count, gcomp dtype, the object (kept alive while
    the view is), and the CUDA device of a device tensor (None: host memory)."""
    __slots__ = ("ptr", "count", "dtype", "obj", "device")

    def __init__(self, ptr, count, dtype, obj, device=None):
        self.ptr, self.count, self.dtype, self.obj, self.device = ptr, count, dtype, obj, device

    @property
    def nbytes(self):
        return self.count * DTYPE_SIZES[self.dtype]

    def overlaps(self, other):
        """The two byte ranges share memory without being the same buffer."""
        if self.ptr == other.ptr or not self.count or not other.count:
            return False
        return self.ptr < other.ptr + other.nbytes and other.ptr < self.ptr + self.nbytes


def torch_module(x):
    """torch, if x is a torch.Tensor (a subclass from any module included)."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and isinstance(x, torch.Tensor) else None


def mark_written(b):
    """Tell autograd that the library wrote into b's tensor, as torch's own in-place ops do:
    its version counter goes up, so a backward pass that saved the old values raises instead of
    using the new ones. An in-place op on an empty view of it does this (the counter is shared
    with views) without touching an element; no_grad lets it reach a leaf that requires grad.
    Inference tensors have no counter; numpy arrays none to keep."""
    torch = torch_module(b.obj)
    if torch is None or (hasattr(b.obj, "is_inference") and b.obj.is_inference()):
        return
    with torch.no_grad():
        b.obj.view(-1)[:0].zero_()


def check_aligned(ptr, dt, what):
    """C reads a float32 buffer through a float * and a float16/bfloat16 one through a
    uint16_t *: both must be aligned to the element size (C11 6.3.2.3; compilers vectorise on
    it). A view at an odd byte offset (numpy .view of a uint8 slice, torch.frombuffer with an
    offset) breaks that; refuse it rather than risk a fault or a silent misread."""
    size = DTYPE_SIZES[dt]
    if ptr % size:
        raise ValueError("%s: the buffer's address %#x is not %d-byte aligned, as %s elements "
                         "must be (a view at an odd byte offset?); pass an aligned copy "
                         "(numpy.array(x) / x.clone())" % (what, ptr, size, DTYPE_NAMES[dt]))


def buf(x, what, writable):
    """Check x and return a Buf, raising TypeError/ValueError with a clear message."""
    torch = torch_module(x)
    if torch is not None:
        return _tensor(torch, x, what)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(x, np.ndarray):
        return _array(np, x, what, writable)
    raise TypeError("%s: expected a numpy.ndarray or a torch.Tensor, got %s"
                    % (what, type(x).__name__))


def _tensor(torch, x, what):
    if x.layout != torch.strided:
        raise TypeError("%s: a %s tensor; only dense (strided) tensors hold their elements in "
                        "one buffer (call .to_dense() first)" % (what, x.layout))
    if x.device.type not in ("cpu", "cuda"):
        raise NotImplementedError("%s: a tensor on %s; gcomp takes CPU and CUDA tensors"
                                  % (what, x.device))
    dt = TORCH_DTYPES.get(str(x.dtype))
    if dt is None:
        raise TypeError("%s: dtype %s not supported (float32, float16, bfloat16)"
                        % (what, x.dtype))
    if not x.is_contiguous():
        raise ValueError("%s: tensor is not contiguous (call .contiguous() first)" % what)
    if (hasattr(x, "is_neg") and x.is_neg()) or (hasattr(x, "is_conj") and x.is_conj()):
        # a lazy view: its memory holds the other sign, applied only when torch reads it
        raise ValueError("%s: tensor is a lazily negated (or conjugated) view; its memory holds "
                         "other values (call .resolve_neg() / .resolve_conj() first)" % what)
    check_aligned(x.data_ptr(), dt, what)
    return Buf(x.data_ptr(), x.numel(), dt, x, x.device if x.device.type == "cuda" else None)


def _array(np, x, what, writable):
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError("%s: a numpy masked array; gcomp would reduce the masked elements too "
                        "(pass x.filled(0) or x.data)" % what)
    dt = NP_DTYPES.get(x.dtype.name)
    if dt is None:
        raise TypeError("%s: dtype %s not supported (float32, float16; bfloat16 through "
                        "torch tensors)" % (what, x.dtype))
    if not x.dtype.isnative:
        # '>f4' names the same numbers in other bytes; the library reads native floats.
        # Converting here would hand the library a copy and break in-place results.
        raise TypeError("%s: array has non-native byte order (dtype %r); gcomp reads "
                        "native (%s-endian) floats: convert with x.astype('%s%s%d') "
                        "(a copy: use the result)"
                        % (what, x.dtype.str, sys.byteorder,
                           "<" if sys.byteorder == "little" else ">", x.dtype.kind,
                           x.dtype.itemsize))
    if not x.flags.c_contiguous:
        raise ValueError("%s: array is not C-contiguous (use numpy.ascontiguousarray)" % what)
    if writable and not x.flags.writeable:
        raise ValueError("%s: array is read-only" % what)
    check_aligned(x.ctypes.data, dt, what)
    return Buf(x.ctypes.data, x.size, dt, x)
