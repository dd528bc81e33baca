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
    size_t bucket;        /* elements per scale (count when one scale) */
    size_t align;         /* chunk boundaries */
    const float *scales;  /* shared scales */
    const uint8_t *codes; /* this rank's code array (whole tensor) */
    int8_t *t;            /* one chunk of this rank's codes as -1/0/+1 */
    int16_t *sums;        /* one chunk of final sums */
    uint8_t *raw;         /* packed sums after the byte stages are undone (zstd) */
    uint8_t *raw_out;     /* packed sums before the byte stages */
    uint8_t *slots;       /* n message slots of msg_cap bytes */
    size_t *slot_bytes;
    size_t msg_cap;
    int staged;           /* the spec has byte stages after terngrad */
} int_ctx;

static void chunk_of(const int_ctx *d, int j, size_t *lo, size_t *hi)
{
    gcomp__chunk(d->call->count, d->call->comm->tp->size, j, d->align, lo, hi);
}

static uint8_t *slot(int_ctx *d, int j) { return d->slots + (size_t)j * d->msg_cap; }

/* d->t = this rank's codes of chunk j, bucket by bucket (codes restart their tiles at each bucket). */
static gcomp_result own_codes(int_ctx *d, int j)
{
    size_t lo, hi;
    chunk_of(d, j, &lo, &hi);
    for (size_t a = lo; a < hi; a += d->bucket) {
        size_t m = hi - a < d->bucket ? hi - a : d->bucket;
        GCOMP_CHECK(gcomp__tg_codes_unpack(d->codes + a / 4, (m + 3) / 4, m, d->t + (a - lo)));
    }
    return GCOMP_SUCCESS;
}

/* One hop: the slot of chunk j := (sums of m_in ranks in `in`) + this rank's codes, packed
 * for m_in + 1 ranks and passed through the byte stages. */
static gcomp_result hop(int_ctx *d, int j, const uint8_t *in, size_t in_bytes, uint32_t m_in)
{
    gcomp_comm *c = d->call->comm;
    size_t lo, hi, raw_bytes, n;
    uint8_t *dst;
    const uint8_t *src = in;
    double t0 = gcomp__now();
    chunk_of(d, j, &lo, &hi);
    n = hi - lo;
    if (m_in && d->staged) {
        GCOMP_CHECK(gcomp__codec_stages_decode(c->codec, in, in_bytes, n, d->raw, (size_t)gcomp_tg_sum_bytes(n, m_in), &in_bytes));
        src = d->raw;
    }
    GCOMP_CHECK(own_codes(d, j));
    raw_bytes = (size_t)gcomp_tg_sum_bytes(n, m_in + 1);
    dst = d->staged ? d->raw_out : slot(d, j);
    GCOMP_CHECK(gcomp__tg_sums_add_pack(src, in_bytes, m_in, d->t, n, dst));
    if (d->staged) GCOMP_CHECK(gcomp__codec_stages_encode(c->codec, d->raw_out, raw_bytes, n, slot(d, j), d->msg_cap, &raw_bytes));
    d->slot_bytes[j] = raw_bytes;
    d->call->st->encode_s += gcomp__now() - t0;
    return GCOMP_SUCCESS;
}

/* result[chunk j] = scale * (final sum of N ranks), bucket by bucket. */
static gcomp_result finish(int_ctx *d, int j)
{
    gcomp_comm *c = d->call->comm;
    uint32_t n_ranks = (uint32_t)c->tp->size;
    size_t lo, hi, bytes = d->slot_bytes[j];
    const uint8_t *src = slot(d, j);
    float *res = d->call->result;
    double t0 = gcomp__now();
    chunk_of(d, j, &lo, &hi);
    if (d->staged) {
        GCOMP_CHECK(gcomp__codec_stages_decode(c->codec, src, bytes, hi - lo, d->raw,
                                               (size_t)gcomp_tg_sum_bytes(hi - lo, n_ranks), &bytes));
        src = d->raw;
    }
    GCOMP_CHECK(gcomp__tg_sums_unpack(src, bytes, hi - lo, n_ranks, d->sums));
    for (size_t i = lo; i < hi;) {
        size_t b = i / d->bucket, end = (b + 1) * d->bucket < hi ? (b + 1) * d->bucket : hi;
        float s = d->scales[b];
        for (; i < end; i++) res[i] = (float)d->sums[i - lo] * s;
    }
    d->call->st->decode_s += gcomp__now() - t0;
    return GCOMP_SUCCESS;
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

/* Scratch layout in the communicator's buffers, sized once per (count, N). */
static gcomp_result reserve_scratch(int_ctx *d, size_t nb, size_t body_cap, size_t max_chunk, uint8_t **body,
                                    float **scales, uint64_t **keys)
{
    gcomp_comm *c = d->call->comm;
    int n = c->tp->size;
    size_t body_al = (body_cap + 7) & ~(size_t)7;
    GCOMP_CHECK(gcomp__reserve(&c->sbuf, &c->sbuf_cap, body_al + nb * 4 + 8 + nb * 8));
    GCOMP_CHECK(gcomp__reserve(&c->acc, &c->acc_cap, max_chunk * (sizeof(int8_t) + sizeof(int16_t)) + 16));
    GCOMP_CHECK(gcomp__reserve(&c->tmp, &c->tmp_cap, 2 * d->msg_cap));
    GCOMP_CHECK(gcomp__reserve(&c->rbuf, &c->rbuf_cap, d->msg_cap));
    GCOMP_CHECK(gcomp__reserve(&c->pay, &c->pay_cap, (size_t)n * d->msg_cap + (size_t)n * sizeof(size_t)));
    *body = c->sbuf;
    *scales = (float *)(*body + body_al);
    *keys = (uint64_t *)(*body + body_al + ((nb * 4 + 7) & ~(size_t)7));
    d->sums = c->acc;
    d->t = (int8_t *)((uint8_t *)c->acc + ((max_chunk * sizeof(int16_t) + 15) & ~(size_t)15));
    d->raw = c->tmp;
    d->raw_out = (uint8_t *)c->tmp + d->msg_cap;
    d->slots = c->pay;
    d->slot_bytes = (size_t *)(d->slots + (size_t)n * d->msg_cap);
    return GCOMP_SUCCESS;
}

typedef struct int_layout {
    const gcomp_codec_vtable *vt;
    const gcomp__stage *st;
    size_t nb, body_cap;
    uint8_t *body;
    float *scales;
    uint64_t *keys;
} int_layout;

/* Buffers of the ring; the same call in prepare and run (where it allocates nothing). */
static gcomp_result layout(gcomp__call *call, int_ctx *d, int_layout *l)
{
    gcomp_comm *c = call->comm;
    const gcomp_terngrad_params *p;
    int n = c->tp->size;
    size_t max_chunk;
    memset(d, 0, sizeof *d);
    l->st = &gcomp__codec_chain(c->codec)->stages[0];
    l->vt = l->st->vt;
    p = l->st->params;
    l->nb = l->vt->num_scales(l->st->params, call->count);
    l->body_cap = l->vt->max_body_bytes(l->st->params, call->count);
    d->call = call;
    d->bucket = p->bucket > 0 ? (size_t)p->bucket : call->count;
    d->align = p->bucket > 0 ? (size_t)p->bucket : GCOMP_TG_TILE;
    d->staged = gcomp__codec_chain(c->codec)->n_stages > 1;
    max_chunk = call->count / (size_t)n + 2 * d->align;
    if (max_chunk > call->count) max_chunk = call->count;
    d->msg_cap = (gcomp__codec_stages_bound(c->codec, (size_t)gcomp_tg_sum_bytes(max_chunk, (uint32_t)n)) + 7) & ~(size_t)7;
    return reserve_scratch(d, l->nb, l->body_cap, max_chunk, &l->body, &l->scales, &l->keys);
}

gcomp_result gcomp__sched_integer_prepare(gcomp__call *call)
{
    int_ctx d;
    int_layout l;
    return layout(call, &d, &l);
}

gcomp_result gcomp__sched_integer(gcomp__call *call)
{
    gcomp_comm *c = call->comm;
    int n = c->tp->size, r = c->tp->rank, own = (r + 1) % n;
    size_t body_bytes, rbytes;
    gcomp_encode_ctx ctx = {0};
    uint32_t flags;
    int_ctx d;
    int_layout l;
    double t0;

    GCOMP_CHECK(layout(call, &d, &l));
    GCOMP_CHECK(shared_scales(call, l.vt, l.st->params, l.scales, l.keys, l.nb));
    t0 = gcomp__now();
    ctx.seed = c->cfg.seed;
    ctx.step = call->step;
    ctx.rank = (uint32_t)r;
    GCOMP_STEP(call, l.vt->encode_scaled(l.st->params, &ctx, call->x, call->r_in, call->r_out, call->count, l.scales,
                                         l.body, l.body_cap, &body_bytes, &flags));
    call->nonfinite = (int)ctx.nonfinite;
    call->st->encode_s += gcomp__now() - t0;
    d.scales = l.scales;
    d.codes = l.body + 4 * l.nb;

    /* reduce-scatter: the chunk received at step s holds s + 1 ranks' sums; this rank adds
     * its codes and forwards s + 2. After N-1 steps the slot of `own` holds all N. */
    d.slot_bytes[r] = 0;
    GCOMP_STEP(call, hop(&d, r, NULL, 0, 0));
    for (int s = 0; s < n - 1; s++) {
        int send_j = ((r - s) % n + n) % n, recv_j = ((r - s - 1) % n + n) % n;
        GCOMP_CHECK(gcomp__ring_exchange(call, slot(&d, send_j), d.slot_bytes[send_j], c->rbuf, d.msg_cap, &rbytes));
        GCOMP_STEP(call, hop(&d, recv_j, c->rbuf, rbytes, (uint32_t)(s + 1)));
    }
    /* allgather: the final sums are forwarded unchanged; every rank (the owner too) turns
     * the same packed bytes into scale * sum */
    GCOMP_STEP(call, finish(&d, own));
    for (int s = 0; s < n - 1; s++) {
        int send_j = ((r + 1 - s) % n + n) % n, recv_j = ((r - s) % n + n) % n;
        GCOMP_CHECK(gcomp__ring_exchange(call, slot(&d, send_j), d.slot_bytes[send_j], slot(&d, recv_j), d.msg_cap,
                                         &d.slot_bytes[recv_j]));
        GCOMP_STEP(call, finish(&d, recv_j));
    }
    call->st->last_schedule = GCOMP_SCHED_INTEGER;
    return GCOMP_SUCCESS;
}
