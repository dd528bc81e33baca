/*
 * request.c — nonblocking allreduce: gcomp_iallreduce, gcomp_test, gcomp_wait, and
 * gcomp_allreduce as iallreduce + wait.
 *
 * Every call of a communicator goes through one FIFO queue and runs to its end
 * (gcomp__engine_run) before the next starts, in the order issued: every rank issues the
 * same collectives in the same order, so every rank runs them in that order too. Whoever
 * finds the queue idle runs its head: the communicator's progress thread, or a caller
 * blocked in gcomp_wait / gcomp_allreduce (it helps instead of sleeping while the thread
 * wakes up; the running flag keeps it to one call at a time).
 *
 * The progress thread (started at the first gcomp_iallreduce, joined at destroy) is what
 * lets a call advance while the caller computes. It calls the transport from a thread of
 * its own, so over MPI it needs MPI_THREAD_MULTIPLE (the user may call MPI meanwhile);
 * with less, no thread is started and the queued calls run inside gcomp_test/gcomp_wait on
 * the caller's thread (progress mode GCOMP__PROGRESS_CALLER): correct, without overlap.
 *
 * gcomp_last_error() is thread-local: a call that failed on the progress thread leaves its
 * detail in the request, and the wait sets it again on the caller's thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"

/* Called with the lock held: the call r ran to rc; wake everyone waiting on the queue. */
static void complete(gcomp_comm *c, gcomp_request *r, gcomp_result rc, const char *detail)
{
    r->rc = rc;
    snprintf(r->detail, sizeof r->detail, "%s", rc != GCOMP_SUCCESS ? detail : "");
    r->done = 1;
    c->q.running = 0;
    pthread_cond_broadcast(&c->q.cond);
}

/* Called with the lock held and the queue idle: run its head on this thread, lock held again
 * on return. */
static void run_head(gcomp_comm *c)
{
    gcomp_request *r = c->q.head;
    gcomp_result rc;
    c->q.head = r->next;
    if (!c->q.head) c->q.tail = NULL;
    r->next = NULL;
    c->q.running = 1;
    pthread_mutex_unlock(&c->q.lock);
    rc = gcomp__engine_run(c, &r->args);
    pthread_mutex_lock(&c->q.lock);
    complete(c, r, rc, gcomp_last_error());
}

/* Called with the lock held: until r is done, run the queue's head whenever it is idle,
 * else sleep until a call finishes. */
static void run_until(gcomp_comm *c, gcomp_request *r)
{
    while (!r->done) {
        if (!c->q.running && c->q.head)
            run_head(c);
        else
            pthread_cond_wait(&c->q.cond, &c->q.lock);
    }
}

static void *progress_main(void *arg)
{
    gcomp_comm *c = arg;
    pthread_mutex_lock(&c->q.lock);
    for (;;) {
        if (c->q.head && !c->q.running)
            run_head(c);
        else if (c->q.stop && !c->q.head)
            break;
        else
            pthread_cond_wait(&c->q.cond, &c->q.lock);
    }
    pthread_mutex_unlock(&c->q.lock);
    return NULL;
}

/* The end of a communicator: the calls in flight finish and the progress thread is joined,
 * then the communicator layer frees the rest (gcomp__comm_free). */
void gcomp_comm_destroy(gcomp_comm *c)
{
    if (!c) return;
    if (c->q.inited) {
        pthread_mutex_lock(&c->q.lock);
        c->q.stop = 1;
        pthread_cond_broadcast(&c->q.cond);
        pthread_mutex_unlock(&c->q.lock);
        if (c->q.thread_started) pthread_join(c->q.thread, NULL);
        /* without a thread, calls issued and never waited for still run (they are collective:
         * the other ranks expect them); their requests stay the caller's */
        pthread_mutex_lock(&c->q.lock);
        while (c->q.head) run_head(c);
        pthread_mutex_unlock(&c->q.lock);
    }
    gcomp__comm_free(c);
}

/* Called with the lock held, at the first gcomp_iallreduce: a progress thread when the
 * transport allows one (checked at creation and again now), else progress in test/wait. */
static void decide_mode(gcomp_comm *c)
{
    char why[160] = "";
    /* the transport first, for its reason (the MPI thread level); threads_ok is creation's */
    int ok = (!c->tp->threads_ok || c->tp->threads_ok(why, sizeof why)) && c->threads_ok;
    c->q.mode = GCOMP__PROGRESS_CALLER;
    if (ok) {
        if (pthread_create(&c->q.thread, NULL, progress_main, c) == 0) {
            c->q.thread_started = 1;
            c->q.mode = GCOMP__PROGRESS_THREAD;
        } else {
            snprintf(why, sizeof why, "pthread_create failed");
        }
    } else if (!why[0]) {
        snprintf(why, sizeof why, "the transport does not allow a progress thread");
    }
    if (c->cfg.debug)
        gcomp__log("rank %d: nonblocking calls progress %s%s%s", c->tp->rank,
                   c->q.mode == GCOMP__PROGRESS_THREAD ? "on a progress thread" : "inside gcomp_test/gcomp_wait",
                   why[0] ? ": " : "", why);
}

static void enqueue(gcomp_comm *c, gcomp_request *r)
{
    if (c->q.tail)
        c->q.tail->next = r;
    else
        c->q.head = r;
    c->q.tail = r;
    pthread_cond_broadcast(&c->q.cond);
}

/* The request's outcome for the caller (its detail set again on this thread: the thread that
 * ran the call has logged the failure already); frees it. */
static gcomp_result finish(gcomp_request **req)
{
    gcomp_request *r = *req;
    gcomp_result rc = gcomp__fail_again(r->rc, r->detail);
    free(r);
    *req = NULL;
    return rc;
}

/* The CUDA device current on the issuing thread, for device buffers (the call may run on the
 * progress thread, whose current device is its own; a buffer of another device, which the
 * device layer refuses, is then refused there the same way); -1 for host buffers (no device
 * is made current for them). */
static int issuing_device(const void *send)
{
    const gcomp__device_ops *ops;
    int dev = -1;
    if (!send) return -1;
    if (gcomp__device_for(send, &ops, &dev) != GCOMP_SUCCESS || dev >= 0) return gcomp__device_current();
    return -1;
}

gcomp_result gcomp_iallreduce(gcomp_comm *c, const void *send, void *recv, size_t count, gcomp_dtype dtype, gcomp_op op,
                              uint64_t key, struct CUstream_st *stream, gcomp_request **req)
{
    gcomp_request *r;
    if (!req) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_iallreduce: req is NULL");
    *req = NULL;
    if (!c) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_iallreduce: comm is NULL");
    r = calloc(1, sizeof *r);
    if (!r) return gcomp__fail(GCOMP_ERR_NOMEM, "gcomp_iallreduce: out of memory");
    r->comm = c;
    r->args = (gcomp__args){ send, recv, count, dtype, op, key, stream, issuing_device(send), "gcomp_iallreduce" };
    pthread_mutex_lock(&c->q.lock);
    if (c->q.mode == GCOMP__PROGRESS_UNDECIDED) decide_mode(c);
    enqueue(c, r);
    c->q.outstanding++;
    pthread_mutex_unlock(&c->q.lock);
    *req = r;
    return GCOMP_SUCCESS;
}

gcomp_result gcomp_test(gcomp_request **req, int *done)
{
    gcomp_request *r;
    gcomp_comm *c;
    if (done) *done = 0;
    if (!req || !*req || !done) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_test: NULL argument");
    r = *req;
    c = r->comm;
    pthread_mutex_lock(&c->q.lock);
    if (c->q.mode != GCOMP__PROGRESS_THREAD) run_until(c, r); /* no thread: this is the progress */
    *done = r->done;
    if (*done) c->q.outstanding--;
    pthread_mutex_unlock(&c->q.lock);
    return *done ? finish(req) : GCOMP_SUCCESS;
}

gcomp_result gcomp_wait(gcomp_request **req)
{
    gcomp_comm *c;
    if (!req || !*req) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_wait: NULL request");
    c = (*req)->comm;
    pthread_mutex_lock(&c->q.lock);
    run_until(c, *req);
    c->q.outstanding--;
    pthread_mutex_unlock(&c->q.lock);
    return finish(req);
}

/* Called with the lock held: GCOMP_ERR_INVALID_ARG while a request is in flight or another
 * thread's call is queued or running (or holds the communicator), else GCOMP_SUCCESS. */
static gcomp_result refuse_if_busy(const gcomp_comm *c, const char *api)
{
    if (c->q.outstanding)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                           "%s: a gcomp_iallreduce of this communicator is in flight (%d not yet completed by "
                           "gcomp_wait/gcomp_test): call it when none is",
                           api, c->q.outstanding);
    if (c->q.head || c->q.running) /* no request in flight: another thread's call, queued or running */
        return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                           "%s: another thread is running or about to run a call on this communicator (a "
                           "blocking gcomp_allreduce, a checkpoint): call it when none is",
                           api);
    return GCOMP_SUCCESS;
}

/* The refusal depends only on what this thread issued and completed, never on how far the
 * progress thread got: every rank that makes the same calls in the same order gets the same
 * answer (a request that already ran but was not waited for still counts). */
gcomp_result gcomp__comm_hold(gcomp_comm *c, const char *api)
{
    gcomp_result rc;
    pthread_mutex_lock(&c->q.lock);
    rc = refuse_if_busy(c, api);
    if (rc == GCOMP_SUCCESS) c->q.running = 1;
    pthread_mutex_unlock(&c->q.lock);
    return rc;
}

void gcomp__comm_release(gcomp_comm *c)
{
    pthread_mutex_lock(&c->q.lock);
    c->q.running = 0;
    pthread_cond_broadcast(&c->q.cond); /* a call queued meanwhile (another thread) may start */
    pthread_mutex_unlock(&c->q.lock);
}

/* ---- stats: written by the thread that runs each call (q.running set, under the lock), so
 * read and reset under the lock while none runs: a call in flight would race with the copy,
 * and a reset would keep half of its figures. The lock only, never the hold: a thread that
 * reads stats must not make another thread's checkpoint call refuse as if a call ran. ---- */

/* The lock taken and nothing running (GCOMP_SUCCESS), or the refusal with the lock released. */
static gcomp_result stats_lock(const gcomp_comm *c, const char *api)
{
    gcomp_comm *locked = (gcomp_comm *)c; /* the queue's lock, which a const communicator owns too */
    gcomp_result rc;
    pthread_mutex_lock(&locked->q.lock);
    rc = refuse_if_busy(c, api);
    if (rc != GCOMP_SUCCESS) pthread_mutex_unlock(&locked->q.lock);
    return rc;
}

static void stats_unlock(const gcomp_comm *c) { pthread_mutex_unlock(&((gcomp_comm *)c)->q.lock); }

gcomp_result gcomp_comm_stats_get(const gcomp_comm *c, gcomp_comm_stats *out)
{
    if (!c || !out) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_comm_stats_get: NULL argument");
    GCOMP_CHECK(stats_lock(c, "gcomp_comm_stats_get"));
    *out = c->stats;
    stats_unlock(c);
    return GCOMP_SUCCESS;
}

gcomp_result gcomp_comm_key_stats_get(const gcomp_comm *c, uint64_t key, gcomp_comm_stats *out)
{
    const gcomp__key *k;
    gcomp_result rc = GCOMP_SUCCESS;
    if (!c || !out) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_comm_key_stats_get: NULL argument");
    GCOMP_CHECK(stats_lock(c, "gcomp_comm_key_stats_get"));
    k = gcomp__comm_find_key(c, key);
    if (!k || !k->count) /* a key's count is recorded by its first call that succeeded */
        rc =
            gcomp__fail(GCOMP_ERR_INVALID_ARG, "key %llu was never used on this communicator", (unsigned long long)key);
    else
        *out = k->stats;
    stats_unlock(c);
    return rc;
}

gcomp_result gcomp_comm_stats_reset(gcomp_comm *c)
{
    if (!c) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_comm_stats_reset: NULL comm");
    GCOMP_CHECK(stats_lock(c, "gcomp_comm_stats_reset"));
    gcomp__comm_clear_stats(c);
    stats_unlock(c);
    return GCOMP_SUCCESS;
}

/* iallreduce + wait, with the request on the stack: when the queue is idle (no nonblocking
 * call in flight) the caller runs the call itself, as before there were requests. */
gcomp_result gcomp_allreduce(gcomp_comm *c, const void *send, void *recv, size_t count, gcomp_dtype dtype, gcomp_op op,
                             uint64_t key, struct CUstream_st *stream)
{
    gcomp_request r;
    if (!c) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_allreduce: comm is NULL");
    memset(&r, 0, sizeof r);
    r.comm = c;
    r.args = (gcomp__args){ send, recv, count, dtype, op, key, stream, issuing_device(send), "gcomp_allreduce" };
    pthread_mutex_lock(&c->q.lock);
    if (!c->q.head && !c->q.running) {
        /* the common case, without a copy of the error detail: run it here directly */
        gcomp_result rc;
        c->q.running = 1;
        pthread_mutex_unlock(&c->q.lock);
        rc = gcomp__engine_run(c, &r.args);
        pthread_mutex_lock(&c->q.lock);
        c->q.running = 0;
        pthread_cond_broadcast(&c->q.cond);
        pthread_mutex_unlock(&c->q.lock);
        return rc;
    }
    enqueue(c, &r);
    run_until(c, &r);
    pthread_mutex_unlock(&c->q.lock);
    return gcomp__fail_again(r.rc, r.detail);
}
