/*
 * top-k sparsification — wire format and helpers shared by the CPU reference (topk.c) and
 * the CUDA kernels (cuda/topk.cu).
 *
 * Selection: k = ceil(ratio * n) (or k= when given, which overrides ratio), clamped to
 * [min(1, n), n]. The k elements with the largest |x| are kept, where |x| is compared as the
 * unsigned integer (bits(x) & 0x7fffffff): NaN > +inf > every finite value, so a non-finite
 * input is always among the first ones kept. Ties are broken by the LOWER index, on every
 * rank and device.
 *
 * Body, format 2 (after the 32-byte gcomp header; header flags bit 0 = values are fp16):
 *   u64  k
 *   the k kept pairs (index, value) in increasing index order, in blocks of GCOMP_TOPK_BLOCK
 *   pairs (the last block holds the rest). Each block:
 *     u8  b    Rice parameter of the block's gaps, 0..63
 *     u8  e0   exponent field of the value the offsets below start from (fp32: 0..255, fp16:
 *              0..31)
 *     u8  ew   bits of each value's exponent offset (fp32: 0..8, fp16: 0..5)
 *     then one bit stream, least-significant bit of each byte first, padded with zero bits to
 *     a whole byte, holding for each pair in turn:
 *       gap    gap_0 = idx_0, gap_j = idx_j - idx_{j-1} - 1 (indices strictly increase):
 *              q = gap >> b one-bits, a zero bit, then the low b bits of gap
 *       value  the sign bit, then (exponent field - e0) in ew bits, then the mantissa field
 *              (fp32: 23 bits, fp16: 10); every field least-significant bit first
 *   So a value costs 24 + ew bits (fp32) instead of 32, and a gap about log2(mean gap) + 2 bits.
 *   Every value is exact: the fp32 (or fp16) bits are rebuilt as they were.
 *
 * Encoder choices (not needed to decode, but fixed so every device writes the same bytes):
 *   b   the one of 0..W, W = min(63, bit length of the largest gap), whose gaps take the fewest
 *       bits, the smallest b on ties (b = W costs W + 1 bits a gap, which bounds the body);
 *   e0  the smallest exponent field of the block's values; ew the bit length of (largest - e0).
 *
 * Format 1 (wire id 5, until 2026-11) wrote each block's gaps in one fixed width and the values
 * as plain fp32/fp16 after all indices: 5.2 bytes a pair at ratio 0.01 on Gaussian data where
 * format 2 takes 4.1 (`bench/codec_perf -s 64M`: 97x instead of 77x, i.e. 400 / cr bytes). A format-1 payload is
 * refused as coming from an unknown codec.
 *
 * Error feedback: r_out = x for every element not kept, x - decode(value) for kept ones.
 */
#ifndef GCOMP_CODECS_TOPK_H
#define GCOMP_CODECS_TOPK_H

#include "codecs/common.h"
#include "codecs/cast.h"
#include "gcomp_codec.h"

#define GCOMP_WIRE_ID_TOPK 7 /* format 2; 5 was format 1 (6 is zstd) */
#define GCOMP_TOPK_BLOCK 128
#define GCOMP_TOPK_FLAG_FP16 1u
#define GCOMP_TOPK_INF_KEY 0x7f800000u /* keys at or above it are Inf/NaN */

typedef struct gcomp_topk_params {
    double ratio; /* fraction of elements kept, (0, 1]; default 0.01 */
    int64_t k;    /* if > 0, the number kept (overrides ratio); default 0 */
    int values;   /* 0 = fp32, 1 = fp16 */
} gcomp_topk_params;

/* The helpers below are GCOMP_HD: the CPU reference (topk.c) and the CUDA kernels
 * (cuda/topk.cu) call the same code for every field they write or check. */

/* Number of elements kept for n inputs. */
static inline GCOMP_HD uint64_t gcomp_topk_k(const gcomp_topk_params *p, uint64_t n)
{
    uint64_t k;
    if (n == 0) return 0;
    if (p->k > 0) {
        k = (uint64_t)p->k;
    } else {
        double want = p->ratio * (double)n;
        /* (double)n may round up to 2^64, which no uint64_t holds: convert only below it */
        if (!(want < (double)n)) return n;
        k = (uint64_t)want;
        if ((double)k < want) k++; /* ceil without libm */
    }
    if (k < 1) k = 1;
    if (k > n) k = n;
    return k;
}

/* The sort key of a value: larger key = larger magnitude. */
static inline GCOMP_HD uint32_t gcomp_topk_key(uint32_t bits) { return bits & 0x7fffffffu; }

/* ---- fields ------------------------------------------------------------------------------ */

/* Bit length of v (0 for v == 0). */
static inline GCOMP_HD unsigned gcomp_topk_width(uint64_t v) { return gcomp_bit_length64(v); }

/* Bits of m Rice-coded gaps with parameter b (b <= 63). */
static inline GCOMP_HD uint64_t gcomp_topk_rice_bits(const uint64_t *gaps, unsigned m, unsigned b)
{
    uint64_t bits = (uint64_t)m * (b + 1);
    for (unsigned j = 0; j < m; j++) bits += gaps[j] >> b;
    return bits;
}

/* The largest Rice parameter the encoder considers for gaps whose OR is `any`. */
static inline GCOMP_HD unsigned gcomp_topk_rice_max(uint64_t any)
{
    unsigned w = gcomp_topk_width(any); /* the width of the OR is that of the largest gap */
    return w > 63 ? 63 : w;
}

/* The encoder's Rice parameter for a block's gaps (see above): the (bits, b) pair that is
 * smallest, compared by bits first and b second. The CUDA encoder computes the same minimum
 * with one b per lane (cuda/topk.cu). */
static inline GCOMP_HD unsigned gcomp_topk_rice_param(const uint64_t *gaps, unsigned m)
{
    uint64_t any = 0, best_bits;
    unsigned w, best = 0;
    for (unsigned j = 0; j < m; j++) any |= gaps[j];
    w = gcomp_topk_rice_max(any);
    best_bits = gcomp_topk_rice_bits(gaps, m, 0);
    for (unsigned b = 1; b <= w; b++) {
        uint64_t bits = gcomp_topk_rice_bits(gaps, m, b);
        if (bits < best_bits) best_bits = bits, best = b;
    }
    return best;
}

/* The value fields: fp32 1/8/23 bits, fp16 1/5/10. */
typedef struct gcomp_topk_vfmt {
    unsigned ebits, mbits;
} gcomp_topk_vfmt;

static inline GCOMP_HD gcomp_topk_vfmt gcomp_topk_value_format(int fp16)
{
    gcomp_topk_vfmt f = { fp16 ? 5u : 8u, fp16 ? 10u : 23u };
    return f;
}

/* Largest block: 3 header bytes, then per pair at most 64 gap bits + 1 (b = 63 with q = 0 is
 * the widest the encoder writes: b <= W) and 32 value bits. */
static inline GCOMP_HD size_t gcomp_topk_block_max_bytes(unsigned m, unsigned gap_width, int fp16)
{
    gcomp_topk_vfmt f = gcomp_topk_value_format(fp16);
    return 3 + ((size_t)m * (gap_width + 1 + 1 + f.ebits + f.mbits) + 7) / 8;
}

/* The wire bits of a kept value x (fp32 bits, or fp16 rounded to nearest even) and the value
 * it decodes to; *overflow = 1 when a finite x became +-inf in fp16. */
static inline GCOMP_HD uint32_t gcomp_topk_value_bits(float x, int fp16, float *decoded, unsigned *overflow)
{
    uint32_t v = gcomp_f32_bits(x);
    *decoded = x;
    *overflow = 0;
    if (fp16) {
        uint32_t key = gcomp_topk_key(v);
        v = gcomp_f16_from_bits(v);
        *decoded = gcomp_f16_to_f32_inline((uint16_t)v);
        *overflow = key < GCOMP_TOPK_INF_KEY && (v & 0x7fffu) == 0x7c00u;
    }
    return v;
}

/* Exponent field of wire value bits v. */
static inline GCOMP_HD uint32_t gcomp_topk_value_exp(uint32_t v, int fp16)
{
    const gcomp_topk_vfmt f = gcomp_topk_value_format(fp16);
    return v >> f.mbits & ((1u << f.ebits) - 1);
}

/* Bytes of a block of m pairs whose gaps take rice_bits bits, values ew-bit exponent offsets. */
static inline GCOMP_HD size_t gcomp_topk_block_bytes(uint64_t rice_bits, unsigned m, unsigned ew, int fp16)
{
    const gcomp_topk_vfmt f = gcomp_topk_value_format(fp16);
    return 3 + (size_t)((rice_bits + (uint64_t)m * (1 + ew + f.mbits) + 7) / 8);
}

/* ---- Rice-coded gaps on the bit streams of codecs/common.h ---------------------------------- */

/* One Rice-coded gap. */
static inline GCOMP_HD void gcomp_topk_put_gap(gcomp_bitwriter *bw, uint64_t gap, unsigned b)
{
    uint64_t q = gap >> b;
    for (; q >= 32; q -= 32) gcomp_bits_put(bw, 0xffffffffu, 32);
    gcomp_bits_put(bw, ((uint64_t)1 << q) - 1, (unsigned)q + 1); /* q ones, then a zero */
    if (b > 32) {
        gcomp_bits_put(bw, gap & 0xffffffffu, 32);
        gcomp_bits_put(bw, (gap >> 32) & (((uint64_t)1 << (b - 32)) - 1), b - 32);
    } else if (b) {
        gcomp_bits_put(bw, gap & (((uint64_t)1 << b) - 1), b);
    }
}

/* The 1 + ew + mantissa bits a value takes in its block's stream: sign, exponent field - e0,
 * mantissa (LSB first). */
static inline GCOMP_HD uint64_t gcomp_topk_value_field(uint32_t v, unsigned e0, unsigned ew, int fp16)
{
    const gcomp_topk_vfmt f = gcomp_topk_value_format(fp16);
    const uint32_t emask = (1u << f.ebits) - 1, mmask = (1u << f.mbits) - 1;
    return (v >> (f.ebits + f.mbits) & 1u) | (uint64_t)((v >> f.mbits & emask) - e0) << 1 |
           (uint64_t)(v & mmask) << (1 + ew);
}

/* Writes one block (header and bit stream) at out: m pairs with the given gaps and wire
 * value bits under the encoder's choices b, e0, ew. Returns the bytes written, which is
 * gcomp_topk_block_bytes of the block. (The CUDA encoder writes the same fields, one lane per
 * four pairs, at offsets from a scan of their lengths: cuda/topk.cu.) */
static inline GCOMP_HD size_t gcomp_topk_block_write(const uint64_t *gaps, const uint32_t *vals, unsigned m, unsigned b,
                                                     unsigned e0, unsigned ew, int fp16, uint8_t *out)
{
    const unsigned vbits = 1 + ew + gcomp_topk_value_format(fp16).mbits;
    gcomp_bitwriter bw = { out + 3, 0, 0, 0 };
    out[0] = (uint8_t)b;
    out[1] = (uint8_t)e0;
    out[2] = (uint8_t)ew;
    for (unsigned j = 0; j < m; j++) {
        gcomp_topk_put_gap(&bw, gaps[j], b);
        gcomp_bits_put(&bw, gcomp_topk_value_field(vals[j], e0, ew, fp16), vbits);
    }
    return 3 + gcomp_bits_flush(&bw);
}

/* How many one-bits acc starts with (64 when all are). */
static inline GCOMP_HD unsigned gcomp_topk_leading_ones(uint64_t acc) { return gcomp_ctz64(~acc); }

/* Takes a Rice-coded gap, refusing (returns 0) a truncated one and one of q >= qmax, where
 * qmax bounds what the caller can accept (so corrupt input cannot make us count forever, and
 * q << b cannot overflow when qmax <= 2^64 >> b). */
static inline GCOMP_HD int gcomp_topk_get_gap(gcomp_bitreader *br, unsigned b, uint64_t qmax, uint64_t *gap)
{
    uint64_t q = 0, lo = 0, hi = 0;
    for (;;) {
        unsigned ones;
        if (br->avail == 0) gcomp_bits_refill(br);
        if (br->avail == 0) return 0;
        ones = gcomp_topk_leading_ones(br->acc);
        if (ones > br->avail) ones = br->avail; /* what lies above avail is not loaded yet */
        q += ones;
        if (q >= qmax) return 0;
        br->acc = ones >= 64 ? 0 : br->acc >> ones;
        br->avail -= ones;
        if (br->avail) break; /* the zero bit is here */
    }
    br->acc >>= 1; /* the terminating zero */
    br->avail -= 1;
    if (b > 32) {
        if (!gcomp_bits_get(br, 32, &lo) || !gcomp_bits_get(br, b - 32, &hi)) return 0;
        lo |= hi << 32;
    } else if (b && !gcomp_bits_get(br, b, &lo)) {
        return 0;
    }
    *gap = q << b | lo;
    return 1;
}

/* One pair's gap and value field (1 <= vbits <= 32) in the common case: both within the bits
 * already loaded after one refill. Returns 0 (having consumed nothing) when they are not, or
 * when q >= qmax; the caller then takes the general path. */
static inline GCOMP_HD int gcomp_topk_get_pair_fast(gcomp_bitreader *br, unsigned b, uint64_t qmax, unsigned vbits,
                                                    uint64_t *gap, uint64_t *field)
{
    unsigned q;
    uint64_t acc;
    gcomp_bits_refill(br);
    q = gcomp_topk_leading_ones(br->acc);
    if (q >= br->avail || q + 1 + b + vbits > br->avail || q >= qmax) return 0;
    acc = br->acc >> (q + 1); /* avail <= 64 and vbits >= 1, so q + 1 <= 63 */
    *gap = (uint64_t)q << b | (acc & (((uint64_t)1 << b) - 1));
    acc >>= b;
    *field = acc & (((uint64_t)1 << vbits) - 1);
    br->acc = acc >> vbits;
    br->avail -= q + 1 + b + vbits;
    return 1;
}

/* ---- reading a body: every check a decoder makes, shared by the CPU and the GPU ---------- */

/* Why a body is refused (0: it is not). topk.c turns these into messages. */
enum {
    GCOMP_TOPK_BAD_FLAGS = 1,  /* unknown header flags */
    GCOMP_TOPK_BAD_NO_K,       /* the body has no room for k */
    GCOMP_TOPK_BAD_K_COUNT,    /* k > count */
    GCOMP_TOPK_BAD_K_CAP,      /* k > what the receiver accepts */
    GCOMP_TOPK_BAD_K_BYTES,    /* k pairs cannot fit in the body */
    GCOMP_TOPK_BAD_BLOCK_HEAD, /* the body ends inside a block's header */
    GCOMP_TOPK_BAD_RICE,       /* Rice parameter over 63 */
    GCOMP_TOPK_BAD_EXP_FIELDS, /* exponent base or width out of range */
    GCOMP_TOPK_BAD_TOO_MANY,   /* more indices than the tensor has */
    GCOMP_TOPK_BAD_GAP,        /* index out of range, or the block is truncated */
    GCOMP_TOPK_BAD_TRUNCATED,  /* the block is truncated */
    GCOMP_TOPK_BAD_INDEX,      /* index out of range */
    GCOMP_TOPK_BAD_EXP,        /* exponent out of range */
    GCOMP_TOPK_BAD_PADDING,    /* padding bits are not zero */
    GCOMP_TOPK_BAD_TRAILING    /* bytes after the last block */
};

/* A body being read: where the next block starts, the smallest index its next gap may give. */
typedef struct gcomp_topk_reader {
    const uint8_t *body;
    size_t bytes, pos;
    uint64_t count, k;
    uint64_t first; /* pairs read so far */
    uint64_t next;
    int fp16;
} gcomp_topk_reader;

/* Starts reading a body (the part after the 32-byte header; flags from the header): checks
 * the flags and k (<= count, <= cap, and small enough for the body's bytes). */
static inline GCOMP_HD int gcomp_topk_read_head(gcomp_topk_reader *rd, uint32_t flags, const uint8_t *body,
                                                size_t bytes, uint64_t count, uint64_t cap)
{
    gcomp_topk_vfmt f;
    rd->body = body, rd->bytes = bytes, rd->pos = 8, rd->count = count;
    rd->k = 0, rd->first = 0, rd->next = 0;
    rd->fp16 = (flags & GCOMP_TOPK_FLAG_FP16) != 0;
    f = gcomp_topk_value_format(rd->fp16);
    if (flags & ~GCOMP_TOPK_FLAG_FP16) return GCOMP_TOPK_BAD_FLAGS;
    if (bytes < 8) return GCOMP_TOPK_BAD_NO_K;
    rd->k = gcomp_le_load_u64(body);
    if (rd->k > count) return GCOMP_TOPK_BAD_K_COUNT;
    if (rd->k > cap) return GCOMP_TOPK_BAD_K_CAP;
    /* a pair takes at least 2 + mantissa bits (a zero bit, a sign bit, the mantissa) */
    if (rd->k > (uint64_t)(bytes - 8) * 8 / (2 + f.mbits)) return GCOMP_TOPK_BAD_K_BYTES;
    return 0;
}

/* Pairs in the block that starts at pair `first` of k. */
static inline GCOMP_HD unsigned gcomp_topk_block_len(uint64_t k, uint64_t first)
{
    uint64_t left = k - first;
    return left < GCOMP_TOPK_BLOCK ? (unsigned)left : GCOMP_TOPK_BLOCK;
}

/* Reads the next block (call while rd->first < rd->k) into idx[0..m) and val[0..m) (room for
 * GCOMP_TOPK_BLOCK each; values widened to fp32 exactly), *m its pair count. Returns 0 or why
 * the block is refused; then idx/val may hold part of it. */
static inline GCOMP_HD int gcomp_topk_read_block(gcomp_topk_reader *rd, uint64_t *idx, float *val, unsigned *m)
{
    const gcomp_topk_vfmt f = gcomp_topk_value_format(rd->fp16);
    const uint32_t emask = (1u << f.ebits) - 1, mmask = (1u << f.mbits) - 1;
    const uint64_t count = rd->count;
    const unsigned mm = gcomp_topk_block_len(rd->k, rd->first);
    unsigned b, e0, ew, pad, vbits;
    uint64_t next = rd->next;
    gcomp_bitreader br;
    *m = mm;
    if (rd->bytes - rd->pos < 3) return GCOMP_TOPK_BAD_BLOCK_HEAD;
    b = rd->body[rd->pos], e0 = rd->body[rd->pos + 1], ew = rd->body[rd->pos + 2];
    if (b > 63) return GCOMP_TOPK_BAD_RICE;
    if (e0 > emask || ew > f.ebits) return GCOMP_TOPK_BAD_EXP_FIELDS;
    br.in = rd->body, br.pos = rd->pos + 3, br.end = rd->bytes, br.acc = 0, br.avail = 0;
    vbits = 1 + ew + f.mbits;
    for (unsigned t = 0; t < mm; t++) {
        uint64_t gap, field, qmax, i;
        uint32_t e, v;
        if (next >= count) return GCOMP_TOPK_BAD_TOO_MANY;
        qmax = ((count - next - 1) >> b) + 1; /* so q << b stays below count - next */
        if (!gcomp_topk_get_pair_fast(&br, b, qmax, vbits, &gap, &field)) {
            if (!gcomp_topk_get_gap(&br, b, qmax, &gap)) return GCOMP_TOPK_BAD_GAP;
            if (!gcomp_bits_get(&br, vbits, &field)) return GCOMP_TOPK_BAD_TRUNCATED;
        }
        if (gap >= count - next) return GCOMP_TOPK_BAD_INDEX;
        e = e0 + (uint32_t)(field >> 1 & ((1u << ew) - 1));
        if (e > emask) return GCOMP_TOPK_BAD_EXP;
        v = (uint32_t)(field & 1) << (f.ebits + f.mbits) | e << f.mbits | ((uint32_t)(field >> (1 + ew)) & mmask);
        i = next + gap;
        idx[t] = i;
        val[t] = rd->fp16 ? gcomp_f16_to_f32_inline((uint16_t)v) : gcomp_bits_f32(v);
        next = i + 1;
    }
    /* the stream ends at the next whole byte, padded with zero bits */
    pad = br.avail % 8;
    if (br.acc & ((1u << pad) - 1)) return GCOMP_TOPK_BAD_PADDING;
    rd->pos = br.pos - (br.avail - pad) / 8;
    rd->next = next;
    rd->first += mm;
    return 0;
}

/* After the last block: the body must end there. */
static inline GCOMP_HD int gcomp_topk_read_end(const gcomp_topk_reader *rd)
{
    return rd->pos != rd->bytes ? GCOMP_TOPK_BAD_TRAILING : 0;
}

/* ---- for the engine's sparse gather ---- */

/* The kept pairs of a body (the part after the 32-byte header; flags from the header), in
 * index order, values widened to fp32 exactly: what decode_add would add. The body is checked
 * as decode_add checks it; GCOMP_ERR_CORRUPT also when it holds more than cap pairs. */
gcomp_result gcomp__topk_body_pairs(uint32_t flags, const uint8_t *body, size_t bytes, size_t count, size_t cap,
                                    uint64_t *idx, float *val, size_t *k_out);

#define GCOMP_TOPK_MAX_LISTS 1024 /* ranks gcomp__topk_sum_pairs sums at once */
typedef struct gcomp_topk_pairs {
    const uint64_t *idx; /* increasing, < count */
    const float *val;
    size_t k;
} gcomp_topk_pairs;

/* result[0..count) = the sum of the n lists, each element summed from 0.0f in list order,
 * then divided by divisor (1: SUM; the rank count: AVG): bit for bit what zeroing the result,
 * calling decode_add for each list in order and dividing gives, but writing the result once,
 * in order, instead of zeroing it, scattering into it and passing over it again.
 * n <= GCOMP_TOPK_MAX_LISTS. */
void gcomp__topk_sum_pairs(const gcomp_topk_pairs *lists, int n, float *result, size_t count, float divisor);

extern const gcomp_codec_vtable gcomp__codec_topk;
GCOMP_DECLARE_CUDA_OPS(topk);

#endif
