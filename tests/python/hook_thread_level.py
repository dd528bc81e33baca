"""The DDP hook under MPI below MPI_THREAD_MULTIPLE (mpi4py's thread_level "funneled"): no
worker thread calls MPI; each CPU bucket's allreduce runs on DDP's own thread, and the
replicas stay identical. (Before, the worker thread called MPI at any thread level.)

Run: timeout 120 mpirun -np 2 /usr/bin/python3 tests/python/hook_thread_level.py
(PYTHONPATH=python, GCOMP_LIBRARY=build/libgcomp.so).
"""
import os
import sys

import mpi4py

mpi4py.rc.thread_level = "funneled"
from mpi4py import MPI  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import gcomp.torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_common import init_dist, param_hash  # noqa: E402

WORLD = MPI.COMM_WORLD
assert MPI.Query_thread() < MPI.THREAD_MULTIPLE, MPI.Query_thread()
init_dist(WORLD)
torch.manual_seed(0)
ddp = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)))
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
state = gcomp.torch.GcompHookState(codec="terngrad", start_iter=1)
ddp.register_comm_hook(state, gcomp.torch.hook)
assert state._thread is None, "a worker thread was started below MPI_THREAD_MULTIPLE"
gen = torch.Generator().manual_seed(1 + WORLD.rank)
for step in range(5):
    opt.zero_grad()
    ddp(torch.randn(8, 32, generator=gen)).square().sum().backward()
    opt.step()
    hashes = WORLD.allgather(param_hash(ddp))
    assert len(set(hashes)) == 1, "step %d: the replicas differ" % step
stats = state.stats()
assert stats["calls"] > 0, stats
state.close()
dist.destroy_process_group()
if WORLD.rank == 0:
    print("hook_thread_level: funneled MPI, no worker thread, %d compressed calls, replicas identical: OK"
          % stats["calls"], flush=True)
