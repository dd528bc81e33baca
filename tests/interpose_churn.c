/*
 * interpose_churn.c — a program that knows nothing of gcomp, run under
 * LD_PRELOAD=libgcomp_mpi.so by interpose.sh: first a trainer that keeps its buffers (20
 * gradients reduced in place, 3 steps), then one that reduces a new array at every call (100
 * calls on addresses never seen before, as mpi4py code that allocates its gradients anew).
 * The interposer keyed every address, so the second part kept a residual per call that no
 * later call read (memory growing by two copies of the buffer per call). Now a first call
 * is keyed while fewer than 16 keys have had one call only, and once 16 of the calls after the
 * first repeated address were on new addresses no new key is given:
 *   step 1: buffers 0-15 keyed at their first call, 16-19 not (4 calls without error feedback);
 *   steps 2-3: all 20 keyed (a second call is keyed);
 *   new arrays: the first 15 keyed, the 16th new address makes the communicator churn, so
 *   calls 16-100 run without error feedback (85).
 * On a duplicate of MPI_COMM_WORLD, a trainer whose addresses churn only for a while: a warm-up
 * buffer reduced twice, then 40 kept buffers for 5 steps. Its first step churns (16 new
 * addresses after a repeated one): buffers 0-14 keyed, 15-39 not; step 2 still churns (the
 * last 64 calls hold step 1's new addresses), step 3 stops churning at its 9th call, and
 * 15-39 get their keys there (before, the churn was for good: 25 buffers never had error
 * feedback): 202 compressed, no_ef 50, 41 keys.
 * Expected: 362 compressed, no_ef 139, 76 residual keys. Sums are checked (integer-valued).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define N 32768 /* floats per buffer: 128 KiB, compressed (above the interposer's default min_bytes) */
#define KEPT 20
#define NEW 100
#define BURST 40 /* the duplicate's kept buffers */

static int rank, size, wrong;

static void sum_check(float *x, MPI_Comm comm)
{
    for (int i = 0; i < N; i++) x[i] = (float)(i % 10 + rank);
    MPI_Allreduce(MPI_IN_PLACE, x, N, MPI_FLOAT, MPI_SUM, comm);
    for (int i = 0; i < N; i++) wrong += x[i] != (float)(size * (i % 10) + size * (size - 1) / 2);
}

int main(int argc, char **argv)
{
    float *pool, *burst;
    MPI_Comm dup;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    /* every buffer a slice of one allocation: distinct addresses, none recycled */
    pool = malloc((size_t)(KEPT + NEW) * N * sizeof(float));
    burst = malloc((size_t)(BURST + 1) * N * sizeof(float));
    if (!pool || !burst) MPI_Abort(MPI_COMM_WORLD, 2);
    for (int step = 0; step < 3; step++)
        for (int b = 0; b < KEPT; b++) sum_check(pool + (size_t)b * N, MPI_COMM_WORLD);
    for (int b = 0; b < NEW; b++) sum_check(pool + (size_t)(KEPT + b) * N, MPI_COMM_WORLD);
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    sum_check(burst + (size_t)BURST * N, dup); /* the warm-up, twice */
    sum_check(burst + (size_t)BURST * N, dup);
    for (int step = 0; step < 5; step++)
        for (int b = 0; b < BURST; b++) sum_check(burst + (size_t)b * N, dup);
    if (wrong) fprintf(stderr, "rank %d: %d wrong sums\n", rank, wrong);
    printf("rank %d expects compressed=%d passed=0 no_ef=139 keys=76\n", rank, 3 * KEPT + NEW + 2 + 5 * BURST);
    free(pool);
    free(burst);
    MPI_Finalize();
    return wrong != 0;
}
