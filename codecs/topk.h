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
 * Body (after the 32-byte gcomp header; header flags bit 0 = values are fp16):
 *   u64  k
 *   index blocks: the k sorted indices as gaps, in blocks of GCOMP_TOPK_BLOCK gaps
 *     gap_0 = idx_0, gap_j = idx_j - idx_{j-1} - 1  (indices strictly increase)
 *     each block: u8 width w (0..64), then ceil(w * m / 8) bytes holding the block's m gaps,
 *     w bits each, packed least-significant bit first
 *   values: k values in index order, fp32 (4 bytes) or fp16 (2 bytes), little-endian
 *
 * Error feedback: r_out = x for every element not kept, x - decode(value) for kept ones.
 */
#ifndef GCOMP_CODECS_TOPK_H
#define GCOMP_CODECS_TOPK_H

#include "gcomp_codec.h"

#define GCOMP_WIRE_ID_TOPK 5
#define GCOMP_TOPK_BLOCK 128
#define GCOMP_TOPK_FLAG_FP16 1u

typedef struct gcomp_topk_params {
    double ratio;  /* fraction of elements kept, (0, 1]; default 0.01 */
    int64_t k;     /* if > 0, the number kept (overrides ratio); default 0 */
    int values;    /* 0 = fp32, 1 = fp16 */
} gcomp_topk_params;

/* Number of elements kept for n inputs. */
static inline uint64_t gcomp_topk_k(const gcomp_topk_params *p, uint64_t n)
{
    uint64_t k;
    if (n == 0) return 0;
    if (p->k > 0) {
        k = (uint64_t)p->k;
    } else {
        double want = p->ratio * (double)n;
        k = (uint64_t)want;
        if ((double)k < want) k++; /* ceil without libm */
    }
    if (k < 1) k = 1;
    if (k > n) k = n;
    return k;
}

/* The sort key of a value: larger key = larger magnitude. */
static inline uint32_t gcomp_topk_key(uint32_t bits) { return bits & 0x7fffffffu; }

/* ---- gap blocks: w-bit fields packed least-significant bit first ------------------------ */

/* Bytes of m fields of w bits. */
static inline size_t gcomp_topk_packed_bytes(unsigned m, unsigned w)
{
    return ((size_t)m * w + 7) / 8;
}

/* Bit length of v: the width a block needs when the OR of its gaps is v (0 for v == 0). */
static inline unsigned gcomp_topk_width(uint64_t v)
{
    unsigned w = 0;
    while (v) { w++; v >>= 1; }
    return w;
}

/* Pack m values (each < 2^w, w <= 64) into exactly gcomp_topk_packed_bytes(m, w) bytes of out.
 * Returns that byte count. The unused high bits of the last byte are zero. */
static inline size_t gcomp_topk_pack(uint8_t *out, const uint64_t *v, unsigned m, unsigned w)
{
    uint64_t acc = 0;  /* bits not yet written, LSB first */
    unsigned fill = 0; /* how many of them, always < 64 between fields */
    size_t pos = 0;
    for (unsigned j = 0; j < m && w > 0; j++) {
        acc |= v[j] << fill;
        fill += w;
        if (fill >= 64) {
            gcomp_store_u64(out + pos, acc);
            pos += 8;
            fill -= 64;
            /* the high bits of v[j] that did not fit; a shift by 64 would be undefined */
            acc = fill ? v[j] >> (w - fill) : 0;
        }
    }
    for (; fill > 0; fill = fill > 8 ? fill - 8 : 0) {
        out[pos++] = (uint8_t)acc;
        acc >>= 8;
    }
    return pos;
}

/* Little-endian load of up to 8 bytes at in[pos..], never reading at or past in[end]. */
static inline uint64_t gcomp_topk_load_tail(const uint8_t *in, size_t pos, size_t end)
{
    uint64_t v = 0;
    if (pos + 8 <= end) return gcomp_load_u64(in + pos);
    for (unsigned s = 0; pos < end; pos++, s += 8) v |= (uint64_t)in[pos] << s;
    return v;
}

/* Unpack m fields of w bits (w <= 64) from in, which holds gcomp_topk_packed_bytes(m, w)
 * bytes; reads nothing outside them. */
static inline void gcomp_topk_unpack(const uint8_t *in, uint64_t *v, unsigned m, unsigned w)
{
    const size_t end = gcomp_topk_packed_bytes(m, w);
    const uint64_t mask = w >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << w) - 1;
    uint64_t acc = 0;   /* bits loaded but not yet consumed, LSB first */
    unsigned avail = 0; /* how many of them (< 64 after each field) */
    size_t pos = 0;
    for (unsigned j = 0; j < m; j++) {
        if (avail >= w) {
            v[j] = acc & mask;
            acc = w >= 64 ? 0 : acc >> w;
            avail -= w;
        } else {
            uint64_t next = gcomp_topk_load_tail(in, pos, end);
            unsigned used = w - avail; /* bits of next that belong to this field, 1..64 */
            pos += 8;
            v[j] = (acc | (avail ? next << avail : next)) & mask;
            acc = used >= 64 ? 0 : next >> used;
            avail = 64 - used;
        }
    }
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

/* result[0..count) = the sum of the n lists, each element summed from 0.0f in list order:
 * bit for bit what zeroing the result and calling decode_add for each list in order gives,
 * but writing the result once, in order, instead of zeroing it and then scattering into it.
 * n <= GCOMP_TOPK_MAX_LISTS. */
void gcomp__topk_sum_pairs(const gcomp_topk_pairs *lists, int n, float *result, size_t count);

extern const gcomp_codec_vtable gcomp__codec_topk;

#endif
