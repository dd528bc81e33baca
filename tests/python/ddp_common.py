"""Helpers shared by the Python tests under mpirun: torch.distributed from Open MPI's
environment, a slice of Fashion-MNIST, a parameter hash."""
import gzip
import hashlib
import os
import socket
import struct

import numpy as np

FMNIST = os.environ.get("FMNIST_DIR", "/usr/share/datasets/fashion-mnist")


def mpi_rank_size():
    return int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])


def init_dist(mpi_comm):
    """gloo process group over 127.0.0.1; rank 0 picks a free port and broadcasts it."""
    import torch.distributed as dist
    rank, size = mpi_rank_size()
    port = None
    if rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = mpi_comm.bcast(port, root=0)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=size)
    return rank, size


def _idx(path, count, header):
    with gzip.open(path, "rb") as f:
        head = f.read(header)
        n = struct.unpack(">I", head[4:8])[0]
        count = n if count is None else min(count, n)
        shape = struct.unpack(">II", head[8:16]) if header == 16 else ()
        per = int(np.prod(shape)) if shape else 1
        data = np.frombuffer(f.read(count * per), dtype=np.uint8)
    return data.reshape((count,) + tuple(shape))


def fashion_mnist(split="train", count=None):
    """(images float32 [n, 784] scaled to [0, 1] and standardised, labels int64 [n])."""
    pre = "train" if split == "train" else "t10k"
    x = _idx(os.path.join(FMNIST, pre + "-images-idx3-ubyte.gz"), count, 16)
    y = _idx(os.path.join(FMNIST, pre + "-labels-idx1-ubyte.gz"), count, 8)
    x = (x.reshape(len(x), -1).astype(np.float32) / 255.0 - 0.2860) / 0.3530
    return x, y.astype(np.int64)


def param_hash(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()
