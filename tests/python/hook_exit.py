"""A DDP run with gcomp's hook that ends without GcompHookState.close() must exit cleanly
(status 0 on every rank). The hook's worker thread used to be still inside a future's
set_result at interpreter shutdown in most runs, and the process aborted ("terminate called
without an active exception"); gcomp.torch's exit handler now stops the workers first.

Run: timeout 120 mpirun -np 2 /usr/bin/python3 tests/python/hook_exit.py
(PYTHONPATH=python, GCOMP_LIBRARY=build/libgcomp.so). Each run is one chance to fail:
ctest runs it several times.
"""
import os
import sys

from mpi4py import MPI
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import gcomp.torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_common import init_dist  # noqa: E402

init_dist(MPI.COMM_WORLD)
torch.manual_seed(0)
ddp = DDP(torch.nn.Linear(5, 3))
state = gcomp.torch.GcompHookState(codec="terngrad", start_iter=0)
ddp.register_comm_hook(state, gcomp.torch.hook)
for _ in range(3):
    ddp(torch.randn(4, 5)).sum().backward()
# no state.close(): what a short script does
