/*
 * top-k sparsification — the CPU reference. This file IS the specification of the codec;
 * the wire format and the selection rule are in topk.h.
 *
 * Selection is a radix select on the 31-bit magnitude keys, MSB digit first: expected O(n),
 * no sort. The state is (prefix, shift, need): keys whose bits above `shift` are greater than
 * `prefix` are kept, smaller ones dropped, equal ones are undecided and `need` of them are
 * kept. When shift reaches 0 the undecided keys all equal the threshold, and the lowest
 * indices win the tie.
 *
 *   sample   a strided sample of x guesses a key t0 that at least k elements reach, with a
 *            wide margin (so the guess almost never fails; when it does we only lose time);
 *   pass 1   x = g + r_in, stored into r_out when there is one (a later pass then reads 4
 *            bytes per element, and the unkept part of the residual is already done), and
 *            the indices of keys >= t0 (a few percent of n), in index order. With at least k
 *            listed, the k-th largest key is in the list, so the top-digit histogram is built
 *            from the list alone and pass 1 does no per-element counting. Without a guess,
 *            or when it failed (too few listed, or the list overflowed), the histogram of the
 *            top digit comes from a pass over x;
 *   digit 0  the bin B holding the k-th largest key. With a good guess every key of bin B
 *            and above is in the list: drop those below B. Otherwise pass 2 collects the
 *            bin-B-and-above elements now that B is known.
 *   digits   histograms of the next digits of the undecided keys, read from the list — or,
 *            when bin B holds a large share of n (ties, zeros), from x itself so that the list
 *            never holds more than a fraction of n;
 *   compact  keep by (prefix, shift, need), from the list or, without one, in a last pass
 *            over x that stops once all k are found; the survivors are the kept indices,
 *            already in increasing order.
 *
 * Scratch (topk_select): 2^D uint64 + 4 x 2^D uint32 counts (D <= 16 digit bits: 1.5 MiB at
 * most) and a candidate list of uint64 index + uint32 key per candidate (about 1.7% of n at
 * ratio 0.01; never more than max(k + n/8, ~n/7) + 16 entries). It is the codec object's
 * state (state_create): grown when a call needs more and reused by every later call, so a
 * steady-state encode allocates nothing. Only an encode without state (ctx->state NULL)
 * allocates its own and frees it before returning.
 */
#include "topk.h"
#include "codecs/common.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define TOPK_KEY_BITS 31u
#define TOPK_INF_KEY GCOMP_TOPK_INF_KEY
#define TOPK_GROUP 16u                    /* elements tested at once before any per-element work */
#define TOPK_CHUNK ((size_t)1 << 30)      /* elements per pass-1 chunk: uint32 counts stay exact */
#define TOPK_SPEC_MIN_N ((size_t)1 << 16) /* below: two passes over data that sits in cache */
#define TOPK_SAMPLE 8192u
#define TOPK_STREAM_MIN_N ((size_t)1 << 22) /* from 16 MiB of x: streamed stores (pass 1) */
/* Before a loop over one group: keeps gcc from unrolling its 16 iterations into straight-line
 * code, whose OR reduction its basic-block vectoriser (gcc 12) leaves scalar; as a loop it is
 * vectorised (about 1 ns per element of pass 1 less here). */
#if defined(__GNUC__)
#define TOPK_VECTOR_LOOP _Pragma("GCC unroll 1")
#else
#define TOPK_VECTOR_LOOP
#endif
#define TOPK_NSUB \
    ((size_t)4) /* partial histograms, so equal keys in a row do not wait on
                                 each other's increment */

/* ---- parameters ---------------------------------------------------------------------- */

static const char *const topk_value_choices[] = { "fp32", "fp16", NULL };

static const gcomp_param_def topk_param_defs[] = {
    { "ratio", GCOMP_PARAM_DOUBLE, offsetof(gcomp_topk_params, ratio), 1e-6, 1.0, 0.01, NULL,
      "fraction of the elements kept, k = ceil(ratio * n)" },
    { "k", GCOMP_PARAM_INT, offsetof(gcomp_topk_params, k), 0.0, 4611686018427387904.0 /* 2^62 */, 0.0, NULL,
      "number of elements kept; 0 uses ratio, > 0 overrides it" },
    { "values", GCOMP_PARAM_ENUM, offsetof(gcomp_topk_params, values), 0.0, 1.0, 0.0, topk_value_choices,
      "wire type of the kept values" },
};

/* ---- element access -------------------------------------------------------------------- */

static inline uint32_t key_of(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return gcomp_topk_key(bits);
}

/* x[i] as the codec defines it: g + r, or g itself (bit for bit, -0 included) without r. */
static inline float x_at(const float *g, const float *r, size_t i) { return r ? g[i] + r[i] : g[i]; }

/* Nonzero iff some key of the group is >= thr: thr - 1 - key borrows into bit 31 exactly
 * then (keys and thr are below 2^31; thr == 0 flags every group). Plain integer ops, so the
 * loop vectorises. */
static inline uint32_t group_reaches(const float *g, const float *r, size_t i, uint32_t thr)
{
    uint32_t any = 0;
    TOPK_VECTOR_LOOP
    for (size_t j = i; j < i + TOPK_GROUP; j++) any |= thr - 1 - key_of(x_at(g, r, j));
    return any >> 31;
}

static unsigned isqrt(uint64_t v)
{
    unsigned s = 0;
    while ((uint64_t)(s + 1) * (s + 1) <= v) s++;
    return s;
}

/* ---- selection state ------------------------------------------------------------------- */

typedef struct topk_select {
    unsigned digit; /* D: bits of the top digit (and at most that many in later digits) */
    unsigned shift; /* keys >> shift are compared with prefix */
    uint32_t prefix;
    uint64_t need;       /* undecided keys still to keep */
    uint64_t undecided;  /* how many keys are undecided */
    uint64_t *hist;      /* 2^D counts of the current digit */
    uint32_t *sub;       /* TOPK_NSUB x 2^D partial counts: pass 1 uses two, a digit pass
                           over x (long runs of one bin) all four */
    uint64_t *idx;       /* candidate list: indices in increasing order ... */
    uint32_t *key;       /* ... and their keys */
    size_t cap;          /* entries the list can hold */
    unsigned hist_digit; /* digit the hist/sub buffers were sized for (0: none) */
    size_t ncand;        /* entries it holds */
} topk_select;

/* Top digit width: 16 bits for large n; fewer for small n, where clearing and scanning 2^16
 * bins would cost more than the data. */
static unsigned digit_bits(size_t n)
{
    unsigned b = gcomp_topk_width(n);
    return b >= 20 ? 16 : b <= 12 ? 8 : b - 4;
}

static gcomp_result list_reserve(topk_select *s, size_t entries)
{
    if (entries <= s->cap) return GCOMP_SUCCESS;
    free(s->idx);
    free(s->key);
    s->idx = malloc(entries * sizeof *s->idx);
    s->key = malloc(entries * sizeof *s->key);
    s->cap = s->idx && s->key ? entries : 0;
    if (!s->cap) return gcomp_codec_fail(GCOMP_ERR_NOMEM, "topk: no memory for %zu candidates", entries);
    return GCOMP_SUCCESS;
}

static void select_free(topk_select *s);

/* The selection buffers live in the codec object's state and are reused by every call. */
static void *topk_state_create(const void *params)
{
    (void)params;
    return calloc(1, sizeof(topk_select));
}

static void topk_state_destroy(void *state)
{
    if (!state) return;
    select_free(state);
    free(state);
}

static void select_free(topk_select *s)
{
    free(s->hist);
    free(s->sub);
    free(s->idx);
    free(s->key);
}

/* The largest bin b whose count together with all higher bins reaches need (1 <= need <=
 * total count). *above receives the count of the higher bins alone. */
static uint32_t find_bin(const uint64_t *hist, uint32_t nbins, uint64_t need, uint64_t *above)
{
    uint64_t cum = 0;
    uint32_t b = nbins - 1;
    while (cum + hist[b] < need) cum += hist[b--];
    *above = cum;
    return b;
}

/* hist (+)= the sum of the first nsub partial counts, which go back to zero for the next
 * chunk. */
static void fold_sub(topk_select *s, size_t nsub, int add)
{
    const size_t nb = (size_t)1 << s->digit;
    for (size_t b = 0; b < nb; b++) {
        uint64_t sum = add ? s->hist[b] : 0;
        for (size_t j = 0; j < nsub; j++) {
            sum += s->sub[j * nb + b];
            s->sub[j * nb + b] = 0;
        }
        s->hist[b] = sum;
    }
}

/* ---- sample: a threshold that at least k elements reach, almost surely ------------------ */

/* Returns 1 and sets *t0 (a top-digit bin floor) and the list capacity when a guess is worth
 * making: n is large and the guess keeps the list at a few percent of n. Uses s->hist. */
static int sample_threshold(topk_select *s, const float *g, const float *r, size_t n, uint64_t k, uint32_t *t0,
                            size_t *cap)
{
    const size_t stride = n / TOPK_SAMPLE;
    uint64_t expect, want, above, got;
    uint32_t b;

    if (n < TOPK_SPEC_MIN_N) return 0;
    expect = k / stride;                   /* sample elements above the true threshold */
    want = expect + 4 * isqrt(expect) + 8; /* > 4 sigma of margin */
    if (want > TOPK_SAMPLE / 8) return 0;
    memset(s->hist, 0, ((size_t)1 << s->digit) * sizeof *s->hist);
    for (size_t j = 0; j < TOPK_SAMPLE; j++) s->hist[key_of(x_at(g, r, j * stride)) >> s->shift]++;
    b = find_bin(s->hist, 1u << s->digit, want, &above);
    got = above + s->hist[b];            /* sample elements >= t0 */
    if (got > TOPK_SAMPLE / 8) return 0; /* a heavy bin (ties): the guess would not pay */
    *t0 = b << s->shift;
    *cap = (size_t)(got + 4 * isqrt(got) + 16) * (stride + 1);
    return 1;
}

/* ---- pass 1: x, the top-digit histogram, and the candidates >= t0 ----------------------- */

/* Appends the group's elements with key >= thr to the list. The write is unconditional and
 * the count moves by the comparison, so the list needs TOPK_GROUP free entries. */
static inline size_t append_group(const float *g, const float *r, size_t i, size_t base, uint32_t thr, uint64_t *idx,
                                  uint32_t *key, size_t c)
{
    for (size_t j = i; j < i + TOPK_GROUP; j++) {
        uint32_t kj = key_of(x_at(g, r, j));
        idx[c] = base + j;
        key[c] = kj;
        c += kj >= thr;
    }
    return c;
}

/* Stores a group of x. Large tensors are streamed past the cache (non-temporal stores): x
 * is not read again soon, and a plain store would first read every line it writes. Small
 * ones stay in the cache for the next call, which reads them as its residual. */
static inline void store_group(float *dst, const float *xb, int stream)
{
#if defined(__SSE2__)
    if (stream && ((uintptr_t)dst & 15) == 0) {
        for (size_t q = 0; q < TOPK_GROUP; q += 4) _mm_stream_ps(dst + q, _mm_loadu_ps(xb + q));
        return;
    }
#endif
    (void)stream;
    memcpy(dst, xb, TOPK_GROUP * sizeof *dst);
}

/* One chunk of pass 1 (elements base .. base + n of the tensor; g, r, xo point at the chunk).
 * Inlined into each call site with constant NULL-ness of r and xo and a constant spec, so
 * every variant is a straight loop. Returns the new list length, or SIZE_MAX when the list
 * overflowed (the guess was wrong; pass 2 will collect). */
static inline __attribute__((always_inline)) size_t pass1_loop(topk_select *s, const float *g, const float *r,
                                                               float *xo, size_t n, size_t base, int spec, uint32_t t0,
                                                               size_t c)
{
    const int hist = !spec; /* with a guess, the list alone decides (see select_topk) */
    const int stream = xo && base + n >= TOPK_STREAM_MIN_N;
    uint32_t *h0 = s->sub, *h1 = s->sub + ((size_t)1 << s->digit);
    const unsigned shift = s->shift;
    size_t i = 0;
    for (; i + TOPK_GROUP <= n; i += TOPK_GROUP) {
        float xb[TOPK_GROUP];
        uint32_t any = 0;
        if (spec) { /* two plain loops (x, then an OR reduction over its bits): both vectorise */
            uint32_t kb[TOPK_GROUP];
            TOPK_VECTOR_LOOP
            for (size_t j = 0; j < TOPK_GROUP; j++) xb[j] = x_at(g, r, i + j);
            memcpy(kb, xb, sizeof kb);
            TOPK_VECTOR_LOOP
            for (size_t j = 0; j < TOPK_GROUP; j++) any |= t0 - 1 - gcomp_topk_key(kb[j]);
        }
        for (size_t j = 0; hist && j < TOPK_GROUP; j += 2) { /* two sub-histograms: fewer store-to-load stalls */
            float a = x_at(g, r, i + j), b = x_at(g, r, i + j + 1);
            xb[j] = a;
            xb[j + 1] = b;
            h0[key_of(a) >> shift]++;
            h1[key_of(b) >> shift]++;
        }
        if (xo) store_group(xo + i, xb, stream);
        /* the candidates come from xb: r may alias xo and already hold x instead of r */
        if (spec && any >> 31 && c != SIZE_MAX)
            c = c + TOPK_GROUP > s->cap ? SIZE_MAX : append_group(xb, NULL, 0, base + i, t0, s->idx, s->key, c);
    }
    for (; i < n; i++) {
        float a = x_at(g, r, i);
        uint32_t ka = key_of(a);
        if (xo) xo[i] = a;
        if (hist) h0[ka >> shift]++;
        if (spec && c != SIZE_MAX) {
            if (c + 1 > s->cap) {
                c = SIZE_MAX;
                continue;
            }
            s->idx[c] = base + i;
            s->key[c] = ka;
            c += ka >= t0;
        }
    }
#if defined(__SSE2__)
    if (stream) _mm_sfence(); /* streamed stores are weakly ordered: finish them here */
#endif
    return c;
}

GCOMP_SIMD_CLONES static size_t pass1_chunk(topk_select *s, const float *g, const float *r, float *xo, size_t n,
                                            size_t base, int spec, uint32_t t0, size_t c)
{
    if (spec) {
        if (r && xo) return pass1_loop(s, g, r, xo, n, base, 1, t0, c);
        if (r) return pass1_loop(s, g, r, NULL, n, base, 1, t0, c);
        if (xo) return pass1_loop(s, g, NULL, xo, n, base, 1, t0, c);
        return pass1_loop(s, g, NULL, NULL, n, base, 1, t0, c);
    }
    if (r && xo) return pass1_loop(s, g, r, xo, n, base, 0, 0, c);
    if (r) return pass1_loop(s, g, r, NULL, n, base, 0, 0, c);
    if (xo) return pass1_loop(s, g, NULL, xo, n, base, 0, 0, c);
    return pass1_loop(s, g, NULL, NULL, n, base, 0, 0, c);
}

/* Pass 1 over the whole tensor in chunks. Returns the list length or SIZE_MAX (overflow). */
static size_t pass1(topk_select *s, const float *g, const float *r, float *xo, size_t n, int spec, uint32_t t0)
{
    size_t c = 0;
    for (size_t base = 0; base < n; base += TOPK_CHUNK) {
        size_t m = n - base < TOPK_CHUNK ? n - base : TOPK_CHUNK;
        c = pass1_chunk(s, g + base, r ? r + base : NULL, xo ? xo + base : NULL, m, base, spec, t0, c);
        if (!spec) fold_sub(s, 2, base > 0);
    }
    return c;
}

/* ---- the kept rule and the passes that apply it ------------------------------------------- */

/* Keeps the listed/scanned elements by the state's rule, the lowest indices first among the
 * undecided. *quota counts down the undecided still to keep. */
static inline int keep(const topk_select *s, uint32_t key, uint64_t *quota)
{
    uint32_t hi = key >> s->shift;
    int tie = hi == s->prefix && *quota > 0;
    *quota -= tie;
    return hi > s->prefix || tie;
}

/* Pass 2: the elements whose top digit is >= prefix, i.e. key >= prefix << shift. */
static size_t collect(topk_select *s, const float *g, const float *r, size_t n)
{
    const uint32_t thr = s->prefix << s->shift;
    size_t c = 0, i = 0;
    for (; i + TOPK_GROUP <= n; i += TOPK_GROUP)
        if (group_reaches(g, r, i, thr)) c = append_group(g, r, i, 0, thr, s->idx, s->key, c);
    for (; i < n; i++) {
        uint32_t ki = key_of(x_at(g, r, i));
        s->idx[c] = i;
        s->key[c] = ki;
        c += ki >= thr;
    }
    return c;
}

/* The final pass when the list was not built: the kept indices straight from x. Once the
 * tie quota is spent only keys above the undecided range can still be kept, so the group
 * test tightens; and the pass stops as soon as all k are found. */
static size_t collect_kept(topk_select *s, const float *g, const float *r, size_t n, uint64_t k)
{
    uint32_t thr = s->prefix << s->shift;
    uint64_t quota = s->need;
    size_t c = 0;
    for (size_t i = 0; i < n && c < k; i += TOPK_GROUP) {
        size_t end = n - i < TOPK_GROUP ? n : i + TOPK_GROUP;
        if (end - i == TOPK_GROUP && !group_reaches(g, r, i, thr)) continue;
        for (size_t j = i; j < end; j++) {
            s->idx[c] = j;
            c += keep(s, key_of(x_at(g, r, j)), &quota);
        }
        if (quota == 0) thr = (s->prefix + 1) << s->shift; /* at most 2^31: reached by none */
    }
    return c;
}

/* Keeps the first len listed candidates whose key is >= thr, in order. */
static size_t list_keep_from(topk_select *s, size_t len, uint32_t thr)
{
    size_t c = 0;
    for (size_t j = 0; j < len; j++) {
        s->idx[c] = s->idx[j];
        s->key[c] = s->key[j];
        c += s->key[j] >= thr;
    }
    return c;
}

/* Drops from the list what the rule does not keep (the list only grows smaller, in place). */
static size_t compact_list(topk_select *s)
{
    uint64_t quota = s->need;
    size_t c = 0;
    for (size_t j = 0; j < s->ncand; j++) {
        s->idx[c] = s->idx[j];
        s->key[c] = s->key[j];
        c += keep(s, s->key[j], &quota);
    }
    return c;
}

/* ---- the lower digits ------------------------------------------------------------------ */

/* Histogram of the next d bits of the undecided keys, from the list. */
static void digit_from_list(topk_select *s, unsigned d)
{
    const unsigned lo = s->shift - d;
    const uint32_t mask = (1u << d) - 1;
    memset(s->hist, 0, ((size_t)1 << d) * sizeof *s->hist);
    for (size_t j = 0; j < s->ncand; j++)
        if (s->key[j] >> s->shift == s->prefix) s->hist[(s->key[j] >> lo) & mask]++;
}

/* The same from x: a full pass, taken when the undecided keys are a large share of n. The
 * increments are predicated (no per-element branch) and spread over four count arrays, as
 * the undecided keys here are mostly in one bin. */
static inline __attribute__((always_inline)) void digit_loop(topk_select *s, const float *g, const float *r, size_t n,
                                                             unsigned d)
{
    const unsigned lo = s->shift - d, shift = s->shift;
    const uint32_t mask = (1u << d) - 1, prefix = s->prefix;
    const size_t nb = (size_t)1 << s->digit;
    uint32_t *h0 = s->sub, *h1 = h0 + nb, *h2 = h1 + nb, *h3 = h2 + nb;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        uint32_t ka = key_of(x_at(g, r, i)), kb = key_of(x_at(g, r, i + 1));
        uint32_t kc = key_of(x_at(g, r, i + 2)), kd = key_of(x_at(g, r, i + 3));
        h0[(ka >> lo) & mask] += ka >> shift == prefix;
        h1[(kb >> lo) & mask] += kb >> shift == prefix;
        h2[(kc >> lo) & mask] += kc >> shift == prefix;
        h3[(kd >> lo) & mask] += kd >> shift == prefix;
    }
    for (; i < n; i++) {
        uint32_t ka = key_of(x_at(g, r, i));
        h0[(ka >> lo) & mask] += ka >> shift == prefix;
    }
}

static void digit_from_data(topk_select *s, const float *g, const float *r, size_t n, unsigned d)
{
    for (size_t base = 0; base < n; base += TOPK_CHUNK) {
        size_t m = n - base < TOPK_CHUNK ? n - base : TOPK_CHUNK;
        if (r)
            digit_loop(s, g + base, r + base, m, d);
        else
            digit_loop(s, g + base, NULL, m, d);
        fold_sub(s, TOPK_NSUB, base > 0); /* bins past 2^d stay zero */
    }
}

/* Narrows (prefix, shift, need) digit by digit until the undecided keys are all kept or all
 * equal. */
static void refine(topk_select *s, const float *g, const float *r, size_t n, int from_list)
{
    while (s->undecided != s->need && s->shift > 0) {
        unsigned d = s->shift < s->digit ? s->shift : s->digit;
        uint64_t above;
        uint32_t b;
        if (from_list)
            digit_from_list(s, d);
        else
            digit_from_data(s, g, r, n, d);
        b = find_bin(s->hist, 1u << d, s->need, &above);
        s->undecided = s->hist[b];
        s->need -= above;
        s->prefix = s->prefix << d | b;
        s->shift -= d;
    }
}

/* ---- selection ---------------------------------------------------------------------------- */

/* Fills s->idx[0..k) with the kept indices in increasing order and sets *nonfinite. x is
 * g + r; when xo is not NULL pass 1 stores x there and later passes read it back. */
static gcomp_result select_topk(topk_select *s, const float *g, const float *r, float *xo, size_t n, uint64_t k,
                                uint32_t *nonfinite)
{
    const float *xs = xo ? xo : g, *xr = xo ? NULL : r; /* x after pass 1 */
    uint32_t t0 = 0;
    size_t cap = 0, got;
    uint64_t above;
    int spec, from_list = 1;

    s->digit = digit_bits(n);
    s->shift = TOPK_KEY_BITS - s->digit;
    if (s->hist_digit != s->digit) { /* reused across calls; regrown only when n's digit changes */
        free(s->hist);
        free(s->sub);
        s->hist = malloc(((size_t)1 << s->digit) * sizeof *s->hist);
        s->sub = calloc(TOPK_NSUB << s->digit, sizeof *s->sub);
        s->hist_digit = s->hist && s->sub ? s->digit : 0;
        if (!s->hist_digit) return gcomp_codec_fail(GCOMP_ERR_NOMEM, "topk: no memory for the histogram");
    } else { /* partial counts start at zero; an earlier failed call may have left some */
        memset(s->sub, 0, (TOPK_NSUB << s->digit) * sizeof *s->sub);
    }
    spec = sample_threshold(s, g, r, n, k, &t0, &cap);
    if (spec && t0 > TOPK_INF_KEY) spec = 0; /* the list must hold every Inf/NaN key */
    if (spec && list_reserve(s, cap) != GCOMP_SUCCESS) return GCOMP_ERR_NOMEM;

    got = pass1(s, g, r, xo, n, spec, t0);
    if (spec && got != SIZE_MAX && got >= k) {
        /* The list holds every key >= t0, a bin floor, and at least k of them: the k-th
         * largest key is in it, and its top-digit histogram equals that of x on every bin
         * from t0's up. Pass 1 needed no histogram. */
        memset(s->hist, 0, ((size_t)1 << s->digit) * sizeof *s->hist);
        for (size_t j = 0; j < got; j++) s->hist[s->key[j] >> s->shift]++;
    } else if (spec) {
        /* the guess failed: histogram x in a pass that stores nothing, then as without one */
        spec = 0;
        pass1(s, xs, xr, NULL, n, 0, 0);
    }
    for (uint32_t b = TOPK_INF_KEY >> s->shift; b >> s->digit == 0; b++)
        if (s->hist[b]) *nonfinite = 1;
    s->prefix = find_bin(s->hist, 1u << s->digit, k, &above);
    s->need = k - above;
    s->undecided = s->hist[s->prefix];
    s->ncand = (size_t)(above + s->undecided);

    if (spec) {
        /* every key of bin B and above reached t0, so all are listed: drop the rest */
        got = list_keep_from(s, got, s->prefix << s->shift);
    } else if (s->ncand <= k + n / 8) {
        if (list_reserve(s, s->ncand + 1) != GCOMP_SUCCESS) return GCOMP_ERR_NOMEM;
        got = collect(s, xs, xr, n);
    } else {
        from_list = 0;
        got = s->ncand;
    }
    if (got != s->ncand)
        return gcomp_codec_fail(GCOMP_ERR_INTERNAL, "topk: %zu candidates, expected %zu", got, s->ncand);

    refine(s, xs, xr, n, from_list);
    if (from_list) {
        got = compact_list(s);
    } else {
        if (list_reserve(s, (size_t)k + 1) != GCOMP_SUCCESS) return GCOMP_ERR_NOMEM;
        got = collect_kept(s, xs, xr, n, k);
    }
    if (got != k) return gcomp_codec_fail(GCOMP_ERR_INTERNAL, "topk: kept %zu of k=%llu", got, (unsigned long long)k);
    return GCOMP_SUCCESS;
}

/* ---- body ----------------------------------------------------------------------------------- */

/* One block of pairs as the encoder sees it before writing it. */
typedef struct topk_block {
    unsigned m, b, e0, ew;
    uint64_t gaps[GCOMP_TOPK_BLOCK];
    uint32_t vals[GCOMP_TOPK_BLOCK]; /* raw fp32 or fp16 bits */
} topk_block;

static unsigned block_len(uint64_t k, uint64_t first) { return gcomp_topk_block_len(k, first); }

/* Gathers the block of pairs idx[first .. first + m) and makes the encoder's choices. x lives
 * in xs (+ xr). With r_out, also writes the residual x - decoded of each kept element (after
 * reading x: they may be the same memory). Counts the finite values fp16 turned into +-inf. */
static void block_fill(topk_block *bl, const uint64_t *idx, uint64_t first, unsigned m, const float *xs,
                       const float *xr, float *r_out, int fp16, uint64_t *overflow)
{
    const gcomp_topk_vfmt f = gcomp_topk_value_format(fp16);
    const uint32_t emask = (1u << f.ebits) - 1;
    uint64_t prev = first ? idx[first - 1] + 1 : 0; /* gap = idx - (previous idx + 1) */
    uint32_t emin = emask, emax = 0;
    bl->m = m;
    for (unsigned j = 0; j < m; j++) {
        size_t i = (size_t)idx[first + j];
        float x = x_at(xs, xr, i), d;
        unsigned ovf;
        uint32_t v = gcomp_topk_value_bits(x, fp16, &d, &ovf), e;
        bl->gaps[j] = i - prev;
        prev = i + 1;
        *overflow += ovf;
        if (r_out) r_out[i] = x - d;
        bl->vals[j] = v;
        e = gcomp_topk_value_exp(v, fp16);
        emin = e < emin ? e : emin;
        emax = e > emax ? e : emax;
    }
    bl->b = gcomp_topk_rice_param(bl->gaps, m);
    bl->e0 = emin;
    bl->ew = gcomp_topk_width(emax - emin);
}

static size_t block_bytes(const topk_block *bl, int fp16)
{
    return gcomp_topk_block_bytes(gcomp_topk_rice_bits(bl->gaps, bl->m, bl->b), bl->m, bl->ew, fp16);
}

/* Writes the block (block_bytes of it) at out; returns that count. */
static size_t block_write(const topk_block *bl, int fp16, uint8_t *out)
{
    return gcomp_topk_block_write(bl->gaps, bl->vals, bl->m, bl->b, bl->e0, bl->ew, fp16, out);
}

/* Bytes of the whole body, without writing anything. */
static size_t body_bytes(const uint64_t *idx, uint64_t k, const float *xs, const float *xr, int fp16)
{
    topk_block bl;
    uint64_t ignored = 0;
    size_t bytes = 8;
    for (uint64_t first = 0; first < k; first += GCOMP_TOPK_BLOCK) {
        block_fill(&bl, idx, first, block_len(k, first), xs, xr, NULL, fp16, &ignored);
        bytes += block_bytes(&bl, fp16);
    }
    return bytes;
}

/* Writes the body and, with r_out, the kept elements' residuals. Returns the bytes written and
 * adds the fp16 overflows to *overflow. */
static size_t body_write(const uint64_t *idx, uint64_t k, const float *xs, const float *xr, float *r_out, int fp16,
                         uint8_t *body, uint64_t *overflow)
{
    topk_block bl;
    size_t pos = 8;
    gcomp_store_u64(body, k);
    for (uint64_t first = 0; first < k; first += GCOMP_TOPK_BLOCK) {
        block_fill(&bl, idx, first, block_len(k, first), xs, xr, r_out, fp16, overflow);
        pos += block_write(&bl, fp16, body + pos);
    }
    return pos;
}

/* ---- vtable functions ---------------------------------------------------------------------- */

static size_t topk_max_body_bytes(const void *params, size_t count)
{
    const gcomp_topk_params *p = params;
    uint64_t k = gcomp_topk_k(p, count);
    /* every gap is at most n - k, and the encoder's b is at most the largest gap's width */
    unsigned w = gcomp_topk_width(count - k);
    size_t full = k / GCOMP_TOPK_BLOCK, rem = k % GCOMP_TOPK_BLOCK;
    return 8 + full * gcomp_topk_block_max_bytes(GCOMP_TOPK_BLOCK, w, p->values) +
           (rem ? gcomp_topk_block_max_bytes((unsigned)rem, w, p->values) : 0);
}

static gcomp_result topk_encode(const void *params, gcomp_encode_ctx *ctx, const float *g, const float *r_in,
                                float *r_out, size_t n, uint8_t *body, size_t cap, size_t *written, uint32_t *flags)
{
    const gcomp_topk_params *p = params;
    const int fp16 = p->values == 1;
    const uint64_t k = gcomp_topk_k(p, n);
    /* x goes to r_out in pass 1 only when the body cannot fail to fit: a failed encode then
     * leaves r_out untouched even when it aliases r_in */
    const int fits = cap >= topk_max_body_bytes(p, n), x_in_rout = r_out && fits;
    topk_select local = { 0 }, *sp = ctx->state ? ctx->state : &local;
    gcomp_result rc = GCOMP_SUCCESS;
    uint64_t ovf = 0;

    *flags = fp16 ? GCOMP_TOPK_FLAG_FP16 : 0;
    if (k == 0) { /* n == 0 */
        if (cap < 8) return gcomp_codec_fail(GCOMP_ERR_BUFFER_TOO_SMALL, "topk: cap %zu < 8", cap);
        gcomp_store_u64(body, 0);
        *written = 8;
        return GCOMP_SUCCESS;
    }
    rc = select_topk(sp, g, r_in, x_in_rout ? r_out : NULL, n, k, &ctx->nonfinite);
    if (rc != GCOMP_SUCCESS) goto out;
    if (!fits) { /* a small buffer: measure the body before touching anything */
        size_t need = body_bytes(sp->idx, k, g, r_in, fp16);
        if (cap < need) {
            rc =
                gcomp_codec_fail(GCOMP_ERR_BUFFER_TOO_SMALL, "topk: body needs %zu bytes, buffer holds %zu", need, cap);
            goto out;
        }
    }
    if (r_out && !x_in_rout) /* the unkept part of the residual: x itself */
        for (size_t i = 0; i < n; i++) r_out[i] = x_at(g, r_in, i);
    *written = body_write(sp->idx, k, r_out ? r_out : g, r_out ? NULL : r_in, r_out, fp16, body, &ovf);
    ctx->overflow += ovf;
    if (ovf) ctx->nonfinite = 1; /* the decoded result holds an inf the residual must not see */
out:
    if (sp == &local) select_free(&local); /* no codec-object state: nothing outlives the call */
    return rc;
}

/* Where a body's pairs go as they are read: nowhere (a check), into lists, or added into acc. */
typedef struct pair_sink {
    uint64_t *idx;
    float *val;
    float *acc;
} pair_sink;

/* The message of a refusal by the readers of topk.h. */
static gcomp_result corrupt(const gcomp_topk_reader *rd, uint32_t flags, size_t cap, int why)
{
    const unsigned long long first = (unsigned long long)rd->first, k = (unsigned long long)rd->k;
    switch (why) {
    case GCOMP_TOPK_BAD_FLAGS:
        return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "topk: unknown flags 0x%x", (unsigned)flags);
    case GCOMP_TOPK_BAD_NO_K:
        return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "topk: body of %zu bytes has no k", rd->bytes);
    case GCOMP_TOPK_BAD_K_COUNT:
        return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "topk: k=%llu > count %llu", k, (unsigned long long)rd->count);
    case GCOMP_TOPK_BAD_K_CAP:
        return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "topk: k=%llu, the receiver expects at most %zu", k, cap);
    case GCOMP_TOPK_BAD_K_BYTES:
        return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "topk: k=%llu pairs do not fit in %zu bytes", k, rd->bytes);
    case GCOMP_TOPK_BAD_TRAILING:
        return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "topk: %zu bytes after the last block", rd->bytes - rd->pos);
    default:
        break;
    }
    {
        static const char *const what[] = {
            [GCOMP_TOPK_BAD_BLOCK_HEAD] = "the body ends inside its header",
            [GCOMP_TOPK_BAD_RICE] = "Rice parameter over 63",
            [GCOMP_TOPK_BAD_EXP_FIELDS] = "exponent base or width out of range",
            [GCOMP_TOPK_BAD_TOO_MANY] = "more indices than the tensor has",
            [GCOMP_TOPK_BAD_GAP] = "index out of range, or the block is truncated",
            [GCOMP_TOPK_BAD_TRUNCATED] = "the block is truncated",
            [GCOMP_TOPK_BAD_INDEX] = "index out of range",
            [GCOMP_TOPK_BAD_EXP] = "exponent out of range",
            [GCOMP_TOPK_BAD_PADDING] = "padding bits are not zero",
        };
        const char *w = why > 0 && why < (int)(sizeof what / sizeof what[0]) && what[why] ? what[why] : "malformed";
        return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "topk: block at pair %llu: %s", first, w);
    }
}

/* Reads a body (with topk.h's reader: flags, k <= count and <= cap, every block, and that the
 * body ends right after the last one) and sends each pair to out in index order. A corrupt
 * body stops at the first fault, so check with an empty sink before adding into anything
 * that must stay unchanged on error. */
static gcomp_result read_body(uint32_t flags, const uint8_t *body, size_t bytes, size_t count, size_t cap,
                              const pair_sink *out, uint64_t *k_out)
{
    gcomp_topk_reader rd;
    uint64_t bidx[GCOMP_TOPK_BLOCK];
    float bval[GCOMP_TOPK_BLOCK];
    int why = gcomp_topk_read_head(&rd, flags, body, bytes, count, cap);
    while (!why && rd.first < rd.k) {
        uint64_t first = rd.first;
        unsigned m;
        why = gcomp_topk_read_block(&rd, bidx, bval, &m);
        if (why) break;
        /* applied after parsing, in a loop of its own: the adds into acc miss the cache, and
         * many of them can then be in flight at once */
        if (out->acc) {
            for (unsigned t = 0; t < m; t++) out->acc[bidx[t]] += bval[t];
        } else if (out->idx) {
            memcpy(out->idx + first, bidx, m * sizeof *bidx);
            memcpy(out->val + first, bval, m * sizeof *bval);
        }
    }
    if (!why) why = gcomp_topk_read_end(&rd);
    if (why) return corrupt(&rd, flags, cap, why);
    *k_out = rd.k;
    return GCOMP_SUCCESS;
}

static gcomp_result topk_decode_add(const void *params, uint32_t flags, const uint8_t *body, size_t bytes, float *acc,
                                    size_t count)
{
    const pair_sink check = { NULL, NULL, NULL }, add = { NULL, NULL, acc };
    uint64_t k;
    gcomp_result rc;
    (void)params; /* the body describes itself: flags say fp16 or fp32 */
    /* read twice, so that a corrupt body never touches acc */
    rc = read_body(flags, body, bytes, count, count, &check, &k);
    return rc == GCOMP_SUCCESS ? read_body(flags, body, bytes, count, count, &add, &k) : rc;
}

gcomp_result gcomp__topk_body_pairs(uint32_t flags, const uint8_t *body, size_t bytes, size_t count, size_t cap,
                                    uint64_t *idx, float *val, size_t *k_out)
{
    const pair_sink lists = { idx, val, NULL };
    uint64_t k = 0;
    gcomp_result rc = read_body(flags, body, bytes, count, cap, &lists, &k);
    *k_out = (size_t)k;
    return rc;
}

/* Blocks of the result small enough for L1: each is summed in a local buffer and written
 * once, streamed past the cache when the result is large (as in pass 1). */
#define TOPK_SUM_BLOCK 4096

void gcomp__topk_sum_pairs(const gcomp_topk_pairs *lists, int n, float *result, size_t count, float divisor)
{
    size_t cur[GCOMP_TOPK_MAX_LISTS] = { 0 };
    const int stream = count >= TOPK_STREAM_MIN_N;
    float buf[TOPK_SUM_BLOCK];
    for (size_t b0 = 0; b0 < count; b0 += TOPK_SUM_BLOCK) {
        size_t len = count - b0 < TOPK_SUM_BLOCK ? count - b0 : TOPK_SUM_BLOCK, end = b0 + len, q = 0;
        memset(buf, 0, len * sizeof *buf);
        for (int j = 0; j < n; j++) { /* rank order: the same sums on every rank */
            const gcomp_topk_pairs *l = &lists[j];
            size_t c = cur[j];
            for (; c < l->k && l->idx[c] < end; c++) buf[l->idx[c] - b0] += l->val[c];
            cur[j] = c;
        }
        if (divisor != 1.0f) gcomp_divide_f32(buf, len, divisor);
        if (stream && ((uintptr_t)(result + b0) & 15) == 0)
            for (; q + TOPK_GROUP <= len; q += TOPK_GROUP) store_group(result + b0 + q, buf + q, 1);
        memcpy(result + b0 + q, buf + q, (len - q) * sizeof *buf);
    }
#if defined(__SSE2__)
    if (stream) _mm_sfence();
#endif
}

/* ---- the sparse gather's vtable entries (gcomp_codec.h), over the helpers above --------- */

static size_t topk_sparse_k(const void *params, size_t count) { return (size_t)gcomp_topk_k(params, count); }

static gcomp_result topk_sparse_pairs(const void *params, uint32_t flags, const uint8_t *body, size_t bytes,
                                      size_t count, size_t cap, uint64_t *idx, float *val, size_t *got)
{
    (void)params;
    return gcomp__topk_body_pairs(flags, body, bytes, count, cap, idx, val, got);
}

static gcomp_result topk_sparse_sum_pairs(const void *params, const gcomp_pair_list *lists, int n, float *result,
                                          size_t count, float divisor)
{
    gcomp_topk_pairs l[GCOMP_TOPK_MAX_LISTS];
    (void)params;
    if (n < 0 || n > GCOMP_TOPK_MAX_LISTS)
        return gcomp_codec_fail(GCOMP_ERR_INVALID_ARG, "topk: %d pair lists, at most %d", n, GCOMP_TOPK_MAX_LISTS);
    for (int j = 0; j < n; j++) {
        l[j].idx = lists[j].idx;
        l[j].val = lists[j].val;
        l[j].k = lists[j].k;
    }
    gcomp__topk_sum_pairs(l, n, result, count, divisor);
    return GCOMP_SUCCESS;
}

const gcomp_codec_vtable gcomp__codec_topk = {
    .abi_version = GCOMP_CODEC_ABI_VERSION,
    .name = "topk",
    .wire_id = GCOMP_WIRE_ID_TOPK,
    .caps = GCOMP_CAP_SPARSE,
    .params = topk_param_defs,
    .n_params = sizeof topk_param_defs / sizeof topk_param_defs[0],
    .params_size = sizeof(gcomp_topk_params),
    .state_create = topk_state_create,
    .state_destroy = topk_state_destroy,
    .max_body_bytes = topk_max_body_bytes,
    .encode = topk_encode,
    .decode_add = topk_decode_add,
    .sparse_k = topk_sparse_k,
    .sparse_pairs = topk_sparse_pairs,
    .sparse_sum_pairs = topk_sparse_sum_pairs,
    .cuda = GCOMP_CUDA_OPS(topk),
};
