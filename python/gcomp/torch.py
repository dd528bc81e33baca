"""gcomp.torch: a PyTorch DDP communication hook that runs gcomp's compressed allreduce.

    import gcomp.torch
    state = gcomp.torch.GcompHookState(codec="terngrad", start_iter=10)
    ddp_model.register_comm_hook(state, gcomp.torch.hook)

How it works
  - Host (CPU) gradient buckets go through gcomp over MPI: launch the trainer with mpirun.
    The state's gcomp communicator is created over an mpi4py communicator (default
    MPI.COMM_WORLD; importing mpi4py initialises MPI with MPI_THREAD_MULTIPLE). Creating the
    state is collective over that communicator.
  - CUDA buckets go through gcomp over NCCL (backend "nccl", the default when DDP's process
    group is an NCCL one): rank 0 gets NCCL's unique id and shares it over the process group
    (or over `comm`, an mpi4py communicator, when given); the communicator lives on the
    current CUDA device (or `device`). Creating the state is collective over that group.
  - The first `start_iter` iterations run a plain dist.all_reduce on DDP's process group (like
    PowerSGD's start_powerSGD_iter): DDP rebuilds its buckets after the first iteration, and
    compressing before then would spend error feedback on a layout that goes away.
  - Later CPU buckets are queued to ONE worker thread, which runs the gcomp calls in the order
    DDP issued them (the same on every rank: DDP launches buckets in index order) with the GIL
    released (ctypes), and completes each bucket's torch.futures.Future; so communication
    overlaps the rest of the backward pass. The result is the average over ranks (GCOMP_AVG).
    That thread calls MPI, so it needs MPI_THREAD_MULTIPLE (mpi4py's default); with a lower
    thread level the calls run on DDP's own thread when it hands over each bucket, without
    overlap. The gcomp communicator must hold DDP's processes in DDP's rank order (checked
    when the state is built: ValueError; built before init_process_group, at the hook's first
    call).
  - Later CUDA buckets are reduced on the caller's thread, on the caller's current stream (the
    stream the autograd engine computed the bucket's gradients on), with no worker thread:
    gcomp orders its device work on that stream after the gradients and before whatever is
    enqueued there next, as ProcessGroupNCCL's collectives do, so the hook never waits for the
    GPU itself (the library may block the host for its small agreements, and top-k reads its
    payload size back once). The hook returns a torch.futures.Future(devices=[the bucket's
    device]) completed right after the call: set_result records a CUDA event on that stream,
    and DDP's wait on the future makes its own stream wait for the event, so nothing reads the
    bucket before the reduction is done on the GPU. No worker thread, hence no question of
    which device or stream a thread has current, and no stream or event of the hook's own.
  - Error feedback: one residual per bucket and layout, key = (generation << 32) | bucket
    index. A bucket's layout is its element count, dtype and its parameters in buffer order
    (with their shapes); a layout not seen before at that index gets the next generation, so
    its residual starts from zero: that is what happens when DDP rebuilds its buckets, also
    into equal-shaped parameters in another order. A layout seen before keeps its key (and
    residual). Parameters are named by number, in the order the hook first meets them (DDP's
    initial buckets, the same on every rank), not by object identity, so a layout means the
    same thing in a resumed process. Bucket gradients of float64 (or other dtypes), and sparse
    ones (nn.Embedding(sparse=True)), are refused from the first iteration: gcomp reduces
    dense float32, float16 and bfloat16.
  - Bit-for-bit resume needs the resumed DDP to bucket gradients as the saved one did. A DDP
    that rebuilds its buckets after its first iteration (the default) runs that first resumed
    iteration with its initial layout: those buckets are compressed under the initial
    layout's own key, and the saved residuals take over from the second iteration, when the
    rebuilt layout is back. DDP(find_unused_parameters=True) never rebuilds (torch 1.13) and
    resumes bit for bit (tests/python/test_ddp_hook.py checks it).
  - Momentum correction (momentum > 0, as in Deep Gradient Compression): the hook keeps a
    velocity per bucket, u = momentum * u + gradient, on the bucket's device, and reduces u
    in place of the gradient; the optimizer then runs WITHOUT momentum (SGD(momentum=0)),
    since the velocity is already in what the hook returns. Plain and compressed iterations
    alike: averaging is linear, so during the plain ones this is exactly the optimizer's
    momentum (up to rounding). Why: with error feedback on the raw gradient, a sparsifier
    such as top-k 1 % keeps most coordinates in the residual for many steps while the
    optimizer's momentum only sees what was sent; accumulating the velocity locally lets
    the residual carry the momentum too (examples/ddp_fashion_mnist.py measures the
    difference). Velocities are kept per bucket layout, keyed like the residuals; when DDP
    rebuilds its buckets each parameter's velocity moves with it into its new bucket, and a
    resumed run's first (initial) layout takes each parameter's saved velocity. A resumed run
    continues bit for bit under the same conditions as the residuals (below). A step whose
    reduced result holds NaN or Inf (an overflow under a loss scaler, which then skips the
    step) leaves the bucket's velocity as it was, as the library leaves the residual: the
    new velocity is kept beside the old one until the bucket's result is known (so one
    velocity's worth of memory more per bucket), then taken only if the result is finite.
    The result is the same on every rank, so every rank decides the same with no collective
    of the hook's own; CUDA buckets decide with a torch.where on the device (no host
    synchronisation). Per bucket, as the residual: a bucket whose result was finite in a
    skipped step keeps its new velocity.
    Momentum factor masking is not done. What differs from SGD's own momentum: the
    optimizer's weight_decay (and nesterov, dampening) act outside the velocity, so run them
    as usual only if that is what you want (DGC adds the weight decay to the gradient before
    the velocity); and with find_unused_parameters=True a parameter unused in a step keeps
    decaying in the hook's velocity (u = m u + 0) while DDP leaves its gradient alone.
  - no_sync() and gradient accumulation: DDP just calls the hook less often; the iteration
    counter counts hook rounds (calls with bucket.is_last()), and residuals stay per bucket.
  - state_dict()/load_state_dict() (and pickling) carry the counters, the bucket layouts and
    the residuals (through the library's residual checkpoint), so a resumed run continues
    bit for bit. Not with error_feedback=False: the library keeps no checkpoint then, and
    TernGrad's stochastic rounding, keyed by each bucket's call count, starts its steps afresh
    (the same in expectation, other bits); fp16, bf16 and top-k resume bit for bit either way. load_state_dict refuses what state_dict() never writes (two layouts of a
    bucket sharing a generation, parameter numbers or offsets that are not the layout's,
    bools or floats where integers go, a field its version always holds missing, a NaN or
    Inf velocity). It is not collective and cannot see the other ranks: every rank must
    load its own rank's state dict of the same step (see the README).
  - A state dropped without close() is closed by its __del__ (the worker thread holds the
    queue only, not the state), as a gcomp.Comm is.
  - CUDA buckets with an MPI state (backend "mpi", e.g. DDP over gloo under mpirun) take the
    same caller-stream path; the library stages them through host memory. One state serves
    the buckets of one DDP model, all on one device: CPU buckets (worker thread) and CUDA
    buckets (caller's thread) are not ordered with each other.
  - A bucket the state's communicator cannot take (a CPU bucket with an NCCL state, a bucket
    on another GPU than its own, a meta tensor) is refused with ValueError naming both.
"""
import atexit
import math
import numbers
import os
import queue
import threading
import weakref

from numpy import bool_ as np_bool

import torch
import torch.distributed as dist

import gcomp
from gcomp import _args, _buffers

__all__ = ["GcompHookState", "hook"]

# 2: momentum and velocities (1, without them, loads as momentum 0); 3: layouts name their
# parameters (by number) and the velocities' placement is saved (2 loads: its layouts by
# shapes are taken for the first layout of each bucket that matches them); 4: the rank and
# world size that saved it (with error feedback off nothing else tells another rank's apart)
_STATE_VERSION = 4
# the fields each version added to what every state dict holds
_SINCE = (("momentum", 2), ("velocity", 2), ("where", 3), ("ids", 3), ("rank", 4), ("world_size", 4))


class _Pending:
    """A bucket's velocity step (momentum correction) until its reduced result is known.

    old is the velocity before the step, new = momentum * old + gradient, which the bucket
    carries into the reduction. A step whose reduced result holds NaN or Inf (a loss scaler
    skips it) must leave the velocity as it was, as the library leaves the residual:
    otherwise u = m u + g keeps the Inf for ever and every later step is non-finite too. The
    reduced result is the same on every rank (gcomp's, and the plain allreduce's), so every
    rank decides the same without a collective of its own. note() is called with the result
    where it is known (the worker thread, a torch future's callback, or the caller for CUDA
    buckets), fail() when the call failed; velocity() then says which one the bucket keeps.
    For a CUDA bucket finite is a device tensor and the choice a torch.where on the current
    stream: no host synchronisation.
    """
    __slots__ = ("old", "new", "finite")

    def __init__(self, old, new):
        self.old, self.new, self.finite = old, new, None

    def note(self, result):
        self.finite = torch.isfinite(result).all()

    def fail(self):
        self.finite = False

    def velocity(self):
        f = self.finite
        if isinstance(f, torch.Tensor):
            if f.device.type != "cpu":
                return torch.where(f, self.new, self.old)
            f = bool(f)
        return self.new if f else self.old


class GcompHookState:
    """State of the gcomp DDP communication hook.

    codec: gcomp codec spec ("terngrad", "topk:ratio=0.01", "fp16", ... "+zstd").
    start_iter: iterations of plain allreduce before compressing (default 10).
    comm: mpi4py communicator the gcomp communicator is built over (backend "mpi": default
        MPI.COMM_WORLD; backend "nccl": where the unique id is shared, default the process
        group); it must hold the same processes, in the same rank order, as DDP's group.
    process_group: torch process group for the plain-allreduce iterations (default: the
        default group).
    min_bytes, error_feedback, seed, timeout_ms: as gcomp.Comm (None: GCOMP_* environment,
        then library defaults). min_bytes defaults to 0 here so every bucket is compressed.
        timeout_ms=None without GCOMP_TIMEOUT_MS in the environment: the process group's own
        timeout (init_process_group(timeout=...); torch's default is 30 min for gloo), so a
        rank that evaluates or checkpoints for longer than gcomp's 300 s default while the
        others wait in backward() fails the job when DDP itself would, not sooner (gcomp's
        300 s where torch does not say, e.g. a process group of another library).
    backend: "mpi" (CPU buckets; CUDA ones staged through host memory) or "nccl" (CUDA
        buckets); None: "nccl" when process_group (default: the default group) has NCCL
        among its backends, else "mpi".
    device: the CUDA device of an NCCL state (None: the current one), as gcomp.Comm.
    momentum: 0 (default) or a factor in (0, 1): momentum correction, see the module's
        docstring; the optimizer must then run with momentum=0.
    """

    def __init__(self, codec="terngrad", start_iter=10, comm=None, process_group=None,
                 min_bytes=0, error_feedback=None, seed=None, timeout_ms=None, backend=None,
                 device=None, momentum=0.0):
        self._thread = None
        self._closed = True  # until the communicator exists
        try:
            start_iter = _args.int_arg("start_iter", start_iter, 0, _args.INT64_MAX)
            momentum = _momentum_arg("momentum", momentum)
            _group_arg(process_group)
        except (TypeError, ValueError) as exc:
            # the other ranks may be in the communicator's creation already: fail it there too
            # (an NCCL state's creation shares NCCL's unique id first: join that share)
            if not _is_group(process_group):
                process_group = None  # the default group, which the other ranks most likely use
            b = backend if backend is not None else _default_backend(process_group)
            if isinstance(b, str) and b.lower() == "nccl":
                gcomp._cuda.join_refused_share(exc, group=process_group if comm is None else None,
                                               mpi_comm=gcomp._share_comm(comm), device=device,
                                               timeout_s=gcomp._share_timeout_s(timeout_ms))
            else:
                gcomp._join_refused_creation(comm)
            raise
        if backend is None:
            backend = _default_backend(process_group)
        wait_ms = timeout_ms  # the argument itself is what a pickled state keeps
        if wait_ms is None and not os.environ.get("GCOMP_TIMEOUT_MS"):  # empty: unset, as in C
            wait_ms = _group_timeout_ms(process_group)
        self.start_iter = start_iter
        self.process_group = process_group
        self.iter = 0
        self.momentum = momentum
        self._layout = {}  # bucket index -> {layout signature: generation}
        # Parameters are named by number, in the order the hook first meets them: DDP's
        # initial buckets, the same on every rank and in every process of a resumed run.
        self._numbers = {}  # id(parameter) -> (parameter, its number)
        self._next_number = 0
        self._velocity = {}  # bucket key -> velocity tensor (momentum > 0)
        self._where = {}  # parameter number -> (bucket key, offset) of its velocity
        self._shapes = {}  # parameter number -> its shape where its velocity was placed
        self._ids = {}  # bucket key -> numbers of the parameters its velocity holds, in order
        self._pending = {}  # bucket key -> _Pending: its step's velocity, result not seen yet
        self._spare = {}  # bucket key -> a CPU velocity buffer for its next step (_settle)
        if backend == "nccl":
            self.comm = gcomp.Comm(comm, codec=codec, min_bytes=min_bytes,
                                   error_feedback=error_feedback, seed=seed,
                                   timeout_ms=wait_ms, backend="nccl",
                                   group=process_group if comm is None else None, device=device)
        else:
            self.comm = gcomp.Comm(comm, codec=codec, min_bytes=min_bytes,
                                   error_feedback=error_feedback, seed=seed,
                                   timeout_ms=wait_ms, backend=backend, device=device)
        self._config = dict(codec=codec, start_iter=start_iter, min_bytes=min_bytes,
                            error_feedback=error_feedback, seed=seed, timeout_ms=timeout_ms,
                            backend=self.comm.backend, momentum=momentum,
                            device=None if self.comm.device is None else str(self.comm.device))
        self._ef = self.comm.config()["error_feedback"]
        try:
            _check_same_group(self.comm, process_group,
                              dict(start_iter=start_iter, momentum=momentum, error_feedback=self._ef))
        except Exception:
            self.comm.close()
            raise
        # Built before init_process_group: DDP's ranks are not known yet. The hook's first
        # call checks them (every rank's first call is its first bucket, so all take part).
        self._order_unchecked = not _ddp_initialized()
        self._closed = False
        _live_states.add(self)
        if self.comm.device is None and _mpi_thread_multiple():  # CPU buckets (MPI): the worker
            self._queue = queue.Queue()
            # the worker gets the queue only, never the state: a thread's target holds its
            # arguments until it ends, and a bound method there would keep a state dropped
            # without close() (its communicator, MPI duplicate and thread) alive until exit
            self._thread = threading.Thread(target=_work, args=(self._queue,),
                                            name="gcomp-ddp-hook", daemon=True)
            self._thread.start()

    # ---- the worker ------------------------------------------------------------------------

    def _open(self):
        # every public method says which object was closed (not the gcomp.Comm inside it)
        if self._closed:
            raise ValueError("GcompHookState used after close()")

    def _submit(self, fn):
        self._open()
        fut = torch.futures.Future()
        if self._thread is None:  # no worker (MPI below MPI_THREAD_MULTIPLE): on this thread
            try:
                fut.set_result(fn())
            except Exception as exc:  # noqa: B902 - as the worker hands it on
                fut.set_exception(exc)
            return fut
        self._queue.put((fn, fut))
        return fut

    def _call(self, fn):
        """Run fn after every allreduce issued so far and return its value: on the worker
        thread for CPU buckets; at once without a worker (CUDA buckets, whose calls ran on the
        caller's thread, and gcomp.Comm waits for the device before stats and residuals; MPI
        below MPI_THREAD_MULTIPLE, where every call ran on DDP's thread)."""
        if self._thread is None:
            self._open()
            return fn()
        return self._submit(fn).wait()

    # ---- bucket bookkeeping ----------------------------------------------------------------

    def _param_numbers(self, params):
        """The numbers of these parameters, a new one for each parameter not met before."""
        out = []
        for p in params:
            known = self._numbers.get(id(p))
            if known is None or known[0] is not p:
                known = self._numbers[id(p)] = (p, self._next_number)
                self._next_number += 1
            out.append(known[1])
        return tuple(out)

    def _key(self, bucket, tensor):
        """The bucket's gcomp key: (generation << 32) | index, one generation per layout of
        the bucket index, a layout being which parameters it holds in which order (with its
        size and dtype). Equal-shaped parameters in another order are another layout: its
        residual must not be added to the parameters that now sit at those offsets."""
        idx = bucket.index()
        params = bucket.parameters()
        shapes = tuple(tuple(p.shape) for p in params)
        sig = (tensor.numel(), str(tensor.dtype), shapes, self._param_numbers(params))
        gens = self._layout.setdefault(idx, {})
        if sig not in gens:
            if sig[:3] in gens:  # a version-2 state dict's layout (shapes only): this one's
                gens[sig] = gens.pop(sig[:3])
            else:
                gens[sig] = max(gens.values(), default=-1) + 1
        return (gens[sig] << 32) | idx

    def _with_momentum(self, key, bucket, grad):
        """momentum * u + grad for the bucket's velocity u, written into grad (the bucket's
        buffer, which is what gets reduced); on grad's device and current stream. u itself
        stays the bucket's velocity until the reduced result is known: the returned
        _Pending takes the new one then if the result is finite, and keeps u if not (see
        _Pending)."""
        self._settle()
        params = bucket.parameters()
        ids = self._param_numbers(params)
        u = self._velocity.get(key)
        # A key names its parameters, but a version-2 state dict's velocity has none
        # recorded (taken as it is), and a layout's velocity may have moved on: then the
        # velocity is gathered parameter by parameter.
        if u is None or u.shape != grad.shape or u.dtype != grad.dtype or \
                self._ids.get(key, ids) != ids:
            u = self._velocity_of_layout(params, ids, grad)
        elif u.device != grad.device:  # loaded from a state dict: on the CPU
            u = u.to(grad.device)
        new = self._spare.pop(key, None)  # the velocity a CPU bucket's last step did not keep
        if new is None or new.shape != u.shape or new.dtype != u.dtype or new.device != u.device:
            new = torch.empty_like(u)
        torch.mul(u, self.momentum, out=new).add_(grad)  # the bits of u.mul_(m).add_(grad)
        grad.copy_(new)
        self._velocity[key] = u
        if self._ids.get(key) != ids:
            self._place(key, params, ids)
        pending = self._pending[key] = _Pending(u, new)
        return pending

    def _settle(self):
        """Give each bucket whose reduced result is known its velocity of that step (on the
        caller's thread: the worker and torch's callbacks only mark the _Pending). One whose
        result is not known yet (its call still queued) is left for the next time."""
        for key, p in list(self._pending.items()):
            if p.finite is None:
                continue
            del self._pending[key]
            if self._velocity.get(key) is not p.old:  # replaced since (load_state_dict)
                continue
            kept = self._velocity[key] = p.velocity()
            # the other one is the next step's buffer: no allocation (and page faults) of a
            # bucket-sized tensor per step. CPU only: a CUDA tensor may still be read by work
            # enqueued on a stream the next step's may not be ordered after.
            if kept.device.type == "cpu":
                self._spare[key] = p.new if kept is p.old else p.old

    def _velocity_of_layout(self, params, ids, grad):
        """The velocity of a layout without one: each parameter's slice comes from where that
        parameter's velocity was (DDP's rebuild moves parameters between buckets; their
        momentum must follow them), zero for a parameter never seen."""
        u = torch.zeros_like(grad)
        off = 0
        for p, num in zip(params, ids):
            n = p.numel()
            was = self._where.get(num)
            had = self._shapes.get(num)
            if was is not None and had is not None and had != tuple(p.shape):
                # another model's velocity (a state dict loaded into the wrong model): it
                # would move this parameter by another one's momentum
                raise ValueError("gcomp.torch.hook: parameter %d (numbered in the order the hook "
                                 "meets them) has shape %s, but its momentum velocity is for "
                                 "shape %s: the loaded state dict is another model's"
                                 % (num, tuple(p.shape), had))
            old = self._velocity.get(was[0]) if was is not None else None
            if old is not None and old.dtype == u.dtype and was[1] + n <= old.numel():
                u[off:off + n].copy_(old[was[1]:was[1] + n].to(u.device))
            off += n
        return u

    def _place(self, key, params, ids):
        """Record that these parameters (ids: their numbers, in bucket order) now have their
        velocity in key's, and drop the velocities of layouts whose parameters have all moved
        on. Velocities of a version-2 state dict (no parameters recorded) are kept until
        used."""
        off = 0
        for p, num in zip(params, ids):
            self._where[num] = (key, off)
            self._shapes[num] = tuple(p.shape)
            off += p.numel()
        self._ids[key] = ids
        live = {w[0] for w in self._where.values()}
        self._velocity = {k: v for k, v in self._velocity.items()
                          if k in live or k not in self._ids}
        self._ids = {k: v for k, v in self._ids.items() if k in live}
        self._spare = {k: v for k, v in self._spare.items() if k in self._velocity}

    # ---- public ----------------------------------------------------------------------------

    def stats(self):
        """gcomp's counters for the compressed iterations (a dict, see gcomp.Comm.stats)."""
        self._open()
        return self._call(self.comm.stats)

    def stats_reset(self):
        self._open()
        self._call(self.comm.stats_reset)

    def state_dict(self):
        """Everything a resumed run needs, residuals included. Call between iterations; it
        waits for queued allreduces first. Each rank saves its own (residuals differ)."""
        self._open()
        # None with error feedback off: there is nothing to carry, and the library refuses
        # to load residuals into such a communicator. Either way the queued allreduces are
        # done before the velocities are read, so their steps are settled.
        residuals = self._call(self.comm.save_residuals) if self._ef else self._call(_nothing)
        self._settle()
        return {
            "version": _STATE_VERSION,
            "codec": self.comm.codec,
            "start_iter": self.start_iter,
            "iter": self.iter,
            "layout": {i: dict(gens) for i, gens in self._layout.items()},
            "momentum": self.momentum,
            "velocity": {k: u.detach().to("cpu", copy=True) for k, u in self._velocity.items()},
            "where": dict(self._where),  # parameter number -> (key, offset) of its velocity
            "ids": dict(self._ids),  # key -> the numbers of its velocity's parameters
            "residuals": residuals,
            "rank": self.comm.rank,
            "world_size": self.comm.size,
        }

    def load_state_dict(self, sd):
        """Take a state_dict() of the same codec and error-feedback setting. All or nothing:
        every field is checked, each on its own and against the others as state_dict()
        writes them, before anything is replaced, and the residuals (the only part the
        library has to accept) are loaded before the Python fields, which cannot fail; a
        refused state dict (ValueError, TypeError, GcompError) leaves this state as it was.
        Not collective: every rank loads its own rank's state dict of the same step (see
        the README: ranks at different iterations are not detected)."""
        self._open()
        version, start_iter, it, layout, residuals = self._check_state_dict(sd)
        velocity = self._check_velocity(sd, version, layout)
        where, ids = self._check_placement(sd, version, layout, velocity)
        if self._ef:
            comm = self.comm
            self._call(lambda: comm.load_residuals(residuals))  # all or nothing in C
        self.start_iter, self.iter, self._layout = start_iter, it, layout
        self._velocity, self._where, self._ids = velocity, where, ids
        self._shapes = _layout_shapes(layout)
        self._pending = {}  # steps in flight (none between iterations) belong to the old state
        self._spare = {}

    def _check_state_dict(self, sd):
        """The version, counters, layouts and residuals of a state dict, checked."""
        if not isinstance(sd, dict):
            raise TypeError("%s: expected a dict from state_dict(), got %s"
                            % (_LOAD, type(sd).__name__))
        missing = [k for k in ("version", "codec", "start_iter", "iter", "layout", "residuals")
                   if k not in sd]
        if missing:
            raise ValueError("%s: the state dict lacks %s" % (_LOAD, ", ".join(missing)))
        # an int, as state_dict() writes it: True or 3.0 is no version
        version = _args.int_arg(_LOAD + ": state version", sd["version"], 1, _STATE_VERSION)
        # what each version's state_dict() always holds: a missing one is not a default
        missing = [k for k, since in _SINCE if version >= since and k not in sd]
        if missing:
            raise ValueError("%s: the state dict lacks %s, which every version-%d state dict "
                             "holds" % (_LOAD, ", ".join(missing), version))
        # as torch's load_state_dict (strict): a field no state_dict() of its version writes
        # is a mistake (a typo, another object's state), not something to skip
        known = {"version", "codec", "start_iter", "iter", "layout", "residuals"}
        known |= {k for k, since in _SINCE if version >= since}
        unknown = sorted(repr(k) for k in sd if k not in known)
        if unknown:
            raise ValueError("%s: the state dict has %s, which no version-%d state dict holds"
                             % (_LOAD, ", ".join(unknown), version))
        if version >= 4:
            # the velocities are this rank's own (u = m u + its local gradient), and so are
            # the residuals; checked here too, as error feedback off has no residuals to check
            rank = _args.int_arg(_LOAD + ": rank", sd["rank"], 0, _args.INT64_MAX)
            size = _args.int_arg(_LOAD + ": world_size", sd["world_size"], 1, _args.INT64_MAX)
            if (rank, size) != (self.comm.rank, self.comm.size):
                raise ValueError("%s: saved by rank %d of %d, this is rank %d of %d: every rank "
                                 "loads its own rank's state dict, at the same world size"
                                 % (_LOAD, rank, size, self.comm.rank, self.comm.size))
        if sd["codec"] != self.comm.codec:
            raise ValueError("%s: saved with codec %r, this state uses %r"
                             % (_LOAD, sd["codec"], self.comm.codec))
        residuals = sd["residuals"]
        if (residuals is None) == self._ef:
            raise ValueError("%s: saved with error feedback %s, this state has it %s"
                             % (_LOAD, "off" if residuals is None else "on",
                                "on" if self._ef else "off"))
        if residuals is not None and not isinstance(residuals, (bytes, bytearray)):
            raise TypeError("%s: residuals must be bytes (Comm.save_residuals), got %s"
                            % (_LOAD, type(residuals).__name__))
        start_iter = _args.int_arg(_LOAD + ": start_iter", sd["start_iter"], 0, _args.INT64_MAX)
        it = _args.int_arg(_LOAD + ": iter", sd["iter"], 0, _args.INT64_MAX)
        return version, start_iter, it, self._check_layout(sd["layout"], version), residuals

    def _check_velocity(self, sd, version, layout):
        """The saved velocities ({bucket key: tensor}), checked against this state's
        momentum and against the bucket layouts of the same state dict (each velocity a dense
        1-D tensor of its layout's element count and dtype, finite: state_dict() never
        holds a NaN or Inf, since a non-finite step leaves the velocity as it was, and one
        would make every later step non-finite); a version-1 state dict has none and means
        momentum 0. Returns copies."""
        if version < 2:
            if self.momentum:
                raise ValueError("%s: a version-1 state dict was saved without momentum "
                                 "correction (it loads into a state of momentum 0), this state "
                                 "uses %r" % (_LOAD, self.momentum))
            return {}
        momentum = _momentum_arg(_LOAD + ": momentum", sd["momentum"])
        velocity = sd["velocity"]
        if momentum != self.momentum:
            raise ValueError("%s: saved with momentum %r, this state uses %r"
                             % (_LOAD, momentum, self.momentum))
        if not isinstance(velocity, dict):
            raise TypeError("%s: velocity must be a dict, got %s" % (_LOAD, type(velocity).__name__))
        if velocity and not self.momentum:
            raise ValueError("%s: velocities saved by a state without momentum" % _LOAD)
        out = {}
        for k, u in velocity.items():
            key = _args.int_arg(_LOAD + ": velocity key", k, 0, _args.KEY_NONE - 1)
            if not isinstance(u, torch.Tensor):
                raise TypeError("%s: velocity of key %d must be a tensor, got %s"
                                % (_LOAD, key, type(u).__name__))
            if not u.is_floating_point() or u.layout != torch.strided or u.device.type == "meta":
                raise TypeError("%s: velocity of key %d must be a dense floating-point tensor with "
                                "data, got %s %s on %s" % (_LOAD, key, u.layout, u.dtype, u.device))
            sig = _layout_of(layout, key)
            if sig is None or u.dim() != 1 or u.numel() != sig[0] or str(u.dtype) != sig[1]:
                raise ValueError("%s: velocity of key %d (%s, %s) does not match a bucket layout "
                                 "of the state dict (%s)" % (_LOAD, key, tuple(u.shape), u.dtype,
                                                             "none" if sig is None else sig[:2]))
            if not bool(torch.isfinite(u).all()):
                raise ValueError("%s: velocity of key %d holds NaN or Inf; state_dict() never "
                                 "saves one (a step whose result is non-finite leaves the "
                                 "velocity as it was), and every later step would be "
                                 "non-finite" % (_LOAD, key))
            out[key] = u.detach().clone(memory_format=torch.contiguous_format)
        return out

    @staticmethod
    def _check_placement(sd, version, layout, velocity):
        """Where each parameter's velocity is ({number: (key, offset)}) and which parameters
        each velocity holds ({key: numbers}), checked against the saved layouts and
        velocities as state_dict() writes them: a key's numbers are its layout's, in its
        order; a parameter's offset is where its layout puts it; a velocity names its
        parameters exactly when some parameter's velocity is in it, and every velocity of a
        layout that names its parameters does. Empty before version 3, whose velocities are
        then taken as they are."""
        if version < 3:
            return {}, {}
        where, ids = sd["where"], sd["ids"]
        if not isinstance(where, dict) or not isinstance(ids, dict):
            raise TypeError("%s: where and ids must be dicts, got %s and %s"
                            % (_LOAD, type(where).__name__, type(ids).__name__))
        out_ids, offsets = {}, {}
        for k, nums in ids.items():
            key = _args.int_arg(_LOAD + ": ids key", k, 0, _args.KEY_NONE - 1)
            sig = _layout_of(layout, key)
            if key not in velocity or sig is None or len(sig) != 4:
                raise ValueError("%s: ids of key %d, which has no saved velocity of a layout "
                                 "naming its parameters" % (_LOAD, key))
            if not (isinstance(nums, tuple) and all(_is_int(n) for n in nums)) or nums != sig[3]:
                raise ValueError("%s: ids of key %d must be the numbers of its layout's "
                                 "parameters, %r, got %r" % (_LOAD, key, sig[3], nums))
            sizes = [math.prod(shape) for shape in sig[2]]
            if sum(sizes) > velocity[key].numel():
                raise ValueError("%s: the parameters of key %d hold %d elements, its velocity %d"
                                 % (_LOAD, key, sum(sizes), velocity[key].numel()))
            out_ids[key] = nums
            offsets[key] = {n: sum(sizes[:i]) for i, n in enumerate(nums)}
        out_where = {}
        for n, place in where.items():
            if not (_is_int(n) and isinstance(place, tuple) and len(place) == 2
                    and all(_is_int(v) for v in place)):
                raise TypeError("%s: where maps a parameter number to (key, offset), integers; "
                                "got %r: %r" % (_LOAD, n, place))
            key, off = place
            if n < 0:
                raise ValueError("%s: where of parameter %d: numbers are not negative" % (_LOAD, n))
            if key not in out_ids or n not in offsets[key]:
                raise ValueError("%s: where puts parameter %d in the velocity of key %d, which "
                                 "does not hold it (ids)" % (_LOAD, n, key))
            if off != offsets[key][n]:
                raise ValueError("%s: where puts parameter %d at offset %d of key %d's velocity; "
                                 "its layout has it at %d" % (_LOAD, n, off, key, offsets[key][n]))
            out_where[n] = (key, off)
        # every parameter a velocity names has a place (state_dict() never drops one: a
        # parameter that moves is placed anew); without it its momentum would be zero
        lost = sorted({n for nums in out_ids.values() for n in nums} - set(out_where))
        if lost:
            raise ValueError("%s: ids name parameter(s) %s, which where does not place"
                             % (_LOAD, ", ".join(map(str, lost))))
        unused = sorted(set(out_ids) - {key for key, _ in out_where.values()})
        if unused:
            raise ValueError("%s: ids of key(s) %s, whose velocity holds no parameter's (where)"
                             % (_LOAD, ", ".join(map(str, unused))))
        unnamed = sorted(k for k in velocity if k not in out_ids and len(_layout_of(layout, k)) == 4)
        if unnamed:
            raise ValueError("%s: velocity of key(s) %s, of a layout naming its parameters, "
                             "without its ids" % (_LOAD, ", ".join(map(str, unnamed))))
        return out_where, out_ids

    @staticmethod
    def _check_layout(layout, version):
        """{bucket index: {layout signature: generation}} with both numbers fitting the key
        (generation << 32) | index below GCOMP_KEY_NONE, each signature as _key() makes
        them (a version 1 or 2 state dict: by shapes only), and one generation per layout
        of a bucket: two layouts sharing one would share a key, and a rebuilt bucket would
        take the other layout's residual and velocity. Returns a copy."""
        if not isinstance(layout, dict):
            raise TypeError("%s: layout must be a dict, got %s" % (_LOAD, type(layout).__name__))
        out = {}
        for i, gens in layout.items():
            idx = _args.int_arg(_LOAD + ": layout bucket index", i, 0, (1 << 32) - 1)
            if not isinstance(gens, dict):
                raise TypeError("%s: layout of bucket %d must be a dict, got %s"
                                % (_LOAD, idx, type(gens).__name__))
            for sig in gens:
                _check_signature(sig, idx, version)
            out[idx] = {sig: _args.int_arg(_LOAD + ": layout generation", g, 0, (1 << 32) - 2)
                        for sig, g in gens.items()}
            seen = set()
            for g in out[idx].values():
                if g in seen:
                    raise ValueError("%s: bucket %d has several layouts of generation %d; each "
                                     "layout of a bucket has its own (the key of its residual "
                                     "and velocity)" % (_LOAD, idx, g))
                seen.add(g)
        return out

    def __getstate__(self):
        # Pickling is a checkpoint; unpickling re-creates the communicator over
        # MPI.COMM_WORLD and the default process group (collective), as PowerSGDState does.
        return {"config": self._config, "state": self.state_dict()}

    def __setstate__(self, d):
        self.__init__(**d["config"])
        self.load_state_dict(d["state"])

    def close(self):
        """Stop the worker and free the communicator (after queued work has finished)."""
        self._stop(wait_s=None)

    def _stop(self, wait_s, close_comm=True):
        self._closed = True
        if self._thread is not None and self._thread is threading.current_thread():
            # on the worker itself (__del__ when a call it ran dropped the last reference, or
            # close() from a future's callback): it cannot wait for itself. The calls queued
            # so far run first, then the communicator is freed and the worker ends.
            self._queue.put((self.comm.close, None))
            self._queue.put(None)
            self._thread = None
            _live_states.discard(self)
            return
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(wait_s)
            if self._thread.is_alive():
                return  # still inside a call (exit handler only): leave its communicator alone
            self._thread = None
        if close_comm and getattr(self, "comm", None) is not None:
            self.comm.close()
        _live_states.discard(self)

    def __del__(self):
        try:
            if not getattr(self, "_closed", True):
                self.close()
        except Exception:
            pass


_live_states = weakref.WeakSet()


def _work(q):
    """The worker thread of a GcompHookState: runs (fn, future) items in queue order until
    None. It is given the queue alone (see GcompHookState.__init__). A future of None: an
    item nobody waits for (the communicator's close() when the state is dropped)."""
    while True:
        item = q.get()
        if item is None:
            return
        fn, fut = item
        item = None  # hold nothing of a finished call while waiting for the next
        try:
            result = fn()
        except Exception as exc:  # noqa: B902 - handed to the waiting side
            if fut is not None:
                fut.set_exception(exc)
        except BaseException as exc:  # noqa: B902 - SystemExit...: torch's futures take
            if fut is not None:  # Exceptions only; never leave one open
                fut.set_exception(RuntimeError(repr(exc)))
        else:
            if fut is not None:
                fut.set_result(result)
        fn = fut = result = None


@atexit.register
def _close_states():
    # A state left open at exit still has its worker thread, which may be inside a future's
    # set_result (torch's C++ callback, the GIL released) when the interpreter finalises:
    # Python then ends the thread through a C++ frame and the process aborts. Stop the
    # workers first (registered after gcomp's own exit handler, so this runs before it). A
    # worker inside a call that does not finish in a few seconds is left to the process's end.
    # The communicators are left to gcomp's handler, which closes every Comm in creation
    # order (a GCOMP_STATS_FILE they share then holds the last-created one's stats).
    for s in list(_live_states):
        s._stop(wait_s=10.0, close_comm=False)


def _layout_shapes(layout):
    """Parameter number -> shape, from the bucket layouts of a state dict (a version-3 layout
    names its parameters; older ones give shapes only, and nothing is checked for them)."""
    shapes = {}
    for gens in layout.values():
        for sig in gens:
            if len(sig) == 4:
                shapes.update(zip(sig[3], sig[2]))
    return shapes


def _is_group(process_group):
    return process_group is None or (dist.is_available() and
                                     isinstance(process_group, dist.ProcessGroup))


def _group_arg(process_group):
    """process_group is None or a torch process group (torch's own functions assert)."""
    if not _is_group(process_group):
        raise TypeError("GcompHookState: process_group must be a torch.distributed process group "
                        "or None (the default group), got %s" % type(process_group).__name__)


def _default_backend(process_group):
    # "nccl", or torch 2's "cpu:gloo,cuda:nccl" of init_process_group() without a backend
    if dist.is_available() and dist.is_initialized() and \
            "nccl" in str(dist.get_backend(process_group)).lower():
        return "nccl"
    return "mpi"


def _group_timeout_ms(process_group):
    """The timeout of process_group (None: the default group) in ms, or None where this torch
    does not say (torch 1.13: the group's options; torch 2: its backends' options; under
    TORCH_DISTRIBUTED_DEBUG=DETAIL either is a wrapper around the one that knows). None
    leaves the deadline to gcomp's default (300 s)."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    pg = process_group if process_group is not None else dist.distributed_c10d._get_default_group()

    def timeout_of(group):
        group = getattr(group, "wrapped_pg", group)
        return group.options._timeout

    found = []
    try:
        found.append(timeout_of(pg))
    except (AttributeError, RuntimeError):
        pass
    for dev in ("cpu", "cuda"):
        try:
            found.append(timeout_of(pg._get_backend(torch.device(dev))))
        except (AttributeError, RuntimeError, ValueError):
            pass
    ms = [int(t.total_seconds() * 1000) for t in found if hasattr(t, "total_seconds")]
    ms = [m for m in ms if m > 0]
    return max(ms) if ms else None


_LOAD = "GcompHookState.load_state_dict"


def _nothing():
    return None


def _is_int(v):
    # an integer as state_dict() writes one: not a bool, not a float
    return isinstance(v, int) and not isinstance(v, bool)


def _layout_of(layout, key):
    """The signature of key's layout in a checked layout dict, or None."""
    return next((s for s, g in layout.get(key & 0xffffffff, {}).items() if g == key >> 32), None)


def _check_signature(sig, idx, version):
    """A layout signature as GcompHookState._key() makes it: (element count, dtype name,
    parameter shapes, parameter numbers); version 1 and 2 state dicts have the first three
    only, and so may a version 3 one for a layout loaded from them and not met since."""
    def count(v):
        return _is_int(v) and v >= 0

    ok = isinstance(sig, tuple) and len(sig) in ((3, 4) if version >= 3 else (3,))
    ok = ok and count(sig[0]) and sig[1] in _buffers.TORCH_DTYPES and isinstance(sig[2], tuple) \
        and all(isinstance(sh, tuple) and all(count(d) for d in sh) for sh in sig[2])
    if ok and len(sig) == 4:
        nums = sig[3]
        ok = isinstance(nums, tuple) and len(nums) == len(sig[2]) and \
            all(count(n) for n in nums) and len(set(nums)) == len(nums)
    if not ok:
        raise ValueError("%s: layout %r of bucket %d is not one state_dict() writes (version %d: "
                         "(count, dtype, shapes%s))" % (_LOAD, sig, idx, version,
                                                        ", parameter numbers" if version >= 3 else ""))
    # a DDP bucket is its parameters' elements, unpadded: a layout of another count matches
    # no bucket, and its residual and velocity would be dropped without a word
    if sig[0] != sum(math.prod(shape) for shape in sig[2]):
        raise ValueError("%s: layout %r of bucket %d counts %d elements, its parameter shapes %d"
                         % (_LOAD, sig, idx, sig[0], sum(math.prod(shape) for shape in sig[2])))


def _momentum_arg(name, v):
    # any real number (numpy's included), not a bool
    if isinstance(v, (bool, np_bool)) or not isinstance(v, numbers.Real):
        raise TypeError("%s must be a number in [0, 1), got %s" % (name, type(v).__name__))
    try:
        v = float(v)
    except OverflowError:
        raise ValueError("%s must be in [0, 1), got a number too large for a float" % name) from None
    if not 0.0 <= v < 1.0:  # also refuses NaN
        raise ValueError("%s must be in [0, 1), got %r" % (name, v))
    return v + 0.0  # -0.0 -> 0.0


def _plain_allreduce(state, tensor, pending=None):
    """dist.all_reduce over the state's process group, averaged. pending (momentum): marked
    from the result in the future's callback (torch runs it on the result's streams for CUDA
    buckets), and settled on the caller's thread at the next bucket (_settle)."""
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    n = dist.get_world_size(group)
    fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()
    if pending is None:
        return fut.then(lambda f: f.value()[0].div_(n))

    def done(f):
        try:
            result = f.value()[0].div_(n)
        except BaseException:
            pending.fail()
            raise
        pending.note(result)
        return result

    return fut.then(done)


def _mpi_thread_multiple():
    """Whether MPI may be called from the hook's worker thread: only under
    MPI_THREAD_MULTIPLE (mpi4py's default). Below it the hook runs each CPU bucket's allreduce
    on DDP's own thread instead, without overlap (what gcomp's C library does: gcomp.h)."""
    from mpi4py import MPI
    return MPI.Query_thread() >= MPI.THREAD_MULTIPLE


def _check_same_group(comm, process_group, settings):
    """The gcomp communicator comm must hold DDP's processes in DDP's rank order: each
    averages the buckets over its own processes, so a mismatch (e.g. ranks started by
    torch.multiprocessing, each its own one-rank MPI job) would let the replicas drift apart
    without an error once compression starts. The ranks must also agree on the hook's own
    settings (a dict: start_iter, momentum, error feedback), or some would run gcomp while
    others run a plain allreduce, until a timeout that names neither. Every rank of comm gets
    the same verdict (an allgather over the mpi4py communicator comm was built over; for an
    NCCL communicator built from the process group itself, over that group), so no rank goes
    on to wait for others that raised."""
    ddp = _ddp_initialized()
    size, rank = (dist.get_world_size(process_group), dist.get_rank(process_group)) if ddp else (0, 0)
    mine = (size, rank, sorted(settings.items()))
    if comm._mpi_comm is not None:
        seen = comm._mpi_comm.allgather(mine)  # in the communicator's rank order
    else:  # the process group's own NCCL communicator: its ranks are the group's
        with torch.cuda.device(comm.device):  # an NCCL group's objects travel through it
            seen = gcomp._cuda.group_allgather(process_group, None)[2](mine)
    differ = [k for k, v in sorted(settings.items()) if any(dict(s[2])[k] != v for s in seen)]
    if differ:
        raise ValueError("gcomp.torch.GcompHookState: the ranks differ in %s (%s): every rank must "
                         "build its state with the same settings"
                         % (", ".join(differ), "; ".join("rank %d: %s" % (i, ", ".join(
                             "%s=%r" % (k, dict(s[2])[k]) for k in differ)) for i, s in enumerate(seen))))
    if ddp:
        _check_rank_order(comm, size, rank, [s[:2] for s in seen])


def _check_rank_order(comm, size, rank, seen):
    """seen: every rank's (process group size, rank in it), in comm's rank order."""
    if seen != [(size, r) for r in range(size)]:
        raise ValueError(
            "gcomp.torch.GcompHookState: the gcomp communicator has %d ranks and this process "
            "is its rank %d, but DDP's process group has %d ranks and this process is its rank "
            "%d (the communicator's ranks are the group's %s); they must hold the same processes "
            "in the same order (launch every rank with mpirun -np N, and pass comm= for a group "
            "that is not the world)"
            % (comm.size, comm.rank, size, rank, [r for _, r in seen]))


def _ddp_initialized():
    return dist.is_available() and dist.is_initialized()


def _check_order_late(state):
    """The rank-order check of a state built before init_process_group (over MPI: an NCCL
    state needs the group to exist). Until it passes, every call repeats it; a call without a
    process group (outside DDP) has none to check against."""
    if not _ddp_initialized():
        return
    if state.comm._mpi_comm is not None:
        size, rank = dist.get_world_size(state.process_group), dist.get_rank(state.process_group)
        _check_rank_order(state.comm, size, rank, state.comm._mpi_comm.allgather((size, rank)))
    state._order_unchecked = False


def hook(state, bucket):
    """DDP communication hook: average the bucket over ranks with gcomp; returns a
    torch.futures.Future holding the averaged bucket tensor."""
    if not isinstance(state, GcompHookState):
        raise TypeError("gcomp.torch.hook: the state must be a gcomp.torch.GcompHookState, got %s "
                        "(model.register_comm_hook(GcompHookState(...), hook))"
                        % type(state).__name__)
    state._open()  # the plain iterations too, not only once compression starts
    if state._order_unchecked:
        _check_order_late(state)
    tensor = bucket.buffer()
    # refused from the first step, not only once compression starts (start_iter)
    if tensor.layout != torch.strided:
        raise TypeError("gcomp.torch.hook: a bucket of %s gradients (e.g. nn.Embedding(sparse=True)); "
                        "gcomp reduces dense gradients: make the layer's gradients dense "
                        "(sparse=False)" % tensor.layout)
    if str(tensor.dtype) not in _buffers.TORCH_DTYPES:
        raise TypeError("gcomp.torch.hook: a bucket of %s; gcomp reduces float32, float16 and "
                        "bfloat16 gradients" % tensor.dtype)
    cuda = tensor.device.type == "cuda"
    if not (cuda or tensor.device.type == "cpu") or \
            (state.comm.device is not None and tensor.device != state.comm.device):
        raise ValueError(
            "gcomp.torch.hook: bucket on %s, but the GcompHookState's communicator (backend "
            "%r) reduces %s; build the state with backend='nccl' on the bucket's device for "
            "CUDA buckets over NCCL, backend='mpi' for CPU ones"
            % (tensor.device, state.comm.backend,
               "CPU and CUDA tensors" if state.comm.device is None else
               "tensors on %s" % state.comm.device))
    compress = state.iter >= state.start_iter
    if bucket.is_last():
        state.iter += 1
    key = state._key(bucket, tensor)
    # momentum: the velocity's step, kept or undone once the reduced result is known (_Pending)
    pending = state._with_momentum(key, bucket, tensor) if state.momentum else None
    try:
        if not compress:
            return _plain_allreduce(state, tensor, pending)
        if cuda:
            return _cuda_allreduce(state, tensor, key, pending)
        return _cpu_allreduce(state, tensor, key, pending)
    except BaseException:
        if pending is not None:  # refused before any call: the velocity stays as it was
            pending.fail()
        raise


def _cpu_allreduce(state, tensor, key, pending):
    """A CPU bucket: on the worker thread (or on this one below MPI_THREAD_MULTIPLE). run()
    holds the communicator, not the state (see GcompHookState.__init__)."""
    comm = state.comm

    def run():
        try:
            comm.allreduce(tensor, op="avg", key=key)
        except BaseException:
            if pending is not None:
                pending.fail()
            raise
        if pending is not None:
            pending.note(tensor)
        return tensor

    # DDP's reducer reads the future's value in C++: an exception set on the worker's future
    # would reach it as a value ("Unable to cast ... to Tensor"); raised again in a callback,
    # it becomes the future's error, which DDP raises from backward() as it is
    return state._submit(run).then(_value)


def _value(fut):
    return fut.value()


def _cuda_allreduce(state, tensor, key, pending):
    """A CUDA bucket on the caller's thread and current stream (see the module's docstring):
    the future is complete when the call has been issued; its CUDA event, recorded on that
    stream by set_result, is what DDP's stream waits for. A velocity step (momentum) is
    settled here, on the same stream, before the event: a torch.where on the device, no
    host synchronisation."""
    state._open()
    fut = torch.futures.Future(devices=[tensor.device])
    with torch.cuda.device(tensor.device):
        # a failure is raised here, on the caller's thread: DDP's reducer passes it on and
        # backward() raises it (a RuntimeError holding the GcompError), where an exception set
        # on the future would reach the reducer as a value ("Unable to cast ... to Tensor")
        state.comm.allreduce(tensor, op="avg", key=key)
        if pending is not None:
            pending.note(tensor)
            state._settle()
        fut.set_result(tensor)
    return fut
