"""What a script that ends without closing its communicators leaves behind (run by ctest
python_exit_order under mpirun -np 2 with GCOMP_STATS_FILE=DIR/s_%r.json):

- rank 0 has a daemon thread inside a blocking allreduce that rank 1 never joins (timeout
  60 s) when both main threads return. The process must exit at once with status 0, the
  call left to the process's end (python/README.md, "Lifetime and threads"): the thread used
  to poll MPI after mpi4py's MPI_Finalize, and the process died of SIGSEGV.
- a Comm (terngrad) made before a GcompHookState (fp16): the stats file must hold the
  hook's (created last; gcomp.Comm's stats_file). The hook's exit handler used to close its
  Comm first, so the earlier Comm's stats overwrote it.
The runner checks the stats files and the exit status.
"""
import threading
import time

from mpi4py import MPI
import numpy as np

import gcomp
import gcomp.torch

world = MPI.COMM_WORLD
first = gcomp.Comm(world, codec="terngrad", min_bytes=0)
first.allreduce(np.ones(1000, np.float32))
stuck = gcomp.Comm(world, codec="bf16", min_bytes=0, timeout_ms=60000)
state = gcomp.torch.GcompHookState(codec="fp16", min_bytes=0)  # its Comm is created last
if world.Get_rank() == 0:
    threading.Thread(target=lambda: stuck.allreduce(np.ones(1000, np.float32)), daemon=True).start()
    time.sleep(1)  # the thread is inside the call now
print("rank %d returns" % world.Get_rank(), flush=True)
