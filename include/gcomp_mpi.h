/*
 * gcomp_mpi.h — create a gcomp communicator over an MPI communicator (host memory).
 */
#ifndef GCOMP_MPI_H
#define GCOMP_MPI_H

#include <mpi.h>

#include "gcomp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Collective over `comm`. Duplicates comm (MPI_Comm_dup) and sets MPI_ERRORS_RETURN on the
 * duplicate, so an MPI failure becomes a gcomp error instead of an abort; never calls
 * MPI_Init or MPI_Finalize (MPI must be initialised, and MPI_Finalize must come after
 * gcomp_comm_destroy). cfg may be NULL (all unset: environment, then defaults).
 * Errors: GCOMP_ERR_INVALID_ARG (NULL out, MPI not initialised), GCOMP_ERR_INVALID_SPEC,
 * GCOMP_ERR_MISMATCH (ranks configured different codecs), GCOMP_ERR_TRANSPORT,
 * GCOMP_ERR_NOMEM. */
gcomp_result gcomp_comm_create_mpi(MPI_Comm comm, const gcomp_config *cfg, gcomp_comm **out);

#ifdef __cplusplus
}
#endif
#endif
