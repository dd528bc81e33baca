#!/usr/bin/env python3
"""The Python binding's CUDA path on one GPU, one rank (issue 16): gcomp.Comm(backend="nccl")
and the DDP hook on CUDA buckets.

Run from the repository root, with a libgcomp built with CUDA and NCCL:
    GCOMP_LIBRARY=build-gpu/libgcomp.so python3 tests/test_python_cuda.py [CHECK ...]
(the package is taken from python/ in place; ctest: python_cuda, label cuda). Exit 77 (skip)
without torch or without a CUDA device; 1 on any failure; 0 when every check passed.

GCOMP_TEST_COMPRESS_ONE_RANK=1 (set here) makes a one-rank communicator run the compressed
schedules. The CPU reference is tests/python/one_rank.py (a codec object's decode(encode(x,
key)) per step), which test_binding_args.py's test_one_rank_reference proves equal, bit for
bit, to the MPI engine's one-rank allreduce of the same CPU tensors; where this Python has
mpi4py and the library MPI, the MPI engine is compared here directly as well.

Checks:
  allreduce   CUDA tensors through an NCCL Comm (one rank; the unique id over a one-rank NCCL
              process group) == the CPU reference bit for bit: fp16, bf16, none, terngrad,
              topk:ratio=0.01; float32, float16, bfloat16; three steps of error feedback;
              the expected schedule ran.
  streams     in place and out of place; on torch's current stream, under
              torch.cuda.stream(side), with stream=side and with a raw cudaStream_t: each ==
              the reference; the input of an out-of-place call unchanged.
  refusals    host buffers on an NCCL Comm, mixed host/device in/out, a "+zstd" spec (NCCL
              moves device memory only), a CUDA tensor given to a Codec, a closed Comm.
  mpi         (mpi4py and an MPI library only) the same calls over MPI.COMM_SELF: CPU
              tensors and CUDA tensors (staged through host memory) == the reference.
  ddp         torch DDP, NCCL process group of world size 1, an MLP on CUDA with
              gcomp.torch.hook for terngrad, topk:ratio=0.05 and fp16: the state picked the
              NCCL backend, the loss falls, buckets past start_iter ran compressed; the
              state's residuals (on the device) survive state_dict -> load_state_dict;
              top-k with momentum correction (momentum=0.9, optimizer without momentum):
              the loss falls, the velocities live on the GPU and survive state_dict.
  share_refusal  two processes of a gloo group on the one GPU, Comm(backend="nccl"): rank 1's
              codec refused in Python, rank 0 fails at the unique id's share naming it (no
              wait in NCCL's creation).
"""
import os
import socket
import sys
import time
import traceback

os.environ["GCOMP_TEST_COMPRESS_ONE_RANK"] = "1"  # read when a communicator is created
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "python"))  # one_rank.py, helpers.py
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))  # the gcomp package in place
SKIP = 77


def say(*a):
    print(*a, flush=True)


try:
    import torch
except ImportError:
    say("test_python_cuda: SKIP: this Python has no torch")
    sys.exit(SKIP)
if not torch.cuda.is_available():
    say("test_python_cuda: SKIP: no CUDA device (torch %s, CUDA %s)"
        % (torch.__version__, torch.version.cuda))
    sys.exit(SKIP)

try:
    import numpy  # not needed, but when there, numpy arrays are checked too
except ImportError:
    numpy = None
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import gcomp  # noqa: E402
import gcomp.torch  # noqa: E402
from gcomp import _lib  # noqa: E402
import one_rank  # noqa: E402
from helpers import raises  # noqa: E402

DEV = torch.device("cuda", 0)
SEED = 5


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_process_group():
    """A one-rank NCCL process group on DEV (the hook's plain iterations and the unique id
    travel over it)."""
    torch.cuda.set_device(DEV)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%d" % free_port(), rank=0,
                            world_size=1)


def check_allreduce():
    for spec, sched in one_rank.SCHEDULES.items():
        with gcomp.Comm(codec=spec, min_bytes=0, seed=SEED, backend="nccl") as comm:
            assert comm.backend == "nccl" and comm.device == DEV and comm.size == 1, \
                (comm.backend, comm.device, comm.size)
            for key, dtype in enumerate(one_rank.DTYPES):
                xs = one_rank.inputs(dtype)
                ref = one_rank.reference(spec, xs, key=key, seed=SEED)
                for i, x in enumerate(xs):
                    g = x.to(DEV)
                    comm.allreduce(g, op="avg", key=key)  # torch's current stream
                    torch.cuda.current_stream(DEV).synchronize()
                    assert one_rank.same_bits(g, ref[i]), \
                        "%s %s step %d: CUDA result differs from the CPU reference" % (spec, dtype, i)
            st = comm.stats()
            n = len(one_rank.DTYPES) * one_rank.STEPS
            assert st["compressed_calls"] == n and st["last_schedule"] == sched, (spec, st)
        say("allreduce: %-16s CUDA == CPU reference, bit for bit (%s; %d calls)"
            % (spec, sched, n))


def check_streams():
    spec = "terngrad"  # stochastic rounding keyed by key and step: a wrong key shows
    x = one_rank.inputs(torch.float32, steps=1)[0]
    cur = torch.cuda.current_stream(DEV)
    side = torch.cuda.Stream(DEV)

    def ref(key):
        return one_rank.reference(spec, [x], key=key, seed=SEED)[0]

    with gcomp.Comm(codec=spec, min_bytes=0, seed=SEED, backend="nccl") as comm:
        g = x.to(DEV)
        out = torch.full_like(g, float("nan"))
        comm.allreduce(g, out=out, op="avg", key=1)
        cur.synchronize()
        assert one_rank.same_bits(out, ref(1)) and one_rank.same_bits(g, x), "out of place"
        for key, how in ((2, "with torch.cuda.stream(side)"), (3, "stream=side"),
                         (4, "stream=side.cuda_stream")):
            g = x.to(DEV)
            side.wait_stream(cur)  # g was written on the current stream
            if key == 2:
                with torch.cuda.stream(side):
                    comm.allreduce(g, op="avg", key=key)
            else:
                comm.allreduce(g, op="avg", key=key,
                               stream=side if key == 3 else side.cuda_stream)
            side.synchronize()
            assert one_rank.same_bits(g, ref(key)), how
    say("streams: out of place, current stream, torch.cuda.stream(side), stream=side, a raw "
        "cudaStream_t: each == the reference")


def check_refusals():
    x = torch.randn(4099)
    with gcomp.Comm(codec="fp16", min_bytes=0, backend="nccl") as comm:
        raises(ValueError, lambda: comm.allreduce(x), "NCCL Comm")
        if numpy is not None:
            raises(ValueError, lambda: comm.allreduce(x.numpy()), "host memory")
        raises(ValueError, lambda: comm.allreduce(x.to(DEV), out=x), "same device")
    raises(ValueError, lambda: comm.allreduce(x.to(DEV)), "after close()")
    e = raises(gcomp.GcompError, lambda: gcomp.Comm(codec="fp16+zstd", backend="nccl"))
    assert e.name == "GCOMP_ERR_UNSUPPORTED", (e.name, e.detail)
    raises(NotImplementedError, lambda: gcomp.Codec("fp16").encode(x.to(DEV)), "cuda")
    say("refusals: host buffers on an NCCL Comm, mixed devices, +zstd, Codec on CUDA, closed")


def check_mpi():
    try:
        from mpi4py import MPI
    except ImportError:
        say("mpi: SKIPPED (no mpi4py in this Python); the reference stands for the MPI engine")
        return
    if _lib.comm_create_mpi is None:
        say("mpi: SKIPPED (%s has no MPI); the reference stands for the MPI engine"
            % _lib.path)
        return
    for spec in one_rank.SCHEDULES:
        xs = one_rank.inputs(torch.float32)
        ref = one_rank.reference(spec, xs, key=0, seed=SEED)
        for where in ("cpu", DEV):
            with gcomp.Comm(MPI.COMM_SELF, codec=spec, min_bytes=0, seed=SEED) as comm:
                for i, x in enumerate(xs):
                    g = x.to(where)
                    comm.allreduce(g, op="avg", key=0)
                    torch.cuda.synchronize(DEV)
                    assert one_rank.same_bits(g, ref[i]), (spec, where, i)
    say("mpi: MPI.COMM_SELF, CPU tensors and CUDA tensors (staged) == the reference")


def teacher_data(n=4096, dim=64, classes=10):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, dim, generator=g)
    y = (x @ torch.randn(dim, classes, generator=g)).argmax(1)
    return x.to(DEV), y.to(DEV)


def ddp_run(codec, data, steps=60, start_iter=3, batch=64, momentum=0.0):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10)).to(DEV)
    ddp = DDP(model, device_ids=[DEV.index])
    state = gcomp.torch.GcompHookState(codec=codec, start_iter=start_iter, seed=SEED,
                                       momentum=momentum)
    assert state.comm.backend == "nccl" and state.comm.device == DEV, state.comm.backend
    ddp.register_comm_hook(state, gcomp.torch.hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.0 if momentum else 0.9)
    x, y = data
    losses = []
    for s in range(steps):
        i = (s * batch) % (len(x) - batch + 1)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x[i:i + batch]), y[i:i + batch])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    st = state.stats()
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    say("ddp: %-16s momentum %.1f: loss %.3f -> %.3f, compressed calls %d, last schedule %s, "
        "wire/raw %.4f" % (codec, momentum, first, last, st["compressed_calls"], st["last_schedule"],
           st["wire_bytes"] / max(st["raw_bytes"], 1)))
    assert all(torch.isfinite(p).all() for p in model.parameters()), "non-finite parameters"
    assert last < 0.8 * first, "%s: loss did not fall: %.3f -> %.3f" % (codec, first, last)
    assert state.iter == steps and st["compressed_calls"] >= steps - start_iter, st
    assert st["compressed_calls"] == st["calls"], st
    if momentum:
        assert state._velocity and all(u.device == DEV for u in state._velocity.values()), \
            {k: u.device for k, u in state._velocity.items()}
    if state._ef:
        sd = state.state_dict()
        again = gcomp.torch.GcompHookState(codec=codec, start_iter=start_iter, seed=SEED,
                                           momentum=momentum)
        again.load_state_dict(sd)
        assert again.state_dict()["residuals"] == sd["residuals"], "residuals changed"
        for k, u in sd["velocity"].items():
            assert torch.equal(again.state_dict()["velocity"][k], u), "velocity %d changed" % k
        again.close()
    state.close()


def check_ddp():
    data = teacher_data()
    for codec in ("terngrad", "topk:ratio=0.05", "fp16"):
        ddp_run(codec, data)
    ddp_run("topk:ratio=0.05", data, momentum=0.9)


def refusing_rank(rank, port, q):
    """One of two processes of a gloo group, both on DEV: rank 1 refuses its codec, rank 0's
    arguments are good. Puts (rank, exception name, message, seconds) on q."""
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=2)
    t0 = time.monotonic()
    try:
        gcomp.Comm(codec="" if rank else "fp16", backend="nccl", device=DEV, timeout_ms=120000)
        q.put((rank, "created", "", time.monotonic() - t0))
    except Exception as exc:  # noqa: B902 - reported to the parent
        q.put((rank, type(exc).__name__, str(exc), time.monotonic() - t0))
    dist.destroy_process_group()


def check_share_refusal():
    """Two processes sharing the GPU (NCCL's creation is never reached): rank 1's codec is
    refused in Python, and rank 0 fails at the unique id's share, naming rank 1's reason,
    instead of waiting in NCCL's creation for the 120 s of its timeout."""
    ctx = torch.multiprocessing.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=refusing_rank, args=(r, port, q)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = sorted(q.get(timeout=90) for _ in procs)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert got[1][1] == "ValueError", got
    assert got[0][1] == "RuntimeError" and "rank 1: ValueError" in got[0][2], got
    assert got[0][3] < 60, got
    say("share_refusal: rank 0 failed after %.1f s: %s" % (got[0][3], got[0][2]))


CHECKS = {"allreduce": check_allreduce, "streams": check_streams, "refusals": check_refusals,
          "mpi": check_mpi, "ddp": check_ddp, "share_refusal": check_share_refusal}


def main(names):
    unknown = set(names) - set(CHECKS)
    assert not unknown, "no such check: %s (have %s)" % (sorted(unknown), sorted(CHECKS))
    say("test_python_cuda: torch %s (CUDA %s), %s, library %s"
        % (torch.__version__, torch.version.cuda, torch.cuda.get_device_name(DEV),
           gcomp.library_path))
    init_process_group()
    t0 = time.monotonic()
    for name, fn in CHECKS.items():
        if not names or name in names:
            fn()
    dist.destroy_process_group()
    say("test_python_cuda: OK (%.1f s)" % (time.monotonic() - t0))


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except BaseException:  # noqa: B902 - any failure is the test's
        traceback.print_exc()
        sys.exit(1)
