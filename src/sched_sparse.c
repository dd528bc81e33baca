/*
 * sched_sparse.c — the sparse gather (GCOMP_CAP_SPARSE codecs: top-k).
 *
 * Each rank encodes its whole tensor once (residual fused): a payload of k (index, value)
 * pairs. A ring allgather forwards every rank's payload unchanged (N-1 steps), and every
 * rank sums the N payloads in rank order into a zeroed result, so all ranks hold the same
 * bits. A codec with the sparse_* entries (top-k) has each payload turned into an (index,
 * value) list while the next one travels, and the lists summed in one ordered pass. Sparse payloads do not shrink
 * when summed, so a gather sends (N-1) payloads per rank; when that would exceed what a
 * dense fp32 ring sends, the engine's planner runs sparse-as-dense instead (engine.c).
 *
 * Device buffers: the codec's CUDA ops; the payloads' headers are checked against the sizes
 * that arrived, then the codec's sum_payloads kernel sums all N in rank order at the end (or,
 * without it, decode-add in rank order). The encoded size depends on the data: it is read
 * back once per call (one wait on the stream), before the gather starts.
 *
 * Host buffers: every message ends with the ring's outcome trailer (ring.h); the encode (the
 * only step that can fail or see a non-finite value without a corrupted payload) runs before
 * the first message, so its news reaches every rank in the N-1 steps; one more step carries
 * the trailer alone so that a failure found in the first message (a payload corrupted on
 * its first hop) also reaches that payload's sender. A payload corrupted on a later hop --
 * impossible over MPI, which guarantees integrity -- is found too late to reach every rank:
 * the engine then breaks the communicator on the rank that found it (engine.c).
 *
 * Wire bytes per rank: the sum of the N-1 payloads it forwards, each 32 + 8 + k * (value
 * bytes) + about k * log2(count / k) / 8 bytes of index gaps; host buffers: N trailers of 16
 * bytes more.
 */
#include <string.h>

#include "schedule.h"

typedef struct sparse_ctx {
    gcomp__call *call;
    int pairs;              /* the pair-list path (else decode-add in rank order) */
    size_t k;               /* pairs per payload (pair path) */
    size_t bound;           /* capacity of one payload slot */
    size_t stride;          /* bytes per slot: bound and the ring's trailer room */
    uint8_t *slots;         /* n payloads */
    uint8_t *hop;           /* the outcome hop's two trailers */
    size_t *bytes;          /* their sizes */
    gcomp_pair_list *lists; /* pair path: n list heads */
    uint64_t *idx;          /* n x k indices */
    float *val;             /* n x k values */
    /* device buffers only */
    void *scratch;                /* the codec's scratch: encode, or sum_payloads of n */
    gcomp_cuda_residual *res;     /* the residual block (device) */
    gcomp_cuda_residual *res_tmp; /* the same, written on the host */
    const uint8_t **ptrs;         /* the n payloads' addresses, for sum_payloads (device) */
    const uint8_t **ptrs_tmp;     /* the same, written on the host */
} sparse_ctx;

/* A codec with the sparse_* entries has its payloads decoded to (index, value) lists as they
 * arrive, and the lists summed into the result in one ordered pass at the end; without them
 * (or past GCOMP_SPARSE_MAX_LISTS ranks) the gather goes through decode_add. */
static int pairs_path(const gcomp__call *call)
{
    if (call->on_device) return 0;
    return call->vt->sparse_sum_pairs && call->ring.size <= GCOMP_SPARSE_MAX_LISTS;
}

/* Device buffers: the codec's kernel sums every payload at once (else decode-add in order). */
static int device_sum(const gcomp__call *call) { return call->on_device && call->vt->cuda->sum_payloads; }

/* a * b * c, or SIZE_MAX when that does not fit: a workspace region that large fails its fit
 * (GCOMP_ERR_NOMEM) instead of a wrapped product carving a region too small for its use. */
static size_t product(size_t a, size_t b, size_t c)
{
    if (b && a > SIZE_MAX / b) return SIZE_MAX;
    if (c && a * b > SIZE_MAX / c) return SIZE_MAX;
    return a * b * c;
}

/* The pairs per payload, as the codec says: more than count cannot be (a user codec breaking
 * its contract), and the pair lists are sized by it, so it is refused before anything is. */
static gcomp_result pairs_per_payload(const gcomp__call *call, size_t *k)
{
    *k = call->vt->sparse_k(call->params, call->count);
    if (*k > call->count)
        return gcomp__fail(GCOMP_ERR_INTERNAL, "codec '%s': sparse_k returned %zu for %zu elements (at most count)",
                           call->vt->name, *k, call->count);
    return GCOMP_SUCCESS;
}

static gcomp_result layout(gcomp__call *call, sparse_ctx *d)
{
    gcomp__workspace *ws = call->ws;
    size_t n = (size_t)call->ring.size, bound = gcomp_codec_max_encoded_bytes(call->codec, call->count);
    memset(d, 0, sizeof *d);
    d->call = call;
    d->pairs = pairs_path(call);
    d->bound = bound > SIZE_MAX - 7 - GCOMP__RING_TRAILER ? SIZE_MAX : (bound + 7) & ~(size_t)7;
    d->stride = d->bound == SIZE_MAX ? SIZE_MAX : d->bound + GCOMP__RING_TRAILER;
    d->slots = gcomp__ws_take(ws, product(n, d->stride, 1), "sparse: payloads");
    d->hop = gcomp__ws_take(ws, 2 * GCOMP__RING_TRAILER, "sparse: outcome hop");
    d->bytes = gcomp__ws_take(call->meta, n * sizeof(size_t), "sparse: payload sizes");
    if (call->on_device) {
        size_t enc = gcomp__call_scratch_bytes(call, call->count, 1);
        size_t sum = device_sum(call) ? gcomp__call_scratch_bytes(call, call->count, (int)n) : 0;
        d->scratch = gcomp__ws_take(ws, enc > sum ? enc : sum, "sparse: codec scratch");
        d->res = gcomp__ws_take(ws, sizeof(gcomp_cuda_residual), "sparse: residual block");
        d->res_tmp = gcomp__ws_take(call->meta, sizeof(gcomp_cuda_residual), "sparse: residual block (host)");
        d->ptrs = gcomp__ws_take(ws, n * sizeof(uint8_t *), "sparse: payload addresses");
        d->ptrs_tmp = gcomp__ws_take(call->meta, n * sizeof(uint8_t *), "sparse: payload addresses (host)");
    }
    if (!d->pairs) return GCOMP_SUCCESS;
    /* k of this call: every rank's payload must hold exactly as many pairs (same spec, count) */
    GCOMP_CHECK(pairs_per_payload(call, &d->k));
    d->lists = gcomp__ws_take(call->meta, n * sizeof(gcomp_pair_list), "sparse: pair lists");
    d->idx = gcomp__ws_take(ws, product(n, d->k, sizeof(uint64_t)), "sparse: pair indices");
    d->val = gcomp__ws_take(ws, product(n, d->k, sizeof(float)), "sparse: pair values");
    return GCOMP_SUCCESS;
}

static gcomp_result sparse_prepare(gcomp__call *call)
{
    sparse_ctx d;
    return layout(call, &d);
}

static uint8_t *slot(sparse_ctx *d, int j) { return d->slots + (size_t)j * d->stride; }

static gcomp_result encode_own(sparse_ctx *d)
{
    gcomp__call *call = d->call;
    gcomp_encode_ctx ctx = gcomp__call_ctx(call, 0);
    size_t zero = 0;
    double t0 = gcomp__now();
    GCOMP_CHECK(gcomp__call_res_blocks(call, 1, &zero, d->res_tmp, d->res));
    GCOMP_CHECK(gcomp__call_encode(call, &ctx, call->x, 0, call->count, 1, d->res, d->scratch,
                                   slot(d, call->ring.rank), d->bound, &d->bytes[call->ring.rank]));
    call->ring.nonfinite = (int)ctx.nonfinite;
    call->ring.st->overflow_count += ctx.overflow;
    call->ring.st->encode_s += gcomp__now() - t0;
    return GCOMP_SUCCESS;
}

/* Any other sparse codec: zero the result, add the N payloads in rank order. */
static void decode_all(sparse_ctx *d)
{
    gcomp__call *call = d->call;
    double t0 = gcomp__now();
    GCOMP_STEP(&call->ring, gcomp__call_zero(call, call->result, call->count * sizeof(float)));
    for (int j = 0; j < call->ring.size; j++)
        GCOMP_STEP(&call->ring, gcomp__call_decode_add(call, slot(d, j), d->bytes[j], call->result, call->count));
    call->ring.st->decode_s += gcomp__now() - t0;
}

/* Device buffers: check each payload's header against the size that arrived, then the codec's
 * kernel sums the N payloads in rank order and divides (it writes nothing after an error). */
static gcomp_result sum_on_device(sparse_ctx *d)
{
    gcomp__call *call = d->call;
    const gcomp__device_ops *dev = call->dev;
    int n = call->ring.size;
    double t0 = gcomp__now();
    GCOMP_CHECK(dev->memset_async(call->status, 0, sizeof *call->status, call->stream));
    for (int j = 0; j < n; j++) {
        GCOMP_CHECK(dev->header_check(slot(d, j), d->bytes[j], call->vt->wire_id, call->count, call->status,
                                      call->stream));
        d->ptrs_tmp[j] = slot(d, j);
    }
    GCOMP_CHECK(gcomp__call_to_device(call, d->ptrs, d->ptrs_tmp, (size_t)n * sizeof *d->ptrs));
    GCOMP_CHECK(GCOMP_CODEC_CALL(call->vt, cuda->sum_payloads,
                                 (call->params, d->ptrs, n, d->bound, call->result, call->count, call->divisor,
                                  d->scratch, call->status, call->stream)));
    GCOMP_CHECK(dev->status_fold(call->status, call->tally, call->stream));
    call->divided = 1;
    call->ring.st->decode_s += gcomp__now() - t0;
    return GCOMP_SUCCESS;
}

/* The pairs of payload j into list j (any order: lists are summed in rank order later). */
static gcomp_result unpack_pairs(sparse_ctx *d, int j)
{
    gcomp__call *call = d->call;
    size_t got = 0, body_bytes;
    uint64_t *idx = d->idx + (size_t)j * d->k;
    float *val = d->val + (size_t)j * d->k;
    const uint8_t *body;
    uint32_t flags;
    double t0 = gcomp__now();
    GCOMP_CHECK(
        gcomp__codec_element_body(call->codec, slot(d, j), d->bytes[j], call->count, &body, &body_bytes, &flags));
    GCOMP_CHECK(GCOMP_CODEC_CALL(call->vt, sparse_pairs,
                                 (call->params, flags, body, body_bytes, call->count, d->k, idx, val, &got)));
    if (got != d->k)
        return gcomp__fail(GCOMP_ERR_CORRUPT, "%s payload of rank %d holds %zu pairs, expected %zu", call->vt->name, j,
                           got, d->k);
    d->lists[j].idx = idx;
    d->lists[j].val = val;
    d->lists[j].k = got;
    gcomp__ring_progress(&call->ring);
    call->ring.st->decode_s += gcomp__now() - t0;
    return GCOMP_SUCCESS;
}

static void sum_pairs(sparse_ctx *d)
{
    gcomp__call *call = d->call;
    double t0 = gcomp__now();
    GCOMP_STEP(&call->ring,
               GCOMP_CODEC_CALL(call->vt, sparse_sum_pairs,
                                (call->params, d->lists, call->ring.size, call->result, call->count, call->divisor)));
    call->divided = 1;
    call->ring.st->decode_s += gcomp__now() - t0;
}

static gcomp_result sparse_run(gcomp__call *call)
{
    gcomp__ring *ring = &call->ring;
    int n = ring->size, r = ring->rank, last = gcomp__ring_right(ring);
    sparse_ctx d;
    GCOMP_CHECK(layout(call, &d));
    GCOMP_CHECK(gcomp__ws_check(call->ws));
    d.bytes[r] = 0;
    GCOMP_STEP(ring, encode_own(&d));
    if (d.pairs) GCOMP_STEP(ring, unpack_pairs(&d, r));
    for (int s = 0; s < n - 1; s++) {
        int send_j = gcomp__ring_rel(ring, -s), recv_j = gcomp__ring_rel(ring, -s - 1);
        GCOMP_CHECK(gcomp__ring_start(ring, slot(&d, send_j), d.bytes[send_j], slot(&d, recv_j), d.bound));
        /* what arrived in the previous step (the payload now being forwarded) is unpacked
         * while this step's transfer runs */
        if (d.pairs && s > 0) GCOMP_STEP(ring, unpack_pairs(&d, send_j));
        GCOMP_CHECK(gcomp__ring_finish(ring, &d.bytes[recv_j]));
    }
    if (d.pairs) GCOMP_STEP(ring, unpack_pairs(&d, last));
    /* host buffers: one more hop of the outcome trailer alone. A rank's own payload never
     * comes back to it, so without this hop a failure found in the gather's first message
     * (N-1 hops from its sender) would not reach that sender within the N-1 steps */
    GCOMP_CHECK(gcomp__ring_outcome_hop(ring, d.hop));
    if (d.pairs) {
        sum_pairs(&d);
    } else if (device_sum(call)) {
        GCOMP_STEP(ring, sum_on_device(&d));
    } else {
        decode_all(&d);
    }
    return GCOMP_SUCCESS;
}

const gcomp__sched gcomp__sched_sparse = { GCOMP_SCHED_SPARSE, "sparse-gather", sparse_prepare, sparse_run };
