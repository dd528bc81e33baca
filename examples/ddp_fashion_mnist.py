#!/usr/bin/env python3
"""PyTorch DDP (gloo) on Fashion-MNIST: uncompressed DDP, torch's fp16 and PowerSGD hooks and
gcomp's hook (TernGrad, top-k, fp16), one after the other in one invocation.

    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    PYTHONPATH=python GCOMP_LIBRARY=build/libgcomp.so \
    mpirun --oversubscribe -np 4 /usr/bin/python3 examples/ddp_fashion_mnist.py --epochs 1

Launched by mpirun: torch.distributed (gloo) takes its rank and size from Open MPI's
environment, and gcomp's hook moves host tensors over MPI (mpi4py initialises MPI with
MPI_THREAD_MULTIPLE). Every setting trains the same MLP (784-256-128-10 by default, as
bench/train's --model mlp; --hidden sets the widths) from the same initial weights on the
same batches: global batch 128 split over the ranks, SGD with momentum 0.9, learning rate
0.05 with a cosine decay. gcomp-topk-mc is top-k with momentum correction (as in Deep
Gradient Compression): the hook keeps each bucket's velocity and reduces it, and the
optimizer runs without momentum (gcomp.torch's momentum argument).

Printed per setting (rank 0): test accuracy on the 10,000 test images, wall time of the
training loop (evaluation excluded), milliseconds per step, and the bytes one rank sends per
step once compression is on (after the first --start-iter steps, which every hook runs as a
plain allreduce):
  - gcomp: measured, gcomp's stats (wire_bytes, headers included) over the compressed steps;
  - uncompressed DDP and torch's hooks: computed from the bucket contents as a ring
    allreduce would send them, 2(N-1)/N x payload bytes: fp32 gradients (none), fp16 ones
    (fp16_compress_hook), and for powerSGD_hook the P and Q factors of every matrix it
    compresses (n x r and m x r, fp32, r = min(n, m, rank)) plus the tensors it sends
    uncompressed (vectors, and matrices where (n + m) r x 2 > n m). gcomp's stats count
    bytes the same way (baseline_bytes = 2(N-1)/N x raw), so the columns compare.
  A gcomp setting that never compressed (steps <= --start-iter) shows n/a.

Bad arguments are usage errors (a message naming the flag, exit 2) on every rank before any
training. A failure on some ranks only (rank 0 unable to bind --master-addr, an uncaught
exception) ends the whole job with a non-zero status instead of leaving the others waiting.
"""
import datetime
import json
import os
import socket
import sys
import time

from mpi4py import MPI

from fashion_mnist_common import (QUICK_TEST, QUICK_TRAIN, ArgumentParser, check_args, check_data,
                                  check_ranks, fail_together, load, make_model, param_hash, schedule)

WORLD = MPI.COMM_WORLD
# torch, its DDP hooks and gcomp.torch: bound by import_torch() once the arguments are
# checked, so that a usage error costs no torch import (a second or two per rank)
torch = dist = F = default_hooks = psgd = DDP = gcomp = None


def import_torch():
    global torch, dist, F, default_hooks, psgd, DDP, gcomp
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel as DDP
    try:
        import gcomp.torch
    except ImportError:  # run from the checkout without PYTHONPATH
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
        import gcomp.torch


def abort_on_uncaught_exception():
    """An exception on some ranks only leaves the others waiting in a collective, and the
    failing rank in MPI_Finalize, for ever: print it, then abort the job (as
    `python -m mpi4py` does)."""
    def hook(kind, value, tb):
        sys.__excepthook__(kind, value, tb)
        sys.stderr.flush()
        WORLD.Abort(1)
    sys.excepthook = hook
SETTINGS = ["none", "torch-fp16", "torch-powersgd", "gcomp-terngrad", "gcomp-topk", "gcomp-topk-mc",
            "gcomp-fp16"]
GCOMP_SPECS = {"gcomp-terngrad": "terngrad", "gcomp-topk": "topk:ratio=0.01",
               "gcomp-topk-mc": "topk:ratio=0.01", "gcomp-fp16": "fp16"}
MOMENTUM = 0.9
# "-mc": momentum correction (gcomp.torch's momentum=0.9: the hook keeps each bucket's
# velocity and reduces it; the optimizer runs without momentum)


def momentum_correction(setting):
    return setting.endswith("-mc")


def parse():
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=float, default=1.0, help="epochs per setting [1]")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 12,800 training and 2,000 test images")
    p.add_argument("--settings", default=",".join(SETTINGS),
                   help="comma-separated subset of: " + ", ".join(SETTINGS))
    p.add_argument("--start-iter", type=int, default=10,
                   help="plain allreduce steps before compressing (PowerSGD and gcomp) [10]")
    p.add_argument("--powersgd-rank", type=int, default=4, help="PowerSGD matrix rank [4]")
    p.add_argument("--batch", type=int, default=128, help="global batch [128]")
    p.add_argument("--lr", type=float, default=0.05, help="peak learning rate [0.05]")
    p.add_argument("--hidden", default="256,128",
                   help="hidden layer widths of the MLP [256,128]: wider layers mean more "
                        "gradient bytes per step for the same data")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--sweep-point", action="store_true",
                   help="run ONE setting for bench/sweep --cmd: gcomp's hook with the codec in "
                        "GCOMP_CODEC (none included, so its bytes are measured too), error "
                        "feedback from GCOMP_EF, --seed from GCOMP_SEED; gcomp writes its stats "
                        "to GCOMP_STATS_FILE and rank 0 prints the GCOMP_RESULT line "
                        "(docs/SWEEP.md)")
    p.add_argument("--master-addr", default="127.0.0.1",
                   help="address of rank 0 for torch.distributed's rendezvous [127.0.0.1]; "
                        "examples/netem_ddp.sh passes rank 0's emulated host")
    p.add_argument("--init-timeout", type=float, default=300,
                   help="seconds torch.distributed waits for every rank, in the rendezvous "
                        "and in each collective (the process group's timeout, which the gcomp "
                        "hook takes as its own) [300]; torch's default is 30 minutes")
    a = p.parse_args()
    a.settings = [s for s in a.settings.split(",") if s]
    if not a.settings:
        p.error("--settings must name at least one of: " + ", ".join(SETTINGS))
    try:
        a.hidden = [int(w) for w in a.hidden.split(",")]
        assert a.hidden and min(a.hidden) > 0
    except (ValueError, AssertionError):
        p.error("--hidden must be positive integers separated by commas, got %r" % a.hidden)
    if not 0 < a.init_timeout < float("inf"):
        p.error("--init-timeout must be a positive finite number of seconds, got %r"
                % a.init_timeout)
    bad = [s for s in a.settings if s not in SETTINGS]
    if bad:
        p.error("unknown setting(s) %s" % ", ".join(bad))
    if a.sweep_point:
        if not os.environ.get("GCOMP_CODEC"):
            p.error("--sweep-point needs GCOMP_CODEC (bench/sweep --cmd sets it)")
        GCOMP_SPECS["gcomp-sweep"] = os.environ["GCOMP_CODEC"]
        a.settings = ["gcomp-sweep"]
        try:
            a.seed = int(os.environ.get("GCOMP_SEED", a.seed))
        except ValueError:
            p.error("--sweep-point: GCOMP_SEED must be an integer, got %r"
                    % os.environ["GCOMP_SEED"])
    if a.start_iter < 0:
        p.error("--start-iter must be 0 or more, got %d" % a.start_iter)
    if "torch-powersgd" in a.settings and a.start_iter < 2:
        p.error("--start-iter must be at least 2 with torch-powersgd (its error feedback needs "
                "it), got %d" % a.start_iter)
    if a.powersgd_rank < 1:
        p.error("--powersgd-rank must be at least 1, got %d" % a.powersgd_rank)
    check_args(p, a)
    check_ranks(p, a, WORLD.size)
    # the data is each rank's own: a rank that stopped alone would leave the others waiting
    error = check_data(a)
    fail_together(p, error, WORLD.allreduce(1 if error else 0, op=MPI.MAX), WORLD.rank)
    return a


# ---- bytes on the wire -------------------------------------------------------------------

def ring_bytes(payload, n):
    return 2.0 * (n - 1) / n * payload


def powersgd_payload(model, rank, min_compression_rate=2.0):
    """Bytes powerSGD_hook allreduces per step: as torch 1.13's hook decides per tensor."""
    total = 0
    for p in model.parameters():
        if p.dim() <= 1:
            total += 4 * p.numel()
            continue
        n, m = p.shape[0], p.numel() // p.shape[0]
        r = min(n, m, rank)
        if (n + m) * r * min_compression_rate < n * m:  # psgd._should_compress
            total += 4 * (n + m) * r
        else:
            total += 4 * p.numel()
    return total


# ---- one setting -------------------------------------------------------------------------

def run(setting, a, train, test):
    rank, size = dist.get_rank(), dist.get_world_size()
    model = make_model(a.seed, a.hidden)
    ddp = DDP(model)
    state = None
    if setting == "torch-fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif setting == "torch-powersgd":
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=a.powersgd_rank,
                                   start_powerSGD_iter=a.start_iter, random_seed=a.seed)
        ddp.register_comm_hook(state, psgd.powerSGD_hook)
    elif setting.startswith("gcomp-"):
        state = gcomp.torch.GcompHookState(codec=GCOMP_SPECS[setting], start_iter=a.start_iter,
                                           seed=a.seed,
                                           momentum=MOMENTUM if momentum_correction(setting) else 0.0)
        ddp.register_comm_hook(state, gcomp.torch.hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr,
                          momentum=0.0 if momentum_correction(setting) else MOMENTUM)

    x, y = train
    steps, batches = schedule(len(x), a.batch, a.epochs, rank, size, a.seed, a.lr)
    dist.barrier()
    t0 = time.perf_counter()
    for s, idx, lr in batches:
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad()
        loss = F.cross_entropy(ddp(x[idx]), y[idx])
        loss.backward()
        opt.step()
        if s == a.start_iter - 1 and setting.startswith("gcomp-"):
            state.stats_reset()
    dist.barrier()
    wall = time.perf_counter() - t0

    with torch.no_grad():
        acc = (model(test[0]).argmax(1) == test[1]).float().mean().item() * 100
    same = len(set(WORLD.allgather(param_hash(model)))) == 1
    nparams = sum(p.numel() for p in model.parameters())
    if setting.startswith("gcomp-"):
        st = state.stats()
        compressed = steps - a.start_iter
        if compressed > 0:
            wire = st["wire_bytes"] / compressed
            how = "measured (gcomp stats); per step: encode %.2f, comm %.2f, decode %.2f, agree %.2f ms" % tuple(
                1000 * st[k] / compressed for k in ("encode_s", "comm_s", "decode_s", "agree_s"))
        else:  # every step ran before --start-iter: nothing compressed, nothing to measure
            wire, how = None, "none compressed: %d steps <= --start-iter %d" % (steps, a.start_iter)
        state.close()
    elif setting == "torch-fp16":
        wire, how = ring_bytes(2 * nparams, size), "computed"
    elif setting == "torch-powersgd":
        wire, how = ring_bytes(powersgd_payload(model, a.powersgd_rank), size), "computed"
    else:
        wire, how = ring_bytes(4 * nparams, size), "computed"
    return dict(setting=setting, acc=acc, wall=wall, steps=steps, wire=wire, how=how, same=same,
                loss=float(loss))


def fmt_bytes(wire):
    return "n/a" if wire is None else "%.0f" % wire


def init_dist(addr, timeout_s):
    """gloo from Open MPI's environment: rank 0 picks a free port, mpi4py broadcasts it. A
    rank that cannot reach addr (rank 0 bound one the others have no route to) ends the
    rendezvous of every rank after timeout_s, not torch's 30 minutes."""
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", WORLD.rank))
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", WORLD.size))
    port = err = None
    if rank == 0:
        try:
            with socket.socket() as s:
                s.bind((addr, 0))
                port = s.getsockname()[1]
        except OSError as e:
            err = "rank 0 cannot bind a port on --master-addr %s: %s" % (addr, e)
    # the outcome, not just the port: the other ranks wait here, and must learn of a failure
    port, err = WORLD.bcast((port, err), root=0)
    if err:
        sys.exit("ddp_fashion_mnist.py: " + err if rank == 0 else 1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, str(port)
    dist.init_process_group("gloo", init_method="tcp://%s:%d" % (addr, port), rank=rank,
                            world_size=size, timeout=datetime.timedelta(seconds=timeout_s))


def main():
    a = parse()
    abort_on_uncaught_exception()
    import_torch()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    init_dist(a.master_addr, a.init_timeout)
    size = dist.get_world_size()
    train = load(a.data, "train", QUICK_TRAIN if a.quick else None)
    test = load(a.data, "test", QUICK_TEST if a.quick else None)
    rows = []
    for setting in a.settings:
        rows.append(run(setting, a, train, test))
        r = rows[-1]
        if WORLD.rank == 0:
            print("# %-15s acc %.2f %%  %.1f s  %.2f ms/step  %s bytes/step  final loss %.3f  "
                  "identical params: %s" % (setting, r["acc"], r["wall"], 1000 * r["wall"] / r["steps"],
                                            fmt_bytes(r["wire"]), r["loss"], "yes" if r["same"] else "NO"),
                  flush=True)
    if a.sweep_point and WORLD.rank == 0:
        # bench/sweep's convention: one line; steps = the steps gcomp's stats count (those
        # after --start-iter), train_steps and train_time_s the whole training loop.
        r = rows[0]
        print("GCOMP_RESULT " + json.dumps(dict(
            test_acc=round(r["acc"], 4), loss=round(r["loss"], 6),
            steps=max(0, r["steps"] - a.start_iter), train_steps=r["steps"],
            train_time_s=round(r["wall"], 4), epochs=a.epochs, identical_params=r["same"])),
            flush=True)
    if WORLD.rank == 0:
        base = next((r for r in rows if r["setting"] == "none"), None)
        print("\nDDP (gloo) on Fashion-MNIST, MLP 784-%s-10, %d ranks, %g epoch(s)%s, %d steps, "
              "global batch %d, torch %s" % ("-".join(map(str, a.hidden)), size, a.epochs,
                                             " (quick)" if a.quick else "", rows[0]["steps"],
                                             a.batch, torch.__version__))
        print("%-15s %9s %9s %8s %13s %8s  %s" % ("setting", "test acc", "wall s", "ms/step",
                                                   "bytes/step", "vs none", "bytes"))
        for r in rows:
            ratio = ("%.1fx" % (base["wire"] / r["wire"])) if base and base["wire"] and r["wire"] else "-"
            print("%-15s %8.2f%% %9.1f %8.2f %13s %8s  %s"
                  % (r["setting"], r["acc"], r["wall"], 1000 * r["wall"] / r["steps"],
                     fmt_bytes(r["wire"]), ratio, r["how"]))
        if not all(r["same"] for r in rows):
            print("WARNING: parameters differ across ranks in some setting")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
