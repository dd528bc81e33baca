"""Checks of the scalar arguments the binding hands to C through ctypes.

ctypes converts a Python int to a C integer type by wrapping it silently (c_uint64(2**64) is
0, c_size_t(-1) is 2**64 - 1), c_char_p stops at the first NUL, and -1 in a gcomp_config
field means GCOMP_UNSET ("take the environment"). So every value is checked here, in Python,
against the range the C API documents, before any C call: a value out of range is a
ValueError, a value of the wrong kind (bool, float, str where an integer goes) a TypeError,
each naming the argument.
"""
import operator
import os

INT64_MAX = (1 << 63) - 1
UINT32_MAX = (1 << 32) - 1
UINT64_MAX = (1 << 64) - 1
SIZE_MAX = UINT64_MAX  # the binding supports 64-bit platforms (Open MPI's ABI, see __init__)
KEY_NONE = UINT64_MAX  # GCOMP_KEY_NONE


def _is_bool(v):
    # bool and numpy.bool_: integers to operator.index (numpy < 2 with a warning), but a
    # True/False where a count or key goes is a mistake, not the number 1/0
    return isinstance(v, bool) or type(v).__name__ in ("bool_", "bool8")


def int_arg(name, v, lo, hi):
    """v as a Python int in [lo, hi]; int and numpy integers (anything with __index__)."""
    if _is_bool(v):
        raise TypeError("%s must be an integer, got the bool %r" % (name, v))
    try:
        i = operator.index(v)
    except TypeError:
        raise TypeError("%s must be an integer, got %s %r" % (name, type(v).__name__, v)) from None
    if not lo <= i <= hi:
        raise ValueError("%s = %d is out of range [%d, %d]" % (name, i, lo, hi))
    return i


def bool_arg(name, v):
    """A flag: bool, numpy.bool_, or the integers 0 and 1 -> 0 or 1 for a C int."""
    if _is_bool(v):
        return 1 if v else 0
    try:
        i = operator.index(v)
    except TypeError:
        raise TypeError("%s must be True or False, got %s %r" % (name, type(v).__name__, v)) from None
    if i not in (0, 1):
        raise ValueError("%s must be True or False (or 0 or 1), got %d" % (name, i))
    return i


def count_arg(name, v):
    """An element count (size_t)."""
    return int_arg(name, v, 0, SIZE_MAX)


def key_arg(key, name="key"):
    """An error-feedback key: None -> GCOMP_KEY_NONE (no error feedback), else an integer in
    [0, 2**64 - 2] (2**64 - 1 is GCOMP_KEY_NONE itself: spell it None)."""
    if key is None:
        return KEY_NONE
    return int_arg(name + " (None: no error feedback)", key, 0, KEY_NONE - 1)


def spec_arg(name, spec, none_is_default=False):
    """A codec spec as the bytes C gets. An empty spec is refused here, with a message that
    names the argument, as C refuses it (gcomp_codec_create, and gcomp_config.codec = "").
    none_is_default: where None means the default (Comm's codec), the message says so; a
    Codec has no default spec."""
    if not isinstance(spec, str):
        raise TypeError("%s must be a codec spec string, got %s" % (name, type(spec).__name__))
    if not spec:
        hint = ("pass None for the default (GCOMP_CODEC, then terngrad)" if none_is_default
                else "name a codec, e.g. 'terngrad' or 'topk:ratio=0.01'")
        raise ValueError("%s is an empty codec spec; %s" % (name, hint))
    return _no_nul(name, spec, spec.encode())


def path_arg(name, path):
    """A file path (str, bytes or path-like) as the bytes C gets."""
    try:
        b = os.fsencode(path)
    except TypeError:
        raise TypeError("%s must be a path (str, bytes or os.PathLike), got %s"
                        % (name, type(path).__name__)) from None
    return _no_nul(name, path, b)


def _no_nul(name, v, b):
    # C would read up to the NUL only: "fp16\0topk" would be "fp16", "dir/a\0b" "dir/a"
    if b"\0" in b:
        raise ValueError("%s %r holds a NUL character, where C would end it" % (name, v))
    return b
