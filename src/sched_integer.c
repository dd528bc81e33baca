/*
 * sched_integer.c — the integer ring for TernGrad (GCOMP_CAP_INTEGER codecs).
 *
 * 1. Each rank computes its local scales of x = g + r; one small allreduce-max makes them
 *    the same on every rank (compared as integer bits, so a NaN anywhere wins and reaches
 *    every result).
 * 2. Reduce-scatter: partial sums of codes travel as exact integers; after m contributions
 *    they are packed as digits of base 2m+1 in groups (codecs/terngrad.h: 1.6 bits each for
 *    m = 1, 2.33 for m = 2, 3 for m = 3, 3.5 for m = 4). No value is ever re-quantised. Each
 *    rank ternarises a chunk (with the shared scales, residual fused) just before it needs
 *    its codes, while the previous message is on the wire.
 * 3. Allgather: the final integer sums (m = N) are forwarded unchanged; every rank computes
 *    result = scale * sum (/ N for AVG, in the same pass), so every rank holds the same bits.
 *    Turning one chunk into floats overlaps the transfer of the next.
 *
 * Codes never leave the rank, so a chunk is ternarised on its own (the RNG is keyed by the
 * global element index, so the codes equal those of a whole-tensor encode). Chunks start at
 * multiples of the bucket size, so each chunk's buckets are whole.
 * Wire bytes per rank: sum_{m=1}^{N-1} gcomp_tg_sum_bytes(L, m) + (N-1) * gcomp_tg_sum_bytes(L, N)
 * for chunks of L elements (plus 32-byte stage headers with zstd), plus 8 * nb bytes for the
 * scale allreduce.
 */
#include <math.h>
#include <string.h>

#include "engine.h"
#include "codecs/terngrad.h"

#define PIECE 65536 /* elements ternarised between two progress calls */

typedef struct int_ctx {
    gcomp__call *call;
    const gcomp__stage *st; /* the terngrad stage: vtable and params */
    size_t nb;              /* number of scales */
    size_t bucket;          /* elements per scale (count when one scale) */
    size_t align;           /* chunk boundaries */
    size_t piece;           /* elements per ternarised piece: whole buckets, or a multiple of 4 */
    float *scales;          /* shared scales */
    uint64_t *keys;         /* their bits, for the allreduce-max */
    int8_t *t;              /* one chunk of this rank's codes as -1/0/+1 */
    int16_t *sums;          /* one chunk of final sums */
    float *values;          /* 2N + 1 results of a sum under the one scale (nb == 1) */
    uint8_t *raw;           /* packed sums after the byte stages are undone (zstd) */
    uint8_t *raw_out;       /* packed sums before the byte stages */
    uint8_t *slots;         /* n message slots of msg_cap bytes */
    size_t *slot_bytes;
    size_t msg_cap;
    int staged;             /* the spec has byte stages after terngrad */
    int write_residual;     /* every scale is finite: the residual may be updated */
} int_ctx;

static void chunk_of(const int_ctx *d, int j, size_t *lo, size_t *hi)
{
    gcomp__chunk(d->call->count, d->call->comm->tp->size, j, d->align, lo, hi);
}

static uint8_t *slot(int_ctx *d, int j) { return d->slots + (size_t)j * d->msg_cap; }

/* Buffers of the ring; the same call in prepare and run (where it allocates nothing). */
static gcomp_result layout(gcomp__call *call, int_ctx *d)
{
    gcomp_comm *c = call->comm;
    const gcomp_terngrad_params *p;
    int n = c->tp->size;
    size_t max_chunk, off;
    uint8_t *base;
    memset(d, 0, sizeof *d);
    d->call = call;
    d->st = &gcomp__codec_chain(c->codec)->stages[0];
    p = d->st->params;
    d->nb = d->st->vt->num_scales(d->st->params, call->count);
    d->bucket = p->bucket > 0 ? (size_t)p->bucket : call->count;
    d->align = p->bucket > 0 ? (size_t)p->bucket : GCOMP_TG_TILE;
    d->piece = p->bucket > 0 ? ((PIECE + d->bucket - 1) / d->bucket) * d->bucket : PIECE;
    d->staged = gcomp__codec_chain(c->codec)->n_stages > 1;
    max_chunk = call->count / (size_t)n + 2 * d->align;
    if (max_chunk > call->count) max_chunk = call->count;
    /* sums of all N ranks are the widest any hop packs (test_sums_format checks it) */
    d->msg_cap = (gcomp__codec_stages_bound(c->codec, (size_t)gcomp_tg_sum_bytes(max_chunk, (uint32_t)n)) + 7) & ~(size_t)7;

    /* sbuf: scales | keys;  acc: sums | t;  tmp: raw | raw_out;  pay: slots | sizes */
    GCOMP_CHECK(gcomp__reserve(&c->sbuf, &c->sbuf_cap, 16 * d->nb + 16 + 4 * (2 * (size_t)n + 1)));
    GCOMP_CHECK(gcomp__reserve(&c->acc, &c->acc_cap, max_chunk * (sizeof(int16_t) + sizeof(int8_t)) + 16));
    GCOMP_CHECK(gcomp__reserve(&c->tmp, &c->tmp_cap, 2 * d->msg_cap));
    GCOMP_CHECK(gcomp__reserve(&c->rbuf, &c->rbuf_cap, d->msg_cap));
    GCOMP_CHECK(gcomp__reserve(&c->pay, &c->pay_cap, (size_t)n * d->msg_cap + (size_t)n * sizeof(size_t)));
    base = c->sbuf;
    off = (4 * d->nb + 7) & ~(size_t)7;
    d->scales = (float *)base;
    d->keys = (uint64_t *)(base + off);
    d->values = (float *)(base + off + 8 * d->nb);
    d->sums = c->acc;
    d->t = (int8_t *)((uint8_t *)c->acc + ((max_chunk * sizeof(int16_t) + 15) & ~(size_t)15));
    d->raw = c->tmp;
    d->raw_out = (uint8_t *)c->tmp + d->msg_cap;
    d->slots = c->pay;
    d->slot_bytes = (size_t *)(d->slots + (size_t)n * d->msg_cap);
    return GCOMP_SUCCESS;
}

gcomp_result gcomp__sched_integer_prepare(gcomp__call *call)
{
    int_ctx d;
    return layout(call, &d);
}

static gcomp_result shared_scales(int_ctx *d)
{
    gcomp__call *call = d->call;
    gcomp_comm *c = call->comm;
    gcomp_encode_ctx ctx = {0};
    double t0 = gcomp__now();
    GCOMP_CHECK(d->st->vt->local_scales(d->st->params, &ctx, call->x, call->r_in, call->count, d->scales));
    call->st->encode_s += gcomp__now() - t0;
    t0 = gcomp__now();
    /* |scale| bits as integers: max is exact, and NaN (largest) wins */
    for (size_t j = 0; j < d->nb; j++) {
        uint32_t b;
        memcpy(&b, &d->scales[j], 4);
        d->keys[j] = b & 0x7fffffffu;
    }
    GCOMP_CHECK(c->tp->allreduce_max_u64(c->tp, d->keys, d->nb, call->deadline));
    d->write_residual = 1;
    for (size_t j = 0; j < d->nb; j++) {
        uint32_t b = (uint32_t)d->keys[j];
        memcpy(&d->scales[j], &b, 4);
        /* a scale whose N-fold sum overflows would give an infinite result after the
         * in-place residual was written: treat it as non-finite too */
        if (!isfinite(d->scales[j] * (float)c->tp->size)) d->write_residual = 0;
    }
    call->nonfinite = !d->write_residual;
    call->st->wire_bytes += 8 * d->nb;
    call->st->comm_s += gcomp__now() - t0;
    return GCOMP_SUCCESS;
}

/* d->t = this rank's codes of chunk j, ternarised piece by piece with the shared scales
 * (residual fused), letting the transfer in flight progress between pieces. */
static gcomp_result ternarise_chunk(int_ctx *d, int j)
{
    gcomp__call *call = d->call;
    gcomp__transport *tp = call->comm->tp;
    size_t lo, hi;
    double t0 = gcomp__now();
    chunk_of(d, j, &lo, &hi);
    for (size_t a = lo; a < hi; a += d->piece) {
        size_t m = hi - a < d->piece ? hi - a : d->piece;
        const float *scales = d->scales + (d->bucket < call->count ? a / d->bucket : 0);
        gcomp_encode_ctx ctx = {0};
        ctx.seed = call->comm->cfg.seed;
        ctx.step = call->step;
        ctx.rank = (uint32_t)tp->rank;
        ctx.offset = a;
        GCOMP_CHECK(gcomp__tg_ternarise(d->st->params, &ctx, call->x + a, call->r_in ? call->r_in + a : NULL,
                                        call->r_out && d->write_residual ? call->r_out + a : NULL, m, scales,
                                        d->t + (a - lo)));
        tp->progress(tp);
    }
    call->st->encode_s += gcomp__now() - t0;
    return GCOMP_SUCCESS;
}

/* One hop: the slot of chunk j := (sums of m_in ranks in `in`) + d->t, packed for m_in + 1
 * ranks and passed through the byte stages. */
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
    raw_bytes = (size_t)gcomp_tg_sum_bytes(n, m_in + 1);
    dst = d->staged ? d->raw_out : slot(d, j);
    GCOMP_CHECK(gcomp__tg_sums_add_pack(src, in_bytes, m_in, d->t, n, dst));
    if (d->staged) GCOMP_CHECK(gcomp__codec_stages_encode(c->codec, d->raw_out, raw_bytes, n, slot(d, j), d->msg_cap, &raw_bytes));
    d->slot_bytes[j] = raw_bytes;
    d->call->st->encode_s += gcomp__now() - t0;
    return GCOMP_SUCCESS;
}

/* The 2N + 1 results a sum of N ranks can give under scale s: the same expression as the
 * bucketed path of finish, so both give the same bits. */
static void sum_values(const int_ctx *d, float s, float *value)
{
    int32_t n = d->call->comm->tp->size;
    for (int32_t k = -n; k <= n; k++) value[k + n] = (float)k * s / d->call->divisor;
}

/* result[chunk j] = scale * (final sum of N ranks) / divisor. With one scale, straight from
 * the packed sums through a table of the 2N + 1 possible results (one pass over the chunk);
 * with buckets, through the int16 sums, bucket by bucket. */
static gcomp_result finish(int_ctx *d, int j)
{
    gcomp_comm *c = d->call->comm;
    uint32_t n_ranks = (uint32_t)c->tp->size;
    size_t lo, hi, bytes = d->slot_bytes[j];
    const uint8_t *src = slot(d, j);
    float *res = d->call->result, div = d->call->divisor;
    double t0 = gcomp__now();
    chunk_of(d, j, &lo, &hi);
    if (d->staged) {
        GCOMP_CHECK(gcomp__codec_stages_decode(c->codec, src, bytes, hi - lo, d->raw,
                                               (size_t)gcomp_tg_sum_bytes(hi - lo, n_ranks), &bytes));
        src = d->raw;
    }
    if (d->nb == 1) {
        sum_values(d, d->scales[0], d->values);
        GCOMP_CHECK(gcomp__tg_sums_values(src, bytes, hi - lo, n_ranks, d->values, res + lo));
        c->tp->progress(c->tp);
    } else {
        GCOMP_CHECK(gcomp__tg_sums_unpack(src, bytes, hi - lo, n_ranks, d->sums));
        c->tp->progress(c->tp);
        for (size_t i = lo; i < hi;) {
            size_t b = i / d->bucket, end = (b + 1) * d->bucket < hi ? (b + 1) * d->bucket : hi;
            float s = d->scales[b];
            for (; i < end; i++) res[i] = (float)d->sums[i - lo] * s / div;
        }
    }
    d->call->divided = 1;
    d->call->st->decode_s += gcomp__now() - t0;
    return GCOMP_SUCCESS;
}

gcomp_result gcomp__sched_integer(gcomp__call *call)
{
    gcomp_comm *c = call->comm;
    int n = c->tp->size, r = c->tp->rank, prev;
    size_t rbytes;
    int_ctx d;

    GCOMP_CHECK(layout(call, &d));
    GCOMP_CHECK(shared_scales(&d));

    /* reduce-scatter: the chunk received at step s holds s + 1 ranks' sums; this rank adds
     * its codes and forwards s + 2. After N-1 steps the slot of (r + 1) % N holds all N. */
    d.slot_bytes[r] = 0;
    GCOMP_STEP(call, ternarise_chunk(&d, r));
    GCOMP_STEP(call, hop(&d, r, NULL, 0, 0));
    for (int s = 0; s < n - 1; s++) {
        int send_j = ((r - s) % n + n) % n, recv_j = ((r - s - 1) % n + n) % n;
        GCOMP_CHECK(gcomp__ring_start(call, slot(&d, send_j), d.slot_bytes[send_j], c->rbuf, d.msg_cap));
        GCOMP_STEP(call, ternarise_chunk(&d, recv_j)); /* while the message travels */
        GCOMP_CHECK(gcomp__ring_finish(call, &rbytes));
        GCOMP_STEP(call, hop(&d, recv_j, c->rbuf, rbytes, (uint32_t)(s + 1)));
    }
    /* allgather: the final sums are forwarded unchanged; every rank (the owner too) turns
     * the same packed bytes into scale * sum, one chunk while the next travels */
    prev = (r + 1) % n;
    for (int s = 0; s < n - 1; s++) {
        int send_j = ((r + 1 - s) % n + n) % n, recv_j = ((r - s) % n + n) % n;
        GCOMP_CHECK(gcomp__ring_start(call, slot(&d, send_j), d.slot_bytes[send_j], slot(&d, recv_j), d.msg_cap));
        GCOMP_STEP(call, finish(&d, prev));
        GCOMP_CHECK(gcomp__ring_finish(call, &d.slot_bytes[recv_j]));
        prev = recv_j;
    }
    GCOMP_STEP(call, finish(&d, prev));
    call->st->last_schedule = GCOMP_SCHED_INTEGER;
    return GCOMP_SUCCESS;
}
