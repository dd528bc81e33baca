/*
 * ring.c — the ring primitives (ring.h): every schedule's transfers pass here, so the wire
 * bytes, the time on the wire and the local-failure convention live in one place.
 */
#include "ring.h"

void gcomp__chunk(size_t count, int n_chunks, int c, size_t align, size_t *lo, size_t *hi)
{
    size_t per = count / (size_t)n_chunks;
    size_t l = (per * (size_t)c) / align * align, h = (per * (size_t)(c + 1)) / align * align;
    if (c + 1 == n_chunks) h = count;
    *lo = l < count ? l : count;
    *hi = h < count ? h : count;
}

gcomp_result gcomp__ring_start(gcomp__ring *r, const void *sbuf, size_t sbytes, void *rbuf, size_t rcap)
{
    if (r->error) sbytes = 0;
    r->st->wire_bytes += sbytes;
    return r->tp->start_sendrecv(r->tp, gcomp__ring_right(r), sbuf, sbytes, gcomp__ring_left(r), rbuf, rcap);
}

gcomp_result gcomp__ring_start_sized(gcomp__ring *r, const void *sbuf, size_t sbytes, void *rbuf, size_t rbytes)
{
    if (!r->tp->start_sendrecv_sized) return gcomp__ring_start(r, sbuf, sbytes, rbuf, rbytes);
    r->st->wire_bytes += sbytes;
    return r->tp->start_sendrecv_sized(r->tp, gcomp__ring_right(r), sbuf, sbytes, gcomp__ring_left(r), rbuf, rbytes);
}

gcomp_result gcomp__ring_finish(gcomp__ring *r, size_t *rbytes)
{
    double t0 = gcomp__now();
    GCOMP_CHECK(r->tp->finish_sendrecv(r->tp, rbytes, r->deadline));
    r->st->comm_s += gcomp__now() - t0;
    return GCOMP_SUCCESS;
}

gcomp_result gcomp__ring_exchange(gcomp__ring *r, const void *sbuf, size_t sbytes, void *rbuf, size_t rcap,
                                  size_t *rbytes)
{
    GCOMP_CHECK(gcomp__ring_start(r, sbuf, sbytes, rbuf, rcap));
    return gcomp__ring_finish(r, rbytes);
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
