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
 * other's agreement in the first place.
 */
#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "transport.h"
#include "gcomp_mpi.h"

#define GCOMP_TAG 0x6763 /* "gc" */

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
} mpi_transport;

static gcomp_result mpi_fail(int err, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(err, msg, &len);
    return gcomp__fail(GCOMP_ERR_TRANSPORT, "%s: %s", what, msg);
}

/* Poll until every request completes or the deadline passes. Spinning is what MPI's own
 * blocking calls do; after a while we yield so oversubscribed ranks can progress. */
static gcomp_result poll_all(int n, MPI_Request *reqs, MPI_Status *st, double deadline, int cancellable, const char *what)
{
    long spins = 0;
    for (;;) {
        int done = 0, err = MPI_Testall(n, reqs, &done, st);
        if (err == MPI_ERR_IN_STATUS)
            for (int i = 0; i < n; i++)
                if (st[i].MPI_ERROR != MPI_SUCCESS && st[i].MPI_ERROR != MPI_ERR_PENDING) err = st[i].MPI_ERROR;
        if (err != MPI_SUCCESS) return mpi_fail(err, what);
        if (done) return GCOMP_SUCCESS;
        if (++spins > 64) sched_yield();
        if ((spins & 255) == 0 && gcomp__now() > deadline) {
            /* point-to-point requests can be cancelled; collective ones cannot (MPI forbids
             * it) and are left behind -- the communicator is unusable from here on anyway */
            for (int i = 0; cancellable && i < n; i++)
                if (reqs[i] != MPI_REQUEST_NULL) MPI_Cancel(&reqs[i]);
            return gcomp__fail(GCOMP_ERR_TIMEOUT, "%s: no answer from a peer before the deadline (GCOMP_TIMEOUT_MS)", what);
        }
    }
}

/* poll_all with MPI_COMM_WORLD's error handler set to MPI_ERRORS_RETURN meanwhile (see the
 * file comment: Open MPI reports failed nonblocking collectives there). */
static gcomp_result wait_all(int n, MPI_Request *reqs, MPI_Status *st, double deadline, int cancellable, const char *what)
{
    MPI_Errhandler world = MPI_ERRHANDLER_NULL;
    gcomp_result rc;
    int swapped = MPI_Comm_get_errhandler(MPI_COMM_WORLD, &world) == MPI_SUCCESS &&
                  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN) == MPI_SUCCESS;
    rc = poll_all(n, reqs, st, deadline, cancellable, what);
    if (swapped) MPI_Comm_set_errhandler(MPI_COMM_WORLD, world);
    if (world != MPI_ERRHANDLER_NULL) MPI_Errhandler_free(&world);
    return rc;
}

static gcomp_result mpi_start(gcomp__transport *t, int to, const void *sbuf, size_t sbytes, int from, void *rbuf,
                              size_t rcap)
{
    mpi_transport *m = (mpi_transport *)t;
    int err;
    if (sbytes > INT_MAX || rcap > INT_MAX)
        return gcomp__fail(GCOMP_ERR_UNSUPPORTED, "MPI transport: message of %zu bytes exceeds 2 GiB", sbytes > rcap ? sbytes : rcap);
    err = MPI_Irecv(rbuf, (int)rcap, MPI_BYTE, from, GCOMP_TAG, m->comm, &m->ring[0]);
    if (err != MPI_SUCCESS) return mpi_fail(err, "MPI_Irecv");
    err = MPI_Isend(sbuf, (int)sbytes, MPI_BYTE, to, GCOMP_TAG, m->comm, &m->ring[1]);
    if (err != MPI_SUCCESS) {
        MPI_Cancel(&m->ring[0]);
        return mpi_fail(err, "MPI_Isend");
    }
    return GCOMP_SUCCESS;
}

static gcomp_result mpi_finish(gcomp__transport *t, size_t *rbytes, double deadline)
{
    mpi_transport *m = (mpi_transport *)t;
    MPI_Status st[2];
    int got = 0;
    GCOMP_CHECK(wait_all(2, m->ring, st, deadline, 1, "ring exchange"));
    MPI_Get_count(&st[0], MPI_BYTE, &got);
    *rbytes = (size_t)got;
    return GCOMP_SUCCESS;
}

/* A probe for a tag nobody sends drives Open MPI's progress engine without touching the
 * requests in flight. */
static void mpi_progress(gcomp__transport *t)
{
    mpi_transport *m = (mpi_transport *)t;
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, GCOMP_TAG + 1, m->comm, &flag, MPI_STATUS_IGNORE);
}

static gcomp_result mpi_allreduce(mpi_transport *m, void *vals, size_t n, size_t esize, MPI_Datatype type, MPI_Op op,
                                  double deadline, const char *what)
{
    MPI_Request req;
    MPI_Status st;
    gcomp_result rc;
    int err;
    if (n > INT_MAX) return gcomp__fail(GCOMP_ERR_UNSUPPORTED, "MPI transport: %zu elements exceed INT_MAX", n);
    if (m->abandoned) return gcomp__fail(GCOMP_ERR_COMM_INVALID, "an earlier collective timed out");
    GCOMP_CHECK(gcomp__reserve(&m->coll, &m->coll_cap, n * esize));
    memcpy(m->coll, vals, n * esize);
    err = MPI_Iallreduce(MPI_IN_PLACE, m->coll, (int)n, type, op, m->comm, &req);
    if (err != MPI_SUCCESS) return mpi_fail(err, what);
    rc = wait_all(1, &req, &st, deadline, 0, what);
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
    return mpi_allreduce((mpi_transport *)t, vals, n, sizeof(uint64_t), MPI_UINT64_T, MPI_MAX, deadline, "agreement allreduce");
}

static gcomp_result mpi_sum_f32(gcomp__transport *t, float *vals, size_t n, double deadline)
{
    return mpi_allreduce((mpi_transport *)t, vals, n, sizeof(float), MPI_FLOAT, MPI_SUM, deadline, "MPI_Allreduce (bypass)");
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
    if (m->owned) free(m);
}

gcomp_result gcomp_comm_create_mpi(MPI_Comm comm, const gcomp_config *cfg, gcomp_comm **out)
{
    static const mpi_transport zero;
    mpi_transport *m, fallback = zero;
    int init = 0, finalized = 0, err;
    if (out) *out = NULL;
    /* these hold on every rank alike (or the program is erroneous anyway): nothing to join */
    MPI_Initialized(&init);
    if (!init) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_comm_create_mpi: MPI is not initialised (call MPI_Init first)");
    MPI_Finalized(&finalized);
    if (finalized) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_comm_create_mpi: MPI is already finalized (MPI_Finalize was called)");
    if (comm == MPI_COMM_NULL) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_comm_create_mpi: MPI_COMM_NULL");
    /* Every other failure (NULL out, bad config, no memory) still joins MPI_Comm_dup and
     * the creation's agreement (gcomp__comm_create), so no rank waits for this one. Without
     * memory for the transport, a stack copy carries the agreement. */
    m = calloc(1, sizeof *m);
    if (m) m->owned = 1;
    else m = &fallback;
    m->ring[0] = m->ring[1] = MPI_REQUEST_NULL;
    err = MPI_Comm_dup(comm, &m->comm);
    if (err != MPI_SUCCESS) {
        if (m->owned) free(m);
        return mpi_fail(err, "MPI_Comm_dup");
    }
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(m->comm, &m->base.rank);
    MPI_Comm_size(m->comm, &m->base.size);
    m->base.start_sendrecv = mpi_start;
    m->base.finish_sendrecv = mpi_finish;
    m->base.progress = mpi_progress;
    m->base.allreduce_max_u64 = mpi_max_u64;
    m->base.allreduce_sum_f32 = mpi_sum_f32;
    m->base.destroy = mpi_destroy;
    if (!m->owned) return gcomp__comm_join_failed(&m->base, gcomp__fail(GCOMP_ERR_NOMEM, "gcomp_comm_create_mpi: out of memory"));
    return gcomp__comm_create(&m->base, cfg, out);
}
