/*
 * sched_doubling.c — recursive doubling, for the summable codecs (none, fp16, bf16): every
 * call at 2 ranks whose payload one message holds, small calls at a power-of-two N >= 4:
 * log2 N exchanges of the whole payload instead of the dense ring's 2(N-1) exchanges of a
 * chunk. At 2 ranks that is one exchange of what the ring's two steps send, with one encode
 * of the input instead of the ring's three of half of it (own chunk, partner's chunk, the
 * sum) and an fp32 sum that is never re-encoded, so it is the schedule there at every size.
 * At N >= 4 a small call is paid in hops, not bytes (each hop waits for a peer to be
 * scheduled, and on shared memory Open MPI sends a message past its eager limit in a
 * handshake), so fewer, larger messages win; a large one is paid in bytes, where the ring
 * sends 2(N-1)/N of the payload and doubling log2 N times it: at N >= 4 the engine picks
 * this schedule up to GCOMP__DOUBLING_MAX_BYTES of encoded elements and
 * GCOMP__DOUBLING_MAX_COUNT elements (schedule.h). At 2 ranks the partner is the ring's
 * neighbour, so the call runs on the plain ring (no butterfly) and agrees in-band like any
 * ring call.
 *
 * Each rank encodes its whole input once (error feedback fused, as on the ring). Step k
 * exchanges the current payload with partner rank ^ 2^k; both decode the two payloads in
 * rank order (the lower rank's first) into an fp32 partial sum, so the pair holds the same
 * bits, and every step but the last re-encodes that sum for the next exchange. Every rank
 * of the 2^k that hold the same sum re-encodes it with the same context (the rank in it is
 * the group's lowest: gcomp_codec.h asks the same bytes of a summable codec for the same
 * input and context), so the pairs of the next step exchange equal payloads. After log2 N
 * steps every rank holds the same fp32 sum of all N inputs. The partial sums live in the
 * workspace (none at 2 ranks: one step) and only the last step writes the result: the last
 * exchange completes the in-band agreement (below), so a call the ranks refuse leaves recv
 * -- and, in place, the input -- untouched, as on the ring.
 *
 * Outcome (host buffers): the own encode runs before the first message, so its news (a
 * failure, a non-finite value) reaches every rank over the log2 N exchanges; a payload that
 * fails its checks is found after an exchange, so log2 N trailer-only hops follow, and news
 * found at the last exchange reaches every rank too (ring.h: 2 log2 N messages in all). The
 * in-band agreement rides in the log2 N exchanges (the engine sends every call's agreement on
 * the butterfly at N >= 4; at 2 on the ring, whose first message is the exchange). Device
 * buffers: the same steps through sched_codec.c, sizes known to both ends, the engine's
 * end-of-call agreement.
 *
 * Wire bytes per rank: log2 N payloads of the whole count (headers included), and on host
 * buffers 2 log2 N trailers.
 */
#include "schedule.h"

typedef struct doubling_ctx {
    gcomp__call *call;
    size_t bound;    /* payload capacity of the whole count, 8-byte aligned */
    size_t exact;    /* the codec's bound itself: a device payload's size on both ends */
    uint8_t *mine;   /* this rank's payload of the current step (trailer room after it) */
    uint8_t *theirs; /* the partner's */
    float *acc;      /* the fp32 partial sum before the last step, count elements (NULL at 2 ranks) */
    uint8_t *hop;    /* the outcome hops' 2 trailers (host memory) */
    /* device buffers only */
    void *scratch;                /* the codec's encode scratch */
    gcomp_cuda_residual *res;     /* the residual's block (device) */
    gcomp_cuda_residual *res_tmp; /* the same, written on the host */
} doubling_ctx;

static void layout(gcomp__call *call, doubling_ctx *d)
{
    size_t stride;
    d->call = call;
    d->exact = gcomp_codec_max_encoded_bytes(call->codec, call->count);
    d->bound = (d->exact + 7) & ~(size_t)7;
    stride = d->bound + GCOMP__RING_TRAILER;
    d->mine = gcomp__ws_take(call->ws, stride, "doubling: own payload");
    d->theirs = gcomp__ws_take(call->ws, stride, "doubling: partner's payload");
    /* one exchange (2 ranks) sums straight into the result */
    d->acc = NULL;
    if (call->ring.size > 2) d->acc = gcomp__ws_take(call->ws, call->count * sizeof(float), "doubling: partial sums");
    d->hop = gcomp__ws_take(call->meta, 2 * GCOMP__RING_TRAILER, "doubling: outcome hops");
    d->scratch = d->res = d->res_tmp = NULL;
    if (!call->on_device) return;
    d->scratch = gcomp__ws_take(call->ws, gcomp__call_scratch_bytes(call, call->count, 1), "doubling: codec scratch");
    d->res = gcomp__ws_take(call->ws, sizeof(gcomp_cuda_residual), "doubling: residual block");
    d->res_tmp = gcomp__ws_take(call->meta, sizeof(gcomp_cuda_residual), "doubling: residual block (host)");
}

static gcomp_result doubling_prepare(gcomp__call *call)
{
    doubling_ctx d;
    layout(call, &d);
    return GCOMP_SUCCESS;
}

/* mine = payload of src: the input with its residual (step 0), else the partial sum that
 * the 2^step ranks of this rank's group hold, encoded as the group's lowest rank would. */
static gcomp_result encode(doubling_ctx *d, const float *src, int step, size_t *bytes)
{
    gcomp__call *call = d->call;
    gcomp_encode_ctx ctx = gcomp__call_ctx(call, 0);
    int own = step == 0 && !call->reencoded;
    double t0 = gcomp__now();
    ctx.rank &= ~((1u << step) - 1u);
    GCOMP_CHECK(gcomp__call_encode(call, &ctx, src, 0, call->count, own, d->res, d->scratch, d->mine, d->bound, bytes));
    call->ring.nonfinite |= own ? (int)ctx.nonfinite : 0;
    call->ring.st->overflow_count += ctx.overflow;
    call->ring.st->encode_s += gcomp__now() - t0;
    return GCOMP_SUCCESS;
}

/* sum = decode(first) + decode(second), in that order on both ranks of the pair. */
static gcomp_result sum_pair(doubling_ctx *d, const uint8_t *first, size_t fbytes, const uint8_t *second, size_t sbytes,
                             float *sum)
{
    gcomp__call *call = d->call;
    double t0 = gcomp__now();
    GCOMP_CHECK(gcomp__call_decode_sum2(call, first, fbytes, second, sbytes, sum, call->count));
    call->ring.st->decode_s += gcomp__now() - t0;
    return GCOMP_SUCCESS;
}

/* Start an exchange of mbytes of mine with this step's partner. Device buffers: both ends
 * know the size (the codec's bound), also after a local failure. */
static gcomp_result start_step(doubling_ctx *d, size_t mbytes)
{
    gcomp__ring *ring = &d->call->ring;
    if (!d->call->on_device) return gcomp__ring_start(ring, d->mine, mbytes, d->theirs, d->bound);
    return gcomp__ring_start_sized(ring, d->mine, d->exact, d->theirs, d->exact);
}

static gcomp_result doubling_run(gcomp__call *call)
{
    gcomp__ring *ring = &call->ring;
    int steps = gcomp__ring_doubling_steps(ring->size);
    size_t mbytes = 0, tbytes = 0, lo = 0;
    doubling_ctx d;
    layout(call, &d);
    GCOMP_CHECK(gcomp__ws_check(call->ws));
    if (ring->size > 2) gcomp__ring_use_butterfly(ring); /* at 2 ranks the ring's neighbour is the partner */
    if (steps == 0 || (ring->size > 2 && !ring->butterfly)) /* N not a power of two, or a message went out first */
        GCOMP_STEP(ring, gcomp__fail(GCOMP_ERR_INTERNAL, "recursive doubling cannot run on this call's ring"));
    if (d.res) GCOMP_STEP(ring, gcomp__call_res_blocks(call, 1, &lo, d.res_tmp, d.res));
    GCOMP_STEP(ring, encode(&d, call->x, 0, &mbytes));
    for (int k = 0; k < steps; k++) {
        int lower = ring->rank < (ring->rank ^ (1 << k));
        float *sum = k + 1 < steps ? d.acc : call->result;
        if (k > 0) GCOMP_STEP(ring, encode(&d, d.acc, k, &mbytes));
        GCOMP_CHECK(start_step(&d, mbytes));
        /* host buffers: the last one completes the in-band agreement (its verdict), unless the
         * engine ran it in a pass before */
        GCOMP_CHECK(gcomp__ring_finish(ring, &tbytes));
        if (lower)
            GCOMP_STEP(ring, sum_pair(&d, d.mine, mbytes, d.theirs, tbytes, sum));
        else
            GCOMP_STEP(ring, sum_pair(&d, d.theirs, tbytes, d.mine, mbytes, sum));
    }
    for (int k = 0; k < steps; k++) GCOMP_CHECK(gcomp__ring_outcome_hop(ring, d.hop));
    return GCOMP_SUCCESS;
}

const gcomp__sched gcomp__sched_doubling = { GCOMP_SCHED_DOUBLING, "dense-doubling", doubling_prepare, doubling_run };
