/*
 * sched_integer.c — the integer ring for TernGrad (GCOMP_CAP_INTEGER codecs).
 *
 * 1. Each rank computes its local scales of x = g + r; one small allreduce-max makes them
 *    the same on every rank (compared as integer bits, so a NaN anywhere wins and reaches
 *    every result).
 * 2. Each rank ternarises its whole tensor once with the shared scales (residual fused).
 * 3. Reduce-scatter: partial sums of codes travel as exact integers; after m contributions
 *    they are packed with ceil(log2(2m+1)) bits each. No value is ever re-quantised.
 * 4. Allgather: the final integer sums (m = N) are forwarded unchanged; every rank computes
 *    result = scale * sum, so every rank holds the same bits.
 *
 * Chunks start at multiples of the bucket size (or of the code tile), so a chunk's codes are
 * a contiguous slice of the code array with the same tile structure.
 * Wire bytes per rank: sum_{m=1}^{N-1} ceil(L*bits(m)/8) + (N-1) * ceil(L*bits(N)/8) for
 * chunks of L elements, plus 8 * nb bytes for the scale allreduce.
 */
#include <math.h>
#include <string.h>

#include "engine.h"
#include "codecs/terngrad.h"

typedef struct int_ctx {
    gcomp__call *call;
    const gcomp_terngrad_params *p;
    size_t bucket;       /* elements per scale (count when one scale) */
    size_t align;        /* chunk boundaries */
    const float *scales; /* shared scales */
    const uint8_t *codes; /* this rank's code array (whole tensor) */
    int32_t *sums;       /* int32 running sums, count elements */
    size_t msg_cap;
} int_ctx;

static void chunk_of(const int_ctx *d, int j, size_t *lo, size_t *hi)
{
    gcomp__chunk(d->call->count, d->call->comm->tp->size, j, d->align, lo, hi);
}

/* sums[lo,hi) += this rank's codes, bucket by bucket (codes restart their tiles at each bucket). */
static gcomp_result add_own_codes(int_ctx *d, int j)
{
    size_t lo, hi;
    chunk_of(d, j, &lo, &hi);
    for (size_t a = lo; a < hi; a += d->bucket) {
        size_t m = hi - a < d->bucket ? hi - a : d->bucket;
        GCOMP_CHECK(gcomp__tg_codes_add(d->codes + a / 4, (m + 3) / 4, m, d->sums + a));
    }
    return GCOMP_SUCCESS;
}

/* Pack chunk j's sums of m ranks (through the byte stages, e.g. zstd) into out. */
static gcomp_result pack_chunk(int_ctx *d, int j, uint32_t m, uint8_t *out, size_t *bytes)
{
    gcomp_comm *c = d->call->comm;
    size_t lo, hi, raw;
    double t0 = gcomp__now();
    chunk_of(d, j, &lo, &hi);
    raw = (size_t)gcomp_tg_sum_bytes(hi - lo, m);
    GCOMP_CHECK(gcomp__reserve(&c->tmp, &c->tmp_cap, raw + 1));
    GCOMP_CHECK(gcomp__tg_sums_pack(d->sums + lo, hi - lo, m, c->tmp));
    GCOMP_CHECK(gcomp__codec_stages_encode(c->codec, c->tmp, raw, hi - lo, out, d->msg_cap, bytes));
    d->call->st->encode_s += gcomp__now() - t0;
    return GCOMP_SUCCESS;
}

/* sums[chunk j] += the sums of m ranks in a received message. */
static gcomp_result unpack_chunk(int_ctx *d, int j, uint32_t m, const uint8_t *in, size_t bytes)
{
    gcomp_comm *c = d->call->comm;
    size_t lo, hi, raw = 0;
    double t0 = gcomp__now();
    chunk_of(d, j, &lo, &hi);
    GCOMP_CHECK(gcomp__reserve(&c->tmp, &c->tmp_cap, (size_t)gcomp_tg_sum_bytes(hi - lo, m) + 1));
    GCOMP_CHECK(gcomp__codec_stages_decode(c->codec, in, bytes, hi - lo, c->tmp, (size_t)gcomp_tg_sum_bytes(hi - lo, m), &raw));
    GCOMP_CHECK(gcomp__tg_sums_add(c->tmp, raw, hi - lo, m, d->sums + lo));
    d->call->st->decode_s += gcomp__now() - t0;
    return GCOMP_SUCCESS;
}

static gcomp_result exchange(int_ctx *d, const void *sbuf, size_t sbytes, void *rbuf, size_t *rbytes)
{
    gcomp__transport *tp = d->call->comm->tp;
    double t0 = gcomp__now();
    GCOMP_CHECK(tp->sendrecv(tp, (tp->rank + 1) % tp->size, sbuf, sbytes, (tp->rank + tp->size - 1) % tp->size, rbuf,
                             d->msg_cap, rbytes, d->call->deadline));
    d->call->st->wire_bytes += sbytes;
    d->call->st->comm_s += gcomp__now() - t0;
    return GCOMP_SUCCESS;
}

/* result[chunk j] = scale * sum, bucket by bucket. */
static void finish_chunk(int_ctx *d, int j)
{
    size_t lo, hi;
    float *res = d->call->result;
    chunk_of(d, j, &lo, &hi);
    for (size_t i = lo; i < hi;) {
        size_t b = i / d->bucket, end = (b + 1) * d->bucket < hi ? (b + 1) * d->bucket : hi;
        float s = d->scales[b];
        for (; i < end; i++) res[i] = (float)d->sums[i] * s;
    }
}

static gcomp_result shared_scales(gcomp__call *call, const gcomp_codec_vtable *vt, const void *params, float *scales,
                                  uint64_t *keys, size_t nb)
{
    gcomp_comm *c = call->comm;
    gcomp_encode_ctx ctx = {0};
    double t0 = gcomp__now();
    GCOMP_CHECK(vt->local_scales(params, &ctx, call->x, call->r_in, call->count, scales));
    call->st->encode_s += gcomp__now() - t0;
    t0 = gcomp__now();
    /* |scale| bits as integers: max is exact, and NaN (largest) wins */
    for (size_t j = 0; j < nb; j++) {
        uint32_t b;
        memcpy(&b, &scales[j], 4);
        keys[j] = b & 0x7fffffffu;
    }
    GCOMP_CHECK(c->tp->allreduce_max_u64(c->tp, keys, nb, call->deadline));
    for (size_t j = 0; j < nb; j++) {
        uint32_t b = (uint32_t)keys[j];
        memcpy(&scales[j], &b, 4);
    }
    call->st->wire_bytes += 8 * nb;
    call->st->comm_s += gcomp__now() - t0;
    return GCOMP_SUCCESS;
}

gcomp_result gcomp__sched_integer(gcomp__call *call)
{
    gcomp_comm *c = call->comm;
    const gcomp__stage *st = &gcomp__codec_chain(c->codec)->stages[0];
    const gcomp_codec_vtable *vt = st->vt;
    int n = c->tp->size, r = c->tp->rank, own = (r + 1) % n;
    size_t nb = vt->num_scales(st->params, call->count), body_cap = vt->max_body_bytes(st->params, call->count);
    size_t max_chunk, body_bytes, rbytes, sbytes;
    gcomp_encode_ctx ctx = {0};
    uint32_t flags;
    uint8_t *body, *slots;
    size_t *slot_bytes;
    float *scales;
    int_ctx d;
    double t0;

    d.call = call;
    d.p = st->params;
    d.bucket = d.p->bucket > 0 ? (size_t)d.p->bucket : call->count;
    d.align = d.p->bucket > 0 ? (size_t)d.p->bucket : GCOMP_TG_TILE;
    max_chunk = call->count / (size_t)n + 2 * d.align;
    if (max_chunk > call->count) max_chunk = call->count;
    d.msg_cap = (gcomp__codec_stages_bound(c->codec, (size_t)gcomp_tg_sum_bytes(max_chunk, (uint32_t)n)) + 7) & ~(size_t)7;

    /* scratch: sums | body | scales+keys | n message slots + their sizes */
    GCOMP_CHECK(gcomp__reserve(&c->acc, &c->acc_cap, call->count * sizeof(int32_t)));
    GCOMP_CHECK(gcomp__reserve(&c->rbuf, &c->rbuf_cap, d.msg_cap));
    GCOMP_CHECK(gcomp__reserve(&c->sbuf, &c->sbuf_cap, ((body_cap + 7) & ~(size_t)7) + nb * (4 + 8) + 8));
    GCOMP_CHECK(gcomp__reserve(&c->pay, &c->pay_cap, (size_t)n * d.msg_cap + (size_t)n * sizeof(size_t)));
    d.sums = c->acc;
    body = c->sbuf;
    scales = (float *)(body + ((body_cap + 7) & ~(size_t)7));
    slots = c->pay;
    slot_bytes = (size_t *)(slots + (size_t)n * d.msg_cap);

    GCOMP_CHECK(shared_scales(call, vt, st->params, scales, (uint64_t *)(scales + nb + (nb & 1)), nb));
    t0 = gcomp__now();
    ctx.seed = c->cfg.seed;
    ctx.step = call->step;
    ctx.rank = (uint32_t)r;
    GCOMP_CHECK(vt->encode_scaled(st->params, &ctx, call->x, call->r_in, call->r_out, call->count, scales, body, body_cap,
                                  &body_bytes, &flags));
    call->nonfinite = (int)ctx.nonfinite;
    call->st->encode_s += gcomp__now() - t0;
    d.scales = scales;
    d.codes = body + 4 * nb;

    /* reduce-scatter: after step s the received chunk holds s + 2 contributions */
    memset(d.sums, 0, call->count * sizeof(int32_t));
    GCOMP_CHECK(add_own_codes(&d, r));
    GCOMP_CHECK(pack_chunk(&d, r, 1, slots, &sbytes));
    for (int s = 0; s < n - 1; s++) {
        int recv_j = ((r - s - 1) % n + n) % n;
        GCOMP_CHECK(exchange(&d, slots, sbytes, c->rbuf, &rbytes));
        GCOMP_CHECK(add_own_codes(&d, recv_j));
        GCOMP_CHECK(unpack_chunk(&d, recv_j, (uint32_t)(s + 1), c->rbuf, rbytes));
        if (s + 1 < n - 1) GCOMP_CHECK(pack_chunk(&d, recv_j, (uint32_t)(s + 2), slots, &sbytes));
    }
    /* allgather of the final sums of N ranks, forwarded unchanged */
    GCOMP_CHECK(pack_chunk(&d, own, (uint32_t)n, slots + (size_t)own * d.msg_cap, &slot_bytes[own]));
    finish_chunk(&d, own);
    for (int s = 0; s < n - 1; s++) {
        int send_j = ((r + 1 - s) % n + n) % n, recv_j = ((r - s) % n + n) % n;
        size_t lo, hi;
        GCOMP_CHECK(exchange(&d, slots + (size_t)send_j * d.msg_cap, slot_bytes[send_j], slots + (size_t)recv_j * d.msg_cap,
                             &slot_bytes[recv_j]));
        chunk_of(&d, recv_j, &lo, &hi);
        memset(d.sums + lo, 0, (hi - lo) * sizeof(int32_t));
        GCOMP_CHECK(unpack_chunk(&d, recv_j, (uint32_t)n, slots + (size_t)recv_j * d.msg_cap, slot_bytes[recv_j]));
        finish_chunk(&d, recv_j);
    }
    call->st->last_schedule = GCOMP_SCHED_INTEGER;
    return GCOMP_SUCCESS;
}
