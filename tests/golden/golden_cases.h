/*
 * golden_cases.h — what the golden files freeze, shared by the generator (tests/make_golden.c)
 * and the check (tests/test_golden.c), so the two can never disagree on the input or options.
 *
 * Each case encodes golden_input() (GOLDEN_COUNT elements, fp32) once, through the public
 * API, with a fresh codec object created with golden_options() and key GCOMP_KEY_NONE (so
 * the input reaches the codec bit for bit and the step is 0). Files, per case:
 *   <name>.bin      the payload (header + body) exactly as encoded
 *   <name>.out.bin  what gcomp_codec_decode (f32) makes of it: GOLDEN_COUNT little-endian f32
 * where <name> is the spec with every character outside [a-z0-9.] replaced by '_'.
 *
 * Changing anything here changes every golden file: that is a wire-format change.
 */
#ifndef GCOMP_GOLDEN_CASES_H
#define GCOMP_GOLDEN_CASES_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gcomp.h"

#define GOLDEN_COUNT 1001 /* odd, not a multiple of the terngrad bucket or of 4 */
#define GOLDEN_SEED 0x5eedull
#define GOLDEN_RANK 3u
#define GOLDEN_NAME_MAX 96

static const char *const golden_specs[] = {
    "none",
    "fp16",
    "bf16",
    "terngrad:clip=0", /* written when clip=0 was the default: the file is terngrad_clip_0.bin */
    "terngrad:bucket=8,clip=0",
    "terngrad:clip=2.5",
    "topk:ratio=0.1",
    "topk:ratio=0.1,values=fp16",
    "fp16+zstd",
    "topk:ratio=0.1+zstd",
    "terngrad:clip=0+zstd",
};
#define GOLDEN_N_SPECS (sizeof golden_specs / sizeof golden_specs[0])

/* The file name stem of a spec ("topk:ratio=0.1+zstd" -> "topk_ratio_0.1_zstd"). */
static inline void golden_name(const char *spec, char out[GOLDEN_NAME_MAX])
{
    size_t i = 0;
    for (; spec[i] && i + 1 < GOLDEN_NAME_MAX; i++) {
        char ch = spec[i];
        int keep = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '.';
        out[i] = keep ? ch : '_';
    }
    out[i] = '\0';
}

/* The element codec part of a zstd chain ("fp16+zstd" -> "fp16"), or NULL if the spec has no
 * zstd stage. */
static inline const char *golden_inner_spec(const char *spec, char out[GOLDEN_NAME_MAX])
{
    const char *plus = strstr(spec, "+zstd");
    size_t len;
    if (!plus) return NULL;
    len = (size_t)(plus - spec);
    memcpy(out, spec, len);
    out[len] = '\0';
    return out;
}

static inline gcomp_codec_options golden_options(void)
{
    gcomp_codec_options o = gcomp_codec_options_default();
    o.seed = GOLDEN_SEED;
    o.rank = GOLDEN_RANK;
    return o;
}

#define GOLDEN_TIE 0.5f /* magnitude of every 10th element: top-k's threshold falls inside */

/* Deterministic input, exact on every platform: a 32-bit LCG gives a 24-bit signed integer
 * and a power-of-two scale (no libm, no rounding). Every 10th element has magnitude
 * GOLDEN_TIE, so top-k must break ties by index; a few elements pin rounding corner cases. */
static inline void golden_input(float *x, size_t n)
{
    static const float scale[8] = {0x1p-23f, 0x1p-24f, 0x1p-25f, 0x1p-26f,
                                   0x1p-27f, 0x1p-28f, 0x1p-30f, 0x1p-33f};
    uint32_t s = 20240601u;
    for (size_t i = 0; i < n; i++) {
        int32_t m;
        s = s * 1664525u + 1013904223u;
        m = (int32_t)(s >> 8) - (1 << 23); /* [-2^23, 2^23): exact in f32 */
        s = s * 1664525u + 1013904223u;
        x[i] = (float)m * scale[s >> 29];
        if (i % 10 == 9) x[i] = (i / 10) % 2 ? -GOLDEN_TIE : GOLDEN_TIE;
    }
    if (n > 7) {
        x[3] = -0.0f;
        x[5] = 0x1p-130f;           /* f32 subnormal: flushes to 0 in fp16 */
        x[6] = 1.0f + 0x1p-11f;     /* fp16 tie: rounds to even (1.0) */
        x[7] = -(1.0f + 0x1p-8f);   /* bf16 tie: rounds to even (-1.0) */
    }
}

#endif
