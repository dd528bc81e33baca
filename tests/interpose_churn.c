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
 * Expected: 160 compressed, no_ef 89, 35 residual keys. Sums are checked (integer-valued).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define N 32768 /* floats per buffer: 128 KiB, compressed (above the interposer's default min_bytes) */
#define KEPT 20
#define NEW 100

static int rank, size, wrong;

static void sum_check(float *x)
{
    for (int i = 0; i < N; i++) x[i] = (float)(i % 10 + rank);
    MPI_Allreduce(MPI_IN_PLACE, x, N, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (int i = 0; i < N; i++) wrong += x[i] != (float)(size * (i % 10) + size * (size - 1) / 2);
}

int main(int argc, char **argv)
{
    float *pool;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    /* every buffer a slice of one allocation: distinct addresses, none recycled */
    pool = malloc((size_t)(KEPT + NEW) * N * sizeof(float));
    if (!pool) MPI_Abort(MPI_COMM_WORLD, 2);
    for (int step = 0; step < 3; step++)
        for (int b = 0; b < KEPT; b++) sum_check(pool + (size_t)b * N);
    for (int b = 0; b < NEW; b++) sum_check(pool + (size_t)(KEPT + b) * N);
    if (wrong) fprintf(stderr, "rank %d: %d wrong sums\n", rank, wrong);
    printf("rank %d expects compressed=%d passed=0 no_ef=89 keys=35\n", rank, 3 * KEPT + NEW);
    free(pool);
    MPI_Finalize();
    return wrong != 0;
}
