#!/usr/bin/env python3
"""torch_peers.py — gcomp's GPU codecs against what a PyTorch user has today, on one tensor.

On the same CUDA tensor (default 256 MiB of fp32 N(0,1) values), timed with CUDA events on
torch's current stream, median of --iters samples after --warmup calls:

  top-k 1 %   torch: torch.topk(x.abs(), k, sorted=False) then torch.sort of the indices
              (the usual sparsification step; values not gathered, which favours torch)
              gcomp: encode of "topk:ratio=0.01" with error feedback in steady state
              (exact k, ties to the lower index, Rice-coded payload; reads its size back once)
  fp16        torch: x.half(), the cast of DDP's fp16 compress hook (no error feedback)
              torch + EF: the same with fp32 error feedback written in eager ops
              (y = x + r; h = y.half(); r = y - h.float()), for reference
              gcomp: encode of "fp16" with error feedback (one fused pass)

GB/s charges each byte once, as codec_perf does: a cast reads 4 and writes 2 bytes per
element; error feedback adds a residual read and write (8 bytes); top-k rows show time only.
Before timing, gcomp's outputs are checked against torch on the same tensor (fresh codec, zero
residual): the fp16 payload decodes to exactly x.half(), the top-k payload keeps exactly k
elements, all with |x| >= the k-th largest |x| torch found.

gcomp is called through ctypes on the built shared library (no Python package needed):
    python3 bench/torch_peers.py --lib build-gpu/libgcomp.so [--json FILE]
Needs torch with CUDA and a GPU; exit status 0 ok, 1 a check or call failed, 2 bad usage.
"""
import argparse
import ctypes
import json
import math
import statistics
import sys

import torch

KEY = 1  # any key but GCOMP_KEY_NONE: error feedback on
F32 = 0


class Gcomp:
    """The few C functions this script needs, declared for ctypes."""

    def __init__(self, path):
        lib = ctypes.CDLL(path)
        vp, sz, u64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64
        lib.gcomp_last_error.restype = ctypes.c_char_p
        lib.gcomp_result_name.restype = ctypes.c_char_p
        lib.gcomp_result_name.argtypes = [ctypes.c_int]
        lib.gcomp_codec_create.argtypes = [ctypes.c_char_p, vp, ctypes.POINTER(vp)]
        lib.gcomp_codec_destroy.argtypes = [vp]
        lib.gcomp_codec_destroy.restype = None
        lib.gcomp_codec_max_encoded_bytes.argtypes = [vp, sz]
        lib.gcomp_codec_max_encoded_bytes.restype = sz
        lib.gcomp_codec_encode_async.argtypes = [vp, u64, vp, sz, ctypes.c_int, vp, sz,
                                                 ctypes.POINTER(sz), vp]
        lib.gcomp_codec_decode_add_async.argtypes = [vp, vp, sz, vp, sz, vp]
        lib.gcomp_codec_sync.argtypes = [vp, vp]
        self.lib = lib

    def check(self, rc, what):
        if rc != 0:
            raise RuntimeError("%s: %s: %s" % (what, self.lib.gcomp_result_name(rc).decode(),
                                               self.lib.gcomp_last_error().decode()))

    def codec(self, spec):
        out = ctypes.c_void_p()
        self.check(self.lib.gcomp_codec_create(spec.encode(), None, ctypes.byref(out)),
                   "gcomp_codec_create(%s)" % spec)
        return out


class Encoder:
    """One codec object and a device payload buffer; encode() enqueues on torch's stream."""

    def __init__(self, g, spec, x):
        self.g, self.spec, self.x = g, spec, x
        self.codec = g.codec(spec)
        cap = g.lib.gcomp_codec_max_encoded_bytes(self.codec, x.numel())
        self.payload = torch.empty(cap, dtype=torch.uint8, device=x.device)
        self.written = ctypes.c_size_t(0)

    def stream(self):
        return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    def encode(self):
        self.g.check(self.g.lib.gcomp_codec_encode_async(
            self.codec, KEY, ctypes.c_void_p(self.x.data_ptr()), self.x.numel(), F32,
            ctypes.c_void_p(self.payload.data_ptr()), self.payload.numel(),
            ctypes.byref(self.written), self.stream()), "encode_async(%s)" % self.spec)

    def decoded(self):
        """The last payload decoded into a fresh fp32 tensor of zeros."""
        acc = torch.zeros_like(self.x)
        self.g.check(self.g.lib.gcomp_codec_decode_add_async(
            self.codec, ctypes.c_void_p(self.payload.data_ptr()), self.written.value,
            ctypes.c_void_p(acc.data_ptr()), acc.numel(), self.stream()),
            "decode_add_async(%s)" % self.spec)
        self.sync()
        return acc

    def sync(self):
        self.g.check(self.g.lib.gcomp_codec_sync(self.codec, self.stream()),
                     "sync(%s)" % self.spec)

    def close(self):
        self.g.lib.gcomp_codec_destroy(self.codec)


def time_ms(fn, iters, warmup):
    """Milliseconds per call: median of `iters` samples of `reps` calls between CUDA events
    (reps makes a sample last >= 1 ms, from the warm-up calls' time)."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def sample(reps):
        start.record()
        for _ in range(reps):
            fn()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / reps

    last = 1.0
    for _ in range(max(warmup, 1)):
        last = sample(1)
    reps = max(1, min(1000, math.ceil(1.0 / max(last, 1e-6))))
    return statistics.median(sample(reps) for _ in range(iters))


def check_fp16(g, x):
    enc = Encoder(g, "fp16", x)
    try:
        enc.encode()
        dec = enc.decoded()
        if not torch.equal(dec, x.half().float()):
            bad = (dec != x.half().float()).nonzero()[0].item()
            raise RuntimeError("gcomp fp16 decodes element %d to %r, x.half() is %r"
                               % (bad, dec[bad].item(), x.half()[bad].item()))
    finally:
        enc.close()


def check_topk(g, x, k):
    enc = Encoder(g, "topk:ratio=0.01", x)
    try:
        enc.encode()
        dec = enc.decoded()
        kept = dec != 0
        n_kept = int(kept.sum().item())
        kth = torch.topk(x.abs(), k, sorted=False).values.min()
        if n_kept != k:
            raise RuntimeError("gcomp top-k kept %d elements, k = %d" % (n_kept, k))
        if not bool((x.abs()[kept] >= kth).all()) or not torch.equal(dec[kept], x[kept]):
            raise RuntimeError("gcomp top-k kept an element below torch's k-th largest |x| "
                               "or changed a value")
    finally:
        enc.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", required=True, help="path to the built libgcomp.so")
    ap.add_argument("--mib", type=int, default=256, help="tensor size in MiB of fp32 (256)")
    ap.add_argument("--iters", type=int, default=10, help="timed samples (10)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls first (3)")
    ap.add_argument("--json", help="also write one JSON object per row to this file")
    args = ap.parse_args()
    if args.mib <= 0 or args.iters <= 0 or args.warmup < 0:
        ap.error("--mib and --iters must be positive, --warmup >= 0")
    if not torch.cuda.is_available():
        print("torch_peers: torch sees no CUDA device", file=sys.stderr)
        return 1

    g = Gcomp(args.lib)
    n = args.mib * (1 << 20) // 4
    k = math.ceil(0.01 * n)  # gcomp's k = ceil(ratio * n), in double as here
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, device="cuda", generator=gen)
    dev = torch.cuda.get_device_name()

    check_fp16(g, x)
    check_topk(g, x, k)

    topk = Encoder(g, "topk:ratio=0.01", x)
    fp16 = Encoder(g, "fp16", x)
    r = torch.zeros_like(x)

    def torch_topk():
        idx = torch.topk(x.abs(), k, sorted=False).indices
        torch.sort(idx)

    def torch_half_ef():
        y = x + r
        h = y.half()
        torch.sub(y, h.float(), out=r)

    topk.encode()  # the residual exists before timing: steady state
    fp16.encode()
    b = 4.0 * n
    rows = [
        # (operation, implementation, function, charged bytes or None)
        ("topk 1%", "torch.topk(|x|) + sort(indices)", torch_topk, None),
        ("topk 1%", "gcomp topk:ratio=0.01, EF", topk.encode, None),
        ("fp16", "torch x.half() (no EF)", lambda: x.half(), b + b / 2),
        ("fp16", "torch eager fp16 + EF", torch_half_ef, b + 2 * b + b / 2),
        ("fp16", "gcomp fp16, EF", fp16.encode, b + 2 * b + b / 2),
    ]
    results = []
    for op, impl, fn, nbytes in rows:
        ms = time_ms(fn, args.iters, args.warmup)
        results.append({"bench": "torch_peers", "op": op, "impl": impl, "ms": ms,
                        "GBps": nbytes / ms / 1e6 if nbytes else None, "elements": n, "k": k,
                        "device": dev, "torch": torch.__version__})
    topk.sync()
    fp16.sync()
    topk.close()
    fp16.close()

    print("# torch_peers: %s | torch %s | %d MiB fp32 N(0,1), k = %d | median of %d, "
          "CUDA events" % (dev, torch.__version__, args.mib, k, args.iters))
    print("%-8s %-34s %10s %8s" % ("op", "implementation", "ms", "GB/s"))
    for row in results:
        print("%-8s %-34s %10.4f %8s" % (row["op"], row["impl"], row["ms"],
                                         "%.1f" % row["GBps"] if row["GBps"] else "-"))
    t_topk, g_topk = results[0]["ms"], results[1]["ms"]
    t_half, g_half = results[2]["ms"], results[4]["ms"]
    summary = {"bench": "torch_peers_summary", "device": dev, "torch": torch.__version__,
               "topk_torch_over_gcomp": t_topk / g_topk,
               "fp16_gcomp_ef_over_torch_cast": g_half / t_half}
    print("# top-k: gcomp is %.2fx %s than torch.topk + sort; fp16: gcomp's encode with EF "
          "takes %.2fx the time of torch's plain cast" %
          (max(t_topk / g_topk, g_topk / t_topk), "faster" if g_topk < t_topk else "SLOWER",
           g_half / t_half))
    if args.json:
        with open(args.json, "w") as f:
            for row in results + [summary]:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RuntimeError as e:
        print("torch_peers: %s" % e, file=sys.stderr)
        sys.exit(1)
