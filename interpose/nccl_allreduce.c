/*
 * nccl_allreduce.c — libgcomp_nccl.so: compressed ncclAllReduce for unmodified NCCL programs.
 *
 *   GCOMP_CODEC=fp16 LD_PRELOAD=/path/libgcomp_nccl.so ./trainer
 *
 * The library defines ncclAllReduce and hands every call it does not compress to NCCL's own
 * (found with dlsym(RTLD_NEXT)), arguments untouched, so its result is exactly NCCL's. It
 * also defines ncclGroupStart/ncclGroupEnd (to know when a call is inside a group) and
 * ncclCommDestroy/ncclCommAbort (to free the gcomp communicator of a communicator that
 * goes), each forwarding to NCCL. A call is compressed only when all of these hold, and each
 * depends only on the call's arguments and the environment, so every rank decides alike:
 *   - GCOMP_CODEC is set and not empty (opt-in);
 *   - the datatype is ncclFloat, ncclHalf or ncclBfloat16 and the op ncclSum or ncclAvg;
 *   - the call is not inside ncclGroupStart/ncclGroupEnd on this thread (a grouped call
 *     must be enqueued with the group's other calls at ncclGroupEnd; gcomp cannot join that);
 *   - its stream is not being captured into a CUDA graph (gcomp waits on the host between
 *     steps, which a capture cannot hold);
 *   - the communicator has more than one rank (or GCOMP_TEST_COMPRESS_ONE_RANK set to any
 *     value but "" or "0", as gcomp's config.c reads it: the test-only switch that makes one
 *     rank run the compressed schedules) and its gcomp communicator could be created;
 *   - count * element size >= the communicator's min_bytes (GCOMP_MIN_BYTES, default 65536).
 * Everything else, and every call gcomp itself makes to NCCL, goes to NCCL unchanged.
 *
 * One gcomp communicator per NCCL communicator, created at the first compressible call on
 * it (gcomp_comm_create_nccl: collective, and every rank reaches that call together since
 * they decide alike), destroyed when the program calls ncclCommDestroy or ncclCommAbort on
 * it. gcomp works on an NCCL communicator of its own, split from the program's. A rank without
 * memory for a communicator's state still joins that creation and the check after it, where
 * it makes every rank pass the communicator through (GCOMP_TEST_INTERPOSE_NO_STATE, tests
 * only, any value but "" or "0": act as if out of memory).
 *
 * Threads. ncclCommDestroy/ncclCommAbort of a communicator wait until no compressed call on
 * it is in flight (a count per communicator and a condition): PyTorch's watchdog aborts
 * from its own thread while the main thread is inside ncclAllReduce. ncclCommAbort first
 * asks gcomp to abort its own NCCL communicator (gcomp_nccl_abort: the call in flight
 * returns at its next poll with an error), so the wait is short, and gcomp's communicator is
 * then aborted, not finalised (no wait for peers that are gone); then NCCL's ncclCommAbort.
 * A communicator aborted while its gcomp communicator is being created gets NCCL's abort at
 * once (which ends an ncclCommSplit stuck on a dead peer), then the creation is waited for;
 * the call that was creating it returns ncclInvalidUsage without reaching NCCL.
 *
 * Devices. gcomp runs a call on the current CUDA device, NCCL on the communicator's: when
 * they differ, the communicator's device is made current for the compressed call and the
 * caller's restored after it.
 *
 * Stream semantics: the call is made with the caller's stream, like ncclAllReduce: gcomp's
 * work is ordered after what the stream holds. (gcomp also waits on the host until the
 * result is in recvbuff before it returns, which ncclAllReduce does not.)
 *
 * Error feedback: the residual key is (communicator, receive buffer address, count), as in
 * libgcomp_mpi.so: one residual per long-lived gradient buffer; a buffer reduced with another
 * count (a fusion buffer) is reduced without error feedback from then on; at most
 * MAX_BUFFERS buffers per communicator keep one.
 *
 * Environment (read once): GCOMP_CODEC (opt-in; gcomp's other GCOMP_* variables configure the
 * communicator as usual), GCOMP_DEBUG (any value but "0" or "NONE": one summary line per rank on
 * stderr at each ncclCommDestroy/ncclCommAbort of a communicator gcomp used),
 * GCOMP_STATS_FILE (the same as JSON, rewritten at each of those: every %r in the path becomes the
 * process's rank from its launcher, else the communicator's (process_rank); else ".rank<N>" is
 * appended).
 *
 * A program linked with a static NCCL (some PyTorch builds) has no ncclAllReduce symbol to
 * replace: nothing is intercepted there (docs/INTERPOSE.md).
 */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

#include "common.h"
#include "gcomp.h"
#include "gcomp_nccl.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_BUFFERS 4096  /* receive buffers with error feedback, per communicator */
#define NO_STATE_SLOTS 64 /* communicators this rank had no memory to track, at once */

/* Why a call went to NCCL (the summary counts each). */
enum {
    PASS_DISABLED, /* GCOMP_CODEC unset */
    PASS_GROUP,    /* inside ncclGroupStart/ncclGroupEnd */
    PASS_CAPTURE,  /* the stream is being captured into a CUDA graph */
    PASS_TYPE,     /* not float, half or bfloat16 */
    PASS_OP,       /* not sum or average */
    PASS_COMM,     /* one rank, or a gcomp communicator that could not be created */
    PASS_SMALL,    /* count * element size below min_bytes */
    PASS_REASONS
};
static const char *const pass_names[PASS_REASONS] = { "disabled", "group",        "capture", "datatype",
                                                      "op",       "communicator", "small" };

typedef ncclResult_t allreduce_fn(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
typedef ncclResult_t group_fn(void);
typedef ncclResult_t comm_fn(ncclComm_t);

/* One NCCL communicator's gcomp side. */
typedef struct ip_comm {
    ncclComm_t comm;
    gcomp_comm *g; /* NULL when creation failed: every call on comm passes through */
    int rank;
    int64_t min_bytes;
    int no_ef;     /* error feedback off (GCOMP_EF=0): no keys, as for an exact codec */
    int users;     /* compressed calls in flight, and the creation (under S.lock) */
    int creating;  /* its gcomp communicator is being made (under S.lock) */
    int aborting;  /* ncclCommAbort came while it was in use: abort g as soon as it exists */
    int no_memory; /* a slot of no_state[] (this rank had no memory for comm's state): g stays NULL */
    struct seen {
        const void *buf;  /* the receive buffer */
        const void *send; /* the send buffer (the same one in place) */
        size_t count;
        int shared;
    } * seen;
    size_t n_seen, cap_seen;
    struct ip_comm *next;
} ip_comm;

/* Process-wide state; the counters are atomics (several threads may each drive their own
 * communicator). */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t idle; /* an ip_comm's users or creating went down */
    int ready, enabled, debug, one_rank;
    int exact;         /* the codec keeps no residual (ip_codec_exact): no keys */
    int test_no_state; /* GCOMP_TEST_INTERPOSE_NO_STATE (tests only): act as if out of memory */
    const char *stats_file;
    char codec[512]; /* GCOMP_CODEC as given: a spec has at most 511 characters (gcomp.h) */
    allreduce_fn *allreduce;
    group_fn *group_start, *group_end;
    comm_fn *destroy, *abort;
    ip_comm *live;
    uint64_t compressed, passed[PASS_REASONS], no_ef_calls;
    uint64_t failed; /* calls that returned an error: compressed ones, and ones aborted meanwhile */
    uint64_t comms_created, comms_destroyed;
    uint64_t raw_bytes, wire_bytes, baseline_bytes; /* of gcomp communicators already destroyed */
} S = { .lock = PTHREAD_MUTEX_INITIALIZER, .idle = PTHREAD_COND_INITIALIZER };

/* NCCL calls that gcomp itself makes pass straight through; the group depth is per thread,
 * as NCCL's own. */
static _Thread_local int inside_gcomp, group_depth;

static void *real(const char *name)
{
    void *f = dlsym(RTLD_NEXT, name);
    if (!f) fprintf(stderr, "gcomp_nccl: NCCL's %s not found behind libgcomp_nccl.so\n", name);
    return f;
}

/* The environment and NCCL's own entry points, once. */
static void setup(void)
{
    if (__atomic_load_n(&S.ready, __ATOMIC_ACQUIRE)) return;
    pthread_mutex_lock(&S.lock);
    if (!S.ready) {
        S.enabled = ip_env_codec(S.codec, sizeof S.codec);
        S.exact = S.enabled && ip_codec_exact(S.codec);
        S.debug = ip_env_debug();
        S.one_rank = ip_env_on("GCOMP_TEST_COMPRESS_ONE_RANK");
        S.test_no_state = ip_env_on("GCOMP_TEST_INTERPOSE_NO_STATE");
        S.stats_file = getenv("GCOMP_STATS_FILE");
        S.allreduce = (allreduce_fn *)real("ncclAllReduce");
        S.group_start = (group_fn *)real("ncclGroupStart");
        S.group_end = (group_fn *)real("ncclGroupEnd");
        S.destroy = (comm_fn *)real("ncclCommDestroy");
        S.abort = (comm_fn *)real("ncclCommAbort");
        __atomic_store_n(&S.ready, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&S.lock);
}

/* ---- the summary ---- */

static void summary_line(int rank, char *out, size_t cap)
{
    uint64_t passed = ip_sum(S.passed, PASS_REASONS);
    snprintf(out, cap,
             "gcomp_nccl: rank %d: codec %s, ncclAllReduce calls: %" PRIu64 " compressed (%" PRIu64
             " without error feedback), %" PRIu64 " failed, %" PRIu64 " passed through (disabled %" PRIu64
             ", group %" PRIu64 ", capture %" PRIu64 ", datatype %" PRIu64 ", op %" PRIu64 ", communicator %" PRIu64
             ", small %" PRIu64 "); %" PRIu64 " bytes sent instead of %" PRIu64 " (%" PRId64 " saved)",
             rank, S.enabled ? S.codec : "(off)", S.compressed, S.no_ef_calls, S.failed, passed,
             S.passed[PASS_DISABLED], S.passed[PASS_GROUP], S.passed[PASS_CAPTURE], S.passed[PASS_TYPE],
             S.passed[PASS_OP], S.passed[PASS_COMM], S.passed[PASS_SMALL], S.wire_bytes, S.baseline_bytes,
             (int64_t)(S.baseline_bytes - S.wire_bytes));
}

/* The number that names this process's stats file and summary line: its rank in the job as the launcher gave
 * it (Open MPI's, PMIx's, PMI's, Slurm's, torchrun's RANK), else comm_rank, the rank in the
 * communicator being destroyed. Not comm_rank first: in a communicator of a subset of the
 * ranks (world ranks {2, 3}), world rank 2 is rank 0 and would overwrite world rank 0's file,
 * which holds the same process-wide counts of another process. */
static int process_rank(int comm_rank)
{
    /* the launchers' own first; torchrun's generic RANK last (one left exported in a shell
     * would give every process of an mpirun the same file) */
    static const char *const vars[] = { "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID", "RANK" };
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        char *end;
        long r;
        if (!v || !*v) continue;
        errno = 0;
        r = strtol(v, &end, 10);
        if (!*end && !errno && r >= 0 && r <= INT_MAX) return (int)r;
    }
    return comm_rank;
}

static void write_stats_file(int comm_rank)
{
    FILE *f;
    int rank = process_rank(comm_rank);
    if (!(f = ip_open_stats_file("gcomp_nccl", S.stats_file, rank))) return;
    fprintf(f, "{\"rank\": %d, \"codec\": \"", rank);
    ip_json_string(f, S.enabled ? S.codec : "");
    fputs("\", ", f);
    ip_json_calls(f, S.compressed, S.no_ef_calls, S.failed, S.passed, pass_names, PASS_REASONS);
    fprintf(f,
            ", \"raw_bytes\": %" PRIu64 ", \"wire_bytes\": %" PRIu64 ", \"baseline_bytes\": %" PRIu64
            ", \"bytes_saved\": %" PRId64 ", \"communicators\": %" PRIu64 ", \"communicators_destroyed\": %" PRIu64
            "}\n",
            S.raw_bytes, S.wire_bytes, S.baseline_bytes, (int64_t)(S.baseline_bytes - S.wire_bytes), S.comms_created,
            S.comms_destroyed);
    fclose(f);
}

/* ---- communicators ---- */

/* Ranks with different GCOMP_MIN_BYTES would take different branches for the same call (one
 * compressing, one in NCCL) and hang. gcomp's agreement at the start of every call compares
 * min_bytes (src/comm.c, gcomp__comm_agree_call, field F_MIN_BYTES), but only among ranks
 * that enter gcomp, and this library decides before that. So once, at creation, a call of
 * count 0 runs that agreement alone, over gcomp's own NCCL communicator (with its deadline;
 * nothing on the user's communicator, stream or memory): when the ranks differ every rank
 * gets GCOMP_ERR_MISMATCH, and no rank compresses on this communicator. A rank without memory
 * for the state (c->no_memory, which cannot keep a gcomp communicator) makes that happen too:
 * its call is of f16, the others' of f32, so every rank fails the check and passes comm
 * through, as that rank does; it drops its gcomp communicator even when the check passes
 * (every rank had no memory, and so every rank drops it). */
static void agree_min_bytes(ip_comm *c)
{
    gcomp_comm *g;
    gcomp_result rc;
    inside_gcomp++;
    rc = gcomp_allreduce(c->g, NULL, NULL, 0, c->no_memory ? GCOMP_F16 : GCOMP_F32, GCOMP_SUM, GCOMP_KEY_NONE, NULL);
    inside_gcomp--;
    if (rc == GCOMP_SUCCESS && !c->no_memory) return;
    if (c->no_memory)
        fprintf(stderr, "gcomp_nccl: rank %d: no memory for the communicator's state: no compression on it\n", c->rank);
    else
        fprintf(stderr, "gcomp_nccl: rank %d: no compression on this communicator: %s%s\n", c->rank,
                rc == GCOMP_ERR_MISMATCH
                    ? "ranks differ in GCOMP_MIN_BYTES (min_bytes below), or a rank had no memory for its state "
                      "(dtype below): "
                    : "",
                gcomp_last_error());
    pthread_mutex_lock(&S.lock);
    g = c->g;
    c->g = NULL;
    pthread_mutex_unlock(&S.lock);
    inside_gcomp++;
    gcomp_comm_destroy(g);
    inside_gcomp--;
}

/* Called with S.lock held. */
static ip_comm *find(ncclComm_t comm)
{
    for (ip_comm *c = S.live; c; c = c->next)
        if (c->comm == comm) return c;
    return NULL;
}

/* Called with S.lock held: one user fewer (a compressed call or the creation left). */
static void unuse_locked(ip_comm *c)
{
    c->users--;
    pthread_cond_broadcast(&S.idle);
}

static void release(ip_comm *c)
{
    pthread_mutex_lock(&S.lock);
    unuse_locked(c);
    pthread_mutex_unlock(&S.lock);
}

/* Make comm's gcomp communicator (collective: every rank reaches its first compressible call
 * together, since they decide alike). c is listed and in use, so a destroy waits for this. */
static void create_gcomp(ip_comm *c)
{
    gcomp_config cfg = gcomp_config_default(), got;
    gcomp_comm *g = NULL;
    ncclCommUserRank(c->comm, &c->rank);
    cfg.debug = S.debug; /* ours is any value but "0"; gcomp's own takes 0, 1, NONE, INFO */
    cfg.timeout_ms = ip_timeout_ms();
    inside_gcomp++;
    if (gcomp_comm_create_nccl(c->comm, &cfg, &g) != GCOMP_SUCCESS) {
        /* the creation agrees across ranks: every rank lands here and passes through */
        fprintf(stderr, "gcomp_nccl: rank %d: no compression on this communicator: %s\n", c->rank, gcomp_last_error());
        g = NULL;
    } else if (gcomp_comm_config_get(g, &got) == GCOMP_SUCCESS) {
        c->min_bytes = got.min_bytes;
        c->no_ef = !got.error_feedback;
    }
    inside_gcomp--;
    pthread_mutex_lock(&S.lock);
    c->g = g; /* published under the lock: an abort from now on reaches it */
    if (g && c->aborting) (void)gcomp_nccl_abort(g);
    pthread_mutex_unlock(&S.lock);
    if (c->g) agree_min_bytes(c);
}

/* The states of the communicators this rank had no memory to track: their calls pass through
 * on every rank (agree_min_bytes), and this rank must remember them, or its next call on one
 * would enter gcomp's collective creation alone while the others pass it to NCCL (a hang). A
 * slot is taken while no_memory is set (under S.lock); listed like any state, and cleared
 * instead of freed when its communicator goes (comm_gone). */
static ip_comm no_state[NO_STATE_SLOTS];

/* Called with S.lock held: a free slot of no_state[], taken; NULL when all are. */
static ip_comm *no_state_slot(void)
{
    for (int i = 0; i < NO_STATE_SLOTS; i++)
        if (!no_state[i].no_memory) {
            no_state[i].no_memory = 1;
            return &no_state[i];
        }
    return NULL;
}

/* comm's state with one more user (release() it), its gcomp communicator created at comm's
 * first compressible call. A rank without memory for the state still joins the creation and
 * the check, which the other ranks wait in, and there makes every rank pass comm through.
 * *aborted: ncclCommAbort has begun to end comm (read under the lock taken here anyway). */
static ip_comm *acquire(ncclComm_t comm, int *aborted)
{
    ip_comm *c;
    pthread_mutex_lock(&S.lock);
    c = find(comm);
    while (c && c->creating) { /* another thread of the program is creating it (erroneous in NCCL, but no crash) */
        pthread_cond_wait(&S.idle, &S.lock);
        c = find(comm);
    }
    if (c) {
        c->users++;
        *aborted = c->aborting;
        pthread_mutex_unlock(&S.lock);
        return c;
    }
    if (!(c = S.test_no_state ? NULL : calloc(1, sizeof *c)) && !(c = no_state_slot())) {
        /* NO_STATE_SLOTS communicators live, all without memory: this one cannot be
         * remembered either, and any way on would leave some rank waiting for the others */
        fprintf(stderr,
                "gcomp_nccl: no memory for the state of another communicator (%d already without): its next "
                "ncclAllReduce would wait forever: aborting\n",
                NO_STATE_SLOTS);
        abort();
    }
    c->comm = comm;
    c->users = 1;
    c->creating = 1;
    c->next = S.live;
    S.live = c;
    pthread_mutex_unlock(&S.lock);
    create_gcomp(c);
    pthread_mutex_lock(&S.lock);
    c->creating = 0;
    if (c->g) S.comms_created++;
    *aborted = c->aborting;
    pthread_cond_broadcast(&S.idle);
    pthread_mutex_unlock(&S.lock);
    return c;
}

/* comm is going (ncclCommDestroy/Abort, NCCL's own in `real`): its gcomp communicator goes
 * first, once no call uses it, then the summary, then NCCL's. An abort stops gcomp's call in
 * flight (gcomp_nccl_abort) instead of waiting for it to end by itself; a creation in flight
 * gets NCCL's abort first, which ends an ncclCommSplit stuck on a dead peer. */
static ncclResult_t comm_gone(ncclComm_t comm, comm_fn *real, int is_abort)
{
    ip_comm *c, **at;
    gcomp_comm_stats st;
    char line[1024]; /* the summary with a 511-character spec */
    ncclResult_t r = ncclSuccess;
    int real_done = 0;
    pthread_mutex_lock(&S.lock);
    for (at = &S.live; *at && (*at)->comm != comm; at = &(*at)->next) {
    }
    c = *at;
    if (c) *at = c->next;
    if (c && is_abort) {
        c->aborting = 1;
        if (c->g) (void)gcomp_nccl_abort(c->g);
        if (c->creating) {
            pthread_mutex_unlock(&S.lock);
            r = real(comm);
            real_done = 1;
            pthread_mutex_lock(&S.lock);
        }
    }
    while (c && (c->users > 0 || c->creating)) pthread_cond_wait(&S.idle, &S.lock);
    pthread_mutex_unlock(&S.lock);
    if (c && c->g) {
        if (gcomp_comm_stats_get(c->g, &st) == GCOMP_SUCCESS) {
            __atomic_fetch_add(&S.raw_bytes, st.raw_bytes, __ATOMIC_RELAXED);
            __atomic_fetch_add(&S.wire_bytes, st.wire_bytes, __ATOMIC_RELAXED);
            __atomic_fetch_add(&S.baseline_bytes, st.baseline_bytes, __ATOMIC_RELAXED);
        }
        inside_gcomp++;
        gcomp_comm_destroy(c->g);
        inside_gcomp--;
        ip_bump(&S.comms_destroyed);
        if (S.debug) {
            summary_line(process_rank(c->rank), line, sizeof line); /* process-wide counts: as the file */
            fprintf(stderr, "%s\n", line);
        }
        if (S.stats_file && *S.stats_file) write_stats_file(c->rank);
    }
    if (c) {
        free(c->seen);
        if (c->no_memory) { /* back to the pool */
            pthread_mutex_lock(&S.lock);
            memset(c, 0, sizeof *c);
            pthread_mutex_unlock(&S.lock);
        } else {
            free(c);
        }
    }
    return real_done ? r : real(comm);
}

/* The residual key of a call, or GCOMP_KEY_NONE for buffers whose count has changed. Out of
 * place, the send buffer is part of the key: a program that reduces every gradient into one
 * scratch receive buffer names the tensor by its send buffer. */
static uint64_t residual_key(ip_comm *c, const void *send, const void *buf, size_t n)
{
    struct seen *s = NULL;
    uint64_t k;
    if (S.exact || c->no_ef) return GCOMP_KEY_NONE; /* nothing to keep: no key, no table entry */
    k = ((uint64_t)(uintptr_t)c->comm * 0xff51afd7ed558ccdull) ^
        ((uint64_t)(uintptr_t)buf * 0x9e3779b97f4a7c15ull) ^ (uint64_t)n ^
        (send == buf ? 0 : (uint64_t)(uintptr_t)send * 0xc4ceb9fe1a85ec53ull);
    for (size_t i = 0; i < c->n_seen && !s; i++)
        if (c->seen[i].buf == buf && c->seen[i].send == send) s = &c->seen[i];
    if (!s) {
        if (c->n_seen == MAX_BUFFERS) return GCOMP_KEY_NONE;
        struct seen *p = ip_room_for_one(c->seen, &c->cap_seen, c->n_seen, sizeof *p);
        if (!p) return GCOMP_KEY_NONE;
        c->seen = p;
        s = &c->seen[c->n_seen++];
        *s = (struct seen){ buf, send, n, 0 };
    } else if (!s->shared && s->count != n) {
        s->shared = 1;
        if (S.debug)
            fprintf(stderr,
                    "gcomp_nccl: rank %d: buffer %p reduced with %zu then %zu elements (a fusion buffer?): "
                    "no error feedback for it from now on\n",
                    c->rank, buf, s->count, n);
    }
    if (s->shared) return GCOMP_KEY_NONE;
    return k == GCOMP_KEY_NONE ? 0 : k;
}

static int gcomp_dtype_of(ncclDataType_t t, gcomp_dtype *out)
{
    switch (t) {
    case ncclFloat:
        *out = GCOMP_F32;
        return 1;
    case ncclHalf:
        *out = GCOMP_F16;
        return 1;
    case ncclBfloat16:
        *out = GCOMP_BF16;
        return 1;
    default:
        return 0;
    }
}

/* classify's answer for a call whose communicator ncclCommAbort ended while the call was
 * creating its gcomp side (NCCL's abort has freed comm then) or has just begun to end (it
 * will): either way the call must not reach NCCL. */
#define CALL_ABORTED (-2)

/* Which reason sends this call to NCCL, or -1 to compress it (*out set, in use), or
 * CALL_ABORTED. */
static int classify(size_t count, ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream,
                    ip_comm **out)
{
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    gcomp_dtype dt;
    ip_comm *c;
    int size = 0, why, aborted;
    if (!S.enabled) return PASS_DISABLED;
    if (group_depth > 0) return PASS_GROUP;
    if (cudaStreamIsCapturing(stream, &cap) != cudaSuccess) {
        (void)cudaGetLastError();
        return PASS_CAPTURE; /* whatever the stream is, do not add work to it */
    }
    if (cap != cudaStreamCaptureStatusNone) return PASS_CAPTURE;
    if (!gcomp_dtype_of(type, &dt)) return PASS_TYPE;
    if (op != ncclSum && op != ncclAvg) return PASS_OP;
    if (ncclCommCount(comm, &size) != ncclSuccess || (size < 2 && !S.one_rank)) return PASS_COMM;
    if (count == 0) return PASS_SMALL;
    c = acquire(comm, &aborted);
    why = aborted                                                  ? CALL_ABORTED
          : !c->g                                                  ? PASS_COMM
          : (int64_t)(count * gcomp_dtype_size(dt)) < c->min_bytes ? PASS_SMALL
                                                                   : -1;
    if (why != -1) /* passed through, or aborted: comm_gone may go on */
        release(c);
    else
        *out = c; /* in use until compressed_allreduce releases it */
    return why;
}

/* NCCL takes buffers of the communicator's device whatever device is current; gcomp runs on
 * the current one: make the communicator's current for the call (*prev: the caller's, to
 * restore; -1 when nothing changed). A failure leaves it: gcomp then refuses the buffers on
 * this rank, and its agreement tells every rank. */
static void use_comm_device(ncclComm_t comm, int *prev)
{
    int dev = -1, cur = -1;
    *prev = -1;
    if (ncclCommCuDevice(comm, &dev) != ncclSuccess || cudaGetDevice(&cur) != cudaSuccess || cur == dev) {
        (void)cudaGetLastError();
        return;
    }
    if (cudaSetDevice(dev) == cudaSuccess)
        *prev = cur;
    else
        (void)cudaGetLastError();
}

static void restore_device(int prev)
{
    if (prev >= 0 && cudaSetDevice(prev) != cudaSuccess) (void)cudaGetLastError();
}

static ncclResult_t compressed_allreduce(ip_comm *c, const void *send, void *recv, size_t count, ncclDataType_t type,
                                         ncclRedOp_t op, cudaStream_t stream)
{
    uint64_t key = residual_key(c, send, recv, count);
    gcomp_dtype dt = GCOMP_F32;
    gcomp_result rc;
    int prev;
    gcomp_dtype_of(type, &dt);
    use_comm_device(c->comm, &prev);
    inside_gcomp++;
    rc = gcomp_allreduce(c->g, send, recv, count, dt, op == ncclAvg ? GCOMP_AVG : GCOMP_SUM, key,
                         (struct CUstream_st *)stream);
    inside_gcomp--;
    restore_device(prev);
    release(c);
    if (rc == GCOMP_SUCCESS) {
        ip_bump(&S.compressed);
        if (key == GCOMP_KEY_NONE) ip_bump(&S.no_ef_calls);
        return ncclSuccess;
    }
    /* gcomp reports a failure on every rank; NCCL's nearest words for it */
    ip_bump(&S.failed);
    fprintf(stderr, "gcomp_nccl: rank %d: compressed ncclAllReduce of %zu elements failed: %s: %s\n", c->rank, count,
            gcomp_result_name(rc), gcomp_last_error());
    return rc == GCOMP_ERR_INVALID_ARG ? ncclInvalidArgument
           : rc == GCOMP_ERR_TIMEOUT   ? ncclRemoteError
                                       : ncclInternalError;
}

EXPORT ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                  ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    ip_comm *c = NULL;
    int why;
    setup();
    if (!S.allreduce) return ncclSystemError;
    if (inside_gcomp) return S.allreduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
    why = classify(count, datatype, op, comm, stream, &c);
    if (why == CALL_ABORTED) {
        ip_bump(&S.failed);
        fprintf(stderr, "gcomp_nccl: ncclAllReduce of %zu elements: ncclCommAbort ended its communicator meanwhile\n",
                count);
        return ncclInvalidUsage;
    }
    if (why < 0) return compressed_allreduce(c, sendbuff, recvbuff, count, datatype, op, stream);
    ip_bump(&S.passed[why]);
    return S.allreduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
}

EXPORT ncclResult_t ncclGroupStart(void)
{
    ncclResult_t r;
    setup();
    if (!S.group_start) return ncclSystemError;
    r = S.group_start();
    if (r == ncclSuccess && !inside_gcomp) group_depth++;
    return r;
}

EXPORT ncclResult_t ncclGroupEnd(void)
{
    setup();
    if (!S.group_end) return ncclSystemError;
    /* the group is closed whatever NCCL answers (ncclInProgress on a non-blocking one) */
    if (!inside_gcomp && group_depth > 0) group_depth--;
    return S.group_end();
}

EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    setup();
    if (!S.destroy) return ncclSystemError;
    if (inside_gcomp) return S.destroy(comm);
    return comm_gone(comm, S.destroy, 0);
}

EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    setup();
    if (!S.abort) return ncclSystemError;
    if (inside_gcomp) return S.abort(comm);
    return comm_gone(comm, S.abort, 1);
}
