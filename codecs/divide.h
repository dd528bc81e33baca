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

static inline void gcomp_divide_f32(float *x, size_t n, float d)
{
    int e;
    if (frexpf(d, &e) == 0.5f) { /* d = 2^(e-1) */
        const float inv = ldexpf(1.0f, 1 - e);
        for (size_t i = 0; i < n; i++) x[i] *= inv;
    } else {
        for (size_t i = 0; i < n; i++) x[i] /= d;
    }
}

#endif
