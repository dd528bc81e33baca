/*
 * interpose_free_cb.c — a program that knows nothing of gcomp, run under
 * LD_PRELOAD=libgcomp_mpi.so: an attribute of its own on a duplicate of MPI_COMM_WORLD has a
 * delete callback that sums floats on the communicator being freed (a library flushing its
 * totals when a communicator goes). MPI runs the delete callbacks in an order it does not
 * fix, and Open MPI runs the interposer's first; the callback's sum must still be right, and
 * MPI_Comm_free and MPI_Finalize must succeed (before, the interposer made a new gcomp
 * communicator on the dying one and MPI_Finalize aborted on its stale attribute).
 * Both a communicator that had compressed sums before and one whose first sum is in the
 * callback. Exits 0 on success, 1 with a message on a wrong sum.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define N 40000

static int rank, size, wrong;

/* integer-valued floats: every codec the test runs sums them exactly */
static void fill(float *x)
{
    for (int i = 0; i < N; i++) x[i] = (float)(i % 10 + rank);
}

static int check(const float *y)
{
    int bad = 0;
    for (int i = 0; i < N; i++) bad += y[i] != (float)(size * (i % 10) + size * (size - 1) / 2);
    return bad;
}

static int sum_in_callback(MPI_Comm comm, int keyval, void *val, void *extra)
{
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    (void)keyval, (void)val, (void)extra;
    fill(x);
    MPI_Allreduce(x, y, N, MPI_FLOAT, MPI_SUM, comm);
    wrong += check(y);
    free(x);
    free(y);
    return MPI_SUCCESS;
}

int main(int argc, char **argv)
{
    int keyval;
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, sum_in_callback, &keyval, NULL);
    fill(x);
    for (int used_before = 0; used_before <= 1; used_before++) {
        MPI_Comm c;
        MPI_Comm_dup(MPI_COMM_WORLD, &c);
        if (used_before) {
            MPI_Allreduce(x, y, N, MPI_FLOAT, MPI_SUM, c);
            wrong += check(y);
        }
        MPI_Comm_set_attr(c, keyval, NULL);
        MPI_Comm_free(&c);
    }
    MPI_Comm_free_keyval(&keyval);
    if (wrong) fprintf(stderr, "rank %d: %d wrong sums\n", rank, wrong);
    free(x);
    free(y);
    MPI_Finalize();
    return wrong != 0;
}
