"""2-rank DDP (gloo) of a small MLP on real Fashion-MNIST with gcomp's comm hook.

Run: timeout 300 mpirun -np 2 /usr/bin/python3 tests/python/test_ddp_hook.py [--timeout-only]
(PYTHONPATH=python, GCOMP_LIBRARY=build/libgcomp.so; --timeout-only: the deadline check alone,
which ctest also runs under TORCH_DISTRIBUTED_DEBUG=DETAIL, where torch wraps the groups).

Checks, for terngrad and top-k: after every step the parameters hash the same on both ranks;
the loss falls; the steps past start_iter ran gcomp's compressed schedule; a step with
gradient accumulation under no_sync keeps the ranks identical; a run resumed from a
checkpoint (model, optimizer, hook state with residuals, through pickle) takes bit-identical
steps, and one resumed without the residuals does not (so the check can fail). Momentum
correction (momentum=0.9, optimizer without momentum): during plain iterations it matches
SGD's own momentum to rounding (and plain SGD does not), with top-k the ranks stay identical
and the loss falls, and a resume carries the velocities bit for bit; bad momentum values and
a state dict of another momentum are refused; a step that overflows (skipped, as a loss
scaler does) leaves the velocity as it was on every rank, and later steps are finite.
load_state_dict refuses state dicts that state_dict() never writes (shared generations,
wrong ids or offsets, bool/float versions, missing fields, NaN velocities) and leaves the
state as it was. A state dropped without close() frees its worker and communicator. The
hook's deadline follows the process group's timeout unless timeout_ms or GCOMP_TIMEOUT_MS is
given.
"""
import datetime
import os
import pickle
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mpi4py import MPI  # noqa: E402  (initialises MPI, thread level multiple)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import gcomp.torch  # noqa: E402
from ddp_common import fashion_mnist, init_dist, param_hash  # noqa: E402

WORLD = MPI.COMM_WORLD
BATCH = 32


def log(*a):
    if WORLD.rank == 0:
        print(*a, flush=True)


def make_ddp(find_unused_parameters=False, momentum=0.9):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10))
    # DDP fills buckets from the last parameter back and closes its first one past 1 MB: the
    # last two layers (1.2 MB) make bucket 0, the first layer bucket 1; two keys, and the
    # issue order matters. find_unused_parameters=True keeps DDP from rebuilding its buckets
    # after the first iteration (torch 1.13's Reducer::should_rebuild_buckets).
    ddp = DDP(model, find_unused_parameters=find_unused_parameters)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=momentum)
    return ddp, opt


class Data:
    def __init__(self, rank, size, n=1024):
        x, y = fashion_mnist("train", n)
        self.x, self.y = torch.from_numpy(x[rank::size]), torch.from_numpy(y[rank::size])

    def batch(self, step, half=None):
        n = len(self.x)
        i = (step * BATCH) % (n - BATCH + 1)
        x, y = self.x[i:i + BATCH], self.y[i:i + BATCH]
        if half is not None:
            h = BATCH // 2
            x, y = (x[:h], y[:h]) if half == 0 else (x[h:], y[h:])
        return x, y


def step(ddp, opt, data, s, accumulate=False):
    """One optimiser step; with accumulate, two micro-batches, the first under no_sync."""
    opt.zero_grad()
    lossf = torch.nn.functional.cross_entropy
    if accumulate:
        with ddp.no_sync():
            x, y = data.batch(s, 0)
            (lossf(ddp(x), y) / 2).backward()
        x, y = data.batch(s, 1)
        loss = lossf(ddp(x), y) / 2
        loss.backward()
        loss = loss * 2
    else:
        x, y = data.batch(s)
        loss = lossf(ddp(x), y)
        loss.backward()
    opt.step()
    return WORLD.allreduce(float(loss), op=MPI.SUM) / WORLD.size


def same_everywhere(ddp, what):
    hashes = WORLD.allgather(param_hash(ddp.module))
    assert len(set(hashes)) == 1, "%s: parameters differ across ranks: %s" % (what, hashes)
    return hashes[0]


def train_check(codec, data, steps=40, start_iter=3, momentum=0.0):
    # momentum correction: the hook applies the momentum, the optimizer none
    ddp, opt = make_ddp(momentum=0.0 if momentum else 0.9)
    state = gcomp.torch.GcompHookState(codec=codec, start_iter=start_iter, momentum=momentum)
    ddp.register_comm_hook(state, gcomp.torch.hook)
    losses = []
    for s in range(steps):
        losses.append(step(ddp, opt, data, s, accumulate=(s % 7 == 6)))
        same_everywhere(ddp, "%s step %d" % (codec, s))
    st = state.stats()
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    log("%-18s momentum %.1f: loss %.3f -> %.3f, compressed calls %d, last schedule %s, wire/raw %.4f"
        % (codec, momentum, first, last, st["compressed_calls"], st["last_schedule"],
           st["wire_bytes"] / max(st["raw_bytes"], 1)))
    assert last < 0.8 * first, "%s: loss did not fall: %.3f -> %.3f" % (codec, first, last)
    assert st["compressed_calls"] > 0 and st["wire_bytes"] < st["raw_bytes"], st
    # plain allreduce for start_iter rounds; then every bucket goes through gcomp
    assert state.iter == steps, (state.iter, steps)
    # DDP rebuilt its buckets after the first iteration: one bucket became two, bucket 0
    # changed layout (a second generation, a fresh residual), bucket 1 is new
    gens = {i: sorted(g.values()) for i, g in state._layout.items()}
    assert gens == {0: [0, 1], 1: [0]}, gens
    assert st["calls"] == 2 * (steps - start_iter), st
    state.close()


def resume_check(codec, data, before=12, after=6, start_iter=2, momentum=0.0):
    # Bit-for-bit resume needs the resumed DDP to bucket the gradients as the saved one did;
    # a DDP that rebuilds its buckets after its first iteration starts the resumed process
    # with its initial layout instead (the hook then resets those buckets' residuals). Hence
    # a DDP that keeps one layout: see make_ddp.
    opt_momentum = 0.0 if momentum else 0.9
    ddp, opt = make_ddp(find_unused_parameters=True, momentum=opt_momentum)
    state = gcomp.torch.GcompHookState(codec=codec, start_iter=start_iter, momentum=momentum)
    ddp.register_comm_hook(state, gcomp.torch.hook)
    for s in range(before):
        step(ddp, opt, data, s)
    ckpt = pickle.dumps({"model": ddp.module.state_dict(), "opt": opt.state_dict(),
                         "hook": state})  # pickling the hook state = its state_dict()
    ref = []
    for s in range(before, before + after):
        step(ddp, opt, data, s)
        ref.append(same_everywhere(ddp, "%s reference step %d" % (codec, s)))
    state.close()

    def resumed(with_residuals):
        ddp2, opt2 = make_ddp(find_unused_parameters=True, momentum=opt_momentum)
        c = pickle.loads(ckpt)  # re-creates the hook state (collective) with its residuals
        ddp2.module.load_state_dict(c["model"])
        opt2.load_state_dict(c["opt"])
        hook_state = c["hook"]
        if not with_residuals and momentum:  # the residuals kept, the velocities dropped
            hook_state._velocity.clear()
        elif not with_residuals:
            fresh = gcomp.torch.GcompHookState(codec=codec, start_iter=start_iter, momentum=momentum)
            fresh.iter = hook_state.iter
            fresh._layout = {i: dict(g) for i, g in hook_state._layout.items()}
            hook_state.close()
            hook_state = fresh
        ddp2.register_comm_hook(hook_state, gcomp.torch.hook)
        got = []
        for s in range(before, before + after):
            step(ddp2, opt2, data, s)
            got.append(same_everywhere(ddp2, "%s resumed step %d" % (codec, s)))
        hook_state.close()
        return got

    got = resumed(True)
    assert got == ref, "%s: resumed run diverged at step %d" % (
        codec, before + next(i for i in range(after) if got[i] != ref[i]))
    assert resumed(False) != ref, "%s: dropping the %s changed nothing" % (
        codec, "velocities" if momentum else "residuals")
    log("%-18s momentum %.1f: resume from step %d: %d steps bit-identical; without %s they differ"
        % (codec, momentum, before, after, "the velocities" if momentum else "residuals"))


def momentum_plain_check(data, steps=8):
    """Momentum correction during plain iterations is SGD's momentum moved into the hook:
    the same parameters to rounding as DDP with SGD(momentum=0.9), and not those of plain
    SGD (so the comparison can fail)."""
    def run(opt_momentum, hook_momentum):
        ddp, opt = make_ddp(momentum=opt_momentum)
        state = None
        if hook_momentum is not None:
            state = gcomp.torch.GcompHookState(codec="terngrad", start_iter=1 << 40,
                                               momentum=hook_momentum)
            ddp.register_comm_hook(state, gcomp.torch.hook)
        for s in range(steps):
            step(ddp, opt, data, s)
        if state is not None:
            assert state.stats()["calls"] == 0  # every iteration was a plain one
            state.close()
        return torch.cat([p.detach().flatten() for p in ddp.module.parameters()])

    ref = run(0.9, None)
    got = run(0.0, 0.9)
    plain = run(0.0, None)
    err, far = (got - ref).abs().max().item(), (plain - ref).abs().max().item()
    assert err < 1e-5 * max(1.0, ref.abs().max().item()), "momentum in the hook: max diff %g" % err
    assert far > 100 * max(err, 1e-7), "plain SGD as close to SGD with momentum as the hook: %g vs %g" % (far, err)
    log("momentum 0.9 in the hook, %d plain steps: max |diff| to SGD(momentum=0.9) %.2g (plain SGD: %.2g)"
        % (steps, err, far))


class FakeBucket:
    """What the hook reads of a DDP GradBucket, for a layout chosen by the test."""
    def __init__(self, index, params, grad):
        self.i, self.params, self.grad = index, params, grad

    def buffer(self):
        return self.grad

    def index(self):
        return self.i

    def parameters(self):
        return self.params

    def is_last(self):
        return True


def momentum_layout_check():
    """Velocities follow their parameters when the buckets are rebuilt, and a resumed state
    gives each parameter its saved velocity in the initial layout that a resumed DDP runs
    first (before: that layout started from zero and the rebuilt one took its stale saved
    velocity back); a state dict of another model (other shapes) is refused at the first
    step; a version-2 state dict (layouts by shapes) still loads. Plain
    iterations (every rank holds the same values, so the average is the value)."""
    def reduce(state, index, params, value):
        n = sum(p.numel() for p in params)
        grad = value if isinstance(value, torch.Tensor) else torch.full((n,), value)
        return gcomp.torch.hook(state, FakeBucket(index, params, grad)).wait()

    p1, p2 = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))
    s = gcomp.torch.GcompHookState(codec="terngrad", start_iter=1 << 40, momentum=0.5)
    reduce(s, 0, [p1, p2], 1.0)  # initial layout: one bucket
    got = reduce(s, 0, [p2], 2.0)  # rebuilt: p2 alone in bucket 0 ...
    assert torch.equal(got, torch.full((2,), 2.5)), got  # 0.5 * 1 + 2: p2's velocity moved
    got = reduce(s, 1, [p1], 2.0)  # ... and p1 in bucket 1
    assert torch.equal(got, torch.full((3,), 2.5)), got
    assert len(s._velocity) == 2, s._velocity.keys()  # the initial layout's is dropped
    sd = s.state_dict()
    s.close()
    q1, q2 = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))
    r = gcomp.torch.GcompHookState(codec="terngrad", start_iter=1 << 40, momentum=0.5)
    r.load_state_dict(sd)
    got = reduce(r, 0, [q1, q2], 1.0)  # a resumed DDP's initial layout: the saved 2.5 each
    assert torch.equal(got, torch.full((5,), 2.25)), got
    got = reduce(r, 0, [q2], 2.0)  # the rebuilt layout: q2's velocity moves with it again
    assert torch.equal(got, torch.full((2,), 3.125)), got
    r.close()
    # the same state dict loaded for another model (its parameters' shapes differ, numbered
    # alike): refused at its first step, where it gave parameter 0 parameter 0's velocity
    r = gcomp.torch.GcompHookState(codec="terngrad", start_iter=1 << 40, momentum=0.5)
    r.load_state_dict(sd)
    o1, o2 = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))
    try:
        reduce(r, 0, [o1, o2], 1.0)
        raise AssertionError("another model's velocities were taken")
    except ValueError as e:
        assert "has shape (2,), but its momentum velocity is for shape (3,)" in str(e), e
    r.close()
    # a version-2 state dict: layouts by shapes, velocities without their parameters
    s = gcomp.torch.GcompHookState(codec="terngrad", start_iter=1 << 40, momentum=0.5)
    reduce(s, 0, [p1, p2], 1.0)
    sd = s.state_dict()
    s.close()
    sd2 = {k: v for k, v in sd.items() if k not in ("where", "ids", "rank", "world_size")}
    sd2["version"] = 2
    sd2["layout"] = {i: {sig[:3]: g for sig, g in gens.items()} for i, gens in sd["layout"].items()}
    r = gcomp.torch.GcompHookState(codec="terngrad", start_iter=1 << 40, momentum=0.5)
    r.load_state_dict(sd2)
    got = reduce(r, 0, [q1, q2], 1.0)  # its layout's key again, the velocity taken as it is
    assert torch.equal(got, torch.full((5,), 1.5)), got
    r.close()
    # an empty parameter at a bucket's end: its velocity's offset is the bucket's size
    w, z = torch.nn.Parameter(torch.zeros(5)), torch.nn.Parameter(torch.zeros(0))
    s = gcomp.torch.GcompHookState(codec="terngrad", start_iter=1 << 40, momentum=0.5)
    reduce(s, 0, [w, z], 1.0)
    sd = s.state_dict()
    s.close()
    r = gcomp.torch.GcompHookState(codec="terngrad", start_iter=1 << 40, momentum=0.5)
    r.load_state_dict(sd)  # refused before ("not in a saved velocity")
    r.close()
    # equal shapes in another order: the same layout key, other parameters at each offset
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    s = gcomp.torch.GcompHookState(codec="terngrad", start_iter=1 << 40, momentum=0.5)
    reduce(s, 0, [a, b], torch.tensor([1.0, 1.0, 2.0, 2.0]))
    got = reduce(s, 0, [b, a], torch.zeros(4))
    assert torch.equal(got, torch.tensor([1.0, 1.0, 0.5, 0.5])), got  # b's 2 * 0.5, a's 1 * 0.5
    s.close()
    log("momentum: velocities follow parameters into rebuilt buckets and survive a resume's first layout")


def layout_key_check():
    """Equal-shaped parameters in another order (DDP's rebuild can do that) are another
    layout with its own key, so the old layout's residual is not added at offsets that now
    hold other parameters (before: one key per shapes, and b's residual went to a)."""
    def reduce(state, params, values):
        return gcomp.torch.hook(state, FakeBucket(0, params, torch.tensor(values))).wait()

    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    s = gcomp.torch.GcompHookState(codec="topk:ratio=0.5", start_iter=0)
    got = reduce(s, [a, b], [3.0, 3.0, 1.0, 1.0])  # top 2 of 4: a's; b's 1s stay in the residual
    assert torch.equal(got, torch.tensor([3.0, 3.0, 0.0, 0.0])), got
    got = reduce(s, [b, a], [0.0, 0.0, 0.0, 0.0])  # rebuilt, b first: a new layout from zero
    assert torch.equal(got, torch.zeros(4)), got
    got = reduce(s, [a, b], [0.0, 0.0, 0.0, 0.0])  # the first layout again: b's 1s, at b
    assert torch.equal(got, torch.tensor([0.0, 0.0, 1.0, 1.0])), got
    s.close()
    log("hook: equal-shaped parameters in another order are another layout (own key and residual)")


def momentum_args_check():
    """Bad momentum values, and a state dict saved with another momentum, are refused."""
    for bad, exc in ((1.0, ValueError), (-0.1, ValueError), (float("nan"), ValueError),
                     ("0.9", TypeError), (True, TypeError)):
        try:
            gcomp.torch.GcompHookState(codec="terngrad", momentum=bad)
        except exc as e:
            assert "momentum" in str(e), str(e)
        else:
            raise AssertionError("momentum=%r accepted" % (bad,))
    a = gcomp.torch.GcompHookState(codec="terngrad", momentum=0.9)
    b = gcomp.torch.GcompHookState(codec="terngrad")
    try:
        b.load_state_dict(a.state_dict())
    except ValueError as e:
        assert "momentum" in str(e), str(e)
    else:
        raise AssertionError("a state dict of momentum 0.9 loaded into a state of momentum 0")
    # velocities that fit no bucket layout of their state dict, or hold no usable data
    p = torch.nn.Parameter(torch.zeros(3))
    gcomp.torch.hook(a, FakeBucket(0, [p], torch.ones(3))).wait()
    good = a.state_dict()
    assert list(good["velocity"]) == [0], good["velocity"]
    for bad, exc in ((torch.ones(4), ValueError), (torch.ones(3, 1), ValueError),
                     (torch.ones(3, dtype=torch.float64), ValueError),
                     (torch.ones(3).to_sparse(), TypeError), (torch.empty(3, device="meta"), TypeError),
                     (torch.ones(3, dtype=torch.int32), TypeError)):
        sd = dict(good, velocity={0: bad})
        try:
            a.load_state_dict(sd)
        except exc as e:
            assert "velocity" in str(e), str(e)
        else:
            raise AssertionError("velocity %r accepted" % (bad,))
    try:
        a.load_state_dict(dict(good, velocity={5 << 32: torch.ones(3)}))
    except ValueError as e:
        assert "layout" in str(e), str(e)
    else:
        raise AssertionError("a velocity of a key without a layout accepted")
    try:
        b.load_state_dict(dict(good, momentum=0.0))
    except ValueError as e:
        assert "without momentum" in str(e), str(e)
    else:
        raise AssertionError("velocities accepted by a state without momentum")
    # a layout whose count is not its shapes' (it would match no bucket: with momentum its
    # velocity does not fit it either, without momentum nothing else would tell), and a
    # parameter named by ids without a place in where (its momentum would restart from zero)
    q = torch.nn.Parameter(torch.zeros(2))
    c = gcomp.torch.GcompHookState(codec="terngrad")
    for st in (a, c):
        gcomp.torch.hook(st, FakeBucket(1, [p, q], torch.ones(5))).wait()
    good = a.state_dict()
    (sig, gen), = good["layout"][1].items()
    cases = [(c, "its parameter shapes"), (a, "its parameter shapes"), (a, "which where does not place")]
    for st, words in cases:
        sd = st.state_dict()
        if words == "its parameter shapes":
            sd["layout"] = {**sd["layout"], 1: {(sig[0] + 1,) + sig[1:]: gen}}
        else:
            sd["where"] = {n: w for n, w in sd["where"].items() if n != sig[3][1]}
        before = st.state_dict()
        try:
            st.load_state_dict(sd)
        except ValueError as e:
            assert words in str(e), str(e)
        else:
            raise AssertionError("a state dict with %r accepted" % words)
        after = st.state_dict()
        assert after["layout"] == before["layout"] and after["where"] == before["where"], after
    c.close()
    a.load_state_dict(good)  # and the good one still loads
    a.close()
    b.close()
    log("momentum: bad values, a state dict of another momentum, velocities that fit no layout, "
        "miscounted layouts, unplaced parameters -> clear errors")


def nonfinite_momentum_check(data, rank, steps=9, start_iter=3, overflow=(2, 5)):
    """Momentum correction under a loss scaler: a step whose gradients overflow (here rank 0's
    alone: its loss times 3e39) gives a non-finite reduced result on every rank, the trainer
    skips it as GradScaler does (no optimizer step; torch 1.13's GradScaler is CUDA-only, so
    by hand), and the hook leaves every rank's velocity bit for bit as it was before that
    step, in a plain iteration (2) and a compressed one (5); every other step is finite and
    the ranks stay identical. Before, u = m u + g kept the Inf: every step after the first
    overflow was non-finite and skipped, and training never recovered."""
    ddp, opt = make_ddp(momentum=0.0)  # the hook applies the momentum
    state = gcomp.torch.GcompHookState(codec="topk:ratio=0.05", start_iter=start_iter, momentum=0.9)
    ddp.register_comm_hook(state, gcomp.torch.hook)
    lossf = torch.nn.functional.cross_entropy
    skipped = []
    for s in range(steps):
        before = state.state_dict()["velocity"] if s in overflow else None
        opt.zero_grad()
        x, y = data.batch(s)
        loss = lossf(ddp(x), y)
        if s in overflow and rank == 0:
            loss = loss * 3e38 * 10  # +inf, as with a loss scale far too large
        loss.backward()
        if all(bool(torch.isfinite(p.grad).all()) for p in ddp.parameters()):
            opt.step()
        else:
            skipped.append(s)  # GradScaler: skip the step (and lower the scale)
            after = state.state_dict()["velocity"]
            assert before and sorted(after) == sorted(before), (s, sorted(before), sorted(after))
            for k in before:
                assert torch.equal(after[k], before[k]), "step %d: velocity of key %d changed" % (s, k)
        same_everywhere(ddp, "non-finite step %d" % s)
    got = WORLD.allgather(skipped)
    assert got == [list(overflow)] * WORLD.size, "skipped steps per rank: %s (want %s)" % (got, list(overflow))
    assert all(bool(torch.isfinite(u).all()) for u in state.state_dict()["velocity"].values())
    assert state.stats()["nonfinite_calls"] > 0  # the compressed overflow did reach gcomp
    state.close()
    log("momentum: an overflowing step (plain and compressed) is skipped, the velocity kept as it "
        "was on every rank, later steps finite")


def dropped_state_check():
    """A GcompHookState dropped without close() is freed like a gcomp.Comm: its __del__ stops
    the worker thread and frees the communicator (its MPI duplicate). Before, the worker's
    target was a bound method of the state, which kept it (and its Comm and thread) alive
    until exit: each dropped state leaked a thread and a communicator."""
    import gc
    import threading
    import weakref

    def make():
        s = gcomp.torch.GcompHookState(codec="terngrad", start_iter=0)
        p = torch.nn.Parameter(torch.zeros(4))
        gcomp.torch.hook(s, FakeBucket(0, [p], torch.ones(4))).wait()  # used, then dropped
        return weakref.ref(s), weakref.ref(s.comm), s._thread

    refs = [make() for _ in range(5)]
    workers = [t for _, _, t in refs if t is not None]
    # mpi4py's MPI_THREAD_MULTIPLE: each state had its worker (the case that leaked)
    assert len(workers) == 5, "expected a worker thread per state, got %d" % len(workers)
    gc.collect()
    alive = [i for i, (s, c, _) in enumerate(refs) if s() is not None or c() is not None]
    assert not alive, "dropped states (or their Comms) still alive: %s" % alive
    assert not any(t.is_alive() for t in workers), "dropped states' workers still running"
    assert not [t for t in threading.enumerate() if t in workers]
    WORLD.Barrier()
    log("hook: a state dropped without close() frees its communicator and worker thread")


def state_dict_consistency_check():
    """load_state_dict refuses what state_dict() never writes, each with a message naming the
    field, and a refused dict leaves the state as it was: two layouts of one bucket sharing
    a generation (one key: a rebuilt bucket would take the other layout's residual),
    parameter numbers (ids) that are not the layout's, a bool where an offset goes, a bool
    or float version, a version-3 dict without momentum (before: "saved with momentum 0.0"),
    a non-finite velocity (every later step would be non-finite). Before, all of these but
    the momentum one loaded (that one with a wrong reason)."""
    import copy
    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(2))
    s = gcomp.torch.GcompHookState(codec="topk:ratio=0.5", start_iter=0, momentum=0.5)

    def reduce(params, values):
        return gcomp.torch.hook(s, FakeBucket(0, params, torch.tensor(values))).wait()

    reduce([a, b], [3.0, 1.0, 1.0])
    good = s.state_dict()
    key = next(iter(good["ids"]))
    (sig, gen), = good["layout"][0].items()
    assert good["where"] == {0: (key, 0), 1: (key, 1)} and good["ids"][key] == (0, 1), good

    def snapshot():
        d = s.state_dict()
        d["velocity"] = {k: u.tolist() for k, u in d["velocity"].items()}
        return repr(d)

    ref = snapshot()

    def changed(fn):
        sd = copy.deepcopy(good)
        fn(sd)
        return sd

    cases = [
        ("one generation for two layouts",
         lambda sd: sd["layout"][0].__setitem__((3, sig[1], (sig[2][1], sig[2][0]), (1, 0)), gen),
         ValueError, "several layouts of generation"),
        ("ids longer than the velocity", lambda sd: sd["ids"].__setitem__(key, (0, 1, 2)),
         ValueError, "ids of key"),
        ("a bool offset in where", lambda sd: sd["where"].__setitem__(1, (key, True)),
         TypeError, "where"),
        ("version True", lambda sd: sd.__setitem__("version", True), TypeError, "version"),
        ("version 3.0", lambda sd: sd.__setitem__("version", 3.0), TypeError, "version"),
        ("a version-4 dict without momentum", lambda sd: sd.pop("momentum"),
         ValueError, "lacks momentum"),
        ("a version-4 dict without where and ids", lambda sd: (sd.pop("where"), sd.pop("ids")),
         ValueError, "lacks where, ids"),
        ("a NaN velocity", lambda sd: sd["velocity"][key].__setitem__(0, float("nan")),
         ValueError, "NaN or Inf"),
        ("an offset its layout does not give", lambda sd: sd["where"].__setitem__(1, (key, 2)),
         ValueError, "offset 2"),
        ("a layout naming its parameters in a version-2 dict",
         lambda sd: (sd.__setitem__("version", 2), sd.pop("where"), sd.pop("ids"), sd.pop("rank"),
                     sd.pop("world_size")),
         ValueError, "not one state_dict() writes"),
        ("where and ids in a version-2 dict", lambda sd: (sd.__setitem__("version", 2), sd.pop("rank"),
                                                          sd.pop("world_size")),
         ValueError, "'ids', 'where', which no version-2 state dict holds"),
        ("rank and world size in a version-3 dict", lambda sd: sd.__setitem__("version", 3),
         ValueError, "'rank', 'world_size', which no version-3 state dict holds"),
        ("a version-4 dict without its rank", lambda sd: sd.pop("rank"), ValueError, "lacks rank"),
        ("another rank's state dict", lambda sd: sd.__setitem__("rank", 1 - sd["rank"]),
         ValueError, "saved by rank %d of 2, this is rank %d of 2" % (1 - good["rank"], good["rank"])),
        ("another world size's state dict", lambda sd: sd.__setitem__("world_size", 3),
         ValueError, "saved by rank %d of 3, this is rank %d of 2" % (good["rank"], good["rank"])),
        ("a bool rank", lambda sd: sd.__setitem__("rank", True), TypeError, "rank"),
    ]
    for what, fn, exc, match in cases:
        try:
            s.load_state_dict(changed(fn))
        except exc as e:
            assert match in str(e), "%s: message %r lacks %r" % (what, str(e), match)
        else:
            raise AssertionError("load_state_dict accepted %s" % what)
        assert snapshot() == ref, "a refused state dict (%s) changed the state" % what
    s.load_state_dict(good)  # and the good one still loads
    assert snapshot() == ref
    s.close()
    # error feedback off: no residuals, whose blob refused another rank's; the dict's own rank
    # and world size are what tell them apart (before: another rank's velocities loaded)
    off = gcomp.torch.GcompHookState(codec="fp16", start_iter=0, momentum=0.5, error_feedback=False)
    gcomp.torch.hook(off, FakeBucket(0, [a, b], torch.tensor([3.0, 1.0, 1.0]))).wait()
    sd = off.state_dict()
    assert sd["residuals"] is None and sd["rank"] == off.comm.rank, sd
    for field, value in (("rank", 1 - sd["rank"]), ("world_size", 3)):
        bad = dict(sd, **{field: value})
        try:
            off.load_state_dict(bad)
        except ValueError as e:
            assert "saved by rank" in str(e), e
        else:
            raise AssertionError("error feedback off: a state dict of another %s loaded" % field)
    off.load_state_dict(sd)
    off.close()
    log("hook: %d inconsistent state dicts refused with the state untouched (shared generation, "
        "ids, bool offset, bool/float version, missing fields, NaN velocity, another rank or "
        "world size, also with error feedback off)" % len(cases))


def device_mismatch_check():
    """A bucket on a device other than the state's communicator's is refused with a message
    naming both (a meta tensor stands in for a device this MPI state does not reduce)."""
    state = gcomp.torch.GcompHookState(codec="terngrad", start_iter=0)
    assert state.comm.backend == "mpi"  # the gloo process group: host buckets over MPI
    try:
        gcomp.torch.hook(state, FakeBucket(0, [], torch.empty(8, device="meta")))
    except ValueError as e:
        assert "meta" in str(e) and "backend='nccl'" in str(e), str(e)
    else:
        raise AssertionError("hook accepted a non-CPU bucket")
    state.close()
    log("hook: bucket on another device than the state's -> ValueError")


def timeout_check():
    """The hook's deadline: the process group's own timeout unless timeout_ms or
    GCOMP_TIMEOUT_MS says otherwise (gloo's default group: torch's 30 min, not gcomp's 300 s)."""
    def made(**kw):
        state = gcomp.torch.GcompHookState(codec="terngrad", **kw)
        ms = state.comm.config()["timeout_ms"]
        state.close()
        return ms
    inherited = os.environ.pop("GCOMP_TIMEOUT_MS", None)
    group = dist.new_group(list(range(WORLD.size)), timeout=datetime.timedelta(seconds=77))
    default_ms = int(dist.default_pg_timeout.total_seconds() * 1000)
    got = made()
    assert got == default_ms, (got, default_ms)
    got = made(process_group=group)
    assert got == 77000, got
    assert made(process_group=group, timeout_ms=5000) == 5000
    os.environ["GCOMP_TIMEOUT_MS"] = ""  # empty is unset, as for the library
    got = made(process_group=group)
    assert got == 77000, got
    os.environ["GCOMP_TIMEOUT_MS"] = "45000"
    got = made(process_group=group)
    assert got == 45000, got
    del os.environ["GCOMP_TIMEOUT_MS"]
    state = gcomp.torch.GcompHookState(codec="terngrad", process_group=group, start_iter=0)
    loaded = pickle.loads(pickle.dumps(state))  # over the default group, deriving its deadline
    assert loaded._config["timeout_ms"] is None and loaded.comm.config()["timeout_ms"] == default_ms
    loaded.close()
    state.close()
    if inherited is not None:
        os.environ["GCOMP_TIMEOUT_MS"] = inherited
    log("hook: deadline = the process group's timeout (%d ms default, 77000 ms for a group of "
        "77 s), timeout_ms and GCOMP_TIMEOUT_MS before it" % default_ms)


def worker_error_check(rank):
    """A gcomp call that fails on the hook's worker thread (here: rank 1 comes 2.5 s late to a
    1 s deadline) is raised by DDP's backward() as that GcompError, on every rank."""
    ddp = DDP(torch.nn.Linear(64, 64))
    state = gcomp.torch.GcompHookState(codec="terngrad", start_iter=0, timeout_ms=1000)
    ddp.register_comm_hook(state, gcomp.torch.hook)
    if rank == 1:
        time.sleep(2.5)
    try:
        ddp(torch.randn(8, 64)).sum().backward()
    except RuntimeError as e:
        assert "GcompError" in str(e) and "GCOMP_ERR_TIMEOUT" in str(e), str(e)
    else:
        raise AssertionError("backward() did not raise the worker's failure")
    state.close()
    WORLD.Barrier()
    log("hook: a call failing on the worker thread -> backward() raises its GcompError")


def group_mismatch_check(rank, size):
    """A gcomp communicator that does not hold DDP's processes in DDP's order is refused when
    the state is built, on every rank (before: each process averaged over its own
    communicator, and replicas launched as separate one-rank MPI jobs drifted apart silently).
    At 3 ranks the reversed order keeps the middle rank's number: it must raise too."""
    reversed_order = WORLD.Split(0, size - 1 - rank)
    for comm, what in ((MPI.COMM_SELF, "a one-rank communicator"), (reversed_order, "the reversed rank order")):
        try:
            gcomp.torch.GcompHookState(codec="terngrad", comm=comm).close()
        except ValueError as e:
            assert "same processes in the same order" in str(e), str(e)
        else:
            raise AssertionError("a hook state over %s was accepted" % what)
    reversed_order.Free()
    log("hook: a gcomp communicator of other processes or another rank order than DDP's -> ValueError")


def states_before_init(rank, size):
    """Hook states built before init_process_group, when DDP's ranks are not known yet: one
    over the reversed rank order, one over COMM_WORLD (DDP's order)."""
    reversed_order = WORLD.Split(0, size - 1 - rank)
    return (gcomp.torch.GcompHookState(codec="terngrad", comm=reversed_order, start_iter=1),
            gcomp.torch.GcompHookState(codec="terngrad", start_iter=1), reversed_order)


def late_group_check(states, rank):
    """A state built before init_process_group is checked at the hook's first call, on every
    rank (before: never, so the replicas drifted apart silently). Until it passes every call
    repeats the check; a state in DDP's order trains."""
    wrong, right, reversed_order = states
    for _ in range(2):
        ddp = DDP(torch.nn.Linear(16, 16))
        ddp.register_comm_hook(wrong, gcomp.torch.hook)
        try:
            ddp(torch.randn(4, 16)).sum().backward()
        except (RuntimeError, ValueError) as e:
            assert "same processes in the same order" in str(e), str(e)
        else:
            raise AssertionError("a hook state built before init_process_group over the reversed "
                                 "rank order was accepted")
    ddp = DDP(torch.nn.Linear(16, 16))
    ddp.register_comm_hook(right, gcomp.torch.hook)
    torch.manual_seed(rank)
    for _ in range(3):  # plain, then compressed
        ddp.zero_grad()
        ddp(torch.randn(4, 16)).sum().backward()
    assert right.stats()["compressed_calls"] >= 1, right.stats()
    grads = WORLD.allgather(torch.cat([p.grad.flatten() for p in ddp.parameters()]).numpy().tobytes())
    assert len(set(grads)) == 1, "a state built before init_process_group: gradients differ across ranks"
    wrong.close()
    right.close()
    reversed_order.Free()
    log("hook: a state built before init_process_group is checked at its first call")


def closed_plain_check():
    """A closed state is refused in the plain iterations too (start_iter not reached), not only
    once compression starts."""
    ddp = DDP(torch.nn.Linear(16, 16))
    state = gcomp.torch.GcompHookState(codec="terngrad", start_iter=5)
    ddp.register_comm_hook(state, gcomp.torch.hook)
    sd = state.state_dict()
    state.close()
    try:
        ddp(torch.randn(4, 16)).sum().backward()
    except (RuntimeError, ValueError) as e:
        assert "used after close" in str(e), str(e)
    else:
        raise AssertionError("a closed state ran a plain iteration")
    # every method names the state, not the gcomp.Comm inside it (before: state_dict() and
    # load_state_dict() said "gcomp.Comm used after close()", stats() the state)
    for name, call in (("state_dict", state.state_dict), ("load_state_dict", lambda: state.load_state_dict(sd)),
                       ("stats", state.stats), ("stats_reset", state.stats_reset)):
        try:
            call()
        except ValueError as e:
            assert str(e) == "GcompHookState used after close()", "%s: %s" % (name, e)
        else:
            raise AssertionError("%s of a closed state did not raise" % name)
    WORLD.Barrier()
    log("hook: a closed state -> refused from its first iteration; its methods say GcompHookState")


def main():
    early = states_before_init(WORLD.rank, WORLD.size) if "--group-only" in sys.argv else None
    rank, size = init_dist(WORLD)
    if "--timeout-only" in sys.argv:  # ctest python_ddp_hook_timeout_detail: wrapped groups
        timeout_check()
        dist.destroy_process_group()
        log("test_ddp_hook --timeout-only: OK")
        return
    if "--group-only" in sys.argv:  # ctest python_ddp_hook_group_np3: a rank keeps its number
        group_mismatch_check(rank, size)
        late_group_check(early, rank)
        dist.destroy_process_group()
        log("test_ddp_hook --group-only: OK")
        return
    device_mismatch_check()
    torch.set_num_threads(1)
    data = Data(rank, size)
    for codec in ("terngrad", "topk:ratio=0.05"):
        train_check(codec, data)
        resume_check(codec, data)
    momentum_args_check()
    state_dict_consistency_check()
    momentum_layout_check()
    layout_key_check()
    momentum_plain_check(data)
    train_check("topk:ratio=0.05", data, momentum=0.9)
    resume_check("topk:ratio=0.05", data, momentum=0.9)
    nonfinite_momentum_check(data, rank)
    dropped_state_check()
    timeout_check()
    worker_error_check(rank)
    group_mismatch_check(rank, size)
    closed_plain_check()
    dist.destroy_process_group()
    log("test_ddp_hook: OK")


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        WORLD.Abort(1)
