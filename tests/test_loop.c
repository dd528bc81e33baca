/*
 * test_loop.c — every schedule over the loopback transport (src/transport_loop.c): 1 to 8
 * ranks as threads of this process, no mpirun. Each case of schedule_cases.h runs a few steps
 * with error feedback; every rank's results must be bit-identical, and equal to the
 * checked-in hashes that test_mpi_allreduce also checks under mpirun. Then the agreement and
 * failure paths: a mismatch, a local failure after agreement, a stopped peer, a message
 * truncated on the wire (the outcome trailer carries the failure to every rank).
 *
 * GCOMP_LOOP_PRINT=1 prints the hash table instead of checking it (to regenerate
 * tests/golden/schedules_expected.h after an intended change of a schedule's arithmetic).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <setjmp.h>
#include <stdarg.h>
#include <cmocka.h>

#include "codecs/common.h" /* gcomp_le_store_u64 */
#include "comm.h"
#include "ring.h"
#include "loop_world.h"
#include "schedule_cases.h"
#include "golden/schedules_expected.h"

#define MAX_RANKS 8

typedef struct rank_job {
    loop_rank at; /* first: loop_run_world fills it */
    const schedule_case *c;
    gcomp_result rc; /* first failure */
    uint64_t hash;   /* of every step's result */
    gcomp_schedule sched;
} rank_job;

/* Worlds of 2..4 ranks each running fn; every rank's rc must be want (what: why, for the
 * failure message). */
static void expect_every_rank(void *(*fn)(void *), gcomp_result want, const char *what)
{
    for (int n = 2; n <= 4; n++) {
        rank_job jobs[MAX_RANKS];
        memset(jobs, 0, sizeof jobs);
        loop_run_world(n, fn, jobs, sizeof jobs[0]);
        for (int r = 0; r < n; r++)
            if (jobs[r].rc != want)
                fail_msg("%d ranks, %s: rank %d returned %s, expected %s", n, what, r, gcomp_result_name(jobs[r].rc),
                         gcomp_result_name(want));
    }
}

static void *run_case(void *arg)
{
    rank_job *j = arg;
    const schedule_case *c = j->c;
    gcomp_config cfg = sc_config(c);
    gcomp_comm *comm = NULL;
    gcomp_comm_stats st;
    cfg.timeout_ms = 20000;
    j->hash = SC_HASH_INIT;
    j->rc = gcomp__comm_create_loop(j->at.w, j->at.rank, &cfg, &comm);
    if (j->rc == GCOMP_SUCCESS) j->rc = sc_run_steps(comm, c, j->at.rank, &j->hash);
    if (j->rc == GCOMP_SUCCESS && gcomp_comm_stats_get(comm, &st) == GCOMP_SUCCESS) j->sched = st.last_schedule;
    if (j->rc != GCOMP_SUCCESS) fprintf(stderr, "rank %d: %s\n", j->at.rank, gcomp_last_error());
    gcomp_comm_destroy(comm);
    return NULL;
}

static void test_every_schedule(void **state)
{
    int print = getenv("GCOMP_LOOP_PRINT") != NULL;
    (void)state;
    for (size_t ci = 0; ci < SCHEDULE_N_CASES; ci++) {
        const schedule_case *c = &schedule_cases[ci];
        for (int n = 1; n <= MAX_RANKS; n++) {
            rank_job jobs[MAX_RANKS];
            memset(jobs, 0, sizeof jobs);
            for (int r = 0; r < n; r++) jobs[r].c = c;
            loop_run_world(n, run_case, jobs, sizeof jobs[0]);
            for (int r = 0; r < n; r++) {
                assert_int_equal(jobs[r].rc, GCOMP_SUCCESS);
                /* bit-identical on every rank */
                assert_true(jobs[r].hash == jobs[0].hash);
                assert_string_equal(gcomp_schedule_name(jobs[r].sched), sc_schedule_at(c, n));
            }
            if (print) {
                printf("    {\"%s\", %d, 0x%016llxull},\n", c->name, n, (unsigned long long)jobs[0].hash);
            } else {
                uint64_t want = sc_expected_hash(c->name, n);
                if (want != jobs[0].hash)
                    fail_msg("%s at %d ranks: hash 0x%016llx, expected 0x%016llx", c->name, n,
                             (unsigned long long)jobs[0].hash, (unsigned long long)want);
            }
        }
    }
}

/* ---- collectives per call ------------------------------------------------------------------ */

typedef struct coll_job {
    loop_rank at;
    const char *spec;
    gcomp_dtype dtype;
    size_t count;
    gcomp_result rc;
    uint64_t total; /* collectives of three calls, as this rank counted them */
    gcomp_schedule sched; /* of the last call */
} coll_job;

static void *run_counted_calls(void *arg)
{
    coll_job *j = arg;
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *comm = NULL;
    gcomp_comm_stats st;
    size_t esize = gcomp_dtype_size(j->dtype);
    uint8_t *x = calloc(j->count, esize), *y = calloc(j->count, esize);
    uint64_t before;
    for (size_t i = 0; i < j->count * esize; i += 2) x[i + 1] = (uint8_t)(0x30 + (i + j->at.rank) % 7); /* finite */
    cfg.codec = j->spec;
    cfg.min_bytes = 0;
    cfg.timeout_ms = 20000;
    j->rc = gcomp__comm_create_loop(j->at.w, j->at.rank, &cfg, &comm);
    if (j->rc == GCOMP_SUCCESS) j->rc = gcomp_allreduce(comm, x, y, j->count, j->dtype, GCOMP_SUM, 5, NULL);
    before = gcomp__loop_world_collectives(j->at.w);
    for (int t = 0; t < 3 && j->rc == GCOMP_SUCCESS; t++)
        j->rc = gcomp_allreduce(comm, x, y, j->count, j->dtype, GCOMP_SUM, 5, NULL);
    j->total = gcomp__loop_world_collectives(j->at.w) - before;
    if (j->rc == GCOMP_SUCCESS && gcomp_comm_stats_get(comm, &st) == GCOMP_SUCCESS) j->sched = st.last_schedule;
    gcomp_comm_destroy(comm);
    free(x);
    free(y);
    return NULL;
}

/* n loopback ranks each running run_counted_calls on the same call; jobs: MAX_RANKS. */
static void run_counted_world(int n, const char *spec, gcomp_dtype dtype, size_t count, coll_job *jobs)
{
    memset(jobs, 0, MAX_RANKS * sizeof *jobs);
    for (int r = 0; r < n; r++) {
        jobs[r].spec = spec;
        jobs[r].dtype = dtype;
        jobs[r].count = count;
    }
    loop_run_world(n, run_counted_calls, jobs, sizeof jobs[0]);
}

/* A compressed call on host buffers of the dense ring, recursive doubling or the sparse
 * gather makes no collective, at 3 and 4 ranks: the ranks agree in the ring's first messages
 * (ring.h; at 4, on the butterfly) and learn the outcome from its trailers. TernGrad keeps one, the agreement that carries its shared scales when
 * there are at most GCOMP__AGREE_SCALES of them and the buffers are fp32 (else the integer
 * ring's own scale allreduce is a second one). */
static void test_collectives_per_call(void **state)
{
    static const struct {
        const char *spec;
        gcomp_dtype dtype;
        size_t count;
        uint64_t want;
    } cases[] = {
        { "terngrad", GCOMP_F32, 20000, 1 },
        { "terngrad:bucket=4096", GCOMP_F32, 8 * 4096, 1 },     /* 8 scales: the slots' limit */
        { "terngrad:bucket=4096", GCOMP_F32, 8 * 4096 + 1, 2 }, /* 9 scales */
        { "terngrad", GCOMP_F16, 20000, 2 },                     /* widened after the agreement */
        { "fp16", GCOMP_F32, 20000, 0 },
        { "none", GCOMP_BF16, 20000, 0 },
        { "topk:ratio=0.01", GCOMP_F32, 20000, 0 },            /* sparse gather */
        { "topk:ratio=0.01", GCOMP_F32, 200, 0 },              /* sparse-as-dense */
    };
    (void)state;
    for (int n = 3; n <= 4; n++) /* 4: recursive doubling (1000), a pass and the dense ring (20000) */
        for (size_t i = 0; i < sizeof cases / sizeof cases[0] + 1; i++) {
            int dbl = i == sizeof cases / sizeof cases[0]; /* one more case: fp16, 1000 elements */
            coll_job jobs[MAX_RANKS];
            run_counted_world(n, dbl ? "fp16" : cases[i].spec, dbl ? GCOMP_F32 : cases[i].dtype,
                              dbl ? 1000 : cases[i].count, jobs);
            for (int r = 0; r < n; r++) {
                uint64_t want = dbl ? 0 : cases[i].want;
                assert_int_equal(jobs[r].rc, GCOMP_SUCCESS);
                if (jobs[r].total != 3 * want)
                    fail_msg("%s, %zu elements of dtype %d at %d ranks: %llu collectives in 3 calls, expected %llu",
                             jobs[r].spec, jobs[r].count, (int)jobs[r].dtype, n, (unsigned long long)jobs[r].total,
                             (unsigned long long)(3 * want));
            }
        }
}

/* Recursive doubling's limit is on the encoded elements (GCOMP__DOUBLING_MAX_BYTES, 32 KiB,
 * beside the 16 Ki element cap): 8 Ki elements of none, 16 Ki of fp16 or bf16 whatever the
 * buffers' dtype, one more takes the dense ring; only at a power-of-two N >= 4. At 2 ranks
 * every one of these calls takes doubling (one exchange: no limit but a message's). */
static void test_doubling_limit(void **state)
{
    static const struct {
        const char *spec;
        gcomp_dtype dtype;
        size_t count;
        gcomp_schedule at_pow2; /* at 4 and 8 ranks; the dense ring at 3 and 5 */
    } cases[] = {
        { "none", GCOMP_F32, 8192, GCOMP_SCHED_DOUBLING },  { "none", GCOMP_F32, 8193, GCOMP_SCHED_DENSE },
        { "fp16", GCOMP_F32, 16384, GCOMP_SCHED_DOUBLING }, { "fp16", GCOMP_F32, 16385, GCOMP_SCHED_DENSE },
        { "bf16", GCOMP_F16, 16384, GCOMP_SCHED_DOUBLING }, { "bf16", GCOMP_F16, 16385, GCOMP_SCHED_DENSE },
        { "fp16+zstd", GCOMP_F32, 16384, GCOMP_SCHED_DOUBLING }, /* the zstd stage's bound aside */
    };
    static const int ranks[] = { 2, 3, 4, 5, 8 };
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (size_t k = 0; k < sizeof ranks / sizeof ranks[0]; k++) {
            int n = ranks[k];
            gcomp_schedule want = n == 2 ? GCOMP_SCHED_DOUBLING : n == 4 || n == 8 ? cases[i].at_pow2 : GCOMP_SCHED_DENSE;
            coll_job jobs[MAX_RANKS];
            run_counted_world(n, cases[i].spec, cases[i].dtype, cases[i].count, jobs);
            for (int r = 0; r < n; r++) {
                assert_int_equal(jobs[r].rc, GCOMP_SUCCESS);
                if (jobs[r].sched != want)
                    fail_msg("%s, %zu elements of dtype %d at %d ranks: rank %d ran %s, expected %s", cases[i].spec,
                             cases[i].count, (int)cases[i].dtype, n, r, gcomp_schedule_name(jobs[r].sched),
                             gcomp_schedule_name(want));
            }
        }
}

/* ---- agreement and failure paths -------------------------------------------------------- */

enum {
    VARIANT_MISMATCH = 1,
    VARIANT_LOCAL_FAILURE = 2,
    VARIANT_STOPPED_PEER = 3
};

static int g_variant;

static void *run_fault(void *arg)
{
    rank_job *j = arg;
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *comm = NULL;
    size_t n = 20000;
    float *x = calloc(n + 1, sizeof(float)), *y = calloc(n + 1, sizeof(float));
    for (size_t i = 0; i <= n; i++) x[i] = (float)(i % 7) - 3.0f;
    cfg.codec = "fp16";
    cfg.min_bytes = 0;
    cfg.timeout_ms = g_variant == VARIANT_STOPPED_PEER ? 300 : 20000;
    j->rc = gcomp__comm_create_loop(j->at.w, j->at.rank, &cfg, &comm);
    if (j->rc == GCOMP_SUCCESS) {
        size_t count = n;
        if (g_variant == VARIANT_MISMATCH && j->at.rank == 1) count = n + 1;
        if (g_variant == VARIANT_LOCAL_FAILURE && j->at.rank == 0)
            gcomp__comm_inject_fault(comm, GCOMP__FAULT_TRUNCATE_WIRE);
        if (g_variant == VARIANT_STOPPED_PEER && j->at.rank == j->at.size - 1) usleep(1200 * 1000);
        j->rc = gcomp_allreduce(comm, x, y, count, GCOMP_F32, GCOMP_SUM, 1, NULL);
        /* the message names the count, the range the ranks hold, and this rank's call in words,
         * not enum values */
        if (g_variant == VARIANT_MISMATCH && j->rc == GCOMP_ERR_MISMATCH &&
            !(strstr(gcomp_last_error(), "count (lowest 20000, highest 20001)") &&
              strstr(gcomp_last_error(), "dtype f32 op sum")))
            j->rc = GCOMP_ERR_INTERNAL;
        /* after a mismatch or a local failure the communicator still works */
        if (g_variant != VARIANT_STOPPED_PEER && j->rc != GCOMP_SUCCESS) {
            gcomp_result again = gcomp_allreduce(comm, x, y, n, GCOMP_F32, GCOMP_SUM, 1, NULL);
            if (again != GCOMP_SUCCESS) j->rc = GCOMP_ERR_INTERNAL;
        }
    }
    gcomp_comm_destroy(comm);
    free(x);
    free(y);
    return NULL;
}

static void run_fault_variant(int variant, int n, gcomp_result want)
{
    rank_job jobs[MAX_RANKS];
    double t0 = gcomp__now();
    memset(jobs, 0, sizeof jobs);
    g_variant = variant;
    loop_run_world(n, run_fault, jobs, sizeof jobs[0]);
    for (int r = 0; r < n; r++) {
        if (jobs[r].rc != want)
            fail_msg("variant %d, %d ranks: rank %d returned %s, expected %s", variant, n, r,
                     gcomp_result_name(jobs[r].rc), gcomp_result_name(want));
    }
    assert_true(gcomp__now() - t0 < 10.0); /* no hang: everyone returned well within the deadline */
}

static void test_mismatch(void **state)
{
    (void)state;
    for (int n = 2; n <= 5; n++) run_fault_variant(VARIANT_MISMATCH, n, GCOMP_ERR_MISMATCH);
}

/* Ranks that planned different calls (rank 1 differs from the others). On the dense ring and
 * the sparse gather the ranks agree in the ring's first N-1 messages (ring.h), received at
 * any size: whatever rank 1 planned -- a larger ring (messages longer than its neighbour's
 * receives), a bypass, an empty call, the other sparse schedule, a failed argument check --
 * every rank sends and receives the same N-1 messages and then stops with the same error,
 * well within the deadline, and the next call works everywhere (no message left over).
 * TernGrad agrees by a collective, as before. */
/* A call the ranks refuse writes nothing the caller can see: not recv, and not the input of
 * an in-place call, on every schedule that reaches the verdict after some of its own work
 * (recursive doubling's last exchange is the verdict; the dense ring's first N-1 steps). */
typedef struct refuse_job {
    loop_rank at;
    size_t count;
    int in_place;
    gcomp_result rc;
    int touched; /* elements of recv (or of the in-place input) that changed */
} refuse_job;

static void *run_refused(void *arg)
{
    refuse_job *j = arg;
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *comm = NULL;
    size_t n = j->count + 1;
    float *x = calloc(n, sizeof(float)), *y = calloc(n, sizeof(float));
    cfg.codec = "fp16";
    cfg.min_bytes = 0;
    cfg.timeout_ms = 20000;
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)(j->at.rank + 1);
        y[i] = -7.0f;
    }
    j->rc = gcomp__comm_create_loop(j->at.w, j->at.rank, &cfg, &comm);
    if (j->rc == GCOMP_SUCCESS) {
        size_t count = j->at.rank == j->at.size - 1 ? j->count + 1 : j->count; /* the last rank differs */
        j->rc = gcomp_allreduce(comm, x, j->in_place ? x : y, count, GCOMP_F32, GCOMP_SUM, 1, NULL);
    }
    for (size_t i = 0; i < n; i++)
        j->touched += j->in_place ? x[i] != (float)(j->at.rank + 1) : y[i] != -7.0f;
    gcomp_comm_destroy(comm);
    free(x);
    free(y);
    return NULL;
}

static void test_refused_call_writes_nothing(void **state)
{
    static const size_t counts[] = { 1000, 40000 }; /* recursive doubling at 2 and 4 ranks; at 2 only */
    (void)state;
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++)
        for (int in_place = 0; in_place <= 1; in_place++)
            for (int n = 2; n <= 5; n++) {
                refuse_job jobs[MAX_RANKS];
                memset(jobs, 0, sizeof jobs);
                for (int r = 0; r < n; r++) {
                    jobs[r].count = counts[k];
                    jobs[r].in_place = in_place;
                }
                loop_run_world(n, run_refused, jobs, sizeof jobs[0]);
                for (int r = 0; r < n; r++)
                    if (jobs[r].rc != GCOMP_ERR_MISMATCH || jobs[r].touched)
                        fail_msg("%zu elements%s at %d ranks: rank %d returned %s and changed %d elements of %s",
                                 counts[k], in_place ? " in place" : "", n, r, gcomp_result_name(jobs[r].rc),
                                 jobs[r].touched, in_place ? "its input" : "recv");
            }
    print_message("    fp16, 1000 and 40000 elements, in and out of place, 2-5 ranks: refused, nothing written\n");
}

typedef struct plan_case {
    const char *spec;
    size_t count, count1; /* rank 1's count */
    gcomp_dtype dtype1;   /* rank 1's dtype */
    int null1;            /* rank 1 passes recv = NULL */
    int hook1;            /* rank 1's buffers go through a staging decorator (1) or the emulated
                           * device path (2): it agrees in a pass of its own, the others in
                           * their ring, and the fingerprint's path field tells them apart;
                           * or (3) the emulated device path without staging, whose host
                           * copies (+zstd) carry the agreement in their ring as host buffers
                           * do: rank 1 agrees with the others and the call succeeds */
    gcomp_result want;
    int pass4; /* at 4 ranks every rank agrees in a pass (a dense ring on a butterfly
                * communicator, engine.c): a hook's path is everyone's, and the call succeeds */
} plan_case;

typedef struct plan_job {
    loop_rank at;
    const plan_case *pc;
    gcomp_result rc, again;
    float sum; /* two elements of a successful result: the same on every rank */
} plan_job;

static void *run_plan(void *arg)
{
    plan_job *j = arg;
    const plan_case *pc = j->pc;
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *comm = NULL;
    size_t cap = pc->count > pc->count1 ? pc->count : pc->count1;
    float *x = calloc(cap + 1, sizeof(float)), *y = calloc(cap + 1, sizeof(float));
    int one = j->at.rank == 1;
    for (size_t i = 0; i <= cap; i++) x[i] = (float)(i % 7) - 3.0f;
    cfg.codec = pc->spec;
    cfg.min_bytes = 4096;
    cfg.timeout_ms = 20000;
    j->rc = j->again = gcomp__comm_create_loop(j->at.w, j->at.rank, &cfg, &comm);
    if (j->rc == GCOMP_SUCCESS && one && pc->hook1)
        j->rc = pc->hook1 == 1 ? gcomp__comm_stage_host(comm) : gcomp__comm_emulate_device(comm, "none", pc->hook1 == 2);
    if (j->rc == GCOMP_SUCCESS) {
        j->rc = gcomp_allreduce(comm, x, one && pc->null1 ? NULL : y, one ? pc->count1 : pc->count,
                                one ? pc->dtype1 : GCOMP_F32, GCOMP_SUM, 1, NULL);
        if (j->rc == GCOMP_ERR_MISMATCH && (pc->hook1 == 1 || pc->hook1 == 2) &&
            !strstr(gcomp_last_error(), "path of its agreement"))
            j->rc = GCOMP_ERR_INTERNAL; /* a hook's difference is the path's alone */
        if (j->rc == GCOMP_SUCCESS) j->sum = y[0] + y[cap / 2];
        /* the hooks stay, so the next call differs as this one did: it must give the same outcome */
        j->again = gcomp_allreduce(comm, x, y, pc->count, GCOMP_F32, GCOMP_SUM, 1, NULL);
        if (pc->hook1 && j->again == pc->want) j->again = GCOMP_SUCCESS;
    }
    gcomp_comm_destroy(comm);
    free(x);
    free(y);
    return NULL;
}

static void test_disagreeing_plans(void **state)
{
    static const plan_case cases[] = {
        { "fp16", 20000, 400000, GCOMP_F32, 0, 0, GCOMP_ERR_MISMATCH, 0 },          /* larger messages */
        { "fp16", 20000, 100, GCOMP_F32, 0, 0, GCOMP_ERR_MISMATCH, 0 },             /* rank 1 bypasses */
        { "fp16", 20000, 0, GCOMP_F32, 0, 0, GCOMP_ERR_MISMATCH, 0 },               /* rank 1's call is empty */
        { "fp16", 20000, 20000, GCOMP_BF16, 0, 0, GCOMP_ERR_MISMATCH, 0 },          /* another dtype */
        { "fp16", 20000, 20000, GCOMP_F32, 1, 0, GCOMP_ERR_INVALID_ARG, 0 },        /* rank 1 cannot plan */
        { "none", 20000, 20001, GCOMP_F32, 0, 0, GCOMP_ERR_MISMATCH, 0 },           /* one element more */
        { "topk:ratio=0.01", 20000, 2000, GCOMP_F32, 0, 0, GCOMP_ERR_MISMATCH, 0 }, /* gather vs sparse-as-dense */
        { "topk:ratio=0.01", 2000, 300000, GCOMP_F32, 0, 0, GCOMP_ERR_MISMATCH, 0 },
        { "terngrad", 20000, 40000, GCOMP_F32, 0, 0, GCOMP_ERR_MISMATCH, 0 },  /* the collective agreement */
        { "fp16", 20000, 20000, GCOMP_F32, 0, 1, GCOMP_ERR_MISMATCH, 1 },      /* staged: a pass */
        { "fp16+zstd", 20000, 20000, GCOMP_F32, 0, 2, GCOMP_ERR_MISMATCH, 1 }, /* host copies, staged */
        /* recursive doubling at 4 ranks against a pass and the dense ring, a bypass, a pass */
        { "fp16", 5000, 20000, GCOMP_F32, 0, 0, GCOMP_ERR_MISMATCH, 0 },
        { "fp16", 5000, 100, GCOMP_F32, 0, 0, GCOMP_ERR_MISMATCH, 0 },
        { "fp16", 5000, 5000, GCOMP_F32, 0, 1, GCOMP_ERR_MISMATCH, 0 },
        { "fp16+zstd", 20000, 20000, GCOMP_F32, 0, 3, GCOMP_SUCCESS, 0 }, /* host copies, in the ring */
        { "topk:ratio=0.01+zstd", 20000, 20000, GCOMP_F32, 0, 3, GCOMP_SUCCESS, 0 },
        { "fp16+zstd", 20000, 20001, GCOMP_F32, 0, 3, GCOMP_ERR_MISMATCH, 0 },
    };
    (void)state;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        for (int n = 2; n <= 5; n++) {
            plan_job jobs[MAX_RANKS];
            double t0 = gcomp__now();
            memset(jobs, 0, sizeof jobs);
            for (int r = 0; r < n; r++) jobs[r].pc = &cases[k];
            loop_run_world(n, run_plan, jobs, sizeof jobs[0]);
            gcomp_result want = cases[k].pass4 && n == 4 ? GCOMP_SUCCESS : cases[k].want;
            for (int r = 0; r < n; r++) {
                if (jobs[r].rc == GCOMP_SUCCESS && jobs[r].sum != jobs[0].sum)
                    fail_msg("%s at %d ranks: rank %d's result differs from rank 0's", cases[k].spec, n, r);
                if (jobs[r].rc != want || jobs[r].again != GCOMP_SUCCESS)
                    fail_msg("%s, count %zu (rank 1: %zu, dtype %d%s) at %d ranks: rank %d returned %s, then %s; "
                             "expected %s, then GCOMP_SUCCESS",
                             cases[k].spec, cases[k].count, cases[k].count1, (int)cases[k].dtype1,
                             cases[k].null1 ? ", recv NULL" : "", n, r, gcomp_result_name(jobs[r].rc),
                             gcomp_result_name(jobs[r].again), gcomp_result_name(want));
            }
            assert_true(gcomp__now() - t0 < 10.0); /* no rank waited for the 20 s deadline */
        }
        printf("  %-16s count %6zu, rank 1 %6zu dtype %d%s: %s on every rank at 2-5 ranks%s%s\n", cases[k].spec,
               cases[k].count, cases[k].count1, (int)cases[k].dtype1,
               cases[k].null1       ? " recv NULL"
               : cases[k].hook1 == 1 ? " staged"
               : cases[k].hook1 == 2 ? " emulated device"
               : cases[k].hook1 == 3 ? " emulated device, unstaged"
                                     : "",
               gcomp_result_name(cases[k].want), cases[k].pass4 ? " (4: success, all pass)" : "",
               cases[k].hook1 ? "" : ", then success");
    }
}

/* A rank whose library speaks another wire protocol (a test hook shifts rank 1's number, as
 * if it ran another build) is refused at creation on every rank, naming the protocol,
 * instead of a first call that would time out. */
static void *run_skewed_create(void *arg)
{
    rank_job *j = arg;
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *comm = NULL;
    cfg.codec = "fp16";
    cfg.timeout_ms = 20000;
    gcomp__protocol_skew = j->at.rank == 1;
    j->rc = gcomp__comm_create_loop(j->at.w, j->at.rank, &cfg, &comm);
    if (j->rc == GCOMP_ERR_MISMATCH && !strstr(gcomp_last_error(), "protocol")) j->rc = GCOMP_ERR_INTERNAL;
    gcomp__protocol_skew = 0;
    gcomp_comm_destroy(comm);
    return NULL;
}

static void test_protocol_mismatch(void **state)
{
    (void)state;
    expect_every_rank(run_skewed_create, GCOMP_ERR_MISMATCH,
                      "rank 1 of another protocol, creation (INTERNAL: the error did not name the protocol)");
}

static void test_local_failure_after_agreement(void **state)
{
    (void)state;
    for (int n = 2; n <= 5; n++) run_fault_variant(VARIANT_LOCAL_FAILURE, n, GCOMP_ERR_CORRUPT);
}

static void test_stopped_peer_times_out(void **state)
{
    (void)state;
    run_fault_variant(VARIANT_STOPPED_PEER, 3, GCOMP_ERR_TIMEOUT);
}

/* The outcome trailer (src/ring.h): rank 0's first ring message of a call loses its last
 * byte (the fault decorator). Its receiver finds the trailer broken and the news rides the
 * ring's later messages -- on the sparse gather its outcome hop brings it back to rank 0 --
 * so every rank returns GCOMP_ERR_CORRUPT with no collective after the ring, and the next
 * call works everywhere (a failure heard too late would have broken a communicator). The
 * same when the message's trailer says a failure code that is no gcomp_result (garbled): its
 * receiver takes the trailer for corrupt, where before it heard of that code and some ranks
 * returned it (GCOMP_ERR_UNKNOWN) while others succeeded. */
typedef struct trunc_job {
    loop_rank at;
    const char *spec;
    size_t count;
    int emulated; /* the buffers take the emulated device path (+zstd: on host copies) */
    gcomp_op op;
    int fault;          /* GCOMP__FAULT_TRUNCATE_WIRE or GCOMP__FAULT_GARBLE_TRAILER */
    gcomp_result rc[2]; /* the truncated call, the call after it */
    gcomp_schedule sched;
    uint64_t wire; /* of the call after it */
} trunc_job;

static void *run_truncated(void *arg)
{
    trunc_job *j = arg;
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *comm = NULL;
    gcomp_comm_stats st;
    size_t n = j->count;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    uint64_t s = 5 + (uint64_t)j->at.rank;
    for (size_t i = 0; i < n; i++) x[i] = (float)((double)(sc_splitmix(&s) >> 11) * 0x1p-53 - 0.5);
    cfg.codec = j->spec;
    cfg.min_bytes = 0;
    cfg.timeout_ms = 20000;
    j->rc[0] = j->rc[1] = gcomp__comm_create_loop(j->at.w, j->at.rank, &cfg, &comm);
    if (j->rc[0] == GCOMP_SUCCESS) {
        if (j->emulated) j->rc[0] = j->rc[1] = gcomp__comm_emulate_device(comm, "none", 0);
        if (j->at.rank == 0) gcomp__comm_inject_fault(comm, j->fault);
        if (j->rc[0] == GCOMP_SUCCESS) j->rc[0] = gcomp_allreduce(comm, x, y, n, GCOMP_F32, j->op, 3, NULL);
        (void)gcomp_comm_stats_reset(comm);
        if (j->rc[1] == GCOMP_SUCCESS) j->rc[1] = gcomp_allreduce(comm, x, y, n, GCOMP_F32, j->op, 3, NULL);
        if (gcomp_comm_stats_get(comm, &st) == GCOMP_SUCCESS) {
            j->sched = st.last_schedule;
            j->wire = st.wire_bytes;
        }
    }
    gcomp_comm_destroy(comm);
    free(x);
    free(y);
    return NULL;
}

static void test_truncated_message(void **state)
{
    static const struct {
        const char *spec;
        size_t count;
        gcomp_schedule sched, at4; /* from 3 ranks (at 2 the dense ring's calls take recursive doubling); at 4 */
        int emulated;
        gcomp_op op;
        int also_garbled; /* run again with the trailer's failure field garbled instead of a byte cut */
    } cases[] = {
        /* at 4 ranks: the agreement's own pass on the butterfly, then the dense ring */
        { "fp16", 20011, GCOMP_SCHED_DENSE, GCOMP_SCHED_DENSE, 0, GCOMP_SUM, 1 },
        { "fp16", 5003, GCOMP_SCHED_DENSE, GCOMP_SCHED_DOUBLING, 0, GCOMP_SUM, 0 },
        { "terngrad", 20011, GCOMP_SCHED_INTEGER, GCOMP_SCHED_INTEGER, 0, GCOMP_SUM, 1 },
        { "topk:ratio=0.01", 20011, GCOMP_SCHED_SPARSE, GCOMP_SCHED_SPARSE, 0, GCOMP_SUM, 1 },
        { "topk:ratio=1", 20011, GCOMP_SCHED_SPARSE_AS_DENSE, GCOMP_SCHED_SPARSE_AS_DENSE, 0, GCOMP_SUM, 0 },
        /* device buffers on host copies (+zstd), AVG (a pre-scaled copy of the input): the
         * failure found in the pass goes on after the copies' regions are carved */
        { "fp16+zstd", 40009, GCOMP_SCHED_DENSE, GCOMP_SCHED_DENSE, 1, GCOMP_AVG, 0 },
        { "fp16+zstd", 5003, GCOMP_SCHED_DENSE, GCOMP_SCHED_DOUBLING, 1, GCOMP_AVG, 0 },
        /* an empty call: the agreement's pass alone, then its outcome hops (no schedule runs) */
        { "fp16", 0, GCOMP_SCHED_NONE, GCOMP_SCHED_NONE, 0, GCOMP_SUM, 1 },
    };
    (void)state;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int run = 0; run < 4 * (1 + cases[k].also_garbled); run++) { /* 2-5 ranks, cut then garbled */
            const int n = 2 + run % 4, garble = run / 4;
            trunc_job jobs[MAX_RANKS];
            memset(jobs, 0, sizeof jobs);
            for (int r = 0; r < n; r++) {
                jobs[r].spec = cases[k].spec;
                jobs[r].count = cases[k].count;
                jobs[r].emulated = cases[k].emulated;
                jobs[r].op = cases[k].op;
                jobs[r].fault = garble ? GCOMP__FAULT_GARBLE_TRAILER : GCOMP__FAULT_TRUNCATE_WIRE;
            }
            loop_run_world(n, run_truncated, jobs, sizeof jobs[0]);
            for (int r = 0; r < n; r++) {
                if (jobs[r].rc[0] != GCOMP_ERR_CORRUPT || jobs[r].rc[1] != GCOMP_SUCCESS)
                    fail_msg("%s at %d ranks: rank %d returned %s, then %s (want CORRUPT, then SUCCESS)", cases[k].spec,
                             n, r, gcomp_result_name(jobs[r].rc[0]), gcomp_result_name(jobs[r].rc[1]));
                gcomp_schedule want = n == 4                                             ? cases[k].at4
                                      : n == 2 && cases[k].sched == GCOMP_SCHED_DENSE ? GCOMP_SCHED_DOUBLING
                                                                                       : cases[k].sched;
                assert_int_equal(jobs[r].sched, want);
                assert_true(jobs[r].wire >= gcomp__ring_trailer_bytes(want, n)); /* counted */
            }
            print_message("    %-16s %5zu elements%s, %d ranks (%s), %s: CORRUPT on every rank, then success\n",
                          cases[k].spec, cases[k].count, cases[k].emulated ? " (device path)" : "", n,
                          gcomp_schedule_name(jobs[0].sched), garble ? "garbled trailer" : "cut message");
        }
}

/* GCOMP_KEY_NONE keeps no residual even with error feedback on (gcomp.h): the same input
 * twice gives the same fp16 result (with a residual, the second call would add the first's
 * rounding error). */
static void *run_key_none(void *arg)
{
    rank_job *j = arg;
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *comm = NULL;
    size_t n = 5003;
    float *x = malloc(n * sizeof(float)), *y1 = malloc(n * sizeof(float)), *y2 = malloc(n * sizeof(float));
    uint64_t s = 99 + (uint64_t)j->at.rank;
    for (size_t i = 0; i < n; i++) x[i] = (float)((double)(sc_splitmix(&s) >> 11) * 0x1p-53 - 0.5) * 3.3f;
    cfg.codec = "fp16";
    cfg.min_bytes = 0;
    cfg.error_feedback = 1;
    j->rc = gcomp__comm_create_loop(j->at.w, j->at.rank, &cfg, &comm);
    if (j->rc == GCOMP_SUCCESS) j->rc = gcomp_allreduce(comm, x, y1, n, GCOMP_F32, GCOMP_SUM, GCOMP_KEY_NONE, NULL);
    if (j->rc == GCOMP_SUCCESS) j->rc = gcomp_allreduce(comm, x, y2, n, GCOMP_F32, GCOMP_SUM, GCOMP_KEY_NONE, NULL);
    if (j->rc == GCOMP_SUCCESS && memcmp(y1, y2, n * sizeof(float)) != 0) j->rc = GCOMP_ERR_INTERNAL;
    gcomp_comm_destroy(comm);
    free(x);
    free(y1);
    free(y2);
    return NULL;
}

static void test_key_none_keeps_no_residual(void **state)
{
    (void)state;
    expect_every_rank(run_key_none, GCOMP_SUCCESS, "two calls without a key (INTERNAL: the second call differed)");
}

/* An exact codec ("none", GCOMP_CAP_EXACT) keeps no residual with error feedback on (gcomp.h):
 * its checkpoint after keyed calls is as small as before them (a record would add the key's
 * count of floats), and its results are the exact sums; fp16 shows that the check sees
 * records. The device path's: test_staging's test_emulated_device. */
typedef struct exact_job {
    loop_rank at;
    int lossy;
    gcomp_result rc;
    size_t grew; /* checkpoint bytes after the calls minus before */
} exact_job;

/* A loopback communicator of codec for this rank (error feedback on, every size compressed);
 * NULL with *rc set on failure. */
static gcomp_comm *loop_comm(const loop_rank *at, const char *codec, gcomp_result *rc)
{
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *c = NULL;
    cfg.codec = codec;
    cfg.min_bytes = 0;
    cfg.timeout_ms = 20000;
    *rc = gcomp__comm_create_loop(at->w, at->rank, &cfg, &c);
    return c;
}

static void *run_exact_codec(void *arg)
{
    exact_job *j = arg;
    gcomp_comm *comm = loop_comm(&j->at, j->lossy ? "fp16" : "none", &j->rc);
    size_t counts[] = { 20000, 4096 }, before = 0, after = 0;
    float *x = malloc(20000 * sizeof(float)), *y = malloc(20000 * sizeof(float));
    float ranks_sum = 0.25f * (float)(j->at.size * (j->at.size + 1) / 2);
    for (size_t i = 0; i < 20000; i++) x[i] = (float)(j->at.rank + 1) * 0.25f * (float)(i % 7); /* exact sums */
    if (j->rc == GCOMP_SUCCESS) j->rc = gcomp_comm_residuals_save(comm, NULL, 0, &before);
    for (size_t k = 0; k < 2 && j->rc == GCOMP_SUCCESS; k++) {
        j->rc = gcomp_allreduce(comm, x, y, counts[k], GCOMP_F32, GCOMP_SUM, 7 + k, NULL);
        for (size_t i = 0; i < counts[k] && j->rc == GCOMP_SUCCESS && !j->lossy; i++)
            if (y[i] != ranks_sum * (float)(i % 7)) j->rc = GCOMP_ERR_INTERNAL;
    }
    if (j->rc == GCOMP_SUCCESS) j->rc = gcomp_comm_residuals_save(comm, NULL, 0, &after);
    if (j->rc != GCOMP_SUCCESS) fprintf(stderr, "rank %d: %s\n", j->at.rank, gcomp_last_error());
    j->grew = after - before;
    gcomp_comm_destroy(comm);
    free(x);
    free(y);
    return NULL;
}

static void test_exact_codec_keeps_no_residual(void **state)
{
    (void)state;
    for (int lossy = 0; lossy <= 1; lossy++)
        for (int n = 2; n <= 5; n++) {
            exact_job jobs[MAX_RANKS];
            memset(jobs, 0, sizeof jobs);
            for (int r = 0; r < n; r++) jobs[r].lossy = lossy;
            loop_run_world(n, run_exact_codec, jobs, sizeof jobs[0]);
            for (int r = 0; r < n; r++) {
                assert_int_equal(jobs[r].rc, GCOMP_SUCCESS);
                if (lossy)
                    assert_true(jobs[r].grew >= (20000 + 4096) * sizeof(float)); /* two records */
                else
                    assert_int_equal(jobs[r].grew, 0); /* no record */
            }
        }
}

/* GCOMP_AVG of inputs whose sum overflows fp32 but whose average does not (2e38 on every
 * rank): the bypass and the dense schedules scale each input by 1/N before the sum (gcomp.h),
 * so the result is finite, within the bound, and no call is counted non-finite. */
typedef struct huge_job {
    loop_rank at;
    int bypass;
    gcomp_result rc;
    float got;
    uint64_t nonfinite;
    gcomp_schedule sched;
} huge_job;

static void *run_huge_avg(void *arg)
{
    huge_job *j = arg;
    enum { N = 5003 }; /* doubling at 2 and 4 ranks, the dense ring at 3 and 5 */
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *comm = NULL;
    gcomp_comm_stats st;
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    for (size_t i = 0; i < N; i++) x[i] = i % 2 ? -2e38f : 2e38f;
    cfg.codec = "none";
    cfg.min_bytes = j->bypass ? 1 << 30 : 0;
    cfg.timeout_ms = 20000;
    j->rc = gcomp__comm_create_loop(j->at.w, j->at.rank, &cfg, &comm);
    if (j->rc == GCOMP_SUCCESS) j->rc = gcomp_allreduce(comm, x, y, N, GCOMP_F32, GCOMP_AVG, 1, NULL);
    j->got = 0.0f;
    for (size_t i = 0; i < N && j->rc == GCOMP_SUCCESS; i++) { /* the largest error, relative to 2e38 */
        float e = isfinite(y[i]) ? fabsf(fabsf(y[i]) - 2e38f) / 2e38f : INFINITY;
        if (e > j->got) j->got = e;
    }
    if (j->rc == GCOMP_SUCCESS && gcomp_comm_stats_get(comm, &st) == GCOMP_SUCCESS) {
        j->nonfinite = st.nonfinite_calls;
        j->sched = st.last_schedule;
    }
    gcomp_comm_destroy(comm);
    free(x);
    free(y);
    return NULL;
}

static void test_avg_of_huge_inputs(void **state)
{
    (void)state;
    for (int bypass = 0; bypass <= 1; bypass++)
        for (int n = 2; n <= 5; n++) {
            huge_job jobs[MAX_RANKS];
            memset(jobs, 0, sizeof jobs);
            for (int r = 0; r < n; r++) jobs[r].bypass = bypass;
            loop_run_world(n, run_huge_avg, jobs, sizeof jobs[0]);
            for (int r = 0; r < n; r++) {
                assert_int_equal(jobs[r].rc, GCOMP_SUCCESS);
                assert_int_equal(jobs[r].sched, bypass       ? GCOMP_SCHED_BYPASS
                                                : n % 2 == 0 ? GCOMP_SCHED_DOUBLING
                                                             : GCOMP_SCHED_DENSE);
                if (!(jobs[r].got <= 1e-5f) || jobs[r].nonfinite != 0) /* none's bound: 1e-5 S / N */
                    fail_msg("%s at %d ranks, rank %d: relative error %g, %llu non-finite calls",
                             bypass ? "bypass" : "dense", n, r, (double)jobs[r].got,
                             (unsigned long long)jobs[r].nonfinite);
            }
        }
}

/* A call of count 0 moves nothing, but its agreement's messages go out: it counts in the
 * communicator's calls and wire bytes (and leaves last_schedule as it was), not in its key's
 * stats. Before, it counted nowhere. */
typedef struct empty_job {
    loop_rank at;
    gcomp_result rc, key_rc;
    gcomp_comm_stats first, second;
} empty_job;

static void *run_empty_calls(void *arg)
{
    empty_job *j = arg;
    gcomp_comm *c = loop_comm(&j->at, "fp16", &j->rc);
    gcomp_comm_stats ks;
    float x[100] = { 0 };
    if (j->rc == GCOMP_SUCCESS) j->rc = gcomp_allreduce(c, NULL, NULL, 0, GCOMP_F32, GCOMP_SUM, 2, NULL);
    if (j->rc == GCOMP_SUCCESS) j->rc = gcomp_comm_stats_get(c, &j->first);
    if (j->rc == GCOMP_SUCCESS) j->key_rc = gcomp_comm_key_stats_get(c, 2, &ks);
    if (j->rc == GCOMP_SUCCESS) j->rc = gcomp_allreduce(c, x, x, 100, GCOMP_F32, GCOMP_SUM, 3, NULL);
    if (j->rc == GCOMP_SUCCESS) j->rc = gcomp_allreduce(c, x, x, 0, GCOMP_F32, GCOMP_SUM, GCOMP_KEY_NONE, NULL);
    if (j->rc == GCOMP_SUCCESS) j->rc = gcomp_comm_stats_get(c, &j->second);
    gcomp_comm_destroy(c);
    return NULL;
}

static void test_empty_call_counted(void **state)
{
    (void)state;
    for (int n = 2; n <= MAX_RANKS; n++) {
        empty_job jobs[MAX_RANKS];
        memset(jobs, 0, sizeof jobs);
        loop_run_world(n, run_empty_calls, jobs, sizeof jobs[0]);
        for (int r = 0; r < n; r++) {
            const empty_job *j = &jobs[r];
            assert_int_equal(j->rc, GCOMP_SUCCESS);
            /* the agreement's own pass: N-1 messages of 160 bytes, log2 N on the butterfly at
             * 4, 8, ... ranks, then as many 16-byte outcome hops (gcomp.h, wire_bytes) */
            int msgs = gcomp__ring_butterfly_steps(n) ? gcomp__ring_butterfly_steps(n) : n - 1;
            if (j->first.calls != 1 || j->first.wire_bytes != 176u * (uint64_t)msgs || j->first.raw_bytes != 0 ||
                j->first.last_schedule != GCOMP_SCHED_NONE)
                fail_msg("%d ranks, rank %d: after an empty call: %llu calls, %llu wire bytes, schedule %s", n, r,
                         (unsigned long long)j->first.calls, (unsigned long long)j->first.wire_bytes,
                         gcomp_schedule_name(j->first.last_schedule));
            assert_int_equal(j->key_rc, GCOMP_ERR_INVALID_ARG); /* key 2 holds nothing */
            assert_int_equal(j->second.calls, 3);
            assert_int_equal(j->second.raw_bytes, 400);
            assert_int_not_equal(j->second.last_schedule, GCOMP_SCHED_NONE); /* the 100-element call's */
        }
    }
}

/* A checkpoint with records for an exact codec (saved before it kept no residual; made here
 * from an fp16 one whose spec is rewritten to "none", checksum redone: checkpoint.c's FNV-1a
 * is sc_hash) loads, and its records are dropped: the next save is a fresh communicator's,
 * and the key still works. */

typedef struct load_job {
    loop_rank at;
    gcomp_result rc;
    uint8_t *blob; /* the fp16 checkpoint, respecified as "none" */
    size_t bytes, fresh, after;
} load_job;

static void fill_exact(float *x, size_t n, int rank)
{
    for (size_t i = 0; i < n; i++) x[i] = 0.1f * (float)(i % 13) + (float)rank;
}

/* An fp16 communicator's checkpoint after one keyed call, respecified as "none". */
static void *run_lossy_save(void *arg)
{
    load_job *j = arg;
    gcomp_comm *c = loop_comm(&j->at, "fp16", &j->rc);
    size_t n = 20000;
    float *x = malloc(n * sizeof(float));
    fill_exact(x, n, j->at.rank);
    if (j->rc == GCOMP_SUCCESS) j->rc = gcomp_allreduce(c, x, x, n, GCOMP_F32, GCOMP_SUM, 7, NULL);
    if (j->rc == GCOMP_SUCCESS) j->rc = gcomp_comm_residuals_save(c, NULL, 0, &j->bytes);
    if (j->rc == GCOMP_SUCCESS && !(j->blob = malloc(j->bytes))) j->rc = GCOMP_ERR_NOMEM;
    if (j->rc == GCOMP_SUCCESS) j->rc = gcomp_comm_residuals_save(c, j->blob, j->bytes, &j->bytes);
    if (j->rc == GCOMP_SUCCESS && memcmp(j->blob + 28, "fp16", 4) != 0) j->rc = GCOMP_ERR_INTERNAL; /* the spec */
    if (j->rc == GCOMP_SUCCESS) {
        memcpy(j->blob + 28, "none", 4);
        gcomp_le_store_u64(j->blob + j->bytes - 8, sc_hash(SC_HASH_INIT, j->blob, j->bytes - 8));
    }
    gcomp_comm_destroy(c);
    free(x);
    return NULL;
}

static void *run_exact_load(void *arg)
{
    load_job *j = arg;
    gcomp_comm *c = loop_comm(&j->at, "none", &j->rc);
    size_t n = 20000;
    float *x = malloc(n * sizeof(float));
    fill_exact(x, n, j->at.rank);
    if (j->rc == GCOMP_SUCCESS) j->rc = gcomp_comm_residuals_save(c, NULL, 0, &j->fresh);
    if (j->rc == GCOMP_SUCCESS) j->rc = gcomp_comm_residuals_load(c, j->blob, j->bytes);
    if (j->rc == GCOMP_SUCCESS) j->rc = gcomp_comm_residuals_save(c, NULL, 0, &j->after);
    if (j->rc == GCOMP_SUCCESS) j->rc = gcomp_allreduce(c, x, x, n, GCOMP_F32, GCOMP_SUM, 7, NULL);
    if (j->rc == GCOMP_SUCCESS && x[12] != 1.2f + 1.2f + 1.0f) j->rc = GCOMP_ERR_INTERNAL; /* exact at 2 ranks */
    if (j->rc != GCOMP_SUCCESS) fprintf(stderr, "rank %d: %s\n", j->at.rank, gcomp_last_error());
    gcomp_comm_destroy(c);
    free(x);
    return NULL;
}

static void test_exact_codec_drops_loaded_residuals(void **state)
{
    load_job jobs[MAX_RANKS];
    (void)state;
    memset(jobs, 0, sizeof jobs);
    loop_run_world(2, run_lossy_save, jobs, sizeof jobs[0]);
    for (int r = 0; r < 2; r++) assert_int_equal(jobs[r].rc, GCOMP_SUCCESS);
    loop_run_world(2, run_exact_load, jobs, sizeof jobs[0]);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(jobs[r].rc, GCOMP_SUCCESS);
        assert_true(jobs[r].bytes > jobs[r].fresh + 20000 * sizeof(float)); /* the blob held the record */
        assert_int_equal(jobs[r].after, jobs[r].fresh);                     /* dropped */
        free(jobs[r].blob);
    }
}

/* ---- a load that runs out of memory halfway -------------------------------------------------
 * gcomp_comm_residuals_load is all or nothing, out of memory included: a blob whose first
 * record fits and whose second cannot be allocated (an address-space limit, RLIMIT_AS, set in a
 * child process just above what it uses) returns GCOMP_ERR_NOMEM and leaves the state byte for
 * byte as it was (it used to drop the old keys and keep the first new one). A one-rank loopback
 * communicator, whose state comes from loads alone (one rank bypasses). */
#define OOM_BIG ((size_t)16 << 20) /* elements of the record that cannot be had: 64 MB, twice */

/* A blob for c: its header (from a save of c) and records (key, count, step 3, elements
 * 0.5), checksummed; NULL on failure. */
static uint8_t *oom_blob(gcomp_comm *c, const uint64_t *keys, const size_t *counts, int n, size_t *bytes)
{
    size_t head = 0, pos;
    uint8_t *empty = NULL, *b;
    if (gcomp_comm_residuals_save(c, NULL, 0, &head) != GCOMP_SUCCESS || !(empty = malloc(head))) return NULL;
    if (gcomp_comm_residuals_save(c, empty, head, &head) != GCOMP_SUCCESS) return free(empty), NULL;
    pos = head - 16; /* before n_keys (0 keys) and the checksum */
    *bytes = pos + 8 + 8;
    for (int i = 0; i < n; i++) *bytes += 24 + counts[i] * sizeof(float);
    if ((b = malloc(*bytes))) {
        memcpy(b, empty, pos);
        gcomp_le_store_u64(b + pos, (uint64_t)n);
        pos += 8;
        for (int i = 0; i < n; i++) {
            gcomp_le_store_u64(b + pos, keys[i]);
            gcomp_le_store_u64(b + pos + 8, counts[i]);
            gcomp_le_store_u64(b + pos + 16, 3);
            for (size_t e = 0; e < counts[i]; e++) gcomp_le_store_u32(b + pos + 24 + 4 * e, 0x3f000000u);
            pos += 24 + counts[i] * sizeof(float);
        }
        gcomp_le_store_u64(b + pos, sc_hash(SC_HASH_INIT, b, pos));
    }
    free(empty);
    return b;
}

/* The state of c as a hash of its checkpoint (0 on failure). */
static uint64_t oom_state(gcomp_comm *c)
{
    size_t bytes = 0;
    uint8_t *b;
    uint64_t h = 0;
    if (gcomp_comm_residuals_save(c, NULL, 0, &bytes) != GCOMP_SUCCESS || !(b = malloc(bytes))) return 0;
    if (gcomp_comm_residuals_save(c, b, bytes, &bytes) == GCOMP_SUCCESS) h = sc_hash(SC_HASH_INIT, b, bytes);
    free(b);
    return h;
}

/* Limit the address space to what the process maps now plus margin bytes. */
static int oom_limit(size_t margin)
{
    long pages = 0;
    struct rlimit rl;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f || fscanf(f, "%ld", &pages) != 1) return f ? fclose(f), -1 : -1;
    fclose(f);
    if (getrlimit(RLIMIT_AS, &rl) != 0) return -1;
    rl.rlim_cur = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + margin;
    return setrlimit(RLIMIT_AS, &rl);
}

static void oom_unlimit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_AS, &rl);
    }
}

/* What failed in the child, by its exit status. */
static const char *const oom_steps[] = {
    "",
    "create",
    "the blobs or the first load",
    "setrlimit",
    "the load did not fail with GCOMP_ERR_NOMEM",
    "the failed load changed the state",
    "the load with the memory failed",
    "the load with the memory changed nothing",
};

/* The child's whole run: 0 when the failed load changed nothing, else the step that failed. */
static int oom_child(void)
{
    static const uint64_t old_key[] = { 1 }, new_keys[] = { 5, 6 };
    const size_t old_count[] = { 10 }, new_counts[] = { 10, OOM_BIG };
    gcomp__loop_world *w = NULL;
    gcomp_comm *c = NULL;
    gcomp_config cfg = gcomp_config_default();
    uint8_t *old_blob, *new_blob;
    size_t old_bytes = 0, new_bytes = 0;
    uint64_t before;
    gcomp_result rc;
    cfg.codec = "fp16";
    cfg.timeout_ms = 20000;
    if (gcomp__loop_world_create(1, &w) != GCOMP_SUCCESS || gcomp__comm_create_loop(w, 0, &cfg, &c) != GCOMP_SUCCESS)
        return 1;
    old_blob = oom_blob(c, old_key, old_count, 1, &old_bytes);
    new_blob = oom_blob(c, new_keys, new_counts, 2, &new_bytes);
    if (!old_blob || !new_blob || gcomp_comm_residuals_load(c, old_blob, old_bytes) != GCOMP_SUCCESS) return 2;
    before = oom_state(c);
    if (oom_limit((size_t)32 << 20) != 0) return 3;
    rc = gcomp_comm_residuals_load(c, new_blob, new_bytes);
    oom_unlimit();
    if (rc != GCOMP_ERR_NOMEM) return fprintf(stderr, "load: %s (%s)\n", gcomp_result_name(rc), gcomp_last_error()), 4;
    if (!before || oom_state(c) != before) return 5;
    if (gcomp_comm_residuals_load(c, new_blob, new_bytes) != GCOMP_SUCCESS) return 6; /* with the memory: loads */
    if (oom_state(c) == before) return 7;
    gcomp_comm_destroy(c);
    gcomp__loop_world_destroy(w);
    free(old_blob);
    free(new_blob);
    return 0;
}

static void test_load_out_of_memory_changes_nothing(void **state)
{
    pid_t pid;
    int status = 0;
    (void)state;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    /* the sanitizers reserve terabytes of address space and allocate outside malloc's way */
    skip();
#endif
    fflush(NULL);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(oom_child());
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
        fail_msg("child status %#x: %s", status, code > 0 && code < 8 ? oom_steps[code] : "crashed");
    }
}

/* Communicators one after another over one world (the world counts each rank's collectives
 * across them: the second creation timed out), and a rank whose creation fails on a NULL out
 * (it still joins: the others failed only at their deadline). */
static void *run_successive(void *arg)
{
    rank_job *j = arg;
    gcomp_config cfg = gcomp_config_default();
    float x[64], y[64];
    cfg.codec = "fp16";
    cfg.min_bytes = 0;
    cfg.timeout_ms = 20000;
    for (int i = 0; i < 64; i++) x[i] = (float)(i + j->at.rank);
    j->rc = GCOMP_SUCCESS;
    for (int round = 0; round < 3 && j->rc == GCOMP_SUCCESS; round++) {
        gcomp_comm *c = NULL;
        j->rc = gcomp__comm_create_loop(j->at.w, j->at.rank, &cfg, &c);
        if (j->rc == GCOMP_SUCCESS) j->rc = gcomp_allreduce(c, x, y, 64, GCOMP_F32, GCOMP_SUM, 1, NULL);
        if (j->rc == GCOMP_SUCCESS && y[5] != (float)(5 * j->at.size + j->at.size * (j->at.size - 1) / 2))
            j->rc = GCOMP_ERR_INTERNAL;
        gcomp_comm_destroy(c);
    }
    if (j->rc == GCOMP_SUCCESS) { /* then a creation with a NULL out on rank 1 */
        gcomp_comm *c = NULL;
        double t0 = gcomp__now();
        j->rc = gcomp__comm_create_loop(j->at.w, j->at.rank, &cfg, j->at.rank == 1 ? NULL : &c);
        if (j->rc != GCOMP_ERR_INVALID_ARG || c != NULL || gcomp__now() - t0 > 10.0)
            j->rc = GCOMP_ERR_INTERNAL;
        else
            j->rc = GCOMP_SUCCESS;
        gcomp_comm_destroy(c);
    }
    return NULL;
}

/* Many ranks, counts whose last chunk is the largest: every chunk start is rounded down to
 * the schedule's alignment (64 elements for the dense ring, the bucket for the integer ring),
 * so the last chunk holds up to N - 1 + align - 1 elements more than count / N. Its buffers
 * were sized for count / N + 2 align: at 68 ranks the dense ring refused every such call on
 * every rank (GCOMP_ERR_BUFFER_TOO_SMALL), and at 8 ranks TernGrad with 4-element buckets
 * overran its regions (one rank GCOMP_ERR_TRANSPORT, the others GCOMP_ERR_TIMEOUT). Every
 * rank must succeed with the same result, near the exact sum. */
typedef struct wide_job {
    loop_rank at;
    const char *spec;
    size_t count, min_bytes;
    gcomp_result rc;
    uint64_t hash;
    double err; /* max |result - exact sum| / max |exact sum| */
} wide_job;

static void *run_wide(void *arg)
{
    wide_job *j = arg;
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *comm = NULL;
    float *x = malloc(j->count * sizeof *x), *y = malloc(j->count * sizeof *y);
    double peak = 0;
    cfg.codec = j->spec;
    cfg.min_bytes = j->min_bytes;
    cfg.timeout_ms = 60000;
    j->rc = GCOMP_ERR_NOMEM;
    if (x && y) {
        for (size_t i = 0; i < j->count; i++) x[i] = (float)((i * 7 + (size_t)j->at.rank * 13) % 29) - 14.0f;
        j->rc = gcomp__comm_create_loop(j->at.w, j->at.rank, &cfg, &comm);
    }
    if (j->rc == GCOMP_SUCCESS) j->rc = gcomp_allreduce(comm, x, y, j->count, GCOMP_F32, GCOMP_SUM, 1, NULL);
    if (j->rc == GCOMP_SUCCESS) {
        j->hash = SC_HASH_INIT;
        for (size_t i = 0; i < j->count; i++) {
            double exact = 0;
            for (int r = 0; r < j->at.size; r++) exact += (double)((i * 7 + (size_t)r * 13) % 29) - 14.0;
            if (fabs(exact) > peak) peak = fabs(exact);
            if (fabs(y[i] - exact) > j->err) j->err = fabs(y[i] - exact);
        }
        j->err /= peak > 0 ? peak : 1;
        j->hash = sc_hash(j->hash, y, j->count * sizeof *y);
    } else {
        fprintf(stderr, "rank %d: %s\n", j->at.rank, gcomp_last_error());
    }
    gcomp_comm_destroy(comm);
    free(x);
    free(y);
    return NULL;
}

static void test_last_chunk_at_many_ranks(void **state)
{
    static const struct {
        int n;
        const char *spec;
        size_t count, min_bytes;
        double tol; /* of the relative error (lossy codecs: finite only) */
    } cases[] = {
        { 68, "none", 18903, 65536, 1e-6 },           /* dense ring, default min_bytes */
        { 70, "fp16", 17077, 65536, 1e-2 },           /* dense ring */
        { 8, "terngrad:bucket=4", 142, 0, INFINITY }, /* integer ring */
        { 10, "terngrad:bucket=4", 29, 0, INFINITY }, /* integer ring */
        { 9, "topk:ratio=0.5", 1000, 0, INFINITY },   /* top-k */
    };
    (void)state;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int n = cases[k].n;
        wide_job *jobs = calloc((size_t)n, sizeof *jobs);
        assert_non_null(jobs);
        for (int r = 0; r < n; r++) {
            jobs[r].spec = cases[k].spec;
            jobs[r].count = cases[k].count;
            jobs[r].min_bytes = cases[k].min_bytes;
        }
        loop_run_world(n, run_wide, jobs, sizeof jobs[0]);
        for (int r = 0; r < n; r++) {
            if (jobs[r].rc != GCOMP_SUCCESS)
                fail_msg("%d ranks, %s, count %zu: rank %d returned %s", n, cases[k].spec, cases[k].count, r,
                         gcomp_result_name(jobs[r].rc));
            if (jobs[r].hash != jobs[0].hash)
                fail_msg("%d ranks, %s, count %zu: rank %d's result differs from rank 0's", n, cases[k].spec,
                         cases[k].count, r);
            if (!(jobs[r].err <= cases[k].tol))
                fail_msg("%d ranks, %s, count %zu: relative error %g above %g", n, cases[k].spec, cases[k].count,
                         jobs[r].err, cases[k].tol);
        }
        free(jobs);
    }
}

static void test_successive_comms_and_null_out(void **state)
{
    (void)state;
    expect_every_rank(run_successive, GCOMP_SUCCESS, "three communicators in turn, then a NULL out on rank 1");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_schedule),
        cmocka_unit_test(test_collectives_per_call),
        cmocka_unit_test(test_doubling_limit),
        cmocka_unit_test(test_key_none_keeps_no_residual),
        cmocka_unit_test(test_exact_codec_keeps_no_residual),
        cmocka_unit_test(test_exact_codec_drops_loaded_residuals),
        cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_disagreeing_plans),
        cmocka_unit_test(test_refused_call_writes_nothing),
        cmocka_unit_test(test_protocol_mismatch),
        cmocka_unit_test(test_local_failure_after_agreement),
        cmocka_unit_test(test_stopped_peer_times_out),
        cmocka_unit_test(test_truncated_message),
        cmocka_unit_test(test_avg_of_huge_inputs),
        cmocka_unit_test(test_empty_call_counted),
        cmocka_unit_test(test_load_out_of_memory_changes_nothing),
        cmocka_unit_test(test_successive_comms_and_null_out),
        cmocka_unit_test(test_last_chunk_at_many_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
