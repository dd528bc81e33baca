#!/usr/bin/env python3
"""A plain Horovod PyTorch trainer on Fashion-MNIST: nothing in it knows of gcomp.

    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun --oversubscribe -np 4 -x OMP_NUM_THREADS=1 \
        /usr/bin/python3 examples/horovod_fashion_mnist.py --epochs 1

It is the textbook Horovod recipe (hvd.init, hvd.DistributedOptimizer, broadcast_parameters,
broadcast_optimizer_state) around the same model and schedule as
examples/ddp_fashion_mnist.py: an MLP 784-256-128-10 (--hidden), global batch 128 split over
the ranks, SGD with momentum 0.9, learning rate 0.05 with a cosine decay, data read from
/usr/share/datasets/fashion-mnist. Horovod must be built with its MPI backend
(scripts/horovod-deps.sh). To compress its gradient allreduces, run it unchanged under gcomp's
MPI_Allreduce interposer (LD_PRELOAD=.../libgcomp_mpi.so GCOMP_CODEC=terngrad, see
docs/INTERPOSE.md and examples/horovod_netem.sh).

Rank 0 prints the test accuracy on the 10,000 test images, the wall time of the training
loop (between two barriers; evaluation excluded), and whether the parameters are identical
on every rank (a SHA-256 of every parameter's bytes, allgathered); the same as one JSON line
starting "RESULT ". The exit status is 1 if the parameters differ, 2 for bad arguments (a
message naming the flag, before torch and Horovod are imported, or right after hvd.init() for
a --batch the ranks cannot split and for a --data that some rank cannot read or that holds
fewer images than a --batch: then every rank exits 2 and the ranks that found it print it).
"""
import json
import os
import sys
import time

from fashion_mnist_common import (QUICK_TEST, QUICK_TRAIN, ArgumentParser, check_args, check_data,
                                  check_ranks, fail_together, load, make_model, param_hash, schedule)


def parse():
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=float, default=1.0, help="epochs [1]")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 12,800 training and 2,000 test images")
    p.add_argument("--batch", type=int, default=128, help="global batch [128]")
    p.add_argument("--lr", type=float, default=0.05, help="peak learning rate [0.05]")
    p.add_argument("--hidden", default="256,128", help="hidden layer widths of the MLP [256,128]")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    a = p.parse_args()
    try:
        a.hidden = [int(w) for w in a.hidden.split(",")]
        assert a.hidden and min(a.hidden) > 0
    except (ValueError, AssertionError):
        p.error("--hidden must be positive integers separated by commas, got %r" % a.hidden)
    check_args(p, a)
    return p, a


def main():
    p, a = parse()
    # imported once the arguments are checked: a usage error costs no torch import
    import torch
    import torch.nn.functional as F
    import horovod
    import horovod.torch as hvd

    hvd.init()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    rank, size = hvd.rank(), hvd.size()
    check_ranks(p, a, size)
    # the data is each rank's own: a rank that stopped alone would leave the others waiting
    error = check_data(a)
    failed = hvd.allreduce(torch.tensor([1.0 if error else 0.0]), op=hvd.Sum, name="check_data")
    fail_together(p, error, failed.item() > 0, rank)
    x, y = load(a.data, "train", QUICK_TRAIN if a.quick else None)
    test = load(a.data, "test", QUICK_TEST if a.quick else None)

    # rank 0's initial state is everyone's (the seed makes them equal anyway)
    model = make_model(a.seed + rank, a.hidden)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())

    steps, batches = schedule(len(x), a.batch, a.epochs, rank, size, a.seed, a.lr)
    hvd.barrier()
    t0 = time.perf_counter()
    for _, idx, lr in batches:
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
    hvd.barrier()
    wall = time.perf_counter() - t0

    with torch.no_grad():
        acc = (model(test[0]).argmax(1) == test[1]).float().mean().item() * 100
    hashes = hvd.allgather_object(param_hash(model))
    same = len(set(hashes)) == 1
    if rank == 0:
        print("Horovod %s (PyTorch %s) on Fashion-MNIST, MLP 784-%s-10, %d ranks, %g epoch(s)%s, "
              "%d steps, global batch %d" % (horovod.__version__, torch.__version__,
                                             "-".join(map(str, a.hidden)), size, a.epochs,
                                             " (quick)" if a.quick else "", steps, a.batch))
        print("test accuracy %.2f %%, training %.2f s (%.2f ms/step), final loss %.4f" %
              (acc, wall, 1000 * wall / steps, float(loss)))
        print("parameters identical on all %d ranks: %s (sha256 %s)" %
              (size, "yes" if same else "NO", " ".join(sorted(set(h[:12] for h in hashes)))))
        print("RESULT " + json.dumps(dict(test_acc=round(acc, 4), train_time_s=round(wall, 4),
                                          steps=steps, loss=round(float(loss), 6),
                                          identical_params=same, ranks=size, epochs=a.epochs)),
              flush=True)
    hvd.shutdown()
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
