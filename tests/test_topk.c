/* test_topk.c — top-k: selection against a sort-based reference (every path of the radix
 * select: sampled guess, pass 2, digit passes over the data, ties), the wire format read by an
 * independent bit-by-bit parser, error feedback, NaN/Inf, fp16 values, the bit-stream helpers,
 * and corrupted bodies. */
#include <string.h>

#include "test_util.h"

#include "codecs/common.h"
#include "codecs/topk.h"
#include "gcomp_codec.h"

static const gcomp_codec_vtable *const vt = &gcomp__codec_topk;

static uint32_t bits_of(float f)
{
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

static float float_of(uint32_t b)
{
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

static uint32_t key_of(float f) { return gcomp_topk_key(bits_of(f)); }

static gcomp_topk_params params(double ratio, int64_t k, int fp16)
{
    gcomp_topk_params p = { ratio, k, fp16 };
    return p;
}

/* ---- reference selection: a full sort ---------------------------------------------------- */

static const float *ref_x;

static int cmp_key_desc(const void *a, const void *b)
{
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    uint32_t ki = key_of(ref_x[i]), kj = key_of(ref_x[j]);
    if (ki != kj) return ki > kj ? -1 : 1;
    return i < j ? -1 : i > j;
}

static int cmp_index(const void *a, const void *b)
{
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    return i < j ? -1 : i > j;
}

/* The k kept indices in increasing order (caller frees). */
static size_t *ref_select(const float *x, size_t n, size_t k)
{
    size_t *order = malloc((n ? n : 1) * sizeof *order);
    for (size_t i = 0; i < n; i++) order[i] = i;
    ref_x = x;
    qsort(order, n, sizeof *order, cmp_key_desc);
    qsort(order, k, sizeof *order, cmp_index);
    return order;
}

/* ---- an independent reader and writer of the body, one bit at a time ----------------------- */

static uint64_t get_bits(const uint8_t *p, size_t bit, unsigned w)
{
    uint64_t v = 0;
    for (unsigned b = 0; b < w; b++, bit++) v |= (uint64_t)(p[bit / 8] >> (bit % 8) & 1) << b;
    return v;
}

static void put_bits(uint8_t *p, size_t bit, uint64_t v, unsigned w)
{
    for (unsigned b = 0; b < w; b++, bit++)
        if (v >> b & 1) p[bit / 8] |= (uint8_t)(1u << (bit % 8));
}

static unsigned bit_len(uint64_t v)
{
    unsigned w = 0;
    for (; v; v >>= 1) w++;
    return w;
}

/* The documented Rice parameter: fewest bits over b = 0 .. bit length of the largest gap,
 * the smallest b on ties, counted here the slow way. */
static unsigned ref_rice_param(const uint64_t *gaps, unsigned m)
{
    uint64_t maxgap = 0, best_bits = UINT64_MAX;
    unsigned best = 0;
    for (unsigned j = 0; j < m; j++) maxgap = gaps[j] > maxgap ? gaps[j] : maxgap;
    for (unsigned b = 0; b <= bit_len(maxgap) && b <= 63; b++) {
        uint64_t bits = 0;
        for (unsigned j = 0; j < m; j++) bits += (gaps[j] >> b) + 1 + b;
        if (bits < best_bits) best_bits = bits, best = b;
    }
    return best;
}

typedef struct parsed {
    uint64_t k;
    uint64_t *idx;  /* k indices */
    uint32_t *vals; /* k raw values: fp32 bits or fp16 bits */
} parsed;

/* Parses a body that must be well formed and written by the documented encoder choices
 * (asserts both). */
static void parse_body(const uint8_t *body, size_t bytes, uint32_t flags, size_t n, parsed *out)
{
    const int fp16 = (flags & GCOMP_TOPK_FLAG_FP16) != 0;
    const unsigned ebits = fp16 ? 5 : 8, mbits = fp16 ? 10 : 23;
    size_t pos = 8;
    uint64_t next = 0;
    assert_true(bytes >= 8);
    out->k = get_bits(body, 0, 64);
    assert_true(out->k <= n);
    out->idx = malloc((out->k + 1) * sizeof *out->idx);
    out->vals = malloc((out->k + 1) * sizeof *out->vals);
    for (uint64_t j = 0; j < out->k; j += GCOMP_TOPK_BLOCK) {
        unsigned m = out->k - j < GCOMP_TOPK_BLOCK ? (unsigned)(out->k - j) : GCOMP_TOPK_BLOCK;
        unsigned b, e0, ew, emin = 255, emax = 0;
        uint64_t gaps[GCOMP_TOPK_BLOCK];
        size_t bit = 0;
        assert_true(pos + 3 <= bytes);
        b = body[pos], e0 = body[pos + 1], ew = body[pos + 2];
        pos += 3;
        assert_true(b <= 63 && ew <= ebits);
        for (unsigned t = 0; t < m; t++) {
            uint64_t q = 0, sign, off, mant;
            while (get_bits(body + pos, bit++, 1)) q++; /* q ones, then a zero */
            gaps[t] = q << b | get_bits(body + pos, bit, b);
            bit += b;
            sign = get_bits(body + pos, bit, 1);
            off = get_bits(body + pos, bit + 1, ew);
            mant = get_bits(body + pos, bit + 1 + ew, mbits);
            bit += 1 + ew + mbits;
            out->idx[j + t] = next + gaps[t];
            next = out->idx[j + t] + 1;
            assert_true(out->idx[j + t] < n);
            out->vals[j + t] = (uint32_t)(sign << (ebits + mbits) | (e0 + off) << mbits | mant);
            emin = (unsigned)(e0 + off) < emin ? (unsigned)(e0 + off) : emin;
            emax = (unsigned)(e0 + off) > emax ? (unsigned)(e0 + off) : emax;
        }
        assert_true(pos + (bit + 7) / 8 <= bytes);
        if (bit % 8) assert_int_equal(body[pos + bit / 8] >> (bit % 8), 0); /* zero padding */
        pos += (bit + 7) / 8;
        /* the encoder's choices */
        assert_int_equal(b, ref_rice_param(gaps, m));
        assert_int_equal(e0, emin);
        assert_int_equal(ew, bit_len(emax - emin));
    }
    assert_int_equal(pos, bytes);
}

static void parsed_free(parsed *p)
{
    free(p->idx);
    free(p->vals);
}

/* ---- direct calls -------------------------------------------------------------------------- */

typedef struct enc {
    uint8_t *body;
    size_t bytes;
    uint32_t flags;
    gcomp_encode_ctx ctx;
} enc;

static void encode_direct(const gcomp_topk_params *p, const float *g, const float *r_in, float *r_out, size_t n, enc *e)
{
    size_t cap = vt->max_body_bytes(p, n);
    memset(e, 0, sizeof *e);
    e->body = malloc(cap);
    e->flags = 0xdeadu;
    assert_int_equal(vt->encode(p, &e->ctx, g, r_in, r_out, n, e->body, cap, &e->bytes, &e->flags), GCOMP_SUCCESS);
    assert_true(e->bytes <= cap);
    assert_int_equal(e->flags, p->values ? GCOMP_TOPK_FLAG_FP16 : 0);
}

/* What decode yields for raw wire value v. */
static float decoded(uint32_t v, int fp16) { return fp16 ? gcomp_f16_to_f32((uint16_t)v) : float_of(v); }

/* Encodes x = g (+ r) every way (r_out separate, r_out aliasing r_in, no r_out) and checks
 * the selection against the reference, the values, the residual and decode_add. */
static void check_encode(const gcomp_topk_params *p, const float *g, const float *r, size_t n)
{
    const int fp16 = p->values == 1;
    const uint64_t k = gcomp_topk_k(p, n);
    float *x = malloc((n ? n : 1) * sizeof *x), *r_out = malloc((n ? n : 1) * sizeof *x);
    float *acc = malloc((n ? n : 1) * sizeof *x), *dec = calloc(n ? n : 1, sizeof *x);
    char *kept = calloc(n ? n : 1, 1);
    size_t *ref;
    uint64_t overflow = 0;
    int nonfinite = 0;
    enc e, e2;
    parsed pb;

    for (size_t i = 0; i < n; i++) {
        x[i] = r ? g[i] + r[i] : g[i];
        nonfinite |= key_of(x[i]) >= 0x7f800000u;
        r_out[i] = 12345.0f;
    }
    ref = ref_select(x, n, (size_t)k);
    encode_direct(p, g, r, r_out, n, &e);

    parse_body(e.body, e.bytes, e.flags, n, &pb);
    assert_int_equal(pb.k, k);
    for (uint64_t j = 0; j < k; j++) {
        size_t i = (size_t)pb.idx[j];
        if (pb.idx[j] != ref[j])
            print_error("n=%zu k=%llu: kept[%llu] = %llu, reference %zu\n", n, (unsigned long long)k,
                        (unsigned long long)j, (unsigned long long)pb.idx[j], ref[j]);
        assert_int_equal(pb.idx[j], ref[j]);
        assert_int_equal(pb.vals[j], fp16 ? gcomp_f32_to_f16(x[i]) : bits_of(x[i]));
        kept[i] = 1;
        dec[i] = decoded(pb.vals[j], fp16);
        overflow += key_of(x[i]) < 0x7f800000u && isinf(dec[i]);
    }
    assert_int_equal(e.ctx.overflow, overflow);
    assert_int_equal(e.ctx.nonfinite, nonfinite || overflow);

    /* residual: x where unkept, x - decoded where kept (undefined after a non-finite input) */
    if (!nonfinite && !e.ctx.overflow) {
        for (size_t i = 0; i < n; i++) {
            assert_int_equal(bits_of(r_out[i]), bits_of(kept[i] ? x[i] - dec[i] : x[i]));
            if (!fp16) assert_int_equal(bits_of(dec[i] + r_out[i]), bits_of(x[i] + 0.0f));
        }
    }

    /* decode_add adds exactly the kept values */
    for (size_t i = 0; i < n; i++) acc[i] = (float)(i % 7) - 3.0f;
    assert_int_equal(vt->decode_add(p, e.flags, e.body, e.bytes, acc, n), GCOMP_SUCCESS);
    for (size_t i = 0; i < n; i++) {
        float want = (float)(i % 7) - 3.0f;
        if (kept[i]) want += dec[i];
        assert_int_equal(bits_of(acc[i]), bits_of(want));
    }

    /* the same body without r_out, and with r_out aliasing r_in */
    encode_direct(p, g, r, NULL, n, &e2);
    assert_int_equal(e2.bytes, e.bytes);
    assert_memory_equal(e2.body, e.body, e.bytes);
    free(e2.body);
    if (r) {
        float *rr = malloc(n * sizeof *rr);
        memcpy(rr, r, n * sizeof *rr);
        encode_direct(p, g, rr, rr, n, &e2);
        assert_int_equal(e2.bytes, e.bytes);
        assert_memory_equal(e2.body, e.body, e.bytes);
        if (!nonfinite && !e.ctx.overflow)
            for (size_t i = 0; i < n; i++) assert_int_equal(bits_of(rr[i]), bits_of(r_out[i]));
        free(e2.body);
        free(rr);
    }

    parsed_free(&pb);
    free(e.body);
    free(ref);
    free(x);
    free(r_out);
    free(acc);
    free(dec);
    free(kept);
}

/* check_encode for fp32 and fp16 values, without and with a residual. */
static void check_all(const gcomp_topk_params *p, const float *g, size_t n, uint64_t seed)
{
    float *r = malloc((n ? n : 1) * sizeof *r);
    gcomp_topk_params q = *p;
    for (size_t i = 0; i < n; i++) r[i] = 0.1f * tu_gauss(&seed);
    for (q.values = 0; q.values <= 1; q.values++) {
        check_encode(&q, g, NULL, n);
        check_encode(&q, g, r, n);
    }
    free(r);
}

/* ---- tests ------------------------------------------------------------------------------- */

static void test_vtable(void **state)
{
    gcomp_topk_params p;
    (void)state;
    assert_string_equal(vt->name, "topk");
    assert_int_equal(vt->wire_id, GCOMP_WIRE_ID_TOPK);
    assert_int_equal(vt->caps, GCOMP_CAP_SPARSE);
    assert_int_equal(vt->abi_version, GCOMP_CODEC_ABI_VERSION);
    assert_int_equal(vt->params_size, sizeof p);
    assert_int_equal(vt->n_params, 3);
    assert_string_equal(vt->params[0].name, "ratio");
    assert_int_equal(vt->params[0].offset, offsetof(gcomp_topk_params, ratio));
    assert_true(vt->params[0].def == 0.01 && vt->params[0].min == 1e-6 && vt->params[0].max == 1);
    assert_string_equal(vt->params[1].name, "k");
    assert_int_equal(vt->params[1].type, GCOMP_PARAM_INT);
    assert_true(vt->params[1].def == 0 && vt->params[1].max == 4611686018427387904.0);
    assert_string_equal(vt->params[2].name, "values");
    assert_string_equal(vt->params[2].choices[1], "fp16");
    assert_null(vt->params[2].choices[2]);
    assert_non_null(vt->encode);
    assert_non_null(vt->decode_add);
    assert_non_null(vt->sparse_pairs);
    assert_non_null(vt->sparse_sum_pairs);
    assert_null(vt->stage_encode);
    assert_ptr_equal(gcomp_codec_find("topk"), vt);
    /* the wire id is its own: a clash would keep a built-in codec out of the registry */
    assert_ptr_equal(gcomp_codec_find_id(GCOMP_WIRE_ID_TOPK), vt);
    assert_non_null(gcomp_codec_find("zstd"));
}

static void test_k_rule(void **state)
{
    gcomp_topk_params p = params(0.01, 0, 0);
    (void)state;
    assert_int_equal(gcomp_topk_k(&p, 0), 0);
    assert_int_equal(gcomp_topk_k(&p, 1), 1);
    assert_int_equal(gcomp_topk_k(&p, 1000), 10);
    assert_int_equal(gcomp_topk_k(&p, 1001), 11); /* ceil */
    p.ratio = 1e-6;
    assert_int_equal(gcomp_topk_k(&p, 7), 1);
    p.ratio = 1;
    assert_int_equal(gcomp_topk_k(&p, 7), 7);
    p.k = 5;
    p.ratio = 0.5;
    assert_int_equal(gcomp_topk_k(&p, 1000), 5); /* k overrides ratio */
    assert_int_equal(gcomp_topk_k(&p, 3), 3);    /* clamped to n */
    p.k = INT64_C(1) << 62;
    assert_int_equal(gcomp_topk_k(&p, 123), 123);
}

static void test_gauss(void **state)
{
    static const size_t ns[] = { 1, 2, 7, 17, 1000, 65536, 1000003 };
    (void)state;
    for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
        size_t n = ns[t];
        float *g = tu_gauss_array(n, 100 + t);
        gcomp_topk_params ps[] = { params(0.01, 0, 0), params(1e-6, 0, 0), params(0.3, 0, 0),
                                   params(1, 0, 0),    params(0.01, 1, 0), params(0.01, 129, 0) };
        for (size_t j = 0; j < sizeof ps / sizeof ps[0]; j++) check_all(&ps[j], g, n, 7 * t + j);
        free(g);
    }
}

static void test_empty(void **state)
{
    gcomp_topk_params p = params(0.01, 0, 0);
    float acc[3] = { 1, 2, 3 };
    enc e;
    (void)state;
    assert_int_equal(vt->max_body_bytes(&p, 0), 8);
    encode_direct(&p, NULL, NULL, NULL, 0, &e);
    assert_int_equal(e.bytes, 8);
    assert_int_equal(gcomp_load_u64(e.body), 0);
    assert_int_equal(vt->decode_add(&p, e.flags, e.body, e.bytes, acc, 0), GCOMP_SUCCESS);
    assert_int_equal(vt->decode_add(&p, e.flags, e.body, e.bytes, acc, 3), GCOMP_SUCCESS);
    assert_true(acc[0] == 1 && acc[1] == 2 && acc[2] == 3);
    free(e.body);
}

/* Many equal magnitudes of both signs: the ties go to the lowest indices. */
static void test_ties(void **state)
{
    static const size_t ns[] = { 7, 1000, 1000003 };
    static const float vals[] = { -1, 0, 1, 2, -2, -0.0f };
    (void)state;
    for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
        size_t n = ns[t];
        uint64_t seed = 5 + t;
        float *g = malloc(n * sizeof *g);
        gcomp_topk_params ps[] = { params(0.01, 0, 0), params(0.2, 0, 0),  params(0.5, 0, 0),
                                   params(1, 0, 0),    params(0.01, 1, 0), params(0.01, 3, 0) };
        for (size_t i = 0; i < n; i++) g[i] = vals[tu_next(&seed) % 6];
        for (size_t j = 0; j < sizeof ps / sizeof ps[0]; j++) {
            check_encode(&ps[j], g, NULL, n);
            ps[j].values = 1;
            check_encode(&ps[j], g, NULL, n);
        }
        free(g);
    }
}

static void test_all_equal(void **state)
{
    static const size_t ns[] = { 1, 7, 1000, 1000003 };
    static const float vals[] = { 1.5f, 0.0f };
    (void)state;
    for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
        size_t n = ns[t];
        float *g = malloc(n * sizeof *g);
        gcomp_topk_params ps[] = { params(0.01, 1, 0), params(0.01, 3, 0), params(0.5, 0, 0), params(1, 0, 0),
                                   params(0.01, 0, 1) };
        for (size_t v = 0; v < 3; v++) {
            /* all 1.5, all 0, and +-1.5 alternating (equal keys, both signs) */
            for (size_t i = 0; i < n; i++) g[i] = v < 2 ? vals[v] : (i & 1 ? -1.5f : 1.5f);
            for (size_t j = 0; j < sizeof ps / sizeof ps[0]; j++) check_encode(&ps[j], g, NULL, n);
        }
        free(g);
    }
}

/* Mostly zeros with fewer nonzeros than k: every nonzero plus the first zeros are kept. */
static void test_sparse_input(void **state)
{
    static const size_t ns[] = { 1000, 1000003 };
    (void)state;
    for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
        size_t n = ns[t];
        uint64_t seed = 77;
        float *g = calloc(n, sizeof *g);
        gcomp_topk_params ps[] = { params(0.01, 0, 0), params(0.001, 0, 0), params(0.1, 0, 0) };
        for (size_t i = 0; i < n; i++)
            if (tu_uniform(&seed) < 0.005) g[i] = tu_gauss(&seed);
        for (size_t j = 0; j < sizeof ps / sizeof ps[0]; j++) check_all(&ps[j], g, n, j);
        free(g);
    }
}

/* Data that misleads the strided sample the encoder takes (every (n / 8192)-th element):
 * the selection must not depend on it. Large values exactly where the sample looks make the
 * guessed threshold too high; tiny values there make it too low (the candidate list overflows).
 * Should the sampler change, these remain plain correctness tests. */
static void test_misleading_sample(void **state)
{
    const size_t n = (size_t)1 << 20, stride = n / 8192;
    float *g = tu_gauss_array(n, 31);
    gcomp_topk_params ps[] = { params(0.05, 0, 0), params(0.01, 0, 0) };
    (void)state;
    for (size_t i = 0; i < n; i += stride) g[i] *= 10.0f;
    for (size_t j = 0; j < sizeof ps / sizeof ps[0]; j++) check_encode(&ps[j], g, NULL, n);
    for (size_t i = 0; i < n; i += stride) g[i] *= 1e-4f;
    for (size_t j = 0; j < sizeof ps / sizeof ps[0]; j++) check_encode(&ps[j], g, NULL, n);
    free(g);
}

/* NaN and Inf are the largest keys: kept whenever k reaches them, and flagged. */
static void test_nonfinite(void **state)
{
    const size_t n = 100003;
    float *g = tu_gauss_array(n, 9), *acc = calloc(n, sizeof *acc);
    gcomp_topk_params p = params(0.001, 0, 0);
    enc e;
    (void)state;
    g[70000] = INFINITY; /* alone first: one non-finite element is enough to flag */
    for (p.values = 0; p.values <= 1; p.values++) check_all(&p, g, n, 3);
    g[5] = NAN;
    g[99999] = -INFINITY;
    for (p.values = 0; p.values <= 1; p.values++) check_all(&p, g, n, 3);

    p.values = 0;
    encode_direct(&p, g, NULL, NULL, n, &e);
    assert_int_equal(e.ctx.nonfinite, 1);
    assert_int_equal(vt->decode_add(&p, e.flags, e.body, e.bytes, acc, n), GCOMP_SUCCESS);
    assert_true(isnan(acc[5]));
    assert_true(isinf(acc[70000]) && acc[70000] > 0);
    assert_true(isinf(acc[99999]) && acc[99999] < 0);
    free(e.body);

    /* k = 1: NaN beats Inf */
    p.k = 1;
    encode_direct(&p, g, NULL, NULL, n, &e);
    assert_int_equal(gcomp_load_u64(e.body), 1);
    memset(acc, 0, n * sizeof *acc);
    assert_int_equal(vt->decode_add(&p, e.flags, e.body, e.bytes, acc, n), GCOMP_SUCCESS);
    assert_true(isnan(acc[5]));
    assert_true(acc[70000] == 0);
    free(e.body);
    free(g);
    free(acc);
}

/* fp16 values: finite values past 65504 become inf, are counted, and flag the call. */
static void test_fp16_overflow(void **state)
{
    const size_t n = 1000;
    float *g = tu_gauss_array(n, 4), *acc = calloc(n, sizeof *acc);
    gcomp_topk_params p = params(0.01, 0, 1);
    enc e;
    (void)state;
    g[10] = 1e5f;
    g[20] = -70000.0f;
    g[30] = 65504.0f; /* the largest half: no overflow */
    encode_direct(&p, g, NULL, NULL, n, &e);
    assert_int_equal(e.ctx.overflow, 2);
    assert_int_equal(e.ctx.nonfinite, 1);
    assert_int_equal(vt->decode_add(&p, e.flags, e.body, e.bytes, acc, n), GCOMP_SUCCESS);
    assert_true(isinf(acc[10]) && acc[10] > 0);
    assert_true(isinf(acc[20]) && acc[20] < 0);
    assert_true(acc[30] == 65504.0f);
    free(e.body);

    g[10] = g[20] = 1.0f;
    encode_direct(&p, g, NULL, NULL, n, &e);
    assert_int_equal(e.ctx.overflow, 0);
    assert_int_equal(e.ctx.nonfinite, 0);
    free(e.body);
    free(g);
    free(acc);
}

/* The bit-stream helpers against the bit-by-bit reference: fields of every width, Rice gaps
 * with every parameter (long unary runs included), and the encoder's Rice choice against the
 * slow one. */
static void test_bitstream(void **state)
{
    uint64_t seed = 1;
    uint8_t out[4096], ref[4096];
    (void)state;
    for (int round = 0; round < 200; round++) {
        gcomp_bitwriter bw = { out, 0, 0, 0 };
        gcomp_bitreader br;
        uint64_t v[64], gaps[64];
        unsigned w[64], b[64];
        size_t bit = 0, bytes;
        memset(ref, 0, sizeof ref);
        for (unsigned j = 0; j < 64; j++) {
            uint64_t r = tu_next(&seed);
            w[j] = (unsigned)(r % 33);
            v[j] = w[j] ? tu_next(&seed) >> (64 - w[j]) : 0;
            b[j] = (unsigned)(tu_next(&seed) % 64);
            gaps[j] = tu_next(&seed) >> (r >> 40 & 63); /* any size */
            if ((gaps[j] >> b[j]) > 300) gaps[j] = (gaps[j] & ((UINT64_C(1) << b[j]) - 1)) | (UINT64_C(299) << b[j]);
            gcomp_bits_put(&bw, v[j], w[j]);
            gcomp_topk_put_gap(&bw, gaps[j], b[j]);
            put_bits(ref, bit, v[j], w[j]);
            bit += w[j];
            for (uint64_t q = gaps[j] >> b[j]; q; q--) put_bits(ref, bit++, 1, 1);
            bit++; /* the zero */
            put_bits(ref, bit, gaps[j], b[j]);
            bit += b[j];
        }
        bytes = gcomp_bits_flush(&bw);
        assert_int_equal(bytes, (bit + 7) / 8);
        assert_memory_equal(out, ref, bytes);
        br = (gcomp_bitreader){ out, 0, bytes, 0, 0 };
        for (unsigned j = 0; j < 64; j++) {
            uint64_t got = 0, gap = 0;
            assert_true(gcomp_bits_get(&br, w[j], &got));
            assert_int_equal(got, v[j]);
            assert_true(gcomp_topk_get_gap(&br, b[j], UINT64_MAX, &gap));
            assert_int_equal(gap, gaps[j]);
        }
        /* past the end: only padding is left */
        {
            uint64_t got;
            assert_false(gcomp_bits_get(&br, 9, &got));
        }
    }
    /* a gap whose quotient reaches qmax is refused before the run of ones ends */
    {
        gcomp_bitwriter bw = { out, 0, 0, 0 };
        gcomp_bitreader br;
        uint64_t gap;
        gcomp_topk_put_gap(&bw, 1000, 0);
        br = (gcomp_bitreader){ out, 0, gcomp_bits_flush(&bw), 0, 0 };
        assert_false(gcomp_topk_get_gap(&br, 0, 1000, &gap));
        br = (gcomp_bitreader){ out, 0, bw.pos, 0, 0 };
        assert_true(gcomp_topk_get_gap(&br, 0, 1001, &gap));
        assert_int_equal(gap, 1000);
        br = (gcomp_bitreader){ out, 0, bw.pos - 1, 0, 0 }; /* the zero is cut off */
        assert_false(gcomp_topk_get_gap(&br, 0, UINT64_MAX, &gap));
    }
    /* the Rice choice */
    for (int round = 0; round < 300; round++) {
        uint64_t gaps[GCOMP_TOPK_BLOCK];
        unsigned m = 1 + (unsigned)(tu_next(&seed) % GCOMP_TOPK_BLOCK), shift = (unsigned)(tu_next(&seed) % 64);
        for (unsigned j = 0; j < m; j++)
            gaps[j] = round % 3 == 0 ? (uint64_t)(-100.0 * log(1.0 - tu_uniform(&seed))) : tu_next(&seed) >> shift;
        assert_int_equal(gcomp_topk_rice_param(gaps, m), ref_rice_param(gaps, m));
    }
    assert_int_equal(gcomp_topk_width(0), 0);
    assert_int_equal(gcomp_topk_width(1), 1);
    assert_int_equal(gcomp_topk_width(255), 8);
    assert_int_equal(gcomp_topk_width(256), 9);
    assert_int_equal(gcomp_topk_width(~UINT64_C(0)), 64);
}

/* ---- hand-made bodies ------------------------------------------------------------------------ */

typedef struct body {
    uint8_t *p;
    size_t n;
} body;

/* A body of k fp32 values 1, 2, 3, ... (exponent base 0, offsets of 8 bits) whose gaps are
 * Rice coded with the given parameter of each block of 128; gaps[] may hold any 64-bit values
 * whose quotient stays small. */
static body make_body(uint64_t k, const uint64_t *gaps, const unsigned *rice)
{
    size_t nblocks = (size_t)((k + 127) / 128), size = 8, pos = 8;
    body b;
    for (size_t blk = 0; blk < nblocks; blk++) {
        size_t m = k - blk * 128 < 128 ? (size_t)(k - blk * 128) : 128, bits = 0;
        for (size_t t = 0; t < m; t++) bits += (size_t)(gaps[blk * 128 + t] >> rice[blk]) + 1 + rice[blk] + 32;
        size += 3 + (bits + 7) / 8;
    }
    b.p = calloc(size, 1);
    b.n = size;
    gcomp_store_u64(b.p, k);
    for (size_t blk = 0; blk < nblocks; blk++) {
        size_t m = k - blk * 128 < 128 ? (size_t)(k - blk * 128) : 128, bit = 0;
        unsigned r = rice[blk];
        b.p[pos] = (uint8_t)r, b.p[pos + 1] = 0, b.p[pos + 2] = 8;
        pos += 3;
        for (size_t t = 0; t < m; t++) {
            uint64_t gap = gaps[blk * 128 + t], v = bits_of((float)(blk * 128 + t + 1));
            for (uint64_t q = gap >> r; q; q--) put_bits(b.p + pos, bit++, 1, 1);
            bit++;
            put_bits(b.p + pos, bit, gap, r);
            bit += r;
            put_bits(b.p + pos, bit, v >> 31, 1);
            put_bits(b.p + pos, bit + 1, v >> 23 & 0xff, 8);
            put_bits(b.p + pos, bit + 9, v & 0x7fffff, 23);
            bit += 32;
        }
        pos += (bit + 7) / 8;
    }
    assert_int_equal(pos, size);
    return b;
}

/* decode_add must fail with CORRUPT and leave acc alone; the body is copied into a buffer of
 * exactly its size so that a sanitizer sees any read past it. */
static void expect_corrupt(const uint8_t *p, size_t bytes, uint32_t flags, size_t n)
{
    gcomp_topk_params q = params(0.01, 0, 0);
    size_t m = n < 100000 ? n : 100000; /* a huge n is claimed, never reached */
    uint8_t *copy = malloc(bytes ? bytes : 1);
    float *acc = malloc((m ? m : 1) * sizeof *acc);
    gcomp_result rc;
    if (bytes) memcpy(copy, p, bytes);
    for (size_t i = 0; i < m; i++) acc[i] = (float)i;
    rc = vt->decode_add(&q, flags, copy, bytes, acc, n);
    if (rc != GCOMP_ERR_CORRUPT) print_error("%zu bytes, flags 0x%x, n %zu: rc %d\n", bytes, flags, n, rc);
    assert_int_equal(rc, GCOMP_ERR_CORRUPT);
    assert_non_null(strstr(gcomp_last_error(), "topk"));
    for (size_t i = 0; i < m; i++) assert_true(acc[i] == (float)i);
    free(copy);
    free(acc);
}

/* Gaps up to 2^64 - 1 are legal fields (Rice parameter 63); one that overflows the running
 * index must be caught even though prev + 1 + gap wraps around to a small number. */
static void test_huge_gaps(void **state)
{
    uint64_t gaps[3] = { 5, 7, 0 };
    unsigned r63[1] = { 63 };
    float acc[20] = { 0 };
    body b = make_body(3, gaps, r63);
    gcomp_topk_params q = params(0.01, 0, 0);
    (void)state;
    assert_int_equal(vt->decode_add(&q, 0, b.p, b.n, acc, 20), GCOMP_SUCCESS);
    assert_true(acc[5] == 1 && acc[13] == 2 && acc[14] == 3 && acc[0] == 0 && acc[6] == 0);
    free(b.p);

    gaps[1] = ~UINT64_C(0) - 3; /* 5 + 1 + gap wraps to 2 */
    b = make_body(3, gaps, r63);
    expect_corrupt(b.p, b.n, 0, 20);
    free(b.p);
    gaps[0] = ~UINT64_C(0);
    b = make_body(3, gaps, r63);
    expect_corrupt(b.p, b.n, 0, 20);
    free(b.p);

    /* a quotient that would wrap: with b = 63, q = 2 makes q << 63 overflow to 0, leaving gap 5
     * (a valid index) unless the decoder bounds q first; q = 0 is the same pair, valid */
    for (unsigned quot = 0; quot <= 2; quot++) {
        float few[20] = { 0 };
        uint8_t wrap[8 + 3 + 13] = { 0 };
        size_t bit = quot + 1;
        gcomp_store_u64(wrap, 1);
        wrap[8] = 63, wrap[9] = 0, wrap[10] = 8;
        put_bits(wrap + 11, 0, (UINT64_C(1) << quot) - 1, quot + 1); /* quot ones, then a zero */
        put_bits(wrap + 11, bit, 5, 63);
        put_bits(wrap + 11, bit + 64, 127, 8); /* sign 0 at bit + 63, exponent 127: 1.0f */
        if (quot == 0) {
            assert_int_equal(vt->decode_add(&q, 0, wrap, sizeof wrap - 1, few, 20), GCOMP_SUCCESS);
            assert_true(few[5] == 1.0f);
        } else {
            expect_corrupt(wrap, sizeof wrap, 0, 20);
        }
    }

    /* a long unary run (b = 0): fine when the index fits, refused when it does not */
    {
        uint64_t far[2] = { 1000, 3 };
        unsigned r0[1] = { 0 };
        float big[1100] = { 0 };
        b = make_body(2, far, r0);
        assert_int_equal(vt->decode_add(&q, 0, b.p, b.n, big, 1100), GCOMP_SUCCESS);
        assert_true(big[1000] == 1 && big[1004] == 2);
        expect_corrupt(b.p, b.n, 0, 1004);
        expect_corrupt(b.p, b.n, 0, 1000);
        expect_corrupt(b.p, b.n, 0, 999);
        free(b.p);
    }

    /* wide gap fields: truncations land inside and between the blocks */
    {
        uint64_t zeros[200] = { 0 };
        unsigned wide[2] = { 63, 63 };
        float all[200] = { 0 };
        b = make_body(200, zeros, wide);
        assert_int_equal(vt->decode_add(&q, 0, b.p, b.n, all, 200), GCOMP_SUCCESS);
        for (size_t i = 0; i < 200; i++) assert_true(all[i] == (float)(i + 1));
        for (size_t len = 0; len < b.n; len++) expect_corrupt(b.p, len, 0, 200);
        free(b.p);
    }
}

/* Keys one above a large tie: once the first tied elements have filled the quota, the scan
 * for the rest must still find the next float up wherever it is. */
static void test_next_float(void **state)
{
    static const size_t ns[] = { 1000, 1000003 };
    const float up = nextafterf(1.0f, 2.0f);
    (void)state;
    for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
        size_t n = ns[t];
        float *g = calloc(n, sizeof *g);
        gcomp_topk_params p = params(0.01, 8, 0);
        for (size_t i = 0; i < n * 9 / 10; i++) g[i] = i & 1 ? -1.0f : 1.0f;
        g[n / 2 + 1] = up;
        g[n * 19 / 20] = -up;
        g[n - 1] = up;
        check_encode(&p, g, NULL, n);
        free(g);
    }
}

static void test_corrupt_fields(void **state)
{
    uint64_t gaps[300] = { 0 };
    unsigned rice[3] = { 3, 0, 9 };
    body b;
    float acc[400];
    gcomp_topk_params q = params(0.01, 0, 0);
    (void)state;

    /* a valid multi-block body first: 300 indices 0, 1, ..., with block 2's gaps at b = 9 */
    b = make_body(300, gaps, rice);
    memset(acc, 0, sizeof acc);
    assert_int_equal(vt->decode_add(&q, 0, b.p, b.n, acc, 300), GCOMP_SUCCESS);
    assert_true(acc[0] == 1 && acc[299] == 300);

    expect_corrupt(b.p, b.n, 0, 299); /* k > n */
    expect_corrupt(b.p, b.n, 2, 300); /* unknown flag bits */
    expect_corrupt(b.p, b.n, 0x80000000u, 300);
    expect_corrupt(b.p, b.n, GCOMP_TOPK_FLAG_FP16, 300); /* fp16: an offset width of 8 > 5 */
    b.p[8] = 64;                                         /* Rice parameter > 63 */
    expect_corrupt(b.p, b.n, 0, 300);
    b.p[8] = 255;
    expect_corrupt(b.p, b.n, 0, 300);
    b.p[8] = 3;
    b.p[10] = 9; /* offset width > 8 */
    expect_corrupt(b.p, b.n, 0, 300);
    b.p[10] = 8;
    b.p[9] = 250; /* 1.0f's exponent 127 + 250 > 255 */
    expect_corrupt(b.p, b.n, 0, 300);
    b.p[9] = 0;
    {
        uint8_t *longer = calloc(b.n + 1, 1); /* trailing byte */
        memcpy(longer, b.p, b.n);
        expect_corrupt(longer, b.n + 1, 0, 300);
        free(longer);
    }
    free(b.p);

    /* index >= n: the last gap pushes past the end */
    gaps[299] = 1;
    b = make_body(300, gaps, rice);
    expect_corrupt(b.p, b.n, 0, 300);
    memset(acc, 0, sizeof acc);
    assert_int_equal(vt->decode_add(&q, 0, b.p, b.n, acc, 301), GCOMP_SUCCESS);
    assert_true(acc[300] == 300 && acc[299] == 0);
    free(b.p);

    /* one pair: 33 bits, so 7 padding bits that must be zero */
    b = make_body(1, gaps, rice + 1);
    assert_int_equal(b.n, 8 + 3 + 5);
    memset(acc, 0, sizeof acc);
    assert_int_equal(vt->decode_add(&q, 0, b.p, b.n, acc, 10), GCOMP_SUCCESS);
    assert_true(acc[0] == 1);
    b.p[b.n - 1] |= 0x80;
    expect_corrupt(b.p, b.n, 0, 10);
    free(b.p);

    /* k larger than the bytes could hold (3 pairs need at least 75 bits), and k past count */
    b.n = 16;
    b.p = calloc(16, 1);
    gcomp_store_u64(b.p, 3);
    expect_corrupt(b.p, b.n, 0, 10);
    gcomp_store_u64(b.p, UINT64_C(1) << 62);
    expect_corrupt(b.p, b.n, 0, SIZE_MAX / 1024); /* acc is never touched */
    gcomp_store_u64(b.p, ~UINT64_C(0));
    expect_corrupt(b.p, b.n, 0, 10);
    free(b.p);
    expect_corrupt((const uint8_t *)"", 0, 0, 10); /* no k at all */
}

/* Every truncation of valid bodies (fp32 and fp16, one and several blocks) is CORRUPT. */
static void test_truncations(void **state)
{
    const size_t n = 5000;
    float *g = tu_gauss_array(n, 12);
    gcomp_topk_params ps[] = { params(0.01, 0, 0), params(0.1, 0, 1), params(0.01, 1, 0) };
    (void)state;
    for (size_t j = 0; j < sizeof ps / sizeof ps[0]; j++) {
        enc e;
        encode_direct(&ps[j], g, NULL, NULL, n, &e);
        for (size_t len = 0; len < e.bytes; len++) expect_corrupt(e.body, len, e.flags, n);
        free(e.body);
    }
    free(g);
}

/* A buffer one byte short fails and leaves r_out untouched, even when it aliases r_in. */
static void test_buffer_too_small(void **state)
{
    const size_t n = 100000;
    float *g = tu_gauss_array(n, 13), *r = tu_gauss_array(n, 14), *r0 = malloc(n * sizeof *r0);
    gcomp_topk_params p = params(0.01, 0, 0);
    gcomp_encode_ctx ctx = { 0 };
    size_t need, w = 0;
    uint32_t flags;
    uint8_t *buf;
    float *r1 = malloc(n * sizeof *r1);
    enc e;
    (void)state;
    encode_direct(&p, g, r, r1, n, &e); /* the reference body and residual, ample buffer */
    need = e.bytes;
    buf = malloc(need);
    memcpy(r0, r, n * sizeof *r);
    assert_int_equal(vt->encode(&p, &ctx, g, r, r, n, buf, need - 1, &w, &flags), GCOMP_ERR_BUFFER_TOO_SMALL);
    assert_non_null(strstr(gcomp_last_error(), "topk"));
    assert_memory_equal(r, r0, n * sizeof *r);
    /* exactly enough: the same body, and the residual of a normal call */
    assert_int_equal(vt->encode(&p, &ctx, g, r, r, n, buf, need, &w, &flags), GCOMP_SUCCESS);
    assert_int_equal(w, need);
    assert_memory_equal(buf, e.body, need);
    assert_memory_equal(r, r1, n * sizeof *r);
    assert_int_equal(vt->encode(&p, &ctx, NULL, NULL, NULL, 0, buf, 7, &w, &flags), GCOMP_ERR_BUFFER_TOO_SMALL);
    free(e.body);
    free(r1);
    free(buf);
    free(g);
    free(r);
    free(r0);
}

/* Through the public API: spec parsing, header, residual kept per key. */
/* The engine's sparse gather sums payloads as pair lists (gcomp__topk_sum_pairs): the result
 * must equal zeroing and calling decode_add for each payload in order, bit for bit,
 * including elements kept by 3+ payloads (where the order of the sums matters), -0 values,
 * fp16 values, a streamed large result and an unaligned small one. */
static void check_sum_pairs(size_t n, int fp16, int lists, size_t misalign)
{
    gcomp_topk_params p = params(0.02, 0, fp16);
    size_t k = (size_t)gcomp_topk_k(&p, n);
    float *base = tu_gauss_array(n, 40), *want = calloc(n, sizeof *want);
    float *got_mem = malloc((n + 4) * sizeof *got_mem), *got = got_mem + misalign;
    gcomp_topk_pairs pl[5];
    uint64_t *idx[5];
    float *val[5];
    assert_true(lists <= 5);
    for (int j = 0; j < lists; j++) {
        float *g = tu_gauss_array(n, 50 + (uint64_t)j);
        enc e;
        size_t got_k = 0;
        /* a shared large component, so ranks keep many of the same elements */
        for (size_t i = 0; i < n; i++) g[i] = 4.0f * base[i] + g[i] * (float)(j + 1) * 0.37f;
        g[7] = j % 2 ? -0.0f : 1e30f; /* -0 and huge: an order-sensitive sum at element 7 */
        encode_direct(&p, g, NULL, NULL, n, &e);
        assert_int_equal(vt->decode_add(&p, e.flags, e.body, e.bytes, want, n), GCOMP_SUCCESS);
        idx[j] = malloc(k * sizeof *idx[j]);
        val[j] = malloc(k * sizeof *val[j]);
        assert_int_equal(gcomp__topk_body_pairs(e.flags, e.body, e.bytes, n, k, idx[j], val[j], &got_k), GCOMP_SUCCESS);
        assert_int_equal(got_k, k);
        if (k > 1)
            assert_int_equal(gcomp__topk_body_pairs(e.flags, e.body, e.bytes, n, k - 1, idx[j], val[j], &got_k),
                             GCOMP_ERR_CORRUPT); /* more pairs than the receiver expects */
        pl[j].idx = idx[j];
        pl[j].val = val[j];
        pl[j].k = k;
        free(e.body);
        free(g);
    }
    memset(got, 0xff, n * sizeof *got); /* NaN garbage: every element must be written */
    gcomp__topk_sum_pairs(pl, lists, got, n, 1.0f);
    assert_memory_equal(got, want, n * sizeof *got);
    for (float d = 3.0f; d <= 4.0f; d += 1.0f) { /* AVG: divided, or times 1/4, bit for bit as dividing */
        memset(got, 0xff, n * sizeof *got);
        gcomp__topk_sum_pairs(pl, lists, got, n, d);
        for (size_t i = 0; i < n; i++) {
            float w = want[i] / d;
            assert_memory_equal(&got[i], &w, sizeof w);
        }
    }
    for (int j = 0; j < lists; j++) {
        free(idx[j]);
        free(val[j]);
    }
    free(base);
    free(want);
    free(got_mem);
}

/* gcomp_divide_f32 equals x / d bit for bit: powers of two take the reciprocal path, others
 * divide; subnormal results, signed zeros, infinities, NaN and the largest floats included. */
static void test_divide_f32(void **state)
{
    static const float d[] = { 1, 2, 3, 4, 5, 7, 8, 1024, 6, 0.5f };
    float edge[] = { 0.0f,           -0.0f,    1e-45f,    -1e-45f, 3e-39f, 1.17549435e-38f, 1.5e-38f, 3.4028235e38f,
                     -3.4028235e38f, INFINITY, -INFINITY, NAN,     1.0f,   -7.0f,           0.1f };
    size_t ne = sizeof edge / sizeof edge[0], n = ne + 1000;
    float *x = tu_gauss_array(n, 77), *y = malloc(n * sizeof *y);
    (void)state;
    memcpy(x, edge, sizeof edge);
    for (size_t i = ne; i < n; i++) x[i] = ldexpf(x[i], (int)(i % 300) - 150); /* many exponents */
    for (size_t k = 0; k < sizeof d / sizeof d[0]; k++) {
        memcpy(y, x, n * sizeof *y);
        gcomp_divide_f32(y, n, d[k]);
        for (size_t i = 0; i < n; i++) {
            float w = x[i] / d[k];
            assert_memory_equal(&y[i], &w, sizeof w);
        }
    }
    free(x);
    free(y);
}

static void test_sum_pairs(void **state)
{
    (void)state;
    check_sum_pairs(10007, 0, 3, 1);
    check_sum_pairs(10007, 1, 5, 0);
    check_sum_pairs(4099, 0, 1, 3);
    check_sum_pairs((size_t)1 << 22 | 5, 0, 4, 0); /* large enough to be streamed */
}

static void test_public_api(void **state)
{
    const size_t n = 300007;
    gcomp_codec *c = tu_codec("topk:ratio=0.01");
    float *g1 = tu_gauss_array(n, 21), *g2 = tu_gauss_array(n, 22), *res = malloc(n * sizeof *res);
    float *x = malloc(n * sizeof *x), *y;
    size_t bytes, *ref, k = 3001;
    (void)state;
    assert_string_equal(gcomp_codec_spec(c), "topk:ratio=0.01,k=0,values=fp32");
    assert_true(gcomp_codec_max_encoded_bytes(c, n) >= GCOMP_HEADER_BYTES + 8 + 4 * k);

    /* step 1: nothing to add yet */
    y = tu_roundtrip(c, 7, g1, n, &bytes);
    ref = ref_select(g1, n, k);
    for (size_t j = 0, i = 0; i < n; i++) {
        int kept = j < k && ref[j] == i;
        assert_int_equal(bits_of(y[i]), bits_of(kept ? g1[i] : 0.0f));
        j += kept;
    }
    assert_int_equal(gcomp_codec_residual_get(c, 7, res, n), GCOMP_SUCCESS);
    for (size_t i = 0; i < n; i++) assert_int_equal(bits_of(y[i] + res[i]), bits_of(g1[i] + 0.0f));
    free(ref);
    free(y);

    /* step 2: x = g2 + residual, and again decoded + residual == x */
    for (size_t i = 0; i < n; i++) x[i] = g2[i] + res[i];
    y = tu_roundtrip(c, 7, g2, n, &bytes);
    ref = ref_select(x, n, k);
    for (size_t j = 0; j < k; j++) assert_int_equal(bits_of(y[ref[j]]), bits_of(x[ref[j]]));
    assert_int_equal(gcomp_codec_residual_get(c, 7, res, n), GCOMP_SUCCESS);
    for (size_t i = 0; i < n; i++) assert_int_equal(bits_of(y[i] + res[i]), bits_of(x[i] + 0.0f));
    free(ref);
    free(y);
    gcomp_codec_destroy(c);

    /* fp16 values through the API: the same indices, 13 mantissa bits less per value and a
     * narrower exponent offset */
    c = tu_codec("topk:k=10");
    y = tu_roundtrip(c, GCOMP_KEY_NONE, g1, n, &bytes);
    free(y);
    gcomp_codec_destroy(c);
    c = tu_codec("topk:k=10,values=fp16");
    y = tu_roundtrip(c, GCOMP_KEY_NONE, g1, n, &k);
    assert_true(k + 16 <= bytes);
    ref = ref_select(g1, n, 10);
    for (size_t j = 0; j < 10; j++)
        assert_int_equal(bits_of(y[ref[j]]), bits_of(gcomp_f16_to_f32(gcomp_f32_to_f16(g1[ref[j]]))));
    free(ref);
    free(y);
    gcomp_codec_destroy(c);
    free(g1);
    free(g2);
    free(res);
    free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vtable),
        cmocka_unit_test(test_k_rule),
        cmocka_unit_test(test_bitstream),
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_gauss),
        cmocka_unit_test(test_ties),
        cmocka_unit_test(test_all_equal),
        cmocka_unit_test(test_sparse_input),
        cmocka_unit_test(test_misleading_sample),
        cmocka_unit_test(test_next_float),
        cmocka_unit_test(test_nonfinite),
        cmocka_unit_test(test_fp16_overflow),
        cmocka_unit_test(test_huge_gaps),
        cmocka_unit_test(test_corrupt_fields),
        cmocka_unit_test(test_truncations),
        cmocka_unit_test(test_buffer_too_small),
        cmocka_unit_test(test_sum_pairs),
        cmocka_unit_test(test_divide_f32),
        cmocka_unit_test(test_public_api),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
