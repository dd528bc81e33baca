/*
 * Cast codecs — none (fp32 identity), fp16, bf16 — wire format. The conversions the CPU
 * reference (cast.c) and the CUDA kernels (cuda/cast.cu) share are in codecs/common.h.
 *
 * Body (after the 32-byte gcomp header; flags 0): count values, 4 bytes (none) or 2 bytes
 * (fp16, bf16) each, little-endian.
 *
 * Rounding is to nearest, ties to even. NaN stays NaN (quiet bit set, top payload bits kept,
 * as F16C hardware does). A finite input that rounds to +-inf is an overflow: counted in
 * ctx->overflow and, like a NaN/Inf input, reported as non-finite so the residual is kept.
 * Error feedback: r_out = x - decode(encode(x)).
 *
 * On x86 CPUs with F16C the fp16 loops use its conversion instructions, which give these
 * exact bits (cast.c; checked on every float by test_cast), in every rounding mode: the
 * conversions never depend on the FPU's. One thing is not specified: when both the gradient
 * and the residual hold a NaN, which NaN's payload x = g + r keeps (compilers order the
 * operands of the add as they like, and x86 keeps the first one's).
 */
#ifndef GCOMP_CODECS_CAST_H
#define GCOMP_CODECS_CAST_H

#include <string.h>

#include "gcomp_codec.h"
#include "codecs/common.h"

#define GCOMP_WIRE_ID_NONE 1
#define GCOMP_WIRE_ID_FP16 2
#define GCOMP_WIRE_ID_BF16 3

typedef struct gcomp_cast_params {
    int unused; /* the cast codecs have no parameters */
} gcomp_cast_params;

/* the CUDA ops (cuda/cast.cu), NULL without CUDA */
GCOMP_DECLARE_CUDA_OPS(none);
GCOMP_DECLARE_CUDA_OPS(fp16);
GCOMP_DECLARE_CUDA_OPS(bf16);

/* Test switch (cast.c): nonzero makes the fp16 loops use only the reference conversions, not
 * the F16C instructions that compute the same bits faster. Not thread-safe; tests only. */
extern int gcomp__cast_reference_only;
/* Nonzero when the fp16 loops run on F16C (the CPU has it and the switch is 0). */
int gcomp__cast_f16c_active(void);

/* Not in the codec ABI: dst[0..n) = 0 + each decoded element of a cast codec's body, the bits
 * that zeroing dst and decode_add give (-0 becomes +0), in one pass instead of two; for
 * gcomp_codec_decode and the engine's schedules. GCOMP_ERR_UNSUPPORTED, with no message, when
 * vt is not none, fp16 or bf16; a malformed body fails as decode_add does. */
gcomp_result gcomp__cast_decode_set(const gcomp_codec_vtable *vt, uint32_t flags, const uint8_t *body, size_t bytes,
                                    float *dst, size_t n);

/* A cast codec's body as a payload holds it (after its header). */
typedef struct gcomp__cast_body {
    const uint8_t *body;
    size_t bytes;
    uint32_t flags;
} gcomp__cast_body;
/* Not in the codec ABI either: dst[i] = (0 + decoded a[i]) + decoded b[i], the bits of zeroing
 * dst and decode-adding a, then b, in one pass instead of three (recursive doubling's sum of
 * a pair) -- except that where both a[i] and b[i] are NaN the sum keeps either one's payload
 * (the loops' operand order is the compiler's; the device path's decode-adds keep a's). A
 * non-finite result fails the call's finite check anyway. GCOMP_ERR_UNSUPPORTED, with no
 * message, when vt is not a cast codec. */
gcomp_result gcomp__cast_decode_sum2(const gcomp_codec_vtable *vt, const gcomp__cast_body *a, const gcomp__cast_body *b,
                                     float *dst, size_t n);

extern const gcomp_codec_vtable gcomp__codec_none;
extern const gcomp_codec_vtable gcomp__codec_fp16;
extern const gcomp_codec_vtable gcomp__codec_bf16;

/* 1 for the three cast codecs, whose bodies the functions above take. */
static inline int gcomp__is_cast_codec(const gcomp_codec_vtable *vt)
{
    return vt == &gcomp__codec_none || vt == &gcomp__codec_fp16 || vt == &gcomp__codec_bf16;
}

#endif
