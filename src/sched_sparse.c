/*
 * sched_sparse.c — the sparse gather for top-k (GCOMP_CAP_SPARSE codecs).
 *
 * Each rank encodes its whole tensor once (residual fused): a payload of k (index, value)
 * pairs. A ring allgather forwards every rank's payload unchanged (N-1 steps), and every
 * rank sums the N payloads in rank order into a zeroed result, so all ranks hold the same
 * bits. For the built-in top-k each payload becomes an (index, value) list while the next
 * one travels, and the lists are summed in one ordered pass. Sparse payloads do not shrink when summed, so a gather sends (N-1) payloads per
 * rank; when that bound would exceed what a dense fp32 ring sends (2(N-1)/N * 4 bytes per
 * element), the engine instead decodes this rank's payload and runs the dense ring on it.
 * The choice depends only on (count, N, spec), so every rank makes the same one.
 *
 * Wire bytes per rank: the sum of the N-1 payloads it forwards, each 32 + 8 + k * (value
 * bytes) + about k * log2(count / k) / 8 bytes of index gaps.
 */
#include <string.h>

#include "engine.h"
#include "codecs/topk.h"

/* The built-in top-k is decoded to (index, value) lists as payloads arrive, and the lists
 * summed into the result in one ordered pass at the end (gcomp__topk_sum_pairs); another
 * sparse codec goes through decode_add. */
static int pairs_path(const gcomp__call *call)
{
    return gcomp__codec_chain(call->comm->codec)->stages[0].vt == &gcomp__codec_topk &&
           call->comm->tp->size <= GCOMP_TOPK_MAX_LISTS;
}

/* k of this call (every rank's payload must hold exactly as many pairs: same spec, count) */
static size_t pairs_k(const gcomp__call *call)
{
    return (size_t)gcomp_topk_k(gcomp__codec_chain(call->comm->codec)->stages[0].params, call->count);
}

/* c->acc holds n list heads, then n x k indices, then n x k values */
static size_t pairs_heads(int n) { return ((size_t)n * sizeof(gcomp_topk_pairs) + 7) & ~(size_t)7; }
static size_t pairs_bytes(const gcomp__call *call)
{
    int n = call->comm->tp->size;
    return pairs_heads(n) + (size_t)n * pairs_k(call) * (sizeof(uint64_t) + sizeof(float));
}

static size_t payload_bound(const gcomp__call *call)
{
    return (gcomp_codec_max_encoded_bytes(call->comm->codec, call->count) + 7) & ~(size_t)7;
}

static int use_dense(const gcomp__call *call)
{
    int n = call->comm->tp->size;
    return (double)(n - 1) * (double)payload_bound(call) > 2.0 * (n - 1) / n * 4.0 * (double)call->count;
}

gcomp_result gcomp__sched_sparse_prepare(gcomp__call *call)
{
    gcomp_comm *c = call->comm;
    int n = c->tp->size;
    GCOMP_CHECK(gcomp__reserve(&c->pay, &c->pay_cap, (size_t)n * payload_bound(call) + (size_t)n * sizeof(size_t)));
    if (!use_dense(call))
        return pairs_path(call) ? gcomp__reserve(&c->acc, &c->acc_cap, pairs_bytes(call)) : GCOMP_SUCCESS;
    if (!c->dense_codec) GCOMP_CHECK(gcomp_codec_create("none", NULL, &c->dense_codec));
    GCOMP_CHECK(gcomp__reserve(&c->spx, &c->spx_cap, call->count * sizeof(float)));
    GCOMP_CHECK(gcomp__reserve(&c->tmp, &c->tmp_cap, payload_bound(call)));
    return gcomp__sched_dense_prepare(call, c->dense_codec);
}

static gcomp_result encode_own(gcomp__call *call, uint8_t *out, size_t cap, size_t *bytes)
{
    gcomp_comm *c = call->comm;
    gcomp_encode_ctx ctx = {0};
    double t0 = gcomp__now();
    ctx.seed = c->cfg.seed;
    ctx.step = call->step;
    ctx.rank = (uint32_t)c->tp->rank;
    GCOMP_CHECK(gcomp__codec_encode_ctx(c->codec, &ctx, call->x, call->r_in, call->r_out, call->count, out, cap, bytes));
    call->nonfinite = (int)ctx.nonfinite;
    call->st->overflow_count += ctx.overflow;
    call->st->encode_s += gcomp__now() - t0;
    return GCOMP_SUCCESS;
}

/* Decode this rank's payload and run the fp32 dense ring on it. */
static gcomp_result sparse_as_dense(gcomp__call *call)
{
    gcomp_comm *c = call->comm;
    const float *x = call->x;
    size_t bytes = 0;
    gcomp_result rc;
    memset(c->spx, 0, call->count * sizeof(float));
    GCOMP_STEP(call, encode_own(call, c->tmp, payload_bound(call), &bytes));
    GCOMP_STEP(call, gcomp_codec_decode_add(c->codec, c->tmp, bytes, c->spx, call->count));
    call->x = c->spx;
    rc = gcomp__sched_dense(call, c->dense_codec, 0);
    call->x = x;
    call->st->last_schedule = GCOMP_SCHED_SPARSE_AS_DENSE;
    return rc;
}

/* Any other sparse codec: zero the result, add the N payloads in rank order. */
static void decode_all(gcomp__call *call, const uint8_t *slots, size_t bound, const size_t *bytes)
{
    gcomp_comm *c = call->comm;
    double t0 = gcomp__now();
    memset(call->result, 0, call->count * sizeof(float));
    for (int j = 0; j < c->tp->size; j++)
        GCOMP_STEP(call, gcomp_codec_decode_add(c->codec, slots + (size_t)j * bound, bytes[j], call->result, call->count));
    call->st->decode_s += gcomp__now() - t0;
}

/* The pairs of payload j into list j (any order: lists are summed in rank order later). */
static gcomp_result unpack_pairs(gcomp__call *call, const uint8_t *payload, size_t bytes, gcomp_topk_pairs *list, int j)
{
    gcomp_comm *c = call->comm;
    size_t k = pairs_k(call), got = 0, body_bytes;
    uint64_t *idx0 = (uint64_t *)((uint8_t *)c->acc + pairs_heads(c->tp->size)), *idx = idx0 + (size_t)j * k;
    float *val = (float *)(idx0 + (size_t)c->tp->size * k) + (size_t)j * k;
    const uint8_t *body;
    uint32_t flags;
    double t0 = gcomp__now();
    GCOMP_CHECK(gcomp__codec_element_body(c->codec, payload, bytes, call->count, &body, &body_bytes, &flags));
    GCOMP_CHECK(gcomp__topk_body_pairs(flags, body, body_bytes, call->count, k, idx, val, &got));
    if (got != k) return gcomp__fail(GCOMP_ERR_CORRUPT, "top-k payload of rank %d holds %zu pairs, expected %zu", j, got, k);
    list->idx = idx;
    list->val = val;
    list->k = got;
    c->tp->progress(c->tp);
    call->st->decode_s += gcomp__now() - t0;
    return GCOMP_SUCCESS;
}

static void sum_pairs(gcomp__call *call, const gcomp_topk_pairs *lists)
{
    double t0 = gcomp__now();
    if (!call->error) gcomp__topk_sum_pairs(lists, call->comm->tp->size, call->result, call->count, call->divisor);
    call->divided = 1;
    call->st->decode_s += gcomp__now() - t0;
}

gcomp_result gcomp__sched_sparse(gcomp__call *call)
{
    gcomp_comm *c = call->comm;
    int n = c->tp->size, r = c->tp->rank, pairs = pairs_path(call), last = (r + 1) % n;
    size_t bound = payload_bound(call);
    uint8_t *slots = c->pay;
    size_t *bytes = (size_t *)(slots + (size_t)n * bound);
    gcomp_topk_pairs *lp = c->acc;
    if (use_dense(call)) return sparse_as_dense(call);
    bytes[r] = 0;
    GCOMP_STEP(call, encode_own(call, slots + (size_t)r * bound, bound, &bytes[r]));
    if (pairs) GCOMP_STEP(call, unpack_pairs(call, slots + (size_t)r * bound, bytes[r], &lp[r], r));
    for (int s = 0; s < n - 1; s++) {
        int send_j = ((r - s) % n + n) % n, recv_j = ((r - s - 1) % n + n) % n;
        GCOMP_CHECK(gcomp__ring_start(call, slots + (size_t)send_j * bound, bytes[send_j],
                                      slots + (size_t)recv_j * bound, bound));
        /* what arrived in the previous step (the payload now being forwarded) is unpacked
         * while this step's transfer runs */
        if (pairs && s > 0)
            GCOMP_STEP(call, unpack_pairs(call, slots + (size_t)send_j * bound, bytes[send_j], &lp[send_j], send_j));
        GCOMP_CHECK(gcomp__ring_finish(call, &bytes[recv_j]));
    }
    if (pairs) {
        GCOMP_STEP(call, unpack_pairs(call, slots + (size_t)last * bound, bytes[last], &lp[last], last));
        sum_pairs(call, lp);
    } else {
        decode_all(call, slots, bound, bytes);
    }
    call->st->last_schedule = GCOMP_SCHED_SPARSE;
    return GCOMP_SUCCESS;
}
