/*
 * cuda/terngrad.cu — TernGrad on the GPU: the same bytes as codecs/terngrad.c, bit for bit.
 *
 * The per-element arithmetic (RNG, rounding rule) is the GCOMP_HD code of codecs/terngrad.h;
 * what is written here is the order of the floating-point operations the CPU reference fixes,
 * spelled with the _rn intrinsics so that no flag (and no FMA contraction) can change it.
 *
 * Encode (one scale per bucket, or one for the tensor):
 *   1. k_block_sums   one warp per rms block of 256 elements: max |x| bits and, with clip, the
 *                     block's halving-stride tree of squares (double) -> scratch
 *   2. k_group_sums   one warp per group of 1024 blocks: the block sums added in order (the
 *                     groups are what lets a large tensor's sum run in parallel) and the max
 *   3. k_scales       one thread per bucket: the group sums in order, clip * sqrt(ss / m) in
 *                     double, compared and rounded as on the host; scale -> body, nonfinite
 *   4. k_pack         one thread per code byte of the planar tiles: elements j, j+q, j+2q, j+3q
 *                     of its tile (coalesced across the warp), residual fused, written only when
 *                     every scale is finite (read from the status block, on the device)
 * With one scale for the tensor (bucket=0, the default) the passes are three kernels with
 * 16-byte accesses (section "one scale" below): k_block_sums4 (pass 1, four rms blocks per
 * warp step), k_group_scale1 (passes 2 and 3 in one launch: the CTA that finishes last adds
 * the group sums and writes the scale) and k_pack1 (pass 4, 4 code bytes per thread, the
 * chunks walked from the tensor's end, which pass 1 read last).
 * With buckets small enough (bucket <= FUSE_MAX), k_fused does 1-4 for one bucket per thread
 * block, the bucket held in shared memory, so g and r are read once. It writes a double-
 * buffered residual (buf[cur ^ 1]: harmless before the other buckets' scales are known, the
 * library keeps buf[cur] if one is not finite); an in-place residual may not be touched
 * before every scale is known finite, so k_resid writes it afterwards from the codes.
 *
 * Decode-add: k_validate (flags, size, scales, codes, padding; first error wins in
 * status->error), then k_add, which adds only when status->error is still 0.
 *
 * Integer ring: local_scales (passes 1-3 into a scale array), ternarise (int8 codes),
 * sums_add_pack and sums_values over the format-2 packed digit sums: one thread per 8 codes,
 * which are exactly W whole bytes (a block of 240 elements is 240/g codes, a multiple of 8).
 *
 * Nothing allocates (scratch comes from the caller), nothing synchronises the host.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

extern "C" { /* the ops table and the CPU helpers it shares are C symbols */
#include "codecs/terngrad.h"
}

#define RMS_BLOCK GCOMP_TG_RMS_BLOCK /* 256 */
#define RMS_GROUP GCOMP_TG_RMS_GROUP /* 1024 */
#define TILE GCOMP_TG_TILE           /* 1024 */
#define SUM_BLOCK 240                /* elements per block of packed sums (terngrad.c) */
#define FUSE_MAX 8192                /* largest bucket k_fused keeps in shared memory */
#define THREADS 256
#define MAX_BLOCKS 8192 /* grid-stride loops beyond this: enough to fill any GPU */

/* ---- geometry of one encode: buckets, rms blocks, rms groups ----------------------------- */

typedef struct tg_geom {
    uint64_t n;    /* elements */
    uint64_t B;    /* elements per bucket (n, or more, with one bucket) */
    uint64_t nb;   /* buckets */
    uint64_t bpb;  /* rms blocks per full bucket */
    uint64_t nblk; /* rms blocks in all (the last bucket may have fewer) */
    uint64_t gpb;  /* rms groups per full bucket */
    uint64_t ngrp; /* rms groups in all */
    double clip;
} tg_geom;

static uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

static tg_geom make_geom(const gcomp_terngrad_params *p, uint64_t n)
{
    tg_geom G;
    memset(&G, 0, sizeof G);
    G.n = n;
    G.clip = p->clip;
    G.nb = gcomp_tg_num_scales(p, n);
    if (n == 0) return G;
    G.B = p->bucket > 0 ? (uint64_t)p->bucket : n;
    G.bpb = ceil_div(G.B, RMS_BLOCK);
    G.gpb = ceil_div(G.bpb, RMS_GROUP);
    uint64_t last = n - (G.nb - 1) * G.B, last_blocks = ceil_div(last, RMS_BLOCK);
    G.nblk = (G.nb - 1) * G.bpb + last_blocks;
    G.ngrp = (G.nb - 1) * G.gpb + ceil_div(last_blocks, RMS_GROUP);
    return G;
}

/* Scratch of the scale passes: block sums and maxima, group sums and maxima. */
typedef struct tg_scratch {
    double *bsum, *gsum;
    uint32_t *bmax, *gmax;
    uint32_t *done; /* k_group_scale1: its CTAs that have finished (zeroed by k_block_sums4) */
} tg_scratch;

static size_t align16(size_t v) { return (v + 15) & ~(size_t)15; }

static size_t scratch_need(const tg_geom *G)
{
    return align16(8 * G->nblk) + align16(8 * G->ngrp) + align16(4 * G->nblk) + align16(4 * G->ngrp) + 4;
}

static tg_scratch carve(const tg_geom *G, void *scratch)
{
    tg_scratch s;
    uint8_t *p = (uint8_t *)scratch;
    s.bsum = (double *)p;
    p += align16(8 * G->nblk);
    s.gsum = (double *)p;
    p += align16(8 * G->ngrp);
    s.bmax = (uint32_t *)p;
    p += align16(4 * G->nblk);
    s.gmax = (uint32_t *)p;
    p += align16(4 * G->ngrp);
    s.done = (uint32_t *)p;
    return s;
}

/* ---- device helpers ---------------------------------------------------------------------- */

static __device__ __forceinline__ uint64_t bucket_len(const tg_geom &G, uint64_t j)
{
    uint64_t rest = G.n - j * G.B;
    return rest < G.B ? rest : G.B;
}

static __device__ __forceinline__ bool finite_f32(float f) { return (gcomp_f32_bits(f) & 0x7f800000u) != 0x7f800000u; }

/* The residual the encode reads, and where it writes: buf[cur ^ 1] when double-buffered,
 * buf[cur] in place; NULL without error feedback. Read on the device: a captured graph
 * replays with the cur and step of the moment. */
static __device__ __forceinline__ const float *res_in(const gcomp_cuda_residual *res)
{
    return res ? res->buf[res->cur] : nullptr;
}
static __device__ __forceinline__ float *res_out(const gcomp_cuda_residual *res)
{
    if (!res) return nullptr;
    float *o = res->buf[res->cur ^ 1u];
    return o ? o : res->buf[res->cur];
}
static __device__ __forceinline__ uint64_t res_key(const gcomp_cuda_residual *res, uint64_t seed, uint64_t step,
                                                   uint32_t rank)
{
    return gcomp_tg_key(seed, res ? res->step : step, rank);
}

static __device__ __forceinline__ float load_x(const float *g, const float *r, uint64_t i)
{
    return r ? __fadd_rn(g[i], r[i]) : g[i];
}

/* The RNG of one call: its key and the salt of the index range where the tensor starts, so
 * an element pays for a second salt only past a multiple of 2^32. */
typedef struct tg_rng {
    uint64_t key;
    uint32_t hi0, salt0;
} tg_rng;

static __device__ __forceinline__ tg_rng rng_of(uint64_t key, uint64_t first)
{
    tg_rng q;
    q.key = key;
    q.hi0 = (uint32_t)(first >> 32);
    q.salt0 = gcomp_tg_salt(key, q.hi0);
    return q;
}

/* The code of the element of global RNG index gi under scale s (gcomp_tg_uniform's value). */
static __device__ __forceinline__ uint32_t code_of(float x, float s, const tg_rng &q, uint64_t gi)
{
    uint32_t hi = (uint32_t)(gi >> 32), salt = hi == q.hi0 ? q.salt0 : gcomp_tg_salt(q.key, hi);
    return gcomp_tg_code(x, s, gcomp_tg_uniform_salted(salt, (uint32_t)gi));
}
static __device__ __forceinline__ float code_value(uint32_t c)
{
    return (float)(int32_t)((c & 1u) - (c >> 1)); /* 1 -> +1, 2 -> -1, 0 -> 0 */
}

static __device__ __forceinline__ uint32_t warp_max_u32(uint32_t v)
{
    for (int o = 16; o > 0; o >>= 1) {
        uint32_t w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}

static __device__ __forceinline__ void set_error(gcomp_cuda_status *st, uint32_t rc) { atomicCAS(&st->error, 0u, rc); }

/* The rms-block tree of terngrad.c for the 256 elements x[lane + 32 i], i < 8, of one warp
 * (zero past the block's end): t[k] = x[k]^2 + x[k+128]^2, then t[k] += t[k+w] for
 * w = 64, 32 (inside the lane), 16 .. 1 (across lanes). The sum lands in lane 0. */
static __device__ __forceinline__ double block_tree(const float x[8])
{
    double t[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        t[i] = __dadd_rn(__dmul_rn((double)x[i], (double)x[i]), __dmul_rn((double)x[i + 4], (double)x[i + 4]));
    t[0] = __dadd_rn(t[0], t[2]); /* w = 64: k = lane (+32) pairs with k + 64 */
    t[1] = __dadd_rn(t[1], t[3]);
    t[0] = __dadd_rn(t[0], t[1]); /* w = 32 */
    for (int w = 16; w > 0; w >>= 1) t[0] = __dadd_rn(t[0], __shfl_down_sync(0xffffffffu, t[0], w));
    return t[0];
}

/* max |x| bits of the 8 values of a lane, over the warp. */
static __device__ __forceinline__ uint32_t block_max(const float x[8])
{
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        uint32_t k = gcomp_f32_bits(x[i]) & 0x7fffffffu;
        m = k > m ? k : m;
    }
    return warp_max_u32(m);
}

/* The scale of a bucket of m elements from its max bits and sum of squares (terngrad.c's
 * bucket_scale): clip * sqrt(ss / m) in double, compared in double, then rounded. */
static __device__ __forceinline__ float bucket_scale(double clip, uint32_t maxbits, double ss, uint64_t m)
{
    float s = gcomp_bits_f32(gcomp_tg_max_bits(maxbits));
    if (clip > 0 && finite_f32(s) && m) {
        double c = __dmul_rn(clip, __dsqrt_rn(__ddiv_rn(ss, (double)m)));
        if (c < (double)s) s = __double2float_rn(c);
    }
    return s;
}

/* ---- pass 1: rms blocks ------------------------------------------------------------------ */

template <bool CLIP>
static __global__ void k_block_sums(tg_geom G, const float *g, const gcomp_cuda_residual *res, tg_scratch S)
{
    const float *r = res_in(res);
    const unsigned lane = threadIdx.x & 31u;
    const uint64_t nwarps = ((uint64_t)gridDim.x * blockDim.x) >> 5;
    for (uint64_t b = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; b < G.nblk; b += nwarps) {
        uint64_t j = b / G.bpb, k = b - j * G.bpb;
        uint64_t start = j * G.B + k * RMS_BLOCK, left = bucket_len(G, j) - k * RMS_BLOCK;
        uint32_t len = left < RMS_BLOCK ? (uint32_t)left : RMS_BLOCK;
        float x[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            uint32_t e = lane + 32u * i;
            x[i] = e < len ? load_x(g, r, start + e) : 0.0f;
        }
        uint32_t m = block_max(x);
        if (CLIP) {
            double t = block_tree(x);
            if (lane == 0) S.bsum[b] = t;
        }
        if (lane == 0) S.bmax[b] = m;
    }
}

/* ---- pass 2: groups of 1024 blocks, one warp each ---------------------------------------- */

#define GROUP_WARPS 4

template <bool CLIP>
static __global__ void k_group_sums(tg_geom G, tg_scratch S, gcomp_cuda_status *st, uint64_t body_bytes)
{
    __shared__ double sh[GROUP_WARPS][RMS_GROUP];
    const unsigned lane = threadIdx.x & 31u, w = threadIdx.x >> 5;
    const uint64_t nwarps = ((uint64_t)gridDim.x * blockDim.x) >> 5;
    if (st && blockIdx.x == 0 && threadIdx.x == 0) { /* before k_scales sets nonfinite */
        st->body_bytes = body_bytes;
        st->overflow = 0;
        st->flags = 0;
        st->nonfinite = 0;
    }
    for (uint64_t h = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; h < G.ngrp; h += nwarps) {
        uint64_t j = h / G.gpb, k = h - j * G.gpb;
        uint64_t blocks = (bucket_len(G, j) + RMS_BLOCK - 1) / RMS_BLOCK - k * RMS_GROUP;
        uint32_t cnt = blocks < RMS_GROUP ? (uint32_t)blocks : RMS_GROUP;
        uint64_t first = j * G.bpb + k * RMS_GROUP;
        uint32_t m = 0;
        for (uint32_t e = lane; e < cnt; e += 32) {
            uint32_t v = S.bmax[first + e];
            m = v > m ? v : m;
            if (CLIP) sh[w][e] = S.bsum[first + e];
        }
        m = warp_max_u32(m);
        __syncwarp();
        if (lane == 0) {
            if (CLIP) {
                double s = 0; /* in block order: the specification's sum */
                uint32_t e = 0;
                for (; e + 8 <= cnt; e += 8) { /* 8 shared loads in flight per step of the chain */
                    double v[8];
#pragma unroll
                    for (int u = 0; u < 8; u++) v[u] = sh[w][e + u];
#pragma unroll
                    for (int u = 0; u < 8; u++) s = __dadd_rn(s, v[u]);
                }
                for (; e < cnt; e++) s = __dadd_rn(s, sh[w][e]);
                S.gsum[h] = s;
            }
            S.gmax[h] = m;
        }
        __syncwarp();
    }
}

/* ---- pass 3: one thread per bucket ------------------------------------------------------- */

template <bool CLIP>
static __global__ void k_scales(tg_geom G, tg_scratch S, float *scales, uint8_t *body, gcomp_cuda_status *st)
{
    for (uint64_t j = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; j < G.nb;
         j += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t m = bucket_len(G, j), groups = ((m + RMS_BLOCK - 1) / RMS_BLOCK + RMS_GROUP - 1) / RMS_GROUP;
        double ss = 0;
        uint32_t mb = 0;
        for (uint64_t k0 = 0; k0 < groups; k0 += 16) {
            /* 16 loads in flight, then the adds in order: a load per add would make the
             * sum of a large tensor's 256+ groups a chain of memory latencies */
            double v[16];
            uint32_t x[16];
#pragma unroll
            for (int u = 0; u < 16; u++) {
                bool in = k0 + u < groups;
                v[u] = CLIP && in ? S.gsum[j * G.gpb + k0 + u] : 0.0;
                x[u] = in ? S.gmax[j * G.gpb + k0 + u] : 0u;
            }
#pragma unroll
            for (int u = 0; u < 16; u++) {
                if (CLIP && k0 + u < groups) ss = __dadd_rn(ss, v[u]);
                mb = x[u] > mb ? x[u] : mb;
            }
        }
        float s = bucket_scale(CLIP ? G.clip : 0.0, mb, ss, m);
        if (scales) scales[j] = s;
        if (body) gcomp_le_store_u32(body + 4 * j, gcomp_f32_bits(s));
        if (st && !finite_f32(s)) st->nonfinite = 1; /* same value from every writer */
    }
}

/* ---- pass 4: ternarise and pack, one thread per code byte -------------------------------- */

static __global__ void k_pack(tg_geom G, const float *g, const gcomp_cuda_residual *res, uint64_t seed, uint64_t step,
                              uint64_t offset, uint32_t rank, uint8_t *body, const gcomp_cuda_status *st)
{
    const float *r = res_in(res);
    float *ro = st->nonfinite ? nullptr : res_out(res); /* every scale finite, or no bucket writes */
    const tg_rng q = rng_of(res_key(res, seed, step, rank), offset);
    const uint64_t nbytes = (G.n + 3) / 4;
    const uint8_t *scales = body;
    uint8_t *codes = body + 4 * G.nb;
    for (uint64_t c = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; c < nbytes;
         c += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t j = G.nb > 1 ? 4 * c / G.B : 0, b0 = j * G.B;
        uint64_t lc = c - b0 / 4, t0 = lc / (TILE / 4), jj = lc - t0 * (TILE / 4);
        uint64_t a = b0 + t0 * TILE, left = bucket_len(G, j) - t0 * TILE;
        uint32_t len = left < TILE ? (uint32_t)left : TILE, qb = (len + 3) / 4;
        float s = gcomp_bits_f32(gcomp_le_load_u32(scales + 4 * j));
        uint32_t byte = 0;
#pragma unroll
        for (uint32_t p = 0; p < 4; p++) {
            uint32_t k = (uint32_t)jj + p * qb;
            if (k < len) {
                uint64_t i = a + k;
                float x = load_x(g, r, i);
                uint32_t cd = code_of(x, s, q, offset + i);
                byte |= cd << (2 * p);
                if (ro) ro[i] = __fsub_rn(x, __fmul_rn(code_value(cd), s));
            }
        }
        codes[c] = (uint8_t)byte;
    }
}

/* ---- one scale for the whole tensor (bucket=0): passes 1-4 with 16-byte accesses --------- */

/* On an H100 (h6-explore2 a4dd388, 256 MiB, a CUDA event after every launch, medians of 30)
 * these three kernels took 0.492 ms (k_block_sums4 0.198, k_group_scale1 0.020, k_pack1
 * 0.267) against 0.545 ms for k_block_sums + k_group_sums + k_scales + k_pack; two rms
 * blocks per warp step did as well as four, one did not (0.202 ms for pass 1), and capping
 * pass 1 at 4-16 CTAs per SM was slower. Each pass's sums are those of passes 1-3 above, in
 * the same order, so the bytes are the same (checked against the CPU there). */

#define S4_BLOCKS 4 /* rms blocks per warp step of k_block_sums4: all their loads issued first */

/* x[u] = element base + 4 lane + u and x[4 + u] = element base + 128 + 4 lane + u of one rms
 * block of len elements (zero past len): two 16-byte loads of g (and of r) per lane. */
static __device__ __forceinline__ void load_block4(const float *g, const float *r, uint64_t base, uint32_t len,
                                                   bool vec, float x[8])
{
    const uint32_t e = 4u * (threadIdx.x & 31u);
    if (vec && len == RMS_BLOCK) {
        /* explicit global loads (r comes through the residual struct: a plain load of it would
         * be a generic one); neither array is written by pass 1 */
        float4 a = __ldg((const float4 *)(g + base + e)), b = __ldg((const float4 *)(g + base + 128 + e));
        if (r) {
            const float4 ra = __ldg((const float4 *)(r + base + e)), rb = __ldg((const float4 *)(r + base + 128 + e));
            a.x = __fadd_rn(a.x, ra.x), a.y = __fadd_rn(a.y, ra.y), a.z = __fadd_rn(a.z, ra.z),
            a.w = __fadd_rn(a.w, ra.w);
            b.x = __fadd_rn(b.x, rb.x), b.y = __fadd_rn(b.y, rb.y), b.z = __fadd_rn(b.z, rb.z),
            b.w = __fadd_rn(b.w, rb.w);
        }
        x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
        return;
    }
#pragma unroll
    for (uint32_t u = 0; u < 4; u++) {
        x[u] = e + u < len ? load_x(g, r, base + e + u) : 0.0f;
        x[4 + u] = 128 + e + u < len ? load_x(g, r, base + 128 + e + u) : 0.0f;
    }
}

/* The rms-block tree of terngrad.c (block_tree's sums) over load_block4's layout:
 * t[k] = x[k]^2 + x[k+128]^2 in the lane (k = 4 lane + u), t[k] += t[k+w] for w = 64 .. 4
 * across lanes 16 .. 1 apart, then w = 2, 1 inside lane 0. The sum lands in lane 0. */
static __device__ __forceinline__ double block_tree4(const float x[8])
{
    double t[4];
#pragma unroll
    for (int u = 0; u < 4; u++)
        t[u] = __dadd_rn(__dmul_rn((double)x[u], (double)x[u]), __dmul_rn((double)x[u + 4], (double)x[u + 4]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int u = 0; u < 4; u++) t[u] = __dadd_rn(t[u], __shfl_down_sync(0xffffffffu, t[u], o));
    t[0] = __dadd_rn(t[0], t[2]); /* w = 2 */
    t[1] = __dadd_rn(t[1], t[3]);
    return __dadd_rn(t[0], t[1]); /* w = 1 */
}

/* Sum of v[0..cnt) in order (the specification's), from shared memory or, GLOBAL, from global
 * memory through L2 (written by other CTAs of the launch); 8 loads in flight per step. */
template <bool GLOBAL> static __device__ __forceinline__ double chain_sum(const double *v, uint64_t cnt)
{
    double s = 0;
    uint64_t e = 0;
    for (; e + 8 <= cnt; e += 8) {
        double t[8];
#pragma unroll
        for (int u = 0; u < 8; u++) t[u] = GLOBAL ? __ldcg(v + e + u) : v[e + u];
#pragma unroll
        for (int u = 0; u < 8; u++) s = __dadd_rn(s, t[u]);
    }
    for (; e < cnt; e++) s = __dadd_rn(s, GLOBAL ? __ldcg(v + e) : v[e]);
    return s;
}

/* Pass 1 for one scale: each warp reduces S4_BLOCKS consecutive rms blocks per step (block b
 * starts at element 256 b: one bucket), all their loads issued before any use. S.done, the
 * counter of k_group_scale1 (next on the stream), is zeroed here: scratch holds anything. */
template <bool CLIP>
static __global__ void __launch_bounds__(THREADS)
    k_block_sums4(tg_geom G, const float *g, const gcomp_cuda_residual *res, tg_scratch S)
{
    const float *r = res_in(res);
    const bool vec = (((uintptr_t)g | (uintptr_t)r) & 15u) == 0;
    const unsigned lane = threadIdx.x & 31u;
    const uint64_t nwarps = ((uint64_t)gridDim.x * blockDim.x) >> 5, tasks = (G.nblk + S4_BLOCKS - 1) / S4_BLOCKS;
    if (blockIdx.x == 0 && threadIdx.x == 0) *S.done = 0;
    for (uint64_t t = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; t < tasks; t += nwarps) {
        float x[S4_BLOCKS][8];
#pragma unroll
        for (int k = 0; k < S4_BLOCKS; k++) {
            const uint64_t b = t * S4_BLOCKS + k, left = b < G.nblk ? G.n - b * RMS_BLOCK : 0;
            load_block4(g, r, b * RMS_BLOCK, left < RMS_BLOCK ? (uint32_t)left : RMS_BLOCK, vec, x[k]);
        }
#pragma unroll
        for (int k = 0; k < S4_BLOCKS; k++) {
            const uint64_t b = t * S4_BLOCKS + k;
            if (b < G.nblk) { /* warp-uniform */
                const uint32_t m = block_max(x[k]);
                const double s = CLIP ? block_tree4(x[k]) : 0.0;
                if (lane == 0) {
                    S.bmax[b] = m;
                    if (CLIP) S.bsum[b] = s;
                }
            }
        }
    }
}

/* Passes 2 and 3 for one scale in one launch: k_group_sums' work (a warp per group of 1024
 * rms blocks, their sums in order), then the CTA that finishes last (S.done counts them) adds
 * the group sums in order, as k_scales does, and writes the scale and status->nonfinite. */
template <bool CLIP>
static __global__ void k_group_scale1(tg_geom G, tg_scratch S, gcomp_cuda_status *st, uint64_t body_bytes,
                                      uint8_t *body)
{
    __shared__ double sh[GROUP_WARPS][RMS_GROUP];
    __shared__ uint32_t wm[GROUP_WARPS];
    __shared__ uint32_t last;
    const unsigned lane = threadIdx.x & 31u, w = threadIdx.x >> 5;
    const uint64_t nwarps = ((uint64_t)gridDim.x * blockDim.x) >> 5;
    if (blockIdx.x == 0 && threadIdx.x == 0) { /* nonfinite: written by the last CTA */
        st->body_bytes = body_bytes;
        st->overflow = 0;
        st->flags = 0;
    }
    for (uint64_t h = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; h < G.ngrp; h += nwarps) {
        const uint64_t blocks = G.nblk - h * RMS_GROUP;
        const uint32_t cnt = blocks < RMS_GROUP ? (uint32_t)blocks : RMS_GROUP;
        const uint64_t first = h * RMS_GROUP;
        uint32_t m = 0;
        for (uint32_t e = lane; e < cnt; e += 32) {
            uint32_t v = S.bmax[first + e];
            m = v > m ? v : m;
            if (CLIP) sh[w][e] = S.bsum[first + e];
        }
        m = warp_max_u32(m);
        __syncwarp();
        if (lane == 0) {
            if (CLIP) S.gsum[h] = chain_sum<false>(sh[w], cnt);
            S.gmax[h] = m;
        }
        __syncwarp();
    }
    if (lane == 0) __threadfence(); /* this warp's group results before the counter */
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(S.done, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return; /* CTA-uniform */
    __threadfence();
    uint32_t mb = 0;
    for (uint64_t e = threadIdx.x; e < G.ngrp; e += blockDim.x) {
        uint32_t v = __ldcg(S.gmax + e);
        mb = v > mb ? v : mb;
    }
    mb = warp_max_u32(mb);
    if (lane == 0) wm[w] = mb;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (unsigned i = 0; i < blockDim.x / 32; i++) mb = wm[i] > mb ? wm[i] : mb;
        const double ss = CLIP ? chain_sum<true>(S.gsum, G.ngrp) : 0.0;
        const float s = bucket_scale(CLIP ? G.clip : 0.0, mb, ss, G.n);
        gcomp_le_store_u32(body, gcomp_f32_bits(s));
        st->nonfinite = finite_f32(s) ? 0u : 1u;
    }
}

/* Pass 4: a chunk of PACK1_CHUNK elements per CTA (2048 code bytes, 4 per thread), up to
 * PACK1_PER_SM CTAs per SM (then they loop). At 256 MiB on the H100 one chunk per CTA took
 * 0.270 ms against k_pack's 0.306 ms, fewer CTAs that loop were slower (0.275 ms at 16 per
 * SM, 0.284 ms at 2), the evict-first hint on the loads and stores cost about 0.01 ms, and
 * starting on the tensor's end (CTA b takes chunk nchunks - 1 - b: pass 1 read those last,
 * some are still in L2) saved about 0.003 ms. */
#define PACK1_THREADS 512
#define PACK1_CHUNK (16u * PACK1_THREADS) /* elements: 4 code bytes per thread */
#define PACK1_PER_SM 64

/* Code byte c of the one-scale body (scale s) with its four elements; residual fused. */
static __device__ __forceinline__ void pack_byte1(const tg_geom &G, const float *g, const float *r, float *ro,
                                                  const tg_rng &q, uint64_t offset, float s, uint64_t c, uint8_t *codes)
{
    const uint64_t t0 = c / (TILE / 4), jj = c - t0 * (TILE / 4), a = t0 * TILE, left = G.n - a;
    const uint32_t len = left < TILE ? (uint32_t)left : TILE, qb = (len + 3) / 4;
    uint32_t byte = 0;
#pragma unroll
    for (uint32_t p = 0; p < 4; p++) {
        uint32_t k = (uint32_t)jj + p * qb;
        if (k < len) {
            uint64_t i = a + k;
            float x = load_x(g, r, i);
            uint32_t cd = code_of(x, s, q, offset + i);
            byte |= cd << (2 * p);
            if (ro) ro[i] = __fsub_rn(x, __fmul_rn(code_value(cd), s));
        }
    }
    codes[c] = (uint8_t)byte;
}

/* Pass 4 for one scale: thread t of a chunk packs code bytes 4t .. 4t+3. In a whole tile
 * (q = 256) they hold elements 4t'..4t'+3 of each of the 4 planes (t' = t mod 64), so with
 * 16-byte aligned arrays that is four float4 loads of g and of r (all issued first), four
 * float4 stores of the residual and one 4-byte store of the codes. Each thread reads and
 * writes only its own elements, so an in-place residual is safe. The partial last tile and
 * unaligned arrays take pack_byte1 (k_pack's arithmetic, byte by byte). The chunks are taken
 * from the tensor's end: pass 1 read the end last. */
static __global__ void __launch_bounds__(PACK1_THREADS, 2) /* 64 registers, as measured */
    k_pack1(tg_geom G, const float *g, const gcomp_cuda_residual *res, uint64_t seed, uint64_t step, uint64_t offset,
            uint32_t rank, uint8_t *body, const gcomp_cuda_status *st)
{
    const float *r = res_in(res);
    float *ro = st->nonfinite ? nullptr : res_out(res); /* the scale is finite, or no write */
    const tg_rng q = rng_of(res_key(res, seed, step, rank), offset);
    const uint64_t nbytes = (G.n + 3) / 4, whole = G.n / TILE;
    const uint64_t nchunks = (G.n + PACK1_CHUNK - 1) / PACK1_CHUNK;
    const float s = gcomp_bits_f32(gcomp_le_load_u32(body));
    uint8_t *codes = body + 4;
    const bool vec = (((uintptr_t)g | (uintptr_t)r | (uintptr_t)ro) & 15u) == 0;
    const bool word = ((uintptr_t)codes & 3u) == 0;
    for (uint64_t cf = blockIdx.x; cf < nchunks; cf += gridDim.x) {
        const uint64_t c = nchunks - 1 - cf; /* from the end */
        const uint64_t c0 = c * (PACK1_CHUNK / 4) + 4u * threadIdx.x, t0 = c0 / (TILE / 4);
        if (c0 >= nbytes) continue;
        if (!vec || t0 >= whole) {
            for (uint64_t cc = c0; cc < c0 + 4 && cc < nbytes; cc++) pack_byte1(G, g, r, ro, q, offset, s, cc, codes);
            continue;
        }
        const uint64_t e0 = t0 * TILE + (c0 - t0 * (TILE / 4)); /* element of byte c0, plane 0 */
        float4 gv[4], rv[4];
#pragma unroll
        for (int p = 0; p < 4; p++) { /* all loads first: 8 x 16 bytes in flight */
            gv[p] = __ldg((const float4 *)(g + e0 + (uint64_t)p * (TILE / 4)));
            if (r) rv[p] = __ldg((const float4 *)(r + e0 + (uint64_t)p * (TILE / 4)));
        }
        uint32_t bytes = 0; /* byte u of the four in bits 8u .. 8u+7 */
#pragma unroll
        for (int p = 0; p < 4; p++) {
            const uint64_t i = e0 + (uint64_t)p * (TILE / 4);
            float x[4] = { gv[p].x, gv[p].y, gv[p].z, gv[p].w };
            if (r) {
                x[0] = __fadd_rn(x[0], rv[p].x);
                x[1] = __fadd_rn(x[1], rv[p].y);
                x[2] = __fadd_rn(x[2], rv[p].z);
                x[3] = __fadd_rn(x[3], rv[p].w);
            }
            float o[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                uint32_t cd = code_of(x[u], s, q, offset + i + u);
                bytes |= cd << (8 * u + 2 * p);
                o[u] = __fsub_rn(x[u], __fmul_rn(code_value(cd), s));
            }
            if (ro) *(float4 *)(ro + i) = make_float4(o[0], o[1], o[2], o[3]);
        }
        if (word) {
            *(unsigned int *)(codes + c0) = bytes;
        } else {
#pragma unroll
            for (int u = 0; u < 4; u++) codes[c0 + u] = (uint8_t)(bytes >> (8 * u));
        }
    }
}

/* ---- fused per-bucket encode (double-buffered residual, small buckets) ------------------- */

/* One thread block per bucket: x = g + r into shared memory, the block trees by warps, the
 * scale by thread 0, then the tiles from shared memory. g and r are read from DRAM once.
 * The residual is written here only when double-buffered (read on the device); in place,
 * k_resid does it. */
template <bool CLIP>
static __global__ void k_fused(tg_geom G, const float *g, const gcomp_cuda_residual *res, uint64_t seed, uint64_t step,
                               uint64_t offset, uint32_t rank, uint8_t *body, gcomp_cuda_status *st)
{
    extern __shared__ float xs[]; /* bpb * 256 floats (x, zero-padded), then bpb block sums */
    __shared__ uint32_t wmax[32];
    __shared__ float scale;
    const unsigned lane = threadIdx.x & 31u, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const float *r = res_in(res);
    float *ro = res ? res->buf[res->cur ^ 1u] : nullptr; /* double-buffered: written here */
    const tg_rng q = rng_of(res_key(res, seed, step, rank), offset);
    double *bs = (double *)(xs + G.bpb * RMS_BLOCK);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        st->body_bytes = 4 * G.nb + (G.n + 3) / 4;
        st->overflow = 0;
        st->flags = 0;
        /* nonfinite: zeroed by the launcher's memset, raised below */
    }
    for (uint64_t j = blockIdx.x; j < G.nb; j += gridDim.x) {
        const uint64_t b0 = j * G.B;
        const uint32_t m = (uint32_t)bucket_len(G, j), nblk = (m + RMS_BLOCK - 1) / RMS_BLOCK;
        /* x = g + r of the bucket into shared memory, 8 loads of each array in flight */
        for (uint32_t e0 = threadIdx.x; e0 < nblk * RMS_BLOCK; e0 += 8 * blockDim.x) {
            float v[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                uint32_t e = e0 + u * blockDim.x;
                v[u] = e < m ? load_x(g, r, b0 + e) : 0.0f; /* the last block zero-padded */
            }
#pragma unroll
            for (int u = 0; u < 8; u++) {
                uint32_t e = e0 + u * blockDim.x;
                if (e < nblk * RMS_BLOCK) xs[e] = v[u];
            }
        }
        __syncthreads();
        uint32_t mx = 0;
        for (uint32_t k = w; k < nblk; k += nw) {
            float x[8];
#pragma unroll
            for (int i = 0; i < 8; i++) x[i] = xs[k * RMS_BLOCK + lane + 32u * i];
            uint32_t bm = block_max(x);
            mx = bm > mx ? bm : mx;
            if (CLIP) {
                double t = block_tree(x);
                if (lane == 0) bs[k] = t;
            }
        }
        /* the bucket's max: per-warp maxima through shared memory (order-free) */
        if (lane == 0) wmax[w] = mx;
        __syncthreads();
        if (threadIdx.x == 0) {
            uint32_t mb = 0;
            for (unsigned i = 0; i < nw; i++) mb = wmax[i] > mb ? wmax[i] : mb;
            double ss = 0;
            if (CLIP)
                for (uint32_t k = 0; k < nblk; k++) ss = __dadd_rn(ss, bs[k]); /* <= 1024 blocks: one group */
            float s = bucket_scale(CLIP ? G.clip : 0.0, mb, ss, m);
            gcomp_le_store_u32(body + 4 * j, gcomp_f32_bits(s));
            if (!finite_f32(s)) atomicOr(&st->nonfinite, 1u);
            scale = s;
        }
        __syncthreads();
        const float s = scale;
        /* nonfinite here: r_out may hold anything, the library keeps buf[cur] (double-buffered) */
        uint8_t *codes = body + 4 * G.nb + b0 / 4;
        const uint32_t nbytes = (m + 3) / 4;
        for (uint32_t lc = threadIdx.x; lc < nbytes; lc += blockDim.x) {
            uint32_t t0 = lc / (TILE / 4), jj = lc - t0 * (TILE / 4), a = t0 * TILE;
            uint32_t left = m - a, len = left < TILE ? left : TILE, qb = (len + 3) / 4;
            uint32_t byte = 0;
#pragma unroll
            for (uint32_t p = 0; p < 4; p++) {
                uint32_t k = jj + p * qb;
                if (k < len) {
                    float x = xs[a + k];
                    uint32_t cd = code_of(x, s, q, offset + b0 + a + k);
                    byte |= cd << (2 * p);
                    if (ro) ro[b0 + a + k] = __fsub_rn(x, __fmul_rn(code_value(cd), s));
                }
            }
            codes[lc] = (uint8_t)byte;
        }
        __syncthreads(); /* xs, wmax and scale are reused by the next bucket */
    }
}

/* After k_fused with an in-place residual: r = x - t*s from the codes it wrote, once every
 * scale is known finite (k_fused raised status->nonfinite otherwise). Same operations as
 * k_pack's residual, so the same bits. */
static __global__ void k_resid(tg_geom G, const float *g, const gcomp_cuda_residual *res, const uint8_t *body,
                               const gcomp_cuda_status *st)
{
    if (!res || res->buf[res->cur ^ 1u] || st->nonfinite) return;
    float *r = res->buf[res->cur];
    const uint64_t nbytes = (G.n + 3) / 4;
    const uint8_t *codes = body + 4 * G.nb;
    for (uint64_t c = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; c < nbytes;
         c += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t j = 4 * c / G.B, b0 = j * G.B;
        uint64_t lc = c - b0 / 4, t0 = lc / (TILE / 4), jj = lc - t0 * (TILE / 4);
        uint64_t a = b0 + t0 * TILE, left = bucket_len(G, j) - t0 * TILE;
        uint32_t len = left < TILE ? (uint32_t)left : TILE, qb = (len + 3) / 4;
        float s = gcomp_bits_f32(gcomp_le_load_u32(body + 4 * j));
        uint32_t v = codes[c];
#pragma unroll
        for (uint32_t p = 0; p < 4; p++) {
            uint32_t k = (uint32_t)jj + p * qb;
            if (k < len) {
                uint64_t i = a + k;
                float x = __fadd_rn(g[i], r[i]);
                r[i] = __fsub_rn(x, __fmul_rn(code_value((v >> (2 * p)) & 3u), s));
            }
        }
    }
}

/* ---- decode-add -------------------------------------------------------------------------- */

/* The payload's header fields the library has checked; the rest of the checks are here. */
static __device__ __forceinline__ bool header_ok(const uint8_t *payload, uint64_t expect)
{
    return gcomp_le_load_u32(payload + 8) == 0 && gcomp_le_load_u64(payload + 24) == expect;
}

static __global__ void k_validate(tg_geom G, const uint8_t *payload, uint64_t cap, gcomp_cuda_status *st)
{
    const uint64_t expect = 4 * G.nb + (G.n + 3) / 4, nbytes = (G.n + 3) / 4;
    const uint64_t tid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (uint64_t)gridDim.x * blockDim.x;
    if (st->error) return;
    if (expect + GCOMP_HEADER_BYTES > cap || !header_ok(payload, expect)) { /* read nothing more */
        if (tid == 0) set_error(st, GCOMP_ERR_CORRUPT);
        return;
    }
    const uint8_t *body = payload + GCOMP_HEADER_BYTES, *codes = body + 4 * G.nb;
    for (uint64_t j = tid; j < G.nb; j += stride)
        if (gcomp_bits_f32(gcomp_le_load_u32(body + 4 * j)) < 0.0f) set_error(st, GCOMP_ERR_CORRUPT);
    for (uint64_t c = tid; c < nbytes; c += stride) {
        uint64_t j = G.nb > 1 ? 4 * c / G.B : 0, b0 = j * G.B;
        uint64_t lc = c - b0 / 4, t0 = lc / (TILE / 4), jj = lc - t0 * (TILE / 4);
        uint64_t left = bucket_len(G, j) - t0 * TILE;
        uint32_t len = left < TILE ? (uint32_t)left : TILE, q = (len + 3) / 4;
        uint32_t v = codes[c], bad = v & (v >> 1) & 0x55u; /* a code 3 */
        for (uint32_t p = 0; p < 4; p++)
            if ((uint32_t)jj + p * q >= len) bad |= (v >> (2 * p)) & 3u; /* padding must be 0 */
        if (bad) set_error(st, GCOMP_ERR_CORRUPT);
    }
}

static __global__ void k_add(tg_geom G, const uint8_t *payload, float *acc, const gcomp_cuda_status *st)
{
    if (st->error) return; /* a corrupt payload leaves acc untouched */
    const uint64_t nbytes = (G.n + 3) / 4;
    const uint8_t *body = payload + GCOMP_HEADER_BYTES, *codes = body + 4 * G.nb;
    for (uint64_t c = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; c < nbytes;
         c += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t j = G.nb > 1 ? 4 * c / G.B : 0, b0 = j * G.B;
        uint64_t lc = c - b0 / 4, t0 = lc / (TILE / 4), jj = lc - t0 * (TILE / 4);
        uint64_t a = b0 + t0 * TILE, left = bucket_len(G, j) - t0 * TILE;
        uint32_t len = left < TILE ? (uint32_t)left : TILE, q = (len + 3) / 4;
        float s = gcomp_bits_f32(gcomp_le_load_u32(body + 4 * j));
        uint32_t v = codes[c];
#pragma unroll
        for (uint32_t p = 0; p < 4; p++) {
            uint32_t k = (uint32_t)jj + p * q;
            /* multiply, not select: a non-finite scale makes NaN of t = 0 too, as on the CPU */
            if (k < len) {
                /* NaN bits as the CPU's (a NaN or infinite scale: t * s, then acc + that) */
                float t = code_value((v >> (2 * p)) & 3u), a0 = acc[a + k];
                float ts = gcomp_x86_nan_f32(__fmul_rn(t, s), t, s);
                acc[a + k] = gcomp_x86_nan_f32(__fadd_rn(a0, ts), a0, ts);
            }
        }
    }
}

/* ---- integer ring: codes ----------------------------------------------------------------- */

/* status->nonfinite = some scale of buckets [j0, j1] is not finite (one block). */
static __global__ void k_check_scales(const float *scales, uint64_t j0, uint64_t j1, gcomp_cuda_status *st)
{
    __shared__ int any;
    if (threadIdx.x == 0) any = 0;
    __syncthreads();
    int bad = 0;
    for (uint64_t j = j0 + threadIdx.x; j <= j1; j += blockDim.x) bad |= !finite_f32(scales[j]);
    if (bad) any = 1;
    __syncthreads();
    if (threadIdx.x == 0) st->nonfinite = (uint32_t)any;
}

static __global__ void k_ternarise(uint64_t B, uint64_t lo, uint64_t n, const float *g, const gcomp_cuda_residual *res,
                                   uint64_t seed, uint64_t step, uint32_t rank, const float *scales, int8_t *t,
                                   const gcomp_cuda_status *st)
{
    const float *r = res_in(res);
    float *ro = st->nonfinite ? nullptr : res_out(res);
    const tg_rng q = rng_of(res_key(res, seed, step, rank), lo);
    for (uint64_t e = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t i = lo + e;
        float s = scales[B ? i / B : 0];
        float x = load_x(g, r, i);
        uint32_t cd = code_of(x, s, q, i);
        t[e] = (int8_t)((int32_t)(cd & 1u) - (int32_t)(cd >> 1));
        if (ro) ro[i] = __fsub_rn(x, __fmul_rn(code_value(cd), s));
    }
}

/* ---- integer ring: packed sums (format 2 of terngrad.h) ---------------------------------- */

typedef struct sum_fmt {
    uint32_t m, L;
    uint32_t g, w;        /* digits per code, bits per code */
    uint32_t lg;          /* L^g */
    uint32_t block_bytes; /* of a whole block of SUM_BLOCK elements */
} sum_fmt;

static sum_fmt make_fmt(uint32_t m)
{
    sum_fmt f;
    f.m = m;
    f.L = 2 * m + 1;
    f.g = gcomp_tg_sum_group(m);
    f.lg = (uint32_t)gcomp_tg_sum_pow(m, f.g);
    f.w = gcomp_tg_bits_below(f.lg);
    f.block_bytes = SUM_BLOCK / f.g * f.w / 8;
    return f;
}

/* The w-bit field at bit `bit` of a byte stream of `bytes` bytes, LSB first (w <= 24);
 * bytes past the end read as 0 (the sizes make that impossible for valid arguments). */
static __device__ __forceinline__ uint32_t get_bits(const uint8_t *in, uint64_t bytes, uint64_t bit, uint32_t w)
{
    uint64_t b = bit >> 3;
    uint32_t v = 0;
    for (uint32_t k = 0; k < 4 && k * 8 < (bit & 7) + w; k++)
        if (b + k < bytes) v |= (uint32_t)in[b + k] << (8 * k);
    return (v >> (bit & 7)) & ((1u << w) - 1u);
}

/* Where the 8-code unit u (a thread's work) of a stream of n sums in format f lies: its
 * block, and its elements [e0, e1) inside the block. */
typedef struct unit_pos {
    uint64_t block;
    uint32_t e0, e1, len; /* len: elements of the block */
} unit_pos;

static __device__ __forceinline__ unit_pos unit_at(const sum_fmt &f, uint64_t n, uint64_t u)
{
    const uint32_t upb = SUM_BLOCK / f.g / 8; /* units per whole block */
    unit_pos p;
    p.block = u / upb;
    uint64_t left = n - p.block * SUM_BLOCK;
    p.len = left < SUM_BLOCK ? (uint32_t)left : SUM_BLOCK;
    p.e0 = (uint32_t)(u - p.block * upb) * 8 * f.g;
    p.e1 = p.e0 + 8 * f.g < p.len ? p.e0 + 8 * f.g : p.len;
    return p;
}

static uint64_t units_of(const sum_fmt &f, uint64_t n)
{
    const uint64_t upb = SUM_BLOCK / f.g / 8, full = n / SUM_BLOCK, rest = n - full * SUM_BLOCK;
    return full * upb + ceil_div(ceil_div(rest, f.g), 8);
}

/* Reads the sums (digit - m) of elements [e0, e1) of one block of a stream in format f into
 * d[0 .. e1 - e0) (at most 40); returns nonzero if a code is out of range. */
static __device__ __forceinline__ uint32_t read_sums(const sum_fmt &f, const uint8_t *blk, uint32_t len, uint32_t e0,
                                                     uint32_t e1, int32_t *d)
{
    const uint64_t bytes = gcomp_tg_sum_bytes(len, f.m); /* the block's own bytes */
    const uint32_t full = len / f.g;                     /* whole codes in the block */
    uint32_t bad = 0, rem = 0;
    for (uint32_t e = e0; e < e1; e++) {
        uint32_t ci = e / f.g, dg = e - ci * f.g;
        if (e == e0 || dg == 0) {
            uint32_t k = ci < full ? f.g : len - full * f.g; /* digits of this code */
            uint32_t lim = k == f.g ? f.lg : (uint32_t)gcomp_tg_sum_pow(f.m, k);
            uint32_t w = k == f.g ? f.w : gcomp_tg_bits_below(lim);
            uint32_t c = get_bits(blk, bytes, (uint64_t)ci * f.w, w);
            bad |= c >= lim;
            rem = c;
            for (uint32_t z = 0; z < dg; z++) rem /= f.L;
        }
        d[e - e0] = (int32_t)(rem % f.L) - (int32_t)f.m;
        rem /= f.L;
    }
    return bad;
}

static __global__ void k_sums_add_pack(sum_fmt fi, sum_fmt fo, const uint8_t *in, const int8_t *t, uint64_t n,
                                       uint64_t units, uint8_t *out, gcomp_cuda_status *st)
{
    if (st->error) return;
    for (uint64_t u = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; u < units;
         u += (uint64_t)gridDim.x * blockDim.x) {
        unit_pos p = unit_at(fo, n, u);
        int32_t d[40];
        const int8_t *tb = t + p.block * SUM_BLOCK;
        uint32_t cnt = p.e1 - p.e0;
        if (fi.m) {
            if (read_sums(fi, in + p.block * fi.block_bytes, p.len, p.e0, p.e1, d)) set_error(st, GCOMP_ERR_CORRUPT);
        } else {
            for (uint32_t k = 0; k < cnt; k++) d[k] = 0;
        }
        /* pack: codes of fo.g digits (Horner from the top digit), LSB-first, zero padding */
        const uint32_t full = p.len / fo.g;
        uint8_t *o = out + p.block * fo.block_bytes + (uint64_t)(p.e0 / fo.g) * fo.w / 8;
        uint64_t acc = 0;
        uint32_t fill = 0;
        for (uint32_t e = 0; e < cnt;) {
            uint32_t ci = (p.e0 + e) / fo.g, k = ci < full ? fo.g : p.len - full * fo.g;
            uint32_t w = k == fo.g ? fo.w : gcomp_tg_bits_below(gcomp_tg_sum_pow(fo.m, k));
            uint32_t c = 0;
            for (uint32_t z = k; z-- > 0;)
                c = c * fo.L + (uint32_t)(d[e + z] + (int32_t)tb[p.e0 + e + z] + (int32_t)fo.m);
            acc |= (uint64_t)c << fill;
            fill += w;
            while (fill >= 8) {
                *o++ = (uint8_t)acc;
                acc >>= 8;
                fill -= 8;
            }
            e += k;
        }
        if (fill) *o = (uint8_t)acc;
    }
}

static __global__ void k_sums_values(sum_fmt f, const uint8_t *in, uint64_t lo, uint64_t n, uint64_t units, uint64_t B,
                                     const float *scales, float divisor, float *out, gcomp_cuda_status *st)
{
    if (st->error) return;
    for (uint64_t u = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; u < units;
         u += (uint64_t)gridDim.x * blockDim.x) {
        unit_pos p = unit_at(f, n, u);
        int32_t d[40];
        if (read_sums(f, in + p.block * f.block_bytes, p.len, p.e0, p.e1, d)) set_error(st, GCOMP_ERR_CORRUPT);
        for (uint32_t e = p.e0; e < p.e1; e++) {
            uint64_t i = p.block * SUM_BLOCK + e;
            float s = scales[B ? (lo + i) / B : 0];
            /* sched_integer.c's sum_values: (float)k * s / divisor */
            float k = (float)d[e - p.e0], ks = gcomp_x86_nan_f32(__fmul_rn(k, s), k, s);
            out[i] = gcomp_x86_nan_f32(__fdiv_rn(ks, divisor), ks, divisor); /* NaN bits as the CPU's */
        }
    }
}

/* ---- launchers --------------------------------------------------------------------------- */

static unsigned grid_for(uint64_t work, unsigned per_block)
{
    uint64_t b = ceil_div(work, per_block);
    return (unsigned)(b == 0 ? 1 : b < MAX_BLOCKS ? b : MAX_BLOCKS);
}

/* k_pack1's grid: one chunk per CTA, up to PACK1_PER_SM CTAs per SM (then they loop). */
static unsigned grid_pack1(uint64_t n)
{
    int dev = 0, sms = 132;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        sms = 132;
    (void)cudaGetLastError(); /* a failed query is not the launch's error */
    const uint64_t chunks = ceil_div(n, PACK1_CHUNK), most = (uint64_t)sms * PACK1_PER_SM;
    return (unsigned)(chunks == 0 ? 1 : chunks < most ? chunks : most);
}

static gcomp_result launched(const char *what)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return gcomp_codec_fail(GCOMP_ERR_TRANSPORT, "terngrad: launching %s failed: %s", what, cudaGetErrorString(e));
    return GCOMP_SUCCESS;
}

#define TG_CHECK(x)                           \
    do {                                      \
        gcomp_result rc_ = (x);               \
        if (rc_ != GCOMP_SUCCESS) return rc_; \
    } while (0)

#define LAUNCHED(what)                        \
    do {                                      \
        gcomp_result rc_ = launched(what);    \
        if (rc_ != GCOMP_SUCCESS) return rc_; \
    } while (0)

static size_t tg_cuda_scratch(const void *params, size_t count)
{
    tg_geom G = make_geom((const gcomp_terngrad_params *)params, count);
    return scratch_need(&G);
}

/* Passes 1-3: scales into the array and/or the body; st (encode) initialised on the way. */
static gcomp_result scale_passes(const tg_geom *G, const float *g, const gcomp_cuda_residual *res, tg_scratch S,
                                 float *scales, uint8_t *body, gcomp_cuda_status *st, uint64_t body_bytes,
                                 cudaStream_t s)
{
    const bool clip = G->clip > 0;
    const unsigned gb = grid_for(G->nblk, THREADS / 32), gg = grid_for(G->ngrp, GROUP_WARPS),
                   gs = grid_for(G->nb, THREADS);
    if (clip)
        k_block_sums<true><<<gb, THREADS, 0, s>>>(*G, g, res, S);
    else
        k_block_sums<false><<<gb, THREADS, 0, s>>>(*G, g, res, S);
    LAUNCHED("k_block_sums");
    if (clip)
        k_group_sums<true><<<gg, 32 * GROUP_WARPS, 0, s>>>(*G, S, st, body_bytes);
    else
        k_group_sums<false><<<gg, 32 * GROUP_WARPS, 0, s>>>(*G, S, st, body_bytes);
    LAUNCHED("k_group_sums");
    if (clip)
        k_scales<true><<<gs, THREADS, 0, s>>>(*G, S, scales, body, st);
    else
        k_scales<false><<<gs, THREADS, 0, s>>>(*G, S, scales, body, st);
    LAUNCHED("k_scales");
    return GCOMP_SUCCESS;
}

/* The encode of one scale for the tensor (G->nb == 1): k_block_sums4, k_group_scale1, k_pack1. */
static gcomp_result encode_one_scale(const tg_geom *G, const gcomp_encode_ctx *ctx, const float *g,
                                     const gcomp_cuda_residual *res, tg_scratch S, uint8_t *body, gcomp_cuda_status *st,
                                     uint64_t body_bytes, cudaStream_t s)
{
    const bool clip = G->clip > 0;
    const unsigned gb = grid_for(ceil_div(G->nblk, S4_BLOCKS), THREADS / 32), gg = grid_for(G->ngrp, GROUP_WARPS);
    if (clip)
        k_block_sums4<true><<<gb, THREADS, 0, s>>>(*G, g, res, S);
    else
        k_block_sums4<false><<<gb, THREADS, 0, s>>>(*G, g, res, S);
    LAUNCHED("k_block_sums4");
    if (clip)
        k_group_scale1<true><<<gg, 32 * GROUP_WARPS, 0, s>>>(*G, S, st, body_bytes, body);
    else
        k_group_scale1<false><<<gg, 32 * GROUP_WARPS, 0, s>>>(*G, S, st, body_bytes, body);
    LAUNCHED("k_group_scale1");
    k_pack1<<<grid_pack1(G->n), PACK1_THREADS, 0, s>>>(*G, g, res, ctx->seed, ctx->step, ctx->offset, ctx->rank, body,
                                                       st);
    LAUNCHED("k_pack1");
    return GCOMP_SUCCESS;
}

static gcomp_result tg_cuda_encode(const void *params, const gcomp_encode_ctx *ctx, const float *g,
                                   const gcomp_cuda_residual *res, size_t count, uint8_t *body, size_t cap,
                                   void *scratch, gcomp_cuda_status *status, struct CUstream_st *stream)
{
    const gcomp_terngrad_params *p = (const gcomp_terngrad_params *)params;
    cudaStream_t s = (cudaStream_t)stream;
    const tg_geom G = make_geom(p, count);
    const uint64_t need = 4 * G.nb + (count + 3) / 4;
    const tg_scratch S = carve(&G, scratch);
    bool fused = count > 0 && G.nb > 1 && G.B <= FUSE_MAX;
    if (cap < need)
        return gcomp_codec_fail(GCOMP_ERR_BUFFER_TOO_SMALL, "terngrad: need %llu body bytes, have %zu",
                                (unsigned long long)need, cap);
    if (p->bucket % 4 && G.nb > 1)
        return gcomp_codec_fail(GCOMP_ERR_INVALID_ARG, "terngrad: bucket must be a multiple of 4");
    if (fused) {
        size_t shm = (size_t)G.bpb * (RMS_BLOCK * 4 + 8); /* k_fused's x and block sums */
        if (cudaMemsetAsync(&status->nonfinite, 0, sizeof status->nonfinite, s) != cudaSuccess)
            return launched("cudaMemsetAsync");
        if (G.clip > 0)
            k_fused<true><<<grid_for(G.nb, 1), THREADS, shm, s>>>(G, g, res, ctx->seed, ctx->step, ctx->offset,
                                                                  ctx->rank, body, status);
        else
            k_fused<false><<<grid_for(G.nb, 1), THREADS, shm, s>>>(G, g, res, ctx->seed, ctx->step, ctx->offset,
                                                                   ctx->rank, body, status);
        LAUNCHED("k_fused");
        /* an in-place residual is written only now that every bucket's scale is known */
        k_resid<<<grid_for((count + 3) / 4, THREADS), THREADS, 0, s>>>(G, g, res, body, status);
        LAUNCHED("k_resid");
        return GCOMP_SUCCESS;
    }
    if (G.nb == 1) return encode_one_scale(&G, ctx, g, res, S, body, status, need, s);
    TG_CHECK(scale_passes(&G, g, res, S, nullptr, body, status, need, s));
    k_pack<<<grid_for((count + 3) / 4, THREADS), THREADS, 0, s>>>(G, g, res, ctx->seed, ctx->step, ctx->offset,
                                                                  ctx->rank, body, status);
    LAUNCHED("k_pack");
    return GCOMP_SUCCESS;
}

static gcomp_result tg_cuda_decode_add(const void *params, const uint8_t *payload, size_t cap, float *acc, size_t count,
                                       gcomp_cuda_status *status, struct CUstream_st *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    const tg_geom G = make_geom((const gcomp_terngrad_params *)params, count);
    const unsigned grid = grid_for((count + 3) / 4 > G.nb ? (count + 3) / 4 : G.nb, THREADS);
    k_validate<<<grid, THREADS, 0, s>>>(G, payload, cap, status);
    LAUNCHED("k_validate");
    k_add<<<grid_for((count + 3) / 4, THREADS), THREADS, 0, s>>>(G, payload, acc, status);
    LAUNCHED("k_add");
    return GCOMP_SUCCESS;
}

static gcomp_result tg_cuda_local_scales(const void *params, const float *g, const gcomp_cuda_residual *res,
                                         size_t count, float *scales, void *scratch, struct CUstream_st *stream)
{
    const tg_geom G = make_geom((const gcomp_terngrad_params *)params, count);
    if (count == 0) return GCOMP_SUCCESS;
    return scale_passes(&G, g, res, carve(&G, scratch), scales, nullptr, nullptr, 0, (cudaStream_t)stream);
}

/* The call sees only the scales of its own range (it does not know the tensor's count), so
 * with buckets a NaN scale elsewhere in the tensor does not stop this range's residual
 * update: a caller that ternarises a bucketed tensor in chunks must check all its scales
 * first (or double-buffer the residual, whose commit then discards the whole update). */
static gcomp_result tg_cuda_ternarise(const void *params, const gcomp_encode_ctx *ctx, const float *g,
                                      const gcomp_cuda_residual *res, size_t n, const float *scales, int8_t *t,
                                      gcomp_cuda_status *status, struct CUstream_st *stream)
{
    const gcomp_terngrad_params *p = (const gcomp_terngrad_params *)params;
    cudaStream_t s = (cudaStream_t)stream;
    const uint64_t B = p->bucket > 0 ? (uint64_t)p->bucket : 0, lo = ctx->offset;
    if (n == 0) return GCOMP_SUCCESS;
    if (B % 4) return gcomp_codec_fail(GCOMP_ERR_INVALID_ARG, "terngrad: bucket must be a multiple of 4");
    /* the residual is written only when every scale of the range is finite */
    k_check_scales<<<1, 1024, 0, s>>>(scales, B ? lo / B : 0, B ? (lo + n - 1) / B : 0, status);
    LAUNCHED("k_check_scales");
    k_ternarise<<<grid_for(n, THREADS), THREADS, 0, s>>>(B, lo, n, g, res, ctx->seed, ctx->step, ctx->rank, scales, t,
                                                         status);
    LAUNCHED("k_ternarise");
    return GCOMP_SUCCESS;
}

static gcomp_result tg_cuda_sums_add_pack(const uint8_t *in, uint32_t m_in, const int8_t *t, size_t n, uint8_t *out,
                                          gcomp_cuda_status *status, struct CUstream_st *stream)
{
    if (m_in >= 32767)
        return gcomp_codec_fail(GCOMP_ERR_UNSUPPORTED, "terngrad: sums of %u ranks do not fit int16", m_in + 1);
    if (n == 0) return GCOMP_SUCCESS;
    sum_fmt fi = m_in ? make_fmt(m_in) : sum_fmt{ 0, 1, 1, 0, 1, 0 }, fo = make_fmt(m_in + 1);
    uint64_t units = units_of(fo, n);
    k_sums_add_pack<<<grid_for(units, THREADS), THREADS, 0, (cudaStream_t)stream>>>(fi, fo, in, t, n, units, out,
                                                                                    status);
    LAUNCHED("k_sums_add_pack");
    return GCOMP_SUCCESS;
}

static gcomp_result tg_cuda_sums_values(const void *params, const uint8_t *in, size_t lo, size_t n, uint32_t m,
                                        const float *scales, float divisor, float *out, gcomp_cuda_status *status,
                                        struct CUstream_st *stream)
{
    const gcomp_terngrad_params *p = (const gcomp_terngrad_params *)params;
    if (m == 0) return gcomp_codec_fail(GCOMP_ERR_INVALID_ARG, "terngrad: sums of 0 ranks");
    if (m > 32767) return gcomp_codec_fail(GCOMP_ERR_UNSUPPORTED, "terngrad: sums of %u ranks do not fit int16", m);
    if (n == 0) return GCOMP_SUCCESS;
    sum_fmt f = make_fmt(m);
    uint64_t units = units_of(f, n);
    k_sums_values<<<grid_for(units, THREADS), THREADS, 0, (cudaStream_t)stream>>>(
        f, in, lo, n, units, p->bucket > 0 ? (uint64_t)p->bucket : 0, scales, divisor, out, status);
    LAUNCHED("k_sums_values");
    return GCOMP_SUCCESS;
}

extern "C" const gcomp_codec_cuda_ops gcomp__cuda_ops_terngrad = {
    tg_cuda_scratch,       /* scratch_bytes */
    tg_cuda_encode,        /* encode */
    tg_cuda_decode_add,    /* decode_add */
    tg_cuda_local_scales,  /* local_scales */
    tg_cuda_ternarise,     /* ternarise */
    tg_cuda_sums_add_pack, /* sums_add_pack */
    tg_cuda_sums_values,   /* sums_values */
    nullptr,               /* sum_payloads: not a sparse codec */
};
