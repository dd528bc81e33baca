/*
 * mpi_test_util.h — what the MPI test programs (test_mpi_allreduce.c, test_mpi_faults.c,
 * test_mpi_checkpoint.c)
 * share: each rank counts its own verdicts with CHECK, collective verdicts come from
 * all_ranks(), and mpi_test_finish() has rank 0 print the totals and gives the exit status
 * (nonzero when any rank failed). It defines the program's state (rank, size, the counters):
 * include it from the one .c file of a test program.
 */
#ifndef GCOMP_TEST_MPI_TEST_UTIL_H
#define GCOMP_TEST_MPI_TEST_UTIL_H

#include <stdio.h>

#include <mpi.h>

static int rank, size, n_pass, n_fail; /* of MPI_COMM_WORLD; set by the program's main */

/* Count a verdict of this rank; a failure prints its rank, place and printf-style reason. */
#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (cond) {                                                             \
            n_pass++;                                                           \
        } else {                                                                \
            n_fail++;                                                           \
            fprintf(stderr, "rank %d: FAIL %s:%d: ", rank, __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
        }                                                                       \
    } while (0)

/* True on every rank iff ok on every rank (collective). */
static inline int all_ranks(int ok)
{
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    return ok;
}

/* Collective, before MPI_Finalize: rank 0 prints "<name> <mode>(<N> ranks): P passed, F
 * failed" (its own counts); returns 1 when any rank failed, else 0. */
static inline int mpi_test_finish(const char *name, const char *mode)
{
    int fail_any = n_fail;
    MPI_Allreduce(MPI_IN_PLACE, &fail_any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) printf("%s %s(%d ranks): %d passed, %d failed\n", name, mode, size, n_pass, n_fail);
    return fail_any != 0;
}

#endif
