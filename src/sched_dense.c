/*
 * sched_dense.c — the dense ring for codecs whose values can be summed after decoding
 * (none, fp16, bf16; and top-k when a gather would cost more).
 *
 * Each rank first encodes its N chunks once (error feedback fused, so the residual keeps
 * what this first rounding dropped). Reduce-scatter, N-1 steps: send a chunk's payload to
 * the right, receive the left neighbour's partial sum of the next chunk, decode it, add this
 * rank's own decoded chunk in fp32 and re-encode. The rank then owns one fully reduced
 * chunk, encodes it a last time, and the allgather forwards those final payloads unchanged.
 * Every rank -- the owner included -- takes each result chunk from decoding its final
 * payload, so all ranks hold the same bits.
 *
 * Wire bytes per rank: the sum over 2(N-1) steps of one chunk's payload (header included),
 * about 2(N-1)/N * count * (bytes per element of the codec) + 2(N-1) * 32.
 */
#include <string.h>

#include "engine.h"

#define DENSE_ALIGN 64 /* chunk boundaries on cache lines */

typedef struct dense_ctx {
    gcomp__call *call;
    gcomp_codec *codec;
    size_t bound;   /* payload capacity of one chunk */
    uint8_t *slots; /* N payloads of `bound` bytes: own chunks, later final chunks */
    size_t *bytes;  /* their sizes */
    float *acc;     /* fp32 running sums, count elements */
} dense_ctx;

static uint8_t *slot(dense_ctx *d, int j) { return d->slots + (size_t)j * d->bound; }

static void chunk_of(const dense_ctx *d, int j, size_t *lo, size_t *hi)
{
    gcomp__chunk(d->call->count, d->call->comm->tp->size, j, DENSE_ALIGN, lo, hi);
}

/* Buffers of the ring; the same call in prepare and run (where it allocates nothing). */
static gcomp_result layout(gcomp__call *call, gcomp_codec *codec, dense_ctx *d)
{
    gcomp_comm *c = call->comm;
    int n = c->tp->size;
    size_t max_chunk = call->count / (size_t)n + 2 * DENSE_ALIGN;
    d->call = call;
    d->codec = codec;
    d->bound = gcomp_codec_max_encoded_bytes(codec, max_chunk < call->count ? max_chunk : call->count);
    d->bound = (d->bound + 7) & ~(size_t)7; /* keeps the size array after the slots aligned */
    GCOMP_CHECK(gcomp__reserve(&c->pay, &c->pay_cap, (size_t)n * d->bound + (size_t)n * sizeof(size_t)));
    GCOMP_CHECK(gcomp__reserve(&c->acc, &c->acc_cap, call->count * sizeof(float)));
    GCOMP_CHECK(gcomp__reserve(&c->sbuf, &c->sbuf_cap, d->bound));
    GCOMP_CHECK(gcomp__reserve(&c->rbuf, &c->rbuf_cap, d->bound));
    d->slots = c->pay;
    d->bytes = (size_t *)(d->slots + (size_t)n * d->bound);
    d->acc = c->acc;
    return GCOMP_SUCCESS;
}

gcomp_result gcomp__sched_dense_prepare(gcomp__call *call, gcomp_codec *codec)
{
    dense_ctx d;
    return layout(call, codec, &d);
}

static gcomp_result encode_chunk(dense_ctx *d, const float *src, int j, int with_ef, uint8_t *out, size_t *bytes)
{
    gcomp__call *call = d->call;
    gcomp_encode_ctx ctx = {0};
    size_t lo, hi;
    double t0 = gcomp__now();
    chunk_of(d, j, &lo, &hi);
    ctx.seed = call->comm->cfg.seed;
    ctx.step = call->step;
    ctx.rank = (uint32_t)call->comm->tp->rank;
    ctx.offset = lo;
    GCOMP_CHECK(gcomp__codec_encode_ctx(d->codec, &ctx, src + lo, with_ef && call->r_in ? call->r_in + lo : NULL,
                                        with_ef && call->r_out ? call->r_out + lo : NULL, hi - lo, out, d->bound, bytes));
    call->nonfinite |= with_ef ? (int)ctx.nonfinite : 0;
    call->st->overflow_count += ctx.overflow;
    call->st->encode_s += gcomp__now() - t0;
    return GCOMP_SUCCESS;
}

/* dst[chunk j] = decode(payload), or += when add. */
static gcomp_result decode_chunk(dense_ctx *d, const uint8_t *payload, size_t bytes, int j, float *dst, int add)
{
    size_t lo, hi;
    double t0 = gcomp__now();
    chunk_of(d, j, &lo, &hi);
    if (!add) memset(dst + lo, 0, (hi - lo) * sizeof(float));
    GCOMP_CHECK(gcomp_codec_decode_add(d->codec, payload, bytes, dst + lo, hi - lo));
    d->call->st->decode_s += gcomp__now() - t0;
    return GCOMP_SUCCESS;
}

static gcomp_result reduce_scatter(dense_ctx *d, uint8_t *sbuf, uint8_t *rbuf)
{
    gcomp__call *call = d->call;
    int n = call->comm->tp->size, r = call->comm->tp->rank;
    size_t sbytes = d->bytes[r], rbytes = 0;
    const uint8_t *out = slot(d, r);
    for (int s = 0; s < n - 1; s++) {
        int recv_j = ((r - s - 1) % n + n) % n;
        GCOMP_CHECK(gcomp__ring_exchange(call, out, sbytes, rbuf, d->bound, &rbytes));
        GCOMP_STEP(call, decode_chunk(d, rbuf, rbytes, recv_j, d->acc, 0));
        GCOMP_STEP(call, decode_chunk(d, slot(d, recv_j), d->bytes[recv_j], recv_j, d->acc, 1));
        if (s + 1 < n - 1) { /* re-encode the partial sum for the next hop */
            GCOMP_STEP(call, encode_chunk(d, d->acc, recv_j, 0, sbuf, &sbytes));
            out = sbuf;
        }
    }
    return GCOMP_SUCCESS;
}

static gcomp_result allgather(dense_ctx *d)
{
    gcomp__call *call = d->call;
    int n = call->comm->tp->size, r = call->comm->tp->rank;
    for (int s = 0; s < n - 1; s++) {
        int send_j = ((r + 1 - s) % n + n) % n, recv_j = ((r - s) % n + n) % n;
        GCOMP_CHECK(gcomp__ring_exchange(call, slot(d, send_j), d->bytes[send_j], slot(d, recv_j), d->bound,
                                         &d->bytes[recv_j]));
        GCOMP_STEP(call, decode_chunk(d, slot(d, recv_j), d->bytes[recv_j], recv_j, call->result, 0));
    }
    return GCOMP_SUCCESS;
}

gcomp_result gcomp__sched_dense(gcomp__call *call, gcomp_codec *codec, int use_ef)
{
    gcomp_comm *c = call->comm;
    int n = c->tp->size, own = (c->tp->rank + 1) % n;
    dense_ctx d;
    GCOMP_CHECK(layout(call, codec, &d));
    for (int j = 0; j < n; j++) GCOMP_STEP(call, encode_chunk(&d, call->x, j, use_ef, slot(&d, j), &d.bytes[j]));
    GCOMP_CHECK(reduce_scatter(&d, c->sbuf, c->rbuf));
    GCOMP_STEP(call, encode_chunk(&d, d.acc, own, 0, slot(&d, own), &d.bytes[own]));
    GCOMP_STEP(call, decode_chunk(&d, slot(&d, own), d.bytes[own], own, call->result, 0));
    GCOMP_CHECK(allgather(&d));
    call->st->last_schedule = GCOMP_SCHED_DENSE;
    return GCOMP_SUCCESS;
}
