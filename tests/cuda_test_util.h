/*
 * cuda_test_util.h — what the CUDA test programs share (tests/test_cuda_*.c,
 * tests/cuda_mpi_staging.c).
 *
 * For every program: cuda_test_no_device(), the skip check (exit 77 without a CUDA device),
 * VARIANTS (dtype and op pairs to compare device with host results on) and
 * residual_checkpoints_differ(), the comparison of two communicators' residual checkpoints
 * (public API only, so the MPI program can use it too).
 *
 * For the cmocka programs only (those that include test_util.h, hence cmocka.h, first):
 * CU/OK/EXPECT, which fail the running test with the file, line and message, device
 * allocation and copies (dmalloc, h2d, h2d_wait, d2h) and gauss_inputs().
 */
#ifndef GCOMP_TEST_CUDA_TEST_UTIL_H
#define GCOMP_TEST_CUDA_TEST_UTIL_H

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gcomp.h"

/* The element types and operations on which device results are compared with host ones. */
typedef struct variant {
    gcomp_dtype dtype;
    gcomp_op op;
    const char *name;
} variant;

static const variant VARIANTS[] = {
    { GCOMP_F32, GCOMP_SUM, "f32 sum" },
    { GCOMP_F32, GCOMP_AVG, "f32 avg" },
    { GCOMP_F16, GCOMP_AVG, "f16 avg" },
    { GCOMP_BF16, GCOMP_SUM, "bf16 sum" },
};
#define N_VARIANTS (sizeof VARIANTS / sizeof VARIANTS[0])

/* 1 (after printing "<name>: no CUDA device: skipped") when there is no usable CUDA device:
 * the caller then exits 77, which ctest counts as skipped (SKIP_RETURN_CODE 77). */
static inline int cuda_test_no_device(const char *name)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) return 0;
    printf("%s: no CUDA device: skipped\n", name);
    return 1;
}

/* 0 when the residual checkpoints of host and dev (gcomp_comm_residuals_save: keys, counts,
 * steps, residual bits) are the same bytes; else 1 with the reason in why. */
static inline int residual_checkpoints_differ(gcomp_comm *host, gcomp_comm *dev, char *why, size_t why_size)
{
    size_t hn = 0, dn = 0, i = 0;
    uint8_t *hb, *db;
    int differ = 1;
    if (gcomp_comm_residuals_save(host, NULL, 0, &hn) != GCOMP_SUCCESS ||
        gcomp_comm_residuals_save(dev, NULL, 0, &dn) != GCOMP_SUCCESS) {
        snprintf(why, why_size, "sizing a residual checkpoint failed: %s", gcomp_last_error());
        return 1;
    }
    if (hn != dn) {
        snprintf(why, why_size, "residual checkpoints of %zu (host) and %zu (device) bytes", hn, dn);
        return 1;
    }
    hb = malloc(hn ? hn : 1);
    db = malloc(dn ? dn : 1);
    if (!hb || !db)
        snprintf(why, why_size, "out of host memory for %zu-byte checkpoints", hn);
    else if (gcomp_comm_residuals_save(host, hb, hn, &hn) != GCOMP_SUCCESS ||
             gcomp_comm_residuals_save(dev, db, dn, &dn) != GCOMP_SUCCESS)
        snprintf(why, why_size, "saving a residual checkpoint failed: %s", gcomp_last_error());
    else if (memcmp(hb, db, hn) != 0) {
        while (hb[i] == db[i]) i++;
        snprintf(why, why_size, "residual checkpoints differ from byte %zu of %zu", i, hn);
    } else
        differ = 0;
    free(hb);
    free(db);
    return differ;
}

#ifdef cmocka_unit_test /* cmocka.h came first: the helpers that fail a cmocka test */

#define CU(x)                                                                                            \
    do {                                                                                                 \
        cudaError_t e_ = (x);                                                                            \
        if (e_ != cudaSuccess) fail_msg("%s:%d %s: %s", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
    } while (0)

#define OK(x)                                                                                                  \
    do {                                                                                                       \
        gcomp_result r_ = (x);                                                                                 \
        if (r_ != GCOMP_SUCCESS)                                                                               \
            fail_msg("%s:%d %s -> %s: %s", __FILE__, __LINE__, #x, gcomp_result_name(r_), gcomp_last_error()); \
    } while (0)

/* x must return want, and the last error message must contain substr (NULL: any message). */
#define EXPECT(x, want, substr)                                                                         \
    do {                                                                                                \
        gcomp_result r_ = (x);                                                                          \
        if (r_ != (want))                                                                               \
            fail_msg("%s:%d %s -> %s, expected %s (%s)", __FILE__, __LINE__, #x, gcomp_result_name(r_), \
                     gcomp_result_name(want), gcomp_last_error());                                      \
        cuda_test_mentions(__FILE__, __LINE__, (substr));                                               \
    } while (0)

static inline void cuda_test_mentions(const char *file, int line, const char *substr)
{
    if (substr && !strstr(gcomp_last_error(), substr))
        fail_msg("%s:%d message '%s' does not mention '%s'", file, line, gcomp_last_error(), substr);
}

/* at least one byte, so that an empty buffer still has a device address (cudaMalloc of 0
 * bytes gives NULL) */
static inline void *dmalloc(size_t bytes)
{
    void *p = NULL;
    CU(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
}

static inline void h2d(void *d, const void *h, size_t bytes) { CU(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice)); }

/* For calls that run on non-blocking streams, which do not wait for the legacy stream: a copy
 * from pageable memory may still be in flight when cudaMemcpy returns, so wait for it. */
static inline void h2d_wait(void *d, const void *h, size_t bytes)
{
    h2d(d, h, bytes);
    CU(cudaDeviceSynchronize());
}

/* count elements of dtype from N(0,1) floats (seeded); the caller frees */
static inline void *gauss_inputs(size_t count, gcomp_dtype dtype, uint64_t seed)
{
    float *x = tu_gauss_array(count, seed);
    uint16_t *h;
    if (dtype == GCOMP_F32) return x;
    h = malloc(count * 2 + 2);
    for (size_t i = 0; i < count; i++) h[i] = dtype == GCOMP_F16 ? gcomp_f32_to_f16(x[i]) : gcomp_f32_to_bf16(x[i]);
    free(x);
    return h;
}

static inline void d2h(void *h, const void *d, size_t bytes) { CU(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost)); }

#endif /* cmocka_unit_test */

#endif
