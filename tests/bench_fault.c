/*
 * bench_fault.c — an LD_PRELOAD library that breaks gcomp_allreduce's result the ways a
 * defect could, for the test that allreduce_perf's check can fail (allreduce_check_fails):
 * GCOMP_TEST_FAULT=skip (the call writes nothing), zero, half, negate, or local (each rank
 * keeps its own input). fp32 calls only (allreduce_perf's default data type).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "gcomp.h"

typedef gcomp_result (*allreduce_fn)(gcomp_comm *, const void *, void *, size_t, gcomp_dtype, gcomp_op, uint64_t,
                                     struct CUstream_st *);

static void corrupt(const char *fault, const float *x, float *y, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(fault, "zero") == 0)
            y[i] = 0;
        else if (strcmp(fault, "half") == 0)
            y[i] *= 0.5f;
        else if (strcmp(fault, "negate") == 0)
            y[i] = -y[i];
        else if (strcmp(fault, "local") == 0)
            y[i] = x[i];
    }
}

gcomp_result gcomp_allreduce(gcomp_comm *comm, const void *send, void *recv, size_t count, gcomp_dtype dtype,
                             gcomp_op op, uint64_t key, struct CUstream_st *stream)
{
    allreduce_fn real;
    const char *fault = getenv("GCOMP_TEST_FAULT");
    gcomp_result rc;
    if (fault && strcmp(fault, "skip") == 0) return GCOMP_SUCCESS;
    *(void **)&real = dlsym(RTLD_NEXT, "gcomp_allreduce");
    rc = real(comm, send, recv, count, dtype, op, key, stream);
    if (rc == GCOMP_SUCCESS && fault && dtype == GCOMP_F32) corrupt(fault, send, recv, count);
    return rc;
}
