/*
 * Cast codecs — none (fp32 identity), fp16, bf16 — wire format and the conversions shared
 * by the CPU reference (cast.c) and the CUDA kernels (cuda/cast.cu).
 *
 * Body (after the 32-byte gcomp header; flags 0): count values, 4 bytes (none) or 2 bytes
 * (fp16, bf16) each, little-endian.
 *
 * Rounding is to nearest, ties to even. NaN stays NaN (quiet bit set, top payload bits kept,
 * as F16C hardware does). A finite input that rounds to +-inf is an overflow: counted in
 * ctx->overflow and, like a NaN/Inf input, reported as non-finite so the residual is kept.
 * Error feedback: r_out = x - decode(encode(x)).
 */
#ifndef GCOMP_CODECS_CAST_H
#define GCOMP_CODECS_CAST_H

#include <string.h>

#include "gcomp_codec.h"
#include "codecs/common.h"

#define GCOMP_WIRE_ID_NONE 1
#define GCOMP_WIRE_ID_FP16 2
#define GCOMP_WIRE_ID_BF16 3

/* f32 -> f16, round to nearest even. Written branch-free (selects) so loops vectorise. */
static inline GCOMP_HD uint16_t gcomp_f16_from_bits(uint32_t x)
{
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t a = x & 0x7fffffffu;
    /* normal range: rebias the exponent, round the 13 dropped mantissa bits to even; a
     * carry out of the mantissa correctly bumps the exponent (up to 0x7c00 = inf) */
    uint32_t normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13; /* 0xc8000000 = (15-127)<<23 */
    /* subnormal range (|x| < 2^-14): adding 0.5f aligns the value so the FPU's own
     * round-to-nearest-even leaves the f16 subnormal bits in the low mantissa */
    uint32_t sub = gcomp_f32_bits(gcomp_bits_f32(a) + 0.5f) - 0x3f000000u;
    uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
    uint32_t o = a < 0x38800000u ? sub : normal;
    o = a >= 0x47800000u ? 0x7c00u : o; /* >= 65536: inf */
    o = a > 0x7f800000u ? nan : o;
    return (uint16_t)(o | sign);
}

static inline GCOMP_HD float gcomp_f16_to_f32_inline(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = (uint32_t)(h & 0x7fffu) << 13; /* exponent and mantissa in f32 position */
    uint32_t exp = em & 0x0f800000u;
    uint32_t normal = em + 0x38000000u; /* rebias 15 -> 127 */
    uint32_t infnan = em + 0x70000000u; /* exponent 31 -> 255 */
    /* subnormal: build 2^-14 * (1 + m) exactly, then subtract 2^-14 (exact in f32) */
    uint32_t sub = gcomp_f32_bits(gcomp_bits_f32(em + 0x38800000u) - gcomp_bits_f32(0x38800000u));
    uint32_t o = exp == 0x0f800000u ? infnan : (exp == 0 ? sub : normal);
    return gcomp_bits_f32(o | sign);
}

/* f32 -> bf16, round to nearest even; NaN stays a quiet NaN. */
static inline GCOMP_HD uint16_t gcomp_bf16_from_bits(uint32_t x)
{
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    uint32_t nan = (x >> 16) | 0x40u;
    return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

static inline GCOMP_HD float gcomp_bf16_to_f32_inline(uint16_t h) { return gcomp_bits_f32((uint32_t)h << 16); }

typedef struct gcomp_cast_params {
    int unused; /* the cast codecs have no parameters */
} gcomp_cast_params;

/* the CUDA ops (cuda/cast.cu), NULL without CUDA */
GCOMP_DECLARE_CUDA_OPS(none);
GCOMP_DECLARE_CUDA_OPS(fp16);
GCOMP_DECLARE_CUDA_OPS(bf16);

extern const gcomp_codec_vtable gcomp__codec_none;
extern const gcomp_codec_vtable gcomp__codec_fp16;
extern const gcomp_codec_vtable gcomp__codec_bf16;

#endif
