/*
 * TernGrad (Wen et al., 2017) — wire format, RNG and integer-sum helpers shared by the CPU
 * reference (terngrad.c) and the CUDA kernels (cuda/terngrad.cu).
 *
 * x = g + r. Elements are grouped into buckets of B elements (bucket=B), or one bucket for
 * the whole tensor (bucket=0, the paper's default). Bucket j has a scale s_j:
 *   s_j = max |x_i| over the bucket, or with clip=c > 0, min(max |x_i|, c * rms_j)
 * (a NaN max is written as the quiet NaN 0x7fc00000, whatever its payload)
 * where rms_j = sqrt(ss_j / m_j), computed in double as clip * sqrt(ss_j / m_j) and compared
 * with max |x| before rounding to float. ss_j, the sum of x_i^2 over the bucket, is summed in
 * this exact order (the CUDA kernels reproduce it): squares in double; the bucket is cut into
 * blocks of GCOMP_TG_RMS_BLOCK (256) elements from its start, the last one zero-padded; inside
 * a block a halving-stride tree (t[k] = x[k]^2 + x[k+128]^2, then t[k] += t[k+w] for w = 64,
 * 32, ..., 1); block sums are added one after the other, from 0, within each group of
 * GCOMP_TG_RMS_GROUP (1024) consecutive blocks; the group sums are added one after the other,
 * from 0, in group order. (Up to 1024 blocks, 262,144 elements, this is one sequential sum of
 * the block sums; the groups let a GPU sum a large tensor in parallel.) The engine may replace
 * s_j by the max over all ranks before quantising.
 * Each element becomes a code t_i in {-1, 0, +1}:
 *   y_i = clamp(x_i, -s_j, s_j);  u_i = gcomp_tg_uniform(key, i);
 *   t_i = sign(y_i) if u_i * s_j < |y_i| else 0        (all in fp32, no FMA)
 * so E[t_i * s_j] = y_i (unbiased up to 2^-24). decode(x)_i = t_i * s_j.
 * Error feedback: r_out_i = x_i - t_i * s_j (the clipped part stays in the residual).
 *
 * RNG: a counter-based hash, no state. The key of one call is
 *   key = mix64(mix64(mix64(seed) ^ step) ^ rank)
 * and the uniform of element i (its index in the whole tensor, ctx->offset + local index):
 *   salt = (uint32)key ^ mix32((uint32)(i >> 32) + (uint32)(key >> 32))
 *   u_i  = (mix32((uint32)i ^ salt) >> 8) * 2^-24                  in [0, 1)
 * mix64 is the splitmix64 finaliser, mix32 the "lowbias32" integer hash.
 *
 * Body (after the 32-byte gcomp header; flags 0):
 *   f32 scales[nb]   nb = ceil(n / B) (bucket=B), or 1 (bucket=0, n > 0), or 0 (n = 0)
 *   u8  codes[...]  2 bits per element: 0 -> 0, 1 -> +1, 2 -> -1, 3 is invalid.
 *       Each bucket's codes start at byte (bucket start) / 4 and are laid out in tiles of
 *       GCOMP_TG_TILE elements from the bucket start. A tile of m elements takes
 *       q = ceil(m / 4) bytes; its element k sits in byte k % q at bits 2 * (k / q)
 *       ("planar": byte j holds elements j, j+q, j+2q, j+3q, so packing and unpacking are
 *       four unit-stride streams for SIMD and GPU threads alike). Unused bits are 0.
 *       In total ceil(n / 4) bytes, since buckets are multiples of 4.
 *
 * Integer sums for the ring (format 2): the sum of the codes of m ranks lies in [-m, m], so
 * d = sum + m is a digit in base L = 2m + 1. Digits travel in groups of g = gcomp_tg_sum_group(m):
 * a group is the number d_0 + d_1 L + ... + d_{g-1} L^(g-1), written in W = bits(L^g) bits
 * (bits(v) = the fewest bits that hold 0..v-1), LSB first, groups back to back; the last
 * group of r < g digits takes bits(L^r) bits; the stream is padded with zero bits to a byte.
 * g is the group size (up to 8 digits, L^g <= 256) with the fewest bits per digit, the
 * smaller one on a tie: m = 1: 5 digits in 8 bits (1.6 bits each instead of 2), m = 2: 3 in
 * 7 (2.33 instead of 3), m = 4, 5: 2 in 7 (3.5 instead of 4); every other m has g = 1, i.e.
 * plain bits(2m + 1)-bit fields. Codes that are not below L^g (or L^r) are invalid.
 */
#ifndef GCOMP_CODECS_TERNGRAD_H
#define GCOMP_CODECS_TERNGRAD_H

#include "codecs/common.h"
#include "gcomp_codec.h"

#define GCOMP_WIRE_ID_TERNGRAD 4
#define GCOMP_TG_RMS_BLOCK 256  /* elements per block of the deterministic rms sum */
#define GCOMP_TG_RMS_GROUP 1024 /* blocks per group of that sum (see gcomp__tg_rms) */
#define GCOMP_TG_TILE 1024      /* elements per tile of the planar code layout */

typedef struct gcomp_terngrad_params {
    int64_t bucket; /* elements per scale; 0 = one scale per tensor (default) */
    double clip;    /* clip at clip * rms (default 2.5, the paper's value); 0 = no clipping */
} gcomp_terngrad_params;

static inline GCOMP_HD uint64_t gcomp_tg_key(uint64_t seed, uint64_t step, uint32_t rank)
{
    return gcomp_mix64(gcomp_mix64(gcomp_mix64(seed) ^ step) ^ (uint64_t)rank);
}

static inline GCOMP_HD uint32_t gcomp_tg_salt(uint64_t key, uint32_t index_hi)
{
    return (uint32_t)key ^ gcomp_mix32(index_hi + (uint32_t)(key >> 32));
}

/* u_i as a float in [0, 1): 24 random bits, exactly representable. */
static inline GCOMP_HD float gcomp_tg_uniform_salted(uint32_t salt, uint32_t index_lo)
{
    return (float)(int32_t)(gcomp_mix32(index_lo ^ salt) >> 8) * 0x1p-24f; /* < 2^24: exact; signed converts faster */
}

static inline GCOMP_HD float gcomp_tg_uniform(uint64_t key, uint64_t i)
{
    return gcomp_tg_uniform_salted(gcomp_tg_salt(key, (uint32_t)(i >> 32)), (uint32_t)i);
}

/* A bucket's max |x| as bits, with every NaN as the quiet NaN 0x7fc00000: the payload of a
 * NaN that went through x = g + r depends on the hardware (x86 keeps g's, a GPU returns
 * 0x7fffffff), and the scale written must not. */
static inline GCOMP_HD uint32_t gcomp_tg_max_bits(uint32_t maxbits)
{
    return maxbits > 0x7f800000u ? 0x7fc00000u : maxbits;
}

/* The code of one element given its scale: 0, 1 (+1) or 2 (-1). */
static inline GCOMP_HD uint32_t gcomp_tg_code(float x, float s, float u)
{
    float y = x > s ? s : (x < -s ? -s : x);
    float mag = y < 0 ? -y : y;
    uint32_t keep = u * s < mag;
    return keep ? (y < 0 ? 2u : 1u) : 0u;
}

/* Number of scales for n elements. */
static inline GCOMP_HD uint64_t gcomp_tg_num_scales(const gcomp_terngrad_params *p, uint64_t n)
{
    if (n == 0) return 0;
    if (p->bucket <= 0) return 1;
    return (n + (uint64_t)p->bucket - 1) / (uint64_t)p->bucket;
}

/* The fewest bits that hold every value in 0..v-1 (0 for v <= 1). */
static inline GCOMP_HD unsigned gcomp_tg_bits_below(uint64_t v)
{
    unsigned b = 0;
    while (b < 64 && (1ull << b) < v) b++;
    return b;
}

/* ceil(log2(2m + 1)): bits of one sum of m ternary codes on its own (g = 1); no group
 * takes more than this per digit. */
static inline GCOMP_HD unsigned gcomp_tg_sum_bits(uint32_t m) { return gcomp_tg_bits_below(2ull * m + 1); }

/* Digits per group for sums of m ranks (see the format above). */
static inline GCOMP_HD unsigned gcomp_tg_sum_group(uint32_t m)
{
    uint64_t L = 2ull * m + 1, p = L;
    unsigned best = 1, best_w = gcomp_tg_bits_below(L);
    for (unsigned g = 2; g <= 8 && p * L <= 256; g++) {
        unsigned w;
        p *= L;
        w = gcomp_tg_bits_below(p);
        if (w * best < best_w * g) { /* fewer bits per digit */
            best = g;
            best_w = w;
        }
    }
    return best;
}

/* L^k for the digits of sums of m ranks (k <= 8, L^k <= 256, or k = 1). */
static inline GCOMP_HD uint64_t gcomp_tg_sum_pow(uint32_t m, unsigned k)
{
    uint64_t p = 1;
    while (k--) p *= 2ull * m + 1;
    return p;
}

/* Bytes of n packed sums of m codes. */
static inline GCOMP_HD uint64_t gcomp_tg_sum_bytes(uint64_t n, uint32_t m)
{
    unsigned g = gcomp_tg_sum_group(m);
    uint64_t bits = n / g * gcomp_tg_bits_below(gcomp_tg_sum_pow(m, g)) +
                    gcomp_tg_bits_below(gcomp_tg_sum_pow(m, (unsigned)(n % g)));
    return (bits + 7) / 8;
}

/* The most sums of m codes whose packing fits in `bytes`. */
static inline GCOMP_HD uint64_t gcomp_tg_sums_fit(uint64_t bytes, uint32_t m)
{
    unsigned b = gcomp_tg_sum_bits(m);
    uint64_t n;
    if (b == 0) return 0;
    n = bytes * 8 * gcomp_tg_sum_group(m) / gcomp_tg_bits_below(gcomp_tg_sum_pow(m, gcomp_tg_sum_group(m))) + 8;
    while (n > 0 && gcomp_tg_sum_bytes(n, m) > bytes) n--;
    return n;
}

/* Integer-sum helpers for the integer ring (CPU reference; terngrad.c). */
/* t[i] = code of element i in {-1, 0, +1}, from the code array of one bucket-aligned range
 * of n elements (tiles from its start). GCOMP_ERR_CORRUPT on code 3 or padding bits. */
gcomp_result gcomp__tg_codes_unpack(const uint8_t *codes, size_t bytes, size_t n, int8_t *t);
/* One hop of the ring: out = sums of m_in + 1 ranks = (sums of m_in ranks in `in`) + t,
 * packed for m_in + 1 ranks (gcomp_tg_sum_bytes(n, m_in + 1) bytes). m_in = 0: no input, out = t packed for m = 1.
 * GCOMP_ERR_CORRUPT if `in` has the wrong size or a value outside [0, 2 m_in]. */
gcomp_result gcomp__tg_sums_add_pack(const uint8_t *in, size_t in_bytes, uint32_t m_in, const int8_t *t, size_t n,
                                     uint8_t *out);
/* out[i] = sum i of m ranks, checked to lie in [-m, m]. */
gcomp_result gcomp__tg_sums_unpack(const uint8_t *in, size_t bytes, size_t n, uint32_t m, int16_t *out);
/* out[i] = value[sum_i + m] (value has 2m + 1 entries): the final sums straight to floats
 * through a table, one pass, no int16 array in between. Same checks as sums_unpack. */
gcomp_result gcomp__tg_sums_values(const uint8_t *in, size_t bytes, size_t n, uint32_t m, const float *value,
                                   float *out);
/* encode with given scales, each >= the local one (the max over all ranks), so a non-finite
 * input always comes with a non-finite scale: what the integer ring's codes stand for (the
 * reference test_terngrad checks gcomp__tg_ternarise against; not in the vtable). */
gcomp_result gcomp__tg_encode_scaled(const void *params, gcomp_encode_ctx *ctx, const float *g, const float *r_in,
                                     float *r_out, size_t n, const float *scales, uint8_t *body, size_t cap,
                                     size_t *written, uint32_t *flags);
/* t[i] in {-1, 0, +1}: the codes gcomp__tg_encode_scaled would pack for these scales (one per
 * bucket of the range), with the residual update fused in (r_out may alias r_in or be NULL). */
gcomp_result gcomp__tg_ternarise(const gcomp_terngrad_params *p, const gcomp_encode_ctx *ctx, const float *g,
                                 const float *r_in, float *r_out, size_t n, const float *scales, int8_t *t);
/* The deterministic rms of x = g + r over [0, n): see terngrad.c. */
double gcomp__tg_rms(const float *g, const float *r, size_t n);

extern const gcomp_codec_vtable gcomp__codec_terngrad;
GCOMP_DECLARE_CUDA_OPS(terngrad);

#endif
