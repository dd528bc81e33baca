/*
 * transport_loop.c — the loopback transport: N ranks as threads of one process.
 *
 * It exists so every schedule, the agreement and the failure paths can be tested with 1 to 8
 * ranks in a unit test, in milliseconds and without mpirun. It keeps the promises the engine
 * relies on from MPI: point-to-point messages between a pair of ranks arrive in order, a
 * message longer than the posted receive is an error (MPI_ERR_TRUNCATE), and every wait ends
 * at its deadline with GCOMP_ERR_TIMEOUT.
 *
 * Messages are copied into a FIFO queue per (sender, receiver), so a send never waits.
 * Collectives meet in one shared slot: each rank deposits its vector, the last to arrive
 * reduces them in rank order (so a float sum is deterministic), every rank copies the result
 * out, and the last reader opens the slot for the next collective. After a timeout the world
 * is, as an MPI communicator would be, unusable; it is freed only by gcomp__loop_world_destroy
 * once every thread is done with it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "transport.h"
#include "transport_loop.h"

typedef struct loop_msg {
    struct loop_msg *next;
    size_t bytes;
    uint8_t data[];
} loop_msg;

enum {
    COLL_MAX_U64 = 1,
    COLL_SUM_F32 = 2
};

struct gcomp__loop_world {
    int size;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    loop_msg **head, **tail; /* size * size queues, index from * size + to */
    /* the collective meeting point */
    uint64_t open_seq; /* sequence number of the collective the slot takes now */
    uint64_t *entered; /* per rank, the collectives it has entered, over all its transports */
    uint64_t done_seq; /* the last collective whose result is ready (0: none yet) */
    int arrived, readers, kind;
    size_t n;       /* elements of the collective in progress */
    int mismatch;   /* ranks called it with different kinds or lengths */
    void **contrib; /* per rank, n elements */
    size_t *contrib_cap;
    void *result;
    size_t result_cap;
};

typedef struct loop_transport {
    gcomp__transport base;
    gcomp__loop_world *w;
    int from;     /* the receive in flight */
    void *rbuf;
    size_t rcap;
    int any; /* the receive in flight takes a message of any size (start_sendrecv_any) */
} loop_transport;

/* Wait on the world's condition until the deadline (CLOCK_MONOTONIC seconds, like gcomp__now).
 * Returns 0 when woken, ETIMEDOUT past the deadline. The caller holds the lock. */
static int wait_until(gcomp__loop_world *w, double deadline)
{
    struct timespec ts;
    double frac;
    if (gcomp__now() >= deadline) return ETIMEDOUT;
    ts.tv_sec = (time_t)deadline;
    frac = deadline - (double)ts.tv_sec;
    ts.tv_nsec = (long)(frac * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
    return pthread_cond_timedwait(&w->cond, &w->lock, &ts) == ETIMEDOUT && gcomp__now() >= deadline ? ETIMEDOUT : 0;
}

gcomp_result gcomp__loop_world_create(int size, gcomp__loop_world **out)
{
    gcomp__loop_world *w;
    pthread_condattr_t attr;
    if (!out || size < 1 || size > 1024)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "loop world: size %d out of [1, 1024]", size);
    w = calloc(1, sizeof *w);
    if (!w) return gcomp__fail(GCOMP_ERR_NOMEM, "loop world: out of memory");
    w->size = size;
    w->head = calloc((size_t)size * (size_t)size, sizeof *w->head);
    w->tail = calloc((size_t)size * (size_t)size, sizeof *w->tail);
    w->contrib = calloc((size_t)size, sizeof *w->contrib);
    w->contrib_cap = calloc((size_t)size, sizeof *w->contrib_cap);
    w->entered = calloc((size_t)size, sizeof *w->entered);
    if (!w->head || !w->tail || !w->contrib || !w->contrib_cap || !w->entered) {
        gcomp__loop_world_destroy(w);
        return gcomp__fail(GCOMP_ERR_NOMEM, "loop world: out of memory");
    }
    pthread_mutex_init(&w->lock, NULL);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cond, &attr);
    pthread_condattr_destroy(&attr);
    w->open_seq = 1;
    *out = w;
    return GCOMP_SUCCESS;
}

void gcomp__loop_world_destroy(gcomp__loop_world *w)
{
    if (!w) return;
    for (size_t q = 0; w->head && q < (size_t)w->size * (size_t)w->size; q++) {
        while (w->head[q]) {
            loop_msg *m = w->head[q];
            w->head[q] = m->next;
            free(m);
        }
    }
    for (int r = 0; w->contrib && r < w->size; r++) free(w->contrib[r]);
    if (w->head && w->tail && w->contrib && w->contrib_cap) {
        pthread_mutex_destroy(&w->lock);
        pthread_cond_destroy(&w->cond);
    }
    free(w->head);
    free(w->tail);
    free(w->contrib);
    free(w->contrib_cap);
    free(w->entered);
    free(w->result);
    free(w);
}

static gcomp_result loop_start(gcomp__transport *t, int to, const void *sbuf, size_t sbytes, int from, void *rbuf,
                               size_t rcap)
{
    loop_transport *lt = (loop_transport *)t;
    gcomp__loop_world *w = lt->w;
    loop_msg *m = malloc(sizeof *m + (sbytes ? sbytes : 1));
    size_t q = (size_t)t->rank * (size_t)w->size + (size_t)to;
    if (!m) return gcomp__fail(GCOMP_ERR_NOMEM, "loop transport: cannot queue a message of %zu bytes", sbytes);
    m->next = NULL;
    m->bytes = sbytes;
    if (sbytes) memcpy(m->data, sbuf, sbytes);
    pthread_mutex_lock(&w->lock);
    if (w->tail[q])
        w->tail[q]->next = m;
    else
        w->head[q] = m;
    w->tail[q] = m;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
    lt->from = from;
    lt->rbuf = rbuf;
    lt->rcap = rcap;
    lt->any = 0;
    return GCOMP_SUCCESS;
}

static gcomp_result loop_start_any(gcomp__transport *t, int to, const void *sbuf, size_t sbytes, int from,
                                   void *rbuf, size_t rcap)
{
    GCOMP_CHECK(loop_start(t, to, sbuf, sbytes, from, rbuf, rcap));
    ((loop_transport *)t)->any = 1;
    return GCOMP_SUCCESS;
}

static gcomp_result loop_finish(gcomp__transport *t, size_t *rbytes, double deadline)
{
    loop_transport *lt = (loop_transport *)t;
    gcomp__loop_world *w = lt->w;
    size_t q = (size_t)lt->from * (size_t)w->size + (size_t)t->rank;
    loop_msg *m;
    pthread_mutex_lock(&w->lock);
    while (!w->head[q]) {
        if (wait_until(w, deadline) == ETIMEDOUT) {
            pthread_mutex_unlock(&w->lock);
            return gcomp__fail(GCOMP_ERR_TIMEOUT, "loop transport: no message from rank %d before the deadline",
                               lt->from);
        }
    }
    m = w->head[q];
    w->head[q] = m->next;
    if (!w->head[q]) w->tail[q] = NULL;
    pthread_mutex_unlock(&w->lock);
    if (m->bytes > lt->rcap && lt->any) { /* its tail, where the ring's trailer lies (transport.h) */
        if (lt->rcap) memcpy(lt->rbuf, m->data + (m->bytes - lt->rcap), lt->rcap);
        *rbytes = m->bytes;
        free(m);
        return GCOMP_SUCCESS;
    }
    if (m->bytes > lt->rcap) {
        size_t bytes = m->bytes;
        free(m);
        return gcomp__fail(GCOMP_ERR_TRANSPORT,
                           "loop transport: a message of %zu bytes from rank %d exceeds the %zu-byte receive", bytes,
                           lt->from, lt->rcap);
    }
    if (m->bytes) memcpy(lt->rbuf, m->data, m->bytes);
    *rbytes = m->bytes;
    free(m);
    return GCOMP_SUCCESS;
}

static void loop_progress(gcomp__transport *t) { (void)t; }

/* The last rank to arrive reduces every contribution in rank order. Caller holds the lock. */
static void reduce_locked(gcomp__loop_world *w, size_t esize)
{
    memcpy(w->result, w->contrib[0], w->n * esize);
    for (int r = 1; r < w->size; r++) {
        for (size_t i = 0; i < w->n; i++) {
            if (w->kind == COLL_MAX_U64) {
                uint64_t *d = w->result, v = ((const uint64_t *)w->contrib[r])[i];
                if (v > d[i]) d[i] = v;
            } else {
                ((float *)w->result)[i] += ((const float *)w->contrib[r])[i];
            }
        }
    }
}

static gcomp_result grow(void **buf, size_t *cap, size_t bytes) { return gcomp__reserve(buf, cap, bytes ? bytes : 1); }

static gcomp_result loop_collective(loop_transport *lt, int kind, void *vals, size_t n, size_t esize, double deadline)
{
    gcomp__loop_world *w = lt->w;
    uint64_t seq = ++w->entered[lt->base.rank]; /* only this rank's thread writes its slot */
    gcomp_result rc = GCOMP_SUCCESS;
    pthread_mutex_lock(&w->lock);
    while (w->open_seq != seq) { /* the previous collective is still being read */
        if (wait_until(w, deadline) == ETIMEDOUT) goto timeout;
    }
    if (w->arrived == 0) {
        w->kind = kind;
        w->n = n;
        w->mismatch = 0;
    } else if (w->kind != kind || w->n != n) {
        w->mismatch = 1;
    }
    if (grow(&w->contrib[lt->base.rank], &w->contrib_cap[lt->base.rank], n * esize) != GCOMP_SUCCESS ||
        grow(&w->result, &w->result_cap, n * esize) != GCOMP_SUCCESS) {
        w->mismatch = 1; /* nobody can compute it: every rank gets an error */
        rc = GCOMP_ERR_NOMEM;
    } else if (n) {
        memcpy(w->contrib[lt->base.rank], vals, n * esize);
    }
    if (++w->arrived == w->size) {
        if (!w->mismatch) reduce_locked(w, esize);
        w->done_seq = seq;
        pthread_cond_broadcast(&w->cond);
    }
    while (w->done_seq != seq) {
        if (wait_until(w, deadline) == ETIMEDOUT) goto timeout;
    }
    if (w->mismatch && rc == GCOMP_SUCCESS)
        rc = gcomp__fail(GCOMP_ERR_TRANSPORT, "loop transport: ranks called a collective with different lengths");
    else if (rc == GCOMP_SUCCESS && n)
        memcpy(vals, w->result, n * esize);
    if (++w->readers == w->size) { /* open the slot for the next collective */
        w->arrived = w->readers = 0;
        w->open_seq = seq + 1;
        pthread_cond_broadcast(&w->cond);
    }
    pthread_mutex_unlock(&w->lock);
    return rc == GCOMP_ERR_NOMEM ? gcomp__fail(rc, "loop transport: out of memory in a collective") : rc;
timeout:
    pthread_mutex_unlock(&w->lock);
    return gcomp__fail(GCOMP_ERR_TIMEOUT, "loop transport: a collective did not complete before the deadline");
}

uint64_t gcomp__loop_world_collectives(gcomp__loop_world *w)
{
    uint64_t done;
    pthread_mutex_lock(&w->lock);
    done = w->done_seq; /* collectives are numbered 1, 2, ... and complete in order */
    pthread_mutex_unlock(&w->lock);
    return done;
}

static gcomp_result loop_max_u64(gcomp__transport *t, uint64_t *vals, size_t n, double deadline)
{
    return loop_collective((loop_transport *)t, COLL_MAX_U64, vals, n, sizeof(uint64_t), deadline);
}

static gcomp_result loop_sum_f32(gcomp__transport *t, float *vals, size_t n, double deadline)
{
    return loop_collective((loop_transport *)t, COLL_SUM_F32, vals, n, sizeof(float), deadline);
}

/* Messages left in the queues belong to the world, which frees them. */
static void loop_destroy(gcomp__transport *t) { free(t); }

gcomp_result gcomp__transport_loop_create(gcomp__loop_world *w, int rank, gcomp__transport **out)
{
    loop_transport *lt;
    if (!w || !out || rank < 0 || rank >= w->size)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "loop transport: bad world, rank or out");
    lt = calloc(1, sizeof *lt);
    if (!lt) return gcomp__fail(GCOMP_ERR_NOMEM, "loop transport: out of memory");
    lt->w = w;
    lt->base.rank = rank;
    lt->base.size = w->size;
    lt->base.start_sendrecv = loop_start;
    lt->base.start_sendrecv_any = loop_start_any;
    lt->base.finish_sendrecv = loop_finish;
    lt->base.progress = loop_progress;
    lt->base.allreduce_max_u64 = loop_max_u64;
    lt->base.allreduce_sum_f32 = loop_sum_f32;
    lt->base.destroy = loop_destroy;
    lt->base.releases_buffers_on_timeout = 1; /* messages are copied at both ends */
    *out = &lt->base;
    return GCOMP_SUCCESS;
}

gcomp_result gcomp__comm_create_loop(gcomp__loop_world *w, int rank, const gcomp_config *cfg, gcomp_comm **out)
{
    gcomp__transport *tp = NULL; /* gcc cannot see through GCOMP_CHECK */
    if (out) *out = NULL;
    GCOMP_CHECK(gcomp__transport_loop_create(w, rank, &tp));
    return gcomp__comm_create(tp, cfg, out); /* a NULL out still joins (the others do not wait) */
}
