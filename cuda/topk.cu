/*
 * cuda/topk.cu — the top-k codec on the GPU: the same selection, the same format-2 body and
 * the same residuals as the CPU reference (codecs/topk.c), bit for bit. Every field written
 * or checked goes through the GCOMP_HD helpers of codecs/topk.h and codecs/common.h, which
 * topk.c calls too.
 *
 * Encode (all on the caller's stream; the host learns the body size from status->body_bytes):
 *   pass 1     x = g + r, stored into the residual's output buffer (the unkept part of the
 *              residual is then done, and later passes read 4 bytes an element), and the
 *              histogram of the top 11 key bits (key = bits & 0x7fffffff, as on the CPU);
 *   select     a radix select on the keys, 11 + 11 + 9 bits, each digit's bin found by a
 *              one-block kernel (the bin b with (count above b) < need <= (that + hist[b]), as
 *              topk.c's find_bin takes it). After digit 0 one pass per tile counts the keys
 *              above the threshold's bin and lists the keys in it (with their tile): digits
 *              1 and 2 are histogrammed from that list, not from x, unless it overflowed
 *              (n/16 + 1024 entries: heavy ties), when they read x. The result is a rule:
 *              keep key > T, and of the keys == T the `tie_need` with the lowest indices;
 *   compact    per-tile counts of keys > T and == T (those above the threshold's top bin
 *              counted by the collect pass, those in it from the list's tiles, or from x),
 *              an exclusive scan over the tiles in two levels in one launch (a block per
 *              1024 tiles, then the block that finishes last scans the groups' totals), and
 *              a scatter of the kept indices in index order, one block per tile (ballots
 *              within a warp, a scan across the warps of a tile): stable, no atomics that
 *              could reorder;
 *   body       one warp per block of 128 pairs: gaps, the value fields, the Rice parameter
 *              (one candidate b per lane, the minimum of (bits, b) as topk.h's
 *              gcomp_topk_rice_param takes it), then a scan of the block sizes gives every
 *              block its offset, and a warp writes each block into shared memory (the fields
 *              of gcomp_topk_block_write, lanes at offsets from a scan of the pair lengths)
 *              and copies it out. The kept elements' residuals (x - decoded value) are
 *              written there too. The scan knows the body's size before a byte is written:
 *              a body past the caller's cap is refused there (status->error =
 *              GCOMP_ERR_BUFFER_TOO_SMALL, the body untouched), which is the CPU's rule: any
 *              cap the body fits in, not only max_body_bytes. Once status->error is set
 *              (that, or a select or scan that cannot happen) the body kernels read no index
 *              and write nothing.
 *   The selection state lives in scratch, so the host enqueues the same launches whatever the
 *   data; a kernel whose digit is not needed returns at once. Scratch holds anything on entry:
 *   one memset clears the digit-0 histogram, and every other counter is cleared by a kernel
 *   that runs before its first use (tk_select_digit for digit 0, tk_collect per tile).
 *
 * Cost (H100, 64 Mi floats, ratio 0.01, test_cuda_topk's test_timing, commit cf7baf3): encode
 * 0.91 ms against 0.18 ms for a device-to-device copy of the floats, i.e. 0.30 of the copy's
 * rate with effective bytes counted as codec_perf does (g, r read, r written, body). Under
 * ncu, pass 1 ran at the copy's bandwidth (0.28 ms) and the per-tile collect and scatter
 * (0.20 and 0.23 ms) and the one-block tile scan (0.07 ms) took most of the rest. On an H100
 * (h6-explore2 a4dd388, 256 MiB, a CUDA event after every launch) collect and scatter kernels
 * that loop over the tiles with the next tile's loads in flight were slower (0.21 and 0.29
 * ms), a two-level scan took 0.010 ms against 0.067 ms: so the scan has two levels, the
 * collect and scatter take one block per tile, the per-tile count pass is folded into the
 * count of the undecided list, and one memset of two is left.
 *
 * Decode: a body's block starts are only known after parsing the blocks before it (the Rice
 * codes have no fixed width), so one payload's chain is parsed by one thread, at about 0.3 us
 * a pair: decode_add of the 671,089 pairs above takes 0.39 s (two parses). That is the price of
 * format 2 on a GPU; a later format that stored each block's byte offset and first index after
 * k (12 bytes a block of 128 pairs, about 2 % of the body) would let a warp parse and check
 * every block independently. decode_add parses twice, as the CPU does: a first kernel checks
 * everything (status->error on a fault), a second adds only when status->error == 0, so a
 * corrupt body never touches acc. sum_payloads parses every rank's body in parallel (one
 * thread each) into lists (scratch), then sums a tile of the result per block, ranks in order
 * from 0.0f, and divides as codecs/common.h says: what gcomp__topk_sum_pairs computes, bit
 * for bit. A rank whose k is not the expected one is refused, as the CPU's sparse gather does.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

extern "C" {
#include "codecs/common.h"
#include "codecs/topk.h"
}

#define TK_KEY_BITS 31u
#define TK_D0 11u /* digit widths, top first: 11 + 11 + 9 = 31 key bits */
#define TK_D1 11u
#define TK_D2 9u
#define TK_NBINS 2048u
#define TK_TILE 4096u /* elements per tile of the compaction (one block each) */
#define TK_TILE_THREADS 256u
#define TK_WARP_ITEMS (TK_TILE / (TK_TILE_THREADS / 32u)) /* 512: a warp's slice of a tile */
#define TK_HIST_THREADS 512u
#define TK_SCAN_THREADS 1024u
#define TK_WARPS_PER_BLOCK 4u /* body kernels: one warp per block of 128 pairs */
#define TK_SUM_TILE 4096u     /* result elements per block of the pair sum */
#define TK_ALL_TIES (~0ull)
#define TK_FULL 0xffffffffu

/* The radix select's state, in scratch. */
struct tk_select {
    unsigned long long need;      /* undecided keys still to keep */
    unsigned long long undecided; /* keys whose bits above shift equal prefix */
    unsigned long long tie_need;  /* final rule: keys == thr kept while their rank < tie_need */
    uint32_t prefix, shift;
    uint32_t done; /* the rule (thr, tie_need) is final */
    uint32_t thr;
    unsigned long long list_n; /* entries the undecided list was offered */
    uint32_t overflow;         /* it could not hold them: the later digits read x again */
    uint32_t scan_done;        /* tk_scan_tiles: its blocks that have finished */
};

/* The undecided list: keys whose top digit is the threshold's bin, with their tile (for the
 * per-tile counts; the order within the list does not matter). */
struct tk_und {
    uint32_t key, tile;
};

/* Where everything of an encode lives in scratch (offsets in bytes, 256-aligned). */
struct tk_layout {
    size_t state, hist, off_gt, off_eq, groups, gt1, und_gt, und_eq, list, idx, blk_info, blk_bytes, blk_off, total;
    size_t list_cap;
};

static size_t tk_align(size_t v) { return (v + 255) & ~(size_t)255; }

static size_t tk_tiles(size_t n) { return (n + TK_TILE - 1) / TK_TILE; }

/* Groups of TK_SCAN_THREADS tiles: the first level of the tile scan. */
static size_t tk_groups(size_t tiles) { return (tiles + TK_SCAN_THREADS - 1) / TK_SCAN_THREADS; }

static tk_layout tk_encode_layout(size_t n, uint64_t k)
{
    const size_t tiles = tk_tiles(n) ? tk_tiles(n) : 1,
                 nb = (size_t)((k + GCOMP_TOPK_BLOCK - 1) / GCOMP_TOPK_BLOCK) + 1;
    tk_layout l;
    size_t at = 0;
    l.state = at, at += tk_align(sizeof(tk_select));
    l.hist = at, at += tk_align(3 * TK_NBINS * sizeof(unsigned long long));
    l.off_gt = at, at += tk_align(tiles * 8);
    l.off_eq = at, at += tk_align(tiles * 8);
    l.groups = at, at += tk_align(2 * tk_groups(tiles) * 8); /* gt, then eq */
    l.gt1 = at, at += tk_align(tiles * 8);
    l.und_gt = at, at += tk_align(tiles * 8);
    l.und_eq = at, at += tk_align(tiles * 8);
    l.list_cap = n / 16 + 1024;
    l.list = at, at += tk_align(l.list_cap * sizeof(tk_und));
    l.idx = at, at += tk_align((size_t)k * 8 + 8);
    l.blk_info = at, at += tk_align(nb * 4);
    l.blk_bytes = at, at += tk_align(nb * 8);
    l.blk_off = at, at += tk_align(nb * 8);
    l.total = at;
    return l;
}

/* sum_payloads: per rank, its k pairs (u64 index, f32 value) and the first pair of each tile
 * of the result (tiles + 1 entries). */
struct tk_list_layout {
    size_t idx, val, starts, per_rank;
};

static tk_list_layout tk_list_layout_for(size_t count, uint64_t k)
{
    tk_list_layout l;
    const size_t tiles = (count + TK_SUM_TILE - 1) / TK_SUM_TILE;
    l.idx = 0;
    l.val = tk_align((size_t)k * 8 + 8);
    l.starts = l.val + tk_align((size_t)k * 4 + 4);
    l.per_rank = l.starts + tk_align((tiles + 1) * 8);
    return l;
}

/* ---- small device helpers ---------------------------------------------------------------- */

static __device__ __forceinline__ uint32_t tk_key(uint32_t bits) { return gcomp_topk_key(bits); }

/* x as pass 1 left it: in the residual's output buffer, or g itself without a residual. */
static __device__ __forceinline__ const float *tk_x(const float *g, const gcomp_cuda_residual *res)
{
    return res ? res->buf[res->cur ^ 1u] : g;
}

/* The keys of a warp's slice of a tile: item j of lane l is element base + j * 32 + l. */
static __device__ __forceinline__ uint32_t tk_item(const uint32_t *x, size_t n, size_t base, unsigned j, int *valid)
{
    const size_t i = base + (size_t)j * 32 + (threadIdx.x & 31u);
    *valid = i < n;
    return i < n ? tk_key(x[i]) : 0;
}

static __device__ void tk_set_error(gcomp_cuda_status *status, uint32_t rc) { atomicCAS(&status->error, 0u, rc); }

/* Exclusive scan over the block of one value per thread (blockDim.x a multiple of 32, at most
 * 1024); *total gets the sum. Uses the 32-entry shared array sh. */
static __device__ unsigned long long tk_block_scan(unsigned long long v, unsigned long long *sh,
                                                   unsigned long long *total)
{
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    unsigned long long incl = v, wsum;
    for (unsigned o = 1; o < 32; o <<= 1) {
        unsigned long long t = __shfl_up_sync(TK_FULL, incl, o);
        if (lane >= o) incl += t;
    }
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 31) sh[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        unsigned long long s = lane < nwarps ? sh[lane] : 0, si = s;
        for (unsigned o = 1; o < 32; o <<= 1) {
            unsigned long long t = __shfl_up_sync(TK_FULL, si, o);
            if (lane >= o) si += t;
        }
        if (lane < nwarps) sh[lane] = si - s; /* exclusive prefix of the warp sums */
        if (lane == 31) sh[32] = si;
    }
    __syncthreads();
    wsum = sh[warp];
    *total = sh[32];
    return wsum + incl - v;
}

/* out[i] = sum of in[0..i) in one block (len up to a few million: each thread scans a slice);
 * out may be in. The slice's loads are unrolled so that several are in flight at once, and go
 * through L2 (__ldcg): in may have been written by other blocks of the same launch. */
static __device__ unsigned long long tk_scan_array(const unsigned long long *in, unsigned long long *out, size_t len,
                                                   unsigned long long *sh)
{
    const size_t per = (len + blockDim.x - 1) / blockDim.x, lo = per * threadIdx.x;
    const size_t hi = lo + per < len ? lo + per : len;
    unsigned long long sum = 0, base, total;
#pragma unroll 8
    for (size_t i = lo; i < hi; i++) sum += __ldcg(in + i);
    base = tk_block_scan(sum, sh, &total);
#pragma unroll 8
    for (size_t i = lo; i < hi; i++) {
        const unsigned long long v = __ldcg(in + i);
        out[i] = base;
        base += v;
    }
    return total;
}

/* ---- pass 1 and the digit histograms ------------------------------------------------------ */

/* Adds the block's nonzero shared counts into the global histogram. */
static __device__ void tk_flush_hist(const unsigned *sh, unsigned nbins, unsigned long long *hist)
{
    __syncthreads();
    for (unsigned b = threadIdx.x; b < nbins; b += blockDim.x)
        if (sh[b]) atomicAdd(&hist[b], (unsigned long long)sh[b]);
}

/* x = g + r into r_out (with a residual), and the histogram of the top digit of every key. */
static __global__ void tk_pass1(const float *g, const gcomp_cuda_residual *res, size_t n, unsigned long long *hist)
{
    __shared__ unsigned sh[TK_NBINS];
    const float *r = res ? res->buf[res->cur] : nullptr;
    float *xo = res ? res->buf[res->cur ^ 1u] : nullptr;
    const unsigned shift = TK_KEY_BITS - TK_D0;
    const size_t stride = (size_t)gridDim.x * blockDim.x, tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t head = 0;
    for (unsigned b = threadIdx.x; b < TK_NBINS; b += blockDim.x) sh[b] = 0;
    __syncthreads();
    /* 16-byte loads and stores where all three buffers allow them; the scalar loop does the rest */
    if ((((uintptr_t)g | (uintptr_t)r | (uintptr_t)xo) & 15u) == 0) {
        const size_t nv = n / 4;
        const float4 *g4 = (const float4 *)g, *r4 = (const float4 *)r;
        float4 *x4 = (float4 *)xo;
        for (size_t v = tid; v < nv; v += stride) {
            float4 a = g4[v];
            if (r) {
                const float4 c = r4[v];
                /* a NaN g or r keeps its bits, as on the CPU (CUDA's sum would be 0x7fffffff) */
                a.x = gcomp_x86_nan_f32(__fadd_rn(a.x, c.x), a.x, c.x);
                a.y = gcomp_x86_nan_f32(__fadd_rn(a.y, c.y), a.y, c.y);
                a.z = gcomp_x86_nan_f32(__fadd_rn(a.z, c.z), a.z, c.z);
                a.w = gcomp_x86_nan_f32(__fadd_rn(a.w, c.w), a.w, c.w);
                x4[v] = a;
            }
            atomicAdd(&sh[tk_key(gcomp_f32_bits(a.x)) >> shift], 1u);
            atomicAdd(&sh[tk_key(gcomp_f32_bits(a.y)) >> shift], 1u);
            atomicAdd(&sh[tk_key(gcomp_f32_bits(a.z)) >> shift], 1u);
            atomicAdd(&sh[tk_key(gcomp_f32_bits(a.w)) >> shift], 1u);
        }
        head = nv * 4;
    }
    for (size_t i = head + tid; i < n; i += stride) {
        /* without r, x is g bit for bit (-0 included); with r, a NaN keeps the CPU's bits */
        float a = r ? gcomp_x86_nan_f32(__fadd_rn(g[i], r[i]), g[i], r[i]) : g[i];
        if (xo) xo[i] = a;
        atomicAdd(&sh[tk_key(gcomp_f32_bits(a)) >> shift], 1u);
    }
    tk_flush_hist(sh, TK_NBINS, hist);
}

/* Histogram of the next d bits of the undecided keys (those whose bits above shift equal
 * prefix): from the undecided list when it holds them all, else from x. */
static __global__ void tk_digit_hist(const float *g, const gcomp_cuda_residual *res, size_t n, const tk_select *st,
                                     unsigned d, const tk_und *list, unsigned long long *hist)
{
    __shared__ unsigned sh[TK_NBINS];
    if (st->done) return;
    const uint32_t *x = (const uint32_t *)tk_x(g, res);
    const unsigned shift = st->shift, lo = shift - d;
    const uint32_t prefix = st->prefix, mask = (1u << d) - 1;
    const size_t stride = (size_t)gridDim.x * blockDim.x, tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t head = 0;
    for (unsigned b = threadIdx.x; b < (1u << d); b += blockDim.x) sh[b] = 0;
    __syncthreads();
    if (list && !st->overflow) {
        const size_t len = (size_t)st->list_n;
        for (size_t i = tid; i < len; i += stride) {
            const uint32_t k0 = list[i].key;
            if (k0 >> shift == prefix) atomicAdd(&sh[(k0 >> lo) & mask], 1u);
        }
    } else {
        if (((uintptr_t)x & 15u) == 0) {
            const size_t nv = n / 4;
            const uint4 *x4 = (const uint4 *)x;
            for (size_t v = tid; v < nv; v += stride) {
                const uint4 a = x4[v];
                const uint32_t k0 = tk_key(a.x), k1 = tk_key(a.y), k2 = tk_key(a.z), k3 = tk_key(a.w);
                if (k0 >> shift == prefix) atomicAdd(&sh[(k0 >> lo) & mask], 1u);
                if (k1 >> shift == prefix) atomicAdd(&sh[(k1 >> lo) & mask], 1u);
                if (k2 >> shift == prefix) atomicAdd(&sh[(k2 >> lo) & mask], 1u);
                if (k3 >> shift == prefix) atomicAdd(&sh[(k3 >> lo) & mask], 1u);
            }
            head = nv * 4;
        }
        for (size_t i = head + tid; i < n; i += stride) {
            const uint32_t k0 = tk_key(x[i]);
            if (k0 >> shift == prefix) atomicAdd(&sh[(k0 >> lo) & mask], 1u);
        }
    }
    tk_flush_hist(sh, 1u << d, hist);
}

/* After digit 0, one block per tile: per tile, the keys whose top digit is above the
 * threshold's bin B (all kept: gt1); the keys in bin B go into the undecided list when it has
 * room for all of them (then the later digits and counts read the list, not x). The tile's
 * counters of undecided keys (tk_und_count adds to them) start at 0 here. */
static __global__ void tk_collect(const float *g, const gcomp_cuda_residual *res, size_t n, tk_select *st,
                                  size_t list_cap, tk_und *list, unsigned long long *gt1, unsigned long long *und_gt,
                                  unsigned long long *und_eq)
{
    __shared__ unsigned long long scan_sh[33];
    __shared__ unsigned long long base_sh;
    __shared__ unsigned wg[TK_TILE_THREADS / 32];
    const uint32_t *x = (const uint32_t *)tk_x(g, res);
    const unsigned top_shift = TK_KEY_BITS - TK_D0;
    const uint32_t bin = st->prefix;
    const unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
    const size_t base = (size_t)blockIdx.x * TK_TILE + (size_t)warp * TK_WARP_ITEMS;
    uint32_t keys[TK_WARP_ITEMS / 32];
    unsigned gt = 0, und = 0;
    unsigned long long slot, total;
#pragma unroll
    for (unsigned j = 0; j < TK_WARP_ITEMS / 32; j++) {
        int valid;
        keys[j] = tk_item(x, n, base, j, &valid);
        (void)valid;
    }
#pragma unroll
    for (unsigned j = 0; j < TK_WARP_ITEMS / 32; j++) {
        const int valid = base + (size_t)j * 32 + lane < n;
        const uint32_t top = keys[j] >> top_shift;
        gt += valid && top > bin;
        und += valid && top == bin;
    }
    /* list slots: a block-wide scan of the per-thread counts, one global atomic per block */
    slot = tk_block_scan(und, scan_sh, &total);
    if (threadIdx.x == 0) base_sh = total ? atomicAdd(&st->list_n, total) : 0;
    for (unsigned o = 16; o; o >>= 1) gt += __shfl_down_sync(TK_FULL, gt, o);
    if (lane == 0) wg[warp] = gt;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long sg = 0;
        for (unsigned w = 0; w < TK_TILE_THREADS / 32; w++) sg += wg[w];
        gt1[blockIdx.x] = sg;
        und_gt[blockIdx.x] = 0;
        und_eq[blockIdx.x] = 0;
        if (base_sh + total > list_cap) st->overflow = 1;
    }
    slot += base_sh;
#pragma unroll
    for (unsigned j = 0; j < TK_WARP_ITEMS / 32; j++) {
        const int valid = base + (size_t)j * 32 + lane < n;
        if (valid && keys[j] >> top_shift == bin) {
            if (slot < list_cap) list[slot] = tk_und{ keys[j], (uint32_t)blockIdx.x };
            slot++;
        }
    }
}

/* With the final rule known: per tile, the undecided keys (top digit = the threshold's)
 * above it and equal to it, from the list (added to tk_collect's zeros), or from x when the
 * list overflowed (a block per tile at a time). With gt1, the tile's counts of every key
 * > thr and == thr: the keys above the top bin are all > thr, those below it all < thr. */
static __global__ void tk_und_count(const float *g, const gcomp_cuda_residual *res, size_t n, size_t tiles,
                                    const tk_select *st, const tk_und *list, unsigned long long *und_gt,
                                    unsigned long long *und_eq)
{
    __shared__ unsigned wg[TK_HIST_THREADS / 32], we[TK_HIST_THREADS / 32];
    const uint32_t thr = st->thr;
    if (!st->overflow) {
        const size_t len = (size_t)st->list_n, stride = (size_t)gridDim.x * blockDim.x;
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < len; i += stride) {
            const tk_und e = list[i];
            if (e.key > thr)
                atomicAdd(&und_gt[e.tile], 1ull);
            else if (e.key == thr)
                atomicAdd(&und_eq[e.tile], 1ull);
        }
        return;
    }
    const uint32_t *x = (const uint32_t *)tk_x(g, res);
    const unsigned top_shift = TK_KEY_BITS - TK_D0, warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
    const uint32_t bin = thr >> top_shift;
    for (size_t t = blockIdx.x; t < tiles; t += gridDim.x) {
        uint32_t keys[TK_TILE / TK_HIST_THREADS];
        unsigned gt = 0, eq = 0;
#pragma unroll
        for (unsigned j = 0; j < TK_TILE / TK_HIST_THREADS; j++) { /* every load first */
            const size_t i = t * TK_TILE + (size_t)j * TK_HIST_THREADS + threadIdx.x;
            keys[j] = i < n ? tk_key(x[i]) : 0;
        }
#pragma unroll
        for (unsigned j = 0; j < TK_TILE / TK_HIST_THREADS; j++) {
            const int valid = t * TK_TILE + (size_t)j * TK_HIST_THREADS + threadIdx.x < n;
            const int und = valid && keys[j] >> top_shift == bin;
            gt += und && keys[j] > thr;
            eq += und && keys[j] == thr;
        }
        for (unsigned o = 16; o; o >>= 1) {
            gt += __shfl_down_sync(TK_FULL, gt, o);
            eq += __shfl_down_sync(TK_FULL, eq, o);
        }
        if (lane == 0) wg[warp] = gt, we[warp] = eq;
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned long long sg = 0, se = 0;
            for (unsigned w = 0; w < TK_HIST_THREADS / 32; w++) sg += wg[w], se += we[w];
            und_gt[t] = sg;
            und_eq[t] = se;
        }
        __syncthreads(); /* wg and we are rewritten for the next tile */
    }
}

/* One digit of the select (one block of 1024 threads): the bin b holding the need-th largest
 * undecided key in the digit's histogram (hists + digit * TK_NBINS), i.e. the one with (count
 * of higher bins) < need <= (that + hist[b]), as topk.c's find_bin takes it; then narrows the
 * state. Digit 0 also starts the state and the status (non-finite: a key in the Inf/NaN
 * bins) and clears the histograms of digits 1 and 2. */
static __global__ void tk_select_digit(unsigned long long *hists, unsigned digit, unsigned d, uint64_t k,
                                       uint32_t flags, tk_select *st, gcomp_cuda_status *status)
{
    __shared__ unsigned long long sh[33];
    __shared__ unsigned long long above_sh, count_sh;
    __shared__ int bin_sh;
    const unsigned long long *hist = hists + (size_t)digit * TK_NBINS;
    const unsigned nbins = 1u << d, per = (nbins + blockDim.x - 1) / blockDim.x;
    unsigned long long need, mine = 0, excl, total;
    if (digit == 0) {
        for (unsigned b = threadIdx.x; b < 2 * TK_NBINS; b += blockDim.x) hists[TK_NBINS + b] = 0;
        if (threadIdx.x == 0) {
            st->need = k, st->undecided = 0, st->tie_need = 0;
            st->prefix = 0, st->shift = TK_KEY_BITS, st->done = 0, st->thr = 0;
            st->list_n = 0, st->overflow = 0, st->scan_done = 0;
            status->flags = flags;
            status->overflow = 0;
            status->body_bytes = 0;
            status->nonfinite = 0;
            bin_sh = -1;
        }
        __syncthreads();
        for (unsigned b = (GCOMP_TOPK_INF_KEY >> (TK_KEY_BITS - TK_D0)) + threadIdx.x; b < TK_NBINS; b += blockDim.x)
            if (hist[b]) status->nonfinite = 1;
    } else {
        if (threadIdx.x == 0) bin_sh = -1;
        __syncthreads();
        if (st->done) return;
    }
    need = st->need;
    /* thread t takes bins from the top: t * per .. t * per + per counted downwards */
    for (unsigned j = 0; j < per; j++) {
        const unsigned q = threadIdx.x * per + j;
        if (q < nbins) mine += hist[nbins - 1 - q];
    }
    excl = tk_block_scan(mine, sh, &total); /* keys in the bins above this thread's first */
    for (unsigned j = 0; j < per; j++) {
        const unsigned q = threadIdx.x * per + j;
        if (q < nbins) {
            const unsigned long long c = hist[nbins - 1 - q];
            if (excl < need && need <= excl + c) {
                bin_sh = (int)(nbins - 1 - q);
                above_sh = excl;
                count_sh = c;
            }
            excl += c;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        if (bin_sh < 0) { /* the histogram holds fewer than need keys: cannot happen */
            tk_set_error(status, GCOMP_ERR_INTERNAL);
            st->done = 1, st->thr = 0x80000000u, st->tie_need = 0; /* keeps nothing */
            return;
        }
        st->need = need - above_sh;
        st->undecided = count_sh;
        st->prefix = st->prefix << d | (uint32_t)bin_sh;
        st->shift -= d;
        if (st->undecided == st->need) { /* every undecided key is kept */
            st->done = 1, st->thr = st->prefix << st->shift, st->tie_need = TK_ALL_TIES;
        } else if (st->shift == 0) { /* the undecided keys all equal the threshold */
            st->done = 1, st->thr = st->prefix, st->tie_need = st->need;
        }
    }
}

/* ---- compaction -------------------------------------------------------------------------- */

/* Exclusive scans of the tile counts (gt = gt1 + und_gt, eq = und_eq) in two levels, one
 * launch: each block scans a group of TK_SCAN_THREADS tiles, writes the offsets inside the
 * group and the group's totals; the block that finishes last (st->scan_done counts them,
 * tk_select_digit zeroed it) turns the totals into the groups' offsets, in place, and checks
 * that the rule keeps exactly k. tk_scatter adds the two levels. */
static __global__ void tk_scan_tiles(const unsigned long long *gt1, const unsigned long long *und_gt,
                                     const unsigned long long *und_eq, size_t tiles, unsigned long long *off_gt,
                                     unsigned long long *off_eq, unsigned long long *group_gt,
                                     unsigned long long *group_eq, tk_select *st, uint64_t k, gcomp_cuda_status *status)
{
    __shared__ unsigned long long sh[33];
    __shared__ int last;
    const size_t i = (size_t)blockIdx.x * TK_SCAN_THREADS + threadIdx.x;
    const unsigned long long vg = i < tiles ? gt1[i] + und_gt[i] : 0, ve = i < tiles ? und_eq[i] : 0;
    unsigned long long tg, te;
    const unsigned long long eg = tk_block_scan(vg, sh, &tg);
    const unsigned long long ee = tk_block_scan(ve, sh, &te);
    if (i < tiles) off_gt[i] = eg, off_eq[i] = ee;
    if (threadIdx.x == 0) {
        group_gt[blockIdx.x] = tg, group_eq[blockIdx.x] = te;
        __threadfence(); /* the totals before the count */
        last = atomicAdd(&st->scan_done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return; /* block-uniform */
    __threadfence();
    const unsigned long long gt = tk_scan_array(group_gt, group_gt, gridDim.x, sh);
    const unsigned long long eq = tk_scan_array(group_eq, group_eq, gridDim.x, sh);
    if (threadIdx.x == 0) {
        const unsigned long long ties = eq < st->tie_need ? eq : st->tie_need;
        if (gt + ties != k) tk_set_error(status, GCOMP_ERR_INTERNAL);
    }
}

/* The kept indices of a tile, in index order, at their place in idx[0..k) (the tile's offset
 * is its group's plus its own inside the group). */
static __global__ void __launch_bounds__(TK_TILE_THREADS, 4)
    tk_scatter(const float *g, const gcomp_cuda_residual *res, size_t n, const tk_select *st,
               const unsigned long long *off_gt, const unsigned long long *off_eq, const unsigned long long *group_gt,
               const unsigned long long *group_eq, unsigned long long *idx, uint64_t k)
{
    __shared__ unsigned wg[TK_TILE_THREADS / 32], we[TK_TILE_THREADS / 32];
    const uint32_t *x = (const uint32_t *)tk_x(g, res);
    const uint32_t thr = st->thr;
    const unsigned long long tie_need = st->tie_need;
    const unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
    const unsigned lt_mask = (1u << lane) - 1u;
    const size_t base = (size_t)blockIdx.x * TK_TILE + (size_t)warp * TK_WARP_ITEMS;
    uint32_t keys[TK_WARP_ITEMS / 32];
    unsigned gt = 0, eq = 0;
    unsigned long long gt_before, eq_before;
    /* every load first, then the ballots: a ballot waits for its load, and interleaved they
     * would put one memory latency per round on the warp's path */
#pragma unroll
    for (unsigned j = 0; j < TK_WARP_ITEMS / 32; j++) {
        int valid;
        keys[j] = tk_item(x, n, base, j, &valid); /* validity is tested again below */
        (void)valid;
    }
#pragma unroll
    for (unsigned j = 0; j < TK_WARP_ITEMS / 32; j++) {
        const int valid = base + (size_t)j * 32 + lane < n;
        gt += __popc(__ballot_sync(TK_FULL, valid && keys[j] > thr));
        eq += __popc(__ballot_sync(TK_FULL, valid && keys[j] == thr));
    }
    if (lane == 0) wg[warp] = gt, we[warp] = eq;
    __syncthreads();
    gt_before = off_gt[blockIdx.x] + group_gt[blockIdx.x / TK_SCAN_THREADS];
    eq_before = off_eq[blockIdx.x] + group_eq[blockIdx.x / TK_SCAN_THREADS];
    for (unsigned w = 0; w < warp; w++) gt_before += wg[w], eq_before += we[w];
#pragma unroll
    for (unsigned j = 0; j < TK_WARP_ITEMS / 32; j++) {
        const size_t i = base + (size_t)j * 32 + lane;
        const int valid = i < n, is_gt = valid && keys[j] > thr, is_eq = valid && keys[j] == thr;
        const unsigned mgt = __ballot_sync(TK_FULL, is_gt), meq = __ballot_sync(TK_FULL, is_eq);
        const unsigned long long g_lt = gt_before + __popc(mgt & lt_mask), e_lt = eq_before + __popc(meq & lt_mask);
        unsigned long long pos = ~0ull;
        if (is_gt)
            pos = g_lt + (e_lt < tie_need ? e_lt : tie_need);
        else if (is_eq && e_lt < tie_need)
            pos = g_lt + e_lt;
        if (pos < k) idx[pos] = i;
        gt_before += __popc(mgt);
        eq_before += __popc(meq);
    }
}

/* ---- the body ------------------------------------------------------------------------------ */

/* Gap and wire value bits of pair p of the kept list (x read at its index). */
static __device__ __forceinline__ void tk_pair(const unsigned long long *idx, uint64_t p, const float *x, int fp16,
                                               uint64_t *gap, uint32_t *v, float *xv, float *dec, unsigned *ovf)
{
    const unsigned long long i = idx[p], prev = p ? idx[p - 1] + 1 : 0; /* gap = idx - (previous idx + 1) */
    *gap = i - prev;
    *xv = x[i];
    *v = gcomp_topk_value_bits(*xv, fp16, dec, ovf);
}

/* Per block of 128 pairs (one warp): the encoder's choices b, e0, ew and the block's bytes. */
static __global__ void tk_block_prep(const float *g, const gcomp_cuda_residual *res, const unsigned long long *idx,
                                     uint64_t k, int fp16, uint32_t *blk_info, unsigned long long *blk_bytes,
                                     gcomp_cuda_status *status)
{
    __shared__ uint64_t gaps_sh[TK_WARPS_PER_BLOCK][GCOMP_TOPK_BLOCK];
    const unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
    const uint64_t blk = (uint64_t)blockIdx.x * TK_WARPS_PER_BLOCK + warp, first = blk * GCOMP_TOPK_BLOCK;
    const float *x = tk_x(g, res);
    uint64_t *gaps = gaps_sh[warp], any = 0, best_bits = ~0ull;
    uint32_t emin = 0xffffffffu, emax = 0;
    unsigned ovf_sum = 0, m, w, best_b = 0;
    /* the whole warp leaves together; after an error of the select or the scan idx may hold
     * anything, and x[idx] must not be read */
    if (first >= k || status->error) return;
    m = gcomp_topk_block_len(k, first);
    for (unsigned j = lane; j < m; j += 32) {
        uint64_t gap;
        uint32_t v, e;
        float xv, dec;
        unsigned ovf;
        tk_pair(idx, first + j, x, fp16, &gap, &v, &xv, &dec, &ovf);
        gaps[j] = gap;
        any |= gap;
        e = gcomp_topk_value_exp(v, fp16);
        emin = e < emin ? e : emin;
        emax = e > emax ? e : emax;
        ovf_sum += ovf;
    }
    for (unsigned o = 16; o; o >>= 1) {
        any |= __shfl_xor_sync(TK_FULL, any, o);
        emin = min(emin, __shfl_xor_sync(TK_FULL, emin, o));
        emax = max(emax, __shfl_xor_sync(TK_FULL, emax, o));
        ovf_sum += __shfl_xor_sync(TK_FULL, ovf_sum, o);
    }
    __syncwarp();
    w = gcomp_topk_rice_max(any);
    /* lane l tries b = l and b = l + 32 (b <= w); the smallest (bits, b) wins, which is what
     * gcomp_topk_rice_param's loop keeps: fewest bits, the smallest b on ties */
    for (unsigned b = lane; b <= w; b += 32) {
        const uint64_t bits = gcomp_topk_rice_bits(gaps, m, b);
        if (bits < best_bits) best_bits = bits, best_b = b; /* b grows: ties keep the smaller */
    }
    for (unsigned o = 16; o; o >>= 1) {
        const uint64_t ob = __shfl_xor_sync(TK_FULL, best_bits, o);
        const unsigned obb = __shfl_xor_sync(TK_FULL, best_b, o);
        if (ob < best_bits || (ob == best_bits && obb < best_b)) best_bits = ob, best_b = obb;
    }
    if (lane == 0) {
        const unsigned ew = gcomp_topk_width(emax - emin);
        blk_info[blk] = best_b | emin << 8 | ew << 16;
        blk_bytes[blk] = gcomp_topk_block_bytes(best_bits, m, ew, fp16);
        if (ovf_sum) { /* the decoded result holds an inf the residual must not see */
            atomicAdd((unsigned long long *)&status->overflow, (unsigned long long)ovf_sum);
            status->nonfinite = 1;
        }
    }
}

/* Block offsets, the body size, and k at the body's start. A body past cap is refused here,
 * before any byte of it is written, as the CPU's encode measures before it writes
 * (codecs/topk.c): status->error = GCOMP_ERR_BUFFER_TOO_SMALL, and body_bytes says what it
 * needs. After an earlier error the block sizes were never made: nothing at all. */
static __global__ void tk_scan_blocks(const unsigned long long *blk_bytes, unsigned long long *blk_off, size_t nb,
                                      uint64_t k, uint8_t *body, size_t cap, gcomp_cuda_status *status)
{
    __shared__ unsigned long long sh[33];
    unsigned long long total;
    if (status->error) return; /* block-uniform: thread 0 writes it only after the scan's barriers */
    total = tk_scan_array(blk_bytes, blk_off, nb, sh);
    if (threadIdx.x == 0) {
        status->body_bytes = 8 + total;
        if (8 + total > cap)
            tk_set_error(status, GCOMP_ERR_BUFFER_TOO_SMALL);
        else
            gcomp_le_store_u64(body, k);
    }
}

/* Largest block the encoder writes (b <= 63, fp32 values: 3 + 128 * 96 / 8 = 1539 bytes). */
#define TK_BLOCK_MAX_WORDS 392u

/* ORs the low w bits of v (w <= 32) into the LSB-first stream of words at bit pos: other
 * lanes' fields may share a word. */
static __device__ __forceinline__ void tk_or_bits(uint32_t *words, uint64_t pos, uint64_t v, unsigned w)
{
    const unsigned at = (unsigned)(pos & 31u);
    const uint64_t wide = (w < 64 ? v & ((1ull << w) - 1) : v) << at;
    if (!w) return;
    atomicOr(&words[pos >> 5], (uint32_t)wide);
    if (at + w > 32) atomicOr(&words[(pos >> 5) + 1], (uint32_t)(wide >> 32));
}

/* Writes each block (one warp) at its offset: the fields gcomp_topk_block_write writes, in
 * the same order, each lane writing four consecutive pairs at the bit offset a scan of the
 * pair lengths gives it. With a residual, the kept elements' residuals x - decoded value
 * (pass 1 left x there). */
static __global__ void tk_block_write(const float *g, const gcomp_cuda_residual *res, const unsigned long long *idx,
                                      uint64_t k, int fp16, const uint32_t *blk_info,
                                      const unsigned long long *blk_bytes, const unsigned long long *blk_off,
                                      uint8_t *body, size_t cap, gcomp_cuda_status *status)
{
    __shared__ uint64_t gaps_sh[TK_WARPS_PER_BLOCK][GCOMP_TOPK_BLOCK];
    __shared__ uint32_t vals_sh[TK_WARPS_PER_BLOCK][GCOMP_TOPK_BLOCK];
    __shared__ uint32_t out_sh[TK_WARPS_PER_BLOCK][TK_BLOCK_MAX_WORDS];
    const unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
    const uint64_t blk = (uint64_t)blockIdx.x * TK_WARPS_PER_BLOCK + warp, first = blk * GCOMP_TOPK_BLOCK;
    const float *x = tk_x(g, res);
    float *r_out = res ? res->buf[res->cur ^ 1u] : nullptr;
    uint32_t *words = out_sh[warp], info;
    unsigned m, b, e0, ew, vbits, j0, j1;
    unsigned long long at, len, mine = 0, pos;
    if (first >= k) return;
    /* a refused body (too small a cap, or an earlier error) gets no byte and no residual; lane
     * 0's reading decides for the warp, whose shuffles need every lane (another warp of this
     * kernel may set the error meanwhile) */
    if (__shfl_sync(TK_FULL, status->error, 0)) return;
    m = gcomp_topk_block_len(k, first);
    info = blk_info[blk];
    b = info & 0xffu, e0 = info >> 8 & 0xffu, ew = info >> 16 & 0xffu;
    vbits = 1 + ew + gcomp_topk_value_format(fp16).mbits;
    for (unsigned j = lane; j < TK_BLOCK_MAX_WORDS; j += 32) words[j] = 0;
    for (unsigned j = lane; j < m; j += 32) {
        float xv, dec;
        unsigned ovf;
        tk_pair(idx, first + j, x, fp16, &gaps_sh[warp][j], &vals_sh[warp][j], &xv, &dec, &ovf);
        if (r_out) r_out[idx[first + j]] = xv - dec; /* read x above, then its residual */
    }
    __syncwarp();
    /* pairs j0 .. j1 of this lane; a pair takes q + 1 + b gap bits and vbits value bits */
    j0 = lane * 4 < m ? lane * 4 : m;
    j1 = j0 + 4 < m ? j0 + 4 : m;
    for (unsigned j = j0; j < j1; j++) mine += (gaps_sh[warp][j] >> b) + 1 + b + vbits;
    pos = mine;
    for (unsigned o = 1; o < 32; o <<= 1) {
        const unsigned long long t = __shfl_up_sync(TK_FULL, pos, o);
        if (lane >= o) pos += t;
    }
    len = __shfl_sync(TK_FULL, pos, 31); /* the block's stream bits */
    pos = 24 + pos - mine;               /* after the 3 header bytes */
    if (lane == 0) words[0] = b | e0 << 8 | ew << 16;
    __syncwarp();
    for (unsigned j = j0; j < j1; j++) {
        const uint64_t gap = gaps_sh[warp][j];
        uint64_t q = gap >> b;
        for (; q >= 32; q -= 32, pos += 32) tk_or_bits(words, pos, 0xffffffffu, 32);
        tk_or_bits(words, pos, (1ull << q) - 1, (unsigned)q); /* q ones, then the zero */
        pos += q + 1;
        if (b > 32) {
            tk_or_bits(words, pos, gap & 0xffffffffu, 32);
            tk_or_bits(words, pos + 32, gap >> 32, b - 32);
        } else {
            tk_or_bits(words, pos, gap, b);
        }
        pos += b;
        tk_or_bits(words, pos, gcomp_topk_value_field(vals_sh[warp][j], e0, ew, fp16), vbits);
        pos += vbits;
    }
    __syncwarp();
    len = 3 + (len + 7) / 8;
    at = 8 + blk_off[blk];
    if (len != blk_bytes[blk] || at + len > cap) { /* cannot happen: the sizes come from one rule */
        if (lane == 0) tk_set_error(status, GCOMP_ERR_INTERNAL);
        return;
    }
    for (unsigned long long j = lane; j < len; j += 32) body[at + j] = ((const uint8_t *)words)[j];
}

/* n == 0: the body is k = 0. */
static __global__ void tk_empty(uint8_t *body, uint32_t flags, gcomp_cuda_status *status)
{
    gcomp_le_store_u64(body, 0);
    status->flags = flags;
    status->overflow = 0;
    status->nonfinite = 0;
    status->body_bytes = 8;
}

/* ---- host side ------------------------------------------------------------------------------ */

static gcomp_result tk_launched(const char *what)
{
    const cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return GCOMP_SUCCESS;
    return gcomp_codec_fail(GCOMP_ERR_INTERNAL, "topk: launch of %s failed: %s", what, cudaGetErrorString(e));
}

#define TK_LAUNCHED(what)                     \
    do {                                      \
        gcomp_result rc_ = tk_launched(what); \
        if (rc_ != GCOMP_SUCCESS) return rc_; \
    } while (0)

/* Blocks for a grid-stride pass over n elements: enough to fill the GPU, no more (each block
 * flushes a histogram at its end). */
static unsigned tk_stream_grid(size_t n, unsigned threads)
{
    int dev = 0, sms = 132;
    size_t want;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        sms = 132;
    (void)cudaGetLastError();
    want = (n + (size_t)threads * 16 - 1) / ((size_t)threads * 16);
    if (want < 1) want = 1;
    if (want > (size_t)sms * 4) want = (size_t)sms * 4;
    return (unsigned)want;
}

static size_t tk_scratch_bytes(const void *params, size_t count)
{
    const gcomp_topk_params *p = (const gcomp_topk_params *)params;
    const uint64_t k = gcomp_topk_k(p, count);
    const size_t enc = tk_encode_layout(count, k).total, lists = tk_list_layout_for(count, k).per_rank;
    return enc > lists ? enc : lists;
}

static gcomp_result tk_encode(const void *params, const gcomp_encode_ctx *ctx, const float *g,
                              const gcomp_cuda_residual *res, size_t n, uint8_t *body, size_t cap, void *scratch,
                              gcomp_cuda_status *status, struct CUstream_st *stream_)
{
    const gcomp_topk_params *p = (const gcomp_topk_params *)params;
    const cudaStream_t stream = (cudaStream_t)stream_;
    const int fp16 = p->values == 1;
    const uint32_t flags = fp16 ? GCOMP_TOPK_FLAG_FP16 : 0;
    const uint64_t k = gcomp_topk_k(p, n);
    const size_t tiles = tk_tiles(n), nb = (size_t)((k + GCOMP_TOPK_BLOCK - 1) / GCOMP_TOPK_BLOCK);
    const tk_layout l = tk_encode_layout(n, k);
    uint8_t *s = (uint8_t *)scratch;
    tk_select *st = (tk_select *)(s + l.state);
    unsigned long long *hist = (unsigned long long *)(s + l.hist);
    unsigned long long *off_gt = (unsigned long long *)(s + l.off_gt), *off_eq = (unsigned long long *)(s + l.off_eq);
    const size_t groups = tk_groups(tiles);
    unsigned long long *group_gt = (unsigned long long *)(s + l.groups), *group_eq = group_gt + groups;
    unsigned long long *gt1 = (unsigned long long *)(s + l.gt1), *und_gt = (unsigned long long *)(s + l.und_gt);
    unsigned long long *und_eq = (unsigned long long *)(s + l.und_eq);
    tk_und *list = (tk_und *)(s + l.list);
    unsigned long long *idx = (unsigned long long *)(s + l.idx);
    uint32_t *blk_info = (uint32_t *)(s + l.blk_info);
    unsigned long long *blk_bytes = (unsigned long long *)(s + l.blk_bytes),
                       *blk_off = (unsigned long long *)(s + l.blk_off);
    const unsigned body_grid = (unsigned)((nb + TK_WARPS_PER_BLOCK - 1) / TK_WARPS_PER_BLOCK);
    unsigned grid;
    (void)ctx; /* top-k uses neither the rank nor the step */

    if (!body || !status || (n && (!g || !scratch)))
        return gcomp_codec_fail(GCOMP_ERR_INVALID_ARG, "topk: cuda encode: NULL buffer");
    /* Every body holds k, so a cap under 8 bytes is refused at once, as on the CPU. A larger
     * one under the worst case (max_body_bytes) may still hold this call's body, which the CPU
     * accepts: its size depends on the data, known on the device only, so tk_scan_blocks
     * judges it (status->error = GCOMP_ERR_BUFFER_TOO_SMALL, nothing written) -- the op never
     * waits for the device to return it here. */
    if (cap < 8)
        return gcomp_codec_fail(GCOMP_ERR_BUFFER_TOO_SMALL,
                                "topk: cuda encode: a body buffer of %zu bytes cannot hold k", cap);
    if (n == 0) {
        tk_empty<<<1, 1, 0, stream>>>(body, flags, status);
        TK_LAUNCHED("tk_empty");
        return GCOMP_SUCCESS;
    }
    /* the digit-0 histogram: pass 1 adds to it from every block, so it is cleared before */
    if (cudaMemsetAsync(hist, 0, TK_NBINS * sizeof *hist, stream) != cudaSuccess) return tk_launched("memset");

    grid = tk_stream_grid(n, TK_HIST_THREADS);
    tk_pass1<<<grid, TK_HIST_THREADS, 0, stream>>>(g, res, n, hist);
    TK_LAUNCHED("tk_pass1");
    tk_select_digit<<<1, TK_SCAN_THREADS, 0, stream>>>(hist, 0, TK_D0, k, flags, st, status);
    TK_LAUNCHED("tk_select_digit");
    tk_collect<<<(unsigned)tiles, TK_TILE_THREADS, 0, stream>>>(g, res, n, st, l.list_cap, list, gt1, und_gt, und_eq);
    TK_LAUNCHED("tk_collect");
    tk_digit_hist<<<grid, TK_HIST_THREADS, 0, stream>>>(g, res, n, st, TK_D1, list, hist + TK_NBINS);
    TK_LAUNCHED("tk_digit_hist");
    tk_select_digit<<<1, TK_SCAN_THREADS, 0, stream>>>(hist, 1, TK_D1, k, flags, st, status);
    TK_LAUNCHED("tk_select_digit");
    tk_digit_hist<<<grid, TK_HIST_THREADS, 0, stream>>>(g, res, n, st, TK_D2, list, hist + 2 * TK_NBINS);
    TK_LAUNCHED("tk_digit_hist");
    tk_select_digit<<<1, TK_SCAN_THREADS, 0, stream>>>(hist, 2, TK_D2, k, flags, st, status);
    TK_LAUNCHED("tk_select_digit");

    tk_und_count<<<grid, TK_HIST_THREADS, 0, stream>>>(g, res, n, tiles, st, list, und_gt, und_eq);
    TK_LAUNCHED("tk_und_count");
    tk_scan_tiles<<<(unsigned)groups, TK_SCAN_THREADS, 0, stream>>>(gt1, und_gt, und_eq, tiles, off_gt, off_eq,
                                                                    group_gt, group_eq, st, k, status);
    TK_LAUNCHED("tk_scan_tiles");
    tk_scatter<<<(unsigned)tiles, TK_TILE_THREADS, 0, stream>>>(g, res, n, st, off_gt, off_eq, group_gt, group_eq, idx,
                                                                k);
    TK_LAUNCHED("tk_scatter");

    tk_block_prep<<<body_grid, TK_WARPS_PER_BLOCK * 32, 0, stream>>>(g, res, idx, k, fp16, blk_info, blk_bytes, status);
    TK_LAUNCHED("tk_block_prep");
    tk_scan_blocks<<<1, TK_SCAN_THREADS, 0, stream>>>(blk_bytes, blk_off, nb, k, body, cap, status);
    TK_LAUNCHED("tk_scan_blocks");
    tk_block_write<<<body_grid, TK_WARPS_PER_BLOCK * 32, 0, stream>>>(g, res, idx, k, fp16, blk_info, blk_bytes,
                                                                      blk_off, body, cap, status);
    TK_LAUNCHED("tk_block_write");
    return GCOMP_SUCCESS;
}

/* ---- decode ---------------------------------------------------------------------------------- */

/* The body of a payload whose header the library checked: flags and size from the header.
 * Re-checked here, cap before any header byte: a direct caller of the ops (or a payload the
 * header check did not see) must not make us read past cap. */
static __device__ int tk_payload_body(const uint8_t *payload, size_t cap, const uint8_t **body, size_t *bytes,
                                      uint32_t *flags)
{
    uint64_t b;
    if (cap < GCOMP_HEADER_BYTES) return 0;
    b = gcomp_le_load_u64(payload + 24);
    if (b > cap - GCOMP_HEADER_BYTES) return 0;
    *flags = gcomp_le_load_u32(payload + 8);
    *body = payload + GCOMP_HEADER_BYTES;
    *bytes = (size_t)b;
    return 1;
}

/* Checks a whole body (one thread: the block chain is sequential). */
static __global__ void tk_decode_check(const uint8_t *payload, size_t cap, size_t count, gcomp_cuda_status *status)
{
    gcomp_topk_reader rd;
    uint64_t bidx[GCOMP_TOPK_BLOCK];
    float bval[GCOMP_TOPK_BLOCK];
    const uint8_t *body;
    size_t bytes;
    uint32_t flags;
    unsigned m;
    int why;
    if (status->error) return;
    if (!tk_payload_body(payload, cap, &body, &bytes, &flags)) {
        tk_set_error(status, GCOMP_ERR_CORRUPT);
        return;
    }
    why = gcomp_topk_read_head(&rd, flags, body, bytes, count, count);
    while (!why && rd.first < rd.k) why = gcomp_topk_read_block(&rd, bidx, bval, &m);
    if (!why) why = gcomp_topk_read_end(&rd);
    if (why) tk_set_error(status, GCOMP_ERR_CORRUPT);
}

/* Adds a checked body into acc: lane 0 parses a block into shared memory, the warp adds it.
 * Lane 0's verdicts reach the other lanes by shuffles, so no lane reads a flag lane 0 is
 * rewriting. */
static __global__ void tk_decode_add(const uint8_t *payload, size_t cap, float *acc, size_t count,
                                     gcomp_cuda_status *status)
{
    __shared__ uint64_t bidx[GCOMP_TOPK_BLOCK];
    __shared__ float bval[GCOMP_TOPK_BLOCK];
    gcomp_topk_reader rd;
    const unsigned lane = threadIdx.x;
    int more = 0;
    if (status->error) return; /* the check kernel (or the header check) refused the payload */
    if (lane == 0) {
        const uint8_t *body;
        size_t bytes;
        uint32_t flags;
        more = tk_payload_body(payload, cap, &body, &bytes, &flags) &&
               !gcomp_topk_read_head(&rd, flags, body, bytes, count, count) && rd.k > 0;
    }
    more = __shfl_sync(TK_FULL, more, 0);
    while (more) {
        unsigned m = 0;
        if (lane == 0) {
            const int why = gcomp_topk_read_block(&rd, bidx, bval, &m);
            if (why) m = 0; /* cannot happen: the same reader accepted the body */
            more = !why && rd.first < rd.k;
        }
        __syncwarp(); /* bidx, bval written */
        m = __shfl_sync(TK_FULL, m, 0);
        more = __shfl_sync(TK_FULL, more, 0);
        for (unsigned t = lane; t < m; t += 32) { /* the CPU's NaN bits */
            const float a = acc[bidx[t]];
            acc[bidx[t]] = gcomp_x86_nan_f32(__fadd_rn(a, bval[t]), a, bval[t]);
        }
        __syncwarp(); /* read before lane 0 parses the next block into them */
    }
}

static gcomp_result tk_decode_add_host(const void *params, const uint8_t *payload, size_t cap, float *acc, size_t count,
                                       gcomp_cuda_status *status, struct CUstream_st *stream_)
{
    const cudaStream_t stream = (cudaStream_t)stream_;
    (void)params; /* the body describes itself */
    if (!payload || !status || (count && !acc))
        return gcomp_codec_fail(GCOMP_ERR_INVALID_ARG, "topk: cuda decode_add: NULL buffer");
    tk_decode_check<<<1, 1, 0, stream>>>(payload, cap, count, status);
    TK_LAUNCHED("tk_decode_check");
    tk_decode_add<<<1, 32, 0, stream>>>(payload, cap, acc, count, status);
    TK_LAUNCHED("tk_decode_add");
    return GCOMP_SUCCESS;
}

/* ---- sparse gather ------------------------------------------------------------------------------ */

/* Parses payload j (thread j) into its list; every rank must hold exactly k pairs, as the
 * CPU's sparse gather requires. */
static __global__ void tk_sum_parse(const uint8_t *const *payloads, int n, size_t cap, size_t count, uint64_t k,
                                    uint8_t *lists, size_t per_rank, size_t val_at, gcomp_cuda_status *status)
{
    const int j = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    gcomp_topk_reader rd;
    const uint8_t *body;
    size_t bytes;
    uint32_t flags;
    unsigned m;
    int why;
    uint64_t *idx;
    float *val;
    if (j >= n || status->error) return;
    idx = (uint64_t *)(lists + (size_t)j * per_rank);
    val = (float *)(lists + (size_t)j * per_rank + val_at);
    if (!payloads[j] || !tk_payload_body(payloads[j], cap, &body, &bytes, &flags)) {
        tk_set_error(status, GCOMP_ERR_CORRUPT);
        return;
    }
    why = gcomp_topk_read_head(&rd, flags, body, bytes, count, k);
    if (!why && rd.k != k) why = GCOMP_TOPK_BAD_K_CAP;
    /* straight into the list: a block is at most GCOMP_TOPK_BLOCK pairs and k is checked */
    while (!why && rd.first < rd.k) why = gcomp_topk_read_block(&rd, idx + rd.first, val + rd.first, &m);
    if (!why) why = gcomp_topk_read_end(&rd);
    if (why) tk_set_error(status, GCOMP_ERR_CORRUPT);
}

/* starts[t] = the first pair of list j whose index lies in result tile t or later (t <=
 * tiles); pair p writes the tiles after its predecessor's, up to its own. */
static __global__ void tk_sum_starts(int n, uint64_t k, size_t tiles, uint8_t *lists, size_t per_rank, size_t starts_at,
                                     const gcomp_cuda_status *status)
{
    const size_t per_list = (size_t)k + 1, total = per_list * (size_t)n;
    if (status->error) return;
    for (size_t q = (size_t)blockIdx.x * blockDim.x + threadIdx.x; q < total; q += (size_t)gridDim.x * blockDim.x) {
        const size_t j = q / per_list, p = q % per_list;
        const uint64_t *idx = (const uint64_t *)(lists + j * per_rank);
        unsigned long long *starts = (unsigned long long *)(lists + j * per_rank + starts_at);
        const size_t cur = p < k ? (size_t)(idx[p] / TK_SUM_TILE) : tiles;
        const size_t from = p ? (size_t)(idx[p - 1] / TK_SUM_TILE) + 1 : 0;
        for (size_t t = from; t <= cur; t++) starts[t] = p;
    }
}

/* One tile of the result: ranks in order into shared memory (from 0.0f), then divided. */
static __global__ void tk_sum_tile(int n, size_t count, uint8_t *lists, size_t per_rank, size_t val_at,
                                   size_t starts_at, float divisor, float inv, float *result,
                                   const gcomp_cuda_status *status)
{
    __shared__ float buf[TK_SUM_TILE];
    const size_t t = blockIdx.x, lo = t * TK_SUM_TILE;
    const size_t len = count - lo < TK_SUM_TILE ? count - lo : TK_SUM_TILE;
    if (status->error) return; /* a corrupt payload: the result is left untouched */
    for (unsigned e = threadIdx.x; e < len; e += blockDim.x) buf[e] = 0.0f;
    __syncthreads();
    for (int j = 0; j < n; j++) { /* rank order: the same sums on every rank */
        const uint8_t *list = lists + (size_t)j * per_rank;
        const uint64_t *idx = (const uint64_t *)list;
        const float *val = (const float *)(list + val_at);
        const unsigned long long *starts = (const unsigned long long *)(list + starts_at);
        const size_t a = (size_t)starts[t], b = (size_t)starts[t + 1];
        for (size_t p = a + threadIdx.x; p < b; p += blockDim.x) {
            const float s = buf[idx[p] - lo]; /* distinct within a rank; the CPU's NaN bits */
            buf[idx[p] - lo] = gcomp_x86_nan_f32(__fadd_rn(s, val[p]), s, val[p]);
        }
        __syncthreads();
    }
    for (unsigned e = threadIdx.x; e < len; e += blockDim.x)
        result[lo + e] =
            divisor != 1.0f ? gcomp_x86_nan_f32(gcomp_divide_one(buf[e], divisor, inv), buf[e], divisor) : buf[e];
}

static gcomp_result tk_sum_payloads(const void *params, const uint8_t *const *payloads, int n, size_t cap,
                                    float *result, size_t count, float divisor, void *scratch,
                                    gcomp_cuda_status *status, struct CUstream_st *stream_)
{
    const gcomp_topk_params *p = (const gcomp_topk_params *)params;
    const cudaStream_t stream = (cudaStream_t)stream_;
    const uint64_t k = gcomp_topk_k(p, count);
    const tk_list_layout l = tk_list_layout_for(count, k);
    const size_t per_rank = tk_scratch_bytes(params, count), tiles = (count + TK_SUM_TILE - 1) / TK_SUM_TILE;
    uint8_t *lists = (uint8_t *)scratch;
    size_t starts_grid;
    if (n < 1 || !payloads || !status || (count && (!result || !scratch)))
        return gcomp_codec_fail(GCOMP_ERR_INVALID_ARG, "topk: cuda sum_payloads: NULL buffer or no payloads");
    if (count == 0) return GCOMP_SUCCESS;
    tk_sum_parse<<<(unsigned)((n + 63) / 64), 64, 0, stream>>>(payloads, n, cap, count, k, lists, per_rank, l.val,
                                                               status);
    TK_LAUNCHED("tk_sum_parse");
    starts_grid = ((size_t)(k + 1) * (size_t)n + 255) / 256;
    if (starts_grid > 65535) starts_grid = 65535;
    tk_sum_starts<<<(unsigned)starts_grid, 256, 0, stream>>>(n, k, tiles, lists, per_rank, l.starts, status);
    TK_LAUNCHED("tk_sum_starts");
    tk_sum_tile<<<(unsigned)tiles, 256, 0, stream>>>(n, count, lists, per_rank, l.val, l.starts, divisor,
                                                     gcomp_divide_inverse(divisor), result, status);
    TK_LAUNCHED("tk_sum_tile");
    return GCOMP_SUCCESS;
}

extern "C" const gcomp_codec_cuda_ops gcomp__cuda_ops_topk = {
    .scratch_bytes = tk_scratch_bytes,
    .encode = tk_encode,
    .decode_add = tk_decode_add_host,
    .local_scales = nullptr, /* not an integer-ring codec */
    .ternarise = nullptr,
    .sums_add_pack = nullptr,
    .sums_values = nullptr,
    .sum_payloads = tk_sum_payloads,
};
