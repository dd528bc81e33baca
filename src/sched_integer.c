/*
 * sched_integer.c — the integer ring (GCOMP_CAP_INTEGER codecs: TernGrad), on the codec's
 * own int_* entries (gcomp_codec.h); the wire format of the sums is the codec's.
 *
 * 1. Each rank computes its local scales of x = g + r; an allreduce-max makes them the same
 *    on every rank (compared as integer bits, so a NaN anywhere wins and reaches every
 *    result). On host fp32 buffers with at most GCOMP__AGREE_SCALES scales (TernGrad's
 *    default: one) the engine computed them before the call and they rode in the call's
 *    agreement (call->agreed_scales); otherwise one small allreduce-max of their own.
 * 2. Reduce-scatter: partial sums of codes travel as exact integers; after m contributions
 *    they are packed by the codec (TernGrad: digits of base 2m+1 in groups, 1.6 bits each for
 *    m = 1, 2.33 for m = 2, 3 for m = 3, 3.5 for m = 4). No value is ever re-quantised. Each
 *    rank ternarises a chunk (with the shared scales, residual fused) just before it needs
 *    its codes, while the previous message is on the wire.
 * 3. Allgather: the final integer sums (m = N) are forwarded unchanged; every rank computes
 *    result = scale * sum (/ N for AVG, in the same pass), so every rank holds the same bits.
 *    Turning one chunk into floats overlaps the transfer of the next.
 *
 * Codes never leave the rank, so a chunk is ternarised on its own (the RNG is keyed by the
 * global element index, so the codes equal those of a whole-tensor encode). Chunks start at
 * multiples of the codec's int_align (TernGrad: the bucket size), so each chunk's buckets are
 * whole. Wire bytes per rank: sum_{m=1}^{N-1} int_sum_bytes(L, m) + (N-1) * int_sum_bytes(L, N)
 * for chunks of L elements (plus 32-byte stage headers with zstd), plus 8 * nb bytes for the
 * scales (counted also when they rode in the agreement); host buffers: 2(N-1) outcome trailers of 16 bytes more (ring.h).
 *
 * Host buffers carry the outcome in the ring's trailers: the non-finite decision follows from
 * the shared scales (the same on every rank), and a failure of a hop (sums that fail their
 * checks) in the reduce-scatter reaches every rank by the end of the allgather. Final sums
 * found corrupt in the allgather (corrupted in transit: MPI guarantees integrity) are found
 * too late to reach every rank; the engine then breaks the communicator on that rank.
 *
 * Device buffers: the codec's CUDA ops (local_scales, ternarise, sums_add_pack, sums_values)
 * on the caller's stream. The scales come back to the host once per call (nb floats: the
 * allreduce-max that shares them runs on host memory) and go back to the device; message
 * sizes are checked on the host against int_sum_bytes, since they are known there. Byte
 * stages (zstd) do not run on device buffers (the engine refuses them before the call).
 */
#include <math.h>
#include <string.h>

#include "schedule.h"

#define PIECE 65536 /* elements ternarised between two progress calls */

typedef struct int_ctx {
    gcomp__call *call;
    size_t nb;        /* number of scales */
    size_t align;     /* chunk boundaries (int_align) */
    size_t piece;     /* elements per ternarised piece: a multiple of align */
    float *scales;    /* shared scales */
    uint64_t *keys;   /* their bits, for the allreduce-max */
    int8_t *t;        /* one chunk of this rank's codes */
    void *scratch;    /* int_sums_values' scratch */
    uint8_t *raw;     /* packed sums after the byte stages are undone (zstd) */
    uint8_t *raw_out; /* packed sums before the byte stages */
    uint8_t *rbuf;    /* the message coming in */
    uint8_t *slots;   /* n message slots of msg_cap bytes */
    size_t *slot_bytes;
    size_t msg_cap;
    int staged;         /* the spec has byte stages after the element codec */
    int write_residual; /* every scale is finite: the residual may be updated */
    /* device buffers only (else hscales == scales) */
    float *hscales;               /* the scales on the host, for the allreduce-max */
    void *dscratch;               /* the codec's local_scales scratch (device) */
    gcomp_cuda_residual *res;     /* the residual block (device) */
    gcomp_cuda_residual *res_tmp; /* the same, written on the host */
} int_ctx;

static void chunk_of(const int_ctx *d, int j, size_t *lo, size_t *hi)
{
    gcomp__chunk(d->call->count, d->call->ring.size, j, d->align, lo, hi);
}

static uint8_t *slot(int_ctx *d, int j) { return d->slots + (size_t)j * (d->msg_cap + GCOMP__RING_TRAILER); }

/* Chunk j's sums of m ranks on the device (no byte stages): int_sum_bytes, known at both ends. */
static size_t device_bytes(const int_ctx *d, int j, uint32_t m)
{
    size_t lo, hi;
    chunk_of(d, j, &lo, &hi);
    return d->call->vt->int_sum_bytes(d->call->params, hi - lo, m);
}

/* Start a ring step that sends chunk send_j's sums (sbytes of them on the host) and receives
 * chunk recv_j's, both of m ranks. Device buffers: sizes known at both ends, also after a
 * local failure. */
static gcomp_result start_step(int_ctx *d, uint8_t *sbuf, size_t sbytes, int send_j, uint8_t *rbuf, int recv_j,
                               uint32_t m)
{
    if (!d->call->on_device) return gcomp__ring_start(&d->call->ring, sbuf, sbytes, rbuf, d->msg_cap);
    return gcomp__ring_start_sized(&d->call->ring, sbuf, device_bytes(d, send_j, m), rbuf, device_bytes(d, recv_j, m));
}

/* The ring's workspace regions; the same sequence in prepare (sizing) and run (carving). */
static void layout(gcomp__call *call, int_ctx *d)
{
    const gcomp_codec_vtable *vt = call->vt;
    gcomp__workspace *ws = call->ws;
    int n = call->ring.size;
    size_t max_chunk;
    memset(d, 0, sizeof *d);
    d->call = call;
    d->nb = vt->num_scales(call->params, call->count);
    d->align = vt->int_align(call->params, call->count);
    if (d->align == 0) d->align = 1;
    d->piece = ((PIECE + d->align - 1) / d->align) * d->align;
    d->staged = gcomp__codec_chain(call->codec)->n_stages > 1;
    max_chunk = gcomp__chunk_max(call->count, n, d->align);
    /* sums of all N ranks are the widest any hop packs (test_sums_format checks it) */
    d->msg_cap = (gcomp__codec_stages_bound(call->codec, vt->int_sum_bytes(call->params, max_chunk, (uint32_t)n)) + 7) &
                 ~(size_t)7;
    d->scales = gcomp__ws_take(ws, d->nb * sizeof(float), "integer: shared scales");
    d->keys = gcomp__ws_take(call->meta, d->nb * sizeof(uint64_t), "integer: scale bits");
    d->scratch = gcomp__ws_take(ws,
                                !call->on_device && vt->int_scratch_bytes
                                    ? vt->int_scratch_bytes(call->params, max_chunk, (uint32_t)n)
                                    : 0,
                                "integer: codec scratch");
    d->t = gcomp__ws_take(ws, max_chunk * sizeof(int8_t), "integer: codes");
    d->raw = gcomp__ws_take(ws, d->staged ? d->msg_cap : 0, "integer: unstaged sums in");
    d->raw_out = gcomp__ws_take(ws, d->staged ? d->msg_cap : 0, "integer: unstaged sums out");
    d->rbuf = gcomp__ws_take(ws, d->msg_cap + GCOMP__RING_TRAILER, "integer: incoming message");
    d->slots = gcomp__ws_take(ws, (size_t)n * (d->msg_cap + GCOMP__RING_TRAILER), "integer: message slots");
    d->slot_bytes = gcomp__ws_take(call->meta, (size_t)n * sizeof(size_t), "integer: message sizes");
    d->hscales = d->scales;
    if (!call->on_device) return;
    d->hscales = gcomp__ws_take(call->meta, d->nb * sizeof(float), "integer: shared scales (host)");
    d->dscratch = gcomp__ws_take(ws, gcomp__call_scratch_bytes(call, call->count, 1), "integer: scale scratch");
    d->res = gcomp__ws_take(ws, sizeof(gcomp_cuda_residual), "integer: residual block");
    d->res_tmp = gcomp__ws_take(call->meta, sizeof(gcomp_cuda_residual), "integer: residual block (host)");
}

static gcomp_result int_prepare(gcomp__call *call)
{
    int_ctx d;
    layout(call, &d);
    return GCOMP_SUCCESS;
}

/* d->keys = this rank's local scales as |float bits| (an integer max of them is exact, and
 * a NaN, the largest, wins). */
static gcomp_result local_scale_bits(int_ctx *d)
{
    gcomp__call *call = d->call;
    gcomp_encode_ctx ctx = { 0 };
    double t0 = gcomp__now();
    if (call->on_device) { /* on the device, then the nb scales to the host (one wait) */
        size_t zero = 0;
        GCOMP_CHECK(gcomp__call_res_blocks(call, 1, &zero, d->res_tmp, d->res));
        GCOMP_CHECK(GCOMP_CODEC_CALL(
            call->vt, cuda->local_scales,
            (call->params, call->x, call->r_in ? d->res : NULL, call->count, d->scales, d->dscratch, call->stream)));
        GCOMP_CHECK(gcomp__call_to_host(call, d->hscales, d->scales, d->nb * sizeof(float)));
    } else {
        GCOMP_CHECK(GCOMP_CODEC_CALL(call->vt, local_scales,
                                     (call->params, &ctx, call->x, call->r_in, call->count, d->scales)));
    }
    call->ring.st->encode_s += gcomp__now() - t0;
    gcomp__scale_bits(d->hscales, d->nb, d->keys);
    return GCOMP_SUCCESS;
}

static gcomp_result shared_scales(int_ctx *d)
{
    gcomp__call *call = d->call;
    if (call->agreed_scales) { /* shared already, in the call's agreement (engine.c) */
        memcpy(d->keys, call->agreed_scales, d->nb * sizeof *d->keys);
        call->ring.st->wire_bytes += 8 * d->nb;
    } else {
        GCOMP_CHECK(local_scale_bits(d));
        GCOMP_CHECK(gcomp__ring_max_u64(&call->ring, d->keys, d->nb));
    }
    d->write_residual = 1;
    for (size_t j = 0; j < d->nb; j++) {
        uint32_t b = (uint32_t)d->keys[j];
        memcpy(&d->hscales[j], &b, 4);
        /* a scale whose N-fold sum overflows would give an infinite result after the
         * in-place residual was written: treat it as non-finite too */
        if (!isfinite(d->hscales[j] * (float)call->ring.size)) d->write_residual = 0;
    }
    call->ring.nonfinite = !d->write_residual;
    return gcomp__call_to_device(call, d->scales, d->hscales, d->nb * sizeof(float));
}

/* d->t = this rank's codes of chunk j, ternarised piece by piece with the shared scales
 * (residual fused), letting the transfer in flight progress between pieces. */
static gcomp_result ternarise_chunk(int_ctx *d, int j)
{
    gcomp__call *call = d->call;
    size_t lo, hi;
    double t0 = gcomp__now();
    chunk_of(d, j, &lo, &hi);
    for (size_t a = lo; a < hi; a += d->piece) {
        size_t m = hi - a < d->piece ? hi - a : d->piece;
        gcomp_encode_ctx ctx = gcomp__call_ctx(call, a);
        if (call->on_device) /* a non-finite scale: the kernel leaves the residual alone */
            GCOMP_CHECK(GCOMP_CODEC_CALL(call->vt, cuda->ternarise,
                                         (call->params, &ctx, call->x, call->r_in ? d->res : NULL, m, d->scales,
                                          d->t + (a - lo), call->status, call->stream)));
        else
            GCOMP_CHECK(GCOMP_CODEC_CALL(call->vt, int_ternarise,
                                         (call->params, &ctx, call->x, call->r_in,
                                          d->write_residual ? call->r_out : NULL, m, d->scales, d->t + (a - lo))));
        gcomp__ring_progress(&call->ring);
    }
    call->ring.st->encode_s += gcomp__now() - t0;
    return GCOMP_SUCCESS;
}

/* Device buffers: a message of sums must have exactly the size int_sum_bytes says (the
 * kernels read that many bytes); the host knows both. */
static gcomp_result check_sums_size(const int_ctx *d, size_t n, uint32_t m, size_t bytes)
{
    size_t want = d->call->vt->int_sum_bytes(d->call->params, n, m);
    if (bytes != want)
        return gcomp__fail(GCOMP_ERR_CORRUPT, "%s: %zu bytes of sums for %zu elements of %u ranks, expected %zu",
                           d->call->vt->name, bytes, n, m, want);
    return GCOMP_SUCCESS;
}

/* hop and finish on the device: the kernel, then its status folded into the call's tally. */
static gcomp_result hop_device(int_ctx *d, int j, size_t n, const uint8_t *in, size_t in_bytes, uint32_t m_in)
{
    gcomp__call *call = d->call;
    if (m_in) GCOMP_CHECK(check_sums_size(d, n, m_in, in_bytes));
    GCOMP_CHECK(call->dev->memset_async(call->status, 0, sizeof *call->status, call->stream));
    GCOMP_CHECK(
        GCOMP_CODEC_CALL(call->vt, cuda->sums_add_pack, (in, m_in, d->t, n, slot(d, j), call->status, call->stream)));
    d->slot_bytes[j] = call->vt->int_sum_bytes(call->params, n, m_in + 1);
    return call->dev->status_fold(call->status, call->tally, call->stream);
}

static gcomp_result finish_device(int_ctx *d, size_t lo, size_t n, const uint8_t *src, size_t bytes)
{
    gcomp__call *call = d->call;
    uint32_t m = (uint32_t)call->ring.size;
    GCOMP_CHECK(check_sums_size(d, n, m, bytes));
    GCOMP_CHECK(call->dev->memset_async(call->status, 0, sizeof *call->status, call->stream));
    GCOMP_CHECK(GCOMP_CODEC_CALL(
        call->vt, cuda->sums_values,
        (call->params, src, lo, n, m, d->scales, call->divisor, call->result + lo, call->status, call->stream)));
    return call->dev->status_fold(call->status, call->tally, call->stream);
}

/* One hop: the slot of chunk j := (sums of m_in ranks in `in`) + d->t, packed for m_in + 1
 * ranks and passed through the byte stages. */
static gcomp_result hop(int_ctx *d, int j, const uint8_t *in, size_t in_bytes, uint32_t m_in)
{
    gcomp__call *call = d->call;
    gcomp_codec *codec = call->codec;
    size_t lo, hi, raw_bytes, n;
    uint8_t *dst;
    const uint8_t *src = in;
    double t0 = gcomp__now();
    chunk_of(d, j, &lo, &hi);
    n = hi - lo;
    if (call->on_device) {
        GCOMP_CHECK(hop_device(d, j, n, in, in_bytes, m_in));
        call->ring.st->encode_s += gcomp__now() - t0;
        return GCOMP_SUCCESS;
    }
    if (m_in && d->staged) {
        GCOMP_CHECK(gcomp__codec_stages_decode(codec, in, in_bytes, n, d->raw,
                                               call->vt->int_sum_bytes(call->params, n, m_in), &in_bytes));
        src = d->raw;
    }
    raw_bytes = call->vt->int_sum_bytes(call->params, n, m_in + 1);
    dst = d->staged ? d->raw_out : slot(d, j);
    GCOMP_CHECK(GCOMP_CODEC_CALL(call->vt, int_sums_add_pack, (call->params, src, in_bytes, m_in, d->t, n, dst)));
    if (d->staged)
        GCOMP_CHECK(gcomp__codec_stages_encode(codec, d->raw_out, raw_bytes, n, slot(d, j), d->msg_cap, &raw_bytes));
    d->slot_bytes[j] = raw_bytes;
    call->ring.st->encode_s += gcomp__now() - t0;
    return GCOMP_SUCCESS;
}

/* result[chunk j] = scale * (final sum of N ranks) / divisor, every rank (the owner too)
 * from the same packed bytes. */
static gcomp_result finish(int_ctx *d, int j)
{
    gcomp__call *call = d->call;
    uint32_t n_ranks = (uint32_t)call->ring.size;
    size_t lo, hi, bytes = d->slot_bytes[j];
    const uint8_t *src = slot(d, j);
    double t0 = gcomp__now();
    chunk_of(d, j, &lo, &hi);
    if (d->staged) {
        GCOMP_CHECK(gcomp__codec_stages_decode(call->codec, src, bytes, hi - lo, d->raw,
                                               call->vt->int_sum_bytes(call->params, hi - lo, n_ranks), &bytes));
        src = d->raw;
    }
    if (call->on_device)
        GCOMP_CHECK(finish_device(d, lo, hi - lo, src, bytes));
    else
        GCOMP_CHECK(GCOMP_CODEC_CALL(
            call->vt, int_sums_values,
            (call->params, src, bytes, lo, hi - lo, n_ranks, d->scales, call->divisor, call->result + lo, d->scratch)));
    gcomp__ring_progress(&call->ring);
    call->divided = 1;
    call->ring.st->decode_s += gcomp__now() - t0;
    return GCOMP_SUCCESS;
}

static gcomp_result int_run(gcomp__call *call)
{
    gcomp__ring *ring = &call->ring;
    int n = ring->size, r = ring->rank, prev;
    size_t rbytes;
    int_ctx d;

    layout(call, &d);
    GCOMP_CHECK(gcomp__ws_check(call->ws));
    GCOMP_CHECK(shared_scales(&d));

    /* reduce-scatter: the chunk received at step s holds s + 1 ranks' sums; this rank adds
     * its codes and forwards s + 2. After N-1 steps the slot of (r + 1) % N holds all N. */
    d.slot_bytes[r] = 0;
    GCOMP_STEP(ring, ternarise_chunk(&d, r));
    GCOMP_STEP(ring, hop(&d, r, NULL, 0, 0));
    for (int s = 0; s < n - 1; s++) {
        int send_j = gcomp__ring_rel(ring, -s), recv_j = gcomp__ring_rel(ring, -s - 1);
        GCOMP_CHECK(start_step(&d, slot(&d, send_j), d.slot_bytes[send_j], send_j, d.rbuf, recv_j, (uint32_t)(s + 1)));
        GCOMP_STEP(ring, ternarise_chunk(&d, recv_j)); /* while the message travels */
        GCOMP_CHECK(gcomp__ring_finish(ring, &rbytes));
        GCOMP_STEP(ring, hop(&d, recv_j, d.rbuf, rbytes, (uint32_t)(s + 1)));
    }
    /* allgather: the final sums are forwarded unchanged; every rank (the owner too) turns
     * the same packed bytes into scale * sum, one chunk while the next travels */
    prev = gcomp__ring_right(ring);
    for (int s = 0; s < n - 1; s++) {
        int send_j = gcomp__ring_rel(ring, 1 - s), recv_j = gcomp__ring_rel(ring, -s);
        GCOMP_CHECK(start_step(&d, slot(&d, send_j), d.slot_bytes[send_j], send_j, slot(&d, recv_j), recv_j, (uint32_t)n));
        GCOMP_STEP(ring, finish(&d, prev));
        GCOMP_CHECK(gcomp__ring_finish(ring, &d.slot_bytes[recv_j]));
        prev = recv_j;
    }
    GCOMP_STEP(ring, finish(&d, prev));
    /* every value is scale * sum / divisor with |sum| <= N: finite when every scale times N
     * is (write_residual), so the engine need not read the result again to find out */
    call->finite = !call->on_device && d.write_residual;
    return GCOMP_SUCCESS;
}

const gcomp__sched gcomp__sched_integer = { GCOMP_SCHED_INTEGER, "integer-ring", int_prepare, int_run };
