"""Finding libgcomp.so and declaring the C functions for ctypes.

The library is searched, first hit wins:
  1. the path in the GCOMP_LIBRARY environment variable (a file, or a folder holding libgcomp.so);
  2. libgcomp.so next to this package (a wheel or a copy that ships the library);
  3. when this package is a gcomp checkout's own python/gcomp (the root has CMakeLists.txt
     and include/gcomp.h): that checkout's build/libgcomp.so, then any build*/libgcomp.so
     (a developer running from python/ without installing), but not a sanitizer build's;
     an installed copy never looks in the folders around it, which may hold some other build;
  4. the system: ctypes.util.find_library("gcomp"), then the soname libgcomp.so.0.1.

ctypes.CDLL releases the GIL for the duration of every foreign call, which is what lets the
DDP hook's worker thread run a gcomp allreduce while Python keeps computing gradients.
"""
import ctypes
import ctypes.util
import glob
import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def _is_checkout(root):
    """Whether root is a gcomp checkout whose python/gcomp is this very package."""
    pkg = os.path.join(root, "python", "gcomp")
    return (os.path.isdir(pkg) and os.path.samefile(pkg, _HERE)
            and os.path.isfile(os.path.join(root, "CMakeLists.txt"))
            and os.path.isfile(os.path.join(root, "include", "gcomp.h")))


def _sanitized(build):
    """Whether a build tree was configured with a sanitizer (GCOMP_SANITIZE or
    GCOMP_SANITIZE_THREAD): its library aborts a Python that did not preload the sanitizer's
    runtime ("ASan runtime does not come first"), so the search passes it by; GCOMP_LIBRARY
    can still name it, with the runtime preloaded, as the sanitizer test passes do."""
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    for line in lines:
        name, _, value = line.partition("=")
        if name.split(":")[0] in ("GCOMP_SANITIZE", "GCOMP_SANITIZE_THREAD") and _cmake_true(value):
            return True
    return False


def _cmake_true(value):
    """CMake's if(<constant>): 1, ON, YES, TRUE, Y (any case) or a non-zero number."""
    v = value.strip().upper()
    if v in ("ON", "YES", "TRUE", "Y"):
        return True
    try:
        return float(v) != 0
    except ValueError:
        return False


def _candidates():
    env = os.environ.get("GCOMP_LIBRARY")
    if env:
        # An explicit choice is never second-guessed: a wrong path is an error, not a fallback.
        yield (os.path.join(env, "libgcomp.so") if os.path.isdir(env) else env), True
        return
    yield os.path.join(_HERE, "libgcomp.so"), False
    root = os.path.dirname(os.path.dirname(_HERE))  # python/gcomp -> checkout root
    if _is_checkout(root):
        first = os.path.join(root, "build")
        builds = [first] + [b for b in sorted(glob.glob(os.path.join(root, "build*"))) if b != first]
        for build in builds:
            if not _sanitized(build):
                yield os.path.join(build, "libgcomp.so"), False
    found = ctypes.util.find_library("gcomp")
    if found:
        yield found, False
    yield "libgcomp.so.0.1", False  # the soname: the minor too before 1.0 (CMakeLists.txt)


def _load():
    tried = []
    for path, explicit in _candidates():
        if explicit or not os.path.isabs(path) or os.path.exists(path):
            try:
                # RTLD_GLOBAL: the library and mpi4py must share one libmpi; loading it global
                # also lets a later LD_PRELOADed interposer resolve against it.
                return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL), path
            except OSError as exc:
                if explicit:
                    raise OSError("gcomp: GCOMP_LIBRARY=%s cannot be loaded: %s"
                                  % (os.environ.get("GCOMP_LIBRARY"), exc)) from None
                tried.append("%s (%s)" % (path, exc))
        else:
            tried.append("%s (absent)" % path)
    raise OSError("gcomp: libgcomp.so not found; set GCOMP_LIBRARY to its path. Tried: "
                  + "; ".join(tried))


lib, path = _load()

c_size_p = ctypes.POINTER(ctypes.c_size_t)


class CodecOptions(ctypes.Structure):
    _fields_ = [("seed", ctypes.c_uint64), ("rank", ctypes.c_uint32),
                ("error_feedback", ctypes.c_int)]


class CodecStats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "encode_calls", "decode_calls", "raw_bytes", "wire_bytes", "overflow_count",
        "nonfinite_calls")]


class Config(ctypes.Structure):
    _fields_ = [("codec", ctypes.c_char_p), ("min_bytes", ctypes.c_int64),
                ("error_feedback", ctypes.c_int), ("seed", ctypes.c_int64),
                ("timeout_ms", ctypes.c_int64), ("debug", ctypes.c_int)]


class CommStats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "calls", "compressed_calls", "raw_bytes", "wire_bytes", "baseline_bytes",
        "overflow_count", "nonfinite_calls")] + [
        (n, ctypes.c_double) for n in ("encode_s", "comm_s", "decode_s", "agree_s")] + [
        ("last_schedule", ctypes.c_int)]


def _fn(name, restype, *argtypes, optional=False):
    try:
        f = getattr(lib, name)
    except AttributeError:
        if optional:
            return None
        raise
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


R = ctypes.c_int  # gcomp_result
vp, sz, u64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64

strerror = _fn("gcomp_strerror", ctypes.c_char_p, R)
result_name = _fn("gcomp_result_name", ctypes.c_char_p, R)
last_error = _fn("gcomp_last_error", ctypes.c_char_p)
dtype_size = _fn("gcomp_dtype_size", sz, ctypes.c_int)
codec_name_at = _fn("gcomp_codec_name_at", ctypes.c_char_p, sz)
schedule_name = _fn("gcomp_schedule_name", ctypes.c_char_p, ctypes.c_int)

codec_create = _fn("gcomp_codec_create", R, ctypes.c_char_p, ctypes.POINTER(CodecOptions),
                   ctypes.POINTER(vp))
codec_destroy = _fn("gcomp_codec_destroy", None, vp)
codec_spec = _fn("gcomp_codec_spec", ctypes.c_char_p, vp)
codec_max_encoded_bytes = _fn("gcomp_codec_max_encoded_bytes", sz, vp, sz)
codec_encode = _fn("gcomp_codec_encode", R, vp, u64, vp, sz, ctypes.c_int, vp, sz, c_size_p)
codec_decode_add = _fn("gcomp_codec_decode_add", R, vp, vp, sz, vp, sz)
codec_decode = _fn("gcomp_codec_decode", R, vp, vp, sz, vp, sz, ctypes.c_int)
codec_residual_get = _fn("gcomp_codec_residual_get", R, vp, u64, vp, sz)
codec_residual_set = _fn("gcomp_codec_residual_set", R, vp, u64, vp, sz)
codec_residual_reset = _fn("gcomp_codec_residual_reset", R, vp, u64)
codec_stats = _fn("gcomp_codec_stats_get", R, vp, ctypes.POINTER(CodecStats))
codec_stats_reset = _fn("gcomp_codec_stats_reset", R, vp)

config_default = _fn("gcomp_config_default", Config)
# MPI_Comm is passed as a void pointer: Open MPI's MPI_Comm is a pointer (the only MPI this
# package supports; _mpi_handle() in __init__ checks the vendor).
comm_create_mpi = _fn("gcomp_comm_create_mpi", R, vp, ctypes.POINTER(Config), ctypes.POINTER(vp),
                      optional=True)
comm_destroy = _fn("gcomp_comm_destroy", None, vp)
allreduce = _fn("gcomp_allreduce", R, vp, vp, vp, sz, ctypes.c_int, ctypes.c_int, u64, vp)
iallreduce = _fn("gcomp_iallreduce", R, vp, vp, vp, sz, ctypes.c_int, ctypes.c_int, u64, vp,
                 ctypes.POINTER(vp), optional=True)
request_test = _fn("gcomp_test", R, ctypes.POINTER(vp), ctypes.POINTER(ctypes.c_int), optional=True)
request_wait = _fn("gcomp_wait", R, ctypes.POINTER(vp), optional=True)
comm_stats_get = _fn("gcomp_comm_stats_get", R, vp, ctypes.POINTER(CommStats))
comm_key_stats = _fn("gcomp_comm_key_stats_get", R, vp, u64, ctypes.POINTER(CommStats))
comm_stats_reset = _fn("gcomp_comm_stats_reset", R, vp)
comm_rank = _fn("gcomp_comm_rank", ctypes.c_int, vp)
comm_size = _fn("gcomp_comm_size", ctypes.c_int, vp)
comm_codec = _fn("gcomp_comm_codec", ctypes.c_char_p, vp)
comm_config_get = _fn("gcomp_comm_config_get", R, vp, ctypes.POINTER(Config), optional=True)
comm_residuals_save = _fn("gcomp_comm_residuals_save", R, vp, vp, sz, c_size_p, optional=True)
comm_residuals_load = _fn("gcomp_comm_residuals_load", R, vp, ctypes.c_char_p, sz, optional=True)
comm_residuals_save_file = _fn("gcomp_comm_residuals_save_file", R, vp, ctypes.c_char_p,
                               optional=True)
comm_residuals_load_file = _fn("gcomp_comm_residuals_load_file", R, vp, ctypes.c_char_p,
                               optional=True)

# The NCCL communicator (include/gcomp_nccl.h), in a library built with GCOMP_WITH_NCCL: absent
# from others, and then gcomp.Comm(backend="nccl") says so (see _need_nccl in __init__).
# ncclUniqueId travels as its 128 bytes.
nccl_get_unique_id = _fn("gcomp_nccl_get_unique_id", R, vp, optional=True)
comm_create_nccl_rank = _fn("gcomp_comm_create_nccl_rank", R, vp, ctypes.c_int, ctypes.c_int,
                            ctypes.POINTER(Config), ctypes.POINTER(vp), optional=True)
