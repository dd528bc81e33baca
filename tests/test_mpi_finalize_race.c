/*
 * test_mpi_finalize_race.c — MPI_Finalize while the progress thread is starting a call's
 * messages (ctest runs it with 2 ranks, several times over).
 *
 * Each rank queues many small gcomp_iallreduce calls and calls MPI_Finalize with them in
 * flight: a program that exits while a thread of its own still talks to MPI. gcomp must then
 * stop calling MPI (a call after MPI_Finalize crashes Open MPI) and fail the calls instead.
 * The window between gcomp's check that MPI is alive and the MPI_Isend / MPI_Iallreduce that
 * starts a call's messages is a few instructions wide; this program widens it by defining
 * those two functions itself (the MPI profiling interface: they call PMPI_*) and sleeping
 * 20 ms in them once the calls are queued, so the progress thread is inside one when
 * MPI_Finalize comes. Before the start calls were counted in the transport's in_wait, 6 runs
 * of 6 crashed there (SIGSEGV, or Open MPI's "MPI_Isend() was called after MPI_FINALIZE").
 * Passes when every wait returns and every call has failed or succeeded cleanly.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <mpi.h>

#include "gcomp.h"
#include "gcomp_mpi.h"

#define CALLS 200
#define COUNT 40

static atomic_int widen; /* set once the calls are queued */

int MPI_Isend(const void *buf, int count, MPI_Datatype type, int to, int tag, MPI_Comm comm, MPI_Request *req)
{
    if (atomic_load(&widen)) usleep(20000);
    return PMPI_Isend(buf, count, type, to, tag, comm, req);
}

int MPI_Iallreduce(const void *send, void *recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                   MPI_Request *req)
{
    if (atomic_load(&widen)) usleep(20000);
    return PMPI_Iallreduce(send, recv, count, type, op, comm, req);
}

int main(int argc, char **argv)
{
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *c = NULL;
    gcomp_request *req[CALLS];
    static float x[COUNT], y[CALLS][COUNT];
    int provided, rank, fails = 0, ok = 0, failed = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (provided < MPI_THREAD_MULTIPLE) { /* no progress thread: nothing runs during MPI_Finalize */
        if (rank == 0) printf("test_mpi_finalize_race: skipped, MPI gave no MPI_THREAD_MULTIPLE\n");
        MPI_Finalize();
        return 0;
    }
    cfg.codec = "fp16";
    cfg.min_bytes = 0;
    cfg.timeout_ms = 3000;
    if (gcomp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c) != GCOMP_SUCCESS) {
        fprintf(stderr, "rank %d: FAIL: create: %s\n", rank, gcomp_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int i = 0; i < COUNT; i++) x[i] = (float)(i + rank);
    for (int i = 0; i < CALLS; i++)
        if (gcomp_iallreduce(c, x, y[i], COUNT, GCOMP_F32, GCOMP_SUM, (uint64_t)(i % 3), NULL, &req[i]) !=
            GCOMP_SUCCESS) {
            fprintf(stderr, "rank %d: FAIL: iallreduce %d: %s\n", rank, i, gcomp_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    atomic_store(&widen, 1);
    usleep(5000 + 3000 * (useconds_t)rank);
    MPI_Finalize();
    for (int i = 0; i < CALLS; i++) {
        gcomp_result rc = gcomp_wait(&req[i]);
        if (rc == GCOMP_SUCCESS)
            ok++;
        else if (rc == GCOMP_ERR_TRANSPORT || rc == GCOMP_ERR_COMM_INVALID || rc == GCOMP_ERR_INVALID_ARG)
            failed++;
        else {
            fprintf(stderr, "rank %d: FAIL: call %d returned %s: %s\n", rank, i, gcomp_result_name(rc),
                    gcomp_last_error());
            fails++;
        }
    }
    gcomp_comm_destroy(c);
    printf("test_mpi_finalize_race: rank %d: %d calls succeeded before MPI_Finalize, %d failed after it, %d wrong\n",
           rank, ok, failed, fails);
    return fails ? 1 : 0;
}
