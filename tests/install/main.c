/* A program outside the tree that finds an installed gcomp (CMake package or pkg-config), built
 * as C and, through main.cpp, as C++. CONSUMER_MPI, CONSUMER_NCCL: gcomp_mpi.h, gcomp_nccl.h
 * are installed; include them too (their MPI, NCCL and CUDA headers must be found). */
#include <stdio.h>
#include <string.h>

#include <gcomp.h>
#ifdef CONSUMER_MPI
#include <gcomp_mpi.h>
#endif
#ifdef CONSUMER_NCCL
#include <gcomp_nccl.h>
#endif

int main(void)
{
    gcomp_codec *c = NULL;
    gcomp_result rc = gcomp_codec_create("topk:ratio=0.1+zstd", NULL, &c);
    int ok = rc == GCOMP_SUCCESS && strcmp(gcomp_codec_spec(c), "topk:ratio=0.1,k=0,values=fp32+zstd:level=1") == 0;
#ifdef CONSUMER_MPI
    /* MPI is not initialised, so this is refused: the program needs no MPI launcher */
    gcomp_comm *comm = NULL;
    ok = ok && gcomp_comm_create_mpi(MPI_COMM_WORLD, NULL, &comm) == GCOMP_ERR_INVALID_ARG;
#endif
    printf("installed gcomp %d.%d.%d: %s\n", GCOMP_VERSION_MAJOR, GCOMP_VERSION_MINOR, GCOMP_VERSION_PATCH,
           ok ? "ok" : gcomp_last_error());
    gcomp_codec_destroy(c);
    return ok ? 0 : 1;
}
