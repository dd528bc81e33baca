/*
 * common.h — helpers shared by the CPU reference (codecs/<codec>.c) and the CUDA kernels (cuda/<codec>.cu),
 * so both compute every element the same way: one GCOMP_HD macro, float bit casts,
 * little-endian loads and stores, bit counts. Free of compiler builtins nvcc's device side lacks.
 * Codec-specific helpers (half/bfloat rounding, the TernGrad RNG, Rice codes) live in their
 * codec's header and use these.
 */
#ifndef GCOMP_CODECS_COMMON_H
#define GCOMP_CODECS_COMMON_H

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

#endif
