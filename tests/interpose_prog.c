/*
 * interpose_prog.c — a plain MPI program that knows nothing of gcomp, run by interpose.sh
 * with and without LD_PRELOAD=libgcomp_mpi.so.
 *
 * Every case calls MPI_Allreduce (which the interposer may replace) and checks it against
 * PMPI_Allreduce on the same input (which nobody replaces, so it is MPI's own answer):
 *   - cases the interposer must leave alone (int, double, MPI_MAX, a user op, a derived
 *     datatype, a small float buffer, an intercommunicator, MPI_Iallreduce, and a float sum
 *     during MPI_Finalize from a MPI_COMM_SELF delete callback): bit-exact;
 *   - an aliased call (sendbuf == recvbuf, not MPI_IN_PLACE): MPI's own error;
 *   - float sums at or above the threshold, in place too, at odd addresses on some ranks, on MPI_COMM_WORLD and on a split
 *     communicator: with --bound exact bit-exact; with --bound fp16|terngrad|topk within that
 *     codec's bound, different from MPI's answer (so something did compress them), and
 *     bitwise identical on every rank; with --bound none (GCOMP_CODEC=none+zstd: an exact codec,
 *     compressed yet lossless) within fp32 rounding of MPI's answer, every compressed call
 *     without error feedback (the interposer gives an exact codec no residual key); under
 *     GCOMP_EF=0 every compressed call is without error feedback too.
 * Each rank prints "rank R expects compressed=C passed=P no_ef=E failed=X freed=F", the
 * MPI_Allreduce calls the interposer should have compressed (E of them without error
 * feedback), refused on every rank (X, ranks that disagree on the count) and passed through, and the gcomp communicators MPI_Comm_free should have destroyed, for the runner to
 * compare with GCOMP_STATS_FILE.
 *
 * usage: interpose_prog --bound exact|none|fp16|terngrad|topk [--min-bytes B]
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_test_util.h" /* rank, size, CHECK and n_fail */

#define N_BIG 40000 /* 160000 bytes: above the default 65536-byte threshold */
#define N_SMALL 1000
#define STEPS 3

static int n_compressed, n_passed, n_no_ef, n_failed, n_freed;
static const char *bound = "exact";


static float value(int r, int i, int step)
{
    return (float)sin(0.37 * i + 1.3 * r + 0.7 * step) * (1.0f + (float)(i % 7));
}

static void fill(float *x, int n, int r, int step)
{
    for (int i = 0; i < n; i++) x[i] = value(r, i, step);
}

/* All ranks hold the same bytes. */
static void check_same_on_all(const void *buf, size_t bytes, const char *what)
{
    unsigned long long h = 1469598103934665603ull, mx, mn;
    for (size_t i = 0; i < bytes; i++) h = (h ^ ((const unsigned char *)buf)[i]) * 1099511628211ull;
    PMPI_Allreduce(&h, &mx, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
    PMPI_Allreduce(&h, &mn, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
    CHECK(mx == mn, "%s: ranks hold different results", what);
}

/* A compressed float sum: within the codec's bound of MPI's exact-input sum. in_abs is the
 * largest |input| of any rank, nranks the communicator's size, first: fresh residuals. */
static void check_compressed(const float *got, const float *ref, int n, int nranks, float in_abs, int first,
                             const char *what)
{
    double max_err = 0;
    int nnz = 0, differ = 0;
    for (int i = 0; i < n; i++) {
        double e = fabs((double)got[i] - (double)ref[i]);
        if (e > max_err) max_err = e;
        nnz += got[i] != 0.0f;
        differ += memcmp(&got[i], &ref[i], 4) != 0;
    }
    if (!strcmp(bound, "exact")) {
        CHECK(differ == 0, "%s: %d elements differ from PMPI_Allreduce (expected pass-through)", what, differ);
        return;
    }
    if (!strcmp(bound, "none")) { /* fp32 sums in another order: a few ulps of nranks * in_abs */
        double tol = (double)nranks * nranks * in_abs * ldexp(1.0, -22);
        CHECK(max_err <= tol, "%s: none error %g > %g", what, max_err, tol);
        return;
    }
    CHECK(differ > 0, "%s: identical to PMPI_Allreduce: not compressed", what);
    if (!strcmp(bound, "fp16")) {
        /* each hop rounds a partial sum (|.| <= nranks * in_abs) to half: 2^-11 relative */
        double tol = (double)nranks * nranks * in_abs * ldexp(1.0, -10);
        CHECK(max_err <= tol, "%s: fp16 error %g > %g", what, max_err, tol);
    } else if (!strcmp(bound, "terngrad")) {
        /* every rank sends scale * {-1,0,1} with scale <= |input + residual|max */
        double tol = (first ? 2.0 : 4.0) * nranks * in_abs;
        CHECK(max_err <= tol, "%s: terngrad error %g > %g", what, max_err, tol);
    } else if (!strcmp(bound, "topk")) {
        int k = (int)ceil(0.01 * n);
        double tol = (first ? 2.0 : 4.0) * nranks * in_abs;
        CHECK(nnz <= nranks * k, "%s: top-k result has %d non-zeros > %d ranks x k %d", what, nnz, nranks, k);
        CHECK(max_err <= tol, "%s: top-k error %g > %g", what, max_err, tol);
    }
}

static void check_exact(const void *got, const void *ref, size_t bytes, const char *what)
{
    CHECK(memcmp(got, ref, bytes) == 0, "%s: differs from PMPI_Allreduce (must pass through bit-exact)", what);
}

/* A sum as a user op, over floats or groups of 4 floats (MPI_SUM is not defined on derived
 * datatypes). */
/* A program's own MPI_COMM_SELF attribute, set after the interposer's (at the first
 * MPI_Allreduce): MPI_Finalize deletes it first, while the interposer's communicators are
 * still alive. Its float sum must go to MPI (the interposer compressed it before it noted
 * MPI_Finalize itself). */
static int at_finalize(MPI_Comm comm, int keyval, void *val, void *extra)
{
    enum {
        N = 40000
    };
    float *x = malloc(N * sizeof *x), *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
    (void)comm, (void)keyval, (void)val, (void)extra;
    for (int i = 0; i < N; i++) x[i] = (float)sin(0.37 * i + 1.3 * rank) * (1.0f + (float)(i % 7));
    PMPI_Allreduce(x, b, N, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(x, a, N, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    if (memcmp(a, b, N * sizeof *a)) {
        fprintf(stderr, "rank %d: FAIL: a float sum during MPI_Finalize differs from MPI's (compressed?)\n", rank);
        n_fail++;
    }
    free(x), free(a), free(b);
    return MPI_SUCCESS;
}

static void user_sum(void *in, void *inout, int *len, MPI_Datatype *t)
{
    int n = *t == MPI_FLOAT ? *len : 4 * *len;
    for (int i = 0; i < n; i++) ((float *)inout)[i] += ((float *)in)[i];
}

/* Float sums on comm, STEPS times on the same buffers (error feedback), out of place and
 * in place. Counts what the interposer should do with them. */
static void float_sums(MPI_Comm comm, const char *name, int compress)
{
    int n = N_BIG, csize, crank;
    float *x = malloc(n * sizeof *x), *got = malloc(n * sizeof *got), *ref = malloc(n * sizeof *ref),
          *inplace = malloc(n * sizeof *inplace);
    char what[128], *mis_send = malloc(n * sizeof *x + 4), *mis_recv = malloc(n * sizeof *x + 4);
    MPI_Comm_size(comm, &csize);
    MPI_Comm_rank(comm, &crank);
    compress = compress && csize > 1;
    for (int step = 0; step < STEPS; step++) {
        fill(x, n, rank, step);
        PMPI_Allreduce(x, ref, n, MPI_FLOAT, MPI_SUM, comm);
        MPI_Allreduce(x, got, n, MPI_FLOAT, MPI_SUM, comm);
        snprintf(what, sizeof what, "%s float sum step %d", name, step);
        if (compress)
            check_compressed(got, ref, n, csize, 7.0f, step == 0, what);
        else
            check_exact(got, ref, n * 4, what);
        memcpy(inplace, x, n * sizeof *x);
        MPI_Allreduce(MPI_IN_PLACE, inplace, n, MPI_FLOAT, MPI_SUM, comm);
        snprintf(what, sizeof what, "%s MPI_IN_PLACE float sum step %d", name, step);
        if (compress)
            check_compressed(inplace, ref, n, csize, 7.0f, step == 0, what);
        else
            check_exact(inplace, ref, n * 4, what);
        /* floats at odd addresses on even ranks (MPI allows any address): the interposer
         * reduces an aligned copy; the other ranks' buffers stay aligned */
        memcpy(mis_send + crank % 2, x, n * sizeof *x);
        MPI_Allreduce(mis_send + crank % 2, mis_recv + 3 * (crank % 2), n, MPI_FLOAT, MPI_SUM, comm);
        memcpy(inplace, mis_recv + 3 * (crank % 2), n * sizeof *x);
        snprintf(what, sizeof what, "%s misaligned float sum step %d", name, step);
        if (compress)
            check_compressed(inplace, ref, n, csize, 7.0f, step == 0, what);
        else
            check_exact(inplace, ref, n * 4, what);
        if (compress)
            n_compressed += 3;
        else
            n_passed += 3;
    }
    if (comm == MPI_COMM_WORLD) {
        check_same_on_all(got, n * 4, "float sum");
        check_same_on_all(inplace, n * 4, "in-place float sum");
    }
    free(x), free(got), free(ref), free(inplace), free(mis_send), free(mis_recv);
}

int main(int argc, char **argv)
{
    int n = N_BIG, compress;
    long min_bytes = 65536;
    float *fx = malloc(n * sizeof *fx), *fa = malloc(n * sizeof *fa), *fb = malloc(n * sizeof *fb);
    double *dx = malloc(n * sizeof *dx), *da = malloc(n * sizeof *da), *db = malloc(n * sizeof *db);
    int *ix = malloc(n * sizeof *ix), *ia = malloc(n * sizeof *ia), *ib = malloc(n * sizeof *ib);
    MPI_Op op;
    MPI_Datatype vec4;
    MPI_Comm split, inter;
    MPI_Request req;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--bound"))
            bound = argv[i + 1];
        else if (!strcmp(argv[i], "--min-bytes"))
            min_bytes = atol(argv[i + 1]);
    }
    compress = strcmp(bound, "exact") != 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int i = 0; i < n; i++) {
        fx[i] = value(rank, i, 9);
        dx[i] = fx[i] * 1.000001;
        ix[i] = (i * 7 + rank * 13) % 1001 - 500;
    }

    /* float sums: compressed when the interposer is on */
    float_sums(MPI_COMM_WORLD, "world", compress);

    /* the same buffer as send and receive buffer (not MPI_IN_PLACE): erroneous, and the
     * caller gets MPI's own error for it (the interposer compressed it, successfully) */
    {
        int got, want;
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        memcpy(fa, fx, n * sizeof *fa);
        want = PMPI_Allreduce(fa, fa, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        memcpy(fa, fx, n * sizeof *fa);
        got = MPI_Allreduce(fa, fa, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
        CHECK(want != MPI_SUCCESS, "MPI accepted an aliased MPI_Allreduce: the case tests nothing");
        CHECK(got == want, "aliased MPI_Allreduce -> %d, MPI says %d", got, want);
        n_passed++;
    }

    /* a reduction inside MPI_Finalize (see at_finalize): passed through, counted now */
    {
        int key;
        MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, at_finalize, &key, NULL);
        MPI_Comm_set_attr(MPI_COMM_SELF, key, NULL);
        n_passed++;
    }

    /* a small float sum: below the threshold */
    PMPI_Allreduce(fx, fb, N_SMALL, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(fx, fa, N_SMALL, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    check_exact(fa, fb, N_SMALL * 4, "small float sum");
    if (compress && N_SMALL * 4 >= min_bytes)
        n_compressed++;
    else
        n_passed++;

    /* other types, ops, user ops, derived datatypes: untouched */
    PMPI_Allreduce(ix, ib, n, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(ix, ia, n, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    check_exact(ia, ib, n * sizeof *ia, "int sum");
    PMPI_Allreduce(dx, db, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(dx, da, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    check_exact(da, db, n * sizeof *da, "double sum");
    PMPI_Allreduce(fx, fb, n, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(fx, fa, n, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
    check_exact(fa, fb, n * 4, "float max");
    MPI_Op_create(user_sum, 1, &op);
    PMPI_Allreduce(fx, fb, n, MPI_FLOAT, op, MPI_COMM_WORLD);
    MPI_Allreduce(fx, fa, n, MPI_FLOAT, op, MPI_COMM_WORLD);
    check_exact(fa, fb, n * 4, "float user op");
    MPI_Type_contiguous(4, MPI_FLOAT, &vec4);
    MPI_Type_commit(&vec4);
    PMPI_Allreduce(fx, fb, n / 4, vec4, op, MPI_COMM_WORLD);
    MPI_Allreduce(fx, fa, n / 4, vec4, op, MPI_COMM_WORLD);
    check_exact(fa, fb, n * 4, "derived datatype (4 floats) sum");
    MPI_Type_free(&vec4);
    MPI_Op_free(&op);
    n_passed += 5;

    /* MPI_Iallreduce of a large float sum: not intercepted, not counted */
    MPI_Iallreduce(fx, fa, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
    MPI_Wait(&req, MPI_STATUS_IGNORE);
    /* (its own algorithm may sum in another order than MPI_Allreduce's) */
    PMPI_Iallreduce(fx, fb, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
    PMPI_Wait(&req, MPI_STATUS_IGNORE);
    check_exact(fa, fb, n * 4, "MPI_Iallreduce float sum");

    /* a split communicator (ranks reversed; even and odd ranks), freed afterwards: its gcomp
     * communicator goes with it */
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, -rank, &split);
    float_sums(split, "split", compress);

    /* an intercommunicator between the even and odd ranks: untouched */
    if (size >= 2) {
        /* split's rank 0 is the group's highest world rank (keys reversed) */
        int last = size - 1, even_leader = last % 2 ? last - 1 : last, odd_leader = last % 2 ? last : last - 1;
        MPI_Intercomm_create(split, 0, MPI_COMM_WORLD, rank % 2 ? even_leader : odd_leader, 7, &inter);
        PMPI_Allreduce(fx, fb, n, MPI_FLOAT, MPI_SUM, inter);
        MPI_Allreduce(fx, fa, n, MPI_FLOAT, MPI_SUM, inter);
        check_exact(fa, fb, n * 4, "intercommunicator float sum");
        n_passed++;
        MPI_Comm_free(&inter);
    }
    {
        int split_size;
        MPI_Comm_size(split, &split_size);
        n_freed = compress && split_size > 1; /* its gcomp communicator goes now, not at MPI_Finalize */
    }
    MPI_Comm_free(&split);

    /* the same buffer with two counts (a fusion buffer whose composition changed): still
     * compressed, without error feedback after the change */
    fill(fx, n, rank, 5);
    MPI_Allreduce(MPI_IN_PLACE, fx, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    fill(fx, n, rank, 6);
    MPI_Allreduce(MPI_IN_PLACE, fx, n - 100, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    if (compress)
        n_compressed += 2, n_no_ef += 1;
    else
        n_passed += 2;

    /* ranks that disagree on a compressed float sum's count (erroneous in MPI): gcomp refuses
     * it on every rank (GCOMP_ERR_MISMATCH), a program's MPI_ERRORS_RETURN gets the error
     * instead of a hang or a truncated result, and the summary counts the call as failed */
    if (compress && size > 1) {
        int rc;
        fill(fa, n, rank, 7);
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        rc = MPI_Allreduce(MPI_IN_PLACE, fa, rank ? n - 50 : n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
        CHECK(rc != MPI_SUCCESS, "a float sum whose count differs across ranks succeeded");
        n_failed++;
    }

    if (!strcmp(bound, "none")) n_no_ef = n_compressed; /* an exact codec: no residual keys at all */
    if (getenv("GCOMP_EF") && !strcmp(getenv("GCOMP_EF"), "0")) n_no_ef = n_compressed; /* nor without feedback */
    printf("rank %d expects compressed=%d passed=%d no_ef=%d failed=%d freed=%d\n", rank, n_compressed, n_passed,
           n_no_ef, n_failed, n_freed);
    {
        int all = 0;
        PMPI_Allreduce(&n_fail, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        if (rank == 0) printf("interpose_prog (%d ranks, bound %s): %s\n", size, bound, all ? "FAILED" : "ok");
        n_fail = all;
    }
    MPI_Finalize();
    free(fx), free(fa), free(fb), free(dx), free(da), free(db), free(ix), free(ia), free(ib);
    return n_fail ? 1 : 0;
}
