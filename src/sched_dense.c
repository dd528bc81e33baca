/*
 * sched_dense.c — the dense ring for codecs whose values can be summed after decoding
 * (none, fp16, bf16; and top-k's payloads decoded, when a gather would cost more).
 *
 * Each rank encodes each of its N chunks once (error feedback fused, so the residual keeps
 * what this first rounding dropped). Reduce-scatter, N-1 steps: send a chunk's payload to
 * the right, receive the left neighbour's partial sum of the next chunk, decode it, add this
 * rank's own decoded chunk in fp32 and re-encode. The rank then owns one fully reduced
 * chunk, encodes it a last time, and the allgather forwards those final payloads unchanged.
 * Every rank -- the owner included -- takes each result chunk from decoding its final
 * payload, so all ranks hold the same bits.
 *
 * Overlap, as in the integer ring: only the first chunk this rank sends is encoded before
 * the ring starts; its own encode of the chunk a step receives runs while that step's
 * message travels, and in the allgather each chunk is decoded into the result while the
 * next one travels. Neither moves an operation across another on the same element (every
 * element still gets 0 + received, + own, re-encode), so the result bits and the wire
 * bytes are those of the unpipelined ring.
 *
 * One rank (a test switch runs the compressed schedules there): the rank's own payload,
 * decoded, is the whole sum; it is re-encoded and decoded as the final chunk, as above.
 *
 * Device buffers: the same steps through sched_codec.c (the codec's kernels on the caller's
 * stream); each own chunk's residual slice is a block in device memory, written once per call.
 *
 * Host buffers: every message ends with the ring's outcome trailer (ring.h). What this rank
 * must tell the others is known in time for it to reach all of them: a failure or a
 * non-finite value of its own encodes -- the last one runs during reduce-scatter step N-2,
 * so its news rides at the latest in the first allgather message, message N-1 of 2(N-1) --
 * and a payload that fails its checks in the reduce-scatter. The result is decoded from the
 * same final payloads on every rank, so its non-finite check (after narrowing to f16/bf16
 * too) gives the same answer everywhere without being sent. Only a final payload found
 * corrupt in the allgather (corrupted in transit: MPI guarantees integrity) is found too late
 * to reach every rank; the engine then breaks the communicator on the rank that found it.
 *
 * Wire bytes per rank: the sum over 2(N-1) steps of one chunk's payload (header included),
 * about 2(N-1)/N * count * (bytes per element of the codec) + 2(N-1) * 32; host buffers:
 * 2(N-1) trailers of 16 bytes more.
 */
#include <string.h>

#include "schedule.h"

#define DENSE_ALIGN 64 /* chunk boundaries on cache lines */

typedef struct dense_ctx {
    gcomp__call *call;
    size_t bound;   /* payload capacity of one chunk */
    size_t stride;  /* bytes per slot: bound and the ring's trailer room */
    uint8_t *slots; /* N payloads of `bound` bytes: own chunks, later final chunks */
    size_t *bytes;  /* their sizes (host) */
    float *acc;     /* fp32 running sums, count elements */
    uint8_t *sbuf;  /* a re-encoded partial sum on its way out */
    uint8_t *rbuf;  /* a partial sum coming in */
    /* device buffers only */
    void *scratch;                /* the codec's encode scratch */
    gcomp_cuda_residual *res;     /* N residual blocks, one per own chunk (device) */
    gcomp_cuda_residual *res_tmp; /* the same, written on the host */
    size_t *lo;                   /* each chunk's first element (host) */
} dense_ctx;

static uint8_t *slot(dense_ctx *d, int j) { return d->slots + (size_t)j * d->stride; }

static void chunk_of(const dense_ctx *d, int j, size_t *lo, size_t *hi)
{
    gcomp__chunk(d->call->count, d->call->ring.size, j, DENSE_ALIGN, lo, hi);
}

/* A chunk's payload size on the device: the codec's bound (the device encode checks it). */
static size_t device_bytes(const dense_ctx *d, int j)
{
    size_t lo, hi;
    chunk_of(d, j, &lo, &hi);
    return gcomp_codec_max_encoded_bytes(d->call->codec, hi - lo);
}

/* Start a ring step that sends chunk send_j's payload (sbytes of it on the host) and receives
 * chunk recv_j's. Device buffers: both ends know every size, also after a local failure. */
static gcomp_result start_step(dense_ctx *d, uint8_t *sbuf, size_t sbytes, int send_j, uint8_t *rbuf, int recv_j)
{
    if (!d->call->on_device) return gcomp__ring_start(&d->call->ring, sbuf, sbytes, rbuf, d->bound);
    return gcomp__ring_start_sized(&d->call->ring, sbuf, device_bytes(d, send_j), rbuf, device_bytes(d, recv_j));
}

/* The ring's workspace regions; the same sequence in prepare (sizing) and run (carving). */
static void layout(gcomp__call *call, dense_ctx *d)
{
    int n = call->ring.size;
    size_t max_chunk = gcomp__chunk_max(call->count, n, DENSE_ALIGN);
    d->call = call;
    d->bound = gcomp_codec_max_encoded_bytes(call->codec, max_chunk);
    d->bound = (d->bound + 7) & ~(size_t)7; /* every slot 8-byte aligned */
    d->stride = d->bound + GCOMP__RING_TRAILER;
    d->slots = gcomp__ws_take(call->ws, (size_t)n * d->stride, "dense: chunk payloads");
    d->bytes = gcomp__ws_take(call->meta, (size_t)n * sizeof(size_t), "dense: payload sizes");
    d->acc = gcomp__ws_take(call->ws, call->count * sizeof(float), "dense: partial sums");
    d->sbuf = gcomp__ws_take(call->ws, d->stride, "dense: outgoing partial sum");
    d->rbuf = gcomp__ws_take(call->ws, d->stride, "dense: incoming partial sum");
    d->scratch = d->res = d->res_tmp = NULL;
    d->lo = NULL;
    if (!call->on_device) return;
    d->scratch = gcomp__ws_take(call->ws, gcomp__call_scratch_bytes(call, max_chunk, 1), "dense: codec scratch");
    d->res = gcomp__ws_take(call->ws, (size_t)n * sizeof(gcomp_cuda_residual), "dense: residual blocks");
    d->res_tmp = gcomp__ws_take(call->meta, (size_t)n * sizeof(gcomp_cuda_residual), "dense: residual blocks (host)");
    d->lo = gcomp__ws_take(call->meta, (size_t)n * sizeof(size_t), "dense: chunk starts");
}

static gcomp_result dense_prepare(gcomp__call *call)
{
    dense_ctx d;
    layout(call, &d);
    return GCOMP_SUCCESS;
}

static gcomp_result encode_chunk(dense_ctx *d, const float *src, int j, int own, uint8_t *out, size_t *bytes)
{
    gcomp__call *call = d->call;
    size_t lo, hi;
    gcomp_encode_ctx ctx;
    double t0 = gcomp__now();
    chunk_of(d, j, &lo, &hi);
    ctx = gcomp__call_ctx(call, lo);
    GCOMP_CHECK(gcomp__call_encode(call, &ctx, src, lo, hi - lo, own, d->res ? &d->res[j] : NULL, d->scratch, out,
                                   d->bound, bytes));
    call->ring.nonfinite |= own ? (int)ctx.nonfinite : 0;
    call->ring.st->overflow_count += ctx.overflow;
    call->ring.st->encode_s += gcomp__now() - t0;
    return GCOMP_SUCCESS;
}

/* dst[chunk j] = decode(payload), or += when add. */
static gcomp_result decode_chunk(dense_ctx *d, const uint8_t *payload, size_t bytes, int j, float *dst, int add)
{
    size_t lo, hi;
    double t0 = gcomp__now();
    chunk_of(d, j, &lo, &hi);
    if (add)
        GCOMP_CHECK(gcomp__call_decode_add(d->call, payload, bytes, dst + lo, hi - lo));
    else
        GCOMP_CHECK(gcomp__call_decode(d->call, payload, bytes, dst + lo, hi - lo));
    d->call->ring.st->decode_s += gcomp__now() - t0;
    return GCOMP_SUCCESS;
}

/* Reduce-scatter. Step s receives chunk r-s-1; this rank's own payload of that chunk is
 * encoded while the step's message travels (it is read only after the message is in). */
static gcomp_result reduce_scatter(dense_ctx *d)
{
    gcomp__call *call = d->call;
    gcomp__ring *ring = &call->ring;
    int n = ring->size, r = ring->rank, own = !call->reencoded;
    size_t sbytes, rbytes = 0;
    uint8_t *out = slot(d, r);
    GCOMP_STEP(ring, encode_chunk(d, call->x, r, own, slot(d, r), &d->bytes[r]));
    sbytes = d->bytes[r];
    for (int s = 0; s < n - 1; s++) {
        int recv_j = gcomp__ring_rel(ring, -s - 1);
        GCOMP_CHECK(start_step(d, out, sbytes, gcomp__ring_rel(ring, -s), d->rbuf, recv_j));
        gcomp__ring_progress(ring);
        GCOMP_STEP(ring, encode_chunk(d, call->x, recv_j, own, slot(d, recv_j), &d->bytes[recv_j]));
        gcomp__ring_progress(ring);
        GCOMP_CHECK(gcomp__ring_finish(ring, &rbytes));
        GCOMP_STEP(ring, decode_chunk(d, d->rbuf, rbytes, recv_j, d->acc, 0));
        GCOMP_STEP(ring, decode_chunk(d, slot(d, recv_j), d->bytes[recv_j], recv_j, d->acc, 1));
        if (s + 1 < n - 1) { /* re-encode the partial sum for the next hop */
            GCOMP_STEP(ring, encode_chunk(d, d->acc, recv_j, 0, d->sbuf, &sbytes));
            out = d->sbuf;
        }
    }
    if (n == 1) /* a ring of one: the own payload is the whole sum */
        GCOMP_STEP(ring, decode_chunk(d, slot(d, r), d->bytes[r], r, d->acc, 0));
    return GCOMP_SUCCESS;
}

/* Allgather: step s forwards chunk r+1-s and receives chunk r-s; the chunk that arrived
 * last (the owned one at first) is decoded into the result while the next travels. */
static gcomp_result allgather(dense_ctx *d)
{
    gcomp__ring *ring = &d->call->ring;
    int n = ring->size, prev = gcomp__ring_right(ring);
    for (int s = 0; s < n - 1; s++) {
        int send_j = gcomp__ring_rel(ring, 1 - s), recv_j = gcomp__ring_rel(ring, -s);
        GCOMP_CHECK(start_step(d, slot(d, send_j), d->bytes[send_j], send_j, slot(d, recv_j), recv_j));
        gcomp__ring_progress(ring);
        GCOMP_STEP(ring, decode_chunk(d, slot(d, prev), d->bytes[prev], prev, d->call->result, 0));
        gcomp__ring_progress(ring);
        GCOMP_CHECK(gcomp__ring_finish(ring, &d->bytes[recv_j]));
        prev = recv_j;
    }
    GCOMP_STEP(ring, decode_chunk(d, slot(d, prev), d->bytes[prev], prev, d->call->result, 0));
    return GCOMP_SUCCESS;
}

static gcomp_result dense_run(gcomp__call *call)
{
    gcomp__ring *ring = &call->ring;
    int own = gcomp__ring_right(ring);
    dense_ctx d;
    layout(call, &d);
    GCOMP_CHECK(gcomp__ws_check(call->ws));
    memset(d.bytes, 0, (size_t)ring->size * sizeof(size_t));
    if (d.res && !call->reencoded) {
        for (int j = 0; j < ring->size; j++) {
            size_t hi;
            chunk_of(&d, j, &d.lo[j], &hi);
        }
        GCOMP_STEP(ring, gcomp__call_res_blocks(call, ring->size, d.lo, d.res_tmp, d.res));
    }
    GCOMP_CHECK(reduce_scatter(&d));
    GCOMP_STEP(ring, encode_chunk(&d, d.acc, own, 0, slot(&d, own), &d.bytes[own]));
    GCOMP_CHECK(allgather(&d));
    return GCOMP_SUCCESS;
}

const gcomp__sched gcomp__sched_dense = { GCOMP_SCHED_DENSE, "dense-ring", dense_prepare, dense_run };
