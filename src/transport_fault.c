/*
 * transport_fault.c — a transport decorator that injects faults for tests: it forwards
 * every call to the transport it wraps, except what a test armed (the next message sent
 * loses its last byte). The engine's hot path knows nothing of it: a communicator's
 * transport is wrapped only when a test asks (gcomp__comm_inject_fault).
 */
#include <stdlib.h>

#include "transport.h"

typedef struct fault_transport {
    gcomp__transport base;
    gcomp__transport *inner;
    int truncate_next;
} fault_transport;

static gcomp_result fault_start(gcomp__transport *t, int to, const void *sbuf, size_t sbytes, int from, void *rbuf,
                                size_t rcap)
{
    fault_transport *f = (fault_transport *)t;
    if (f->truncate_next && sbytes > 0) {
        f->truncate_next = 0;
        sbytes--;
    }
    return f->inner->start_sendrecv(f->inner, to, sbuf, sbytes, from, rbuf, rcap);
}

static gcomp_result fault_finish(gcomp__transport *t, size_t *rbytes, double deadline)
{
    fault_transport *f = (fault_transport *)t;
    return f->inner->finish_sendrecv(f->inner, rbytes, deadline);
}

static void fault_progress(gcomp__transport *t)
{
    fault_transport *f = (fault_transport *)t;
    f->inner->progress(f->inner);
}

static gcomp_result fault_max_u64(gcomp__transport *t, uint64_t *vals, size_t n, double deadline)
{
    fault_transport *f = (fault_transport *)t;
    return f->inner->allreduce_max_u64(f->inner, vals, n, deadline);
}

static gcomp_result fault_sum_f32(gcomp__transport *t, float *vals, size_t n, double deadline)
{
    fault_transport *f = (fault_transport *)t;
    return f->inner->allreduce_sum_f32(f->inner, vals, n, deadline);
}

static void fault_destroy(gcomp__transport *t)
{
    fault_transport *f = (fault_transport *)t;
    f->inner->destroy(f->inner);
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
    f->base = *inner;
    f->base.start_sendrecv = fault_start;
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
