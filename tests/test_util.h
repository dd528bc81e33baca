/* test_util.h — small helpers shared by the unit tests: a deterministic RNG and a
 * one-call encode/decode through the public API. */
#ifndef GCOMP_TEST_UTIL_H
#define GCOMP_TEST_UTIL_H

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <setjmp.h>
#include <cmocka.h>

#include "gcomp.h"

static inline uint64_t tu_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline double tu_uniform(uint64_t *s) { return (double)(tu_next(s) >> 11) * 0x1p-53; }

static inline float tu_gauss(uint64_t *s)
{
    double u1 = tu_uniform(s), u2 = tu_uniform(s);
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static inline float *tu_gauss_array(size_t n, uint64_t seed)
{
    float *x = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = tu_gauss(&seed);
    return x;
}

/* Encode src with key through a codec, decode into a fresh zeroed array. Returns the
 * decoded array (caller frees) and the payload size in *bytes. */
static inline float *tu_roundtrip(gcomp_codec *c, uint64_t key, const float *src, size_t n, size_t *bytes)
{
    size_t cap = gcomp_codec_max_encoded_bytes(c, n), w = 0;
    uint8_t *buf = malloc(cap);
    float *out = calloc(n ? n : 1, sizeof(float));
    assert_int_equal(gcomp_codec_encode(c, key, src, n, GCOMP_F32, buf, cap, &w), GCOMP_SUCCESS);
    assert_true(w <= cap);
    assert_int_equal(gcomp_codec_decode_add(c, buf, w, out, n), GCOMP_SUCCESS);
    if (bytes) *bytes = w;
    free(buf);
    return out;
}

static inline gcomp_codec *tu_codec(const char *spec)
{
    gcomp_codec *c = NULL;
    gcomp_result rc = gcomp_codec_create(spec, NULL, &c);
    if (rc != GCOMP_SUCCESS) print_error("spec %s: %s\n", spec, gcomp_last_error());
    assert_int_equal(rc, GCOMP_SUCCESS);
    return c;
}

#endif
