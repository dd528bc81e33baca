/*
 * mpi_allreduce.c — libgcomp_mpi.so: compressed MPI_Allreduce for unmodified MPI programs.
 *
 *   GCOMP_CODEC=terngrad LD_PRELOAD=/path/libgcomp_mpi.so mpirun ... ./trainer
 *
 * The library defines MPI_Allreduce (C) and the Fortran entry points of Open MPI's mpif.h /
 * `use mpi` (mpi_allreduce_ and its spellings) and `use mpi_f08` (mpi_allreduce_f08_); a
 * program's own PMPI_Allreduce, in any language, is never touched. A call is compressed only
 * when all of these hold, and each depends only on the call's arguments and the environment,
 * so every rank decides the same way:
 *   - GCOMP_CODEC is set and not empty (opt-in);
 *   - the datatype is predefined MPI_FLOAT (or Fortran's MPI_REAL / MPI_REAL4 of 4 bytes) and
 *     the op is predefined MPI_SUM;
 *   - the communicator is an intracommunicator with more than one rank;
 *   - count * 4 >= the communicator's min_bytes (GCOMP_MIN_BYTES, default 65536);
 *   - the send buffer is MPI_IN_PLACE or not the receive buffer (an aliased call is
 *     erroneous: MPI's own answer to it is an error, MPI_ERR_BUFFER, which the caller gets);
 *   - MPI is initialised and MPI_Finalize has not begun: the library defines MPI_Finalize
 *     too, to note that before MPI deletes attributes (a program's own MPI_COMM_SELF delete
 *     callback may reduce during MPI_Finalize, before the interposer's callback runs).
 * Everything else goes to the next MPI_Allreduce (or Open MPI's own Fortran binding) with the
 * caller's arguments untouched, so its result is exactly MPI's: the next is that of a PMPI
 * tool preloaded after this library, else MPI's own (next_mpi). MPI_Iallreduce and the other
 * collectives are not intercepted at all, but for MPI_Bcast, which in sequence mode (below) is
 * observed, never changed: it goes to the next MPI_Bcast with the caller's arguments.
 *
 * One gcomp communicator per MPI communicator, created collectively at the first float sum
 * on it (all ranks reach that call together, since the decision above is the same on every
 * rank) and kept as an attribute of that communicator: its delete callback destroys the
 * gcomp communicator when the program frees the MPI one (MPI_Comm_free from any language)
 * and, at MPI_Finalize, an attribute on MPI_COMM_SELF (deleted first, while MPI still works)
 * destroys whatever is left and writes the summary.
 *
 * Error feedback: the residual key names what a buffer holds, chosen by
 * GCOMP_INTERPOSE_EF_KEY:
 *   - "buffer" (default): (communicator, buffer addresses, count), the addresses being the
 *     receive buffer's and, out of place, the send buffer's too (a program that reduces every
 *     gradient into one scratch receive buffer names the tensor by its send buffer). A trainer
 *     that reduces each gradient in its own long-lived buffer gets one residual per tensor. A
 *     buffer that comes back with a different count is a buffer whose contents change meaning
 *     (Horovod's fusion buffer: which tensors share a fused call varies from step to step):
 *     its residual would feed one tensor's error into another, so from then on that address
 *     is reduced without error feedback (still compressed), and the summary counts those
 *     calls. The same address and count holding other tensors is not seen.
 *   - "sequence": (communicator, buffer addresses, count, control context). The control
 *     context is a hash of the results of the control collectives that led to the call (the
 *     MPI_Allreduce, any op, and MPI_Bcast calls of predefined integer types on the same
 *     communicator since the last compressed call) and of the call's place among the
 *     compressed calls after them. A program that decides what goes into a shared buffer
 *     through such calls
 *     (Horovod: each cycle's MPI_BAND of the response-cache bits, and the coordinator's
 *     MPI_Bcast of the response list when something is not cached; the fused composition is
 *     a function of those results) gets one residual per composition: no tensor's error is
 *     fed into another one's, at the price of a residual per composition (delayed error
 *     feedback) instead of per tensor. A control call of the same kind, datatype, op and
 *     count as the one that opened the run starts a new run (Horovod's idle cycles each
 *     reduce one bit vector: only the last one counts). Control results are hashed up to
 *     CONTROL_HASH_BYTES each.
 * At most MAX_BUFFERS keys per communicator keep a residual (and in sequence mode at most
 * MAX_CONTEXTS per buffer address); calls on further ones run without error feedback too.
 * A program that reduces freshly allocated arrays every step (mpi4py with new numpy
 * gradients) shows new addresses at most calls, and some old ones again where the allocator
 * recycles them: a residual per address would keep two copies of each call's buffer that no
 * later call reads (memory growing by that per call). So a key reduced once gets its
 * residual only while fewer than MAX_ONCE keys of the communicator have been reduced once and
 * not again (the others get theirs at a later call), and while CHURN_NEW of the last 64
 * calls after the first repeated address were on new addresses, the communicator gives no
 * new residual keys (a program that keeps its buffers shows no new ones after its first
 * round of calls). Buffer mode only: in sequence mode a buffer's contexts are bounded by
 * MAX_CONTEXTS, and Horovod's compositions change with the timing of its cycles.
 *
 * Environment (read once, here): GCOMP_CODEC (opt-in; the rest of gcomp's GCOMP_* variables
 * configure the communicator as usual), GCOMP_INTERPOSE_EF_KEY (above), GCOMP_DEBUG (any value
 * but "0" or "NONE": one summary line per rank on stderr at MPI_Finalize, and one line per compressed
 * call with its buffer, count and key), GCOMP_STATS_FILE (the same as JSON, one file per rank:
 * every %r in the path becomes the MPI_COMM_WORLD rank, else ".rank<N>" is appended).
 *
 * Uses gcomp's public API only.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "common.h"
#include "gcomp.h"
#include "gcomp_mpi.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_BUFFERS 4096         /* keys with error feedback, per communicator */
#define MAX_CONTEXTS 256         /* sequence mode: control contexts per buffer address */
#define MAX_ONCE 16              /* keys with a residual that were reduced only once, per communicator */
#define CHURN_NEW 16             /* of the last 64 calls after the first repeat, on new addresses */
#define CONTROL_HASH_BYTES 65536 /* of each control result, hashed */

/* GCOMP_INTERPOSE_EF_KEY */
enum {
    EF_KEY_BUFFER,
    EF_KEY_SEQUENCE
};

/* Why a call went to MPI (the summary counts each). */
enum {
    PASS_DISABLED, /* GCOMP_CODEC unset, or MPI not initialised / finalising */
    PASS_TYPE,     /* not predefined MPI_FLOAT (other types, derived datatypes) */
    PASS_OP,       /* not predefined MPI_SUM (MPI_MAX, user ops) */
    PASS_COMM,     /* intercommunicator, one rank, or a gcomp communicator that failed */
    PASS_SMALL,    /* count * 4 below min_bytes */
    PASS_ALIASED,  /* sendbuf == recvbuf without MPI_IN_PLACE: erroneous, MPI reports it */
    PASS_REASONS
};
static const char *const pass_names[PASS_REASONS] = {
    "disabled", "datatype", "op", "communicator", "small", "aliased"
};

/* One MPI communicator's gcomp side. */
typedef struct ip_comm {
    MPI_Comm comm;
    gcomp_comm *g; /* NULL when creation failed: every call on comm passes through */
    int64_t min_bytes;
    int no_ef; /* error feedback off (GCOMP_EF=0): no keys, as for an exact codec */
    /* the keys given out: buffer mode, one per address (shared: seen with more than one
     * count, a fusion buffer: no error feedback); sequence mode, one per (address, count,
     * control context) */
    struct seen {
        const void *buf;  /* the receive buffer */
        const void *send; /* the send buffer, NULL for MPI_IN_PLACE */
        size_t count;
        uint64_t context;
        int shared;
        int uses;  /* calls on it: 0, 1, or 2 for more */
        int keyed; /* has a residual key (see MAX_ONCE) */
    } * seen;
    size_t n_seen, cap_seen;
    size_t n_once;   /* keyed entries with one call so far (MAX_ONCE) */
    int repeated;    /* an entry has had a second call */
    uint64_t recent; /* since then, one bit per call: on a new entry (CHURN_NEW) */
    int churn;       /* addresses keep changing: no new keys (CHURN_NEW) */
    int warned_churn;
    int warned_full, warned_contexts;
    /* sequence mode: the run of control calls that leads to the next compressed call */
    uint64_t run_hash;  /* their results, hashed */
    uint64_t run_sig;   /* call, datatype, op and count of the call that opened the run */
    uint64_t run_calls; /* control calls in the run (0: none yet on this communicator) */
    uint64_t since;     /* compressed calls since the run's last control call */
    float *copy;        /* the aligned copy of misaligned buffers, kept for the next call */
    size_t copy_cap;    /* its floats */
    struct ip_comm *prev, *next;
} ip_comm;

/* Process-wide state. The counters are atomics because a MPI_THREAD_MULTIPLE program may
 * reduce on several communicators from several threads; each communicator's own state is
 * only touched by its (necessarily serialised) collective calls. */
static struct {
    pthread_mutex_t lock; /* setup, the list of communicators */
    int ready;            /* keyvals created, finalize hook set */
    int finalizing;
    int enabled, debug;
    int exact;  /* the codec keeps no residual (ip_codec_exact): no keys */
    int ef_key;      /* EF_KEY_BUFFER or EF_KEY_SEQUENCE */
    int bad_setting; /* GCOMP_INTERPOSE_EF_KEY was refused: no communicator compresses */
    int test_no_state; /* GCOMP_TEST_INTERPOSE_NO_STATE (tests only): act as if out of memory */
    int test_no_attr;  /* GCOMP_TEST_INTERPOSE_NO_ATTR (tests only): act as if MPI_Comm_set_attr failed */
    const char *stats_file;
    int comm_keyval, self_keyval;
    ip_comm *live;
    uint64_t compressed, passed[PASS_REASONS], no_ef_calls;
    uint64_t failed;                     /* compressed calls that returned an error (to an MPI_ERRORS_RETURN caller) */
    uint64_t ef_keys;                    /* residual keys given out by communicators already destroyed */
    uint64_t comms_created, comms_freed; /* gcomp communicators; freed: by MPI_Comm_free */
    /* stats of gcomp communicators already destroyed */
    uint64_t raw_bytes, wire_bytes, baseline_bytes;
    char codec[512]; /* GCOMP_CODEC as given: a spec has at most 511 characters (gcomp.h) */
} S = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* Calls that gcomp itself makes to MPI pass straight through. */
static _Thread_local int inside_gcomp;

static int world_rank(void)
{
    int r = 0;
    PMPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

static void add_stats(const gcomp_comm *g)
{
    gcomp_comm_stats st;
    if (!g || gcomp_comm_stats_get(g, &st) != GCOMP_SUCCESS) return;
    S.raw_bytes += st.raw_bytes;
    S.wire_bytes += st.wire_bytes;
    S.baseline_bytes += st.baseline_bytes;
}

/* The state of every communicator this rank had no memory to track: it passes through here,
 * as on every rank (agree_settings). Never linked, never freed. */
static ip_comm no_state;

static int comm_delete(MPI_Comm comm, int keyval, void *val, void *extra)
{
    ip_comm *c = val;
    (void)comm, (void)keyval, (void)extra;
    if (c == &no_state) return MPI_SUCCESS;
    pthread_mutex_lock(&S.lock);
    if (c->prev)
        c->prev->next = c->next;
    else
        S.live = c->next;
    if (c->next) c->next->prev = c->prev;
    add_stats(c->g);
    for (size_t i = 0; i < c->n_seen; i++) S.ef_keys += c->seen[i].keyed && !c->seen[i].shared;
    if (c->g && !S.finalizing) S.comms_freed++;
    pthread_mutex_unlock(&S.lock);
    inside_gcomp++;
    gcomp_comm_destroy(c->g);
    inside_gcomp--;
    free(c->seen);
    free(c->copy);
    free(c);
    return MPI_SUCCESS;
}

/* How residuals are keyed on this rank; "refused" when its GCOMP_INTERPOSE_EF_KEY was refused
 * (nothing is compressed, so nothing is keyed). */
static const char *ef_key_name(void)
{
    if (S.bad_setting) return "refused";
    return S.ef_key == EF_KEY_SEQUENCE ? "sequence" : "buffer";
}

static void summary_line(char *out, size_t cap)
{
    uint64_t passed = ip_sum(S.passed, PASS_REASONS);
    snprintf(out, cap,
             "gcomp_mpi: rank %d: codec %s, MPI_Allreduce calls: %" PRIu64 " compressed (%" PRIu64
             " without error feedback), %" PRIu64 " failed, %" PRIu64 " passed through (disabled %" PRIu64
             ", datatype %" PRIu64 ", op %" PRIu64 ", communicator %" PRIu64 ", small %" PRIu64 ", aliased %" PRIu64
             "); %" PRIu64 " bytes sent instead of %" PRIu64 " (%" PRId64 " saved); %" PRIu64 " residual keys (by %s)",
             world_rank(), S.enabled ? S.codec : "(off)", S.compressed, S.no_ef_calls, S.failed, passed,
             S.passed[PASS_DISABLED], S.passed[PASS_TYPE], S.passed[PASS_OP], S.passed[PASS_COMM], S.passed[PASS_SMALL],
             S.passed[PASS_ALIASED], S.wire_bytes, S.baseline_bytes, (int64_t)(S.baseline_bytes - S.wire_bytes),
             S.ef_keys, ef_key_name());
}

static void write_stats_file(void)
{
    int rank = world_rank(), size = 0;
    FILE *f;
    PMPI_Comm_size(MPI_COMM_WORLD, &size);
    if (!(f = ip_open_stats_file("gcomp_mpi", S.stats_file, rank))) return;
    fprintf(f, "{\"rank\": %d, \"size\": %d, \"codec\": \"", rank, size);
    ip_json_string(f, S.enabled ? S.codec : "");
    fputs("\", ", f);
    ip_json_calls(f, S.compressed, S.no_ef_calls, S.failed, S.passed, pass_names, PASS_REASONS);
    fprintf(f,
            ", \"raw_bytes\": %" PRIu64 ", \"wire_bytes\": %" PRIu64 ", \"baseline_bytes\": %" PRIu64
            ", \"bytes_saved\": %" PRId64 ", \"communicators\": %" PRIu64
            ", \"communicators_freed_before_finalize\": %" PRIu64 ", \"ef_key\": \"%s\", \"residual_keys\": %" PRIu64
            "}\n",
            S.raw_bytes, S.wire_bytes, S.baseline_bytes, (int64_t)(S.baseline_bytes - S.wire_bytes), S.comms_created,
            S.comms_freed, ef_key_name(), S.ef_keys);
    fclose(f);
}

/* MPI_Finalize deletes MPI_COMM_SELF's attributes first, with MPI still working: free every
 * gcomp communicator left, then report. */
static int self_delete(MPI_Comm comm, int keyval, void *val, void *extra)
{
    char line[1024];
    (void)comm, (void)keyval, (void)val, (void)extra;
    S.finalizing = 1;
    while (S.live) {
        ip_comm *c = S.live;
        /* the callback unlinks and frees it; call it by hand if MPI would not */
        if (PMPI_Comm_delete_attr(c->comm, S.comm_keyval) != MPI_SUCCESS || S.live == c)
            comm_delete(MPI_COMM_NULL, 0, c, NULL);
    }
    if (S.debug) {
        summary_line(line, sizeof line);
        fprintf(stderr, "%s\n", line);
    }
    if (S.stats_file && *S.stats_file) write_stats_file();
    /* MPI frees a keyval still in use (this one) when its last attribute goes */
    if (S.comm_keyval != MPI_KEYVAL_INVALID) PMPI_Comm_free_keyval(&S.comm_keyval);
    PMPI_Comm_free_keyval(&S.self_keyval);
    return MPI_SUCCESS;
}

/* GCOMP_INTERPOSE_EF_KEY: "buffer" (or unset, empty) or "sequence"; -1 for anything else. */
static int ef_key_mode(const char *v)
{
    if (!v || !*v || strcmp(v, "buffer") == 0) return EF_KEY_BUFFER;
    if (strcmp(v, "sequence") == 0) return EF_KEY_SEQUENCE;
    return -1;
}

/* Read the environment and hook MPI_Finalize, once MPI is up. */
static int setup(void)
{
    int init = 0, fin = 0;
    if (__atomic_load_n(&S.ready, __ATOMIC_ACQUIRE)) return 1;
    if (PMPI_Initialized(&init) != MPI_SUCCESS || !init || PMPI_Finalized(&fin) != MPI_SUCCESS || fin) return 0;
    pthread_mutex_lock(&S.lock);
    if (!S.ready) {
        S.enabled = ip_env_codec(S.codec, sizeof S.codec);
        S.exact = S.enabled && ip_codec_exact(S.codec);
        S.debug = ip_env_debug();
        S.stats_file = getenv("GCOMP_STATS_FILE");
        S.ef_key = ef_key_mode(getenv("GCOMP_INTERPOSE_EF_KEY"));
        S.test_no_state = ip_env_on("GCOMP_TEST_INTERPOSE_NO_STATE");
        S.test_no_attr = ip_env_on("GCOMP_TEST_INTERPOSE_NO_ATTR");
        if (S.enabled && S.ef_key < 0) {
            /* as for a bad GCOMP_* value at communicator creation: this rank says why, and no
             * communicator compresses. The rank stays enabled so that it still joins each
             * communicator's creation and its check (agree_settings), where the others learn it:
             * a rank that alone went straight to PMPI_Allreduce would leave them waiting */
            fprintf(stderr,
                    "gcomp_mpi: rank %d: GCOMP_INTERPOSE_EF_KEY='%s' is neither 'buffer' nor 'sequence': "
                    "no compression\n",
                    world_rank(), getenv("GCOMP_INTERPOSE_EF_KEY"));
            S.bad_setting = 1;
            S.ef_key = EF_KEY_BUFFER;
        }
        /* without it no communicator's state can be kept: comm_state ends the job (lost_track) */
        if (PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, comm_delete, &S.comm_keyval, NULL) != MPI_SUCCESS)
            S.comm_keyval = MPI_KEYVAL_INVALID;
        PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, self_delete, &S.self_keyval, NULL);
        PMPI_Comm_set_attr(MPI_COMM_SELF, S.self_keyval, NULL);
        __atomic_store_n(&S.ready, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&S.lock);
    return 1;
}

/* Ranks with different GCOMP_MIN_BYTES would take different branches for the same call (one
 * compressing, one in PMPI_Allreduce) and hang: check once, at creation, and compress nothing
 * on this communicator if they differ, if any rank has a setting of the interposer's own that
 * it refused (S.bad_setting), or if any rank has no memory for its state (no_memory). gcomp
 * itself already refuses different codecs. */
static void agree_settings(ip_comm *c, int no_memory)
{
    long long mine[4] = { c->min_bytes, -c->min_bytes, S.bad_setting, no_memory }, all[4] = { 0, 0, 0, 0 };
    int rc = PMPI_Allreduce(mine, all, 4, MPI_LONG_LONG, MPI_MAX, c->comm);
    if (rc != MPI_SUCCESS || all[0] != -all[1] || all[2] || all[3]) {
        if (rc != MPI_SUCCESS)
            fprintf(stderr, "gcomp_mpi: rank %d: the settings check failed (MPI error %d): no compression on this "
                            "communicator\n",
                    world_rank(), rc);
        else if (all[2])
            fprintf(stderr,
                    "gcomp_mpi: rank %d: a rank refused its GCOMP_INTERPOSE_EF_KEY: no compression on this "
                    "communicator\n",
                    world_rank());
        else if (all[3])
            fprintf(stderr,
                    "gcomp_mpi: rank %d: a rank had no memory for the communicator's state: no compression "
                    "on this communicator\n",
                    world_rank());
        else
            fprintf(stderr,
                    "gcomp_mpi: rank %d: ranks differ in GCOMP_MIN_BYTES (this rank %lld, %lld..%lld): "
                    "no compression on this communicator\n",
                    world_rank(), (long long)c->min_bytes, -all[1], all[0]);
        gcomp_comm_destroy(c->g);
        c->g = NULL;
    }
}

/* This rank cannot read or keep its record of comm (the attribute): never returns. Without the
 * record, its next call on comm would take comm for new and enter gcomp's collective creation
 * alone while the others, who have theirs, compress or pass through: a hang. No other record is
 * safe: one kept here by handle outlives an MPI_Comm_free (seen only through the attribute's
 * delete callback), so a later communicator that MPI gives the same handle would pass through
 * on this rank alone; and making every rank forget comm instead takes another collective, and
 * an attribute delete, that can fail the same way. MPI_Comm_get_attr/set_attr fail only when
 * MPI itself is out of memory or its keyval is gone: end the job, with the reason, as MPI's
 * default error handler would. */
static void lost_track(MPI_Comm comm, const char *what, int rc)
{
    fprintf(stderr,
            "gcomp_mpi: rank %d: %s failed (MPI error %d): this rank cannot keep track of the communicator's "
            "gcomp state, and its next MPI_Allreduce on it would wait for the other ranks forever: aborting\n",
            world_rank(), what, rc);
    PMPI_Abort(comm, MPI_ERR_OTHER);
}

/* Communicators being freed on this thread (MPI_Comm_free, MPI_Comm_disconnect, Fortran's
 * MPI_COMM_FREE). Their delete callbacks run inside the free in an order MPI does not fix, so
 * a program's callback may reduce on the communicator after ours destroyed its gcomp state:
 * such a call passes through (every rank frees, so every rank sees it so), where a new state
 * would be created collectively on a dying communicator and its attribute outlive the handle
 * (MPI_Finalize then aborted on it). Nested frees (a callback that frees) are a stack. */
enum {
    MAX_FREEING = 8
};
static _Thread_local MPI_Comm freeing[MAX_FREEING];
static _Thread_local int n_freeing;

static int being_freed(MPI_Comm comm)
{
    for (int i = 0; i < n_freeing && i < MAX_FREEING; i++)
        if (freeing[i] == comm) return 1;
    return 0;
}

static void free_begin(MPI_Comm comm)
{
    if (n_freeing < MAX_FREEING) freeing[n_freeing] = comm;
    n_freeing++;
}

static void free_end(void) { n_freeing--; }

/* The gcomp communicator of comm, created at its first compressible call (collective). A rank
 * without memory for the state still joins the creation and the settings check, which the
 * other ranks wait in, and there makes every rank pass the communicator through. */
static ip_comm *comm_state(MPI_Comm comm)
{
    ip_comm *c = NULL, scratch;
    int flag = 0, no_memory, rc;
    gcomp_config cfg = gcomp_config_default(), got;
    if (S.comm_keyval == MPI_KEYVAL_INVALID) lost_track(comm, "MPI_Comm_create_keyval (at setup)", MPI_ERR_KEYVAL);
    if ((rc = PMPI_Comm_get_attr(comm, S.comm_keyval, &c, &flag)) != MPI_SUCCESS)
        lost_track(comm, "MPI_Comm_get_attr", rc);
    if (flag) return c;
    if (being_freed(comm)) return &no_state; /* its state is gone already: pass through */
    c = S.test_no_state ? NULL : calloc(1, sizeof *c);
    no_memory = !c;
    if (no_memory) c = memset(&scratch, 0, sizeof scratch);
    c->comm = comm;
    cfg.debug = S.debug; /* ours is any value but "0"; gcomp's own takes 0, 1, NONE, INFO */
    cfg.timeout_ms = ip_timeout_ms();
    inside_gcomp++;
    if (gcomp_comm_create_mpi(comm, &cfg, &c->g) != GCOMP_SUCCESS) {
        /* the creation agrees across ranks: every rank lands here and passes through */
        fprintf(stderr, "gcomp_mpi: rank %d: no compression on this communicator: %s\n", world_rank(),
                gcomp_last_error());
        c->g = NULL;
    } else if (gcomp_comm_config_get(c->g, &got) == GCOMP_SUCCESS) {
        c->min_bytes = got.min_bytes;
        c->no_ef = !got.error_feedback;
        agree_settings(c, no_memory);
    }
    inside_gcomp--;
    if (no_memory) { /* agree_settings destroyed the gcomp communicator, if any */
        rc = S.test_no_attr ? MPI_ERR_OTHER : PMPI_Comm_set_attr(comm, S.comm_keyval, &no_state);
        if (rc != MPI_SUCCESS) lost_track(comm, "MPI_Comm_set_attr", rc);
        return &no_state;
    }
    pthread_mutex_lock(&S.lock);
    if (c->g) S.comms_created++;
    c->next = S.live;
    if (S.live) S.live->prev = c;
    S.live = c;
    pthread_mutex_unlock(&S.lock);
    rc = S.test_no_attr ? MPI_ERR_OTHER : PMPI_Comm_set_attr(comm, S.comm_keyval, c);
    if (rc != MPI_SUCCESS) lost_track(comm, "MPI_Comm_set_attr", rc);
    return c;
}

/* splitmix64's finaliser: keys and contexts from addresses, counts and hashes. */
static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* FNV-1a over at most CONTROL_HASH_BYTES of p, continuing h. */
static uint64_t hash_bytes(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    if (n > CONTROL_HASH_BYTES) n = CONTROL_HASH_BYTES;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* The entry for (send, buf, n, context) in c's table, added if new; NULL when the table is
 * full (or in sequence mode, when the buffers already have MAX_CONTEXTS contexts). Buffer
 * mode looks up the addresses alone (context is 0): the entry remembers the first count.
 * send is NULL for MPI_IN_PLACE. */
static struct seen *seen_entry(ip_comm *c, const void *send, const void *buf, size_t n, uint64_t context)
{
    size_t contexts = 0;
    for (size_t i = 0; i < c->n_seen; i++) {
        struct seen *e = &c->seen[i];
        if (e->buf != buf || e->send != send) continue;
        if (S.ef_key == EF_KEY_BUFFER || (e->count == n && e->context == context)) return e;
        contexts++;
    }
    if (contexts >= MAX_CONTEXTS) {
        /* a program that reduces with no control calls in between sees a new context at
         * every call: bound what it costs */
        if (S.debug && !c->warned_contexts)
            fprintf(stderr,
                    "gcomp_mpi: rank %d: buffer %p reduced in more than %d control contexts: new ones get no "
                    "error feedback (GCOMP_INTERPOSE_EF_KEY=sequence expects control collectives before each "
                    "round of reductions, as Horovod's)\n",
                    world_rank(), buf, MAX_CONTEXTS);
        c->warned_contexts = 1;
        return NULL;
    }
    /* a trainer that reallocates its gradients every step shows new addresses forever:
     * bound the residuals kept (each is as large as its buffer) */
    if (c->n_seen == MAX_BUFFERS) {
        if (S.debug && !c->warned_full)
            fprintf(stderr,
                    "gcomp_mpi: rank %d: more than %d residual keys on one communicator: new ones get no error "
                    "feedback\n",
                    world_rank(), MAX_BUFFERS);
        c->warned_full = 1;
        return NULL;
    }
    struct seen *p = ip_room_for_one(c->seen, &c->cap_seen, c->n_seen, sizeof *p);
    if (!p) return NULL;
    c->seen = p;
    /* sequence mode keys every entry (MAX_CONTEXTS bounds them); buffer mode: count_use */
    c->seen[c->n_seen] = (struct seen){ buf, send, n, context, 0, 0, S.ef_key != EF_KEY_BUFFER };
    return &c->seen[c->n_seen++];
}

/* Whether CHURN_NEW of the last 64 calls since the first repeated address were on new
 * addresses; fresh: this call's entry is new. Not latched: a program that added buffers in
 * a burst (a warm-up call, then its first round) stops churning once its calls repeat. */
static int churning(ip_comm *c, int fresh)
{
    int was = c->churn;
    if (!c->repeated) return 0;
    c->recent = c->recent << 1 | (uint64_t)fresh;
    c->churn = __builtin_popcountll(c->recent) >= CHURN_NEW;
    if (c->churn && !was && S.debug && !c->warned_churn)
        fprintf(stderr,
                "gcomp_mpi: rank %d: %d of the last 64 calls on one communicator were on new buffer addresses "
                "(new arrays every step?): no new residual keys on it while that lasts (keep the buffers, or "
                "see GCOMP_INTERPOSE_EF_KEY=sequence)\n",
                world_rank(), CHURN_NEW);
    c->warned_churn |= c->churn;
    return c->churn;
}

/* One more call on entry s: its first is keyed while fewer than MAX_ONCE keyed entries have
 * had one call only; a later one while the communicator's addresses do not churn. */
static void count_use(ip_comm *c, struct seen *s)
{
    int churn = churning(c, s->uses == 0);
    if (s->uses == 0) {
        s->keyed = !churn && c->n_once < MAX_ONCE;
        c->n_once += (size_t)s->keyed;
    } else {
        if (s->uses == 1) {
            c->repeated = 1;
            if (s->keyed) c->n_once--;
        }
        s->keyed = s->keyed || !churn;
    }
    if (s->uses < 2) s->uses++;
}

/* The residual key of a compressed call, or GCOMP_KEY_NONE for no error feedback (a buffer
 * whose count has changed in buffer mode, a full table). send is NULL for MPI_IN_PLACE. In
 * sequence mode the context is the control run before the call and the call's place after
 * it (its index among the compressed calls since the run's last control call: two fused
 * calls of one Horovod cycle differ by it). */
static uint64_t residual_key(ip_comm *c, const void *send, const void *buf, size_t n)
{
    uint64_t context = 0, k;
    struct seen *s;
    if (S.exact || c->no_ef) return GCOMP_KEY_NONE; /* nothing to keep: no key, no table entry */
    /* no control call seen yet on this communicator: nothing to key by but the buffer */
    if (S.ef_key == EF_KEY_SEQUENCE && c->run_calls) context = mix64(c->run_hash ^ mix64(c->since + 1));
    s = seen_entry(c, send, buf, n, context);
    if (!s) return GCOMP_KEY_NONE;
    if (S.ef_key == EF_KEY_BUFFER) count_use(c, s);
    if (!s->keyed) return GCOMP_KEY_NONE;
    if (!s->shared && s->count != n) {
        s->shared = 1;
        if (S.debug)
            fprintf(stderr,
                    "gcomp_mpi: rank %d: buffer %p reduced with %zu then %zu floats (a fusion buffer?): "
                    "no error feedback for it from now on (GCOMP_INTERPOSE_EF_KEY=sequence keys it by "
                    "control context instead, see docs/INTERPOSE.md)\n",
                    world_rank(), buf, s->count, n);
    }
    if (s->shared) return GCOMP_KEY_NONE;
    k = mix64((uint64_t)(uintptr_t)buf) ^ mix64(n * 0x9e3779b97f4a7c15ull + context) ^
        mix64(~(uint64_t)(uintptr_t)send);
    return k == GCOMP_KEY_NONE ? 0 : k;
}

/* Integer datatypes: what a program's control collectives (flags, bit vectors, counts,
 * serialised messages) are made of. Float reductions are data, not control. */
static int is_control_type(MPI_Datatype t)
{
    const MPI_Datatype ints[] = { MPI_CHAR,    MPI_SIGNED_CHAR,    MPI_UNSIGNED_CHAR, MPI_BYTE,
                                  MPI_SHORT,   MPI_UNSIGNED_SHORT, MPI_INT,           MPI_UNSIGNED,
                                  MPI_LONG,    MPI_UNSIGNED_LONG,  MPI_LONG_LONG,     MPI_UNSIGNED_LONG_LONG,
                                  MPI_INT8_T,  MPI_INT16_T,        MPI_INT32_T,       MPI_INT64_T,
                                  MPI_UINT8_T, MPI_UINT16_T,       MPI_UINT32_T,      MPI_UINT64_T,
                                  MPI_C_BOOL };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (t == ints[i]) return 1;
    return 0;
}

enum {
    CONTROL_ALLREDUCE = 1,
    CONTROL_BCAST = 2
};

/* Sequence mode: fold the result of a control collective that MPI has just completed on
 * comm into the communicator's control run. Only communicators that already have a gcomp
 * communicator are followed (the lookup creates nothing; a program's control calls before
 * its first compressed call do not matter). A control call after a compressed call, or one
 * of the same kind, datatype, op and count as the run's first, starts a new run: so a run is
 * "the calls of one coordination round", and an idle round repeated N times counts once. */
static void observe_control(MPI_Comm comm, int kind, const void *buf, int n, MPI_Datatype type, MPI_Op op)
{
    ip_comm *c = NULL;
    int flag = 0, size = 0;
    uint64_t sig;
    if (inside_gcomp || !S.enabled || S.ef_key != EF_KEY_SEQUENCE || n < 0 || comm == MPI_COMM_NULL ||
        __atomic_load_n(&S.finalizing, __ATOMIC_ACQUIRE) || !is_control_type(type))
        return;
    if (S.comm_keyval == MPI_KEYVAL_INVALID || PMPI_Comm_get_attr(comm, S.comm_keyval, &c, &flag) != MPI_SUCCESS ||
        !flag || !c || !c->g)
        return;
    if (PMPI_Type_size(type, &size) != MPI_SUCCESS) return;
    sig = mix64((uint64_t)kind ^ mix64((uint64_t)(uintptr_t)type) ^ mix64((uint64_t)(uintptr_t)op + 1) ^
                mix64((uint64_t)n + 2));
    if (c->since > 0 || c->run_calls == 0 || sig == c->run_sig) {
        c->run_hash = 0xcbf29ce484222325ull; /* FNV offset basis */
        c->run_sig = sig;
        c->run_calls = 0;
    }
    c->run_hash = hash_bytes(c->run_hash ^ sig, buf, (size_t)n * (size_t)size);
    c->run_calls++;
    c->since = 0;
}

static int is_float(MPI_Datatype type)
{
    int size = 0;
    if (type != MPI_FLOAT && type != MPI_REAL && type != MPI_REAL4) return 0;
    return PMPI_Type_size(type, &size) == MPI_SUCCESS && size == 4;
}

/* Which reason sends this call to MPI, or -1 to compress it; sets *out for compression.
 * aliased: the send buffer is the receive buffer and not MPI_IN_PLACE (counted as such only
 * with data: MPI_Allreduce(NULL, NULL, 0, ...) is a common, harmless empty call). */
static int classify(int n, MPI_Datatype type, MPI_Op op, MPI_Comm comm, int aliased, ip_comm **out)
{
    int inter = 0, size = 0;
    if (inside_gcomp || __atomic_load_n(&S.finalizing, __ATOMIC_ACQUIRE) || !setup() || !S.enabled)
        return PASS_DISABLED;
    if (aliased && n > 0) return PASS_ALIASED;
    if (!is_float(type)) return PASS_TYPE;
    if (op != MPI_SUM) return PASS_OP;
    if (comm == MPI_COMM_NULL || PMPI_Comm_test_inter(comm, &inter) != MPI_SUCCESS || inter) return PASS_COMM;
    if (PMPI_Comm_size(comm, &size) != MPI_SUCCESS || size < 2) return PASS_COMM;
    if (n <= 0) return PASS_SMALL;
    *out = comm_state(comm);
    if (!*out || !(*out)->g) return PASS_COMM;
    if ((int64_t)n * 4 < (*out)->min_bytes) return PASS_SMALL;
    return -1;
}

/* c's aligned copy of at least n floats, grown as needed and kept for the next call (a
 * program that reduces a misaligned buffer does so every step); NULL without memory. */
static float *aligned_copy(ip_comm *c, size_t n)
{
    if (n > c->copy_cap) {
        free(c->copy);
        c->copy = malloc(n * sizeof(float));
        c->copy_cap = c->copy ? n : 0;
    }
    return c->copy;
}

static int compressed_allreduce(ip_comm *c, const void *send, void *recv, int n)
{
    uint64_t key = residual_key(c, send == MPI_IN_PLACE ? NULL : send, recv, (size_t)n);
    gcomp_result rc;
    if (S.debug)
        fprintf(stderr,
                "gcomp_mpi: rank %d: MPI_Allreduce %p %d floats: key %016" PRIx64 " (control run %016" PRIx64
                " of %" PRIu64 " calls, #%" PRIu64 " after it)\n",
                world_rank(), recv, n, key, c->run_hash, c->run_calls, c->since);
    c->since++;
    if (send == MPI_IN_PLACE) send = recv;
    inside_gcomp++;
    if (((uintptr_t)send | (uintptr_t)recv) % sizeof(float) == 0) {
        rc = gcomp_allreduce(c->g, send, recv, (size_t)n, GCOMP_F32, GCOMP_SUM, key, NULL);
    } else {
        /* MPI takes floats at any address, gcomp only aligned ones: reduce an aligned copy
         * (same key). Without memory for it, NULL buffers make gcomp report the failure on
         * every rank instead of leaving the others waiting. */
        float *tmp = aligned_copy(c, (size_t)n);
        if (tmp) memcpy(tmp, send, (size_t)n * sizeof(float));
        rc = gcomp_allreduce(c->g, tmp, tmp, (size_t)n, GCOMP_F32, GCOMP_SUM, key, NULL);
        if (rc == GCOMP_SUCCESS) memcpy(recv, tmp, (size_t)n * sizeof(float));
    }
    inside_gcomp--;
    if (rc == GCOMP_SUCCESS) {
        ip_bump(&S.compressed);
        if (key == GCOMP_KEY_NONE) ip_bump(&S.no_ef_calls);
        return MPI_SUCCESS;
    }
    /* gcomp reports a failure on every rank: hand it to the communicator's error handler,
     * as MPI would (the default handler aborts the job; MPI_ERRORS_RETURN goes on, and the
     * summary counts the call as failed) */
    ip_bump(&S.failed);
    fprintf(stderr, "gcomp_mpi: rank %d: compressed MPI_Allreduce of %d floats failed: %s: %s\n", world_rank(), n,
            gcomp_result_name(rc), gcomp_last_error());
    PMPI_Comm_call_errhandler(c->comm, MPI_ERR_OTHER);
    return MPI_ERR_OTHER;
}

/* A definition of MPI_Allreduce ahead of this library's (a PMPI tool earlier in LD_PRELOAD,
 * or one linked into the program) takes every call, and its PMPI_Allreduce goes to MPI past
 * this library: nothing would be compressed, silently. Said once per process, at load, when
 * GCOMP_CODEC asks for compression. (The address of MPI_Allreduce taken here would be the
 * first definition too: this library's own is told by the object it lies in.) */
__attribute__((constructor)) static void warn_if_shadowed(void)
{
    const char *codec = getenv("GCOMP_CODEC");
    void *first;
    Dl_info mine, theirs;
    if (!codec || !*codec) return;
    first = dlsym(RTLD_DEFAULT, "MPI_Allreduce");
    if (!first || !dladdr((void *)warn_if_shadowed, &mine) || !dladdr(first, &theirs) ||
        theirs.dli_fbase == mine.dli_fbase)
        return;
    fprintf(stderr,
            "gcomp_mpi: MPI_Allreduce resolves to %s before %s (a PMPI tool earlier in LD_PRELOAD, or one linked "
            "into the program): no call reaches gcomp and nothing is compressed; list %s first in LD_PRELOAD\n",
            theirs.dli_fname ? theirs.dli_fname : "another object", mine.dli_fname ? mine.dli_fname : "libgcomp_mpi.so",
            mine.dli_fname ? mine.dli_fname : "libgcomp_mpi.so");
}

/* The next definition of an entry point this library defines: a PMPI tool preloaded after
 * this library (it wraps MPI_Finalize, counts MPI_Allreduce, ...) when there is one, else MPI's
 * own, so such a tool still sees every call that passes through (PMPI_* went straight to MPI,
 * past it). Looked up once per entry point (*slot); the profiling entry point pmpi when there is
 * no next one. Two threads resolving at once store the same address. */
static void *next_mpi(void **slot, const char *name, void *pmpi)
{
    void *f = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (!f) {
        f = dlsym(RTLD_NEXT, name);
        if (!f) f = pmpi;
        __atomic_store_n(slot, f, __ATOMIC_RELEASE);
    }
    return f;
}
typedef int allreduce_fn(const void *, void *, int, MPI_Datatype, MPI_Op, MPI_Comm);
typedef int bcast_fn(void *, int, MPI_Datatype, int, MPI_Comm);
typedef int comm_free_fn(MPI_Comm *);
typedef int finalize_fn(void);
static void *next_allreduce, *next_bcast, *next_comm_free, *next_comm_disconnect, *next_finalize;

EXPORT int MPI_Allreduce(const void *sendbuf, void *recvbuf, int count_, MPI_Datatype type, MPI_Op op, MPI_Comm comm)
{
    ip_comm *c = NULL;
    int why = classify(count_, type, op, comm, sendbuf == recvbuf && sendbuf != MPI_IN_PLACE, &c);
    int rc;
    if (why < 0) return compressed_allreduce(c, sendbuf, recvbuf, count_);
    if (!inside_gcomp && S.ready) ip_bump(&S.passed[why]);
    rc = ((allreduce_fn *)next_mpi(&next_allreduce, "MPI_Allreduce", (void *)PMPI_Allreduce))(sendbuf, recvbuf, count_,
                                                                                              type, op, comm);
    if (rc == MPI_SUCCESS && why != PASS_DISABLED && why != PASS_ALIASED)
        observe_control(comm, CONTROL_ALLREDUCE, recvbuf, count_, type, op);
    return rc;
}

/* Passed to MPI untouched; in sequence mode its result is part of the control run. */
EXPORT int MPI_Bcast(void *buf, int count_, MPI_Datatype type, int root, MPI_Comm comm)
{
    int rc = ((bcast_fn *)next_mpi(&next_bcast, "MPI_Bcast", (void *)PMPI_Bcast))(buf, count_, type, root, comm);
    if (rc == MPI_SUCCESS && !inside_gcomp && setup())
        observe_control(comm, CONTROL_BCAST, buf, count_, type, MPI_OP_NULL);
    return rc;
}

/* fn (the next MPI_Comm_free or MPI_Comm_disconnect) with *comm noted as being freed meanwhile */
static int freeing_call(int (*fn)(MPI_Comm *), MPI_Comm *comm)
{
    int rc;
    free_begin(comm ? *comm : MPI_COMM_NULL);
    rc = fn(comm);
    free_end();
    return rc;
}

EXPORT int MPI_Comm_free(MPI_Comm *comm)
{
    return freeing_call((comm_free_fn *)next_mpi(&next_comm_free, "MPI_Comm_free", (void *)PMPI_Comm_free), comm);
}
EXPORT int MPI_Comm_disconnect(MPI_Comm *comm)
{
    return freeing_call(
        (comm_free_fn *)next_mpi(&next_comm_disconnect, "MPI_Comm_disconnect", (void *)PMPI_Comm_disconnect), comm);
}

/* From here on every call passes through: MPI_Finalize deletes attributes first, and a
 * program's MPI_COMM_SELF callback set after ours runs (and may reduce) before ours. (Open
 * MPI's Fortran MPI_FINALIZE goes to PMPI_Finalize directly: there the flag is set by our
 * MPI_COMM_SELF callback, as before.) */
EXPORT int MPI_Finalize(void)
{
    (void)setup(); /* a program that never reduced still gets its summary and stats file */
    __atomic_store_n(&S.finalizing, 1, __ATOMIC_RELEASE);
    return ((finalize_fn *)next_mpi(&next_finalize, "MPI_Finalize", (void *)PMPI_Finalize))();
}

/* ---- Fortran (Open MPI 4.1). mpif.h and `use mpi` call mpi_allreduce_ (and its other
 * spellings), an alias of ompi_allreduce_f, which goes to PMPI_Allreduce directly, past
 * MPI_Allreduce. `use mpi_f08` calls mpi_allreduce_f08_, which calls ompi_allreduce_f too;
 * so does the program's own PMPI_Allreduce (pmpi_allreduce_f08_, pmpi_allreduce_), which
 * must reach MPI untouched: so the language entry points are replaced here, never
 * ompi_allreduce_f. What is not compressed goes to Open MPI's own entry point of the same
 * binding, found behind this library. The f08 handles (TYPE(MPI_Comm) ...) hold one INTEGER
 * and are passed by reference, its buffers (!GCC$ NO_ARG_CHECK) as addresses, and its
 * optional ierror as NULL when absent: the same arguments as the mpif.h entry. ---- */
typedef void fortran_allreduce_fn(char *, char *, MPI_Fint *, MPI_Fint *, MPI_Fint *, MPI_Fint *, MPI_Fint *);

/* Fortran's MPI_IN_PLACE is the address of a common block, under one of these names: looked
 * up at the first Fortran call (the block does not move; a call's path should not pay
 * dlsym). Two threads resolving at once store the same addresses. */
static int fortran_in_place(const void *p)
{
    static const char *const names[] = { "mpi_fortran_in_place_", "mpi_fortran_in_place", "mpi_fortran_in_place__",
                                         "MPI_FORTRAN_IN_PLACE" };
    enum { N_NAMES = sizeof names / sizeof names[0] };
    static void *addr[N_NAMES];
    static int resolved;
    if (!__atomic_load_n(&resolved, __ATOMIC_ACQUIRE)) {
        for (size_t i = 0; i < N_NAMES; i++) __atomic_store_n(&addr[i], dlsym(RTLD_DEFAULT, names[i]), __ATOMIC_RELAXED);
        __atomic_store_n(&resolved, 1, __ATOMIC_RELEASE);
    }
    for (size_t i = 0; i < N_NAMES; i++)
        if (p && __atomic_load_n(&addr[i], __ATOMIC_RELAXED) == p) return 1;
    return 0;
}

/* Open MPI's own entry point `name`, found behind this library (looked up once per entry
 * point: *slot); NULL, with a message, when it is missing. */
static void *fortran_real(void **slot, const char *name, const char *what)
{
    void *f = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (!f) {
        f = dlsym(RTLD_NEXT, name);
        __atomic_store_n(slot, f, __ATOMIC_RELEASE);
    }
    if (!f) fprintf(stderr, "gcomp_mpi: Open MPI's Fortran %s (%s) not found\n", what, name);
    return f;
}

/* Open MPI's own binding for a call that passes through. */
static void fortran_pass(void **real, const char *name, char *send, char *recv, MPI_Fint *n, MPI_Fint *type,
                         MPI_Fint *op, MPI_Fint *comm, MPI_Fint *ierr)
{
    fortran_allreduce_fn *f = (fortran_allreduce_fn *)fortran_real(real, name, "MPI_Allreduce");
    if (!f) {
        if (ierr) *ierr = MPI_ERR_INTERN;
        return;
    }
    f(send, recv, n, type, op, comm, ierr);
}

static void fortran_allreduce(void **real, const char *name, char *send, char *recv, MPI_Fint *n, MPI_Fint *type,
                              MPI_Fint *op, MPI_Fint *comm, MPI_Fint *ierr)
{
    MPI_Comm c_comm = PMPI_Comm_f2c(*comm);
    ip_comm *c = NULL;
    int in_place = fortran_in_place(send);
    int why = classify((int)*n, PMPI_Type_f2c(*type), PMPI_Op_f2c(*op), c_comm, send == recv && !in_place, &c);
    if (why < 0) {
        int rc = compressed_allreduce(c, in_place ? MPI_IN_PLACE : send, recv, (int)*n);
        if (ierr) *ierr = (MPI_Fint)rc;
        return;
    }
    if (!inside_gcomp && S.ready) ip_bump(&S.passed[why]);
    fortran_pass(real, name, send, recv, n, type, op, comm, ierr);
}

/* name: the entry point defined here; real: Open MPI's, that calls which pass through go to */
#define FORTRAN_ENTRY(name, real)                                                                       \
    EXPORT void name(char *s, char *r, MPI_Fint *n, MPI_Fint *t, MPI_Fint *o, MPI_Fint *c, MPI_Fint *e) \
    {                                                                                                   \
        static void *fn;                                                                                \
        fortran_allreduce(&fn, #real, s, r, n, t, o, c, e);                                             \
    }
FORTRAN_ENTRY(mpi_allreduce_, ompi_allreduce_f)
FORTRAN_ENTRY(mpi_allreduce, ompi_allreduce_f)
FORTRAN_ENTRY(mpi_allreduce__, ompi_allreduce_f)
FORTRAN_ENTRY(MPI_ALLREDUCE, ompi_allreduce_f)
FORTRAN_ENTRY(mpi_allreduce_f08_, mpi_allreduce_f08_)

/* MPI_COMM_FREE goes to PMPI_Comm_free directly too: its entry points are replaced so that
 * a program's delete callbacks that reduce on the communicator being freed pass through (see
 * being_freed), as from C. */
typedef void fortran_comm_free_fn(MPI_Fint *, MPI_Fint *);

static void fortran_comm_free(void **real, const char *name, MPI_Fint *comm, MPI_Fint *ierr)
{
    fortran_comm_free_fn *f = (fortran_comm_free_fn *)fortran_real(real, name, "MPI_Comm_free");
    if (!f) {
        if (ierr) *ierr = MPI_ERR_INTERN;
        return;
    }
    free_begin(PMPI_Comm_f2c(*comm));
    f(comm, ierr);
    free_end();
}

#define FORTRAN_FREE_ENTRY(name, real)         \
    EXPORT void name(MPI_Fint *c, MPI_Fint *e) \
    {                                          \
        static void *fn;                       \
        fortran_comm_free(&fn, #real, c, e);   \
    }
FORTRAN_FREE_ENTRY(mpi_comm_free_, ompi_comm_free_f)
FORTRAN_FREE_ENTRY(mpi_comm_free, ompi_comm_free_f)
FORTRAN_FREE_ENTRY(mpi_comm_free__, ompi_comm_free_f)
FORTRAN_FREE_ENTRY(MPI_COMM_FREE, ompi_comm_free_f)
FORTRAN_FREE_ENTRY(mpi_comm_free_f08_, mpi_comm_free_f08_)
