/*
 * terngrad.c — CPU reference of TernGrad. This file is the specification the CUDA kernels
 * reproduce bit for bit; terngrad.h documents the format, the RNG and the rounding rule.
 *
 * Encode is two passes per bucket: (1) the scale (max |x|, optionally clipped at c*rms),
 * (2) stochastic ternarisation with the residual update fused in. The engine's integer ring
 * runs the passes separately (local_scales, then int_ternarise with the max over ranks).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codecs/common.h"
#include "codecs/terngrad.h"

#define TILE GCOMP_TG_TILE

#define GCOMP_CHECK_TG(x)                           \
    do {                                            \
        gcomp_result tg_rc_ = (x);                  \
        if (tg_rc_ != GCOMP_SUCCESS) return tg_rc_; \
    } while (0)

static const gcomp_param_def tg_params[] = {
    { "bucket", GCOMP_PARAM_INT, offsetof(gcomp_terngrad_params, bucket), 0, 1073741824, 0, NULL,
      "elements per scale, a multiple of 4; 0 = one scale per tensor" },
    { "clip", GCOMP_PARAM_DOUBLE, offsetof(gcomp_terngrad_params, clip), 0, 1000, 2.5, NULL,
      "clip |x| at clip * rms before ternarising (the paper's 2.5); 0 = off" },
};

/* Reported like every codec failure; the parser adds the codec's name and the spec. */
static gcomp_result tg_check_params(const void *params, char *msg, size_t cap)
{
    const gcomp_terngrad_params *p = params;
    (void)msg;
    (void)cap;
    if (p->bucket % 4 != 0)
        return gcomp_codec_fail(GCOMP_ERR_INVALID_SPEC, "bucket=%lld must be a multiple of 4 (codes pack 4 per byte)",
                                (long long)p->bucket);
    return GCOMP_SUCCESS;
}

static inline float load_f32(const uint8_t *p)
{
    float v;
    memcpy(&v, p, 4);
    return v;
}
static inline void store_f32(uint8_t *p, float v) { memcpy(p, &v, 4); }

static size_t bucket_len(const gcomp_terngrad_params *p, size_t n) { return p->bucket > 0 ? (size_t)p->bucket : n; }

static size_t tg_codes_bytes(size_t n) { return (n + 3) / 4; }

static size_t tg_max_body(const void *params, size_t n)
{
    return 4 * (size_t)gcomp_tg_num_scales(params, n) + tg_codes_bytes(n);
}

/* ---- pass 1: the scale of one bucket ---------------------------------------------------- */

/* max |x| compared as the integer bits & 0x7fffffff: exact, order-free, and NaN > inf >
 * finite, so a non-finite input always becomes a non-finite scale. */
GCOMP_SIMD_CLONES static uint32_t max_abs_bits(const float *g, const float *r, size_t n)
{
    uint32_t m = 0;
    if (r) {
        for (size_t i = 0; i < n; i++) {
            float x = g[i] + r[i];
            uint32_t k;
            memcpy(&k, &x, 4);
            k &= 0x7fffffffu;
            m = k > m ? k : m;
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            uint32_t k;
            memcpy(&k, &g[i], 4);
            k &= 0x7fffffffu;
            m = k > m ? k : m;
        }
    }
    return m;
}

/* The tree sum of one whole block: the first halving step (k + k + B/2) is fused with the
 * squaring, then the remaining halvings on B/2 doubles. Same operations in the same order
 * as the general loop below, with no branch in the loops, so it vectorises. The block's
 * max |x| bits come out of the same pass (*maxbits is raised, never lowered). */
GCOMP_SIMD_CLONES static double rms_block_sum(const float *g, const float *r, uint32_t *maxbits)
{
    enum {
        H = GCOMP_TG_RMS_BLOCK / 2
    };
    double t[H];
    uint32_t m = *maxbits;
    for (size_t k = 0; k < H; k++) {
        float a = r ? g[k] + r[k] : g[k], b = r ? g[k + H] + r[k + H] : g[k + H];
        uint32_t ka, kb;
        memcpy(&ka, &a, 4);
        memcpy(&kb, &b, 4);
        ka &= 0x7fffffffu;
        kb &= 0x7fffffffu;
        m = ka > m ? ka : m;
        m = kb > m ? kb : m;
        t[k] = (double)a * (double)a + (double)b * (double)b;
    }
    for (size_t w = H / 2; w >= 1; w /= 2)
        for (size_t k = 0; k < w; k++) t[k] += t[k + w];
    *maxbits = m;
    return t[0];
}

/* Sum of squares of x = g + r in the fixed order of terngrad.h (squares in double, a
 * halving-stride tree inside each block of GCOMP_TG_RMS_BLOCK elements, zero-padded, block
 * sums added in block order within each group of GCOMP_TG_RMS_GROUP blocks, group sums added
 * in group order), and max |x| as bits, in one pass over the data. */
static double sumsq_and_max(const float *g, const float *r, size_t n, uint32_t *maxbits)
{
    double total = 0, group = 0, t[GCOMP_TG_RMS_BLOCK];
    size_t b = 0, in_group = 0;
    *maxbits = 0;
    for (; b + GCOMP_TG_RMS_BLOCK <= n; b += GCOMP_TG_RMS_BLOCK) {
        group += rms_block_sum(g + b, r ? r + b : NULL, maxbits);
        if (++in_group == GCOMP_TG_RMS_GROUP) { /* a whole group: the GPU sums groups in parallel */
            total += group;
            group = 0;
            in_group = 0;
        }
    }
    if (b < n) { /* the last, partial block, zero-padded */
        size_t m = n - b;
        for (size_t k = 0; k < GCOMP_TG_RMS_BLOCK; k++) {
            float x = k < m ? (r ? g[b + k] + r[b + k] : g[b + k]) : 0.0f;
            uint32_t kx;
            memcpy(&kx, &x, 4);
            kx &= 0x7fffffffu;
            *maxbits = kx > *maxbits ? kx : *maxbits;
            t[k] = (double)x * (double)x;
        }
        for (size_t w = GCOMP_TG_RMS_BLOCK / 2; w >= 1; w /= 2)
            for (size_t k = 0; k < w; k++) t[k] += t[k + w];
        group += t[0];
    }
    return total + group; /* + 0 when n ends a group: changes nothing (sums are >= 0) */
}

double gcomp__tg_rms(const float *g, const float *r, size_t n)
{
    uint32_t m;
    double total = sumsq_and_max(g, r, n, &m);
    return n ? sqrt(total / (double)n) : 0.0;
}

/* One pass with clipping (max and sum of squares together), or the max alone. */
static float bucket_scale(const gcomp_terngrad_params *p, const float *g, const float *r, size_t n)
{
    uint32_t mbits;
    double ss = 0;
    float s;
    if (p->clip > 0)
        ss = sumsq_and_max(g, r, n, &mbits);
    else
        mbits = max_abs_bits(g, r, n);
    mbits = gcomp_tg_max_bits(mbits);
    memcpy(&s, &mbits, 4);
    if (p->clip > 0 && isfinite(s) && n) {
        double c = p->clip * sqrt(ss / (double)n);
        if (c < (double)s) s = (float)c;
    }
    return s;
}

static gcomp_result tg_local_scales(const void *params, gcomp_encode_ctx *ctx, const float *g, const float *r, size_t n,
                                    float *scales)
{
    const gcomp_terngrad_params *p = params;
    size_t B = bucket_len(p, n);
    for (size_t a = 0, j = 0; a < n; a += B, j++) {
        size_t m = n - a < B ? n - a : B;
        scales[j] = bucket_scale(p, g + a, r ? r + a : NULL, m);
        if (!isfinite(scales[j])) ctx->nonfinite = 1;
    }
    return GCOMP_SUCCESS;
}

/* ---- pass 2: ternarise one bucket with scale s ------------------------------------------ */

/* Codes of m consecutive elements whose global indices share their high 32 bits (one salt);
 * the residual update x - t*s is fused in. has_r_in/has_r_out are constants at each call
 * site so every instantiation is a branch-free, vectorisable loop. Returns nonzero if any x
 * was non-finite. */
static inline __attribute__((always_inline)) uint32_t quantize_run(int has_r_in, int has_r_out, const float *g,
                                                                   const float *r_in, float *r_out, size_t m, float s,
                                                                   uint32_t salt, uint32_t lo, uint32_t *codes)
{
    uint32_t bad = 0;
    for (size_t k = 0; k < m; k++) {
        float x = has_r_in ? g[k] + r_in[k] : g[k];
        uint32_t bits;
        float u = gcomp_tg_uniform_salted(salt, lo + (uint32_t)k);
        uint32_t c = gcomp_tg_code(x, s, u);
        float t = (float)(int32_t)((c & 1u) - (c >> 1)); /* 1 -> +1, 2 -> -1, 0 -> 0 */
        memcpy(&bits, &x, 4);
        bad |= (bits & 0x7f800000u) == 0x7f800000u;
        codes[k] = c;
        if (has_r_out) r_out[k] = x - t * s;
    }
    return bad;
}

GCOMP_SIMD_CLONES static uint32_t quantize_salted(const float *g, const float *r_in, float *r_out, size_t m, float s,
                                                  uint32_t salt, uint32_t lo, uint32_t *codes)
{
    if (r_in && r_out) return quantize_run(1, 1, g, r_in, r_out, m, s, salt, lo, codes);
    if (r_in) return quantize_run(1, 0, g, r_in, NULL, m, s, salt, lo, codes);
    if (r_out) return quantize_run(0, 1, g, NULL, r_out, m, s, salt, lo, codes);
    return quantize_run(0, 0, g, NULL, NULL, m, s, salt, lo, codes);
}

/* One tile (m <= TILE) starting at global index `first`; splits where the index crosses a
 * multiple of 2^32, since the salt changes there. */
static uint32_t quantize_tile(const float *g, const float *r_in, float *r_out, size_t m, float s, uint64_t key,
                              uint64_t first, uint32_t *codes)
{
    uint64_t to_wrap = ((uint64_t)1 << 32) - (first & 0xffffffffull);
    size_t m1 = (uint64_t)m > to_wrap ? (size_t)to_wrap : m;
    uint32_t bad =
        quantize_salted(g, r_in, r_out, m1, s, gcomp_tg_salt(key, (uint32_t)(first >> 32)), (uint32_t)first, codes);
    if (m1 < m)
        bad |= quantize_salted(g + m1, r_in ? r_in + m1 : NULL, r_out ? r_out + m1 : NULL, m - m1, s,
                               gcomp_tg_salt(key, (uint32_t)((first + m1) >> 32)), 0, codes + m1);
    return bad;
}

/* Planar packing of one tile of len codes (see terngrad.h): byte j holds the codes of
 * elements j, j+q, j+2q, j+3q. codes[] has room for 4q entries; the padding is zeroed. */
static void pack_tile(uint32_t *codes, size_t len, uint8_t *out)
{
    size_t q = (len + 3) / 4;
    for (size_t k = len; k < 4 * q; k++) codes[k] = 0;
    for (size_t j = 0; j < q; j++)
        out[j] = (uint8_t)(codes[j] | codes[j + q] << 2 | codes[j + 2 * q] << 4 | codes[j + 3 * q] << 6);
}

/* Ternarise bucket [a, a+m) of the buffer with scale s into the packed code array (byte 0
 * = element 0 of the buffer). a is a multiple of 4. r_out may alias r_in. */
static uint32_t quantize_bucket(const float *g, const float *r_in, float *r_out, size_t a, size_t m, float s,
                                const gcomp_encode_ctx *ctx, uint64_t key, uint8_t *packed)
{
    uint32_t codes[TILE];
    uint32_t bad = 0;
    for (size_t done = 0; done < m;) {
        size_t i = a + done, len = m - done < TILE ? m - done : TILE;
        bad |=
            quantize_tile(g + i, r_in ? r_in + i : NULL, r_out ? r_out + i : NULL, len, s, key, ctx->offset + i, codes);
        pack_tile(codes, len, packed + i / 4); /* i is a multiple of 4: a is, and so is TILE */
        done += len;
    }
    return bad;
}

static gcomp_result check_cap(size_t n, const gcomp_terngrad_params *p, size_t cap, size_t *need)
{
    *need = tg_max_body(p, n);
    if (cap < *need)
        return gcomp_codec_fail(GCOMP_ERR_BUFFER_TOO_SMALL, "terngrad: need %zu body bytes, have %zu", *need, cap);
    return GCOMP_SUCCESS;
}

/* Shared by encode and encode_scaled: scales == NULL means "compute each bucket's own". */
static gcomp_result tg_encode_impl(const gcomp_terngrad_params *p, gcomp_encode_ctx *ctx, const float *g,
                                   const float *r_in, float *r_out, size_t n, const float *scales, uint8_t *body,
                                   size_t cap, size_t *written, uint32_t *flags)
{
    size_t need, B = bucket_len(p, n), nb = (size_t)gcomp_tg_num_scales(p, n);
    uint64_t key = gcomp_tg_key(ctx->seed, ctx->step, ctx->rank);
    uint8_t *packed = body + 4 * nb;
    uint32_t bad = 0;
    gcomp_result rc = check_cap(n, p, cap, &need);
    if (rc != GCOMP_SUCCESS) return rc;
    if (B % 4 && nb > 1) return gcomp_codec_fail(GCOMP_ERR_INVALID_ARG, "terngrad: bucket must be a multiple of 4");
    /* All scales first: if any is non-finite, no bucket may touch the residual (it may be
     * updated in place), and every rank's result will hold a NaN. */
    for (size_t a = 0, j = 0; a < n; a += B, j++) {
        size_t m = n - a < B ? n - a : B;
        float s = scales ? scales[j] : bucket_scale(p, g + a, r_in ? r_in + a : NULL, m);
        store_f32(body + 4 * j, s);
        bad |= !isfinite(s);
    }
    for (size_t a = 0, j = 0; a < n; a += B, j++) {
        size_t m = n - a < B ? n - a : B;
        bad |= quantize_bucket(g, r_in, bad ? NULL : r_out, a, m, load_f32(body + 4 * j), ctx, key, packed);
    }
    ctx->nonfinite |= bad;
    *written = need;
    *flags = 0;
    return GCOMP_SUCCESS;
}

/* The engine's integer ring needs each rank's codes as t in {-1, 0, +1}, never the packed
 * body: the same codes as encode_scaled (same RNG, same rule, residual fused), without the
 * planar packing and the unpacking behind it. */
gcomp_result gcomp__tg_ternarise(const gcomp_terngrad_params *p, const gcomp_encode_ctx *ctx, const float *g,
                                 const float *r_in, float *r_out, size_t n, const float *scales, int8_t *t)
{
    size_t B = bucket_len(p, n);
    uint64_t key = gcomp_tg_key(ctx->seed, ctx->step, ctx->rank);
    uint32_t codes[TILE];
    if (B % 4 && B < n) return gcomp_codec_fail(GCOMP_ERR_INVALID_ARG, "terngrad: bucket must be a multiple of 4");
    for (size_t a = 0, j = 0; a < n; a += B, j++) {
        size_t m = n - a < B ? n - a : B;
        for (size_t done = 0; done < m; done += TILE) {
            size_t i = a + done, len = m - done < TILE ? m - done : TILE;
            quantize_tile(g + i, r_in ? r_in + i : NULL, r_out ? r_out + i : NULL, len, scales[j], key, ctx->offset + i,
                          codes);
            for (size_t k = 0; k < len; k++) t[i + k] = (int8_t)((int32_t)(codes[k] & 1u) - (int32_t)(codes[k] >> 1));
        }
    }
    return GCOMP_SUCCESS;
}

static gcomp_result tg_encode(const void *params, gcomp_encode_ctx *ctx, const float *g, const float *r_in,
                              float *r_out, size_t n, uint8_t *body, size_t cap, size_t *written, uint32_t *flags)
{
    return tg_encode_impl(params, ctx, g, r_in, r_out, n, NULL, body, cap, written, flags);
}

gcomp_result gcomp__tg_encode_scaled(const void *params, gcomp_encode_ctx *ctx, const float *g, const float *r_in,
                                     float *r_out, size_t n, const float *scales, uint8_t *body, size_t cap,
                                     size_t *written, uint32_t *flags)
{
    return tg_encode_impl(params, ctx, g, r_in, r_out, n, scales, body, cap, written, flags);
}

static size_t tg_num_scales(const void *params, size_t n) { return (size_t)gcomp_tg_num_scales(params, n); }

/* ---- decode --------------------------------------------------------------------------- */

/* Elements of plane p (0..3) of a tile of len elements with q bytes. */
static size_t plane_len(size_t len, size_t q, unsigned p)
{
    return len > p * q ? (len - p * q < q ? len - p * q : q) : 0;
}

/* A tile's bytes hold no code 3 and no set bit past its last element. */
static gcomp_result check_tile(const uint8_t *in, size_t len, size_t first)
{
    size_t q = (len + 3) / 4;
    uint8_t threes = 0;
    for (size_t j = 0; j < q; j++) threes |= in[j] & (in[j] >> 1) & 0x55;
    if (threes)
        return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "terngrad: invalid code 3 in the tile at element %zu", first);
    for (unsigned p = 0; p < 4; p++)
        for (size_t j = plane_len(len, q, p); j < q; j++)
            if ((in[j] >> (2 * p)) & 3u)
                return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "terngrad: padding bits set in the tile at element %zu",
                                        first);
    return GCOMP_SUCCESS;
}

/* The value of code c as t in {-1, 0, +1}: 1 -> +1, 2 -> -1, 0 -> 0. */
static inline float code_value(uint32_t c) { return (float)(int32_t)((c & 1u) - (c >> 1)); }

/* acc += t * s over one tile. Multiplying (not selecting) makes a non-finite scale give NaN
 * for t = 0 too, so a NaN anywhere in the bucket reaches every rank's result. */
GCOMP_SIMD_CLONES static void decode_tile(const uint8_t *in, size_t len, float s, float *acc)
{
    size_t q = (len + 3) / 4;
    for (unsigned p = 0; p < 4; p++) {
        size_t np = plane_len(len, q, p);
        float *a = acc + p * q;
        for (size_t j = 0; j < np; j++) a[j] += code_value((in[j] >> (2 * p)) & 3u) * s;
    }
}

static gcomp_result tg_decode_add(const void *params, uint32_t flags, const uint8_t *body, size_t bytes, float *acc,
                                  size_t n)
{
    const gcomp_terngrad_params *p = params;
    size_t B = bucket_len(p, n), nb = (size_t)gcomp_tg_num_scales(p, n);
    const uint8_t *packed = body + 4 * nb;
    if (flags) return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "terngrad: unknown flags 0x%x", flags);
    if (bytes != tg_max_body(p, n))
        return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "terngrad: body of %zu bytes for %zu elements (expected %zu)", bytes,
                                n, tg_max_body(p, n));
    /* validate everything first, so a corrupt payload leaves acc untouched */
    for (size_t a = 0, j = 0; a < n; a += B, j++) {
        size_t m = n - a < B ? n - a : B;
        float s = load_f32(body + 4 * j);
        if (s < 0) return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "terngrad: negative scale %g in bucket %zu", s, j);
        for (size_t t = 0; t < m; t += TILE)
            GCOMP_CHECK_TG(check_tile(packed + (a + t) / 4, m - t < TILE ? m - t : TILE, a + t));
    }
    for (size_t a = 0, j = 0; a < n; a += B, j++) {
        size_t m = n - a < B ? n - a : B;
        float s = load_f32(body + 4 * j);
        for (size_t t = 0; t < m; t += TILE)
            decode_tile(packed + (a + t) / 4, m - t < TILE ? m - t : TILE, s, acc + a + t);
    }
    return GCOMP_SUCCESS;
}

/* ---- integer sums for the ring ---------------------------------------------------------- */

gcomp_result gcomp__tg_codes_unpack(const uint8_t *codes, size_t bytes, size_t n, int8_t *t)
{
    if (bytes != tg_codes_bytes(n))
        return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "terngrad: %zu code bytes for %zu elements", bytes, n);
    for (size_t a = 0; a < n; a += TILE) {
        size_t len = n - a < TILE ? n - a : TILE, q = (len + 3) / 4;
        const uint8_t *in = codes + a / 4;
        GCOMP_CHECK_TG(check_tile(in, len, a));
        for (unsigned p = 0; p < 4; p++) {
            int8_t *out = t + a + p * q;
            for (size_t j = 0; j < plane_len(len, q, p); j++) {
                uint32_t c = (in[j] >> (2 * p)) & 3u;
                out[j] = (int8_t)((int32_t)(c & 1u) - (int32_t)(c >> 1));
            }
        }
    }
    return GCOMP_SUCCESS;
}

/* Packed sums (format in terngrad.h): digits of base L = 2m + 1 in groups of g, each group
 * a W-bit code. 240 elements are a whole number of groups for every g (1, 2, 3 or 5) and,
 * since 240 / g is a multiple of 8, a whole number of bytes: blocks of 240 are packed with
 * W known at compile time and a table from code to digits (W <= 8, up to 127 ranks); the
 * last partial block and wider sums go through the bit streams of codecs/common.h. */
#define SUM_BLOCK 240

/* Sums of m ranks as packed: digits of base L, g per code of w bits. */
typedef struct sum_fmt {
    uint32_t m, L;
    unsigned g, w;
    uint64_t lg; /* L^g: every code is below it */
    size_t block_bytes;
    int16_t (*digits)[8]; /* code -> its g digits as sums (digit - m), when w <= 8 and the
                           * caller unpacks: int16 like the output, so a code's digits are one
                           * fixed-size copy. Codes from lg up (invalid) map to zeros. */
} sum_fmt;

/* table == NULL: the format only packs (block_pack computes its codes). */
static void sum_fmt_init(sum_fmt *f, uint32_t m, int16_t (*table)[8])
{
    f->m = m;
    f->L = 2 * m + 1;
    f->g = gcomp_tg_sum_group(m);
    f->lg = gcomp_tg_sum_pow(m, f->g);
    f->w = gcomp_tg_bits_below(f->lg);
    f->block_bytes = SUM_BLOCK / f->g * f->w / 8;
    f->digits = f->w <= 8 ? table : NULL; /* marks the block path */
    if (!f->digits) return;
    /* count through the codes in base L, digit 0 lowest: no division per entry */
    int16_t d[8];
    for (unsigned k = 0; k < 8; k++) d[k] = (int16_t) - (int32_t)m;
    for (uint64_t c = 0; c < 256; c++) {
        if (c >= f->lg) {
            memset(f->digits[c], 0, sizeof f->digits[c]);
            continue;
        }
        memcpy(f->digits[c], d, sizeof d);
        for (unsigned k = 0; k < f->g && ++d[k] > (int32_t)m; k++) d[k] = (int16_t) - (int32_t)m;
    }
}

/* Whole 8-byte loads (a w-byte copy is assembled on the stack and stalls the load that reads
 * it back): the word of group gi of a block of `groups` groups of w bytes holds its 8 codes
 * in its low 8w bits. Bytes past the group belong to the next groups and are never looked
 * at; groups within 8 bytes of the block's end load the 8 bytes that end where they end, so
 * nothing past the block is read. */
static inline __attribute__((always_inline)) uint64_t group_word(const uint8_t *in, size_t gi, unsigned w,
                                                                 size_t groups)
{
    uint64_t word;
    if (gi * w + 8 <= groups * w) {
        memcpy(&word, in + gi * w, 8);
        return word;
    }
    memcpy(&word, in + gi * w + w - 8, 8);
    return word >> (8 * (8 - w));
}

/* One block: codes of width w, g digits each (compile-time constants in the common cases)
 * -> out, g elements of es bytes per code copied from row c of tab (rows of 8 elements).
 * The int16 digit table gives the sums; a float table gives values of the sums. Returns
 * nonzero on an invalid code. */
static inline __attribute__((always_inline)) uint64_t block_lookup(const unsigned w, const unsigned g, const size_t es,
                                                                   uint64_t lg, const void *tab, const uint8_t *in,
                                                                   void *out)
{
    const uint64_t mask = (1ull << w) - 1;
    const size_t groups = SUM_BLOCK / g / 8; /* of 8 codes in exactly w bytes, little-endian host */
    uint64_t bad = 0;
    for (size_t gi = 0; gi < groups; gi++) {
        uint64_t word = group_word(in, gi, w, groups);
        for (unsigned k = 0; k < 8; k++) {
            uint64_t c = (word >> (k * w)) & mask;
            bad |= c >= lg;
            memcpy((uint8_t *)out + (gi * 8 + k) * g * es, (const uint8_t *)tab + c * 8 * es, g * es);
        }
    }
    return bad;
}

/* One block: sums (in [-m, m]) -> codes of width w, g digits of base L each. */
static inline __attribute__((always_inline)) void block_pack(const unsigned w, const unsigned g, const uint32_t L,
                                                             const sum_fmt *f, const int16_t *sums, uint8_t *out)
{
    const int32_t m = (int32_t)f->m;
    const size_t groups = SUM_BLOCK / g / 8;
    for (size_t gi = 0; gi < groups; gi++) {
        uint64_t word = 0;
        for (unsigned k = 0; k < 8; k++) {
            const int16_t *s = sums + (gi * 8 + k) * g;
            uint64_t c = 0;
            for (unsigned j = g; j-- > 0;) c = c * L + (uint64_t)(uint32_t)(s[j] + m);
            word |= c << (k * w);
        }
        /* a whole 8-byte store where it stays inside the block: the bytes past this group
         * are zero and the next groups' stores overwrite them */
        if (gi * w + 8 <= groups * w)
            memcpy(out + gi * w, &word, 8);
        else
            memcpy(out + gi * w, &word, w);
    }
}

/* The formats of a ring of up to 5 ranks with every constant known at compile time; other
 * plain (g = 1) formats by width; the rest (g = 2 for m = 5) generic. */
#define SUM_FORMATS(X, f, ...)                         \
    switch ((f)->m) {                                  \
    case 1:                                            \
        X(8, 5, 3, f, __VA_ARGS__);                    \
        break;                                         \
    case 2:                                            \
        X(7, 3, 5, f, __VA_ARGS__);                    \
        break;                                         \
    case 3:                                            \
        X(3, 1, 7, f, __VA_ARGS__);                    \
        break;                                         \
    case 4:                                            \
        X(7, 2, 9, f, __VA_ARGS__);                    \
        break;                                         \
    default:                                           \
        if ((f)->g > 1)                                \
            X((f)->w, (f)->g, (f)->L, f, __VA_ARGS__); \
        else                                           \
            switch ((f)->w) {                          \
            case 4:                                    \
                X(4, 1, (f)->L, f, __VA_ARGS__);       \
                break;                                 \
            case 5:                                    \
                X(5, 1, (f)->L, f, __VA_ARGS__);       \
                break;                                 \
            case 6:                                    \
                X(6, 1, (f)->L, f, __VA_ARGS__);       \
                break;                                 \
            case 7:                                    \
                X(7, 1, (f)->L, f, __VA_ARGS__);       \
                break;                                 \
            default:                                   \
                X(8, 1, (f)->L, f, __VA_ARGS__);       \
                break;                                 \
            }                                          \
    }

#define LOOKUP_X(w, g, L, f, es, tab, in, out, bad) bad = block_lookup(w, g, es, (f)->lg, tab, in, out) /* no L */
#define PACK_X(w, g, L, f, sums, out) block_pack(w, g, L, f, sums, out)

static uint64_t block_unpack_w(const sum_fmt *f, const uint8_t *in, int16_t *out)
{
    uint64_t bad = 0;
    SUM_FORMATS(LOOKUP_X, f, sizeof(int16_t), f->digits, in, out, bad)
    return bad;
}

static uint64_t block_values_w(const sum_fmt *f, const float (*tab)[8], const uint8_t *in, float *out)
{
    uint64_t bad = 0;
    SUM_FORMATS(LOOKUP_X, f, sizeof(float), tab, in, out, bad)
    return bad;
}

static void block_pack_w(const sum_fmt *f, const int16_t *sums, uint8_t *out) { SUM_FORMATS(PACK_X, f, sums, out) }

/* Any n <= SUM_BLOCK sums (the last block, or sums wider than 8 bits), group by group. */
static uint64_t slow_unpack(const sum_fmt *f, const uint8_t *in, size_t n, int16_t *out)
{
    gcomp_bitreader r = { in, 0, (size_t)gcomp_tg_sum_bytes(n, f->m), 0, 0 };
    uint64_t bad = 0;
    for (size_t i = 0; i < n; i += f->g) {
        unsigned k = n - i < f->g ? (unsigned)(n - i) : f->g;
        uint64_t lim = k == f->g ? f->lg : gcomp_tg_sum_pow(f->m, k), c = 0;
        bad |= !gcomp_bits_get(&r, k == f->g ? f->w : gcomp_tg_bits_below(lim), &c); /* cannot end early: sized */
        bad |= c >= lim;
        for (unsigned j = 0; j < k; j++, c /= f->L) out[i + j] = (int16_t)((int64_t)(c % f->L) - (int64_t)f->m);
    }
    return bad;
}

static void slow_pack(const sum_fmt *f, const int16_t *sums, size_t n, uint8_t *out)
{
    gcomp_bitwriter w = { out, 0, 0, 0 };
    for (size_t i = 0; i < n; i += f->g) {
        unsigned k = n - i < f->g ? (unsigned)(n - i) : f->g;
        uint64_t c = 0;
        for (unsigned j = k; j-- > 0;) c = c * f->L + (uint64_t)(sums[i + j] + (int32_t)f->m);
        gcomp_bits_put(&w, c, k == f->g ? f->w : gcomp_tg_bits_below(gcomp_tg_sum_pow(f->m, k)));
    }
    gcomp_bits_flush(&w);
}

static uint64_t unpack_block_any(const sum_fmt *f, const uint8_t *in, size_t n, int16_t *out)
{
    return n == SUM_BLOCK && f->digits ? block_unpack_w(f, in, out) : slow_unpack(f, in, n, out);
}

static void pack_block_any(const sum_fmt *f, const int16_t *sums, size_t n, uint8_t *out)
{
    if (n == SUM_BLOCK && f->w <= 8)
        block_pack_w(f, sums, out);
    else
        slow_pack(f, sums, n, out);
}

gcomp_result gcomp__tg_sums_add_pack(const uint8_t *in, size_t in_bytes, uint32_t m_in, const int8_t *t, size_t n,
                                     uint8_t *out)
{
    int16_t tab_in[256][8];
    int16_t blk[SUM_BLOCK];
    sum_fmt fi, fo;
    uint64_t bad = 0;
    if (m_in && in_bytes != gcomp_tg_sum_bytes(n, m_in))
        return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "terngrad: %zu bytes of sums for %zu elements of %u ranks", in_bytes,
                                n, m_in);
    if (m_in >= 32767)
        return gcomp_codec_fail(GCOMP_ERR_UNSUPPORTED, "terngrad: sums of %u ranks do not fit int16", m_in + 1);
    if (m_in) sum_fmt_init(&fi, m_in, tab_in);
    sum_fmt_init(&fo, m_in + 1, NULL);
    for (size_t a = 0, b = 0; a < n; a += SUM_BLOCK, b++) {
        size_t len = n - a < SUM_BLOCK ? n - a : SUM_BLOCK;
        if (m_in)
            bad |= unpack_block_any(&fi, in + b * fi.block_bytes, len, blk);
        else
            memset(blk, 0, sizeof blk);
        for (size_t i = 0; i < len; i++) blk[i] = (int16_t)(blk[i] + t[a + i]);
        pack_block_any(&fo, blk, len, out + b * fo.block_bytes);
    }
    if (bad)
        return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "terngrad: a packed group of sums of %u ranks is out of range",
                                m_in);
    return GCOMP_SUCCESS;
}

/* The arguments of unpacking n final sums of m ranks from `bytes` bytes. */
static gcomp_result check_final_sums(size_t bytes, size_t n, uint32_t m)
{
    if (m == 0) return gcomp_codec_fail(GCOMP_ERR_INVALID_ARG, "terngrad: sums of 0 ranks");
    if (m > 32767) return gcomp_codec_fail(GCOMP_ERR_UNSUPPORTED, "terngrad: sums of %u ranks do not fit int16", m);
    if (bytes != gcomp_tg_sum_bytes(n, m))
        return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "terngrad: %zu bytes of sums for %zu elements of %u ranks", bytes, n,
                                m);
    return GCOMP_SUCCESS;
}

gcomp_result gcomp__tg_sums_unpack(const uint8_t *in, size_t bytes, size_t n, uint32_t m, int16_t *out)
{
    int16_t tab[256][8];
    sum_fmt f;
    uint64_t bad = 0;
    GCOMP_CHECK_TG(check_final_sums(bytes, n, m));
    sum_fmt_init(&f, m, tab);
    for (size_t a = 0, b = 0; a < n; a += SUM_BLOCK, b++) {
        size_t len = n - a < SUM_BLOCK ? n - a : SUM_BLOCK;
        bad |= unpack_block_any(&f, in + b * f.block_bytes, len, out + a);
    }
    if (bad)
        return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "terngrad: a packed group of sums of %u ranks is out of range", m);
    return GCOMP_SUCCESS;
}

gcomp_result gcomp__tg_sums_values(const uint8_t *in, size_t bytes, size_t n, uint32_t m, const float *value,
                                   float *out)
{
    int16_t tab[256][8], blk[SUM_BLOCK];
    float ftab[256][8];
    sum_fmt f;
    uint64_t bad = 0;
    GCOMP_CHECK_TG(check_final_sums(bytes, n, m));
    sum_fmt_init(&f, m, tab);
    for (unsigned c = 0; f.digits && c < 256; c++) /* invalid codes (digits 0) are reported, not used */
        for (unsigned k = 0; k < 8; k++) ftab[c][k] = value[tab[c][k] + (int32_t)m];
    for (size_t a = 0, b = 0; a < n; a += SUM_BLOCK, b++) {
        size_t len = n - a < SUM_BLOCK ? n - a : SUM_BLOCK;
        const uint8_t *src = in + b * f.block_bytes;
        if (len == SUM_BLOCK && f.digits) {
            bad |= block_values_w(&f, (const float(*)[8])ftab, src, out + a);
            continue;
        }
        bad |= slow_unpack(&f, src, len, blk);
        for (size_t i = 0; i < len; i++) out[a + i] = value[blk[i] + (int32_t)m];
    }
    if (bad)
        return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "terngrad: a packed group of sums of %u ranks is out of range", m);
    return GCOMP_SUCCESS;
}

/* ---- the integer ring's vtable entries (gcomp_codec.h), over the helpers above ------------ */

/* Chunks of whole buckets, or of whole tiles with one scale. */
static size_t tg_int_align(const void *params, size_t count)
{
    const gcomp_terngrad_params *p = params;
    (void)count;
    return p->bucket > 0 ? (size_t)p->bucket : GCOMP_TG_TILE;
}

static size_t tg_int_sum_bytes(const void *params, size_t n, uint32_t m)
{
    (void)params;
    return (size_t)gcomp_tg_sum_bytes(n, m);
}

/* int_sums_values: the 2m + 1 possible results of one scale, or the int16 sums of a chunk
 * that spans several buckets. */
static size_t tg_int_scratch_bytes(const void *params, size_t n, uint32_t m)
{
    size_t table = (2 * (size_t)m + 1) * sizeof(float), sums = n * sizeof(int16_t);
    (void)params;
    return table > sums ? table : sums;
}

static gcomp_result tg_int_ternarise(const void *params, const gcomp_encode_ctx *ctx, const float *g, const float *r_in,
                                     float *r_out, size_t n, const float *scales, int8_t *t)
{
    const gcomp_terngrad_params *p = params;
    size_t a = (size_t)ctx->offset;
    return gcomp__tg_ternarise(p, ctx, g + a, r_in ? r_in + a : NULL, r_out ? r_out + a : NULL, n,
                               scales + (p->bucket > 0 ? a / (size_t)p->bucket : 0), t);
}

static gcomp_result tg_int_sums_add_pack(const void *params, const uint8_t *in, size_t in_bytes, uint32_t m_in,
                                         const int8_t *t, size_t n, uint8_t *out)
{
    (void)params;
    return gcomp__tg_sums_add_pack(in, in_bytes, m_in, t, n, out);
}

/* Under one scale, straight from the packed sums through a table of the 2m + 1 possible
 * results (one pass); across buckets, through int16 sums, bucket by bucket. The table holds
 * the same expression as the bucket loop, so both give the same bits. */
static gcomp_result tg_int_sums_values(const void *params, const uint8_t *in, size_t bytes, size_t lo, size_t n,
                                       uint32_t m, const float *scales, float divisor, float *out, void *scratch)
{
    const gcomp_terngrad_params *p = params;
    size_t B = p->bucket > 0 ? (size_t)p->bucket : 0;
    if (n == 0 || B == 0 || lo / B == (lo + n - 1) / B) {
        float *value = scratch, s = scales[B ? lo / B : 0];
        for (int32_t k = -(int32_t)m; k <= (int32_t)m; k++) value[k + (int32_t)m] = (float)k * s / divisor;
        return gcomp__tg_sums_values(in, bytes, n, m, value, out);
    }
    {
        int16_t *sums = scratch;
        GCOMP_CHECK_TG(gcomp__tg_sums_unpack(in, bytes, n, m, sums));
        for (size_t i = 0; i < n;) {
            size_t b = (lo + i) / B, end = (b + 1) * B - lo < n ? (b + 1) * B - lo : n;
            float s = scales[b];
            for (; i < end; i++) out[i] = (float)sums[i] * s / divisor;
        }
    }
    return GCOMP_SUCCESS;
}

const gcomp_codec_vtable gcomp__codec_terngrad = {
    .abi_version = GCOMP_CODEC_ABI_VERSION,
    .name = "terngrad",
    .wire_id = GCOMP_WIRE_ID_TERNGRAD,
    .caps = GCOMP_CAP_INTEGER | GCOMP_CAP_RESIDUAL_IN_PLACE,
    .params = tg_params,
    .n_params = sizeof tg_params / sizeof tg_params[0],
    .params_size = sizeof(gcomp_terngrad_params),
    .check_params = tg_check_params,
    .max_body_bytes = tg_max_body,
    .encode = tg_encode,
    .decode_add = tg_decode_add,
    .num_scales = tg_num_scales,
    .local_scales = tg_local_scales,
    .int_align = tg_int_align,
    .int_sum_bytes = tg_int_sum_bytes,
    .int_scratch_bytes = tg_int_scratch_bytes,
    .int_ternarise = tg_int_ternarise,
    .int_sums_add_pack = tg_int_sums_add_pack,
    .int_sums_values = tg_int_sums_values,
    .cuda = GCOMP_CUDA_OPS(terngrad),
};
