/*
 * transport_nccl.c — CUDA device memory over NCCL, and the constructors of gcomp_nccl.h
 * (gcomp_comm_create_nccl, gcomp_comm_create_nccl_rank, gcomp_nccl_get_unique_id).
 *
 * gcomp's own NCCL communicator. gcomp never aborts or destroys the user's communicator: it
 * splits one of its own from it (ncclCommSplit, same color for all, no resource sharing, so
 * aborting it leaves the user's untouched) or creates one from a unique id, and owns that.
 * The communicator is non-blocking (ncclConfig_t.blocking = 0): NCCL calls that would wait
 * for peers on the host (creation, the connection set up at the first send to a peer)
 * return ncclInProgress, and the transport polls ncclCommGetAsyncError against a deadline.
 * Every wait on the device polls a CUDA event and ncclCommGetAsyncError the same way. An
 * NCCL error becomes GCOMP_ERR_TRANSPORT with NCCL's words; a deadline that passes becomes
 * GCOMP_ERR_TIMEOUT. Either way gcomp's communicator is aborted (ncclCommAbort stops its
 * kernels) and every later call returns GCOMP_ERR_COMM_INVALID; the engine marks the gcomp
 * communicator broken (gcomp__comm_transport_failed).
 *
 * Messages. An NCCL receive must be posted with the exact size of the send. The engine's
 * schedules pass a capacity (rcap) instead, so start_sendrecv first exchanges the size: a
 * grouped send/recv of one uint64 on the device, read back into pinned memory (one small
 * exchange and one host wait per message); then the payload goes as one grouped
 * ncclSend/ncclRecv on the caller's stream (transport.h: t->stream). start_sendrecv_sized is
 * the same without the size: for callers that know every size (transport.h), nothing but the
 * payload travels and start does not wait. Messages of 0 bytes post no NCCL operation (the
 * receiver knows the size, so both ends skip it). finish_sendrecv waits for the payload.
 *
 * The agreements (allreduce_max_u64, host values) go through a small device buffer with
 * ncclAllReduce(ncclUint64, ncclMax) on a stream of the transport's own: they need no order
 * with the caller's work. allreduce_sum_f32 (the uncompressed path) is ncclAllReduce(float,
 * sum) on the caller's device buffer and stream. Every operation is waited for before the
 * next is issued, so operations on the two streams never overlap on the communicator.
 *
 * Threads: each entry makes the communicator's device current for its duration (the engine
 * may call from its progress thread, which starts on device 0) and restores the caller's.
 * One thread at a time uses a transport (the communicator's request queue guarantees it).
 * gcomp_nccl_abort, the one entry for any thread, only sets a flag: every poll above checks
 * it, so the thread in a call aborts gcomp's communicator itself (ncclCommAbort, from the
 * thread that polls it, never under another's poll) and returns GCOMP_ERR_TRANSPORT at once,
 * and the destroy that follows aborts instead of finalising (no wait for peers that are gone).
 *
 * Scratch (the size words, the agreements' buffers, one event, one stream) is allocated at
 * creation and grown only when an agreement is longer than any before: nothing per call.
 * The CUDA runtime is called only from cuda/nccl.cu (events, pinned memory, the device,
 * the stream) and cuda/device.cu (device memory and copies, through the device ops).
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nccl.h>

#include "comm.h"
#include "config.h"
#include "device.h"
#include "gcomp_nccl.h"
#include "transport.h"

/* ncclCommSplit and ncclConfig_t.splitShare came with 2.18; ncclConfig_t.commName (only a
 * name in NCCL's logs) with 2.27.3, so it is set only when the headers have it. */
#define GCOMP_NCCL_MIN_VERSION NCCL_VERSION(2, 18, 0)
#if NCCL_VERSION_CODE < GCOMP_NCCL_MIN_VERSION
#error "gcomp's NCCL transport needs NCCL 2.18 or later (ncclCommSplit, non-blocking communicators)"
#endif

/* cuda/device.cu: the device layer's CUDA ops (device memory, copies) */
extern const gcomp__device_ops gcomp__device_cuda;
/* cuda/nccl.cu */
gcomp_result gcomp__nccl_cuda_enter(int dev, int *prev);
void gcomp__nccl_cuda_leave(int dev, int prev);
gcomp_result gcomp__nccl_cuda_host_alloc(size_t bytes, void **out);
void gcomp__nccl_cuda_host_free(void *p);
gcomp_result gcomp__nccl_cuda_stream_create(struct CUstream_st **out);
void gcomp__nccl_cuda_stream_destroy(struct CUstream_st *s);
gcomp_result gcomp__nccl_cuda_event_create(struct CUevent_st **out);
void gcomp__nccl_cuda_event_destroy(struct CUevent_st *ev);
gcomp_result gcomp__nccl_cuda_event_record(struct CUevent_st *ev, struct CUstream_st *s);
int gcomp__nccl_cuda_event_done(struct CUevent_st *ev, gcomp_result *rc);
int gcomp__nccl_cuda_capturing(struct CUstream_st *s);

#define NO_ZSTD                                                                                        \
    "the NCCL transport moves device memory and zstd runs on host memory: use the MPI path for +zstd " \
    "(gcomp_comm_create_mpi; device buffers are staged through host memory there)"

typedef struct nccl_transport {
    gcomp__transport base;
    ncclComm_t comm; /* gcomp's own (split from the user's, or made from a unique id); NULL once aborted */
    int device;      /* the CUDA device of comm */
    int dead;        /* aborted after a timeout or an error: every later call fails */
    int abort_asked; /* gcomp_nccl_abort (any thread, atomically): the thread in a call aborts comm */
    char dead_why[160];
    int64_t timeout_ms;               /* the communicator's: waits of calls that get no deadline */
    double call_deadline;             /* the deadline of the latest call that passed one */
    struct CUstream_st *agree_stream; /* the agreements' stream (host values: no order with the caller's) */
    struct CUevent_st *done;          /* recorded after the work a wait waits for */
    uint64_t *dsize, *hsize;          /* the size exchange: [0] out, [1] in; device and pinned host */
    void *dcoll, *hcoll;              /* allreduce_max_u64: device and pinned host scratch */
    size_t coll_cap;                  /* bytes of each */
    int in_flight;                    /* an exchange was started and not finished */
    size_t rbytes;                    /* its receive size */
    uint64_t allocs;                  /* device and pinned allocations so far (tests: none per call) */
} nccl_transport;

/* Tests: how many allocations the transport made (creation's and growth's), to show that
 * calls in steady state make none. */
uint64_t gcomp__nccl_transport_allocs(const gcomp__transport *t);
uint64_t gcomp__nccl_transport_allocs(const gcomp__transport *t) { return ((const nccl_transport *)t)->allocs; }

/* Abort gcomp's communicator: after a timeout its kernels may wait forever for a peer, and
 * after an error it is in an unknown state. Never the user's communicator. */
static void kill_comm(nccl_transport *n, const char *why)
{
    if (n->dead) return;
    n->dead = 1;
    snprintf(n->dead_why, sizeof n->dead_why, "%s", why);
    if (n->comm) (void)ncclCommAbort(n->comm);
    n->comm = NULL;
}

/* An NCCL failure: NCCL's words in the message, then the communicator is aborted. */
static gcomp_result nccl_fail(nccl_transport *n, ncclResult_t r, const char *what)
{
    const char *last = n->comm ? ncclGetLastError(n->comm) : NULL;
    gcomp_result rc = gcomp__fail(GCOMP_ERR_TRANSPORT, "%s: %s%s%s%s", what, ncclGetErrorString(r),
                                  last && *last ? " (" : "", last && *last ? last : "", last && *last ? ")" : "");
    kill_comm(n, "an earlier NCCL operation failed");
    return rc;
}

static gcomp_result timed_out(nccl_transport *n, const char *what)
{
    gcomp_result rc = gcomp__fail(GCOMP_ERR_TIMEOUT,
                                  "%s: not done before the deadline (GCOMP_TIMEOUT_MS; a peer did not answer, or the "
                                  "stream is blocked): gcomp aborted its own NCCL communicator",
                                  what);
    kill_comm(n, "an earlier NCCL operation timed out");
    return rc;
}

/* The program asked for an abort (gcomp_nccl_abort, from any thread): the thread in the call
 * aborts gcomp's communicator itself, so no other thread frees it under a poll. */
static int abort_asked(const nccl_transport *n) { return __atomic_load_n(&n->abort_asked, __ATOMIC_ACQUIRE); }

static gcomp_result aborted(nccl_transport *n, const char *what)
{
    gcomp_result rc = gcomp__fail(GCOMP_ERR_TRANSPORT,
                                  "%s: stopped: the program aborted this communicator (gcomp_nccl_abort; "
                                  "libgcomp_nccl.so calls it from ncclCommAbort)",
                                  what);
    kill_comm(n, "the program aborted it (gcomp_nccl_abort)");
    return rc;
}

/* Any other failure of a step (CUDA): the communicator is in an unknown state too. */
static gcomp_result failed(nccl_transport *n, gcomp_result rc)
{
    if (rc != GCOMP_SUCCESS) kill_comm(n, "an earlier CUDA operation of the NCCL transport failed");
    return rc;
}

/* Between two polls: spin (a small message takes microseconds), then yield, then sleep up
 * to 50 us (a long wait costs little CPU). */
static void nap(long *spins)
{
    struct timespec ts = { 0, 0 };
    ++*spins;
    if (*spins < 64) return;
    if (*spins < 2048) {
        sched_yield();
        return;
    }
    ts.tv_nsec = *spins < 4096 ? 5000 : 50000;
    nanosleep(&ts, NULL);
}

/* A call on a non-blocking communicator returned r: wait until it has taken effect
 * (ncclCommGetAsyncError no longer says ncclInProgress), the deadline passes (*late = 1) or
 * *stop is set (*late = 2; stop may be NULL). Does not abort: creation uses it on a
 * communicator that is not yet a transport's. */
static ncclResult_t settle_comm(ncclComm_t comm, ncclResult_t r, double deadline, const int *stop, int *late)
{
    long spins = 0;
    *late = 0;
    while (r == ncclInProgress) {
        if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) return ncclInternalError;
        if (r != ncclInProgress) break;
        if (stop && __atomic_load_n(stop, __ATOMIC_ACQUIRE)) {
            *late = 2;
            return r;
        }
        if (gcomp__now() > deadline) {
            *late = 1;
            return r;
        }
        nap(&spins);
    }
    return r;
}

static gcomp_result settle(nccl_transport *n, ncclResult_t r, double deadline, const char *what)
{
    int late;
    r = settle_comm(n->comm, r, deadline, &n->abort_asked, &late);
    if (late == 2) return aborted(n, what);
    if (late) return timed_out(n, what);
    if (r != ncclSuccess) return nccl_fail(n, r, what);
    return GCOMP_SUCCESS;
}

/* Wait for the work before n->done, polling NCCL's asynchronous errors, until deadline. */
static gcomp_result wait_done(nccl_transport *n, double deadline, const char *what)
{
    long spins = 0;
    for (;;) {
        gcomp_result rc = GCOMP_SUCCESS;
        ncclResult_t async = ncclSuccess;
        int done = gcomp__nccl_cuda_event_done(n->done, &rc);
        if (done > 0) return GCOMP_SUCCESS;
        if (done < 0) return failed(n, rc);
        if (ncclCommGetAsyncError(n->comm, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress)
            return nccl_fail(n, async, what);
        if (abort_asked(n)) return aborted(n, what);
        if (gcomp__now() > deadline) return timed_out(n, what);
        nap(&spins);
    }
}

/* ---- entry and exit of every operation ---- */

static void leave(nccl_transport *n, int prev) { gcomp__nccl_cuda_leave(n->device, prev); }

static gcomp_result enter(nccl_transport *n, int *prev)
{
    *prev = -1;
    if (n->dead) return gcomp__fail(GCOMP_ERR_COMM_INVALID, "NCCL transport: %s", n->dead_why);
    GCOMP_CHECK(gcomp__nccl_cuda_enter(n->device, prev));
    if (abort_asked(n)) {
        leave(n, *prev);
        return aborted(n, "NCCL transport");
    }
    return GCOMP_SUCCESS;
}

/* The deadline of waits inside start_sendrecv (which gets none): the current call's, known
 * from the agreement every call of the engine begins with, else timeout_ms from now. */
static double start_deadline(const nccl_transport *n)
{
    double now = gcomp__now();
    return n->call_deadline > now ? n->call_deadline : now + 1e-3 * (double)n->timeout_ms;
}

static gcomp_result not_capturing(struct CUstream_st *s, const char *what)
{
    if (gcomp__nccl_cuda_capturing(s))
        return gcomp__fail(GCOMP_ERR_UNSUPPORTED,
                           "%s: the stream is being captured into a CUDA graph; gcomp over NCCL waits on the host "
                           "between its steps and cannot be captured",
                           what);
    return GCOMP_SUCCESS;
}

/* ---- send/receive ---- */

/* One grouped ncclSend/ncclRecv on stream (either side skipped when it has 0 bytes). */
static gcomp_result sendrecv_group(nccl_transport *n, int to, const void *sbuf, size_t sbytes, int from, void *rbuf,
                                   size_t rbytes, struct CUstream_st *stream, double deadline, const char *what)
{
    ncclResult_t r = ncclGroupStart(), end;
    if (r != ncclSuccess) return nccl_fail(n, r, what);
    if (sbytes) r = ncclSend(sbuf, sbytes, ncclUint8, to, n->comm, stream);
    if (r == ncclSuccess && rbytes) r = ncclRecv(rbuf, rbytes, ncclUint8, from, n->comm, stream);
    end = ncclGroupEnd(); /* always: the group must be closed */
    if (r == ncclSuccess) r = end;
    return settle(n, r, deadline, what);
}

/* The size of the message from `from` (the peer's sbytes), exchanged for ours. */
static gcomp_result exchange_size(nccl_transport *n, int to, size_t sbytes, int from, size_t *rsize, double deadline)
{
    struct CUstream_st *s = n->base.stream;
    n->hsize[0] = sbytes;
    GCOMP_CHECK(failed(n, gcomp__device_cuda.copy_async(n->dsize, n->hsize, sizeof(uint64_t), s)));
    GCOMP_CHECK(sendrecv_group(n, to, n->dsize, sizeof(uint64_t), from, n->dsize + 1, sizeof(uint64_t), s, deadline,
                               "NCCL size exchange"));
    GCOMP_CHECK(failed(n, gcomp__device_cuda.copy_async(n->hsize + 1, n->dsize + 1, sizeof(uint64_t), s)));
    GCOMP_CHECK(failed(n, gcomp__nccl_cuda_event_record(n->done, s)));
    GCOMP_CHECK(wait_done(n, deadline, "NCCL size exchange"));
    *rsize = (size_t)n->hsize[1];
    return GCOMP_SUCCESS;
}

/* Post the payload exchange; sized: rsize is known, else it is exchanged first (<= rcap). */
static gcomp_result post(nccl_transport *n, int to, const void *sbuf, size_t sbytes, int from, void *rbuf, size_t rsize,
                         int sized)
{
    struct CUstream_st *s = n->base.stream;
    double deadline = start_deadline(n);
    size_t rcap = rsize;
    if (n->in_flight) return gcomp__fail(GCOMP_ERR_INTERNAL, "NCCL transport: an exchange is already in flight");
    if (to < 0 || to >= n->base.size || from < 0 || from >= n->base.size)
        return gcomp__fail(GCOMP_ERR_INTERNAL, "NCCL transport: peer %d/%d out of range", to, from);
    GCOMP_CHECK(not_capturing(s, "NCCL transport: send/recv"));
    if (!sized) {
        GCOMP_CHECK(exchange_size(n, to, sbytes, from, &rsize, deadline));
        if (rsize > rcap) {
            gcomp_result rc = gcomp__fail(GCOMP_ERR_TRANSPORT,
                                          "NCCL transport: rank %d sends a message of %zu bytes, more than the %zu "
                                          "this rank expects (message truncated)",
                                          from, rsize, rcap);
            kill_comm(n, "an earlier message was longer than expected");
            return rc;
        }
    }
    GCOMP_CHECK(sendrecv_group(n, to, sbuf, sbytes, from, rbuf, rsize, s, deadline, "NCCL send/recv"));
    GCOMP_CHECK(failed(n, gcomp__nccl_cuda_event_record(n->done, s)));
    n->in_flight = 1;
    n->rbytes = rsize;
    return GCOMP_SUCCESS;
}

/* post() on the transport's device (enter/leave): the two start entry points differ only in sized. */
static gcomp_result start_on_device(gcomp__transport *t, int to, const void *sbuf, size_t sbytes, int from, void *rbuf,
                                    size_t rsize, int sized)
{
    nccl_transport *n = (nccl_transport *)t;
    int prev;
    gcomp_result rc;
    GCOMP_CHECK(enter(n, &prev));
    rc = post(n, to, sbuf, sbytes, from, rbuf, rsize, sized);
    leave(n, prev);
    return rc;
}

static gcomp_result nccl_start(gcomp__transport *t, int to, const void *sbuf, size_t sbytes, int from, void *rbuf,
                               size_t rcap)
{
    return start_on_device(t, to, sbuf, sbytes, from, rbuf, rcap, 0);
}

static gcomp_result nccl_start_sized(gcomp__transport *t, int to, const void *sbuf, size_t sbytes, int from, void *rbuf,
                                     size_t rbytes)
{
    return start_on_device(t, to, sbuf, sbytes, from, rbuf, rbytes, 1);
}

static gcomp_result nccl_finish(gcomp__transport *t, size_t *rbytes, double deadline)
{
    nccl_transport *n = (nccl_transport *)t;
    int prev;
    gcomp_result rc;
    GCOMP_CHECK(enter(n, &prev));
    n->call_deadline = deadline;
    if (!n->in_flight) {
        rc = gcomp__fail(GCOMP_ERR_INTERNAL, "NCCL transport: finish_sendrecv without an exchange in flight");
    } else {
        n->in_flight = 0;
        rc = wait_done(n, deadline, "NCCL send/recv");
        if (rc == GCOMP_SUCCESS) *rbytes = n->rbytes;
    }
    leave(n, prev);
    return rc;
}

/* NCCL moves data from its own kernels and proxy thread: nothing to drive from here. */
static void nccl_progress(gcomp__transport *t) { (void)t; }

/* ---- the small collectives ---- */

/* Grow the agreements' scratch to bytes (at creation, and for an agreement longer than any
 * before: the integer ring's scales of a larger tensor). */
static gcomp_result coll_reserve(nccl_transport *n, size_t bytes)
{
    void *d = NULL, *h = NULL;
    gcomp_result rc;
    if (bytes <= n->coll_cap) return GCOMP_SUCCESS;
    if (bytes < 2 * n->coll_cap) bytes = 2 * n->coll_cap;
    GCOMP_CHECK(gcomp__device_cuda.alloc(bytes, &d));
    rc = gcomp__nccl_cuda_host_alloc(bytes, &h); /* its message and code (NOMEM, or CUDA's failure) */
    if (rc != GCOMP_SUCCESS) {
        gcomp__device_cuda.free(d);
        return rc;
    }
    gcomp__device_cuda.free(n->dcoll);
    gcomp__nccl_cuda_host_free(n->hcoll);
    n->dcoll = d;
    n->hcoll = h;
    n->coll_cap = bytes;
    n->allocs += 2;
    return GCOMP_SUCCESS;
}

static gcomp_result max_u64(nccl_transport *n, uint64_t *vals, size_t count, double deadline)
{
    struct CUstream_st *s = n->agree_stream;
    size_t bytes = count * sizeof(uint64_t);
    if (!count) return GCOMP_SUCCESS;
    GCOMP_CHECK(coll_reserve(n, bytes));
    memcpy(n->hcoll, vals, bytes);
    GCOMP_CHECK(failed(n, gcomp__device_cuda.copy_async(n->dcoll, n->hcoll, bytes, s)));
    GCOMP_CHECK(settle(n, ncclAllReduce(n->dcoll, n->dcoll, count, ncclUint64, ncclMax, n->comm, s), deadline,
                       "NCCL agreement allreduce"));
    GCOMP_CHECK(failed(n, gcomp__device_cuda.copy_async(n->hcoll, n->dcoll, bytes, s)));
    GCOMP_CHECK(failed(n, gcomp__nccl_cuda_event_record(n->done, s)));
    GCOMP_CHECK(wait_done(n, deadline, "NCCL agreement allreduce"));
    memcpy(vals, n->hcoll, bytes);
    return GCOMP_SUCCESS;
}

static gcomp_result nccl_max_u64(gcomp__transport *t, uint64_t *vals, size_t count, double deadline)
{
    nccl_transport *n = (nccl_transport *)t;
    int prev;
    gcomp_result rc;
    GCOMP_CHECK(enter(n, &prev));
    n->call_deadline = deadline;
    rc = max_u64(n, vals, count, deadline);
    leave(n, prev);
    return rc;
}

static gcomp_result sum_f32(nccl_transport *n, float *vals, size_t count, double deadline)
{
    struct CUstream_st *s = n->base.stream;
    if (!count) return GCOMP_SUCCESS;
    GCOMP_CHECK(not_capturing(s, "NCCL transport: allreduce"));
    GCOMP_CHECK(settle(n, ncclAllReduce(vals, vals, count, ncclFloat, ncclSum, n->comm, s), deadline,
                       "ncclAllReduce (uncompressed path)"));
    GCOMP_CHECK(failed(n, gcomp__nccl_cuda_event_record(n->done, s)));
    return wait_done(n, deadline, "ncclAllReduce (uncompressed path)");
}

static gcomp_result nccl_sum_f32(gcomp__transport *t, float *vals, size_t count, double deadline)
{
    nccl_transport *n = (nccl_transport *)t;
    int prev;
    gcomp_result rc;
    GCOMP_CHECK(enter(n, &prev));
    n->call_deadline = deadline;
    rc = sum_f32(n, vals, count, deadline);
    leave(n, prev);
    return rc;
}

/* One thread at a time per communicator (the request queue), NCCL allows any thread. */
static int nccl_threads_ok(char *why, size_t cap)
{
    (void)why, (void)cap;
    return 1;
}

/* ---- lifetime ---- */

/* A communicator that never failed is finalised (its operations flushed, within timeout_ms)
 * and destroyed; one that did, or that does not finalise in time, is aborted, and so is one
 * the program aborted (gcomp_nccl_abort: no wait for peers that may be gone). */
static void close_comm(nccl_transport *n)
{
    ncclResult_t r;
    int late = 0;
    if (!n->comm) return;
    if (abort_asked(n)) {
        kill_comm(n, "the program aborted it (gcomp_nccl_abort)");
        return;
    }
    r = ncclCommFinalize(n->comm);
    r = settle_comm(n->comm, r, gcomp__now() + 1e-3 * (double)n->timeout_ms, &n->abort_asked, &late);
    if (late || r != ncclSuccess || ncclCommDestroy(n->comm) != ncclSuccess) (void)ncclCommAbort(n->comm);
    n->comm = NULL;
}

static void nccl_destroy(gcomp__transport *t)
{
    nccl_transport *n = (nccl_transport *)t;
    int prev = -1;
    if (!n) return;
    if (gcomp__nccl_cuda_enter(n->device, &prev) != GCOMP_SUCCESS) prev = -1;
    close_comm(n);
    gcomp__device_cuda.free(n->dsize);
    gcomp__device_cuda.free(n->dcoll);
    gcomp__nccl_cuda_host_free(n->hsize);
    gcomp__nccl_cuda_host_free(n->hcoll);
    gcomp__nccl_cuda_event_destroy(n->done);
    gcomp__nccl_cuda_stream_destroy(n->agree_stream);
    leave(n, prev);
    free(n);
}

/* The transport around comm (owned from here on, even on failure: aborted then). */
static gcomp_result transport_new(ncclComm_t comm, int64_t timeout_ms, nccl_transport **out)
{
    nccl_transport *n = calloc(1, sizeof *n);
    gcomp_result rc = GCOMP_SUCCESS;
    ncclResult_t r;
    *out = NULL;
    if (!n) {
        (void)ncclCommAbort(comm);
        return gcomp__fail(GCOMP_ERR_NOMEM, "gcomp_comm_create_nccl: out of memory");
    }
    n->comm = comm;
    n->timeout_ms = timeout_ms;
    if ((r = ncclCommCuDevice(comm, &n->device)) != ncclSuccess ||
        (r = ncclCommUserRank(comm, &n->base.rank)) != ncclSuccess ||
        (r = ncclCommCount(comm, &n->base.size)) != ncclSuccess) {
        rc = nccl_fail(n, r, "gcomp_comm_create_nccl: reading the NCCL communicator");
        goto fail;
    }
    n->base.mem = GCOMP__MEM_CUDA;
    n->base.device = n->device;
    n->base.releases_buffers_on_timeout = 1; /* ncclCommAbort stops the kernels that use them */
    n->base.start_sendrecv = nccl_start;
    n->base.start_sendrecv_sized = nccl_start_sized;
    n->base.finish_sendrecv = nccl_finish;
    n->base.progress = nccl_progress;
    n->base.allreduce_max_u64 = nccl_max_u64;
    n->base.allreduce_sum_f32 = nccl_sum_f32;
    n->base.destroy = nccl_destroy;
    n->base.threads_ok = nccl_threads_ok;
    n->base.no_byte_stages = NO_ZSTD;
    /* the scratch of every later call, now: the size words and a first agreement buffer */
    GCOMP_CHECK_GOTO(failed(n, gcomp__nccl_cuda_stream_create(&n->agree_stream)), rc, fail);
    GCOMP_CHECK_GOTO(failed(n, gcomp__nccl_cuda_event_create(&n->done)), rc, fail);
    GCOMP_CHECK_GOTO(failed(n, gcomp__device_cuda.alloc(2 * sizeof(uint64_t), (void **)&n->dsize)), rc, fail);
    GCOMP_CHECK_GOTO(failed(n, gcomp__nccl_cuda_host_alloc(2 * sizeof(uint64_t), (void **)&n->hsize)), rc, fail);
    n->allocs += 2;
    GCOMP_CHECK_GOTO(failed(n, coll_reserve(n, 64 * sizeof(uint64_t))), rc, fail);
    *out = n;
    return GCOMP_SUCCESS;
fail:
    nccl_destroy(&n->base);
    return rc;
}

static int64_t timeout_of(const gcomp_config *cfg)
{
    gcomp__config resolved;
    /* a bad configuration is reported by the creation's agreement (gcomp__comm_create) */
    if (gcomp__config_resolve(cfg, &resolved) != GCOMP_SUCCESS) return GCOMP__TIMEOUT_MS_DEFAULT;
    return resolved.timeout_ms;
}

/* NCCL's version code as major.minor.patch (codes below 10000 are NCCL 2.8 and older). */
static void version_parts(int v, int *major, int *minor, int *patch)
{
    int wide = v >= 10000;
    *major = wide ? v / 10000 : v / 1000;
    *minor = wide ? v / 100 % 100 : v / 100 % 10;
    *patch = v % 100;
}

/* The NCCL loaded at run time may be older than the headers gcomp was built with (another
 * libnccl.so.2 first on the library path): refuse it before calling what it may lack. */
static gcomp_result check_nccl_version(const char *who)
{
    int v = 0, a, b, c, x, y, z;
    ncclResult_t r = ncclGetVersion(&v);
    if (r != ncclSuccess) return gcomp__fail(GCOMP_ERR_TRANSPORT, "%s: ncclGetVersion: %s", who, ncclGetErrorString(r));
    if (v >= GCOMP_NCCL_MIN_VERSION) return GCOMP_SUCCESS;
    version_parts(v, &a, &b, &c);
    version_parts(NCCL_VERSION_CODE, &x, &y, &z);
    return gcomp__fail(GCOMP_ERR_UNSUPPORTED,
                       "%s: the NCCL library loaded at run time is %d.%d.%d; gcomp needs NCCL 2.18 or later "
                       "(it was built with the headers of %d.%d.%d): put a newer libnccl.so.2 first on the "
                       "library path",
                       who, a, b, c, x, y, z);
}

static ncclConfig_t own_config(void)
{
    ncclConfig_t conf = NCCL_CONFIG_INITIALIZER;
    conf.blocking = 0;   /* every wait polls against a deadline */
    conf.splitShare = 0; /* resources of its own: aborting it leaves the user's communicator alone */
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 3)
    conf.commName = "gcomp";
#endif
    return conf;
}

/* After a non-blocking creation call returned r: wait until comm is ready, or fail (and
 * abort what was made). */
static gcomp_result creation_done(ncclComm_t comm, ncclResult_t r, double deadline, const char *what)
{
    int late = 0;
    if (comm) r = settle_comm(comm, r, deadline, NULL, &late);
    if (!late && r == ncclSuccess && comm) return GCOMP_SUCCESS;
    if (late)
        gcomp__fail(GCOMP_ERR_TIMEOUT, "%s: not every rank joined before the deadline (GCOMP_TIMEOUT_MS)", what);
    else
        gcomp__fail(GCOMP_ERR_TRANSPORT, "%s: %s%s%s%s", what, ncclGetErrorString(r), comm ? " (" : "",
                    comm ? ncclGetLastError(comm) : "", comm ? ")" : "");
    if (comm) (void)ncclCommAbort(comm);
    return late ? GCOMP_ERR_TIMEOUT : GCOMP_ERR_TRANSPORT;
}

/* gcomp's communicator around own (already created), collectively. */
static gcomp_result create_over(ncclComm_t own, const gcomp_config *cfg, int64_t timeout_ms, gcomp_comm **out)
{
    nccl_transport *n;
    int dev = -1, prev = -1;
    gcomp_result rc;
    ncclResult_t r = ncclCommCuDevice(own, &dev);
    if (r != ncclSuccess) {
        (void)ncclCommAbort(own);
        return gcomp__fail(GCOMP_ERR_TRANSPORT, "ncclCommCuDevice: %s", ncclGetErrorString(r));
    }
    /* the transport's stream, event and scratch belong to the communicator's device */
    GCOMP_CHECK(gcomp__nccl_cuda_enter(dev, &prev));
    rc = transport_new(own, timeout_ms, &n);
    if (rc == GCOMP_SUCCESS) rc = gcomp__comm_create(&n->base, cfg, out);
    gcomp__nccl_cuda_leave(dev, prev);
    return rc;
}

gcomp_result gcomp_comm_create_nccl(ncclComm_t comm, const gcomp_config *cfg, gcomp_comm **out)
{
    ncclConfig_t conf = own_config();
    ncclComm_t own = NULL;
    int64_t timeout_ms = timeout_of(cfg);
    int rank = 0, dev = -1, prev = -1;
    ncclResult_t r;
    gcomp_result rc;
    if (out) *out = NULL;
    /* the same on every rank, or the program is erroneous: nothing to join */
    if (!comm) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_comm_create_nccl: comm is NULL");
    if (!out) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_comm_create_nccl: out is NULL");
    GCOMP_CHECK(check_nccl_version("gcomp_comm_create_nccl"));
    if ((r = ncclCommUserRank(comm, &rank)) != ncclSuccess || (r = ncclCommCuDevice(comm, &dev)) != ncclSuccess)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_comm_create_nccl: not a usable NCCL communicator: %s",
                           ncclGetErrorString(r));
    GCOMP_CHECK(gcomp__nccl_cuda_enter(dev, &prev));
    /* gcomp's own communicator: same ranks in the same order, owned and aborted by gcomp */
    r = ncclCommSplit(comm, 0, rank, &own, &conf);
    rc = creation_done(own, r, gcomp__now() + 1e-3 * (double)timeout_ms, "gcomp_comm_create_nccl: ncclCommSplit");
    gcomp__nccl_cuda_leave(dev, prev);
    GCOMP_CHECK(rc);
    return create_over(own, cfg, timeout_ms, out);
}

gcomp_result gcomp_nccl_get_unique_id(void *id128)
{
    ncclUniqueId id;
    ncclResult_t r;
    if (!id128) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_nccl_get_unique_id: id128 is NULL");
    if ((r = ncclGetUniqueId(&id)) != ncclSuccess)
        return gcomp__fail(GCOMP_ERR_TRANSPORT, "ncclGetUniqueId: %s", ncclGetErrorString(r));
    memcpy(id128, &id, sizeof id);
    return GCOMP_SUCCESS;
}

gcomp_result gcomp_comm_create_nccl_rank(const void *id128, int nranks, int rank, const gcomp_config *cfg,
                                         gcomp_comm **out)
{
    ncclConfig_t conf = own_config();
    ncclUniqueId id;
    ncclComm_t own = NULL;
    int64_t timeout_ms = timeout_of(cfg);
    int dev = gcomp__device_current();
    ncclResult_t r;
    if (out) *out = NULL;
    if (!id128 || !out || nranks < 1 || rank < 0 || rank >= nranks)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                           "gcomp_comm_create_nccl_rank: needs an id, out, nranks >= 1 and 0 <= rank < nranks "
                           "(got id %p, out %p, nranks %d, rank %d)",
                           id128, (void *)out, nranks, rank);
    if (dev < 0)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_comm_create_nccl_rank: no CUDA device on this machine");
    GCOMP_CHECK(check_nccl_version("gcomp_comm_create_nccl_rank"));
    memcpy(&id, id128, sizeof id);
    r = ncclCommInitRankConfig(&own, nranks, id, rank, &conf);
    GCOMP_CHECK(creation_done(own, r, gcomp__now() + 1e-3 * (double)timeout_ms,
                              "gcomp_comm_create_nccl_rank: ncclCommInitRankConfig"));
    return create_over(own, cfg, timeout_ms, out);
}

gcomp_result gcomp_nccl_abort(gcomp_comm *comm)
{
    nccl_transport *n;
    if (!comm) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_nccl_abort: comm is NULL");
    if (!comm->tp || comm->tp->destroy != nccl_destroy)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                           "gcomp_nccl_abort: not a communicator over NCCL (gcomp_comm_create_nccl, "
                           "gcomp_comm_create_nccl_rank)");
    n = (nccl_transport *)comm->tp;
    /* only a flag: the thread in a call (or gcomp_comm_destroy) sees it and aborts */
    __atomic_store_n(&n->abort_asked, 1, __ATOMIC_RELEASE);
    return GCOMP_SUCCESS;
}
