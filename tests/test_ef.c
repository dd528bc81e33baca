/* test_ef.c — error feedback: the invariant sum(decoded) + residual = sum(inputs), residual
 * lifetime per key, non-finite steps that leave the residual untouched, save/restore. */
#include <math.h>
#include <string.h>

#include "test_util.h"

static const char *const specs[] = {
    "none",
    "fp16",
    "bf16",
    "terngrad",
    "terngrad:bucket=64",
    "terngrad:clip=2.5",
    "topk:ratio=0.01",
    "topk:ratio=0.05,values=fp16",
    "fp16+zstd",
    "terngrad+zstd",
};
#define N_SPECS (sizeof specs / sizeof specs[0])

/* Over T steps, sum of decoded + final residual equals sum of inputs up to fp32 rounding:
 * nothing the codec dropped is lost, it is only delayed. */
static void test_invariant(void **state)
{
    enum {
        N = 5003,
        T = 20
    };
    (void)state;
    for (size_t s = 0; s < N_SPECS; s++) {
        gcomp_codec *c = tu_codec(specs[s]);
        double *sum_in = calloc(N, sizeof(double)), *sum_out = calloc(N, sizeof(double));
        float r[N];
        double err = 0, scale = 0;
        for (int t = 0; t < T; t++) {
            float *g = tu_gauss_array(N, 1000 + t);
            float *y = tu_roundtrip(c, 42, g, N, NULL);
            for (int i = 0; i < N; i++) {
                sum_in[i] += g[i];
                sum_out[i] += y[i];
            }
            free(g);
            free(y);
        }
        assert_int_equal(gcomp_codec_residual_get(c, 42, r, N), GCOMP_SUCCESS);
        for (int i = 0; i < N; i++) {
            err = fmax(err, fabs(sum_out[i] + r[i] - sum_in[i]));
            scale = fmax(scale, fabs(sum_in[i]) + fabs(r[i]));
        }
        /* a few fp32 roundings of values of size `scale` per step */
        if (err > 1e-5 * scale * T) print_error("%s: err %g scale %g\n", specs[s], err, scale);
        assert_true(err <= 1e-5 * scale * T);
        free(sum_in);
        free(sum_out);
        gcomp_codec_destroy(c);
    }
}

/* Error feedback makes the running mean of a lossy codec converge to the true mean. */
static void test_ef_beats_no_ef(void **state)
{
    enum {
        N = 2000,
        T = 50
    };
    float *g = tu_gauss_array(N, 5);
    gcomp_codec *c = tu_codec("topk:ratio=0.05");
    double *acc_ef = calloc(N, sizeof(double)), *acc_no = calloc(N, sizeof(double)), e_ef = 0, e_no = 0;
    (void)state;
    for (int t = 0; t < T; t++) {
        float *a = tu_roundtrip(c, 1, g, N, NULL);
        float *b = tu_roundtrip(c, GCOMP_KEY_NONE, g, N, NULL);
        for (int i = 0; i < N; i++) {
            acc_ef[i] += a[i];
            acc_no[i] += b[i];
        }
        free(a);
        free(b);
    }
    for (int i = 0; i < N; i++) {
        e_ef += pow(acc_ef[i] / T - g[i], 2);
        e_no += pow(acc_no[i] / T - g[i], 2);
    }
    assert_true(e_ef < 0.1 * e_no);
    free(g);
    free(acc_ef);
    free(acc_no);
    gcomp_codec_destroy(c);
}

/* A NaN/Inf step decodes to non-finite values and leaves the residual exactly as it was;
 * the next finite step works normally. */
static void test_nonfinite_keeps_residual(void **state)
{
    enum {
        N = 777
    };
    (void)state;
    for (size_t s = 0; s < N_SPECS; s++) {
        gcomp_codec *c = tu_codec(specs[s]);
        float *g = tu_gauss_array(N, 9), before[N], after[N];
        float *y = tu_roundtrip(c, 5, g, N, NULL);
        int nonfinite = 0;
        free(y);
        assert_int_equal(gcomp_codec_residual_get(c, 5, before, N), GCOMP_SUCCESS);
        g[100] = (s % 2) ? INFINITY : NAN;
        y = tu_roundtrip(c, 5, g, N, NULL);
        for (int i = 0; i < N; i++) nonfinite |= !isfinite(y[i]);
        assert_true(nonfinite);
        assert_int_equal(gcomp_codec_residual_get(c, 5, after, N), GCOMP_SUCCESS);
        assert_memory_equal(before, after, sizeof before);
        free(y);
        g[100] = 0.5f;
        y = tu_roundtrip(c, 5, g, N, NULL);
        for (int i = 0; i < N; i++) assert_true(isfinite(y[i]));
        free(y);
        free(g);
        gcomp_codec_destroy(c);
    }
}

/* Residuals are per key, reset when the count changes; KEY_NONE and error_feedback=0 keep none. */
static void test_residual_lifetime(void **state)
{
    gcomp_codec *c = tu_codec("topk:k=1");
    gcomp_codec_options o = gcomp_codec_options_default();
    float x[4] = { 1, 2, 3, 4 }, r[4], r3[3], set[4] = { 10, 0, 0, 0 };
    float *y;
    (void)state;
    y = tu_roundtrip(c, 1, x, 4, NULL); /* keeps 4, residual {1,2,3,0} */
    free(y);
    assert_int_equal(gcomp_codec_residual_get(c, 1, r, 4), GCOMP_SUCCESS);
    assert_true(r[0] == 1 && r[1] == 2 && r[2] == 3 && r[3] == 0);
    y = tu_roundtrip(c, 2, x, 4, NULL); /* another key starts from zero */
    assert_true(y[3] == 4 && y[2] == 0);
    free(y);
    y = tu_roundtrip(c, 1, x, 4, NULL); /* key 1: x + r = {2,4,6,4} keeps 6 */
    assert_true(y[2] == 6 && y[3] == 0);
    free(y);
    y = tu_roundtrip(c, 1, x, 3, NULL); /* count changed: reset, so plain top-1 of {1,2,3} */
    assert_true(y[2] == 3 && y[0] == 0 && y[1] == 0);
    free(y);
    assert_int_equal(gcomp_codec_residual_get(c, 1, r, 4), GCOMP_ERR_INVALID_ARG);
    assert_int_equal(gcomp_codec_residual_get(c, 1, r3, 3), GCOMP_SUCCESS);
    /* a non-finite value is refused, and the key keeps its residual (it would make every
     * later result of the key non-finite for good) */
    {
        float bad[3] = { 1.0f, INFINITY, 2.0f }, kept[3];
        assert_int_equal(gcomp_codec_residual_set(c, 1, bad, 3), GCOMP_ERR_INVALID_ARG);
        assert_non_null(strstr(gcomp_last_error(), "element 1"));
        bad[1] = NAN;
        assert_int_equal(gcomp_codec_residual_set(c, 1, bad, 3), GCOMP_ERR_INVALID_ARG);
        /* a count past GCOMP_MAX_COUNT is refused before src is read (it was scanned first) */
        assert_int_equal(gcomp_codec_residual_set(c, 1, bad, (size_t)GCOMP_MAX_COUNT + 1), GCOMP_ERR_INVALID_ARG);
        assert_non_null(strstr(gcomp_last_error(), "GCOMP_MAX_COUNT"));
        assert_int_equal(gcomp_codec_residual_get(c, 1, kept, 3), GCOMP_SUCCESS);
        assert_memory_equal(kept, r3, sizeof kept);
    }
    /* restore from a checkpoint */
    assert_int_equal(gcomp_codec_residual_set(c, 1, set, 4), GCOMP_SUCCESS);
    y = tu_roundtrip(c, 1, x, 4, NULL); /* x + r = {11,2,3,4} keeps 11 */
    assert_true(y[0] == 11);
    free(y);
    assert_int_equal(gcomp_codec_residual_reset(c, 1), GCOMP_SUCCESS);
    assert_int_equal(gcomp_codec_residual_get(c, 1, r, 4), GCOMP_ERR_INVALID_ARG);
    y = tu_roundtrip(c, GCOMP_KEY_NONE, x, 4, NULL);
    free(y);
    assert_int_equal(gcomp_codec_residual_get(c, GCOMP_KEY_NONE, r, 4), GCOMP_ERR_INVALID_ARG);
    /* GCOMP_KEY_NONE is "no error feedback": a residual set under it would never be used */
    assert_int_equal(gcomp_codec_residual_set(c, GCOMP_KEY_NONE, set, 4), GCOMP_ERR_INVALID_ARG);
    assert_non_null(strstr(gcomp_last_error(), "GCOMP_KEY_NONE"));
    assert_int_equal(gcomp_codec_residual_get(c, GCOMP_KEY_NONE, r, 4), GCOMP_ERR_INVALID_ARG);
    gcomp_codec_destroy(c);

    o.error_feedback = 0;
    assert_int_equal(gcomp_codec_create("topk:k=1", &o, &c), GCOMP_SUCCESS);
    y = tu_roundtrip(c, 1, x, 4, NULL);
    free(y);
    assert_int_equal(gcomp_codec_residual_get(c, 1, r, 4), GCOMP_ERR_INVALID_ARG);
    /* encode ignores keys here: a residual set would be kept and read back yet never used,
     * so set and get refuse, and the next encode of the key is plain top-1 of x */
    assert_int_equal(gcomp_codec_residual_set(c, 1, set, 4), GCOMP_ERR_INVALID_ARG);
    assert_non_null(strstr(gcomp_last_error(), "error feedback off"));
    assert_int_equal(gcomp_codec_residual_get(c, 1, r, 4), GCOMP_ERR_INVALID_ARG);
    assert_non_null(strstr(gcomp_last_error(), "error feedback off"));
    y = tu_roundtrip(c, 1, x, 4, NULL);
    assert_true(y[3] == 4 && y[0] == 0);
    free(y);
    assert_int_equal(gcomp_codec_residual_reset(c, 1), GCOMP_SUCCESS); /* nothing to drop */
    gcomp_codec_destroy(c);
}

/* An encode that fails leaves the step that keys TernGrad's rounding as it was: the next
 * call gives the bytes of a codec that never made the failed one (here without a key, whose
 * step is the codec object's own, with a too-small output). */
static void test_failed_encode_keeps_step(void **state)
{
    enum {
        N = 1000
    };
    gcomp_codec *c = tu_codec("terngrad"), *fresh = tu_codec("terngrad");
    size_t cap = gcomp_codec_max_encoded_bytes(c, N), wa = 0, wb = 0;
    uint8_t *a = malloc(cap), *b = malloc(cap);
    float x[N];
    (void)state;
    for (int i = 0; i < N; i++) x[i] = sinf(0.37f * (float)i);
    assert_int_equal(gcomp_codec_encode(c, GCOMP_KEY_NONE, x, N, GCOMP_F32, a, cap / 2, &wa),
                     GCOMP_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(gcomp_codec_encode(c, GCOMP_KEY_NONE, x, N, GCOMP_F32, a, cap, &wa), GCOMP_SUCCESS);
    assert_int_equal(gcomp_codec_encode(fresh, GCOMP_KEY_NONE, x, N, GCOMP_F32, b, cap, &wb), GCOMP_SUCCESS);
    assert_int_equal(wa, wb);
    assert_memory_equal(a, b, wa);
    free(a);
    free(b);
    gcomp_codec_destroy(c);
    gcomp_codec_destroy(fresh);
}

/* Many keys: the store grows, drops keep others reachable. */
static void test_many_keys(void **state)
{
    gcomp_codec *c = tu_codec("fp16");
    float x[3] = { 0.1f, 0.2f, 0.3f }, r[3];
    (void)state;
    for (uint64_t k = 0; k < 500; k++) free(tu_roundtrip(c, k * 7919, x, 3, NULL));
    for (uint64_t k = 0; k < 500; k += 2) assert_int_equal(gcomp_codec_residual_reset(c, k * 7919), GCOMP_SUCCESS);
    for (uint64_t k = 0; k < 500; k++)
        assert_int_equal(gcomp_codec_residual_get(c, k * 7919, r, 3), k % 2 ? GCOMP_SUCCESS : GCOMP_ERR_INVALID_ARG);
    gcomp_codec_destroy(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_invariant),
        cmocka_unit_test(test_ef_beats_no_ef),
        cmocka_unit_test(test_nonfinite_keeps_residual),
        cmocka_unit_test(test_residual_lifetime),
        cmocka_unit_test(test_failed_encode_keeps_step),
        cmocka_unit_test(test_many_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
