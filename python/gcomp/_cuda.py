"""CUDA helpers of the binding: the device and stream of a call, and NCCL's unique id shared
from rank 0 over a torch process group or an mpi4py communicator.

torch is imported here only when a CUDA communicator or tensor is used, so the package works
without torch (numpy arrays over MPI) and with a CPU-only torch.
"""
from . import _args

UNIQUE_ID_BYTES = 128  # sizeof(ncclUniqueId)


def torch_with_cuda(what):
    try:
        import torch
    except ImportError:
        raise NotImplementedError("%s needs torch with CUDA (import torch failed)" % what) from None
    if not torch.cuda.is_available():
        raise RuntimeError("%s needs a CUDA device: torch.cuda.is_available() is False (torch %s, "
                           "built for CUDA %s)" % (what, torch.__version__, torch.version.cuda))
    return torch


def device_arg(torch, device):
    """The CUDA device a communicator lives on: None is the current device; an int, "cuda",
    "cuda:1" or a torch.device of type cuda."""
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    if isinstance(device, int) and not isinstance(device, bool):
        d = torch.device("cuda", _args.int_arg("device", device, 0,
                                               torch.cuda.device_count() - 1))
    else:
        try:
            d = torch.device(device)
        except (TypeError, RuntimeError) as exc:
            raise ValueError("device %r is not a CUDA device (%s)" % (device, exc)) from None
    if d.type != "cuda":
        raise ValueError("device %r is not a CUDA device" % (device,))
    if d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    if not 0 <= d.index < torch.cuda.device_count():
        raise ValueError("device %s does not exist (%d CUDA devices)"
                         % (d, torch.cuda.device_count()))
    return d


def stream_arg(torch, device, stream):
    """(cudaStream_t as an int, the torch stream) of a call on device. None: torch's current
    stream there, so the call is ordered after the work that produced the tensor and before
    what the caller enqueues next, as torch's own collectives are. A torch.cuda.Stream must
    be on that device; an int is a raw cudaStream_t of that device (0: the legacy default)."""
    current = torch.cuda.current_stream(device)
    if stream is None:
        return current.cuda_stream, current
    if isinstance(stream, torch.cuda.Stream):
        if stream.device != device:
            raise ValueError("stream is on %s, the call on %s" % (stream.device, device))
        return stream.cuda_stream, stream
    handle = _args.int_arg("stream", stream, 0, _args.UINT64_MAX)
    if handle == current.cuda_stream:
        return handle, current
    return handle, torch.cuda.ExternalStream(handle, device=device)


def record_stream(bufs, stream, torch):
    """Tell torch's caching allocator that the tensors are used on stream, so their memory is
    not handed out again before the work enqueued there is done (a no-op for the tensor's
    own allocation stream, the usual case)."""
    for b in bufs:
        if isinstance(b.obj, torch.Tensor):
            b.obj.record_stream(stream)


SLOT_BYTES = 1024  # one rank's state in the share over MPI: the id, "ok", or a reason
_abandoned = []  # buffers of shares that timed out: MPI may still write them


def _mpi_allgather_until(mpi_comm, obj, timeout_s):
    """mpi_comm.allgather(obj) with a deadline: each rank's small object pickled into a slot
    of SLOT_BYTES, one MPI_Iallgather polled until timeout_s. Past it, RuntimeError: a rank
    that never comes (one that could not join over this communicator) must not leave the
    others waiting for ever, as mpi4py's blocking allgather would."""
    import pickle
    import time
    from mpi4py import MPI
    data = pickle.dumps(obj)
    if len(data) > SLOT_BYTES - 4:  # a reason too long: cut it
        data = pickle.dumps((obj[0], str(obj[1])[:SLOT_BYTES // 2]))
    mine = bytearray(SLOT_BYTES)
    mine[:4] = len(data).to_bytes(4, "little")
    mine[4:4 + len(data)] = data
    size = mpi_comm.Get_size()
    out = bytearray(SLOT_BYTES * size)
    req = mpi_comm.Iallgather([mine, MPI.BYTE], [out, MPI.BYTE])
    until = time.monotonic() + timeout_s
    while not req.Test():
        if time.monotonic() > until:
            _abandoned.append((mine, out, req))
            raise RuntimeError("gcomp.Comm(backend='nccl'): not every rank came to the sharing of "
                               "NCCL's unique id within %g s (timeout_ms)" % timeout_s)
        time.sleep(0.0005)
    slots = [out[i * SLOT_BYTES:(i + 1) * SLOT_BYTES] for i in range(size)]
    return [pickle.loads(bytes(b[4:4 + int.from_bytes(b[:4], "little")])) for b in slots]


def group_allgather(group, mpi_comm, timeout_s=None):
    """(rank, size, allgather) of the group the unique id is shared over: mpi_comm (mpi4py)
    when given (with a deadline of timeout_s when given), else the torch process group
    (None: the default group; the group's own timeout bounds it)."""
    if mpi_comm is not None:
        if timeout_s is None:
            return mpi_comm.Get_rank(), mpi_comm.Get_size(), mpi_comm.allgather
        return (mpi_comm.Get_rank(), mpi_comm.Get_size(),
                lambda obj: _mpi_allgather_until(mpi_comm, obj, timeout_s))
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("backend='nccl' shares NCCL's unique id over a torch process group "
                         "or an mpi4py communicator: call torch.distributed."
                         "init_process_group first, or pass mpi_comm")
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if rank < 0:
        raise ValueError("this process is not a member of the process group")

    def allgather(obj):
        # an NCCL group moves the objects through tensors on the current device (torch
        # picks it, 1.13 and 2.x alike): the caller has made the Comm's device current
        out = [None] * size
        dist.all_gather_object(out, obj, group=group)
        return out
    return rank, size, allgather


def share_unique_id(get_id, group=None, mpi_comm=None, refusal=None, timeout_s=300.0):
    """Rank 0 calls get_id() (-> 128 bytes) and every rank returns it, with (rank, size) of
    the group: over mpi_comm (mpi4py) when given, else over the torch process group (None:
    the default group). refusal: the exception this rank raised on its own arguments, which
    it raises again here. One allgather carries each rank's state, so a failure anywhere (rank
    0's get_id(), a rank's refusal) reaches every rank as an exception at once, instead of
    leaving the others in NCCL's creation until their timeout. Over mpi_comm it gives up
    after timeout_s (RuntimeError); over a torch group, after the group's timeout."""
    rank, size, allgather = group_allgather(group, mpi_comm, timeout_s)
    err = refusal
    if err is not None:
        mine = ("error", "%s: %s" % (type(err).__name__, err))
    elif rank == 0:
        try:
            mine = ("id", bytes(get_id()))
        except Exception as exc:  # noqa: B902 - carried to every rank, then raised
            err, mine = exc, ("error", "%s: %s" % (type(exc).__name__, exc))
    else:
        mine = ("ok", None)
    seen = allgather(mine)
    if err is not None:
        raise err
    failed = ["rank %d: %s" % (r, m[1]) for r, m in enumerate(seen) if m[0] == "error"]
    if failed:
        raise RuntimeError("gcomp.Comm(backend='nccl'): not created, another rank failed before "
                           "NCCL's creation (%s)" % "; ".join(failed))
    uid = seen[0][1]
    if not isinstance(uid, bytes) or len(uid) != UNIQUE_ID_BYTES:
        raise RuntimeError("the NCCL unique id from rank 0 is not %d bytes" % UNIQUE_ID_BYTES)
    return uid, rank, size


def join_refused_share(refusal, group=None, mpi_comm=None, device=None, timeout_s=300.0):
    """This rank refused its own arguments to Comm(backend='nccl') before sharing NCCL's
    unique id; the other ranks would share it and wait in NCCL's creation for this one until
    their timeout. Join the share with the refusal instead, so they raise at once. Over a
    torch group it runs on `device` where that names one (an NCCL group moves the objects
    through the current device, which must be this rank's own, not another rank's). Best
    effort: with no group to share over (an mpi_comm that is no communicator, no torch
    process group) there is nothing to join; the caller raises its own error either way."""
    try:
        with _share_device(device if mpi_comm is None else None):
            share_unique_id(None, group=group, mpi_comm=mpi_comm, refusal=refusal,
                            timeout_s=timeout_s)
    except Exception:  # noqa: B902 - the refusal itself, or a share that cannot run here
        pass


def _share_device(device):
    """torch.cuda.device(device) where device names a CUDA device of this process; else a
    context that changes nothing (the current device stays)."""
    import contextlib
    if device is None:
        return contextlib.nullcontext()
    try:
        import torch
        if torch.cuda.is_available():
            return torch.cuda.device(device_arg(torch, device))
    except Exception:  # noqa: B902 - a device the refusal may be about: keep the current one
        pass
    return contextlib.nullcontext()
