/*
 * ring.c — the ring primitives (ring.h): every schedule's transfers pass here, so the wire
 * bytes, the time on the wire, the local-failure convention and the outcome trailer live in
 * one place.
 */
#include <string.h>

#include "codecs/common.h"
#include "ring.h"

#define TRAILER_MAGIC 0x6f47u
#define TRAILER_VERSION 1u
#define NOT_SENT UINT64_MAX

void gcomp__chunk(size_t count, int n_chunks, int c, size_t align, size_t *lo, size_t *hi)
{
    size_t per = count / (size_t)n_chunks;
    size_t l = (per * (size_t)c) / align * align, h = (per * (size_t)(c + 1)) / align * align;
    if (c + 1 == n_chunks) h = count;
    *lo = l < count ? l : count;
    *hi = h < count ? h : count;
}

size_t gcomp__chunk_max(size_t count, int n_chunks, size_t align)
{
    size_t most = 0, lo, hi;
    for (int c = 0; c < n_chunks; c++) {
        gcomp__chunk(count, n_chunks, c, align, &lo, &hi);
        if (hi - lo > most) most = hi - lo;
    }
    return most;
}

void gcomp__ring_begin(gcomp__ring *r, int trailer, uint32_t seq)
{
    r->error = GCOMP_SUCCESS;
    r->nonfinite = 0;
    r->trailer = trailer;
    r->seq = seq;
    r->fail = 0;
    r->flags = 0;
    r->heard = 0;
    r->msgs = 0;
    r->block_in_flight = 0;
    r->fail_at = r->nonfinite_at = NOT_SENT;
    r->agree_n = 0;
    r->butterfly = 0;
    r->reach = r->size - 1;
    r->peer = gcomp__ring_left(r);
    r->verdict = NULL;
    r->verdict_ctx = NULL;
    r->stop = GCOMP_SUCCESS;
}

int gcomp__ring_butterfly_steps(int n)
{
    int k = 0;
    if (n < 4 || (n & (n - 1))) return 0;
    while ((1 << k) < n) k++;
    return k;
}

int gcomp__ring_doubling_steps(int n) { return n == 2 ? 1 : gcomp__ring_butterfly_steps(n); }

void gcomp__ring_use_butterfly(gcomp__ring *r)
{
    int k = gcomp__ring_butterfly_steps(r->size);
    if (k == 0 || r->msgs > 0) return;
    r->butterfly = 1;
    r->reach = k;
}

/* The peers of the message about to start: the neighbours, or the butterfly's partner. */
static void next_peers(const gcomp__ring *r, int *to, int *from)
{
    if (r->butterfly) {
        *to = *from = r->rank ^ (1 << (int)(r->msgs % (uint64_t)r->reach));
        return;
    }
    *to = gcomp__ring_right(r);
    *from = gcomp__ring_left(r);
}

void gcomp__ring_agree(gcomp__ring *r, const uint64_t *block, size_t n, gcomp__ring_verdict verdict, void *ctx)
{
    if (!r->trailer || r->size < 2 || n == 0 || n > GCOMP__RING_AGREE_MAX) return;
    memset(r->agree_mine, 0, sizeof r->agree_mine);
    memcpy(r->agree_mine, block, n * sizeof *block);
    memcpy(r->agree_all, r->agree_mine, sizeof r->agree_all);
    r->agree_n = n;
    r->verdict = verdict;
    r->verdict_ctx = ctx;
}

/* Bytes after a message's payload: the trailer, and the agreement block before it. */
static size_t trailer_len(int with_block)
{
    return GCOMP__RING_TRAILER_BASE + (with_block ? 8 * GCOMP__RING_AGREE_MAX : 0);
}

/* The next message carries the agreement block: one of the first r->reach. */
static int agreeing(const gcomp__ring *r) { return r->agree_n > 0 && r->msgs < (uint64_t)r->reach; }

static void write_block(const gcomp__ring *r, uint8_t *p)
{
    for (int i = 0; i < GCOMP__RING_AGREE_MAX; i++) gcomp_le_store_u64(p + 8 * i, r->agree_all[i]);
}

static void merge_block(gcomp__ring *r, const uint8_t *p)
{
    for (int i = 0; i < GCOMP__RING_AGREE_MAX; i++) {
        uint64_t v = gcomp_le_load_u64(p + 8 * i);
        if (v > r->agree_all[i]) r->agree_all[i] = v;
    }
}

/* This rank's news into what it knows, noting the first message that carries each. */
static void note_own_news(gcomp__ring *r)
{
    if (r->error && !r->heard && r->fail_at == NOT_SENT) {
        uint64_t mine = (uint64_t)(uint32_t)r->error << 32 | (uint32_t)r->rank;
        if (mine > r->fail) r->fail = mine;
        r->fail_at = r->msgs;
    }
    if (r->nonfinite && r->nonfinite_at == NOT_SENT) {
        r->flags |= GCOMP__RING_NONFINITE;
        r->nonfinite_at = r->msgs;
    }
}

static void write_trailer(gcomp__ring *r, uint8_t *p, int with_block)
{
    note_own_news(r);
    p[0] = (uint8_t)(TRAILER_MAGIC & 0xff);
    p[1] = (uint8_t)(TRAILER_MAGIC >> 8);
    p[2] = TRAILER_VERSION;
    p[3] = (uint8_t)(r->flags | (with_block ? GCOMP__RING_AGREEING : 0));
    gcomp_le_store_u32(p + 4, r->seq);
    gcomp_le_store_u64(p + 8, r->fail);
}

/* The trailer at the end of a message of `bytes` bytes (with_block: and the agreement block
 * before it): merged into what this rank knows, or a local failure when it is missing or not
 * of this call. A message longer than the receive (r->rcap: an any-size receive of a
 * neighbour that disagrees on the call) left its tail in msg: its trailer is read, its
 * payload is a local failure. Returns the payload's size. */
static size_t read_trailer(gcomp__ring *r, const uint8_t *msg, size_t bytes, int with_block)
{
    size_t have = bytes < r->rcap ? bytes : r->rcap; /* the message's last `have` bytes are in msg */
    size_t tlen = trailer_len(with_block);
    const uint8_t *p = msg + have - GCOMP__RING_TRAILER_BASE;
    uint64_t fail;
    if (have < tlen || (p[0] | p[1] << 8) != TRAILER_MAGIC || p[2] != TRAILER_VERSION ||
        gcomp_le_load_u32(p + 4) != r->seq || ((p[3] & GCOMP__RING_AGREEING) != 0) != (with_block != 0)) {
        GCOMP_STEP(r, gcomp__fail(GCOMP_ERR_CORRUPT,
                                  "ring message of %zu bytes from rank %d lacks this call's outcome trailer "
                                  "(truncated, or of another call)",
                                  bytes, r->peer));
        return 0;
    }
    fail = gcomp_le_load_u64(p + 8);
    /* a failure field that names no error or no rank, or flags this version does not have:
     * corrupt (heard as it is, it would end the call with no gcomp_result on some ranks) */
    if ((fail && (!gcomp__result_known((gcomp_result)(fail >> 32)) || (fail >> 32) == GCOMP_SUCCESS ||
                  (uint32_t)fail >= (uint32_t)r->size)) ||
        (p[3] & ~(GCOMP__RING_NONFINITE | GCOMP__RING_AGREEING))) {
        GCOMP_STEP(
            r, gcomp__fail(GCOMP_ERR_CORRUPT, "ring message from rank %d has a malformed outcome trailer", r->peer));
        return 0;
    }
    if (with_block) merge_block(r, msg + have - tlen);
    r->flags |= p[3] & GCOMP__RING_NONFINITE;
    if (fail > r->fail) r->fail = fail;
    if (fail && !r->error) { /* stop working, as after a failure of this rank's own */
        r->error = (gcomp_result)(fail >> 32);
        r->heard = 1;
    }
    if (bytes > r->rcap) {
        GCOMP_STEP(r, gcomp__fail(GCOMP_ERR_CORRUPT,
                                  "ring message of %zu bytes from rank %d is longer than the %zu bytes this call "
                                  "can receive (do the ranks disagree on the call?)",
                                  bytes, r->peer, r->rcap));
        return 0;
    }
    return bytes - tlen;
}

gcomp_result gcomp__ring_start(gcomp__ring *r, void *sbuf, size_t sbytes, void *rbuf, size_t rcap)
{
    int block = agreeing(r), to, from;
    if (r->stop) return r->stop; /* the agreement stopped the call on every rank */
    if (r->error) sbytes = 0;
    if (r->trailer) {
        uint8_t *p = (uint8_t *)sbuf + sbytes;
        size_t tlen = trailer_len(block);
        if (block) write_block(r, p);
        write_trailer(r, p + tlen - GCOMP__RING_TRAILER_BASE, block);
        sbytes += tlen;
        rcap += tlen;
    }
    next_peers(r, &to, &from);
    r->peer = from;
    r->rbuf = rbuf;
    r->rcap = rcap;
    r->block_in_flight = block;
    r->msgs++;
    r->st->wire_bytes += sbytes;
    if (block) return r->tp->start_sendrecv_any(r->tp, to, sbuf, sbytes, from, rbuf, rcap);
    return r->tp->start_sendrecv(r->tp, to, sbuf, sbytes, from, rbuf, rcap);
}

gcomp_result gcomp__ring_start_sized(gcomp__ring *r, void *sbuf, size_t sbytes, void *rbuf, size_t rbytes)
{
    int to, from;
    if (r->trailer || !r->tp->start_sendrecv_sized) return gcomp__ring_start(r, sbuf, sbytes, rbuf, rbytes);
    next_peers(r, &to, &from);
    r->peer = from;
    r->block_in_flight = 0; /* no trailer: no agreement in the messages (gcomp__ring_agree) */
    r->msgs++;
    r->st->wire_bytes += sbytes;
    return r->tp->start_sendrecv_sized(r->tp, to, sbuf, sbytes, from, rbuf, rbytes);
}

gcomp_result gcomp__ring_finish(gcomp__ring *r, size_t *rbytes)
{
    double t0 = gcomp__now();
    int block = r->block_in_flight;
    GCOMP_CHECK(r->tp->finish_sendrecv(r->tp, rbytes, r->deadline));
    r->st->comm_s += gcomp__now() - t0;
    if (r->trailer) *rbytes = read_trailer(r, r->rbuf, *rbytes, block);
    if (block && r->msgs == (uint64_t)r->reach) { /* the agreement is complete: the same on every rank */
        r->stop = r->verdict ? r->verdict(r->verdict_ctx, r->agree_mine, r->agree_all, r->agree_n) : GCOMP_SUCCESS;
        return r->stop;
    }
    return GCOMP_SUCCESS;
}

gcomp_result gcomp__ring_agree_pass(gcomp__ring *r, uint8_t *buf)
{
    size_t got;
    for (int s = 0; r->agree_n > 0 && s < r->reach; s++)
        GCOMP_CHECK(gcomp__ring_exchange(r, buf, 0, buf + GCOMP__RING_TRAILER, 0, &got));
    return GCOMP_SUCCESS;
}

gcomp_result gcomp__ring_exchange(gcomp__ring *r, void *sbuf, size_t sbytes, void *rbuf, size_t rcap, size_t *rbytes)
{
    GCOMP_CHECK(gcomp__ring_start(r, sbuf, sbytes, rbuf, rcap));
    return gcomp__ring_finish(r, rbytes);
}

gcomp_result gcomp__ring_outcome_hop(gcomp__ring *r, uint8_t *buf)
{
    size_t got;
    if (!r->trailer || r->size == 1) return GCOMP_SUCCESS;
    return gcomp__ring_exchange(r, buf, 0, buf + GCOMP__RING_TRAILER, 0, &got);
}

gcomp__ring_outcome gcomp__ring_outcome_get(const gcomp__ring *r)
{
    gcomp__ring_outcome o;
    uint64_t need = (uint64_t)r->reach; /* hops to every other rank */
    o.fail = r->fail;
    o.nonfinite = (r->flags & GCOMP__RING_NONFINITE) != 0 || r->nonfinite;
    /* own news first sent in message m reaches every rank iff msgs - m >= reach; news never
     * sent (found after the last message) reaches nobody */
    o.late = 0;
    if (r->error && !r->heard) {
        if (o.fail < ((uint64_t)(uint32_t)r->error << 32 | (uint32_t)r->rank))
            o.fail = (uint64_t)(uint32_t)r->error << 32 | (uint32_t)r->rank;
        if (r->fail_at == NOT_SENT || r->msgs - r->fail_at < need) o.late = need > 0;
    }
    if (r->nonfinite && (r->nonfinite_at == NOT_SENT || r->msgs - r->nonfinite_at < need)) o.late = need > 0;
    return o;
}

uint64_t gcomp__ring_trailer_bytes(gcomp_schedule sched, int n)
{
    uint64_t msgs;
    if (n <= 1 || sched == GCOMP_SCHED_BYPASS || sched == GCOMP_SCHED_NONE) return 0;
    if (sched == GCOMP_SCHED_SPARSE)
        msgs = (uint64_t)n;
    else if (sched == GCOMP_SCHED_DOUBLING)
        msgs = 2 * (uint64_t)gcomp__ring_doubling_steps(n);
    else
        msgs = 2 * (uint64_t)(n - 1);
    return msgs * GCOMP__RING_TRAILER_BASE;
}

uint64_t gcomp__ring_agree_bytes(int n, int butterfly, int pass)
{
    int k = butterfly ? gcomp__ring_butterfly_steps(n) : 0;
    if (n <= 1) return 0;
    return (uint64_t)(k ? k : n - 1) * (trailer_len(1) - (pass ? 0 : GCOMP__RING_TRAILER_BASE));
}

void gcomp__ring_progress(gcomp__ring *r) { r->tp->progress(r->tp); }

gcomp_result gcomp__ring_max_u64(gcomp__ring *r, uint64_t *vals, size_t n)
{
    double t0 = gcomp__now();
    GCOMP_CHECK(r->tp->allreduce_max_u64(r->tp, vals, n, r->deadline));
    r->st->wire_bytes += 8 * n;
    r->st->comm_s += gcomp__now() - t0;
    return GCOMP_SUCCESS;
}
