/* test_cast.c — none/fp16/bf16: conversions checked exhaustively against the compiler's
 * IEEE _Float16 and an integer bf16 reference, and the codecs on odd sizes. */
#include <string.h>

#include "test_util.h"
#include "codecs/cast.h"

static float bits_to_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t float_to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* All 65536 halves: widening equals the compiler's, and narrowing gives the half back. */
static void test_f16_all_values(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        _Float16 ref;
        uint16_t h16 = (uint16_t)h;
        float f = gcomp_f16_to_f32(h16);
        memcpy(&ref, &h16, 2);
        if (isnan((float)ref)) {
            assert_true(isnan(f));
            /* NaN stays NaN, quiet bit set, payload's top bits and sign kept */
            assert_int_equal(gcomp_f32_to_f16(f), h16 | 0x0200);
            continue;
        }
        assert_int_equal(float_to_bits(f), float_to_bits((float)ref));
        assert_int_equal(gcomp_f32_to_f16(f), h16);
    }
}

/* Narrowing: every float between consecutive halves, including exact ties, rounds as the
 * compiler's round-to-nearest-even conversion does; plus a random sweep of all exponents. */
static void test_f16_rounding(void **state)
{
    uint64_t seed = 42;
    (void)state;
    for (uint32_t h = 0; h < 0x7c00; h++) {
        float lo = gcomp_f16_to_f32((uint16_t)h);
        float hi = h + 1 < 0x7c00 ? gcomp_f16_to_f32((uint16_t)(h + 1)) : 65536.0f;
        float probes[5] = { lo, (lo + hi) / 2, nextafterf((lo + hi) / 2, 0), nextafterf((lo + hi) / 2, INFINITY), hi };
        for (int k = 0; k < 5; k++) {
            for (int sign = 0; sign < 2; sign++) {
                float f = sign ? -probes[k] : probes[k];
                _Float16 ref = (_Float16)f;
                uint16_t rb;
                memcpy(&rb, &ref, 2);
                assert_int_equal(gcomp_f32_to_f16(f), rb);
            }
        }
    }
    for (int i = 0; i < 2000000; i++) {
        float f = bits_to_float((uint32_t)tu_next(&seed));
        _Float16 ref = (_Float16)f;
        uint16_t rb;
        if (isnan(f)) continue;
        memcpy(&rb, &ref, 2);
        assert_int_equal(gcomp_f32_to_f16(f), rb);
    }
    assert_int_equal(gcomp_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(gcomp_f32_to_f16(65520.0f), 0x7c00); /* overflow rounds to inf */
    assert_int_equal(gcomp_f32_to_f16(-INFINITY), 0xfc00);
}

/* Integer reference for bf16: round the low 16 bits half to even. */
static uint16_t bf16_reference(uint32_t x)
{
    uint32_t low = x & 0xffff, up = x >> 16;
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)(up | 0x40);
    if (low > 0x8000 || (low == 0x8000 && (up & 1))) up++;
    return (uint16_t)up;
}

static void test_bf16(void **state)
{
    uint64_t seed = 7;
    (void)state;
    assert_int_equal(gcomp_f32_to_bf16(bits_to_float(0x3f808000)), 0x3f80); /* tie, even stays */
    assert_int_equal(gcomp_f32_to_bf16(bits_to_float(0x3f818000)), 0x3f82); /* tie, odd rounds up */
    assert_int_equal(gcomp_f32_to_bf16(bits_to_float(0x3f808001)), 0x3f81);
    assert_int_equal(gcomp_f32_to_bf16(bits_to_float(0x3f807fff)), 0x3f80);
    assert_int_equal(gcomp_f32_to_bf16(bits_to_float(0x7f7fffff)), 0x7f80); /* max float -> inf */
    assert_int_equal(gcomp_f32_to_bf16(bits_to_float(0xff7fffff)), 0xff80);
    assert_int_equal(gcomp_f32_to_bf16(bits_to_float(0x0000ffff)), 0x0001); /* subnormal rounds up */
    assert_int_equal(gcomp_f32_to_bf16(-0.0f), 0x8000);
    assert_true(isnan(gcomp_bf16_to_f32(gcomp_f32_to_bf16(bits_to_float(0x7f800001))))); /* sNaN stays NaN */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = gcomp_bf16_to_f32((uint16_t)h);
        assert_int_equal(float_to_bits(f), h << 16);
        if (!isnan(f)) assert_int_equal(gcomp_f32_to_bf16(f), h);
    }
    for (int i = 0; i < 2000000; i++) {
        uint32_t x = (uint32_t)tu_next(&seed);
        assert_int_equal(gcomp_f32_to_bf16(bits_to_float(x)), bf16_reference(x));
    }
}

/* Codec round trip on odd sizes: none exact, fp16/bf16 equal to the scalar conversion. */
static void test_cast_codecs_roundtrip(void **state)
{
    static const size_t sizes[] = { 0, 1, 7, 1000003 };
    static const char *specs[] = { "none", "fp16", "bf16" };
    (void)state;
    for (size_t s = 0; s < 3; s++) {
        for (size_t k = 0; k < 4; k++) {
            size_t n = sizes[k], bytes;
            float *x = tu_gauss_array(n, 100 + k);
            gcomp_codec *c = tu_codec(specs[s]);
            float *y = tu_roundtrip(c, GCOMP_KEY_NONE, x, n, &bytes);
            assert_int_equal(bytes, 32 + n * (s == 0 ? 4 : 2));
            for (size_t i = 0; i < n; i++) {
                float want = s == 0   ? x[i]
                             : s == 1 ? gcomp_f16_to_f32(gcomp_f32_to_f16(x[i]))
                                      : gcomp_bf16_to_f32(gcomp_f32_to_bf16(x[i]));
                assert_int_equal(float_to_bits(y[i]), float_to_bits(want));
            }
            free(x);
            free(y);
            gcomp_codec_destroy(c);
        }
    }
}

/* Overflow to inf is counted, the result is non-finite, and the residual is not touched. */
static void test_fp16_overflow(void **state)
{
    gcomp_codec *c = tu_codec("fp16");
    float x[5] = { 1.0f, 70000.0f, -1e30f, 2.0f, 65519.0f }, r[5];
    float *y;
    gcomp_stats st;
    (void)state;
    y = tu_roundtrip(c, 3, x, 5, NULL);
    assert_true(isinf(y[1]) && y[1] > 0);
    assert_true(isinf(y[2]) && y[2] < 0);
    assert_true(y[4] == 65504.0f);
    assert_int_equal(gcomp_codec_stats_get(c, &st), GCOMP_SUCCESS);
    assert_int_equal(st.overflow_count, 2);
    assert_int_equal(st.nonfinite_calls, 1);
    assert_int_equal(gcomp_codec_residual_get(c, 3, r, 5), GCOMP_SUCCESS);
    for (int i = 0; i < 5; i++) assert_true(r[i] == 0.0f);
    free(y);
    gcomp_codec_destroy(c);
}

static void test_nonfinite_propagates(void **state)
{
    static const char *specs[] = { "none", "fp16", "bf16" };
    float x[6] = { 1.0f, NAN, 3.0f, INFINITY, -INFINITY, 0.5f };
    (void)state;
    for (int s = 0; s < 3; s++) {
        gcomp_codec *c = tu_codec(specs[s]);
        float *y = tu_roundtrip(c, 1, x, 6, NULL);
        assert_true(isnan(y[1]));
        assert_true(isinf(y[3]) && y[3] > 0);
        assert_true(isinf(y[4]) && y[4] < 0);
        assert_true(y[0] == 1.0f);
        free(y);
        gcomp_codec_destroy(c);
    }
}

static void *test_malloc_or_fail(size_t bytes)
{
    void *p = malloc(bytes);
    assert_non_null(p);
    return p;
}
static void *test_calloc_or_fail(size_t n, size_t size)
{
    void *p = calloc(n, size);
    assert_non_null(p);
    return p;
}

/* One batch of float bit patterns through the fp16 codec twice -- with the F16C instructions
 * where the CPU has them, and with the reference conversions only -- with and without a
 * residual: the same body, residual, decoded sum and non-finite/overflow counts. */
typedef struct f16_batch {
    size_t n;
    float *g, *zero, *r_hw, *r_ref, *acc_hw, *acc_ref;
    uint8_t *body_hw, *body_ref;
} f16_batch;

static void f16_encode_decode(f16_batch *b, int reference_only, int residual, uint8_t *body, float *r, float *acc,
                              gcomp_encode_ctx *ctx)
{
    size_t written = 0;
    uint32_t flags = 1;
    gcomp__cast_reference_only = reference_only;
    memset(ctx, 0, sizeof *ctx);
    assert_int_equal(gcomp__codec_fp16.encode(NULL, ctx, b->g, residual ? b->zero : NULL, residual ? r : NULL, b->n,
                                              body, 2 * b->n, &written, &flags),
                     GCOMP_SUCCESS);
    assert_int_equal(written, 2 * b->n);
    memset(acc, 0, b->n * sizeof(float));
    assert_int_equal(gcomp__codec_fp16.decode_add(NULL, flags, body, written, acc, b->n), GCOMP_SUCCESS);
    gcomp__cast_reference_only = 0;
}

static void f16_compare(f16_batch *b)
{
    for (int residual = 0; residual < 2; residual++) {
        gcomp_encode_ctx hw, ref;
        f16_encode_decode(b, 0, residual, b->body_hw, b->r_hw, b->acc_hw, &hw);
        f16_encode_decode(b, 1, residual, b->body_ref, b->r_ref, b->acc_ref, &ref);
        assert_memory_equal(b->body_hw, b->body_ref, 2 * b->n);
        assert_memory_equal(b->acc_hw, b->acc_ref, b->n * sizeof(float));
        if (residual) assert_memory_equal(b->r_hw, b->r_ref, b->n * sizeof(float));
        assert_int_equal(hw.nonfinite, ref.nonfinite);
        assert_int_equal(hw.overflow, ref.overflow);
    }
}

/* Every float (GCOMP_TEST_EXHAUSTIVE=1), or every value of the top 26 bits with the low 6 bits
 * once zero (the exact ties) and once pseudo-random; the batch length is not a multiple of 8,
 * so each batch also ends in the reference loop. Then again with MXCSR's FTZ and DAZ on. */
static void test_f16c_matches_reference(void **state)
{
    const size_t batch = ((size_t)1 << 20) + 5;
    const int exhaustive = getenv("GCOMP_TEST_EXHAUSTIVE") != NULL;
    f16_batch b = { .n = batch };
    (void)state;
    b.g = test_malloc_or_fail(batch * sizeof(float));
    b.zero = test_calloc_or_fail(batch, sizeof(float));
    b.r_hw = test_malloc_or_fail(batch * sizeof(float));
    b.r_ref = test_malloc_or_fail(batch * sizeof(float));
    b.acc_hw = test_malloc_or_fail(batch * sizeof(float));
    b.acc_ref = test_malloc_or_fail(batch * sizeof(float));
    b.body_hw = test_malloc_or_fail(2 * batch);
    b.body_ref = test_malloc_or_fail(2 * batch);
    for (int mode = 0; mode < 2; mode++) {
#if defined(__x86_64__)
        unsigned csr = __builtin_ia32_stmxcsr();
        if (mode) __builtin_ia32_ldmxcsr(csr | 0x8040u); /* FTZ | DAZ */
#else
        if (mode) break;
#endif
        for (uint64_t next = 0, end = exhaustive ? (uint64_t)1 << 32 : (uint64_t)1 << 27; next < end;) {
            b.n = end - next < batch ? (size_t)(end - next) : batch;
            for (size_t i = 0; i < b.n; i++, next++) {
                uint32_t x = exhaustive ? (uint32_t)next
                                        : (uint32_t)(next >> 1) << 6 | ((next & 1) ? gcomp_mix32((uint32_t)next) & 63u : 0);
                memcpy(&b.g[i], &x, 4);
            }
            f16_compare(&b);
        }
#if defined(__x86_64__)
        __builtin_ia32_ldmxcsr(csr);
#endif
    }
    free(b.g), free(b.zero), free(b.r_hw), free(b.r_ref), free(b.acc_hw), free(b.acc_ref), free(b.body_hw),
        free(b.body_ref);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_all_values), cmocka_unit_test(test_f16_rounding),
        cmocka_unit_test(test_bf16),           cmocka_unit_test(test_cast_codecs_roundtrip),
        cmocka_unit_test(test_fp16_overflow),  cmocka_unit_test(test_nonfinite_propagates),
        cmocka_unit_test(test_f16c_matches_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
