/*
 * divide.h — x[i] / d over an array, bit for bit as the division, fast where it can be.
 *
 * AVG is SUM / N. When N is a power of two, x * (1/N) is the same correctly rounded value as
 * x / N (1/N is exact, so both round the same real number, subnormal results included), and
 * a multiply vectorises where a division stalls; any other N divides.
 */
#ifndef GCOMP_CODECS_DIVIDE_H
#define GCOMP_CODECS_DIVIDE_H

#include <math.h>
#include <stddef.h>

#include "codecs/common.h"

/* The rule for one divisor, shared by the CPU loop below and the CUDA kernels: returns 1/d
 * when d is a power of two (then x * that is x / d, bit for bit), else 0 (divide). */
static inline GCOMP_HD float gcomp_divide_inverse(float d)
{
    int e;
    return frexpf(d, &e) == 0.5f ? ldexpf(1.0f, 1 - e) : 0.0f; /* d = 2^(e-1) */
}

/* x / d as the rule computes it, inv = gcomp_divide_inverse(d). */
static inline GCOMP_HD float gcomp_divide_one(float x, float d, float inv) { return inv != 0.0f ? x * inv : x / d; }

static inline void gcomp_divide_f32(float *x, size_t n, float d)
{
    const float inv = gcomp_divide_inverse(d);
    if (inv != 0.0f) {
        for (size_t i = 0; i < n; i++) x[i] *= inv;
    } else {
        for (size_t i = 0; i < n; i++) x[i] /= d;
    }
}

#endif
