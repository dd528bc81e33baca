/*
 * interpose_errhandler.c — under LD_PRELOAD=libgcomp_mpi.so with MPI_THREAD_MULTIPLE: a
 * thread makes 200 compressed float sums on a duplicate of MPI_COMM_WORLD while the main
 * thread sets an error handler of its own on MPI_COMM_WORLD once. gcomp sets
 * MPI_ERRORS_RETURN on MPI_COMM_WORLD while it waits (include/gcomp_mpi.h); the program's
 * handler must still be there afterwards (before, gcomp put back the handler it had saved
 * over it on some ranks). A race: a run without the fix may pass on some ranks.
 * Exits 1 with a message when the handler is gone.
 */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define N 400000

static int started;
static MPI_Comm dup_comm;

static void program_handler(MPI_Comm *comm, int *code, ...) { (void)comm, (void)code; }

static void *sums(void *arg)
{
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) x[i] = 1.0f;
    for (int it = 0; it < 200; it++) {
        MPI_Allreduce(x, y, N, MPI_FLOAT, MPI_SUM, dup_comm);
        if (it == 20) __atomic_store_n(&started, 1, __ATOMIC_SEQ_CST);
    }
    free(x);
    free(y);
    return arg;
}

int main(int argc, char **argv)
{
    int provided, rank;
    MPI_Errhandler mine, now;
    pthread_t t;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (provided < MPI_THREAD_MULTIPLE) {
        fprintf(stderr, "rank %d: MPI_THREAD_MULTIPLE not provided\n", rank);
        MPI_Finalize();
        return 1;
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &dup_comm);
    MPI_Comm_create_errhandler(program_handler, &mine);
    pthread_create(&t, NULL, sums, NULL);
    while (!__atomic_load_n(&started, __ATOMIC_SEQ_CST)) usleep(100);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, mine);
    pthread_join(t, NULL);
    MPI_Comm_get_errhandler(MPI_COMM_WORLD, &now);
    if (now != mine) fprintf(stderr, "rank %d: the program's handler on MPI_COMM_WORLD is gone\n", rank);
    MPI_Comm_free(&dup_comm);
    MPI_Finalize();
    return now != mine;
}
