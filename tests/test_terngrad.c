/* test_terngrad.c — TernGrad: format, unbiasedness, determinism, buckets, clipping,
 * the split encode the engine uses, and the exact integer sums of the ring. */
#include <string.h>

#include "test_util.h"
#include "codecs/terngrad.h"

static gcomp_terngrad_params params(int64_t bucket, double clip)
{
    gcomp_terngrad_params p = { bucket, clip };
    return p;
}

/* Encode through the vtable with an explicit seed/step/rank; returns the body size. */
static size_t encode_vt(const gcomp_terngrad_params *p, uint64_t seed, uint64_t step, uint32_t rank, const float *x,
                        size_t n, uint8_t *body, float *r_out, uint32_t *nonfinite)
{
    gcomp_encode_ctx ctx = { 0 };
    size_t w = 0;
    uint32_t flags = 1;
    ctx.seed = seed;
    ctx.step = step;
    ctx.rank = rank;
    assert_int_equal(gcomp__codec_terngrad.encode(p, &ctx, x, NULL, r_out, n, body,
                                                  gcomp__codec_terngrad.max_body_bytes(p, n), &w, &flags),
                     GCOMP_SUCCESS);
    assert_int_equal(flags, 0);
    if (nonfinite) *nonfinite = ctx.nonfinite;
    return w;
}

static void decode_vt(const gcomp_terngrad_params *p, const uint8_t *body, size_t w, float *acc, size_t n)
{
    assert_int_equal(gcomp__codec_terngrad.decode_add(p, 0, body, w, acc, n), GCOMP_SUCCESS);
}

/* Odd sizes, no clipping: every decoded value is -s, 0 or +s with the sign of x, s = max |x|. */
static void test_roundtrip_values(void **state)
{
    static const size_t sizes[] = { 0, 1, 7, 1000003 };
    (void)state;
    for (int k = 0; k < 4; k++) {
        size_t n = sizes[k], bytes;
        float *x = tu_gauss_array(n, 11 + k), s = 0;
        gcomp_codec *c = tu_codec("terngrad:clip=0");
        float *y = tu_roundtrip(c, GCOMP_KEY_NONE, x, n, &bytes);
        for (size_t i = 0; i < n; i++) s = fmaxf(s, fabsf(x[i]));
        assert_int_equal(bytes, 32 + (n ? 4 : 0) + (n + 3) / 4);
        for (size_t i = 0; i < n; i++) {
            assert_true(y[i] == 0.0f || y[i] == s || y[i] == -s);
            if (y[i] != 0.0f) assert_true((y[i] > 0) == (x[i] > 0));
        }
        if (n == 1) assert_true(y[0] == x[0]); /* |x| = s is always kept */
        free(x);
        free(y);
        gcomp_codec_destroy(c);
    }
}

/* E[decode] = x: the mean over T seeds is within 5 standard errors (s/2/sqrt(T)). */
static void test_unbiased(void **state)
{
    enum {
        N = 64,
        T = 4000
    };
    gcomp_terngrad_params p = params(0, 0);
    float x[N], acc[N] = { 0 };
    uint8_t body[64];
    double s = 0;
    (void)state;
    for (int i = 0; i < N; i++) x[i] = (float)((i * 37 % 64) - 31) / 31.0f * 0.8f;
    x[5] = 1.0f;
    for (int i = 0; i < N; i++) s = fmax(s, fabs(x[i]));
    for (uint64_t seed = 0; seed < T; seed++) {
        size_t w = encode_vt(&p, seed, 0, 0, x, N, body, NULL, NULL);
        decode_vt(&p, body, w, acc, N);
    }
    for (int i = 0; i < N; i++) {
        double mean = acc[i] / T, bound = 5 * s / 2 / sqrt((double)T);
        if (fabs(mean - x[i]) > bound) print_error("element %d: mean %g, x %g\n", i, mean, x[i]);
        assert_true(fabs(mean - x[i]) <= bound);
    }
}

/* Same (seed, step, rank) -> same bits; any of them changed -> different bits. */
static void test_deterministic(void **state)
{
    enum {
        N = 4096
    };
    gcomp_terngrad_params p = params(0, 0);
    float *x = tu_gauss_array(N, 5);
    uint8_t a[2048], b[2048];
    size_t w;
    (void)state;
    w = encode_vt(&p, 9, 3, 1, x, N, a, NULL, NULL);
    encode_vt(&p, 9, 3, 1, x, N, b, NULL, NULL);
    assert_memory_equal(a, b, w);
    encode_vt(&p, 10, 3, 1, x, N, b, NULL, NULL);
    assert_memory_not_equal(a, b, w);
    encode_vt(&p, 9, 4, 1, x, N, b, NULL, NULL);
    assert_memory_not_equal(a, b, w);
    encode_vt(&p, 9, 3, 2, x, N, b, NULL, NULL);
    assert_memory_not_equal(a, b, w);
    /* the RNG itself: a fixed value freezes the documented formula */
    assert_int_equal(gcomp_mix32(1), 0x688990c0u);
    assert_int_equal(gcomp_mix64(0), 0xe220a8397b1dcdafull);
    assert_true(gcomp_tg_uniform(gcomp_tg_key(0, 0, 0), 0) >= 0.0f);
    free(x);
}

/* Per-bucket scales are each bucket's max; the last bucket may be short. */
static void test_buckets(void **state)
{
    enum {
        N = 1003,
        B = 100
    };
    gcomp_terngrad_params p = params(B, 0);
    float *x = tu_gauss_array(N, 77);
    uint8_t body[2048];
    size_t w;
    (void)state;
    w = encode_vt(&p, 1, 0, 0, x, N, body, NULL, NULL);
    assert_int_equal(w, 4 * 11 + (N + 3) / 4);
    for (int j = 0; j < 11; j++) {
        float s, m = 0;
        memcpy(&s, body + 4 * j, 4);
        for (int i = j * B; i < N && i < (j + 1) * B; i++) m = fmaxf(m, fabsf(x[i]));
        assert_true(s == m);
    }
    free(x);
}

/* clip=c: scale = min(max |x|, c * rms); the fixed-order rms equals a double sum closely. */
static void test_clip(void **state)
{
    enum {
        N = 10000
    };
    gcomp_terngrad_params p = params(0, 2.5);
    float *x = tu_gauss_array(N, 3), s;
    uint8_t body[4096];
    double ss = 0, rms;
    (void)state;
    x[17] = 40.0f; /* an outlier the clip cuts */
    for (int i = 0; i < N; i++) ss += (double)x[i] * x[i];
    rms = sqrt(ss / N);
    assert_true(fabs(gcomp__tg_rms(x, NULL, N) - rms) < 1e-12 * rms);
    encode_vt(&p, 1, 0, 0, x, N, body, NULL, NULL);
    memcpy(&s, body, 4);
    assert_true(s == (float)(2.5 * gcomp__tg_rms(x, NULL, N)));
    assert_true(s < 40.0f);
    free(x);
}

/* The summation order of terngrad.h, written out as plainly as possible: every block of
 * GCOMP_TG_RMS_BLOCK zero-padded squares is summed by a halving-stride tree; the block sums are
 * added in block order within each group of GCOMP_TG_RMS_GROUP blocks, and the group sums in
 * group order. gcomp__tg_rms (with its fused, vectorised fast path) must equal it bit for bit,
 * since CUDA reproduces this order (one group per thread block there). */
static double rms_spec(const float *g, const float *r, size_t n)
{
    double total = 0, group = 0, t[GCOMP_TG_RMS_BLOCK];
    size_t in_group = 0;
    for (size_t b = 0; b < n; b += GCOMP_TG_RMS_BLOCK) {
        for (size_t k = 0; k < GCOMP_TG_RMS_BLOCK; k++) {
            float x = b + k < n ? (r ? g[b + k] + r[b + k] : g[b + k]) : 0.0f;
            t[k] = (double)x * (double)x;
        }
        for (size_t w = GCOMP_TG_RMS_BLOCK / 2; w >= 1; w /= 2)
            for (size_t k = 0; k < w; k++) t[k] = t[k] + t[k + w];
        group += t[0];
        if (++in_group == GCOMP_TG_RMS_GROUP) {
            total += group;
            group = 0;
            in_group = 0;
        }
    }
    total += group;
    return n ? sqrt(total / (double)n) : 0.0;
}

/* The order before the groups (one chain over every block): the same value up to one group. */
static double rms_one_chain(const float *g, size_t n)
{
    double total = 0, t[GCOMP_TG_RMS_BLOCK];
    for (size_t b = 0; b < n; b += GCOMP_TG_RMS_BLOCK) {
        for (size_t k = 0; k < GCOMP_TG_RMS_BLOCK; k++) {
            float x = b + k < n ? g[b + k] : 0.0f;
            t[k] = (double)x * (double)x;
        }
        for (size_t w = GCOMP_TG_RMS_BLOCK / 2; w >= 1; w /= 2)
            for (size_t k = 0; k < w; k++) t[k] = t[k] + t[k + w];
        total += t[0];
    }
    return n ? sqrt(total / (double)n) : 0.0;
}

static void test_rms_order(void **state)
{
    enum {
        N = (1 << 20) + 3
    };
    static const size_t sizes[] = { 0, 1, 255, 256, 257, 1000, 4096, 70001, 262144, 262145, 524288 + 77, N };
    const size_t group = (size_t)GCOMP_TG_RMS_BLOCK * GCOMP_TG_RMS_GROUP;
    float *g = tu_gauss_array(N, 21), *r = tu_gauss_array(N, 22);
    int differs = 0;
    (void)state;
    for (size_t i = 0; i < N; i += 97) g[i] *= 1e6f; /* wide dynamic range: order matters */
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        double a = gcomp__tg_rms(g, NULL, sizes[s]), b = rms_spec(g, NULL, sizes[s]);
        double c = gcomp__tg_rms(g, r, sizes[s]), d = rms_spec(g, r, sizes[s]);
        double e = rms_one_chain(g, sizes[s]);
        assert_memory_equal(&a, &b, sizeof a);
        assert_memory_equal(&c, &d, sizeof c);
        /* up to one group, the groups change nothing (the golden files were written before) */
        if (sizes[s] <= group)
            assert_memory_equal(&a, &e, sizeof a);
        else
            differs |= memcmp(&a, &e, sizeof a) != 0;
    }
    assert_true(differs); /* past one group the test tells the two orders apart */
    free(g);
    free(r);
}

/* The engine's split: local_scales, then encode_scaled with a larger shared scale. */
static void test_split_encode(void **state)
{
    enum {
        N = 999
    };
    gcomp_terngrad_params p = params(0, 0);
    float *x = tu_gauss_array(N, 8), scale, whole_body_scale, shared, r[N], y[N] = { 0 };
    uint8_t a[1024], b[1024];
    size_t wa, wb;
    uint32_t flags;
    gcomp_encode_ctx ctx = { 0 };
    (void)state;
    assert_int_equal(gcomp__codec_terngrad.num_scales(&p, N), 1);
    assert_int_equal(gcomp__codec_terngrad.local_scales(&p, &ctx, x, NULL, N, &scale), GCOMP_SUCCESS);
    wa = encode_vt(&p, 1, 0, 0, x, N, a, NULL, NULL);
    memcpy(&whole_body_scale, a, 4);
    assert_true(scale == whole_body_scale);
    /* with its own scale, the split encode equals the one-call encode */
    assert_int_equal(gcomp__tg_encode_scaled(&p, &ctx, x, NULL, NULL, N, &scale, b, sizeof b, &wb, &flags),
                     GCOMP_SUCCESS);
    ctx.seed = 1;
    assert_int_equal(gcomp__tg_encode_scaled(&p, &ctx, x, NULL, r, N, &scale, b, sizeof b, &wb, &flags), GCOMP_SUCCESS);
    assert_int_equal(wa, wb);
    assert_memory_equal(a, b, wa);
    /* a larger shared scale is used as given, and decode + residual = x exactly */
    shared = 2 * scale;
    assert_int_equal(gcomp__tg_encode_scaled(&p, &ctx, x, NULL, r, N, &shared, b, sizeof b, &wb, &flags),
                     GCOMP_SUCCESS);
    decode_vt(&p, b, wb, y, N);
    for (int i = 0; i < N; i++) {
        assert_true(y[i] == 0 || fabsf(y[i]) == shared);
        assert_true(fabsf(y[i] + r[i] - x[i]) <= 1e-6f * shared); /* r = x - y, rounded once */
    }
    free(x);
}

static void test_nonfinite(void **state)
{
    gcomp_terngrad_params p = params(4, 0);
    float x[12] = { 1, 2, 3, 4, 1, NAN, 1, 1, 5, 6, 7, 8 }, y[12] = { 0 };
    uint8_t body[64];
    uint32_t bad = 0;
    size_t w;
    (void)state;
    w = encode_vt(&p, 1, 0, 0, x, 12, body, NULL, &bad);
    assert_int_equal(bad, 1);
    decode_vt(&p, body, w, y, 12);
    for (int i = 4; i < 8; i++) assert_true(isnan(y[i])); /* the whole bucket, codes 0 included */
    for (int i = 0; i < 4; i++) assert_true(isfinite(y[i]));
}

/* The documented planar layout, written independently of terngrad.c: tiles of 1024 from
 * the start; a tile of m elements has q = ceil(m/4) bytes, element k in byte k%q, bits 2(k/q). */
static void pack_planar(const uint8_t *c, size_t n, uint8_t *out)
{
    memset(out, 0, (n + 3) / 4);
    for (size_t t = 0; t < n; t += GCOMP_TG_TILE) {
        size_t m = n - t < GCOMP_TG_TILE ? n - t : GCOMP_TG_TILE, q = (m + 3) / 4;
        for (size_t k = 0; k < m; k++) out[t / 4 + k % q] |= (uint8_t)(c[t + k] << (2 * (k / q)));
    }
}

/* The body's codes follow the planar layout: decode a hand-packed body. */
static void test_planar_layout(void **state)
{
    enum {
        N = 2999
    };
    gcomp_terngrad_params p = params(0, 0);
    uint8_t c[N], body[4 + (N + 3) / 4];
    float y[N] = { 0 }, s = 0.5f;
    uint64_t seed = 3;
    (void)state;
    for (int i = 0; i < N; i++) c[i] = (uint8_t)(tu_next(&seed) % 3);
    memcpy(body, &s, 4);
    pack_planar(c, N, body + 4);
    decode_vt(&p, body, sizeof body, y, N);
    for (int i = 0; i < N; i++) assert_true(y[i] == (c[i] == 1 ? 0.5f : c[i] == 2 ? -0.5f : 0.0f));
    /* and the encoder writes it: codes of a tensor with |x| = s everywhere are all kept */
    {
        float x[N], y2[N] = { 0 };
        uint8_t b2[sizeof body];
        for (int i = 0; i < N; i++) x[i] = c[i] == 2 ? -1.0f : 1.0f;
        encode_vt(&p, 1, 0, 0, x, N, b2, NULL, NULL);
        for (int i = 0; i < N; i++) c[i] = c[i] == 2 ? 2 : 1;
        pack_planar(c, N, body + 4);
        assert_memory_equal(b2 + 4, body + 4, sizeof body - 4);
        decode_vt(&p, b2, sizeof b2, y2, N);
        for (int i = 0; i < N; i++) assert_true(y2[i] == x[i]);
    }
}

/* Sums of m ranks' codes travel in ceil(log2(2m+1)) bits, hop by hop, and come back exactly. */
static void test_integer_sums(void **state)
{
    static const unsigned bits[9] = { 0, 2, 3, 3, 4, 4, 4, 4, 5 };
    enum {
        N = 1001,
        M = 9
    };
    uint64_t seed = 1;
    uint8_t codes[(N + 3) / 4], packed[2][N * 2];
    int8_t t[N], c[N];
    int16_t got[N];
    int32_t want[N] = { 0 };
    size_t bytes = 0;
    (void)state;
    for (uint32_t m = 1; m <= 8; m++) assert_int_equal(gcomp_tg_sum_bits(m), bits[m]);
    assert_int_equal(gcomp_tg_sum_bits(1000), 11);
    for (uint32_t m = 0; m < M; m++) { /* rank m adds its codes to the sums of m ranks */
        for (int i = 0; i < N; i++) c[i] = (int8_t)(tu_next(&seed) % 3);
        pack_planar((const uint8_t *)c, N, codes);
        assert_int_equal(gcomp__tg_codes_unpack(codes, sizeof codes, N, t), GCOMP_SUCCESS);
        for (int i = 0; i < N; i++) {
            int v = c[i] == 1 ? 1 : c[i] == 2 ? -1 : 0;
            assert_int_equal(t[i], v);
            want[i] += v;
        }
        assert_int_equal(gcomp__tg_sums_add_pack(packed[m & 1], bytes, m, t, N, packed[(m + 1) & 1]), GCOMP_SUCCESS);
        bytes = gcomp_tg_sum_bytes(N, m + 1);
        assert_int_equal(gcomp__tg_sums_unpack(packed[(m + 1) & 1], bytes, N, m + 1, got), GCOMP_SUCCESS);
        for (int i = 0; i < N; i++) assert_int_equal(got[i], want[i]);
    }
    /* a wrong size or an out-of-range value is rejected */
    assert_int_equal(gcomp__tg_sums_unpack(packed[M & 1], bytes - 1, N, M, got), GCOMP_ERR_CORRUPT);
    packed[M & 1][0] |= 0x1f; /* 5 bits hold 0..31; 31 > 2*9 */
    assert_int_equal(gcomp__tg_sums_unpack(packed[M & 1], bytes, N, M, got), GCOMP_ERR_CORRUPT);
    assert_int_equal(gcomp__tg_sums_add_pack(packed[M & 1], bytes, M, t, N, packed[0]), GCOMP_ERR_CORRUPT);
    /* the tail (n not a multiple of 8) takes the bit-by-bit path: check it alone */
    assert_int_equal(gcomp__tg_sums_add_pack(NULL, 0, 0, t, 5, packed[0]), GCOMP_SUCCESS);
    assert_int_equal(gcomp__tg_sums_unpack(packed[0], gcomp_tg_sum_bytes(5, 1), 5, 1, got), GCOMP_SUCCESS);
    for (int i = 0; i < 5; i++) assert_int_equal(got[i], t[i]);
    codes[0] |= 3; /* code 3 is invalid */
    assert_int_equal(gcomp__tg_codes_unpack(codes, sizeof codes, N, t), GCOMP_ERR_CORRUPT);
}

/* The packed sums byte for byte against the documented format written the plainest way
 * (terngrad.h: digits d = sum + m of base L = 2m + 1, g per group, group i holding
 * sum_j d_{ig+j} L^j in bits(L^g) bits, the last group bits(L^r), LSB first). `bad_group`
 * >= 0 replaces that group's code by L^g, which fits its width but is invalid. */
static void put_bits(uint8_t *out, size_t *pos, uint64_t v, unsigned w)
{
    for (unsigned b = 0; b < w; b++, (*pos)++)
        if ((v >> b) & 1u) out[*pos / 8] |= (uint8_t)(1u << (*pos % 8));
}

static void pack_plain(const int32_t *sum, size_t n, uint32_t m, uint8_t *out, long bad_group)
{
    unsigned g = gcomp_tg_sum_group(m);
    uint64_t L = 2ull * m + 1;
    size_t pos = 0;
    memset(out, 0, (size_t)gcomp_tg_sum_bytes(n, m));
    for (size_t i = 0; i < n; i += g) {
        unsigned k = n - i < g ? (unsigned)(n - i) : g;
        uint64_t code = 0, lim = 1;
        for (unsigned j = 0; j < k; j++, lim *= L) code += (uint64_t)(sum[i + j] + (int32_t)m) * lim;
        if ((long)(i / g) == bad_group) code = lim;
        put_bits(out, &pos, code, gcomp_tg_bits_below(lim));
    }
    assert_int_equal((pos + 7) / 8, gcomp_tg_sum_bytes(n, m));
}

/* Group sizes and sizes of the format, worked by hand. */
static void test_sums_format(void **state)
{
    static const unsigned groups[] = { 0, 5, 3, 1, 2, 2, 1, 1, 1 };
    (void)state;
    for (uint32_t m = 1; m <= 8; m++) assert_int_equal(gcomp_tg_sum_group(m), groups[m]);
    assert_int_equal(gcomp_tg_sum_group(127), 1);
    assert_int_equal(gcomp_tg_sum_group(1000), 1);
    assert_int_equal(gcomp_tg_sum_bytes(240, 1), 48);  /* 48 groups of 5 in 8 bits */
    assert_int_equal(gcomp_tg_sum_bytes(7, 1), 2);     /* 8 bits + 2 digits in bits(9) = 4 */
    assert_int_equal(gcomp_tg_sum_bytes(240, 2), 70);  /* 80 groups of 3 in 7 bits */
    assert_int_equal(gcomp_tg_sum_bytes(240, 4), 105); /* 120 groups of 2 in 7 bits */
    assert_int_equal(gcomp_tg_sum_bytes(240, 3), 90);  /* plain 3 bits */
    assert_int_equal(gcomp_tg_sum_bytes(1, 1000), 2);  /* 11 bits */
    assert_int_equal(gcomp_tg_sum_bytes(0, 4), 0);
    { /* a hop to 32768 ranks would leave int16: refused */
        uint8_t in[2] = { 0, 0 }, out[4];
        int8_t t1 = 0;
        assert_int_equal(gcomp__tg_sums_add_pack(in, (size_t)gcomp_tg_sum_bytes(1, 32767), 32767, &t1, 1, out),
                         GCOMP_ERR_UNSUPPORTED);
    }
    /* sums of N ranks are the widest of a ring of N (the engine sizes its slots by them) */
    for (uint32_t m = 1; m < 140; m++)
        for (uint64_t n = 0; n < 500; n++) assert_true(gcomp_tg_sum_bytes(n, m) <= gcomp_tg_sum_bytes(n, m + 1));
    for (uint32_t m = 1; m <= 130; m++)
        for (uint64_t bytes = 0; bytes < 300; bytes += 7) {
            uint64_t n = gcomp_tg_sums_fit(bytes, m);
            assert_true(gcomp_tg_sum_bytes(n, m) <= bytes);
            assert_true(gcomp_tg_sum_bytes(n + 1, m) > bytes);
        }
}

/* Every m up to 140 (all group sizes, blocks and tails, sums past 8 bits) for n elements,
 * against pack_plain; every buffer handed to the library is exactly sized, so ASan sees any
 * access past the end. */
static void check_sums_wire_bytes(int N)
{
    enum {
        NMAX = 4099,
        M = 140
    };
    uint64_t seed = 5;
    static uint8_t packed[2][NMAX * 2], want[NMAX * 2], bad[NMAX * 2];
    int8_t t[NMAX];
    int32_t sum[NMAX] = { 0 };
    int16_t got[NMAX];
    static float value[2 * M + 1], vals_bad[NMAX];
    size_t bytes = 0;
    assert_true(N <= NMAX);
    for (uint32_t m = 0; m < M; m++) {
        uint32_t mo = m + 1;
        uint64_t lg = gcomp_tg_sum_pow(mo, gcomp_tg_sum_group(mo));
        for (int i = 0; i < N; i++) {
            t[i] = (int8_t)((int)(tu_next(&seed) % 3) - 1);
            sum[i] += t[i];
        }
        uint8_t *in = m ? malloc(bytes) : NULL, *out = malloc(gcomp_tg_sum_bytes(N, mo));
        if (m) memcpy(in, packed[m & 1], bytes);
        assert_int_equal(gcomp__tg_sums_add_pack(in, bytes, m, t, N, out), GCOMP_SUCCESS);
        bytes = gcomp_tg_sum_bytes(N, mo);
        memcpy(packed[mo & 1], out, bytes);
        pack_plain(sum, N, mo, want, -1);
        assert_memory_equal(out, want, bytes);
        assert_int_equal(gcomp__tg_sums_unpack(out, bytes, N, mo, got), GCOMP_SUCCESS);
        for (int i = 0; i < N; i++) assert_int_equal(got[i], sum[i]);
        /* straight to values: a distinct value per possible sum, so any digit slip shows */
        for (uint32_t k = 0; k < 2 * mo + 1; k++) value[k] = (float)k * 0.37f - 1e3f;
        float *vals = malloc((size_t)N * sizeof *vals);
        assert_int_equal(gcomp__tg_sums_values(out, bytes, N, mo, value, vals), GCOMP_SUCCESS);
        for (int i = 0; i < N; i++) assert_true(vals[i] == value[sum[i] + (int32_t)mo]);
        free(vals);
        free(in);
        free(out);
        /* an invalid code (L^g, if the width holds it) in a full block, and in the tail, is
         * rejected by both functions */
        if (lg < (1ull << gcomp_tg_bits_below(lg)))
            for (int where = 0; where < 2 && N >= 240; where++) {
                long grp = where ? (long)(((size_t)N - 1) / 240 * 240 / gcomp_tg_sum_group(mo)) : 3;
                pack_plain(sum, N, mo, bad, grp);
                assert_int_equal(gcomp__tg_sums_unpack(bad, bytes, N, mo, got), GCOMP_ERR_CORRUPT);
                assert_int_equal(gcomp__tg_sums_values(bad, bytes, N, mo, value, vals_bad), GCOMP_ERR_CORRUPT);
                assert_int_equal(gcomp__tg_sums_add_pack(bad, bytes, mo, t, N, packed[m & 1]), GCOMP_ERR_CORRUPT);
            }
    }
}

/* n with a partial last block, and n a whole number of blocks: the last full block is where
 * the block path's 8-byte loads and stores must stop at the buffer's end. */
static void test_sums_wire_bytes(void **state)
{
    (void)state;
    check_sums_wire_bytes(4099);
    check_sums_wire_bytes(17 * 240);
    check_sums_wire_bytes(240);
}

/* The engine's direct ternarisation gives the codes encode_scaled packs, and the same
 * residual. */
static void test_ternarise_matches_encode(void **state)
{
    enum {
        N = 5003
    };
    static const int64_t buckets[] = { 0, 1024, 4 };
    float *x = tu_gauss_array(N, 31), *r = tu_gauss_array(N, 32), ra[N], rb[N], scales[N];
    static uint8_t body[4 * N + N];
    int8_t ta[N], tb[N];
    (void)state;
    for (size_t bi = 0; bi < sizeof buckets / sizeof buckets[0]; bi++) {
        gcomp_terngrad_params p = params(buckets[bi], 2.5);
        gcomp_encode_ctx ctx = { 0 };
        size_t nb = gcomp__codec_terngrad.num_scales(&p, N), w;
        uint32_t flags;
        ctx.seed = 7;
        ctx.step = 3;
        ctx.rank = 2;
        ctx.offset = ((uint64_t)1 << 32) - 1000; /* crosses a salt boundary */
        assert_int_equal(gcomp__codec_terngrad.local_scales(&p, &ctx, x, r, N, scales), GCOMP_SUCCESS);
        for (size_t j = 0; j < nb; j++) scales[j] *= 1.25f; /* a larger shared scale, as from another rank */
        assert_int_equal(gcomp__tg_encode_scaled(&p, &ctx, x, r, ra, N, scales, body, sizeof body, &w, &flags),
                         GCOMP_SUCCESS);
        if (buckets[bi] == 0) { /* one bucket: tiles from element 0 */
            assert_int_equal(gcomp__tg_codes_unpack(body + 4 * nb, (N + 3) / 4, N, ta), GCOMP_SUCCESS);
        } else {
            for (size_t a = 0; a < N; a += (size_t)buckets[bi]) {
                size_t len = N - a < (size_t)buckets[bi] ? N - a : (size_t)buckets[bi];
                assert_int_equal(gcomp__tg_codes_unpack(body + 4 * nb + a / 4, (len + 3) / 4, len, ta + a),
                                 GCOMP_SUCCESS);
            }
        }
        assert_int_equal(gcomp__tg_ternarise(&p, &ctx, x, r, rb, N, scales, tb), GCOMP_SUCCESS);
        assert_memory_equal(ta, tb, N);
        assert_memory_equal(ra, rb, sizeof ra);
    }
    free(x);
    free(r);
}

static void test_corrupt_codes(void **state)
{
    gcomp_terngrad_params p = params(0, 0);
    float x[5] = { 1, -1, 0.5f, 0.25f, 1 }, y[5];
    uint8_t body[64];
    size_t w;
    (void)state;
    w = encode_vt(&p, 1, 0, 0, x, 5, body, NULL, NULL);
    body[4] |= 3; /* code 3 is invalid */
    assert_int_equal(gcomp__codec_terngrad.decode_add(&p, 0, body, w, y, 5), GCOMP_ERR_CORRUPT);
    body[4] &= (uint8_t)~3;
    body[5] |= 0x10; /* a code beyond the last element */
    assert_int_equal(gcomp__codec_terngrad.decode_add(&p, 0, body, w, y, 5), GCOMP_ERR_CORRUPT);
    body[5] &= 0x03;
    {
        float neg = -1.0f;
        memcpy(body, &neg, 4);
        assert_int_equal(gcomp__codec_terngrad.decode_add(&p, 0, body, w, y, 5), GCOMP_ERR_CORRUPT);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_values),
        cmocka_unit_test(test_unbiased),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_buckets),
        cmocka_unit_test(test_clip),
        cmocka_unit_test(test_rms_order),
        cmocka_unit_test(test_split_encode),
        cmocka_unit_test(test_nonfinite),
        cmocka_unit_test(test_integer_sums),
        cmocka_unit_test(test_sums_format),
        cmocka_unit_test(test_sums_wire_bytes),
        cmocka_unit_test(test_ternarise_matches_encode),
        cmocka_unit_test(test_corrupt_codes),
        cmocka_unit_test(test_planar_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
