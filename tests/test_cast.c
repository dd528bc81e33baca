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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_all_values), cmocka_unit_test(test_f16_rounding),
        cmocka_unit_test(test_bf16),           cmocka_unit_test(test_cast_codecs_roundtrip),
        cmocka_unit_test(test_fp16_overflow),  cmocka_unit_test(test_nonfinite_propagates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
