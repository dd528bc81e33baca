/*
 * test_mpi_faults.c — faults and misuse under real Open MPI ranks; every case asserts the
 * documented outcome on every rank. Modes:
 *   (default)  injected allocation failure, a truncated message on the wire, edge values,
 *              ranks that disagree on min_bytes or plan different calls, the transport's
 *              any-size receive, mismatched collectives inside the
 *              transport, a failure at creation on one rank, an intercommunicator
 *              (even sizes), creation after MPI_Finalize
 *   --stop     one rank is stopped (SIGSTOP) mid-run: the others time out, then refuse;
 *              destroy, MPI_Barrier and MPI_Finalize follow when the late rank arrives;
 *              one rank comes 3 s late to a creation with a 1 s deadline; one rank
 *              misses a creation, and the next ones work on every rank
 *   --kill     one rank is killed: the job must end non-zero (checked by the ctest wrapper)
 *   --2gib     real messages past 2 GiB through the transport (about 4.3 GB per rank)
 */
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mpi.h>

#include "gcomp.h"
#include "gcomp_mpi.h"
#include "mpi_test_util.h"
#include "src/comm.h"

static gcomp_comm *make_comm(const char *spec, int64_t timeout_ms)
{
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *c = NULL;
    cfg.codec = spec;
    cfg.min_bytes = 0;
    cfg.timeout_ms = timeout_ms;
    CHECK(gcomp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c) == GCOMP_SUCCESS, "create %s: %s", spec, gcomp_last_error());
    return c;
}

static void fill(float *x, size_t n, float v)
{
    for (size_t i = 0; i < n; i++) x[i] = v * (float)((i * 7 + (size_t)rank) % 13) / 13.0f;
}

static const char *const specs[] = { "fp16",           "terngrad", "terngrad+zstd", "topk:ratio=0.01",
                                     "topk:ratio=0.6", "none+zstd" };
#define N_SPECS (sizeof specs / sizeof specs[0])

/* One rank's allocation fails: every rank returns an error, and the next call works. */
static void test_alloc_failure(void)
{
    enum {
        N = 50000
    };
    static float x[N], y[N];
    for (size_t s = 0; s < N_SPECS; s++) {
        gcomp_comm *c = make_comm(specs[s], 60000);
        gcomp_result rc;
        fill(x, N, 1.0f);
        if (rank == size - 1) gcomp__comm_inject_fault(c, GCOMP__FAULT_ALLOC);
        rc = gcomp_allreduce(c, x, y, N, GCOMP_F32, GCOMP_SUM, 1, NULL);
        CHECK(all_ranks(rc == GCOMP_ERR_NOMEM), "%s: allocation failure on one rank -> %s", specs[s],
              gcomp_result_name(rc));
        if (rank != size - 1) { /* the others are told which rank failed, and that it ran out of memory */
            char want[64];
            snprintf(want, sizeof want, "rank %d failed", size - 1);
            CHECK(strstr(gcomp_last_error(), want) && strstr(gcomp_last_error(), "out of memory"),
                  "%s: the message does not name rank %d and out-of-memory: %s", specs[s], size - 1,
                  gcomp_last_error());
        }
        rc = gcomp_allreduce(c, x, y, N, GCOMP_F32, GCOMP_SUM, 1, NULL);
        CHECK(all_ranks(rc == GCOMP_SUCCESS), "%s: the call after an allocation failure -> %s", specs[s],
              gcomp_result_name(rc));
        gcomp_comm_destroy(c);
    }
}

/* One rank's message loses its last byte on the wire: every rank returns CORRUPT (never a
 * crash or a silently wrong result), and the communicator keeps working. */
static void test_truncated_wire(void)
{
    enum {
        N = 50000
    };
    static float x[N], y[N];
    for (size_t s = 0; s < N_SPECS; s++) {
        gcomp_comm *c = make_comm(specs[s], 60000);
        gcomp_result rc;
        fill(x, N, 1.0f);
        if (rank == 0) gcomp__comm_inject_fault(c, GCOMP__FAULT_TRUNCATE_WIRE);
        rc = gcomp_allreduce(c, x, y, N, GCOMP_F32, GCOMP_SUM, 1, NULL);
        CHECK(all_ranks(rc == GCOMP_ERR_CORRUPT), "%s: truncated message -> %s (%s)", specs[s], gcomp_result_name(rc),
              gcomp_last_error());
        rc = gcomp_allreduce(c, x, y, N, GCOMP_F32, GCOMP_SUM, 1, NULL);
        CHECK(all_ranks(rc == GCOMP_SUCCESS), "%s: the call after a corrupt one -> %s", specs[s],
              gcomp_result_name(rc));
        gcomp_comm_destroy(c);
    }
}

/* All-zero tensors give exact zeros; fp16 sums past its range are +inf everywhere (and
 * counted) where partial sums travel in fp16 (3 ranks or more; at 2 the fp32 sum is exact); top-k of all-equal values keeps the lowest indices. */
static void test_edge_values(void)
{
    enum {
        N = 40000
    };
    static float x[N], y[N];
    gcomp_comm_stats st;
    for (size_t s = 0; s < N_SPECS; s++) {
        gcomp_comm *c = make_comm(specs[s], 60000);
        int zero = 1;
        memset(x, 0, sizeof x);
        CHECK(gcomp_allreduce(c, x, y, N, GCOMP_F32, GCOMP_SUM, 2, NULL) == GCOMP_SUCCESS, "%s: zeros", specs[s]);
        for (int i = 0; i < N; i++) zero &= y[i] == 0.0f;
        CHECK(all_ranks(zero), "%s: all-zero input does not give zeros", specs[s]);
        gcomp_comm_destroy(c);
    }
    {
        gcomp_comm *c = make_comm("fp16", 60000);
        int inf = 1, ok;
        for (int i = 0; i < N; i++) x[i] = 60000.0f;
        ok = gcomp_allreduce(c, x, y, N, GCOMP_F32, GCOMP_SUM, 3, NULL) == GCOMP_SUCCESS;
        gcomp_comm_stats_get(c, &st);
        if (size == 2) { /* no sum travels at 2 ranks (recursive doubling): 120000 in fp32 */
            for (int i = 0; i < N; i++) ok &= y[i] == 120000.0f;
            CHECK(all_ranks(ok && st.overflow_count == 0), "fp16 at 2 ranks: 60000 + 60000 is not 120000");
        } else {
            for (int i = 0; i < N; i++) inf &= isinf(y[i]) && y[i] > 0;
            CHECK(all_ranks(ok && inf && st.overflow_count > 0), "fp16: a sum past 65504 is not +inf everywhere");
        }
        /* AVG pre-scales by 1/N: the same values average without overflow */
        ok = gcomp_allreduce(c, x, y, N, GCOMP_F32, GCOMP_AVG, 4, NULL) == GCOMP_SUCCESS;
        for (int i = 0; i < N; i++) ok &= fabsf(y[i] - 60000.0f) <= 64.0f;
        CHECK(all_ranks(ok), "fp16: AVG of 60000 is not 60000 (+-1 ulp)");
        /* ... but each scaled input is rounded to fp16 before the sum: 65504 / N rounds up at
         * 3 ranks (21840) and 5 (13104), and N of them sum to 65520, which rounds to +inf;
         * at 2 and 4 ranks 65504 / N is exact (documented in gcomp.h and RELIABILITY.md) */
        {
            const int rounds_up = size == 3 || size == 5;
            uint64_t before = st.nonfinite_calls;
            for (int i = 0; i < N; i++) x[i] = 65504.0f;
            ok = gcomp_allreduce(c, x, y, N, GCOMP_F32, GCOMP_AVG, 5, NULL) == GCOMP_SUCCESS;
            gcomp_comm_stats_get(c, &st);
            for (int i = 0; i < N; i++) ok &= rounds_up ? isinf(y[i]) && y[i] > 0 : y[i] == 65504.0f;
            ok &= st.nonfinite_calls == before + (uint64_t)rounds_up;
            CHECK(all_ranks(ok), "fp16: AVG of 65504 at %d ranks is not %s", size,
                  rounds_up ? "+inf, counted" : "65504");
        }
        gcomp_comm_destroy(c);
    }
    {
        /* bf16's subnormals are 2^-133 apart: below that no relative bound holds (2^-135 on
         * every rank at 2 ranks rounds to 0), so gcomp.h's bf16 bound has (N+1) 2^-133 */
        gcomp_comm *c = make_comm("bf16", 60000);
        const float v = 0x1p-135f, exact = (float)size * 0x1p-135f;
        const double bound = (size + 1) * (8e-3 * size * 0x1p-135 + 0x1p-133);
        int ok;
        for (int i = 0; i < N; i++) x[i] = v;
        ok = gcomp_allreduce(c, x, y, N, GCOMP_F32, GCOMP_SUM, 7, NULL) == GCOMP_SUCCESS;
        for (int i = 0; i < N; i++) ok &= fabs((double)y[i] - exact) <= bound;
        CHECK(all_ranks(ok), "bf16: a sum of subnormals (2^-135 on each rank) is %g, outside gcomp.h's bound", y[0]);
        gcomp_comm_destroy(c);
    }
    {
        /* TernGrad's fp32 result is finite whenever its scale times N is (the engine then
         * skips its pass over the result); a narrowed one can still overflow: 40000 in fp16
         * (0x78e2) ternarises to +1 at scale 40000 on every rank, so the sum is N * 40000 */
        static uint16_t h[N], hy[N];
        gcomp_comm *c = make_comm("terngrad", 60000);
        int ok, inf = 1;
        for (int i = 0; i < N; i++) x[i] = 1.0f;
        ok = gcomp_allreduce(c, x, y, N, GCOMP_F32, GCOMP_SUM, 6, NULL) == GCOMP_SUCCESS;
        for (int i = 0; i < N; i++) ok &= y[i] == (float)size;
        gcomp_comm_stats_get(c, &st);
        CHECK(all_ranks(ok && st.nonfinite_calls == 0), "terngrad: ones do not sum to N as a finite call");
        for (int i = 0; i < N; i++) h[i] = 0x78e2;
        ok = gcomp_allreduce(c, h, hy, N, GCOMP_F16, GCOMP_SUM, 7, NULL) == GCOMP_SUCCESS;
        for (int i = 0; i < N; i++) inf &= hy[i] == 0x7c00;
        gcomp_comm_stats_get(c, &st);
        CHECK(all_ranks(ok && inf && st.nonfinite_calls == 1), "terngrad: an fp16 sum past 65504 is not +inf, "
                                                                "counted as a non-finite call, everywhere");
        gcomp_comm_destroy(c);
    }
    {
        gcomp_comm *c = make_comm("topk:k=100", 60000);
        int ok;
        for (int i = 0; i < N; i++) x[i] = 1.0f;
        ok = gcomp_allreduce(c, x, y, N, GCOMP_F32, GCOMP_SUM, 5, NULL) == GCOMP_SUCCESS;
        for (int i = 0; i < N; i++) ok &= y[i] == (i < 100 ? (float)size : 0.0f);
        CHECK(all_ranks(ok), "topk: all-equal values do not keep the lowest indices");
        gcomp_comm_destroy(c);
    }
}

/* Ranks configured with different min_bytes: one would compress while the others bypass
 * (before the fix: TernGrad aborted the whole job with MPI_ERR_TRUNCATE, the other codecs
 * timed out). Now GCOMP_ERR_MISMATCH on every rank at once, naming min_bytes. */
static void test_min_bytes_mismatch(void)
{
    enum {
        N = 20000
    };
    static float x[N], y[N];
    const char *spec[] = { "terngrad", "none", "topk:ratio=0.01", "fp16+zstd" };
    fill(x, N, 1.0f);
    for (size_t s = 0; s < sizeof spec / sizeof spec[0]; s++) {
        gcomp_config cfg = gcomp_config_default();
        gcomp_comm *c = NULL;
        gcomp_result rc;
        double t0;
        cfg.codec = spec[s];
        cfg.min_bytes = rank == 0 ? 0 : 1 << 20; /* as if GCOMP_MIN_BYTES=0 on one node */
        cfg.timeout_ms = 20000;
        CHECK(gcomp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c) == GCOMP_SUCCESS, "create %s: %s", spec[s],
              gcomp_last_error());
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        rc = gcomp_allreduce(c, x, y, N, GCOMP_F32, GCOMP_SUM, 1, NULL);
        CHECK(all_ranks(rc == GCOMP_ERR_MISMATCH), "%s: different min_bytes -> %s (%s)", spec[s], gcomp_result_name(rc),
              gcomp_last_error());
        CHECK(MPI_Wtime() - t0 < 1.0, "%s: the mismatch took %.2f s", spec[s], MPI_Wtime() - t0);
        CHECK(strstr(gcomp_last_error(), "call's min_bytes (lowest 0, highest 1048576) (this rank:"),
              "%s: the message does not say min_bytes (alone) differs: %s", spec[s], gcomp_last_error());
        gcomp_comm_destroy(c);
    }
}

/* Ranks that planned different calls (rank 1 differs): the ranks agree in the ring's first
 * N-1 messages, which MPI receives at any size (MPI_Improbe), so a larger ring, a bypass, an
 * empty call or a failed argument check on rank 1 gives the same error on every rank at once
 * -- no MPI_ERR_TRUNCATE, no wait for the deadline -- and the next call works (no message
 * was left behind to be matched by it). */
static void test_disagreeing_plans(void)
{
    enum {
        N = 20000,
        BIG = 600000
    };
    static const struct {
        const char *spec;
        size_t count1; /* rank 1's count */
        gcomp_dtype dtype1;
        int null1; /* rank 1 passes recv = NULL */
        gcomp_result want;
    } cases[] = {
        { "fp16", BIG, GCOMP_F32, 0, GCOMP_ERR_MISMATCH },   { "fp16", 100, GCOMP_F32, 0, GCOMP_ERR_MISMATCH },
        { "fp16", 0, GCOMP_F32, 0, GCOMP_ERR_MISMATCH },     { "fp16", N, GCOMP_BF16, 0, GCOMP_ERR_MISMATCH },
        { "fp16", N, GCOMP_F32, 1, GCOMP_ERR_INVALID_ARG },  { "none", N + 1, GCOMP_F32, 0, GCOMP_ERR_MISMATCH },
        { "topk:ratio=0.01", 2000, GCOMP_F32, 0, GCOMP_ERR_MISMATCH },
        { "topk:ratio=0.01", BIG, GCOMP_F32, 0, GCOMP_ERR_MISMATCH },
    };
    static float x[BIG], y[BIG];
    fill(x, BIG, 1.0f);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        gcomp_config cfg = gcomp_config_default();
        gcomp_comm *c = NULL;
        gcomp_result rc, again;
        double t0;
        int one = rank == 1;
        cfg.codec = cases[k].spec;
        cfg.min_bytes = 4096;
        cfg.timeout_ms = 20000;
        CHECK(gcomp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c) == GCOMP_SUCCESS, "create %s: %s", cases[k].spec,
              gcomp_last_error());
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        rc = gcomp_allreduce(c, x, one && cases[k].null1 ? NULL : y, one ? cases[k].count1 : N,
                             one ? cases[k].dtype1 : GCOMP_F32, GCOMP_SUM, 1, NULL);
        CHECK(all_ranks(rc == cases[k].want), "%s, rank 1 count %zu dtype %d%s -> %s (%s), expected %s", cases[k].spec,
              cases[k].count1, (int)cases[k].dtype1, cases[k].null1 ? " recv NULL" : "", gcomp_result_name(rc),
              gcomp_last_error(), gcomp_result_name(cases[k].want));
        CHECK(MPI_Wtime() - t0 < 10.0, "%s: the disagreement took %.2f s", cases[k].spec, MPI_Wtime() - t0);
        again = gcomp_allreduce(c, x, y, N, GCOMP_F32, GCOMP_SUM, 1, NULL);
        CHECK(all_ranks(again == GCOMP_SUCCESS), "%s: the call after the disagreement -> %s (%s)", cases[k].spec,
              gcomp_result_name(again), gcomp_last_error());
        gcomp_comm_destroy(c);
    }
}

/* The MPI transport's any-size receive (transport.h, start_sendrecv_any), on its own: each rank
 * sends its right neighbour messages of 0 bytes, exactly the receive's capacity, one byte
 * more and 1000 times more; the receiver learns each message's whole length, holds a message
 * that fits whole and the last `cap` bytes of a longer one, and nothing is left over (a
 * normal exchange follows and matches its own message). */
static void test_any_size_receive(void)
{
    enum {
        CAP = 64
    };
    static const size_t sizes[] = { 0, CAP, CAP + 1, 1000 * CAP };
    static uint8_t sbuf[1000 * CAP], rbuf[CAP];
    gcomp_comm *c = make_comm("none", 20000);
    gcomp__transport *tp;
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    if (!c) return;
    tp = c->tp;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t got = 0, have;
        int ok = 1;
        for (size_t i = 0; i < sizes[k]; i++) sbuf[i] = (uint8_t)(i * 7 + (size_t)rank);
        memset(rbuf, 0xee, sizeof rbuf);
        CHECK(tp->start_sendrecv_any(tp, right, sbuf, sizes[k], left, rbuf, CAP) == GCOMP_SUCCESS &&
                  tp->finish_sendrecv(tp, &got, gcomp__now() + 10.0) == GCOMP_SUCCESS,
              "any-size exchange of %zu bytes: %s", sizes[k], gcomp_last_error());
        CHECK(got == sizes[k], "any-size receive of %zu bytes reported %zu", sizes[k], got);
        have = sizes[k] < CAP ? sizes[k] : CAP; /* the message's last `have` bytes */
        for (size_t i = 0; i < have; i++)
            ok &= rbuf[i] == (uint8_t)((sizes[k] - have + i) * 7 + (size_t)left);
        for (size_t i = have; i < CAP; i++) ok &= rbuf[i] == 0xee;
        CHECK(ok, "any-size receive of %zu bytes into %d: wrong bytes", sizes[k], (int)CAP);
    }
    {
        size_t got = 0;
        sbuf[0] = (uint8_t)rank;
        CHECK(tp->start_sendrecv(tp, right, sbuf, 1, left, rbuf, CAP) == GCOMP_SUCCESS &&
                  tp->finish_sendrecv(tp, &got, gcomp__now() + 10.0) == GCOMP_SUCCESS && got == 1 &&
                  rbuf[0] == (uint8_t)left,
              "the exchange after the any-size ones: %s", gcomp_last_error());
    }
    gcomp_comm_destroy(c);
}

/* Messages and collectives past the MPI transport's count limit (INT_MAX, lowered here to 1000
 * so that small buffers cross it: transport.h): the ring's messages go as derived datatypes
 * (fixed and any-size receives), the bypass's MPI_Iallreduce in pieces, and every call gives
 * the result the same calls give under the normal limit, bit for bit. Before, a message past
 * 2 GiB was GCOMP_ERR_UNSUPPORTED on the rank that sent it (and not always on the others). */
static void test_long_messages(void)
{
    enum {
        N = 30011,
        CALLS = 3
    };
    static const char *const long_specs[] = { "none",           "fp16",           "bf16",      "terngrad",
                                              "topk:ratio=0.1", "topk:ratio=0.6", "none+zstd", "terngrad+zstd" };
    enum {
        N_LONG = sizeof long_specs / sizeof long_specs[0]
    };
    static float x[N], y[N], ref[N_LONG + 1][CALLS][N];
    for (int lowered = 0; lowered <= 1; lowered++) {
        gcomp__mpi_max_count = lowered ? 1000 : INT_MAX;
        for (size_t s = 0; s <= N_LONG; s++) {
            gcomp_config cfg = gcomp_config_default();
            gcomp_comm *c = NULL;
            cfg.codec = s < N_LONG ? long_specs[s] : "fp16";
            cfg.min_bytes = s < N_LONG ? 0 : (int64_t)1 << 30; /* the last: bypassed */
            cfg.seed = 5;
            cfg.timeout_ms = 60000;
            CHECK(gcomp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c) == GCOMP_SUCCESS, "create %s: %s", cfg.codec,
                  gcomp_last_error());
            for (int k = 0; k < CALLS && c; k++) {
                gcomp_result rc;
                fill(x, N, 1.0f + (float)k);
                memset(y, 0, sizeof y);
                rc = gcomp_allreduce(c, x, y, N, GCOMP_F32, k == 1 ? GCOMP_AVG : GCOMP_SUM, 1, NULL);
                CHECK(rc == GCOMP_SUCCESS, "%s%s, limit %zu, call %d: %s (%s)", cfg.codec,
                      s < N_LONG ? "" : " bypassed", gcomp__mpi_max_count, k, gcomp_result_name(rc),
                      gcomp_last_error());
                if (!lowered)
                    memcpy(ref[s][k], y, sizeof y);
                else
                    CHECK(memcmp(ref[s][k], y, sizeof y) == 0,
                          "%s%s, call %d: the result differs under a count limit "
                          "of 1000",
                          cfg.codec, s < N_LONG ? "" : " bypassed", k);
            }
            gcomp_comm_destroy(c);
        }
    }
    test_any_size_receive(); /* its longest message, 64000 bytes, crosses the lowered limit */
    gcomp__mpi_max_count = INT_MAX;
}

/* --2gib: real messages past 2 GiB through the transport (the lowered limit above cannot reach
 * Open MPI's own int limits): 2^31 + 12345 bytes into a larger capacity (what the schedules
 * post: their bounds), fixed and any-size, must arrive whole with their length. Before, the
 * fixed receive reported MPI_UNDEFINED as its length. About 4.3 GB per rank. */
static void test_2gib_exchange(void)
{
    const size_t n = ((size_t)1 << 31) + 12345, cap = n + ((size_t)1 << 20) + 7;
    uint8_t *s = malloc(n), *r = malloc(cap);
    gcomp_comm *c = make_comm("none", 120000);
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    CHECK(s && r, "no memory for two buffers of %zu bytes", n);
    if (!s || !r || !c) goto out;
    for (size_t i = 0; i < n; i += 4093) s[i] = (uint8_t)(i / 4093 + (size_t)rank);
    s[n - 1] = (uint8_t)(77 + rank);
    for (int any = 0; any <= 1; any++) {
        gcomp__transport *tp = c->tp;
        size_t got = 0;
        int ok;
        gcomp_result rc = any ? tp->start_sendrecv_any(tp, right, s, n, left, r, cap)
                              : tp->start_sendrecv(tp, right, s, n, left, r, cap);
        if (rc == GCOMP_SUCCESS) rc = tp->finish_sendrecv(tp, &got, gcomp__now() + 100.0);
        CHECK(rc == GCOMP_SUCCESS && got == n, "%s exchange of %zu bytes into %zu: %s, length %zu (%s)",
              any ? "any-size" : "fixed", n, cap, gcomp_result_name(rc), got, gcomp_last_error());
        ok = rc == GCOMP_SUCCESS && r[n - 1] == (uint8_t)(77 + left);
        for (size_t i = 0; ok && i < n - 1; i += 4093) ok = r[i] == (uint8_t)(i / 4093 + (size_t)left);
        CHECK(ok, "%s exchange of %zu bytes: wrong bytes", any ? "any-size" : "fixed", n);
    }
out:
    gcomp_comm_destroy(c);
    free(s);
    free(r);
}

/* Collectives of different sizes inside the transport (what ranks out of step would do):
 * Open MPI reports the truncation through MPI_COMM_WORLD's error handler, which must not
 * abort the job; each rank gets an error (or a timeout), and the job goes on. */
static void test_mismatched_collectives(void)
{
    enum {
        N = 1000
    };
    static float v[N];
    uint64_t u = 1;
    gcomp_comm *c = make_comm("none", 60000);
    gcomp__transport *tp;
    gcomp_result rc;
    if (!c) return;
    tp = c->tp;
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        rc = tp->allreduce_max_u64(tp, &u, 1, gcomp__now() + 2.0);
    else
        rc = tp->allreduce_sum_f32(tp, v, N, gcomp__now() + 2.0);
    CHECK(all_ranks(rc != GCOMP_SUCCESS || rank != 0), "mismatched collectives: rank 0 -> %s", gcomp_result_name(rc));
    c->broken = 1; /* as the engine does after a transport failure */
    gcomp_comm_destroy(c);
    MPI_Barrier(MPI_COMM_WORLD);
}

/* One rank's creation fails locally (out == NULL): it still joins, so every rank returns an
 * error instead of the others waiting forever in MPI_Comm_dup (before the fix). */
static void test_create_local_failure(void)
{
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *c = NULL;
    gcomp_result rc;
    double t0 = MPI_Wtime();
    cfg.codec = "fp16";
    cfg.timeout_ms = 20000;
    rc = gcomp_comm_create_mpi(MPI_COMM_WORLD, &cfg, rank == size - 1 ? NULL : &c);
    CHECK(all_ranks(rc != GCOMP_SUCCESS && c == NULL), "out == NULL on rank %d -> %s", size - 1, gcomp_result_name(rc));
    CHECK(MPI_Wtime() - t0 < 10.0, "creation with out == NULL on one rank took %.2f s", MPI_Wtime() - t0);
    CHECK(rank != size - 1 || rc == GCOMP_ERR_INVALID_ARG, "the rank with out == NULL -> %s", gcomp_result_name(rc));
    if (rank != size - 1) {
        char want[64];
        snprintf(want, sizeof want, "rank %d failed", size - 1);
        CHECK(strstr(gcomp_last_error(), want) != NULL, "the message does not name rank %d: %s", size - 1,
              gcomp_last_error());
    }
    /* the world is still in step: a normal creation works */
    c = make_comm("fp16", 20000);
    gcomp_comm_destroy(c);
}

/* An intercommunicator is refused on every rank, before any collective: the agreement's
 * MPI_Iallreduce(MPI_IN_PLACE) is invalid there, and Open MPI aborted the job at its start
 * through MPI_COMM_WORLD's handler (before the fix). Needs an even size (two halves). */
static void test_intercomm(void)
{
    MPI_Comm half, inter;
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *c = NULL;
    gcomp_result rc;
    double t0 = MPI_Wtime();
    if (size % 2) return;
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
    MPI_Intercomm_create(half, 0, MPI_COMM_WORLD, rank % 2 ? 0 : 1, 7, &inter);
    cfg.codec = "fp16";
    cfg.timeout_ms = 5000;
    rc = gcomp_comm_create_mpi(inter, &cfg, &c);
    CHECK(all_ranks(rc == GCOMP_ERR_INVALID_ARG && c == NULL &&
                    strstr(gcomp_last_error(), "intercommunicators are not supported") != NULL),
          "an intercommunicator -> %s: %s", gcomp_result_name(rc), gcomp_last_error());
    CHECK(MPI_Wtime() - t0 < 4.0, "refusing an intercommunicator took %.2f s", MPI_Wtime() - t0);
    MPI_Comm_free(&inter);
    MPI_Comm_free(&half);
}

static long resident_kib(void)
{
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
        fclose(f);
    }
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

/* 1000 calls on each of 2 communicators with 3 keys each: after the first round nothing
 * grows (no allocation per call in steady state). */
static void test_no_growth(void)
{
    enum {
        N = 30000,
        CALLS = 1000
    };
    static float x[N], y[N];
    const char *spec[2] = { "terngrad", "topk:ratio=0.05+zstd" };
    gcomp_comm *c[2] = { make_comm(spec[0], 60000), make_comm(spec[1], 60000) };
    long before = 0, after;
    int ok = 1;
    fill(x, N, 1.0f);
    for (int i = 0; i < CALLS; i++) {
        for (int k = 0; k < 2; k++)
            for (uint64_t key = 0; key < 3; key++)
                ok &= gcomp_allreduce(c[k], x, y, N - 1000 * (size_t)key, GCOMP_F32, GCOMP_SUM, key, NULL) ==
                      GCOMP_SUCCESS;
        if (i == 10) before = resident_kib();
    }
    after = resident_kib();
    CHECK(all_ranks(ok), "1000 calls on 2 communicators failed");
    /* allocators that quarantine freed memory (ASan, valgrind) make resident size grow with
     * Open MPI's own per-call allocations; the check is meaningful only without them */
#if !defined(__SANITIZE_ADDRESS__)
    if (!getenv("GCOMP_TEST_UNDER_VALGRIND"))
        CHECK(after - before < 512, "resident memory grew by %ld KiB over %d calls", after - before, CALLS);
#else
    (void)before, (void)after;
#endif
    gcomp_comm_destroy(c[0]);
    gcomp_comm_destroy(c[1]);
}

/* The last rank stops itself (SIGSTOP) for 4 s; a child process wakes it. The others get
 * GCOMP_ERR_TIMEOUT within the 1 s deadline, and their next call is refused. */
static void test_stopped_rank(void)
{
    enum {
        N = 20000
    };
    static float x[N], y[N];
    gcomp_comm *c = make_comm("terngrad", 1000);
    gcomp_result rc;
    double t0;
    fill(x, N, 1.0f);
    CHECK(all_ranks(gcomp_allreduce(c, x, y, N, GCOMP_F32, GCOMP_SUM, 1, NULL) == GCOMP_SUCCESS), "warm-up call");
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == size - 1) {
        pid_t parent = getpid(), child = fork();
        if (child == 0) {
            sleep(4);
            kill(parent, SIGCONT);
            _exit(0);
        }
        raise(SIGSTOP);
        waitpid(child, NULL, 0);
    }
    t0 = MPI_Wtime();
    rc = gcomp_allreduce(c, x, y, N, GCOMP_F32, GCOMP_SUM, 1, NULL);
    if (rank != size - 1) {
        double took = MPI_Wtime() - t0;
        CHECK(rc == GCOMP_ERR_TIMEOUT, "a peer stopped -> %s, expected TIMEOUT", gcomp_result_name(rc));
        CHECK(took < 8.0, "the timeout took %.2f s with a 1 s deadline", took); /* generous: loaded CI */
        rc = gcomp_allreduce(c, x, y, N, GCOMP_F32, GCOMP_SUM, 1, NULL);
        CHECK(rc == GCOMP_ERR_COMM_INVALID, "after a timeout the next call -> %s, expected COMM_INVALID",
              gcomp_result_name(rc));
    } else {
        CHECK(rc != GCOMP_SUCCESS, "the stopped rank's late call succeeded");
    }
    /* destroy with the timed-out collective still pending, then MPI goes on: the late rank's
     * arrival must not make MPI_Barrier or MPI_Finalize (in main) touch a freed communicator */
    gcomp_comm_destroy(c);
    MPI_Barrier(MPI_COMM_WORLD);
}

/* Creation has a deadline: the last rank comes 3 s late to a creation with timeout_ms =
 * 1000. The others get GCOMP_ERR_TIMEOUT from the duplication in about 1 s (before the fix
 * they waited in MPI_Comm_dup for it, then succeeded); the late rank's duplication completes
 * against their pending ones, and it times out in the agreement nobody else joins. Then
 * MPI_Barrier and MPI_Finalize (in main) must not trip over what was left pending. */
static void test_late_create(void)
{
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *c = NULL;
    gcomp_result rc;
    double t0, took;
    cfg.codec = "fp16";
    cfg.timeout_ms = 1000;
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == size - 1) sleep(3);
    t0 = MPI_Wtime();
    rc = gcomp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c);
    took = MPI_Wtime() - t0;
    CHECK(rc == GCOMP_ERR_TIMEOUT && c == NULL, "creation with a rank 3 s late -> %s: %s", gcomp_result_name(rc),
          gcomp_last_error());
    if (rank != size - 1) {
        CHECK(took < 2.5, "the creation timed out after %.2f s with a 1 s deadline", took);
        CHECK(strstr(gcomp_last_error(), "MPI_Comm_idup") != NULL, "the message: %s", gcomp_last_error());
    }
    gcomp_comm_destroy(c);
    MPI_Barrier(MPI_COMM_WORLD);
}

/* The last rank never joins a creation (the others time out, their MPI_Comm_idup left
 * pending), then every rank creates again: that creation must work everywhere, and a call
 * on it. Before, the waiting ranks started a second idup while the first was pending, the
 * absent rank's idup completed their first one, and every later creation timed out, one
 * duplication apart. Runs after test_late_create, whose pending idups completed when the
 * late rank came: the creation here starts afresh past them. */
static void test_absent_create(void)
{
    enum {
        N = 4096
    };
    static float x[N], y[N];
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *c = NULL;
    gcomp_result rc;
    cfg.codec = "fp16";
    cfg.timeout_ms = 1000;
    if (rank != size - 1) {
        rc = gcomp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c);
        CHECK(rc == GCOMP_ERR_TIMEOUT && c == NULL, "creation without the last rank -> %s: %s", gcomp_result_name(rc),
              gcomp_last_error());
    } else {
        sleep(3); /* past their deadline; no collective meanwhile: their idup is the next one */
    }
    for (int again = 0; again < 2; again++) { /* and the one after it: in step for good */
        cfg.timeout_ms = 20000;
        rc = gcomp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c);
        CHECK(rc == GCOMP_SUCCESS, "creation %d after one the last rank missed -> %s: %s", again + 1,
              gcomp_result_name(rc), gcomp_last_error());
        if (rc != GCOMP_SUCCESS) return;
        for (int i = 0; i < N; i++) x[i] = 1.0f;
        rc = gcomp_allreduce(c, x, y, N, GCOMP_F32, GCOMP_SUM, 1, NULL);
        CHECK(rc == GCOMP_SUCCESS && y[0] == (float)size && y[N - 1] == (float)size, "a call on it -> %s, y[0] = %g",
              gcomp_result_name(rc), (double)y[0]);
        gcomp_comm_destroy(c);
        c = NULL;
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

/* The last rank comes 1.5 s late to a creation with timeout_ms = 1000; the others time out,
 * work for 1 s (no MPI call), and every rank creates again until one succeeds: the late
 * rank's first creation and the others' second meet on the duplicate the others left pending.
 * Before, the others dropped a pending idup that completed in their next creation and
 * started another, while the late rank was in the agreement on the first: they stayed one
 * duplication apart and no retry ever succeeded. */
static void test_late_create_retry(void)
{
    enum {
        N = 4096
    };
    static float x[N], y[N];
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *c = NULL;
    gcomp_result rc = GCOMP_ERR_TIMEOUT;
    int tries = 0;
    cfg.codec = "fp16";
    cfg.timeout_ms = 1000;
    if (rank == size - 1) usleep(1500000);
    while (rc != GCOMP_SUCCESS && tries < 4) {
        rc = gcomp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c);
        if (tries++ == 0 && rank != size - 1) usleep(1000000);
    }
    CHECK(rc == GCOMP_SUCCESS, "creations after a late rank, retried %d times -> %s: %s", tries, gcomp_result_name(rc),
          gcomp_last_error());
    if (rc != GCOMP_SUCCESS) return;
    for (int i = 0; i < N; i++) x[i] = 1.0f;
    rc = gcomp_allreduce(c, x, y, N, GCOMP_F32, GCOMP_SUM, 1, NULL);
    CHECK(rc == GCOMP_SUCCESS && y[0] == (float)size, "a call on it -> %s, y[0] = %g", gcomp_result_name(rc),
          (double)y[0]);
    gcomp_comm_destroy(c);
    MPI_Barrier(MPI_COMM_WORLD);
}

/* The last rank dies mid-run; mpirun must end the job with a non-zero status. */
static void test_killed_rank(void)
{
    enum {
        N = 20000
    };
    static float x[N], y[N];
    gcomp_comm *c = make_comm("fp16", 5000);
    fill(x, N, 1.0f);
    gcomp_allreduce(c, x, y, N, GCOMP_F32, GCOMP_SUM, 1, NULL);
    if (rank == size - 1) raise(SIGKILL);
    for (int i = 0; i < 100; i++) gcomp_allreduce(c, x, y, N, GCOMP_F32, GCOMP_SUM, 1, NULL);
    gcomp_comm_destroy(c);
}

int main(int argc, char **argv)
{
    int fail_any;
    gcomp_comm *kept[3] = { NULL, NULL, NULL };
    const char *mode = argc > 1 ? argv[1] : "";
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (!strcmp(mode, "--stop")) {
        test_stopped_rank();
        test_late_create();
        test_absent_create();
        test_late_create_retry();
    } else if (!strcmp(mode, "--kill")) {
        test_killed_rank();
    } else if (!strcmp(mode, "--2gib")) {
        test_2gib_exchange();
    } else {
        test_alloc_failure();
        test_truncated_wire();
        test_edge_values();
        test_no_growth();
        test_min_bytes_mismatch();
        if (size > 1) test_disagreeing_plans();
        test_any_size_receive();
        test_long_messages();
        test_create_local_failure();
        test_intercomm();
        /* it leaves a timed-out collective behind, whose communicator and buffer destroy
         * leaks on purpose (docs/RELIABILITY.md, known limits): not a leak to report */
        if (!getenv("GCOMP_TEST_UNDER_VALGRIND")) test_mismatched_collectives();
    }
    fail_any = mpi_test_finish("mpi_faults", mode);
    /* communicators kept past MPI_Finalize: fp16 and top-k used once before it, one unused.
     * Not under valgrind: the MPI communicators they duplicated can no longer be freed after
     * MPI_Finalize, so Open MPI's copies of them are leaked by construction */
    int keep = !mode[0] && !getenv("GCOMP_TEST_UNDER_VALGRIND");
    if (keep) {
        static const char *const specs[3] = { "fp16", "topk:ratio=0.01", "fp16" };
        static float x[4096] = { 1.0f }, y[4096];
        for (int k = 0; k < 3 && !fail_any; k++) {
            gcomp_config cfg = gcomp_config_default();
            cfg.codec = specs[k];
            cfg.min_bytes = 0;
            if (gcomp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &kept[k]) != GCOMP_SUCCESS ||
                (k < 2 && gcomp_allreduce(kept[k], x, y, 4096, GCOMP_F32, GCOMP_SUM, 1, NULL) != GCOMP_SUCCESS)) {
                fprintf(stderr, "rank %d: FAIL: %s before MPI_Finalize: %s\n", rank, specs[k], gcomp_last_error());
                fail_any = 1;
            }
        }
    }
    MPI_Finalize();
    if (!mode[0]) { /* creation after MPI_Finalize, and calls of kept communicators: errors, not aborts */
        gcomp_comm *c = NULL;
        static float x[4096] = { 1.0f }, y[4096];
        gcomp_result rc = gcomp_comm_create_mpi(MPI_COMM_WORLD, NULL, &c);
        if (rc != GCOMP_ERR_INVALID_ARG || c) {
            fprintf(stderr, "rank %d: FAIL: creation after MPI_Finalize -> %s\n", rank, gcomp_result_name(rc));
            fail_any = 1;
        }
        for (int k = 0; k < 3 && kept[k]; k++) {
            /* the unused one's first call decides its progress mode (MPI_Query_thread would abort) */
            gcomp_request *req = NULL;
            rc = k < 2 ? gcomp_allreduce(kept[k], x, y, 4096, GCOMP_F32, GCOMP_SUM, 1, NULL)
                       : gcomp_iallreduce(kept[k], x, y, 4096, GCOMP_F32, GCOMP_SUM, 1, NULL, &req);
            if (k == 2 && rc == GCOMP_SUCCESS) rc = gcomp_wait(&req);
            if (rc != GCOMP_ERR_INVALID_ARG || !strstr(gcomp_last_error(), "MPI is finalized")) {
                fprintf(stderr, "rank %d: FAIL: call %d after MPI_Finalize -> %s (%s)\n", rank, k,
                        gcomp_result_name(rc), gcomp_last_error());
                fail_any = 1;
            }
            gcomp_comm_destroy(kept[k]);
        }
    }
    return fail_any ? 1 : 0;
}
