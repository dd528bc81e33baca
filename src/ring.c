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
    r->fail_at = r->nonfinite_at = NOT_SENT;
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

static void write_trailer(gcomp__ring *r, uint8_t *p)
{
    note_own_news(r);
    p[0] = (uint8_t)(TRAILER_MAGIC & 0xff);
    p[1] = (uint8_t)(TRAILER_MAGIC >> 8);
    p[2] = TRAILER_VERSION;
    p[3] = (uint8_t)r->flags;
    gcomp_le_store_u32(p + 4, r->seq);
    gcomp_le_store_u64(p + 8, r->fail);
}

/* The trailer at the end of a message of `bytes` bytes: merged into what this rank knows, or
 * a local failure when it is missing or not of this call. Returns the payload's size. */
static size_t read_trailer(gcomp__ring *r, const uint8_t *msg, size_t bytes)
{
    const uint8_t *p = msg + bytes - GCOMP__RING_TRAILER;
    uint64_t fail;
    if (bytes < GCOMP__RING_TRAILER || (p[0] | p[1] << 8) != TRAILER_MAGIC || p[2] != TRAILER_VERSION ||
        gcomp_le_load_u32(p + 4) != r->seq) {
        GCOMP_STEP(r, gcomp__fail(GCOMP_ERR_CORRUPT,
                                  "ring message of %zu bytes from rank %d lacks this call's outcome trailer "
                                  "(truncated, or of another call)",
                                  bytes, gcomp__ring_left(r)));
        return 0;
    }
    fail = gcomp_le_load_u64(p + 8);
    r->flags |= p[3] & GCOMP__RING_NONFINITE;
    if (fail > r->fail) r->fail = fail;
    if (fail && !r->error) { /* stop working, as after a failure of this rank's own */
        r->error = (gcomp_result)(fail >> 32);
        r->heard = 1;
    }
    return bytes - GCOMP__RING_TRAILER;
}

gcomp_result gcomp__ring_start(gcomp__ring *r, void *sbuf, size_t sbytes, void *rbuf, size_t rcap)
{
    if (r->error) sbytes = 0;
    if (r->trailer) {
        write_trailer(r, (uint8_t *)sbuf + sbytes);
        sbytes += GCOMP__RING_TRAILER;
        rcap += GCOMP__RING_TRAILER;
    }
    r->rbuf = rbuf;
    r->msgs++;
    r->st->wire_bytes += sbytes;
    return r->tp->start_sendrecv(r->tp, gcomp__ring_right(r), sbuf, sbytes, gcomp__ring_left(r), rbuf, rcap);
}

gcomp_result gcomp__ring_start_sized(gcomp__ring *r, void *sbuf, size_t sbytes, void *rbuf, size_t rbytes)
{
    if (r->trailer || !r->tp->start_sendrecv_sized) return gcomp__ring_start(r, sbuf, sbytes, rbuf, rbytes);
    r->msgs++;
    r->st->wire_bytes += sbytes;
    return r->tp->start_sendrecv_sized(r->tp, gcomp__ring_right(r), sbuf, sbytes, gcomp__ring_left(r), rbuf, rbytes);
}

gcomp_result gcomp__ring_finish(gcomp__ring *r, size_t *rbytes)
{
    double t0 = gcomp__now();
    GCOMP_CHECK(r->tp->finish_sendrecv(r->tp, rbytes, r->deadline));
    r->st->comm_s += gcomp__now() - t0;
    if (r->trailer) *rbytes = read_trailer(r, r->rbuf, *rbytes);
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
    uint64_t need = (uint64_t)(r->size - 1); /* hops to every other rank */
    o.fail = r->fail;
    o.nonfinite = (r->flags & GCOMP__RING_NONFINITE) != 0 || r->nonfinite;
    /* own news first sent in message m reaches every rank iff msgs - m >= N - 1; news never
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
    msgs = sched == GCOMP_SCHED_SPARSE ? (uint64_t)n : 2 * (uint64_t)(n - 1);
    return msgs * GCOMP__RING_TRAILER;
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
