/*
 * test_nonblocking.c — gcomp_iallreduce / gcomp_test / gcomp_wait over the loopback
 * transport (2 to 5 ranks as threads, no mpirun), with the progress thread and with
 * progress inside test/wait (the mode a communicator takes over MPI below
 * MPI_THREAD_MULTIPLE): many requests in flight give bit-identical results to the same
 * calls made blocking; a stopped peer gives GCOMP_ERR_TIMEOUT from the wait; a mismatch
 * among requests in flight gives GCOMP_ERR_MISMATCH on every rank, without a hang; residual
 * checkpoints are refused while requests are in flight and change nothing.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <setjmp.h>
#include <stdarg.h>
#include <cmocka.h>

#include "comm.h"
#include "loop_world.h"

#define MAX_RANKS 5
#define N_CALLS 12
#define N_REFUSED 9 /* checkpoint_in_flight: six checkpoint calls, three stats calls */

typedef struct job {
    loop_rank at; /* first: loop_run_world fills it */
    const char *spec;
    int blocking;  /* 1: the same calls with gcomp_allreduce (the reference) */
    int no_thread; /* 1: no progress thread (progress in test/wait) */
    int variant;
    gcomp_result rc[N_CALLS];
    uint64_t hash[N_CALLS];
    int progressed; /* the first request completed while nobody tested or waited */
    int mode;
    char error[160]; /* gcomp_last_error() after the first wait that failed */
    /* V_CHECKPOINT */
    gcomp_result refused[N_REFUSED]; /* the checkpoint and stats calls made while requests were in flight */
    char refusal[200];       /* gcomp_last_error() after the first of them */
    int file_written;        /* the refused save_file wrote its path anyway */
    uint64_t state_hash;     /* the checkpoint after every call */
    gcomp_result reload;     /* a load after every request completed */
    int reload_same;         /* ... gave back exactly the state it loaded */
} job;

enum {
    V_MANY = 0,
    V_TIMEOUT = 1,
    V_MISMATCH = 2,
    V_BAD_OP = 3,    /* call 1 passes an invalid op on every rank */
    V_CHECKPOINT = 4 /* calls 0-5 blocking (a checkpoint after call 2), 6-11 in flight while
                      * the checkpoint calls run */
};

static uint64_t fnv(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* Call i's count and key: a few sizes (the first below min_bytes: bypass), keys reused so
 * error feedback carries over between calls in flight. */
static size_t call_count(int i) { return i % 4 == 0 ? 100 : 3001 + 1000 * (size_t)(i % 3); }
static uint64_t call_key(int i) { return (uint64_t)(i % 6); }

static void fill(float *x, size_t n, int rank, int i)
{
    uint32_t s = 2654435761u * (uint32_t)(rank + 1) + 40503u * (uint32_t)(i + 1);
    for (size_t k = 0; k < n; k++) {
        s = s * 1664525u + 1013904223u;
        x[k] = (float)((int32_t)(s >> 8) - (1 << 23)) * 0x1p-22f;
    }
}

/* A checkpoint of comm in memory (malloc'd, NULL on failure) and its size. */
static uint8_t *checkpoint(gcomp_comm *comm, size_t *bytes)
{
    uint8_t *blob;
    *bytes = 0;
    if (gcomp_comm_residuals_save(comm, NULL, 0, bytes) != GCOMP_SUCCESS || !(blob = malloc(*bytes))) return NULL;
    if (gcomp_comm_residuals_save(comm, blob, *bytes, bytes) == GCOMP_SUCCESS) return blob;
    free(blob);
    return NULL;
}

/* V_CHECKPOINT, with calls 6.. in flight (req): every checkpoint and stats call is refused, the load
 * of `early` (the state after call 2, unlike the current one) included, and writes no file.
 * The first load comes at once; before the others one request is completed (by gcomp_test:
 * the rest stay in flight) and, with a progress thread, another has run but nobody waited
 * for it: neither makes a difference. */
static void checkpoint_in_flight(job *j, gcomp_comm *comm, gcomp_request **req, const uint8_t *early,
                                 size_t early_bytes, const char *early_path, const char *path)
{
    size_t need = 0;
    uint8_t buf[64];
    gcomp_comm_stats st;
    int done = 0;
    gcomp_result rc;
    j->refused[0] = gcomp_comm_residuals_load(comm, early, early_bytes); /* at once: call 6 may be running */
    snprintf(j->refusal, sizeof j->refusal, "%s", gcomp_last_error());
    while ((rc = gcomp_test(&req[6], &done)) == GCOMP_SUCCESS && !done) usleep(1000);
    j->rc[6] = rc;
    for (int t = 0; t < 2000 && !j->no_thread; t++) {
        pthread_mutex_lock(&comm->q.lock);
        done = req[7]->done;
        pthread_mutex_unlock(&comm->q.lock);
        if (done) break;
        usleep(1000);
    }
    j->refused[1] = gcomp_comm_residuals_save(comm, NULL, 0, &need);
    j->refused[2] = gcomp_comm_residuals_save(comm, buf, sizeof buf, &need);
    j->refused[3] = gcomp_comm_residuals_load_file(comm, early_path);
    j->refused[4] = gcomp_comm_residuals_save_file(comm, path);
    j->refused[5] = gcomp_comm_residuals_load(comm, early, early_bytes);
    /* stats are written by the call running: a copy or reset would race with it */
    j->refused[6] = gcomp_comm_stats_get(comm, &st);
    j->refused[7] = gcomp_comm_key_stats_get(comm, call_key(0), &st);
    j->refused[8] = gcomp_comm_stats_reset(comm);
    j->file_written = access(path, F_OK) == 0;
}

/* V_CHECKPOINT after every call: the state's hash, then a load of `early` must work and give
 * back exactly that state. */
static void checkpoint_after(job *j, gcomp_comm *comm, const uint8_t *early, size_t early_bytes)
{
    size_t bytes = 0;
    uint8_t *now = checkpoint(comm, &bytes);
    j->state_hash = now ? fnv(now, bytes) : 0;
    free(now);
    if (j->blocking) return;
    j->reload = gcomp_comm_residuals_load(comm, early, early_bytes);
    now = checkpoint(comm, &bytes);
    j->reload_same = now && bytes == early_bytes && memcmp(now, early, bytes) == 0;
    free(now);
}

static void *run_job(void *arg)
{
    job *j = arg;
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *comm = NULL;
    gcomp_request *req[N_CALLS] = { 0 };
    float *x[N_CALLS], *y[N_CALLS];
    int n_calls = j->variant == V_MANY || j->variant == V_CHECKPOINT ? N_CALLS : 4;
    uint8_t *early = NULL; /* V_CHECKPOINT: the state after call 2 */
    size_t early_bytes = 0;
    char early_path[96], path[96];
    snprintf(early_path, sizeof early_path, "/tmp/gcomp_nb_ckpt_%d_%d_early.bin", (int)getpid(), j->at.rank);
    snprintf(path, sizeof path, "/tmp/gcomp_nb_ckpt_%d_%d_refused.bin", (int)getpid(), j->at.rank);
    cfg.codec = j->spec;
    cfg.min_bytes = 4096;
    cfg.seed = 3;
    cfg.timeout_ms = j->variant == V_TIMEOUT ? 300 : 20000;
    for (int i = 0; i < N_CALLS; i++) {
        x[i] = malloc(call_count(i) * sizeof(float) + 4);
        y[i] = malloc(call_count(i) * sizeof(float) + 4);
        fill(x[i], call_count(i), j->at.rank, i);
        j->rc[i] = GCOMP_ERR_INTERNAL;
    }
    if (gcomp__comm_create_loop(j->at.w, j->at.rank, &cfg, &comm) != GCOMP_SUCCESS) goto out;
    if (j->no_thread) comm->threads_ok = 0;
    if (j->variant == V_TIMEOUT && j->at.rank == j->at.size - 1) usleep(1200 * 1000);
    for (int i = 0; i < n_calls; i++) {
        size_t count = call_count(i);
        gcomp_op op = j->variant == V_BAD_OP && i == 1 ? GCOMP_OP_COUNT : GCOMP_SUM;
        if (j->variant == V_MISMATCH && i == 2 && j->at.rank == 1) count++;
        if (j->blocking || (j->variant == V_CHECKPOINT && i < 6)) {
            j->rc[i] = gcomp_allreduce(comm, x[i], y[i], count, GCOMP_F32, op, call_key(i), NULL);
            if (j->variant == V_CHECKPOINT && i == 2) {
                early = checkpoint(comm, &early_bytes);
                if (gcomp_comm_residuals_save_file(comm, early_path) != GCOMP_SUCCESS) j->rc[i] = GCOMP_ERR_INTERNAL;
            }
        } else if (j->variant == V_MANY && i == 7) {
            /* a blocking call among requests in flight runs after them, in order */
            j->rc[i] = gcomp_allreduce(comm, x[i], y[i], count, GCOMP_F32, GCOMP_SUM, call_key(i), NULL);
        } else {
            j->rc[i] = gcomp_iallreduce(comm, x[i], y[i], count, GCOMP_F32, op, call_key(i), NULL, &req[i]);
            if (j->rc[i] == GCOMP_SUCCESS) j->rc[i] = GCOMP_ERR_INTERNAL; /* until waited */
        }
        if (i == 0 && req[0] && !j->no_thread) {
            /* the caller "computes": with a progress thread the call completes meanwhile */
            for (int t = 0; t < 400 && !j->progressed; t++) {
                pthread_mutex_lock(&comm->q.lock);
                j->progressed = req[0]->done;
                pthread_mutex_unlock(&comm->q.lock);
                usleep(1000);
            }
        }
    }
    j->mode = comm->q.mode;
    if (j->variant == V_CHECKPOINT && !j->blocking)
        checkpoint_in_flight(j, comm, req, early, early_bytes, early_path, path);
    /* complete them: some by gcomp_test polling, the rest by gcomp_wait in reverse order */
    for (int i = 0; i < n_calls; i += 3) {
        int done = 0;
        if (!req[i]) continue;
        while (!done) {
            gcomp_result rc = gcomp_test(&req[i], &done);
            if (done || rc != GCOMP_SUCCESS) j->rc[i] = rc;
            if (rc != GCOMP_SUCCESS) break;
        }
        if (done && req[i]) j->rc[i] = GCOMP_ERR_INTERNAL; /* completed requests are freed */
    }
    for (int i = n_calls - 1; i >= 0; i--) {
        if (!req[i]) continue;
        j->rc[i] = gcomp_wait(&req[i]);
        if (j->rc[i] != GCOMP_SUCCESS && !j->error[0]) snprintf(j->error, sizeof j->error, "%s", gcomp_last_error());
    }
    for (int i = 0; i < n_calls; i++)
        j->hash[i] = j->rc[i] == GCOMP_SUCCESS ? fnv(y[i], call_count(i) * sizeof(float)) : 0;
    if (j->variant == V_CHECKPOINT) checkpoint_after(j, comm, early, early_bytes);
out:
    free(early);
    unlink(early_path);
    unlink(path);
    gcomp_comm_destroy(comm);
    for (int i = 0; i < N_CALLS; i++) {
        free(x[i]);
        free(y[i]);
    }
    return NULL;
}

static void run(int n, const char *spec, int variant, int blocking, int no_thread, job *jobs)
{
    memset(jobs, 0, sizeof(job) * MAX_RANKS);
    for (int r = 0; r < n; r++) {
        jobs[r].spec = spec;
        jobs[r].variant = variant;
        jobs[r].blocking = blocking;
        jobs[r].no_thread = no_thread;
    }
    loop_run_world(n, run_job, jobs, sizeof jobs[0]);
}

static void test_many_in_flight_match_blocking(void **state)
{
    static const char *const specs[] = { "fp16", "terngrad", "topk:ratio=0.01", "topk:ratio=1" };
    (void)state;
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++)
        for (int n = 2; n <= MAX_RANKS; n++) {
            job ref[MAX_RANKS], nb[MAX_RANKS];
            run(n, specs[s], V_MANY, 1, 0, ref);
            for (int no_thread = 0; no_thread <= 1; no_thread++) {
                run(n, specs[s], V_MANY, 0, no_thread, nb);
                for (int r = 0; r < n; r++) {
                    assert_int_equal(nb[r].mode, no_thread ? GCOMP__PROGRESS_CALLER : GCOMP__PROGRESS_THREAD);
                    if (!no_thread) assert_true(nb[r].progressed);
                    for (int i = 0; i < N_CALLS; i++) {
                        assert_int_equal(ref[r].rc[i], GCOMP_SUCCESS);
                        if (nb[r].rc[i] != GCOMP_SUCCESS || nb[r].hash[i] != ref[r].hash[i] ||
                            ref[r].hash[i] != ref[0].hash[i])
                            fail_msg("%s, %d ranks, %s: rank %d call %d: %s, hash %016llx, blocking %016llx", specs[s],
                                     n, no_thread ? "no thread" : "progress thread", r, i,
                                     gcomp_result_name(nb[r].rc[i]), (unsigned long long)nb[r].hash[i],
                                     (unsigned long long)ref[r].hash[i]);
                    }
                }
            }
        }
}

static void test_stopped_peer_times_out(void **state)
{
    job jobs[MAX_RANKS];
    double t0 = gcomp__now();
    (void)state;
    for (int no_thread = 0; no_thread <= 1; no_thread++) {
        run(3, "fp16", V_TIMEOUT, 0, no_thread, jobs);
        for (int r = 0; r < 3; r++) {
            /* the first call times out; the ones queued behind it find the communicator broken */
            if (jobs[r].rc[0] != GCOMP_ERR_TIMEOUT) fail_msg("rank %d: %s", r, gcomp_result_name(jobs[r].rc[0]));
            for (int i = 1; i < 4; i++)
                assert_true(jobs[r].rc[i] == GCOMP_ERR_TIMEOUT || jobs[r].rc[i] == GCOMP_ERR_COMM_INVALID);
        }
    }
    assert_true(gcomp__now() - t0 < 20.0);
}

static void test_mismatch_in_flight(void **state)
{
    (void)state;
    for (int n = 2; n <= MAX_RANKS; n++)
        for (int no_thread = 0; no_thread <= 1; no_thread++) {
            job jobs[MAX_RANKS];
            double t0 = gcomp__now();
            run(n, "terngrad", V_MISMATCH, 0, no_thread, jobs);
            for (int r = 0; r < n; r++)
                for (int i = 0; i < 4; i++)
                    if (jobs[r].rc[i] != (i == 2 ? GCOMP_ERR_MISMATCH : GCOMP_SUCCESS))
                        fail_msg("%d ranks: rank %d call %d returned %s", n, r, i, gcomp_result_name(jobs[r].rc[i]));
            assert_true(gcomp__now() - t0 < 10.0);
        }
}

/* An argument error of a request is reported by its wait, named after gcomp_iallreduce (the
 * call the user made), and the calls around it run. */
static void test_bad_argument_in_flight(void **state)
{
    (void)state;
    for (int no_thread = 0; no_thread <= 1; no_thread++) {
        job jobs[MAX_RANKS];
        run(3, "fp16", V_BAD_OP, 0, no_thread, jobs);
        for (int r = 0; r < 3; r++) {
            for (int i = 0; i < 4; i++)
                if (jobs[r].rc[i] != (i == 1 ? GCOMP_ERR_INVALID_ARG : GCOMP_SUCCESS))
                    fail_msg("rank %d call %d returned %s", r, i, gcomp_result_name(jobs[r].rc[i]));
            if (strncmp(jobs[r].error, "gcomp_iallreduce: invalid op", 28) != 0)
                fail_msg("rank %d: \"%s\"", r, jobs[r].error);
        }
    }
}

/* Checkpoint and stats calls while requests are in flight (a load used to free the residuals the
 * progress thread was encoding with, or without a thread to apply before the queued calls):
 * refused with GCOMP_ERR_INVALID_ARG, the requests' results and the state after them are the
 * blocking run's bit for bit, and once every request is completed a load works. */
static void test_checkpoint_while_in_flight(void **state)
{
    static const char *const specs[] = { "fp16", "terngrad", "topk:ratio=0.01" };
    (void)state;
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++)
        for (int n = 2; n <= MAX_RANKS; n += 3) {
            job ref[MAX_RANKS], nb[MAX_RANKS];
            run(n, specs[s], V_CHECKPOINT, 1, 0, ref);
            for (int no_thread = 0; no_thread <= 1; no_thread++) {
                run(n, specs[s], V_CHECKPOINT, 0, no_thread, nb);
                for (int r = 0; r < n; r++) {
                    const job *b = &nb[r];
                    for (int k = 0; k < N_REFUSED; k++)
                        if (b->refused[k] != GCOMP_ERR_INVALID_ARG)
                            fail_msg(
                                "%s, %d ranks, %s: rank %d: checkpoint or stats call %d in flight returned %s (%s)",
                                specs[s], n, no_thread ? "no thread" : "progress thread", r, k,
                                gcomp_result_name(b->refused[k]), b->refusal);
                    if (!strstr(b->refusal, "gcomp_comm_residuals_load") || !strstr(b->refusal, "in flight"))
                        fail_msg("rank %d: the refusal says '%s'", r, b->refusal);
                    assert_false(b->file_written);
                    for (int i = 0; i < N_CALLS; i++)
                        if (ref[r].rc[i] != GCOMP_SUCCESS || b->rc[i] != GCOMP_SUCCESS || b->hash[i] != ref[r].hash[i])
                            fail_msg("%s, %d ranks, %s: rank %d call %d: %s, differs from blocking: %d", specs[s], n,
                                     no_thread ? "no thread" : "progress thread", r, i, gcomp_result_name(b->rc[i]),
                                     b->hash[i] != ref[r].hash[i]);
                    assert_true(ref[r].state_hash != 0);
                    assert_true(b->state_hash == ref[r].state_hash); /* the refused calls changed nothing */
                    assert_int_equal(b->reload, GCOMP_SUCCESS);
                    assert_true(b->reload_same);
                }
            }
        }
}

/* A checkpoint call while another thread of the same rank is inside a blocking call (rank 0's
 * second thread waits in its gcomp_allreduce for rank 1, which calls only once rank 0's main
 * thread saw the refusal): refused, and the refusal names the other thread's call rather than
 * requests in flight (it said "0 not yet completed by gcomp_wait/gcomp_test"). */
typedef struct other_thread_job {
    loop_rank at;
    pthread_mutex_t *lock;
    pthread_cond_t *cond;
    int *refusal_seen;
    gcomp_comm *comm;
    float x[3001], y[3001];
    gcomp_result call_rc, save_rc;
    char refusal[240];
} other_thread_job;

static void *blocking_call(void *arg)
{
    other_thread_job *j = arg;
    j->call_rc = gcomp_allreduce(j->comm, j->x, j->y, 3001, GCOMP_F32, GCOMP_SUM, 1, NULL);
    return NULL;
}

static void *other_thread_rank(void *arg)
{
    other_thread_job *j = arg;
    gcomp_config cfg = gcomp_config_default();
    pthread_t t;
    uint8_t buf[1 << 16];
    size_t written = 0;
    cfg.codec = "terngrad";
    cfg.min_bytes = 0;
    cfg.timeout_ms = 20000;
    fill(j->x, 3001, j->at.rank, 0);
    j->call_rc = j->save_rc = GCOMP_ERR_INTERNAL;
    if (gcomp__comm_create_loop(j->at.w, j->at.rank, &cfg, &j->comm) != GCOMP_SUCCESS) return NULL;
    if (j->at.rank == 0) {
        if (pthread_create(&t, NULL, blocking_call, j) != 0) { /* no cmocka assert off the main thread */
            j->save_rc = GCOMP_ERR_INTERNAL;
            snprintf(j->refusal, sizeof j->refusal, "pthread_create failed");
            pthread_mutex_lock(j->lock);
            *j->refusal_seen = 1;
            pthread_cond_broadcast(j->cond);
            pthread_mutex_unlock(j->lock);
            gcomp_comm_destroy(j->comm);
            return NULL;
        }
        /* until the other thread's call holds the communicator (a save before it is fine) */
        for (int tries = 0; tries < 4000; tries++) {
            j->save_rc = gcomp_comm_residuals_save(j->comm, buf, sizeof buf, &written);
            if (j->save_rc != GCOMP_SUCCESS) break;
            usleep(500);
        }
        snprintf(j->refusal, sizeof j->refusal, "%s", gcomp_last_error());
        pthread_mutex_lock(j->lock);
        *j->refusal_seen = 1;
        pthread_cond_broadcast(j->cond);
        pthread_mutex_unlock(j->lock);
        pthread_join(t, NULL);
    } else {
        pthread_mutex_lock(j->lock);
        while (!*j->refusal_seen) pthread_cond_wait(j->cond, j->lock);
        pthread_mutex_unlock(j->lock);
        blocking_call(j);
    }
    gcomp_comm_destroy(j->comm);
    return NULL;
}

static void test_checkpoint_while_other_thread_calls(void **state)
{
    static other_thread_job jobs[2];
    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
    int refusal_seen = 0;
    (void)state;
    memset(jobs, 0, sizeof jobs);
    for (int r = 0; r < 2; r++) {
        jobs[r].lock = &lock;
        jobs[r].cond = &cond;
        jobs[r].refusal_seen = &refusal_seen;
    }
    loop_run_world(2, other_thread_rank, jobs, sizeof jobs[0]);
    assert_int_equal(jobs[0].call_rc, GCOMP_SUCCESS);
    assert_int_equal(jobs[1].call_rc, GCOMP_SUCCESS);
    if (jobs[0].save_rc != GCOMP_ERR_INVALID_ARG) fail_msg("save returned %s", gcomp_result_name(jobs[0].save_rc));
    if (!strstr(jobs[0].refusal, "gcomp_comm_residuals_save") || !strstr(jobs[0].refusal, "another thread"))
        fail_msg("the refusal says '%s'", jobs[0].refusal);
}

/* Stats readers on other threads of an idle communicator: they take its lock, never its hold,
 * so two readers never refuse each other, and a reader never makes the main thread's
 * checkpoint calls refuse as if a call ran (both did: the getters took the hold). Each rank
 * makes one call, then runs two readers at once, then one reader beside READS saves. */
#define READS 20000
typedef struct reader_job {
    loop_rank at;
    gcomp_comm *comm;
    int stop; /* atomic */
    long refused;
    long saves_refused, readers_refused;
    char refusal[240];
} reader_job;

static void *read_stats(void *arg)
{
    reader_job *j = arg;
    gcomp_comm_stats st;
    long refused = 0;
    for (long i = 0; i < READS && !__atomic_load_n(&j->stop, __ATOMIC_RELAXED); i++)
        if (gcomp_comm_stats_get(j->comm, &st) != GCOMP_SUCCESS ||
            gcomp_comm_key_stats_get(j->comm, 1, &st) != GCOMP_SUCCESS)
            refused++;
    __atomic_add_fetch(&j->refused, refused, __ATOMIC_RELAXED);
    return NULL;
}

static void *stats_reader_rank(void *arg)
{
    reader_job *j = arg;
    gcomp_config cfg = gcomp_config_default();
    float x[1000], y[1000];
    uint8_t buf[1 << 14];
    size_t written;
    pthread_t t[2];
    cfg.codec = "terngrad";
    cfg.min_bytes = 0;
    cfg.timeout_ms = 20000;
    fill(x, 1000, j->at.rank, 0);
    j->readers_refused = j->saves_refused = -1;
    if (gcomp__comm_create_loop(j->at.w, j->at.rank, &cfg, &j->comm) != GCOMP_SUCCESS) return NULL;
    if (gcomp_allreduce(j->comm, x, y, 1000, GCOMP_F32, GCOMP_SUM, 1, NULL) != GCOMP_SUCCESS) goto out;
    if (pthread_create(&t[0], NULL, read_stats, j) != 0) goto out;
    if (pthread_create(&t[1], NULL, read_stats, j) != 0) {
        __atomic_store_n(&j->stop, 1, __ATOMIC_RELAXED);
        pthread_join(t[0], NULL);
        goto out;
    }
    pthread_join(t[0], NULL);
    pthread_join(t[1], NULL);
    j->readers_refused = j->refused;
    j->saves_refused = 0;
    if (pthread_create(&t[0], NULL, read_stats, j) != 0) goto out;
    for (int i = 0; i < READS; i++)
        if (gcomp_comm_residuals_save(j->comm, buf, sizeof buf, &written) != GCOMP_SUCCESS && j->saves_refused++ == 0)
            snprintf(j->refusal, sizeof j->refusal, "%s", gcomp_last_error());
    __atomic_store_n(&j->stop, 1, __ATOMIC_RELAXED);
    pthread_join(t[0], NULL);
out:
    gcomp_comm_destroy(j->comm);
    return NULL;
}

static void test_stats_readers_take_no_hold(void **state)
{
    static reader_job jobs[2];
    (void)state;
    memset(jobs, 0, sizeof jobs);
    loop_run_world(2, stats_reader_rank, jobs, sizeof jobs[0]);
    for (int r = 0; r < 2; r++) {
        if (jobs[r].readers_refused != 0)
            fail_msg("rank %d: two stats readers of an idle communicator: %ld reads refused", r,
                     jobs[r].readers_refused);
        if (jobs[r].saves_refused != 0)
            fail_msg("rank %d: %ld of %d saves refused beside a stats reader (%s)", r, jobs[r].saves_refused, READS,
                     jobs[r].refusal);
    }
}

static void test_null_arguments(void **state)
{
    gcomp_request *req = (gcomp_request *)1;
    int done = 1;
    (void)state;
    assert_int_equal(gcomp_iallreduce(NULL, NULL, NULL, 0, GCOMP_F32, GCOMP_SUM, 0, NULL, &req), GCOMP_ERR_INVALID_ARG);
    assert_null(req);
    assert_int_equal(gcomp_wait(NULL), GCOMP_ERR_INVALID_ARG);
    assert_int_equal(gcomp_wait(&req), GCOMP_ERR_INVALID_ARG);
    assert_int_equal(gcomp_test(&req, &done), GCOMP_ERR_INVALID_ARG);
    assert_int_equal(done, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_null_arguments),
        cmocka_unit_test(test_many_in_flight_match_blocking),
        cmocka_unit_test(test_stopped_peer_times_out),
        cmocka_unit_test(test_mismatch_in_flight),
        cmocka_unit_test(test_bad_argument_in_flight),
        cmocka_unit_test(test_checkpoint_while_in_flight),
        cmocka_unit_test(test_checkpoint_while_other_thread_calls),
        cmocka_unit_test(test_stats_readers_take_no_hold),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
