/*
 * schedule.h — the schedules: a table of {id, name, prepare, run} that the engine indexes by
 * gcomp_schedule (engine.c), and the call struct every schedule sees. A schedule sees the
 * ring, the codec object and its element codec's table, the workspace, the device and the
 * buffers -- never the communicator -- and calls neither the engine nor another schedule
 * (the engine's planner composes sparse-as-dense from an encode and the dense schedule).
 *
 *   sched_dense.c    the dense ring (summable codecs: none, fp16, bf16; top-k as dense)
 *   sched_doubling.c recursive doubling (summable codecs: every call at N = 2, small ones at 4, 8, ...)
 *   sched_integer.c  the integer ring (GCOMP_CAP_INTEGER: the codec's int_* entries)
 *   sched_sparse.c   the sparse gather (GCOMP_CAP_SPARSE: sparse_* entries, or decode-add)
 */
#ifndef GCOMP_SCHEDULE_H
#define GCOMP_SCHEDULE_H

#include <limits.h>
#include <string.h>

#include "codec_internal.h"
#include "ring.h"
#include "workspace.h"

typedef struct gcomp__call {
    gcomp__ring ring;
    gcomp_codec *codec;           /* the codec object: chain, byte stages, payload headers */
    const gcomp_codec_vtable *vt; /* its element codec (vt->cuda: its ops on device memory) */
    const void *params;           /* the element codec's parameters */
    gcomp__workspace *ws;         /* memory of the buffers' device: everything elements live in */
    gcomp__workspace *meta;       /* host memory for the call's bookkeeping (sizes, lists, scale
                                   * bits); the same workspace as ws for host buffers */
    const gcomp__device_ops *dev; /* the device layer's ops of the buffers' memory */
    int on_device;                /* dev is not the host's: the device path below */
    struct CUstream_st *stream;   /* device buffers: the caller's stream; every device op goes on it */
    gcomp_cuda_status *status;    /* device buffers: the status block of the call's device steps */
    gcomp__device_tally *tally;   /* device buffers: what those steps found (errors, non-finite
                                   * encodes), read back once at the end of the call */
    uint64_t seed;
    const float *x; /* fp32 input (pre-scaled for AVG on the dense ring and recursive doubling) */
    float *result;  /* fp32 output, count elements */
    size_t count;
    float *r_in, *r_out; /* residual of the key, NULL without error feedback */
    const uint64_t *agreed_scales; /* the integer ring's shared scales (|float bits|, max over
                                    * ranks), agreed with the call (engine.c), or NULL: the
                                    * ring computes and shares them itself */
    uint64_t step;
    float divisor; /* AVG on the integer and sparse schedules: result = sum / divisor (else 1) */
    int divided;   /* the schedule applied divisor in its last pass over the result */
    int finite;    /* host fp32 result: the schedule knows it holds no Inf or NaN, so the
                    * engine skips its pass over the result looking for one */
    int reencoded; /* x is already a decoded payload (sparse-as-dense): the dense ring's
                         * first encode neither keeps a residual nor reports non-finite */
} gcomp__call;

/* prepare lays out the call's workspace regions while the workspace is sizing (before the
 * ranks agree, so a failed allocation becomes an error on every rank); run lays them out
 * again, carving, and allocates nothing. Transport failures return at once; local failures
 * go to call->ring.error (GCOMP_STEP). run == NULL: the engine runs it itself. */
typedef struct gcomp__sched {
    gcomp_schedule id;
    const char *name;
    gcomp_result (*prepare)(gcomp__call *call);
    gcomp_result (*run)(gcomp__call *call);
} gcomp__sched;

extern const gcomp__sched gcomp__sched_dense;
extern const gcomp__sched gcomp__sched_integer;
extern const gcomp__sched gcomp__sched_sparse;
extern const gcomp__sched gcomp__sched_doubling;

/* Recursive doubling's limit (engine.c) at a power-of-two N >= 4 (at 2 ranks it takes every
 * dense call up to GCOMP__PAIR_MAX_BYTES: sched_doubling.c): calls whose elements encode to at most this many bytes (the
 * element codec's body, headers aside: 16 Ki elements of fp16 or bf16, 8 Ki of none). Doubling sends log2 N / (2(N-1)/N) times the ring's bytes
 * (4/3 at N = 4, 12/7 at 8) and saves 2(N-1) - log2 N hops, so its gain depends on the link:
 * measured at N = 4 (docs/BENCHMARKS.md, "Round trips per call"), exchanges of 32 KiB gain on
 * shared memory, at 10 Gbit/s and at 1 Gbit/s, of 64 KiB lose at 1 Gbit/s; on shared memory
 * doubling wins up to 128 KiB exchanges. At more ranks it saves more hops per extra byte, so
 * the limit measured at 4 is conservative there. The element cap keeps a codec of few bits
 * per element (a user's summable codec) off doubling for large counts: each step decodes and
 * re-encodes the whole count, which costs CPU where the ring handles a chunk. */
#define GCOMP__DOUBLING_MAX_BYTES 32768
#define GCOMP__DOUBLING_MAX_COUNT 16384
/* At 2 ranks doubling sends the whole payload in one message, and an MPI message holds at
 * most INT_MAX bytes (its count is an int): larger payloads (over a billion fp16 elements)
 * take the dense ring, whose messages carry half of it. */
#define GCOMP__PAIR_MAX_BYTES ((size_t)INT_MAX - GCOMP__RING_TRAILER - 8)

/* ---- the element codec and memory on the call's device (sched_codec.c) ----
 * One function per thing a schedule does to element memory, for host and device buffers
 * alike: host buffers take the codec object's CPU path and plain memory, device buffers the
 * codec's CUDA ops and the device layer, every step enqueued on call->stream. Device errors
 * found by kernels (a corrupt payload) land in call->tally and reach the engine at the end. */

/* Device codec scratch for an encode of count elements, the integer ring's local scales, or
 * the sparse gather's sum of n payloads (count and n as the schedule will call them); 0 for
 * host buffers (the codec object keeps its own). */
size_t gcomp__call_scratch_bytes(const gcomp__call *call, size_t count, int n);

/* Device buffers give the kernels a key's residual as a block in device memory: dev[i]
 * describes the residual slice from element lo[i] on (the call's r_in/r_out and step), written
 * from host_tmp (the call's meta memory) in one copy. Host buffers: nothing to do. */
gcomp_result gcomp__call_res_blocks(gcomp__call *call, int n, const size_t *lo, gcomp_cuda_residual *host_tmp,
                                    gcomp_cuda_residual *dev);

/* out = payload of x[lo, lo + n) (header included, *bytes of it), encoded with the call's
 * residual slice when with_residual (res_block: that slice's block, device buffers) and ctx
 * (ctx->nonfinite and ctx->overflow reported on the host; the device's go to the tally).
 * scratch: gcomp__call_scratch_bytes of device memory (NULL for host buffers). */
gcomp_result gcomp__call_encode(gcomp__call *call, gcomp_encode_ctx *ctx, const float *x, size_t lo, size_t n,
                                int with_residual, const gcomp_cuda_residual *res_block, void *scratch, uint8_t *out,
                                size_t cap, size_t *bytes);
/* acc[0..n) += decode(payload of `bytes` bytes). */
gcomp_result gcomp__call_decode_add(gcomp__call *call, const void *payload, size_t bytes, float *acc, size_t n);
/* dst[0..n) = decode(payload): the bits of zeroing dst and decode-adding, in one pass for the
 * cast codecs on host buffers (gcomp_codec_decode). */
gcomp_result gcomp__call_decode(gcomp__call *call, const void *payload, size_t bytes, float *dst, size_t n);
/* dst[0..n) = decode(first) + decode(second), first's added first: one pass for the cast
 * codecs on host buffers (gcomp__codec_decode_sum2), else zero and two decode-adds. */
gcomp_result gcomp__call_decode_sum2(gcomp__call *call, const void *first, size_t fbytes, const void *second,
                                     size_t sbytes, float *dst, size_t n);
/* bytes of dst := 0. */
gcomp_result gcomp__call_zero(gcomp__call *call, void *dst, size_t bytes);
/* Copies between the buffers' memory and the call's host memory: to_host waits for the
 * copy (within the call's deadline); to_device only enqueues it (src must stay until the
 * call ends). Host buffers: a plain copy. */
gcomp_result gcomp__call_to_host(gcomp__call *call, void *dst, const void *src, size_t bytes);
gcomp_result gcomp__call_to_device(gcomp__call *call, void *dst, const void *src, size_t bytes);
/* Wait for the call's device work (within its deadline); host buffers: nothing to wait for. */
gcomp_result gcomp__call_wait(gcomp__call *call);
/* The same for work on `stream` of the device ops dev (within the call's deadline). */
gcomp_result gcomp__call_wait_on(const gcomp__call *call, const gcomp__device_ops *dev, struct CUstream_st *stream);

/* bits[j] = |scales[j]| as its float bits, j < n: an integer max of them is the max of the
 * magnitudes, exact, with a NaN (the largest) winning (the integer ring's shared scales). */
static inline void gcomp__scale_bits(const float *scales, size_t n, uint64_t *bits)
{
    for (size_t j = 0; j < n; j++) {
        uint32_t b;
        memcpy(&b, &scales[j], 4);
        bits[j] = b & 0x7fffffffu;
    }
}

/* The encode context of a call for elements from `offset` on. */
static inline gcomp_encode_ctx gcomp__call_ctx(const gcomp__call *call, size_t offset)
{
    gcomp_encode_ctx ctx = { 0 };
    ctx.seed = call->seed;
    ctx.step = call->step;
    ctx.rank = (uint32_t)call->ring.rank;
    ctx.offset = offset;
    return ctx;
}

#endif
