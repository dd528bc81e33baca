/*
 * transport_staging.c — device buffers over a host transport (MPI without CUDA support):
 * every message goes through page-locked host bounce buffers.
 *
 *   start_sendrecv   copy the device send buffer into the send bounce buffer (on the call's
 *                    stream, then wait for it: the host transport reads it from now on), and
 *                    start the host exchange into the receive bounce buffer
 *   finish_sendrecv  finish the host exchange, then enqueue the copy of what arrived into the
 *                    device receive buffer on the stream (what the caller enqueues next on the
 *                    stream comes after it, as transport.h promises)
 *   allreduce_sum_f32  the same round trip through a third bounce buffer
 *   allreduce_max_u64  forwarded: the agreements are host memory already
 *
 * A bounce buffer is reused only after a wait on the stream that follows the copy out of it
 * (the next start waits for its own copy in, which the stream orders after the previous copy
 * out), so no copy of one exchange overlaps the next. The buffers grow to the largest message
 * and are kept: steady state allocates nothing. Growing one frees the old buffer only after a
 * wait on the stream (the previous finish's copy out of it may still be queued there).
 *
 * Waits on the stream take the deadline of the call in progress: the decorator learns it
 * from every entry that gets one (the engine's agreement at the start of each call is the
 * first), and a wait that passes it is GCOMP_ERR_TIMEOUT (the user's stream may hold work
 * that never ends: a kernel waiting on something else). The decorator does not own the host
 * transport (the communicator owns both). After a timed-out exchange the host transport may
 * still use the bounce buffers (MPI cannot cancel a send): they are then left allocated
 * rather than freed under it. Device buffers are never handed to the host transport, so the
 * communicator may free its device workspace after a timeout.
 *
 * Every device operation goes through the device layer (cuda/device.cu): this file calls no
 * CUDA runtime function itself, and with the host's device ops it runs (copying through plain
 * memory) on any machine, which is how its logic is tested without a GPU.
 */
#include <stdlib.h>
#include <string.h>

#include "transport_staging.h"

typedef struct staging_transport {
    gcomp__transport base;
    gcomp__transport *inner; /* host memory, not owned */
    const gcomp__device_ops *dev;
    void *sb, *rb, *cb; /* bounce buffers: send, receive, collective */
    size_t scap, rcap, ccap;
    void *rdst;    /* the receive in flight: where its bytes go on the device */
    size_t expect; /* its exact size (start_sendrecv_sized), or SIZE_MAX: any up to capacity */
    uint64_t allocs;
    int leak;             /* an exchange or collective timed out: keep the bounce buffers */
    double call_deadline; /* the deadline of the latest entry that got one; 0: none yet */
} staging_transport;

static staging_transport *st_of(gcomp__transport *t) { return (staging_transport *)t; }

/* Wait for the stream within the call's deadline (none known yet: no limit). */
static gcomp_result wait_stream(staging_transport *s)
{
    double left_ms = 1e3 * (s->call_deadline - gcomp__now());
    /* timeout_ms may be as large as INT64_MAX: a double that far out no longer fits an int64 */
    int64_t timeout_ms = s->call_deadline <= 0 ? -1
                         : left_ms >= 0x1p62 ? INT64_MAX
                         : left_ms > 0       ? (int64_t)left_ms
                                             : 0;
    gcomp_result rc = s->dev->wait(s->base.stream, timeout_ms);
    if (rc == GCOMP_ERR_TIMEOUT)
        return gcomp__fail(rc, "staging transport: the stream's work before the exchange was not done before the "
                               "call's deadline (GCOMP_TIMEOUT_MS): %s",
                           gcomp_last_error());
    return rc;
}

/* Grow a bounce buffer to at least bytes (the old contents are not kept: callers refill it).
 * A copy out of the old buffer may still be queued on the stream: wait for it first. */
static gcomp_result reserve(staging_transport *s, void **buf, size_t *cap, size_t bytes)
{
    void *p = NULL;
    if (bytes <= *cap && *buf) return GCOMP_SUCCESS;
    if (*buf) GCOMP_CHECK(wait_stream(s));
    GCOMP_CHECK(s->dev->alloc_pinned(bytes, &p));
    s->allocs++;
    s->dev->free_pinned(*buf);
    *buf = p;
    *cap = bytes;
    return GCOMP_SUCCESS;
}

/* Device work enqueued before start must be done before the host transport reads. */
static gcomp_result copy_in(staging_transport *s, void *host, const void *device, size_t bytes)
{
    if (!bytes) return GCOMP_SUCCESS;
    GCOMP_CHECK(s->dev->copy_async(host, device, bytes, s->base.stream));
    return wait_stream(s);
}

static gcomp_result staging_start(gcomp__transport *t, int to, const void *sbuf, size_t sbytes, int from, void *rbuf,
                                  size_t rcap)
{
    staging_transport *s = st_of(t);
    /* a message is at most what its receiver accepts, and every rank posts the same capacity
     * for an exchange: sizing the send buffer by it too means a data-dependent size (top-k)
     * that grows later allocates nothing */
    GCOMP_CHECK(reserve(s, &s->sb, &s->scap, sbytes > rcap ? sbytes : rcap));
    GCOMP_CHECK(reserve(s, &s->rb, &s->rcap, rcap));
    GCOMP_CHECK(copy_in(s, s->sb, sbuf, sbytes));
    s->rdst = rbuf;
    s->expect = SIZE_MAX;
    return s->inner->start_sendrecv(s->inner, to, s->sb, sbytes, from, s->rb, rcap);
}

/* Both ends know the sizes (transport.h): the host transport carries them as it does any
 * message; what arrives must be exactly rbytes, as the entry's contract promises. */
static gcomp_result staging_start_sized(gcomp__transport *t, int to, const void *sbuf, size_t sbytes, int from,
                                        void *rbuf, size_t rbytes)
{
    GCOMP_CHECK(staging_start(t, to, sbuf, sbytes, from, rbuf, rbytes));
    st_of(t)->expect = rbytes;
    return GCOMP_SUCCESS;
}

static void note_timeout(staging_transport *s, gcomp_result rc)
{
    if (rc == GCOMP_ERR_TIMEOUT && !s->inner->releases_buffers_on_timeout) s->leak = 1;
}

static gcomp_result staging_finish(gcomp__transport *t, size_t *rbytes, double deadline)
{
    staging_transport *s = st_of(t);
    gcomp_result rc;
    s->call_deadline = deadline;
    rc = s->inner->finish_sendrecv(s->inner, rbytes, deadline);
    note_timeout(s, rc);
    GCOMP_CHECK(rc);
    if (s->expect != SIZE_MAX && *rbytes != s->expect)
        return gcomp__fail(GCOMP_ERR_TRANSPORT, "staging transport: a message of %zu bytes where both ends agreed on %zu",
                           *rbytes, s->expect);
    if (!*rbytes) return GCOMP_SUCCESS;
    return s->dev->copy_async(s->rdst, s->rb, *rbytes, s->base.stream);
}

static void staging_progress(gcomp__transport *t) { st_of(t)->inner->progress(st_of(t)->inner); }

static gcomp_result staging_max_u64(gcomp__transport *t, uint64_t *vals, size_t n, double deadline)
{
    staging_transport *s = st_of(t);
    s->call_deadline = deadline; /* the call's: its agreement comes first */
    return s->inner->allreduce_max_u64(s->inner, vals, n, deadline);
}

static gcomp_result staging_sum_f32(gcomp__transport *t, float *vals, size_t n, double deadline)
{
    staging_transport *s = st_of(t);
    size_t bytes = n * sizeof(float);
    gcomp_result rc;
    s->call_deadline = deadline;
    GCOMP_CHECK(reserve(s, &s->cb, &s->ccap, bytes));
    GCOMP_CHECK(copy_in(s, s->cb, vals, bytes));
    rc = s->inner->allreduce_sum_f32(s->inner, (float *)s->cb, n, deadline);
    note_timeout(s, rc);
    GCOMP_CHECK(rc);
    if (!bytes) return GCOMP_SUCCESS;
    return s->dev->copy_async(vals, s->cb, bytes, s->base.stream);
}

static void staging_destroy(gcomp__transport *t)
{
    staging_transport *s = st_of(t);
    if (!s->leak) { /* else the host transport may still use them (see the top) */
        s->dev->free_pinned(s->sb);
        s->dev->free_pinned(s->rb);
        s->dev->free_pinned(s->cb);
    }
    free(s);
}

gcomp_result gcomp__transport_staging_wrap(gcomp__transport *inner, const gcomp__device_ops *dev,
                                           gcomp__transport **out)
{
    staging_transport *s;
    *out = NULL;
    if (!inner || !dev || inner->mem != GCOMP__MEM_HOST)
        return gcomp__fail(GCOMP_ERR_INTERNAL, "staging transport: needs a host-memory transport and a device");
    s = calloc(1, sizeof *s);
    if (!s) return gcomp__fail(GCOMP_ERR_NOMEM, "staging transport: out of memory");
    /* every entry set here; optional ones stay NULL (none is forwarded blindly) */
    s->base.rank = inner->rank;
    s->base.size = inner->size;
    s->base.mem = dev->kind == GCOMP__DEVICE_CUDA ? GCOMP__MEM_CUDA : GCOMP__MEM_HOST;
    /* the device of the buffers that made it (the engine makes it at their first call, with
     * their device current); the engine refuses buffers of another */
    s->base.device = dev->kind == GCOMP__DEVICE_CUDA ? gcomp__device_current() : -1;
    s->base.releases_buffers_on_timeout = 1; /* the caller's buffers never reach inner */
    s->base.start_sendrecv = staging_start;
    s->base.start_sendrecv_sized = staging_start_sized;
    s->base.finish_sendrecv = staging_finish;
    s->base.progress = staging_progress;
    s->base.allreduce_max_u64 = staging_max_u64;
    s->base.allreduce_sum_f32 = staging_sum_f32;
    s->base.destroy = staging_destroy;
    s->base.threads_ok = inner->threads_ok;
    s->inner = inner;
    s->dev = dev;
    *out = &s->base;
    return GCOMP_SUCCESS;
}

void gcomp__transport_staging_rebind(gcomp__transport *t, gcomp__transport *inner)
{
    if (t && t->destroy == staging_destroy && inner) st_of(t)->inner = inner;
}

uint64_t gcomp__transport_staging_allocs(const gcomp__transport *t)
{
    return t && t->destroy == staging_destroy ? ((const staging_transport *)t)->allocs : 0;
}
