/*
 * common.h — helpers shared by the CPU reference (codecs/<codec>.c) and the CUDA kernels (cuda/<codec>.cu),
 * so both compute every element the same way: one GCOMP_HD macro, float bit casts,
 * little-endian loads and stores, bit counts, half and bfloat16 rounding, the TernGrad RNG
 * mixers, the division rule and LSB-first bit streams. Free of compiler builtins nvcc's device
 * side lacks. What only one codec needs (its wire format, Rice codes, the TernGrad code rule)
 * stays in that codec's header and uses these.
 */
#ifndef GCOMP_CODECS_COMMON_H
#define GCOMP_CODECS_COMMON_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define GCOMP_HD __host__ __device__
#else
#define GCOMP_HD
#endif

/* The CUDA ops table of a built-in codec, or NULL when the library is built without CUDA:
 * the only #ifdef a codec's vtable needs (cuda/<codec>.cu defines gcomp__cuda_ops_<name>). */
#if defined(GCOMP_WITH_CUDA)
#define GCOMP_CUDA_OPS(name) (&gcomp__cuda_ops_##name)
#define GCOMP_DECLARE_CUDA_OPS(name) extern const gcomp_codec_cuda_ops gcomp__cuda_ops_##name
#else
#define GCOMP_CUDA_OPS(name) NULL
#define GCOMP_DECLARE_CUDA_OPS(name) struct gcomp__cuda_ops_unused_##name
#endif

static inline GCOMP_HD uint32_t gcomp_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline GCOMP_HD float gcomp_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The bits an x86 CPU (SSE/AVX, what the CPU reference runs on) gives for a NaN result of
 * s = a op b: a's NaN quieted, else b's, else the default NaN 0xffc00000 (inf - inf, 0 * inf).
 * CUDA's float arithmetic returns 0x7fffffff for every NaN, so kernels pass a sum or quotient
 * that may meet a NaN input through this; finite and infinite s come back unchanged. With two
 * NaN operands the CPU's choice depends on the compiler's operand order: only then may the
 * bits differ. */
static inline GCOMP_HD float gcomp_x86_nan_f32(float s, float a, float b)
{
    uint32_t ua = gcomp_f32_bits(a), ub = gcomp_f32_bits(b);
    if (s == s) return s;
    if ((ua & 0x7fffffffu) > 0x7f800000u) return gcomp_bits_f32(ua | 0x00400000u);
    if ((ub & 0x7fffffffu) > 0x7f800000u) return gcomp_bits_f32(ub | 0x00400000u);
    return gcomp_bits_f32(0xffc00000u);
}

/* Little-endian loads and stores at any alignment (bodies are byte streams). */
static inline GCOMP_HD void gcomp_le_store_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}
static inline GCOMP_HD uint32_t gcomp_le_load_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline GCOMP_HD void gcomp_le_store_u64(uint8_t *p, uint64_t v)
{
    gcomp_le_store_u32(p, (uint32_t)v);
    gcomp_le_store_u32(p + 4, (uint32_t)(v >> 32));
}
static inline GCOMP_HD uint64_t gcomp_le_load_u64(const uint8_t *p)
{
    return (uint64_t)gcomp_le_load_u32(p) | (uint64_t)gcomp_le_load_u32(p + 4) << 32;
}

/* Trailing zero bits of v != 0 (64 for v == 0). */
static inline GCOMP_HD unsigned gcomp_ctz64(uint64_t v)
{
#if defined(__CUDA_ARCH__)
    return v ? (unsigned)(__ffsll((long long)v) - 1) : 64u;
#elif defined(__GNUC__)
    return v ? (unsigned)__builtin_ctzll(v) : 64u;
#else
    unsigned n = 0;
    if (!v) return 64u;
    while (!(v & 1)) v >>= 1, n++;
    return n;
#endif
}

/* Bit length of v (0 for v == 0). */
static inline GCOMP_HD unsigned gcomp_bit_length64(uint64_t v)
{
#if defined(__CUDA_ARCH__)
    return 64u - (unsigned)__clzll((long long)v);
#elif defined(__GNUC__)
    return v ? 64u - (unsigned)__builtin_clzll(v) : 0u;
#else
    unsigned w = 0;
    while (v) w++, v >>= 1;
    return w;
#endif
}

/* ---- RNG mixers (TernGrad's counter-based RNG; see codecs/terngrad.h) -------------------- */

/* The splitmix64 finaliser. */
static inline GCOMP_HD uint64_t gcomp_mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The "lowbias32" integer hash. */
static inline GCOMP_HD uint32_t gcomp_mix32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

/* ---- half and bfloat16 (codecs/cast.h's formats; top-k's fp16 values) -------------------- */

/* f32 -> f16, round to nearest even. Written branch-free (selects) so loops vectorise, and in
 * integers: the result does not depend on the FPU's rounding mode (x86's F16C instructions,
 * cast.c, give the same bits). */
static inline GCOMP_HD uint16_t gcomp_f16_from_bits(uint32_t x)
{
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t a = x & 0x7fffffffu;
    /* normal range: rebias the exponent, round the 13 dropped mantissa bits to even; a
     * carry out of the mantissa correctly bumps the exponent (up to 0x7c00 = inf) */
    uint32_t normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13; /* 0xc8000000 = (15-127)<<23 */
    /* subnormal range (|x| < 2^-14): the value is m * 2^(e-150), in units of 2^-24 that is
     * m >> (126 - e), rounded to even here in integers -- not with the FPU, whose rounding
     * mode the caller may have changed. e is clamped so the shift stays in [14, 31]: above,
     * the lane is not subnormal (unused); below, every bit shifts out and m < half: 0. */
    uint32_t e = a >> 23;
    uint32_t shift = 126u - (e > 112u ? 112u : (e < 95u ? 95u : e));
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    uint32_t sub = q + ((rem > half) | ((rem == half) & q & 1u));
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
    /* subnormal (and zero): m * 2^-24, exact in f32 in every rounding mode, +0 for m = 0 */
    uint32_t sub = gcomp_f32_bits((float)(int32_t)(em >> 13) * 0x1p-24f);
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

/* ---- division: x[i] / d, bit for bit as the division, fast where it can be --------------
 * AVG is SUM / N. When N is a power of two, x * (1/N) is the same correctly rounded value as
 * x / N (1/N is exact, so both round the same real number, subnormal results included), and
 * a multiply vectorises where a division stalls; any other N divides. */

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

/* ---- bit streams ------------------------------------------------------------------------
 * LSB-first bit streams for codec bodies: a writer of fields up to 32 bits and a reader that
 * never reads past its end (so it is safe on untrusted payloads). Bits fill each byte from its
 * least-significant bit; the last byte is padded with zero bits. Used by top-k (Rice-coded
 * gaps and packed values) and by TernGrad's packed sums outside its fast blocks, on the host
 * and, through the same functions, in the CUDA kernels. */

typedef struct gcomp_bitwriter {
    uint8_t *out;
    size_t pos;    /* bytes written */
    uint64_t acc;  /* bits not yet written */
    unsigned fill; /* how many, < 32 between calls */
} gcomp_bitwriter;

/* Appends the low w bits of v (w <= 32; higher bits of v must be zero). */
static inline GCOMP_HD void gcomp_bits_put(gcomp_bitwriter *bw, uint64_t v, unsigned w)
{
    bw->acc |= v << bw->fill;
    bw->fill += w;
    if (bw->fill >= 32) {
        gcomp_le_store_u32(bw->out + bw->pos, (uint32_t)bw->acc);
        bw->pos += 4;
        bw->acc >>= 32;
        bw->fill -= 32;
    }
}

/* Writes the last partial bytes (zero-padded). Returns the bytes written in all. */
static inline GCOMP_HD size_t gcomp_bits_flush(gcomp_bitwriter *bw)
{
    for (; bw->fill > 0; bw->fill = bw->fill > 8 ? bw->fill - 8 : 0) {
        bw->out[bw->pos++] = (uint8_t)bw->acc;
        bw->acc >>= 8;
    }
    bw->acc = 0;
    return bw->pos;
}

typedef struct gcomp_bitreader {
    const uint8_t *in;
    size_t pos, end; /* next byte to load, and the end of what may be read */
    uint64_t acc;    /* bits loaded but not consumed; above them, zeros or the stream's next bits */
    unsigned avail;  /* how many */
} gcomp_bitreader;

/* Loads whole bytes so that at least 56 bits are available, or all that is left. Away from the
 * end this is one unaligned 8-byte load and no branch on the data: bytes already in acc are
 * loaded again at the same place, which changes nothing. */
static inline GCOMP_HD void gcomp_bits_refill(gcomp_bitreader *br)
{
    if (br->end - br->pos >= 8) {
        br->acc |= gcomp_le_load_u64(br->in + br->pos) << br->avail;
        br->pos += (63 - br->avail) >> 3;
        br->avail |= 56; /* = avail + 8 x the bytes taken */
        return;
    }
    while (br->avail <= 56 && br->pos < br->end) {
        br->acc |= (uint64_t)br->in[br->pos++] << br->avail;
        br->avail += 8;
    }
}

/* Takes w bits (w <= 32). Returns 0 when the input ended first. */
static inline GCOMP_HD int gcomp_bits_get(gcomp_bitreader *br, unsigned w, uint64_t *v)
{
    if (br->avail < w) gcomp_bits_refill(br);
    if (br->avail < w) return 0;
    *v = br->acc & (((uint64_t)1 << w) - 1);
    br->acc >>= w;
    br->avail -= w;
    return 1;
}

#endif
