"""The host reference of a one-rank compressed allreduce, shared by test_binding_args.py (which
checks it against the MPI engine on the CPU) and tests/test_python_cuda.py (which checks CUDA
tensors against it on a GPU).

With GCOMP_TEST_COMPRESS_ONE_RANK=1 a communicator of one rank runs the compressed schedules.
There, the sum over ranks is this rank's own payload decoded (dense ring: re-encoding a decoded
fp16/bf16 chunk gives it back unchanged; integer ring: scale * codes; sparse gather: the one
payload added to zero) and AVG divides by 1. So the result of step i under key k equals a codec
object's decode(encode(x_i, key=k)), error feedback included, when the codec object has the
communicator's seed and rank 0. torch CPU tensors throughout (float32, float16, bfloat16):
the GPU machine's Python need not have numpy.
"""
import torch

import gcomp

STEPS = 3
SCHEDULES = {"fp16": "dense-ring", "bf16": "dense-ring", "none": "dense-ring",
             "terngrad": "integer-ring", "topk:ratio=0.01": "sparse-gather"}
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def inputs(dtype, n=100003, steps=STEPS, seed=11):
    """steps CPU tensors of n elements of dtype, N(0, 1 + i), from a fixed generator; n odd on
    purpose (ragged chunks)."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, generator=g) * (1 + i)).to(dtype) for i in range(steps)]


def reference(spec, xs, key, seed):
    """decode(encode(x, key)) for each x in order, from one codec object: the results of
    one-rank compressed allreduces (op avg or sum) of xs under key."""
    out = []
    with gcomp.Codec(spec, seed=seed, rank=0, error_feedback=True) as c:
        for x in xs:
            y = torch.empty_like(x)
            c.decode(c.encode(x, key=key), out=y)
            out.append(y)
    return out


def same_bits(a, b):
    """Bitwise equality of two tensors of the same float dtype (NaN payloads included)."""
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    return a.dtype == b.dtype and a.shape == b.shape and \
        torch.equal(a.view(INT_VIEW[a.dtype]), b.view(INT_VIEW[b.dtype]))
