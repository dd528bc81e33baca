"""What the Fashion-MNIST examples share (ddp_fashion_mnist.py, horovod_fashion_mnist.py): the
IDX reader, the normalised data, the MLP and the parameter hash, so both train the same model
on the same data. Nothing in it knows of gcomp or of how the gradients are averaged.
"""
import gzip
import hashlib
import os
import struct

import numpy as np
import torch


def read_idx(path, count):
    with gzip.open(path, "rb") as f:
        magic, n = struct.unpack(">II", f.read(8))
        dims = struct.unpack(">%dI" % ((magic & 0xFF) - 1), f.read(4 * ((magic & 0xFF) - 1)))
        n = n if count is None else min(n, count)
        per = int(np.prod(dims)) if dims else 1
        return np.frombuffer(f.read(n * per), dtype=np.uint8).reshape((n,) + dims)


def load(data, split, count):
    pre = "train" if split == "train" else "t10k"
    x = read_idx(os.path.join(data, pre + "-images-idx3-ubyte.gz"), count)
    y = read_idx(os.path.join(data, pre + "-labels-idx1-ubyte.gz"), count)
    x = (x.reshape(len(x), -1).astype(np.float32) / 255.0 - 0.2860) / 0.3530
    return torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))


def make_model(seed, hidden):
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
    Returns (number of steps, an iterator of (step, this rank's image indices, lr))."""
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
