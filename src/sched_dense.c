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
 * Wire bytes per rank: sum over 2(N-1) steps of one chunk's payload (header included).
 */
#include <string.h>

#include "engine.h"

#define DENSE_ALIGN 64 /* chunk boundaries on cache lines */

typedef struct dense_ctx {
    gcomp__call *call;
    gcomp_codec *codec;
    int use_ef;
    size_t bound;    /* payload capacity of one chunk */
    uint8_t *slots;  /* N payloads of `bound` bytes: own chunks, later final chunks */
    float *acc;      /* fp32 running sums, count elements */
} dense_ctx;

static uint8_t *slot(dense_ctx *d, int j) { return d->slots + (size_t)j * d->bound; }

static void chunk_of(const dense_ctx *d, int j, size_t *lo, size_t *hi)
{
    const gcomp__transport *tp = d->call->comm->tp;
    gcomp__chunk(d->call->count, tp->size, j, DENSE_ALIGN, lo, hi);
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

static gcomp_result decode_into(dense_ctx *d, const uint8_t *payload, size_t bytes, int j, float *dst)
{
    size_t lo, hi;
    double t0 = gcomp__now();
    chunk_of(d, j, &lo, &hi);
    GCOMP_CHECK(gcomp_codec_decode_add(d->codec, payload, bytes, dst + lo, hi - lo));
    d->call->st->decode_s += gcomp__now() - t0;
    return GCOMP_SUCCESS;
}

static void zero_chunk(dense_ctx *d, int j, float *dst)
{
    size_t lo, hi;
    chunk_of(d, j, &lo, &hi);
    memset(dst + lo, 0, (hi - lo) * sizeof(float));
}

static gcomp_result exchange(dense_ctx *d, const void *sbuf, size_t sbytes, void *rbuf, size_t *rbytes)
{
    gcomp__transport *tp = d->call->comm->tp;
    double t0 = gcomp__now();
    GCOMP_CHECK(tp->sendrecv(tp, (tp->rank + 1) % tp->size, sbuf, sbytes, (tp->rank + tp->size - 1) % tp->size, rbuf,
                             d->bound, rbytes, d->call->deadline));
    d->call->st->wire_bytes += sbytes;
    d->call->st->comm_s += gcomp__now() - t0;
    return GCOMP_SUCCESS;
}

static gcomp_result reduce_scatter(dense_ctx *d, size_t *own_bytes, uint8_t *sbuf, uint8_t *rbuf)
{
    int n = d->call->comm->tp->size, r = d->call->comm->tp->rank;
    size_t sbytes = own_bytes[r], rbytes = 0;
    const uint8_t *out = slot(d, r);
    for (int s = 0; s < n - 1; s++) {
        int recv_j = ((r - s - 1) % n + n) % n;
        GCOMP_CHECK(exchange(d, out, sbytes, rbuf, &rbytes));
        zero_chunk(d, recv_j, d->acc);
        GCOMP_CHECK(decode_into(d, rbuf, rbytes, recv_j, d->acc));
        GCOMP_CHECK(decode_into(d, slot(d, recv_j), own_bytes[recv_j], recv_j, d->acc));
        if (s + 1 < n - 1) { /* re-encode the partial sum for the next hop */
            GCOMP_CHECK(encode_chunk(d, d->acc, recv_j, 0, sbuf, &sbytes));
            out = sbuf;
        }
    }
    return GCOMP_SUCCESS;
}

static gcomp_result allgather(dense_ctx *d, size_t *bytes)
{
    int n = d->call->comm->tp->size, r = d->call->comm->tp->rank;
    for (int s = 0; s < n - 1; s++) {
        int send_j = ((r + 1 - s) % n + n) % n, recv_j = ((r - s) % n + n) % n;
        GCOMP_CHECK(exchange(d, slot(d, send_j), bytes[send_j], slot(d, recv_j), &bytes[recv_j]));
        zero_chunk(d, recv_j, d->call->result);
        GCOMP_CHECK(decode_into(d, slot(d, recv_j), bytes[recv_j], recv_j, d->call->result));
    }
    return GCOMP_SUCCESS;
}

/* The dense ring with a given codec object; use_ef applies the key's residual. */
gcomp_result gcomp__sched_dense_with(gcomp__call *call, gcomp_codec *codec, int use_ef)
{
    gcomp_comm *c = call->comm;
    int n = c->tp->size, r = c->tp->rank, own = (r + 1) % n;
    size_t max_chunk = call->count / (size_t)n + 2 * DENSE_ALIGN, *bytes;
    dense_ctx d;
    d.call = call;
    d.codec = codec;
    d.use_ef = use_ef;
    d.bound = gcomp_codec_max_encoded_bytes(codec, max_chunk < call->count ? max_chunk : call->count);
    d.bound = (d.bound + 7) & ~(size_t)7; /* keeps the size array after the slots aligned */
    GCOMP_CHECK(gcomp__reserve(&c->pay, &c->pay_cap, (size_t)n * d.bound + (size_t)n * sizeof(size_t)));
    GCOMP_CHECK(gcomp__reserve(&c->acc, &c->acc_cap, call->count * sizeof(float)));
    GCOMP_CHECK(gcomp__reserve(&c->sbuf, &c->sbuf_cap, d.bound));
    GCOMP_CHECK(gcomp__reserve(&c->rbuf, &c->rbuf_cap, d.bound));
    d.slots = c->pay;
    d.acc = c->acc;
    bytes = (size_t *)(d.slots + (size_t)n * d.bound);
    for (int j = 0; j < n; j++) GCOMP_CHECK(encode_chunk(&d, call->x, j, use_ef, slot(&d, j), &bytes[j]));
    GCOMP_CHECK(reduce_scatter(&d, bytes, c->sbuf, c->rbuf));
    GCOMP_CHECK(encode_chunk(&d, d.acc, own, 0, slot(&d, own), &bytes[own]));
    zero_chunk(&d, own, call->result);
    GCOMP_CHECK(decode_into(&d, slot(&d, own), bytes[own], own, call->result));
    GCOMP_CHECK(allgather(&d, bytes));
    call->st->last_schedule = GCOMP_SCHED_DENSE;
    return GCOMP_SUCCESS;
}

gcomp_result gcomp__sched_dense(gcomp__call *call) { return gcomp__sched_dense_with(call, call->comm->codec, 1); }
