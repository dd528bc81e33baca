/*
 * gcomp_mpi.h — create a gcomp communicator over an MPI communicator (host memory).
 */
#ifndef GCOMP_MPI_H
#define GCOMP_MPI_H

/* From C++, Open MPI's and MPICH's mpi.h also declare the deprecated MPI C++ bindings, whose
 * inline code needs a library (libmpi_cxx) that gcomp's targets do not link: keep them out
 * (a program that wants them includes mpi.h first). */
#if defined(__cplusplus) && !defined(OMPI_SKIP_MPICXX)
#define OMPI_SKIP_MPICXX 1
#endif
#if defined(__cplusplus) && !defined(MPICH_SKIP_MPICXX)
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include "gcomp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Collective over `comm`. Duplicates comm (MPI_Comm_dup) and sets MPI_ERRORS_RETURN on the
 * duplicate, so an MPI failure becomes a gcomp error instead of an abort; never calls
 * MPI_Init or MPI_Finalize (MPI must be initialised, and MPI_Finalize must come after
 * gcomp_comm_destroy). cfg may be NULL (all unset: environment, then defaults).
 * A rank whose own creation fails (NULL out, bad spec or config, no memory) still takes part
 * in the duplication and the ranks' agreement, so every rank returns an error (the others
 * are told which rank failed and with what), none waits.
 * While gcomp waits for MPI requests it sets MPI_ERRORS_RETURN on MPI_COMM_WORLD too and
 * restores the previous handler before returning: Open MPI 4.1 reports a failed nonblocking
 * collective through MPI_COMM_WORLD's handler, which would abort the job. A thread that
 * uses MPI_COMM_WORLD concurrently sees that handler meanwhile; a handler it sets meanwhile
 * is kept (gcomp puts the saved one back only over its own MPI_ERRORS_RETURN).
 * Thread level: blocking calls need none beyond what the caller uses. gcomp_iallreduce
 * runs its calls on a progress thread only when MPI provides MPI_THREAD_MULTIPLE
 * (MPI_Query_thread, here and at the first gcomp_iallreduce); with a lower level they run
 * inside gcomp_test/gcomp_wait on the caller's thread (GCOMP_DEBUG=1 logs which).
 * A call still waiting for a peer when another thread calls MPI_Finalize (a program that
 * exits with a thread stuck in a call) stops touching MPI once finalization has begun and
 * fails with GCOMP_ERR_TRANSPORT, the communicator broken, instead of crashing the process.
 * Errors: GCOMP_ERR_INVALID_ARG (NULL out, MPI not initialised or already finalized,
 * MPI_COMM_NULL), GCOMP_ERR_INVALID_SPEC, GCOMP_ERR_MISMATCH (ranks configured different
 * codecs), GCOMP_ERR_TRANSPORT, GCOMP_ERR_NOMEM, GCOMP_ERR_TIMEOUT (a rank never joined).
 * After such a timeout, the waiting ranks' duplication of comm stays pending (MPI cannot
 * cancel it) and their next creation over comm takes it over, so a creation that the
 * missing rank joins works on every rank. A rank that came late to the one that timed out is
 * joined by the others' next creation when it is still in its own then (its late creation
 * and their next one succeed together, so the ranks then count creations differently: give
 * up on the communicator after a creation timed out, or retry until one succeeds on every
 * rank); one that gave up before they came back (their other MPI calls completed its
 * duplication meanwhile) gets GCOMP_ERR_TIMEOUT, and the next creation starts afresh.
 * timeout_ms bounds the duplication and then, from its end, the creation's agreement: a
 * creation can take up to twice it. */
GCOMP_API gcomp_result gcomp_comm_create_mpi(MPI_Comm comm, const gcomp_config *cfg, gcomp_comm **out);

#ifdef __cplusplus
}
#endif
#endif
