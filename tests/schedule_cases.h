/*
 * schedule_cases.h — one allreduce case per schedule, shared by the loopback-transport test
 * (test_loop.c, 1 to 8 thread-ranks) and the MPI test (test_mpi_allreduce.c, 2 to 5 ranks
 * under mpirun). Both hash every rank's results over a few steps (error feedback on) and
 * compare with the checked-in table of tests/golden/schedules_expected.h, so a schedule gives
 * the same bits over threads and over real MPI ranks.
 */
#ifndef GCOMP_TEST_SCHEDULE_CASES_H
#define GCOMP_TEST_SCHEDULE_CASES_H

#include <stddef.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "gcomp.h"

typedef struct schedule_case {
    const char *name; /* the table key */
    const char *spec;
    size_t count;
    gcomp_op op;
    int64_t min_bytes;
    int integer_input;    /* inputs are small integers: every sum order gives the same bits */
    const char *schedule; /* gcomp_schedule_name of what runs at 3 ranks and more */
    const char *pow2;     /* ... and at 4 and 8 ranks, when it differs (NULL: the same) */
    const char *pair;     /* ... and at 2 ranks, when it differs (NULL: the same) */
} schedule_case;

#define SCHEDULE_STEPS 3

static const schedule_case schedule_cases[] = {
    /* recursive doubling at 2 ranks (every size: one exchange) and, small calls, at 4 and 8 */
    { "dense_fp16", "fp16", 10007, GCOMP_SUM, 0, 0, "dense-ring", "dense-doubling", "dense-doubling" },
    { "dense_none_avg", "none", 4099, GCOMP_AVG, 0, 0, "dense-ring", "dense-doubling", "dense-doubling" },
    /* above recursive doubling's limit: the dense ring at every rank count but 2 */
    { "dense_fp16_ring", "fp16", 40009, GCOMP_AVG, 0, 0, "dense-ring", NULL, "dense-doubling" },
    { "integer_terngrad_avg", "terngrad", 10007, GCOMP_AVG, 0, 0, "integer-ring", NULL, NULL },
    { "integer_terngrad_bucket", "terngrad:bucket=512", 5003, GCOMP_SUM, 0, 0, "integer-ring", NULL, NULL },
    { "sparse_topk", "topk:ratio=0.01", 10007, GCOMP_SUM, 0, 0, "sparse-gather", NULL, NULL },
    { "sparse_as_dense_topk", "topk:ratio=1", 3001, GCOMP_SUM, 0, 0, "sparse-as-dense-ring", NULL, NULL },
    { "bypass_small", "terngrad", 1000, GCOMP_SUM, 65536, 1, "bypass", NULL, NULL },
};
#define SCHEDULE_N_CASES (sizeof schedule_cases / sizeof schedule_cases[0])

/* What case c runs at n ranks (one rank bypasses: the tests do not set the one-rank switch). */
static inline const char *sc_schedule_at(const schedule_case *c, int n)
{
    if (n == 1) return "bypass";
    if (c->pair && n == 2) return c->pair;
    if (c->pow2 && n >= 4 && (n & (n - 1)) == 0) return c->pow2;
    return c->schedule;
}

static inline uint64_t sc_splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The input of rank r at step t: Gaussian-ish floats, or small integers. */
static inline void sc_fill(const schedule_case *c, float *x, int r, int t)
{
    uint64_t s = 1000003ull * (uint64_t)r + 7919ull * (uint64_t)t + 17;
    for (size_t i = 0; i < c->count; i++) {
        if (c->integer_input) {
            x[i] = (float)((int)(sc_splitmix(&s) % 201) - 100);
        } else {
            double u = 0;
            for (int k = 0; k < 4; k++) u += (double)(sc_splitmix(&s) >> 11) * 0x1p-53;
            x[i] = (float)((u - 2.0) * 1.7);
        }
    }
}

static inline uint64_t sc_hash(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = (const uint8_t *)p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

#define SC_HASH_INIT 0xcbf29ce484222325ull

/* The configuration every run of a case uses. */
static inline gcomp_config sc_config(const schedule_case *c)
{
    gcomp_config cfg = gcomp_config_default();
    cfg.codec = c->spec;
    cfg.min_bytes = c->min_bytes;
    cfg.seed = 7;
    return cfg;
}

/* SCHEDULE_STEPS calls of case c on comm as rank `rank`, key 42; *hash: of every result.
 * Returns the first failure (the later steps are skipped). */
static inline gcomp_result sc_run_steps(gcomp_comm *comm, const schedule_case *c, int rank, uint64_t *hash)
{
    float *x = (float *)malloc(c->count * sizeof(float)), *y = (float *)malloc(c->count * sizeof(float));
    gcomp_result rc = x && y ? GCOMP_SUCCESS : GCOMP_ERR_NOMEM;
    *hash = SC_HASH_INIT;
    for (int t = 0; t < SCHEDULE_STEPS && rc == GCOMP_SUCCESS; t++) {
        sc_fill(c, x, rank, t);
        rc = gcomp_allreduce(comm, x, y, c->count, GCOMP_F32, c->op, 42, NULL);
        *hash = sc_hash(*hash, y, c->count * sizeof(float));
    }
    free(x);
    free(y);
    return rc;
}

#endif
