/*
 * sched_sparse.c — the sparse gather for top-k (GCOMP_CAP_SPARSE codecs).
 *
 * Each rank encodes its whole tensor once (residual fused): a payload of k (index, value)
 * pairs. A ring allgather forwards every rank's payload unchanged (N-1 steps), and every
 * rank sums the N payloads in rank order into a zeroed result, so all ranks hold the same
 * bits. Sparse payloads do not shrink when summed, so a gather sends (N-1) payloads per
 * rank; when that would exceed what a dense fp32 ring sends (2(N-1)/N * 4 bytes per
 * element), the engine instead decodes this rank's payload and runs the dense ring on it.
 * Both sides of that choice depend only on (count, N, spec), so every rank makes the same.
 */
#include <string.h>

#include "engine.h"

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
static gcomp_result sparse_as_dense(gcomp__call *call, const uint8_t *own, size_t own_bytes)
{
    gcomp_comm *c = call->comm;
    const float *x = call->x;
    gcomp_result rc;
    if (!c->dense_codec) GCOMP_CHECK(gcomp_codec_create("none", NULL, &c->dense_codec));
    GCOMP_CHECK(gcomp__reserve(&c->spx, &c->spx_cap, call->count * sizeof(float)));
    memset(c->spx, 0, call->count * sizeof(float));
    GCOMP_CHECK(gcomp_codec_decode_add(c->codec, own, own_bytes, c->spx, call->count));
    call->x = c->spx;
    rc = gcomp__sched_dense_with(call, c->dense_codec, 0);
    call->x = x;
    call->st->last_schedule = GCOMP_SCHED_SPARSE_AS_DENSE;
    return rc;
}

gcomp_result gcomp__sched_sparse(gcomp__call *call)
{
    gcomp_comm *c = call->comm;
    int n = c->tp->size, r = c->tp->rank;
    size_t bound = (gcomp_codec_max_encoded_bytes(c->codec, call->count) + 7) & ~(size_t)7;
    double dense_bytes = 2.0 * (n - 1) / n * 4.0 * (double)call->count;
    uint8_t *slots;
    size_t *bytes;
    GCOMP_CHECK(gcomp__reserve(&c->pay, &c->pay_cap, (size_t)n * bound + (size_t)n * sizeof(size_t)));
    slots = c->pay;
    bytes = (size_t *)(slots + (size_t)n * bound);
    GCOMP_CHECK(encode_own(call, slots + (size_t)r * bound, bound, &bytes[r]));
    if ((double)(n - 1) * (double)bound > dense_bytes) return sparse_as_dense(call, slots + (size_t)r * bound, bytes[r]);
    for (int s = 0; s < n - 1; s++) {
        int send_j = ((r - s) % n + n) % n, recv_j = ((r - s - 1) % n + n) % n;
        double t0 = gcomp__now();
        GCOMP_CHECK(c->tp->sendrecv(c->tp, (r + 1) % n, slots + (size_t)send_j * bound, bytes[send_j], (r + n - 1) % n,
                                    slots + (size_t)recv_j * bound, bound, &bytes[recv_j], call->deadline));
        call->st->wire_bytes += bytes[send_j];
        call->st->comm_s += gcomp__now() - t0;
    }
    {
        double t0 = gcomp__now();
        memset(call->result, 0, call->count * sizeof(float));
        for (int j = 0; j < n; j++)
            GCOMP_CHECK(gcomp_codec_decode_add(c->codec, slots + (size_t)j * bound, bytes[j], call->result, call->count));
        call->st->decode_s += gcomp__now() - t0;
    }
    call->st->last_schedule = GCOMP_SCHED_SPARSE;
    return GCOMP_SUCCESS;
}
