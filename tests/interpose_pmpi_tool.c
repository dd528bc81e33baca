/*
 * interpose_pmpi_tool.c — a PMPI tool, as profilers and tracers are: it defines MPI_Allreduce,
 * MPI_Bcast, MPI_Comm_free and MPI_Finalize, counts the calls and passes each to its PMPI_*
 * entry point. At MPI_Finalize each rank prints
 *   "pmpi tool rank R: allreduce=A bcast=B comm_free=F finalize=1"
 * Preloaded after libgcomp_mpi.so it must still see the calls gcomp passes through
 * (interpose.sh with IP_TOOL); preloaded before it, it takes every call and gcomp says so.
 */
#include <stdio.h>

#include <mpi.h>

static long n_allreduce, n_bcast, n_comm_free;

int MPI_Allreduce(const void *send, void *recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm)
{
    __atomic_add_fetch(&n_allreduce, 1, __ATOMIC_RELAXED);
    return PMPI_Allreduce(send, recv, count, type, op, comm);
}

int MPI_Bcast(void *buf, int count, MPI_Datatype type, int root, MPI_Comm comm)
{
    __atomic_add_fetch(&n_bcast, 1, __ATOMIC_RELAXED);
    return PMPI_Bcast(buf, count, type, root, comm);
}

int MPI_Comm_free(MPI_Comm *comm)
{
    __atomic_add_fetch(&n_comm_free, 1, __ATOMIC_RELAXED);
    return PMPI_Comm_free(comm);
}

int MPI_Finalize(void)
{
    int rank = -1;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    printf("pmpi tool rank %d: allreduce=%ld bcast=%ld comm_free=%ld finalize=1\n", rank, n_allreduce, n_bcast,
           n_comm_free);
    fflush(stdout);
    return PMPI_Finalize();
}
