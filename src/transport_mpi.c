/*
 * transport_mpi.c — the host-memory transport over Open MPI, and gcomp_comm_create_mpi.
 *
 * The library works on its own MPI_Comm_dup of the user's communicator with
 * MPI_ERRORS_RETURN, so MPI failures come back as error codes. Every wait polls
 * non-blocking requests against a deadline, which turns a stuck peer into
 * GCOMP_ERR_TIMEOUT instead of a hang. It never calls MPI_Init or MPI_Finalize.
 *
 * MPI_ERRORS_RETURN on the duplicate is not enough: Open MPI 4.1 reports a nonblocking
 * collective that completed with an error (e.g. MPI_ERR_TRUNCATE when two ranks' collectives
 * differ in size) through MPI_COMM_WORLD's error handler from MPI_Test/MPI_Testall, which
 * aborts the job by default (seen with 4.1.4; tests/test_mpi_faults.c test_min_bytes_mismatch
 * ran into it before the ranks agreed on min_bytes). So every wait runs with
 * MPI_ERRORS_RETURN on MPI_COMM_WORLD too, restored before the wait returns; and every
 * agreement has the same size on every rank, so out-of-step ranks cannot truncate each
 * other's agreement in the first place. The starts of nonblocking calls (MPI_Iallreduce,
 * MPI_Isend/Irecv, MPI_Comm_idup) run under the same swap: Open MPI raises some errors
 * there too (MPI_Iallreduce(MPI_IN_PLACE) on an intercommunicator aborted the job).
 *
 * Creation has a deadline as well: the duplicate comes from MPI_Comm_idup polled against
 * the configuration's timeout_ms, so a rank that never joins turns into GCOMP_ERR_TIMEOUT
 * on the ranks that waited. Their idup stays pending (MPI cannot cancel it), kept as an
 * attribute of the parent communicator (pending_dup). The next creation over that parent
 * takes it over instead of starting another idup while it is still pending: the missing
 * rank's next idup completes it, so that creation works on every rank (before, each rank
 * that had waited stayed one duplication ahead, and every later creation timed out). If
 * it is still pending when the next creation begins and then completes against a late
 * rank's idup, that rank is in a creation at that moment (Open MPI's idup advances only
 * while every rank calls MPI), its agreement on the duplicate just begun: that creation is
 * joined too, and succeeds on every rank (before, one that completed within 50 ms was
 * dropped; a late rank that kept retrying then stayed one duplication apart for good). If
 * it had completed before the next creation began, the late rank came while the others
 * were in other MPI calls and may have given up in the agreement nobody joined: its
 * abandoned collective would be matched by a new agreement there, so that duplicate is
 * never used nor freed (left to MPI_Finalize), and the next creation starts afresh.
 *
 * MPI counts are int. A ring message of more than INT_MAX bytes travels as one element of a
 * derived datatype of that many bytes (blocks of GCOMP__MPI_BLOCK bytes and the rest, so its
 * type signature is still that many bytes, and a receive posted with such a type of its
 * capacity takes any shorter message too); a collective of more than INT_MAX elements runs
 * as several of at most INT_MAX. Tests lower both limits (gcomp__mpi_max_count) to run these
 * paths on small buffers.
 */
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include "config.h"
#include "transport.h"
#include "gcomp_mpi.h"

#define GCOMP_TAG 0x6763 /* "gc" */
#define GCOMP__MPI_BLOCK ((size_t)1 << 20)

/* The largest count one MPI call takes: INT_MAX, lower in tests (transport.h). */
size_t gcomp__mpi_max_count = INT_MAX;

typedef struct mpi_transport {
    gcomp__transport base;
    MPI_Comm comm;
    /* Collectives run on this scratch, never on caller memory: a collective that timed out
     * cannot be cancelled (MPI forbids it) and may still complete later, so its buffer must
     * outlive the call. After a timeout the buffer is abandoned (leaked) for that reason. */
    void *coll;
    size_t coll_cap;
    int abandoned;
    MPI_Request ring[2]; /* the exchange in flight: receive, send */
    int owned;           /* heap-allocated (a stack fallback joins a failed creation) */
    /* a receive of any size (start_sendrecv_any): matched by MPI_Improbe, then received */
    int any;       /* the exchange in flight is one */
    int probing;   /* its message is not matched yet */
    int from;      /* its sender */
    void *rbuf;    /* its buffer and capacity */
    size_t rcap;
    size_t got;    /* the matched message's whole length */
    void *big;     /* a message longer than rcap lands here whole; its tail is copied to rbuf */
    size_t big_cap;
    int into_big;
    gcomp_result match_rc; /* a failure of match_any in progress(), reported by finish */
} mpi_transport;

static gcomp_result mpi_fail(int err, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(err, msg, &len);
    return gcomp__fail(GCOMP_ERR_TRANSPORT, "%s: %s", what, msg);
}

/* MPI_Finalize in another thread while a call waits: a program that exits while a (daemon)
 * thread waits for a peer that will never come. No MPI call may follow -- polling a finalized
 * Open MPI crashes the process -- so the wait ends with an error, making no MPI call on its
 * way out. MPI_Finalize deletes MPI_COMM_SELF's attributes first, while MPI still works:
 * gcomp's delete callback there (at_finalize) sets `finalizing`, then waits for the threads
 * counted in `in_wait` (inside a wait's MPI calls) to leave. A thread counts itself in, then
 * looks at `finalizing`: with sequentially consistent atomics one of the two sees the other,
 * so no wait's MPI call starts after the callback has returned. */
static atomic_int finalizing, in_wait;

/* Enter a wait's MPI calls: 1, or 0 (nothing entered) once MPI_Finalize has begun. */
static int wait_enter(void)
{
    atomic_fetch_add(&in_wait, 1);
    if (!atomic_load(&finalizing)) return 1;
    atomic_fetch_sub(&in_wait, 1);
    return 0;
}

static void wait_leave(void) { atomic_fetch_sub(&in_wait, 1); }

static gcomp_result mpi_gone_fail(const char *what)
{
    return gcomp__fail(GCOMP_ERR_TRANSPORT, "%s: MPI was finalized (by another thread) during this call", what);
}

/* Poll until every request completes or the deadline passes. Spinning is what MPI's own
 * blocking calls do; after a while we yield so oversubscribed ranks can progress (and look
 * whether MPI is still there: a long wait is where an exiting program finds a thread). */
static gcomp_result poll_all(int n, MPI_Request *reqs, MPI_Status *st, double deadline, int cancellable,
                             const char *what)
{
    long spins = 0;
    for (;;) {
        int done = 0, err;
        if (!wait_enter()) return mpi_gone_fail(what);
        err = MPI_Testall(n, reqs, &done, st);
        wait_leave();
        if (err == MPI_ERR_IN_STATUS)
            for (int i = 0; i < n; i++)
                if (st[i].MPI_ERROR != MPI_SUCCESS && st[i].MPI_ERROR != MPI_ERR_PENDING) err = st[i].MPI_ERROR;
        if (err != MPI_SUCCESS) return mpi_fail(err, what);
        if (done) return GCOMP_SUCCESS;
        if (++spins > 64) sched_yield();
        if ((spins & 255) == 0 && gcomp__now() > deadline) {
            /* point-to-point requests can be cancelled; collective ones cannot (MPI forbids
             * it) and are left behind -- the communicator is unusable from here on anyway */
            if (cancellable && wait_enter()) { /* else MPI_Finalize has begun: no MPI call */
                for (int i = 0; i < n; i++)
                    if (reqs[i] != MPI_REQUEST_NULL) MPI_Cancel(&reqs[i]);
                wait_leave();
            }
            return gcomp__fail(GCOMP_ERR_TIMEOUT, "%s: no answer from a peer before the deadline (GCOMP_TIMEOUT_MS)",
                               what);
        }
    }
}

/* MPI_ERRORS_RETURN on comm until quiet_end (see the file comment: Open MPI reports some
 * errors through MPI_COMM_WORLD's handler, which aborts by default). */
typedef struct quiet {
    MPI_Comm comm;
    MPI_Errhandler saved;
    int swapped;
    int live; /* begun before MPI_Finalize: quiet_end has something to undo */
} quiet;

/* MPI_COMM_WORLD's swap is shared by every gcomp thread of the process: progress threads of
 * several communicators (and a caller's blocking call) wait at the same time, and two
 * interleaved save/set/restore sequences would leave MPI_ERRORS_RETURN installed for good.
 * The first to enter saves the user's handler, the last to leave restores it. This is the
 * one piece of process-wide state of the transport; it exists because the handler is. */
static pthread_mutex_t world_lock = PTHREAD_MUTEX_INITIALIZER;
static int world_depth;
static MPI_Errhandler world_saved = MPI_ERRHANDLER_NULL;
static int world_swapped;

static quiet quiet_begin(MPI_Comm comm)
{
    quiet q = { comm, MPI_ERRHANDLER_NULL, 0, 0 };
    if (!wait_enter()) return q;
    q.live = 1;
    if (comm == MPI_COMM_WORLD) {
        pthread_mutex_lock(&world_lock);
        if (world_depth++ == 0)
            world_swapped = MPI_Comm_get_errhandler(comm, &world_saved) == MPI_SUCCESS &&
                            MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN) == MPI_SUCCESS;
        pthread_mutex_unlock(&world_lock);
    } else {
        q.swapped = MPI_Comm_get_errhandler(comm, &q.saved) == MPI_SUCCESS &&
                    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN) == MPI_SUCCESS;
    }
    wait_leave();
    return q;
}

/* Put saved back on comm unless another thread set a handler of its own meanwhile (the
 * program's, which must stay: overwriting it would lose it for good). */
static void restore_handler(MPI_Comm comm, MPI_Errhandler saved)
{
    MPI_Errhandler now = MPI_ERRHANDLER_NULL;
    if (MPI_Comm_get_errhandler(comm, &now) != MPI_SUCCESS) return;
    if (now == MPI_ERRORS_RETURN) MPI_Comm_set_errhandler(comm, saved);
    if (now != MPI_ERRHANDLER_NULL) MPI_Errhandler_free(&now);
}

static void quiet_end(quiet *q)
{
    int live;
    if (!q->live) return;
    live = wait_enter(); /* else MPI_Finalize has begun: the depth is kept, no MPI call made */
    if (q->comm == MPI_COMM_WORLD) {
        pthread_mutex_lock(&world_lock);
        if (--world_depth == 0) {
            if (world_swapped && live) restore_handler(MPI_COMM_WORLD, world_saved);
            if (world_saved != MPI_ERRHANDLER_NULL && live) MPI_Errhandler_free(&world_saved);
            world_saved = MPI_ERRHANDLER_NULL;
            world_swapped = 0;
        }
        pthread_mutex_unlock(&world_lock);
    } else if (live) {
        if (q->swapped) restore_handler(q->comm, q->saved);
        if (q->saved != MPI_ERRHANDLER_NULL) MPI_Errhandler_free(&q->saved);
    }
    if (live) wait_leave();
}

static gcomp_result wait_all(int n, MPI_Request *reqs, MPI_Status *st, double deadline, int cancellable,
                             const char *what)
{
    quiet q = quiet_begin(MPI_COMM_WORLD);
    gcomp_result rc = poll_all(n, reqs, st, deadline, cancellable, what);
    quiet_end(&q);
    return rc;
}

/* Around the calls that start an exchange or a collective (MPI_Isend, MPI_Irecv,
 * MPI_Iallreduce): counted in in_wait, so MPI_Finalize waits for them to return instead of
 * finalizing under them, with MPI_ERRORS_RETURN on MPI_COMM_WORLD. 0 (nothing entered, no
 * MPI call may follow) once MPI_Finalize has begun. */
static int start_enter(quiet *q)
{
    if (!wait_enter()) return 0;
    *q = quiet_begin(MPI_COMM_WORLD);
    if (q->live) return 1;
    wait_leave();
    return 0;
}

static void start_leave(quiet *q)
{
    quiet_end(q);
    wait_leave();
}

/* (type, count) for a message of `bytes` bytes: (MPI_BYTE, bytes) up to the count limit, else
 * one element of a committed derived datatype of that many bytes, which the caller frees
 * (MPI lets it go while the operation using it is still pending). */
static int bytes_type(size_t bytes, MPI_Datatype *type, int *count)
{
    size_t block = GCOMP__MPI_BLOCK < gcomp__mpi_max_count ? GCOMP__MPI_BLOCK : gcomp__mpi_max_count;
    MPI_Datatype whole = MPI_DATATYPE_NULL, types[2] = { MPI_DATATYPE_NULL, MPI_BYTE };
    int lens[2], err;
    MPI_Aint at[2];
    *type = MPI_BYTE;
    *count = (int)bytes;
    if (bytes <= gcomp__mpi_max_count) return MPI_SUCCESS;
    /* at most 2^42 bytes (2^40 elements of 4): whole blocks number fewer than INT_MAX */
    lens[0] = (int)(bytes / block);
    lens[1] = (int)(bytes % block);
    at[0] = 0;
    at[1] = (MPI_Aint)(bytes - bytes % block);
    err = MPI_Type_contiguous((int)block, MPI_BYTE, &types[0]);
    if (err == MPI_SUCCESS) err = MPI_Type_create_struct(2, lens, at, types, &whole);
    if (err == MPI_SUCCESS) err = MPI_Type_commit(&whole);
    if (types[0] != MPI_DATATYPE_NULL) MPI_Type_free(&types[0]);
    if (err != MPI_SUCCESS) {
        if (whole != MPI_DATATYPE_NULL) MPI_Type_free(&whole);
        return err;
    }
    *type = whole;
    *count = 1;
    return MPI_SUCCESS;
}

static void free_type(MPI_Datatype *type)
{
    if (*type != MPI_BYTE && *type != MPI_DATATYPE_NULL) MPI_Type_free(type);
    *type = MPI_DATATYPE_NULL;
}

/* A call after MPI_Finalize (a communicator the program kept): an error, where any MPI call
 * would abort the process. MPI_Finalized may be called at any time, and is cheap. */
static gcomp_result check_live(void)
{
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "MPI transport: MPI is finalized (MPI_Finalize was called); "
                                                  "destroy gcomp communicators before it");
    return GCOMP_SUCCESS;
}

/* The exchange's send, as ring[1]; call between quiet_begin and quiet_end. */
static int post_send(mpi_transport *m, int to, const void *sbuf, size_t sbytes)
{
    MPI_Datatype type;
    int count, err = bytes_type(sbytes, &type, &count);
    if (err != MPI_SUCCESS) return err;
    err = MPI_Isend(sbuf, count, type, to, GCOMP_TAG, m->comm, &m->ring[1]);
    free_type(&type);
    return err;
}

static gcomp_result mpi_start(gcomp__transport *t, int to, const void *sbuf, size_t sbytes, int from, void *rbuf,
                              size_t rcap)
{
    mpi_transport *m = (mpi_transport *)t;
    quiet q;
    gcomp_result rc = GCOMP_SUCCESS;
    int err;
    MPI_Datatype type;
    int count;
    GCOMP_CHECK(check_live());
    if (!start_enter(&q)) return mpi_gone_fail("ring exchange");
    err = bytes_type(rcap, &type, &count);
    if (err == MPI_SUCCESS) {
        err = MPI_Irecv(rbuf, count, type, from, GCOMP_TAG, m->comm, &m->ring[0]);
        free_type(&type);
    }
    if (err != MPI_SUCCESS) {
        rc = mpi_fail(err, "MPI_Irecv");
    } else if ((err = post_send(m, to, sbuf, sbytes)) != MPI_SUCCESS) {
        MPI_Cancel(&m->ring[0]);
        rc = mpi_fail(err, "MPI_Isend");
    }
    start_leave(&q);
    return rc;
}

/* The same exchange with a receive of any size: the send starts now, the receive once
 * MPI_Improbe has matched the message and told its length (match_any), so it is never posted
 * smaller than what arrives. */
static gcomp_result mpi_start_any(gcomp__transport *t, int to, const void *sbuf, size_t sbytes, int from,
                                  void *rbuf, size_t rcap)
{
    mpi_transport *m = (mpi_transport *)t;
    quiet q;
    int err;
    GCOMP_CHECK(check_live());
    m->ring[0] = MPI_REQUEST_NULL;
    m->any = m->probing = 1;
    m->from = from;
    m->rbuf = rbuf;
    m->rcap = rcap;
    m->got = 0;
    m->into_big = 0;
    m->match_rc = GCOMP_SUCCESS;
    if (!start_enter(&q)) {
        m->any = m->probing = 0;
        return mpi_gone_fail("ring exchange");
    }
    err = post_send(m, to, sbuf, sbytes);
    start_leave(&q);
    if (err != MPI_SUCCESS) {
        m->any = m->probing = 0;
        return mpi_fail(err, "MPI_Isend");
    }
    return GCOMP_SUCCESS;
}

/* If the any-size message has arrived: post its receive, into rbuf when it fits, else whole
 * into `big`. Runs with MPI_ERRORS_RETURN on MPI_COMM_WORLD (quiet). */
static gcomp_result match_any(mpi_transport *m)
{
    MPI_Message msg;
    MPI_Status st;
    MPI_Count len = 0;
    MPI_Datatype type;
    int flag = 0, count, err;
    void *dst = m->rbuf;
    size_t take;
    if (!m->probing) return GCOMP_SUCCESS;
    err = MPI_Improbe(m->from, GCOMP_TAG, m->comm, &flag, &msg, &st);
    if (err != MPI_SUCCESS) return mpi_fail(err, "MPI_Improbe");
    if (!flag) return GCOMP_SUCCESS;
    m->probing = 0;
    MPI_Get_elements_x(&st, MPI_BYTE, &len); /* a probe's status: any datatype may count it */
    m->got = take = (size_t)len;
    if (m->got > m->rcap) {
        /* without memory for it, receiving into rbuf reports MPI_ERR_TRUNCATE, an error of the
         * exchange: the message must be received once matched */
        m->into_big = gcomp__reserve(&m->big, &m->big_cap, m->got) == GCOMP_SUCCESS;
        dst = m->into_big ? m->big : m->rbuf;
        if (!m->into_big) take = m->rcap;
    }
    err = bytes_type(take, &type, &count);
    if (err == MPI_SUCCESS) err = MPI_Imrecv(dst, count, type, &msg, &m->ring[0]);
    free_type(&type);
    return err == MPI_SUCCESS ? GCOMP_SUCCESS : mpi_fail(err, "MPI_Imrecv");
}

/* Spin (then yield) until the any-size message is matched or the deadline passes. */
static gcomp_result wait_match(mpi_transport *m, double deadline)
{
    quiet q = quiet_begin(MPI_COMM_WORLD);
    gcomp_result rc = GCOMP_SUCCESS;
    long spins = 0;
    while (rc == GCOMP_SUCCESS && m->probing) {
        if (!wait_enter()) {
            rc = mpi_gone_fail("ring exchange");
            break;
        }
        rc = match_any(m);
        wait_leave();
        if (rc != GCOMP_SUCCESS || !m->probing) break;
        if (++spins > 64) sched_yield();
        if ((spins & 255) == 0 && gcomp__now() > deadline) {
            if (m->ring[1] != MPI_REQUEST_NULL && wait_enter()) { /* else MPI_Finalize has begun */
                MPI_Cancel(&m->ring[1]);
                wait_leave();
            }
            rc = gcomp__fail(GCOMP_ERR_TIMEOUT,
                             "ring exchange: no answer from a peer before the deadline (GCOMP_TIMEOUT_MS)");
        }
    }
    quiet_end(&q);
    return rc;
}

static gcomp_result mpi_finish(gcomp__transport *t, size_t *rbytes, double deadline)
{
    mpi_transport *m = (mpi_transport *)t;
    MPI_Status st[2];
    MPI_Count got = 0;
    int any = m->any;
    gcomp_result rc;
    m->any = 0;
    if (any) GCOMP_CHECK(m->match_rc != GCOMP_SUCCESS ? m->match_rc : wait_match(m, deadline));
    rc = wait_all(2, m->ring, st, deadline, 1, "ring exchange");
    if (rc == GCOMP_SUCCESS && any) { /* a longer message leaves its tail in rbuf (transport.h) */
        if (m->into_big && m->rcap) memcpy(m->rbuf, (uint8_t *)m->big + (m->got - m->rcap), m->rcap);
        *rbytes = m->got;
    } else if (rc == GCOMP_SUCCESS) {
        /* counted in MPI_BYTE, whatever type received it (its signature is bytes): Open MPI
         * 4.1 answers MPI_UNDEFINED when asked in a long receive's own derived type for a
         * message shorter than it */
        MPI_Get_elements_x(&st[0], MPI_BYTE, &got);
        if (got == MPI_UNDEFINED || got < 0)
            return gcomp__fail(GCOMP_ERR_TRANSPORT, "ring exchange: MPI gave no length for the received message");
        *rbytes = (size_t)got;
    }
    return rc;
}

/* A progress thread calls MPI while the user's threads may too: that needs
 * MPI_THREAD_MULTIPLE (MPI_Init_thread). Asked at creation and at the first iallreduce. */
static int mpi_threads_ok(char *why, size_t cap)
{
    int level = MPI_THREAD_SINGLE, finalized = 0;
    const char *name;
    MPI_Finalized(&finalized); /* MPI_Query_thread would abort: no thread, and the call fails (check_live) */
    if (finalized) {
        if (why && cap) snprintf(why, cap, "MPI is finalized");
        return 0;
    }
    if (MPI_Query_thread(&level) != MPI_SUCCESS) level = MPI_THREAD_SINGLE;
    if (level == MPI_THREAD_MULTIPLE) return 1;
    name = level == MPI_THREAD_SERIALIZED ? "MPI_THREAD_SERIALIZED"
           : level == MPI_THREAD_FUNNELED ? "MPI_THREAD_FUNNELED"
                                          : "MPI_THREAD_SINGLE";
    if (why && cap)
        snprintf(why, cap, "MPI was initialised with %s, a progress thread needs MPI_THREAD_MULTIPLE", name);
    return 0;
}

/* A probe for a tag nobody sends drives Open MPI's progress engine without touching the
 * requests in flight. */
static void mpi_progress(gcomp__transport *t)
{
    mpi_transport *m = (mpi_transport *)t;
    int flag = 0;
    /* nothing in flight, nothing to advance: a schedule may progress before its first
     * exchange, which after MPI_Finalize (check_live) must make no MPI call */
    if (!m->probing && m->ring[0] == MPI_REQUEST_NULL && m->ring[1] == MPI_REQUEST_NULL) return;
    if (!wait_enter()) return; /* MPI_Finalize has begun: the finish reports it */
    if (m->probing) { /* an any-size message is posted as soon as it is seen */
        quiet q = quiet_begin(MPI_COMM_WORLD);
        if (m->match_rc == GCOMP_SUCCESS) m->match_rc = match_any(m); /* finish reports it */
        quiet_end(&q);
    } else {
        MPI_Iprobe(MPI_ANY_SOURCE, GCOMP_TAG + 1, m->comm, &flag, MPI_STATUS_IGNORE);
    }
    wait_leave();
}

static gcomp_result mpi_allreduce(mpi_transport *m, void *vals, size_t n, size_t esize, MPI_Datatype type, MPI_Op op,
                                  double deadline, const char *what)
{
    MPI_Request req;
    MPI_Status st;
    gcomp_result rc = GCOMP_SUCCESS;
    quiet q;
    int err;
    GCOMP_CHECK(check_live());
    if (m->abandoned) return gcomp__fail(GCOMP_ERR_COMM_INVALID, "an earlier collective timed out");
    GCOMP_CHECK(gcomp__reserve(&m->coll, &m->coll_cap, n * esize));
    memcpy(m->coll, vals, n * esize);
    /* n is the same on every rank, and so are the pieces (one, of 0 elements, for n = 0) */
    size_t at = 0;
    do {
        size_t k = n - at < gcomp__mpi_max_count ? n - at : gcomp__mpi_max_count;
        if (!start_enter(&q)) return mpi_gone_fail(what);
        err = MPI_Iallreduce(MPI_IN_PLACE, (uint8_t *)m->coll + at * esize, (int)k, type, op, m->comm, &req);
        start_leave(&q);
        if (err != MPI_SUCCESS) return mpi_fail(err, what);
        rc = wait_all(1, &req, &st, deadline, 0, what);
        at += k;
    } while (rc == GCOMP_SUCCESS && at < n);
    if (rc == GCOMP_ERR_TIMEOUT) {
        m->coll = NULL; /* still referenced by the pending request: leak it on purpose */
        m->coll_cap = 0;
        m->abandoned = 1;
    }
    if (rc == GCOMP_SUCCESS) memcpy(vals, m->coll, n * esize);
    return rc;
}

static gcomp_result mpi_max_u64(gcomp__transport *t, uint64_t *vals, size_t n, double deadline)
{
    return mpi_allreduce((mpi_transport *)t, vals, n, sizeof(uint64_t), MPI_UINT64_T, MPI_MAX, deadline,
                         "agreement allreduce");
}

static gcomp_result mpi_sum_f32(gcomp__transport *t, float *vals, size_t n, double deadline)
{
    return mpi_allreduce((mpi_transport *)t, vals, n, sizeof(float), MPI_FLOAT, MPI_SUM, deadline,
                         "MPI_Allreduce (bypass)");
}

/* After a timeout a collective (and maybe a send) is still pending on the duplicate: MPI
 * cannot cancel it, and Open MPI 4.1 crashes inside a later MPI call (MPI_Barrier,
 * MPI_Finalize) when the late peer arrives if the communicator was freed under it. So the
 * duplicate is then left to MPI_Finalize, like the buffers the pending requests use. */
static void mpi_destroy(gcomp__transport *t)
{
    mpi_transport *m = (mpi_transport *)t;
    int finalized = 0, pending;
    if (!m) return;
    pending = m->abandoned || m->ring[0] != MPI_REQUEST_NULL || m->ring[1] != MPI_REQUEST_NULL;
    MPI_Finalized(&finalized);
    if (!finalized && !pending) MPI_Comm_free(&m->comm);
    if (!pending) free(m->coll);
    if (!pending) free(m->big);
    if (m->owned) free(m);
}

/* An MPI_Comm_idup of a creation that timed out, still in flight: the request and the
 * duplicate it will write. Kept as an attribute of the parent communicator until a later
 * creation over it takes it over. Never freed with the parent: MPI may still write p->dup
 * (a parent freed meanwhile leaks one record). */
typedef struct pending_dup {
    MPI_Request req;
    MPI_Comm dup;
} pending_dup;

static int pending_keyval = MPI_KEYVAL_INVALID;
static pthread_once_t pending_once = PTHREAD_ONCE_INIT;

/* MPI_Finalize deletes MPI_COMM_SELF's attributes first: the keyval goes with them, and
 * the waits of other threads stop calling MPI (finalizing, at the top). A thread inside one
 * of their MPI calls is waited for, at most 2 s (a poll returns at once; only a lock of MPI
 * held by this thread could keep it). */
static int at_finalize(MPI_Comm comm, int keyval, void *value, void *extra)
{
    (void)comm, (void)keyval, (void)value, (void)extra;
    atomic_store(&finalizing, 1);
    for (int ms = 0; ms < 2000 && atomic_load(&in_wait) > 0; ms++) {
        struct timespec one_ms = { 0, 1000000 };
        nanosleep(&one_ms, NULL);
    }
    if (pending_keyval != MPI_KEYVAL_INVALID) MPI_Comm_free_keyval(&pending_keyval);
    return MPI_SUCCESS;
}

static void pending_keyval_create(void)
{
    int kv = MPI_KEYVAL_INVALID, self_kv = MPI_KEYVAL_INVALID;
    if (MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, MPI_COMM_NULL_DELETE_FN, &kv, NULL) != MPI_SUCCESS) return;
    pending_keyval = kv;
    if (MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, at_finalize, &self_kv, NULL) == MPI_SUCCESS) {
        MPI_Comm_set_attr(MPI_COMM_SELF, self_kv, NULL);
        MPI_Comm_free_keyval(&self_kv); /* the attribute keeps it until MPI_Finalize */
    }
}

/* The timed-out idup over comm, taken off comm to be taken over; NULL when there is none, or
 * when it had already completed before this creation (the late rank came while this rank
 * was in other MPI calls: it may have given up in the agreement on that duplicate, whose
 * abandoned collective a new agreement there would match: see the top). One still pending
 * is taken over whether the missing rank's idup completes it now (a late rank in a creation
 * right now, its agreement on that duplicate only begun) or later (dup_until polls it). */
static pending_dup *pending_take(MPI_Comm comm)
{
    pending_dup *p = NULL;
    int found = 0, done = 0;
    pthread_once(&pending_once, pending_keyval_create);
    if (pending_keyval == MPI_KEYVAL_INVALID) return NULL;
    if (MPI_Comm_get_attr(comm, pending_keyval, &p, &found) != MPI_SUCCESS || !found || !p) return NULL;
    MPI_Comm_delete_attr(comm, pending_keyval);
    if (MPI_Test(&p->req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done) return p;
    free(p); /* completed before, or failed: its duplicate, if any, is left to MPI_Finalize */
    return NULL;
}

/* Keep p, whose idup timed out, for the next creation over comm; without the attribute it
 * is leaked as before (MPI may still write p->dup). */
static void pending_keep(MPI_Comm comm, pending_dup *p)
{
    if (pending_keyval != MPI_KEYVAL_INVALID) (void)MPI_Comm_set_attr(comm, pending_keyval, p);
}

/* *dup from MPI_Comm_idup (or the timed-out one of an earlier creation over comm, taken
 * over: pending_dup), polled against the deadline. Without memory for the record, the idup
 * writes *fallback, and a timeout leaks it as before. */
static gcomp_result dup_until(MPI_Comm comm, MPI_Comm *dup, MPI_Comm *fallback, double deadline)
{
    static pending_dup stack_rec; /* outlives a timed-out idup without memory for a record */
    quiet world = quiet_begin(MPI_COMM_WORLD), user = quiet_begin(comm);
    pending_dup *p = pending_take(comm);
    gcomp_result rc = GCOMP_SUCCESS;
    int err;
    if (!p) {
        p = calloc(1, sizeof *p);
        err = MPI_Comm_idup(comm, p ? &p->dup : fallback, p ? &p->req : &stack_rec.req);
        if (err != MPI_SUCCESS) rc = mpi_fail(err, "MPI_Comm_idup");
    }
    if (rc == GCOMP_SUCCESS)
        rc = poll_all(1, p ? &p->req : &stack_rec.req, &(MPI_Status){ 0 }, deadline, 0, "MPI_Comm_idup (creation)");
    quiet_end(&user);
    quiet_end(&world);
    if (rc == GCOMP_SUCCESS) *dup = p ? p->dup : *fallback;
    if (rc == GCOMP_ERR_TIMEOUT && p)
        pending_keep(comm, p);
    else
        free(p);
    return rc;
}

gcomp_result gcomp_comm_create_mpi(MPI_Comm comm, const gcomp_config *cfg, gcomp_comm **out)
{
    static const mpi_transport zero;
    static MPI_Comm fallback_dup; /* outlives a timed-out idup without memory (dup_until) */
    mpi_transport *m, fallback = zero;
    gcomp__config resolved;
    double deadline;
    int init = 0, finalized = 0, inter = 0, err;
    quiet q;
    gcomp_result rc;
    if (out) *out = NULL;
    /* these hold on every rank alike (or the program is erroneous anyway): nothing to join */
    MPI_Initialized(&init);
    if (!init)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                           "gcomp_comm_create_mpi: MPI is not initialised (call MPI_Init first)");
    MPI_Finalized(&finalized);
    if (finalized)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                           "gcomp_comm_create_mpi: MPI is already finalized (MPI_Finalize was called)");
    if (comm == MPI_COMM_NULL) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_comm_create_mpi: MPI_COMM_NULL");
    /* before any collective: the agreement's MPI_Iallreduce(MPI_IN_PLACE) is invalid on an
     * intercommunicator, and every rank of one gets the same answer here */
    q = quiet_begin(MPI_COMM_WORLD);
    err = MPI_Comm_test_inter(comm, &inter);
    quiet_end(&q);
    if (err != MPI_SUCCESS) return mpi_fail(err, "gcomp_comm_create_mpi: MPI_Comm_test_inter");
    if (inter)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_comm_create_mpi: intercommunicators are not supported "
                                                  "(MPI_Intercomm_merge makes an intracommunicator of one)");
    /* Every other failure (NULL out, bad config, no memory) still joins the duplication and
     * the creation's agreement (gcomp__comm_create), so no rank waits for this one: a bad
     * configuration waits with the default deadline. Without memory for the transport, a
     * stack copy carries the agreement. */
    deadline = gcomp__now() + 1e-3 * (double)(gcomp__config_resolve(cfg, &resolved) == GCOMP_SUCCESS
                                                  ? resolved.timeout_ms
                                                  : GCOMP__TIMEOUT_MS_DEFAULT);
    m = calloc(1, sizeof *m);
    if (m)
        m->owned = 1;
    else
        m = &fallback;
    m->ring[0] = m->ring[1] = MPI_REQUEST_NULL;
    rc = dup_until(comm, &m->comm, &fallback_dup, deadline);
    if (rc != GCOMP_SUCCESS) {
        if (m->owned) free(m);
        return rc;
    }
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(m->comm, &m->base.rank);
    MPI_Comm_size(m->comm, &m->base.size);
    m->base.start_sendrecv = mpi_start;
    m->base.start_sendrecv_any = mpi_start_any;
    m->base.finish_sendrecv = mpi_finish;
    m->base.progress = mpi_progress;
    m->base.allreduce_max_u64 = mpi_max_u64;
    m->base.allreduce_sum_f32 = mpi_sum_f32;
    m->base.destroy = mpi_destroy;
    m->base.threads_ok = mpi_threads_ok;
    if (!m->owned)
        return gcomp__comm_join_failed(&m->base, gcomp__fail(GCOMP_ERR_NOMEM, "gcomp_comm_create_mpi: out of memory"));
    return gcomp__comm_create(&m->base, cfg, out);
}
