/*
 * comm.h — the communicator (comm.c): configuration, transport, codec object, per-key
 * state, stats, workspaces, and the agreements ranks make before and after a call. For the
 * API layer only (comm.c, engine.c, checkpoint.c): schedules see a gcomp__call, transports
 * see nothing of it.
 */
#ifndef GCOMP_COMM_H
#define GCOMP_COMM_H

#include "codec_internal.h"
#include "config.h"
#include "transport.h"
#include "workspace.h"

#include <pthread.h>

/* ---- per-key state ---- */
typedef struct gcomp__key {
    uint64_t key;
    size_t count;
    /* calls without a residual so far (error feedback off, or an exact codec): keys the
     * stochastic rounding then (with a residual, the residual's own step does, and is
     * checkpointed with it; this one is not) */
    uint64_t step;
    gcomp_comm_stats stats;
    struct gcomp__key *next;
} gcomp__key;

/* The arguments of one allreduce, as the user passed them. */
typedef struct gcomp__args {
    const void *send;
    void *recv;
    size_t count;
    gcomp_dtype dtype;
    gcomp_op op;
    uint64_t key;
    struct CUstream_st *stream;
    int device;      /* the CUDA device current on the issuing thread (-1: none): a call run on
                      * the progress thread makes it current there too */
    const char *api; /* the API call that issued it ("gcomp_allreduce", "gcomp_iallreduce"): the
                      * engine names the call's argument errors after it */
} gcomp__args;

/* A call issued and not yet freed by gcomp_wait/gcomp_test (request.c). */
struct gcomp_request {
    gcomp_comm *comm;
    gcomp__args args;
    int done;                   /* under comm->q.lock */
    gcomp_result rc;            /* valid once done */
    char detail[512];           /* the runner's gcomp_last_error() on failure (thread-local there) */
    struct gcomp_request *next; /* the queue */
};

/* The calls of a communicator, run one after another in the order issued (request.c). */
typedef struct gcomp__queue {
    pthread_mutex_t lock;
    pthread_cond_t cond;               /* a call finished, or one was queued, or stop */
    struct gcomp_request *head, *tail; /* issued, not yet started */
    int running;                       /* a call is being run (by the thread or a caller), or the
                                        * communicator is held (gcomp__comm_hold) */
    int outstanding;                   /* gcomp_iallreduce requests not yet completed by
                                        * gcomp_wait/gcomp_test */
    int mode;                          /* GCOMP__PROGRESS_*: decided at the first call */
    int inited, thread_started, stop;
    pthread_t thread;
} gcomp__queue;
enum {
    GCOMP__PROGRESS_UNDECIDED = 0,
    GCOMP__PROGRESS_THREAD = 1,
    GCOMP__PROGRESS_CALLER = 2
};

struct gcomp_comm {
    gcomp__config cfg;
    gcomp__transport *tp; /* the transport the communicator was made with: the agreements,
                           * and the buffers of its memory kind (tp->mem) */
    /* decorators of tp for buffers of the other memory kind, made at their first call and
     * owned here (tp stays owned by the communicator too): CUDA memory over a host transport
     * goes through the staging transport (transport_staging.c); [GCOMP__MEM_HOST] only by a
     * test hook (gcomp__comm_stage_host) */
    gcomp__transport *staged[2];
    int emulate_device; /* test hook (gcomp__comm_emulate_device): host buffers take the device path */
    gcomp_codec *codec;       /* the parsed chain and its residuals */
    gcomp_codec *dense_codec; /* sparse-as-dense: the fp32 ring's codec ("none"), made at first use */
    int broken;               /* set by a timeout or transport failure: refuse further calls */
    gcomp__key *keys;
    uint64_t nokey_step; /* the step of GCOMP_KEY_NONE calls (no residual; checkpoint.c saves it) */
    uint32_t call_seq;   /* compressed calls so far: each call's ring trailers carry it (ring.h) */
    uint8_t *agree_buf;  /* the in-band agreement's own pass (engine.c), made at first use */
    gcomp_comm_stats stats;
    gcomp__workspace ws[2]; /* scratch per device kind (gcomp__device_kind) */
    int threads_ok;         /* the transport allows a progress thread (checked at creation) */
    gcomp__queue q;
};

/* ---- the engine (engine.c) and the request queue (request.c) ---- */
/* Run one call to its end on this thread (the caller of gcomp_allreduce, or the progress
 * thread). Calls of a communicator never run concurrently: request.c serialises them. */
gcomp_result gcomp__engine_run(gcomp_comm *c, const gcomp__args *a);
/* For the calls that read or replace the communicator's per-key state outside the queue
 * (residual checkpoints, checkpoint.c): GCOMP_ERR_INVALID_ARG, named after api, while a
 * gcomp_iallreduce of the communicator is in flight (issued and not yet completed by
 * gcomp_wait/gcomp_test, whether or not it ran), else the queue is held as if a call ran, so
 * the progress thread starts none, until gcomp__comm_release. */
gcomp_result gcomp__comm_hold(gcomp_comm *c, const char *api);
void gcomp__comm_release(gcomp_comm *c);
/* Frees the communicator and everything it owns (comm.c). gcomp_comm_destroy (request.c)
 * first lets the calls in flight finish and joins the progress thread, then calls this, so the
 * communicator layer never calls up into the request layer. */
void gcomp__comm_free(gcomp_comm *c);

/* The key's state, created at its first call (its count is recorded when a call succeeds). */
gcomp_result gcomp__comm_key(gcomp_comm *c, uint64_t key, gcomp__key **out);
const gcomp__key *gcomp__comm_find_key(const gcomp_comm *c, uint64_t key);
/* A call's numbers into the key's (k NULL: none, a call of count 0) and the communicator's stats. */
void gcomp__comm_add_stats(gcomp_comm *c, gcomp__key *k, const gcomp_comm_stats *st);
/* Zeroes the communicator's stats and every key's (gcomp_comm_stats_reset, under the hold). */
void gcomp__comm_clear_stats(gcomp_comm *c);
/* rc, after marking the communicator broken when rc says the transport is (timeout, failure). */
gcomp_result gcomp__comm_transport_failed(gcomp_comm *c, gcomp_result rc);
/* The transport that moves buffers of dev's memory: tp when its memory kind is that one,
 * else a staging decorator of tp (made here at the first such call). GCOMP_ERR_UNSUPPORTED
 * for host buffers on a transport of device memory only (NCCL). */
gcomp_result gcomp__comm_transport_for(gcomp_comm *c, const char *api, const gcomp__device_ops *dev,
                                       gcomp__transport **out);
/* Device memory the communicator allocated so far: workspace, the codec objects' device
 * state and residuals, staging buffers (pinned host memory). Tests show steady state adds none. */
uint64_t gcomp__comm_device_allocs(const gcomp_comm *c);

/* Before a call: the ranks agree on the call (codec spec, count, dtype, op, min_bytes,
 * memory kind (on_device), library version) and on whether every rank's preparation (local) succeeded. A difference
 * is GCOMP_ERR_MISMATCH on every rank, a local failure anywhere that rank's error.
 * *any_device: some rank's call runs on device buffers (on_device), so every rank ends the
 * call with gcomp__comm_agree_outcome instead of the ring's outcome trailers.
 *
 * An agreement is needed on every call: whether a call is bypassed or compressed, and the
 * size of every receive a rank posts, follow from (count, dtype, codec, min_bytes), arguments
 * that may change from call to call on any one rank; a rank that differed without one would
 * post receives too small for what its neighbour sends (truncation) or wait in another
 * operation until the timeout, instead of returning GCOMP_ERR_MISMATCH at once. This
 * collective one serves the integer ring and NCCL; host transports agree in the ring
 * (gcomp__comm_in_band below). */
/* scales: NULL, or GCOMP__AGREE_SCALES uint64 that ride in the same allreduce: a TernGrad
 * call on host fp32 buffers puts its local scales' |bits| there (engine.c), so the codec's
 * shared scales need no allreduce of their own (sched_integer.c). *scales_shared = 1 when
 * every rank passed its scales, and scales then holds their max over ranks; 0 when some rank
 * passed NULL (every rank then shares its scales in the ring, as before). Every agreement
 * carries the slots (zero when unused): the layout never changes. */
#define GCOMP__AGREE_SCALES 8
gcomp_result gcomp__comm_agree_call(gcomp_comm *c, gcomp_result local, size_t count, gcomp_dtype dtype, gcomp_op op,
                                    int on_device, uint64_t *scales, int *scales_shared, int *any_device,
                                    double deadline);
/* The in-band agreement (ring.h): on a communicator whose transport is host memory with
 * any-size receives (MPI, loopback) and whose codec is not an integer one, a call does not
 * agree by a collective: the same fields and first failure travel in a block in the first
 * N-1 messages of the call's ring (or of a pass of its own, engine.c), and the verdict is
 * taken on every rank from the same max. Integer codecs (TernGrad) keep the collective: it
 * carries their shared scales, which the ring needs before its first message. The same
 * answer on every rank: it depends on the codec and the transport, agreed at creation. */
int gcomp__comm_in_band(const gcomp_comm *c);
/* The in-band agreement travels on the butterfly (ring.h) instead of the ring: an in-band
 * communicator of a dense codec (no integer or sparse one) at N = 4, 8, 16, ... ranks, where
 * small calls run recursive doubling. Every call's agreement then takes the butterfly's
 * peers, whatever schedule it planned, so ranks that disagree on the call still exchange the
 * same messages before the verdict. The same answer on every rank (the codec is agreed at
 * creation). */
int gcomp__comm_butterfly(const gcomp_comm *c);
/* What the verdict needs of this rank's call (the block is built from the same). */
typedef struct gcomp__agreement {
    gcomp_comm *c;
    size_t count;
    gcomp_dtype dtype;
    gcomp_op op;
    char detail[256]; /* this rank's own failure message */
} gcomp__agreement;
/* Fill block (at most 18 uint64) for the call; returns its length. in_ring: the call's ring
 * carries the agreement (else it runs a pass of its own): part of the fingerprint, so ranks
 * that would send different messages after the verdict never pass it. */
size_t gcomp__comm_in_band_block(gcomp_comm *c, gcomp__agreement *a, gcomp_result local, size_t count,
                                 gcomp_dtype dtype, gcomp_op op, int on_device, int in_ring, uint64_t *block);
/* The verdict (a gcomp__ring_verdict, ctx: the gcomp__agreement): a failure before the call on
 * some rank (that rank's error everywhere), else GCOMP_ERR_MISMATCH when the fields differ,
 * with the same messages as gcomp__comm_agree_call. */
gcomp_result gcomp__comm_in_band_verdict(void *ctx, const uint64_t *mine, const uint64_t *all, size_t n);

/* After a compressed schedule on device buffers (host buffers carry the outcome in the ring's
 * trailers, ring.h; device buffers' flags live in device memory and are read back at the end):
 * whether any rank failed locally (the error, on every rank) and whether any saw a non-finite
 * value (*nonfinite, the same on every rank). */
gcomp_result gcomp__comm_agree_outcome(gcomp_comm *c, gcomp_result local, int local_nonfinite, int *nonfinite,
                                       double deadline);

/* Test hook: added to this thread's wire protocol number at creation (comm.c), as if it
 * ran another build of the library (a loopback rank is a thread). */
extern _Thread_local int gcomp__protocol_skew;

/* Test hooks (tests only): make this rank's next call fail its allocation (the workspace
 * is released and its next fit fails), truncate the next message it sends by one byte, or
 * garble the failure field of the next message's outcome trailer (the transport is wrapped in
 * the fault decorator, transport_fault.c). */
enum {
    GCOMP__FAULT_NONE = 0,
    GCOMP__FAULT_ALLOC = 1,
    GCOMP__FAULT_TRUNCATE_WIRE = 2,
    GCOMP__FAULT_GARBLE_TRAILER = 3
};
void gcomp__comm_inject_fault(gcomp_comm *c, int fault);
/* Test hook: host buffers of this communicator go through a staging decorator with the host's
 * device ops (bounce buffers of plain memory), so the decorator's logic runs without a GPU. */
gcomp_result gcomp__comm_stage_host(gcomp_comm *c);
/* Test hook: host buffers of this communicator take the engine's device path (the device
 * workspace and residual store, the call's status and tally blocks, the codec's `cuda` ops,
 * the staging decorator) with the host's device ops, so a codec whose `cuda` table runs on
 * host memory exercises that path without a GPU (tests/test_staging.c). dense_spec: the
 * codec of sparse-as-dense's fp32 ring (normally "none"), one with such a table too.
 * staged = 0: without the staging decorator, so that host copies of the "device" buffers
 * (a codec with a byte stage) run on the communicator's own transport, as real device
 * buffers' copies do on MPI (tests/test_loop.c). */
gcomp_result gcomp__comm_emulate_device(gcomp_comm *c, const char *dense_spec, int staged);

#endif
