/*
 * transport_fault.c — a transport decorator that injects faults for tests: it forwards
 * every call to the transport it wraps (the optional sized and any-size exchanges too, when
 * the inner one has them), except what a test armed (the next message sent loses its last
 * byte, or goes out with its last 8 bytes garbled). The
 * engine's hot path knows nothing of it: a communicator's transport is wrapped only when a
 * test asks (gcomp__comm_inject_fault).
 */
#include <stdlib.h>
#include <string.h>

#include "transport.h"

typedef struct fault_transport {
    gcomp__transport base;
    gcomp__transport *inner;
    int truncate_next;
    int garble_next;
    uint8_t *garbled; /* the garbled copy sent (kept until destroy: the exchange may read it) */
} fault_transport;

/* The transport underneath, told the stream of the call in progress: the engine sets it on
 * the transport it holds -- this one -- before each call (transport.h), and the inner one
 * (NCCL, staging) reads its own field. */
static gcomp__transport *inner_of(gcomp__transport *t)
{
    fault_transport *f = (fault_transport *)t;
    f->inner->stream = f->base.stream;
    return f->inner;
}

/* The size the next message is sent with: one byte less once, when armed. */
static size_t sent_size(gcomp__transport *t, size_t sbytes)
{
    fault_transport *f = (fault_transport *)t;
    if (f->truncate_next && sbytes > 0) {
        f->truncate_next = 0;
        sbytes--;
    }
    return sbytes;
}

/* The bytes the next message is sent from: a copy whose last 8 bytes say failure code 0xff
 * (little-endian u64 0xff << 32, rank 0) once, when armed and the message is long enough. */
static const void *sent_bytes(gcomp__transport *t, const void *sbuf, size_t sbytes)
{
    fault_transport *f = (fault_transport *)t;
    static const uint8_t code[8] = { 0, 0, 0, 0, 0xff, 0, 0, 0 };
    if (!f->garble_next || sbytes < 8 || f->garbled) return sbuf;
    if (!(f->garbled = malloc(sbytes))) return sbuf;
    f->garble_next = 0;
    memcpy(f->garbled, sbuf, sbytes);
    memcpy(f->garbled + sbytes - 8, code, 8);
    return f->garbled;
}

static gcomp_result fault_start(gcomp__transport *t, int to, const void *sbuf, size_t sbytes, int from, void *rbuf,
                                size_t rcap)
{
    gcomp__transport *in = inner_of(t);
    return in->start_sendrecv(in, to, sent_bytes(t, sbuf, sbytes), sent_size(t, sbytes), from, rbuf, rcap);
}

/* Only offered when the inner transport has the entry. A truncated message breaks the sized
 * entry's promise (the receiver was told the exact size): that is the fault. A receiver that
 * checks the size (the staging decorator) fails the exchange with GCOMP_ERR_TRANSPORT; what
 * NCCL does with a short send against its posted receive is NCCL's (no test injects it). */
static gcomp_result fault_start_sized(gcomp__transport *t, int to, const void *sbuf, size_t sbytes, int from,
                                      void *rbuf, size_t rbytes)
{
    gcomp__transport *in = inner_of(t);
    return in->start_sendrecv_sized(in, to, sent_bytes(t, sbuf, sbytes), sent_size(t, sbytes), from, rbuf, rbytes);
}

static gcomp_result fault_start_any(gcomp__transport *t, int to, const void *sbuf, size_t sbytes, int from,
                                    void *rbuf, size_t rcap)
{
    gcomp__transport *in = inner_of(t);
    return in->start_sendrecv_any(in, to, sent_bytes(t, sbuf, sbytes), sent_size(t, sbytes), from, rbuf, rcap);
}

static gcomp_result fault_finish(gcomp__transport *t, size_t *rbytes, double deadline)
{
    gcomp__transport *in = inner_of(t);
    return in->finish_sendrecv(in, rbytes, deadline);
}

static void fault_progress(gcomp__transport *t)
{
    gcomp__transport *in = inner_of(t);
    in->progress(in);
}

static gcomp_result fault_max_u64(gcomp__transport *t, uint64_t *vals, size_t n, double deadline)
{
    gcomp__transport *in = inner_of(t);
    return in->allreduce_max_u64(in, vals, n, deadline);
}

static gcomp_result fault_sum_f32(gcomp__transport *t, float *vals, size_t n, double deadline)
{
    gcomp__transport *in = inner_of(t);
    return in->allreduce_sum_f32(in, vals, n, deadline);
}

static void fault_destroy(gcomp__transport *t)
{
    fault_transport *f = (fault_transport *)t;
    f->inner->destroy(f->inner);
    free(f->garbled);
    free(f);
}

gcomp_result gcomp__transport_fault_wrap(gcomp__transport *inner, gcomp__transport **out)
{
    fault_transport *f;
    if (inner->destroy == fault_destroy) { /* already wrapped */
        *out = inner;
        return GCOMP_SUCCESS;
    }
    f = calloc(1, sizeof *f);
    if (!f) return gcomp__fail(GCOMP_ERR_NOMEM, "fault transport: out of memory");
    /* every field of transport.h set here, none copied blindly: a copied entry would be called
     * with this wrapper as its `t` (an optional entry such as start_sendrecv_sized crashed so);
     * a field added to gcomp__transport must be added here too */
    f->base.rank = inner->rank;
    f->base.size = inner->size;
    f->base.mem = inner->mem;
    f->base.device = inner->device;
    f->base.stream = inner->stream;
    f->base.releases_buffers_on_timeout = inner->releases_buffers_on_timeout;
    f->base.threads_ok = inner->threads_ok; /* takes no transport (transport.h) */
    f->base.no_byte_stages = inner->no_byte_stages;
    f->base.start_sendrecv = fault_start;
    f->base.start_sendrecv_sized = inner->start_sendrecv_sized ? fault_start_sized : NULL;
    f->base.start_sendrecv_any = inner->start_sendrecv_any ? fault_start_any : NULL;
    f->base.finish_sendrecv = fault_finish;
    f->base.progress = fault_progress;
    f->base.allreduce_max_u64 = fault_max_u64;
    f->base.allreduce_sum_f32 = fault_sum_f32;
    f->base.destroy = fault_destroy;
    f->inner = inner;
    *out = &f->base;
    return GCOMP_SUCCESS;
}

void gcomp__transport_fault_truncate_next(gcomp__transport *t)
{
    if (t && t->destroy == fault_destroy) ((fault_transport *)t)->truncate_next = 1;
}

void gcomp__transport_fault_garble_next(gcomp__transport *t)
{
    if (t && t->destroy == fault_destroy) ((fault_transport *)t)->garble_next = 1;
}
