"""What the Fashion-MNIST examples share (ddp_fashion_mnist.py, horovod_fashion_mnist.py): the
IDX reader, the normalised data, the MLP and the parameter hash, so both train the same model
on the same data, and the checks of the arguments they share. Nothing in it knows of gcomp or
of how the gradients are averaged. torch is imported where it is used, so that a trainer can
refuse bad arguments before paying for torch's import (a second or two).
"""
import argparse
import gzip
import hashlib
import math
import os
import struct
import sys

import numpy as np

QUICK_TRAIN, QUICK_TEST = 12800, 2000  # images --quick uses


class ArgumentParser(argparse.ArgumentParser):
    """argparse's, where every rank exits 2 on a usage error but only Open MPI's rank 0 (or a
    process not started by mpirun) prints it, so that the message reads once."""

    def error(self, message):
        if os.environ.get("OMPI_COMM_WORLD_RANK", "0") == "0":
            self.print_usage(sys.stderr)
            print("%s: error: %s" % (self.prog, message), file=sys.stderr)
        sys.exit(2)


def read_idx(path, count):
    with gzip.open(path, "rb") as f:
        magic, n = struct.unpack(">II", f.read(8))
        dims = struct.unpack(">%dI" % ((magic & 0xFF) - 1), f.read(4 * ((magic & 0xFF) - 1)))
        n = n if count is None else min(n, count)
        per = int(np.prod(dims)) if dims else 1
        return np.frombuffer(f.read(n * per), dtype=np.uint8).reshape((n,) + dims)


def idx_count(path):
    """The number of items an IDX file (gzip) holds, from its header alone."""
    with gzip.open(path, "rb") as f:
        head = f.read(8)
    if len(head) < 8:
        raise OSError("not an IDX file (%d header bytes)" % len(head))
    return struct.unpack(">II", head)[1]


def check_args(p, a):
    """What both trainers refuse before they start (argparse's usage error: a message naming
    the flag, exit 2): --epochs not positive and finite, --lr not positive and finite,
    --batch below 1. The batch's split over the ranks is the caller's check (it needs the
    number of ranks), and so is the data: check_data, whose verdict may differ between ranks."""
    if not (math.isfinite(a.epochs) and a.epochs > 0):
        p.error("--epochs must be a positive finite number, got %r" % a.epochs)
    if not (math.isfinite(a.lr) and a.lr > 0):
        p.error("--lr must be a positive finite number, got %r" % a.lr)
    if a.batch < 1:
        p.error("--batch must be at least 1, got %d" % a.batch)


def check_data(a):
    """This rank's error about its --data (no readable training images, or fewer than one
    --batch: schedule() needs a full global batch per epoch), or None; sets a.train_count,
    the training images that will be read. Each rank reads its own file system, so the
    verdicts may differ: the caller combines them over the ranks (fail_together) before any
    collective that a rank which stopped would leave waiting."""
    path = os.path.join(a.data, "train-images-idx3-ubyte.gz")
    try:
        n = idx_count(path)
    except (OSError, EOFError) as e:
        return "--data %s: cannot read %s: %s" % (a.data, path, e)
    a.train_count = min(n, QUICK_TRAIN) if a.quick else n
    if a.batch > a.train_count:
        return "--batch %d is larger than the %d training images%s" % (
            a.batch, a.train_count, " of --quick" if a.quick else "")
    return None


def fail_together(p, error, any_failed, rank):
    """Ends every rank with argparse's usage status (2) when any rank found an error: the
    ranks that found one print it (rank 0's line reads like argparse's, the others name their
    rank), the others leave quietly."""
    if not any_failed:
        return
    if error:
        if rank == 0:
            p.print_usage(sys.stderr)
        print("%s: error: %s%s" % (p.prog, "rank %d: " % rank if rank else "", error), file=sys.stderr)
    sys.exit(2)


def check_ranks(p, a, size):
    """The global batch splits evenly over the ranks (each takes batch // size images)."""
    if a.batch % size:
        p.error("--batch %d must be a multiple of the %d ranks" % (a.batch, size))


def load(data, split, count):
    import torch
    pre = "train" if split == "train" else "t10k"
    x = read_idx(os.path.join(data, pre + "-images-idx3-ubyte.gz"), count)
    y = read_idx(os.path.join(data, pre + "-labels-idx1-ubyte.gz"), count)
    x = (x.reshape(len(x), -1).astype(np.float32) / 255.0 - 0.2860) / 0.3530
    return torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))


def make_model(seed, hidden):
    import torch
    torch.manual_seed(seed)
    layers, width = [], 784
    for h in hidden:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        width = h
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))


def param_hash(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def schedule(n, batch, epochs, rank, size, seed, peak_lr):
    """The steps both examples train: `epochs` passes over n images in global batches of
    `batch`, a fresh permutation each epoch (the same on every rank: seeded), each rank taking
    its slice of batch // size, and the learning rate decaying from peak_lr by a cosine.
    Returns (number of steps, an iterator of (step, this rank's image indices, lr)).
    check_args() and check_ranks() make sure 1 <= batch <= n and size divides batch."""
    import torch
    if not (1 <= batch <= n and batch % size == 0):
        raise ValueError("schedule: global batch %d for %d images over %d ranks" % (batch, n, size))
    local = batch // size
    steps_per_epoch = n // batch
    steps = max(1, int(round(epochs * steps_per_epoch)))

    def steps_iter():
        gen = torch.Generator().manual_seed(seed)
        perm = None
        for s in range(steps):
            if s % steps_per_epoch == 0:
                perm = torch.randperm(n, generator=gen)
            i = (s % steps_per_epoch) * batch + rank * local
            yield s, perm[i:i + local], 0.5 * peak_lr * (1 + np.cos(np.pi * s / steps))

    return steps, steps_iter()
