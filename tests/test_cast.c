/* test_cast.c — none/fp16/bf16: conversions checked exhaustively against an independent
 * IEEE half (the compiler's _Float16, or x86's F16C instructions where the compiler has no
 * _Float16 -- clang 14 on x86) and an integer bf16 reference, and the codecs on odd sizes. */
#define _GNU_SOURCE /* feenableexcept */
#include <fenv.h>
#include <string.h>

#include "test_util.h"
#include "codecs/cast.h"
#include "codecs/common.h"

/* ---- the independent half (the tests that use it run in round-to-nearest: the compiler's
 * _Float16 follows the caller's mode, F16C's conversion is told to round to nearest) ---- */
#if defined(__FLT16_MANT_DIG__)
static int ref_available(void) { return 1; }
static uint16_t ref_narrow(float f)
{
    _Float16 h = (_Float16)f;
    uint16_t b;
    memcpy(&b, &h, 2);
    return b;
}
static float ref_widen(uint16_t b)
{
    _Float16 h;
    memcpy(&h, &b, 2);
    return (float)h;
}
#elif defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
static int ref_available(void)
{
    unsigned a, b, c, d;
    /* "avx": the CPU has it and the OS saves its registers, which F16C's encoding needs */
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
__attribute__((target("f16c"))) static uint16_t ref_narrow(float f)
{
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}
__attribute__((target("f16c"))) static float ref_widen(uint16_t b) { return _cvtsh_ss(b); }
#else
static int ref_available(void) { return 0; }
static uint16_t ref_narrow(float f) { return (void)f, 0; }
static float ref_widen(uint16_t b) { return (void)b, 0.0f; }
#endif

/* Skips the calling test where neither reference exists. */
#define NEED_REF()                                                                               \
    do {                                                                                         \
        if (!ref_available()) {                                                                  \
            print_message("no independent half here (no _Float16, no F16C): comparison skipped\n"); \
            skip();                                                                              \
        }                                                                                        \
    } while (0)


/* All 65536 halves: widening equals the independent half's, and narrowing gives the half back. */
static void test_f16_all_values(void **state)
{
    (void)state;
    NEED_REF();
    for (uint32_t h = 0; h < 65536; h++) {
        uint16_t h16 = (uint16_t)h;
        float f = gcomp_f16_to_f32(h16), ref = ref_widen(h16);
        if (isnan(ref)) {
            assert_true(isnan(f));
            /* NaN stays NaN, quiet bit set, payload's top bits and sign kept */
            assert_int_equal(gcomp_f32_to_f16(f), h16 | 0x0200);
            continue;
        }
        assert_int_equal(gcomp_f32_bits(f), gcomp_f32_bits(ref));
        assert_int_equal(gcomp_f32_to_f16(f), h16);
    }
}

/* Narrowing: every float between consecutive halves, including exact ties, rounds as the
 * independent half's round-to-nearest-even conversion does; plus a random sweep of all exponents. */
static void test_f16_rounding(void **state)
{
    uint64_t seed = 42;
    (void)state;
    NEED_REF();
    for (uint32_t h = 0; h < 0x7c00; h++) {
        float lo = gcomp_f16_to_f32((uint16_t)h);
        float hi = h + 1 < 0x7c00 ? gcomp_f16_to_f32((uint16_t)(h + 1)) : 65536.0f;
        float probes[5] = { lo, (lo + hi) / 2, nextafterf((lo + hi) / 2, 0), nextafterf((lo + hi) / 2, INFINITY), hi };
        for (int k = 0; k < 5; k++) {
            for (int sign = 0; sign < 2; sign++) {
                float f = sign ? -probes[k] : probes[k];
                assert_int_equal(gcomp_f32_to_f16(f), ref_narrow(f));
            }
        }
    }
    for (int i = 0; i < 2000000; i++) {
        float f = gcomp_bits_f32((uint32_t)tu_next(&seed));
        if (isnan(f)) continue;
        assert_int_equal(gcomp_f32_to_f16(f), ref_narrow(f));
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
    assert_int_equal(gcomp_f32_to_bf16(gcomp_bits_f32(0x3f808000)), 0x3f80); /* tie, even stays */
    assert_int_equal(gcomp_f32_to_bf16(gcomp_bits_f32(0x3f818000)), 0x3f82); /* tie, odd rounds up */
    assert_int_equal(gcomp_f32_to_bf16(gcomp_bits_f32(0x3f808001)), 0x3f81);
    assert_int_equal(gcomp_f32_to_bf16(gcomp_bits_f32(0x3f807fff)), 0x3f80);
    assert_int_equal(gcomp_f32_to_bf16(gcomp_bits_f32(0x7f7fffff)), 0x7f80); /* max float -> inf */
    assert_int_equal(gcomp_f32_to_bf16(gcomp_bits_f32(0xff7fffff)), 0xff80);
    assert_int_equal(gcomp_f32_to_bf16(gcomp_bits_f32(0x0000ffff)), 0x0001); /* subnormal rounds up */
    assert_int_equal(gcomp_f32_to_bf16(-0.0f), 0x8000);
    assert_true(isnan(gcomp_bf16_to_f32(gcomp_f32_to_bf16(gcomp_bits_f32(0x7f800001))))); /* sNaN stays NaN */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = gcomp_bf16_to_f32((uint16_t)h);
        assert_int_equal(gcomp_f32_bits(f), h << 16);
        if (!isnan(f)) assert_int_equal(gcomp_f32_to_bf16(f), h);
    }
    for (int i = 0; i < 2000000; i++) {
        uint32_t x = (uint32_t)tu_next(&seed);
        assert_int_equal(gcomp_f32_to_bf16(gcomp_bits_f32(x)), bf16_reference(x));
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
                assert_int_equal(gcomp_f32_bits(y[i]), gcomp_f32_bits(want));
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
    void *p = malloc(bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}

/* MXCSR modes the F16C comparisons run in: the four rounding modes, and round-to-nearest with
 * flush-to-zero and denormals-are-zero. */
static const unsigned mxcsr_modes[] = { 0x0000u, 0x2000u, 0x4000u, 0x6000u, 0x8040u };
#define N_MXCSR_MODES (sizeof mxcsr_modes / sizeof mxcsr_modes[0])

static unsigned mxcsr_enter(unsigned mode)
{
#if defined(__x86_64__)
    unsigned csr = __builtin_ia32_stmxcsr();
    __builtin_ia32_ldmxcsr((csr & ~0xe040u) | mode);
    return csr;
#else
    (void)mode;
    return 0;
#endif
}

static void mxcsr_leave(unsigned csr)
{
#if defined(__x86_64__)
    __builtin_ia32_ldmxcsr(csr);
#else
    (void)csr;
#endif
}

/* One fp16 encode then decode_add, through the F16C path or the reference only. r_in/r_out
 * may be NULL or equal; acc is added to. */
typedef struct f16_run {
    uint8_t *body;
    float *r_out, *acc;
    gcomp_encode_ctx ctx;
} f16_run;

static void f16_once(int reference_only, const float *g, const float *r_in, size_t n, f16_run *run)
{
    size_t written = 0;
    uint32_t flags = 1;
    gcomp__cast_reference_only = reference_only;
    memset(&run->ctx, 0, sizeof run->ctx);
    assert_int_equal(gcomp__codec_fp16.encode(NULL, &run->ctx, g, r_in, run->r_out, n, run->body, 2 * n, &written, &flags),
                     GCOMP_SUCCESS);
    assert_int_equal(written, 2 * n);
    assert_int_equal(gcomp__codec_fp16.decode_add(NULL, flags, run->body, written, run->acc, n), GCOMP_SUCCESS);
    gcomp__cast_reference_only = 0;
}

static void f16_same(const f16_run *hw, const f16_run *ref, size_t n)
{
    assert_memory_equal(hw->body, ref->body, 2 * n);
    assert_memory_equal(hw->acc, ref->acc, n * sizeof(float));
    if (hw->r_out) assert_memory_equal(hw->r_out, ref->r_out, n * sizeof(float));
    assert_int_equal(hw->ctx.nonfinite, ref->ctx.nonfinite);
    assert_int_equal(hw->ctx.overflow, ref->ctx.overflow);
}

/* The F16C path against the reference on float bit patterns: every float
 * (GCOMP_TEST_EXHAUSTIVE=1), or every value of the top 25 bits with the low 7 bits once zero
 * (the exact ties) and once pseudo-random; with no residual and with a zero one, in every
 * MXCSR mode. Batches of 2^20 + 5 elements end in the reference's tail loop. */
static void test_f16c_matches_reference(void **state)
{
    const size_t batch = ((size_t)1 << 20) + 5;
    const int exhaustive = getenv("GCOMP_TEST_EXHAUSTIVE") != NULL;
    float *g = test_malloc_or_fail(batch * sizeof(float)), *zero = calloc(batch, sizeof(float));
    f16_run hw, ref;
    (void)state;
    if (!gcomp__cast_f16c_active()) {
        print_message("this CPU has no F16C (or AVX2): the fp16 loops run the reference only\n");
        free(g), free(zero);
        skip();
    }
    assert_non_null(zero);
    hw.body = test_malloc_or_fail(2 * batch), ref.body = test_malloc_or_fail(2 * batch);
    hw.acc = test_malloc_or_fail(batch * sizeof(float)), ref.acc = test_malloc_or_fail(batch * sizeof(float));
    float *r_hw = test_malloc_or_fail(batch * sizeof(float)), *r_ref = test_malloc_or_fail(batch * sizeof(float));
    for (size_t mode = 0; mode < N_MXCSR_MODES; mode++) {
        unsigned csr = mxcsr_enter(mxcsr_modes[mode]);
        for (uint64_t next = 0, end = exhaustive ? (uint64_t)1 << 32 : (uint64_t)1 << 26; next < end;) {
            size_t n = end - next < batch ? (size_t)(end - next) : batch;
            for (size_t i = 0; i < n; i++, next++) {
                uint32_t x = exhaustive ? (uint32_t)next
                                        : (uint32_t)(next >> 1) << 7 | ((next & 1) ? gcomp_mix32((uint32_t)next) & 127u : 0);
                memcpy(&g[i], &x, 4);
            }
            for (int residual = 0; residual < 2; residual++) {
                hw.r_out = residual ? r_hw : NULL, ref.r_out = residual ? r_ref : NULL;
                memset(hw.acc, 0, n * sizeof(float)), memset(ref.acc, 0, n * sizeof(float));
                f16_once(0, g, residual ? zero : NULL, n, &hw);
                f16_once(1, g, residual ? zero : NULL, n, &ref);
                f16_same(&hw, &ref, n);
            }
        }
        mxcsr_leave(csr);
    }
    free(g), free(zero), free(r_hw), free(r_ref), free(hw.body), free(ref.body), free(hw.acc), free(ref.acc);
}

/* The F16C loops on random data: each residual case (none, r_in only, r_out only, both, and
 * r_out == r_in), random finite residuals and sums, lengths around multiples of 8, bodies at
 * odd addresses, every MXCSR mode. Gradients mix Gaussians with arbitrary bit patterns
 * (NaN, Inf, subnormals, overflows); residuals stay finite (a NaN + NaN keeps an unspecified
 * payload: cast.h). */
static void test_f16c_loops(void **state)
{
    static const size_t lengths[] = { 0, 1, 7, 8, 9, 15, 16, 17, 1000, 1003 };
    enum { MAX_N = 1003, R_NONE, R_IN, R_OUT, R_BOTH, R_SAME };
    uint64_t seed = 7;
    float g[MAX_N], r[MAX_N], acc0[MAX_N], rb_hw[MAX_N], rb_ref[MAX_N], acc_hw[MAX_N], acc_ref[MAX_N];
    uint8_t body_hw[2 * MAX_N + 3], body_ref[2 * MAX_N + 3];
    (void)state;
    if (!gcomp__cast_f16c_active()) skip();
    for (int trial = 0; trial < 20; trial++)
        for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++)
            for (int rc = R_NONE; rc <= R_SAME; rc++)
                for (size_t mode = 0; mode < N_MXCSR_MODES; mode++) {
                    size_t n = lengths[li], off = (size_t)(trial % 4); /* body offsets 0-3 */
                    f16_run hw = { body_hw + off, NULL, acc_hw, { 0 } }, ref = { body_ref + off, NULL, acc_ref, { 0 } };
                    const float *rin_hw = NULL, *rin_ref = NULL;
                    unsigned csr;
                    for (size_t i = 0; i < n; i++) {
                        uint32_t bits = (uint32_t)tu_next(&seed);
                        float scale = (float)(1u << (bits & 15)) * 0x1p-10f;
                        if (bits & 0x10000u) memcpy(&g[i], &bits, 4);
                        else g[i] = tu_gauss(&seed) * scale;
                        r[i] = tu_gauss(&seed) * 0x1p-12f;
                        acc0[i] = tu_gauss(&seed);
                    }
                    memcpy(acc_hw, acc0, n * sizeof(float)), memcpy(acc_ref, acc0, n * sizeof(float));
                    memcpy(rb_hw, r, n * sizeof(float)), memcpy(rb_ref, r, n * sizeof(float));
                    if (rc == R_IN || rc == R_BOTH) rin_hw = rin_ref = r;
                    if (rc == R_OUT || rc == R_BOTH) hw.r_out = rb_hw, ref.r_out = rb_ref;
                    if (rc == R_SAME) rin_hw = hw.r_out = rb_hw, rin_ref = ref.r_out = rb_ref;
                    csr = mxcsr_enter(mxcsr_modes[mode]);
                    f16_once(0, g, rin_hw, n, &hw);
                    f16_once(1, g, rin_ref, n, &ref);
                    mxcsr_leave(csr);
                    f16_same(&hw, &ref, n);
                }
}

/* With the overflow trap enabled (as a debugging caller might), an fp16 overflow is counted as
 * always -- on F16C too, whose conversion raises the exception the reference's integer
 * rounding does not -- and the caller's floating-point state is left as it was. */
static void test_f16c_no_traps(void **state)
{
    float g[11], r[11] = { 0 }, acc[11] = { 0 };
    uint8_t body[22];
    (void)state;
    for (int i = 0; i < 11; i++) g[i] = i < 8 ? 70000.0f : 1.0f;
    for (int reference_only = 0; reference_only < 2; reference_only++) {
        f16_run run = { body, r, acc, { 0 } };
        memset(r, 0, sizeof r); /* the residual is updated in place */
        feclearexcept(FE_ALL_EXCEPT);
#if defined(__x86_64__) && defined(__GLIBC__)
        feenableexcept(FE_OVERFLOW);
#endif
        f16_once(reference_only, g, r, 11, &run);
#if defined(__x86_64__) && defined(__GLIBC__)
        fedisableexcept(FE_OVERFLOW);
#endif
        assert_int_equal(run.ctx.overflow, 8);
        assert_int_equal(run.ctx.nonfinite, 1);
        assert_int_equal(fetestexcept(FE_OVERFLOW), 0);
    }
}

/* The engine's one-pass decodes give the bits of zeroing and decode_add -- -0 becomes +0,
 * NaN payloads stay: gcomp__cast_decode_set (gcomp_codec_decode's) against zero + decode_add,
 * and gcomp__cast_decode_sum2 (recursive doubling's pair) against zero + decode_add of one
 * body then of another (the same body reversed, so that -0 + -0, NaN + x and x + NaN occur;
 * NaN + NaN may keep either payload).
 * Every cast codec, on F16C and on the reference loops, lengths around multiples of 8, bodies
 * at odd addresses, random bit patterns (every 16-bit one for fp16/bf16 at 65536 elements); a
 * malformed body fails the same way. */
/* Element i of a cast body (w bytes each; bf16 or fp16 when w == 2) is a NaN. */
static int body_nan(const uint8_t *body, size_t w, int bf16, size_t i)
{
    uint16_t h;
    if (w == 4) {
        float f;
        memcpy(&f, body + 4 * i, 4);
        return f != f;
    }
    memcpy(&h, body + 2 * i, 2);
    return bf16 ? (h & 0x7f80) == 0x7f80 && (h & 0x7f) : (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
}

/* Equal bits, except where both inputs are NaN: a NaN + NaN keeps either payload (cast.h: the
 * compiler orders the add's operands), so there both sums must be NaN. */
static int same_sums(const float *x, const float *y, size_t n, const uint8_t *a, const uint8_t *b, size_t w, int bf16)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&x[i], &y[i], sizeof(float)) != 0 &&
            !(body_nan(a, w, bf16, i) && body_nan(b, w, bf16, i) && x[i] != x[i] && y[i] != y[i]))
            return 0;
    return 1;
}

static void test_decode_set_matches_decode_add(void **state)
{
    static const gcomp_codec_vtable *const vts[] = { &gcomp__codec_none, &gcomp__codec_fp16, &gcomp__codec_bf16 };
    static const size_t lengths[] = { 0, 1, 7, 8, 9, 17, 1003, 65536 };
    enum { MAX_N = 65536 };
    uint64_t seed = 11;
    uint8_t *body = malloc(4 * MAX_N + 3), *rev = malloc(4 * MAX_N + 3);
    float *set = malloc(MAX_N * sizeof(float)), *add = malloc(MAX_N * sizeof(float));
    (void)state;
    assert_true(body && rev && set && add);
    if (!gcomp__cast_f16c_active()) print_message("no F16C here: the reference loops only\n");
    for (int reference_only = 0; reference_only < 2; reference_only++) {
        gcomp__cast_reference_only = reference_only;
        for (size_t v = 0; v < 3; v++)
            for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++)
                for (size_t off = 0; off < 4; off++) {
                    size_t n = lengths[li], w = v == 0 ? 4 : 2;
                    uint8_t *b = body + off;
                    for (size_t i = 0; i < n * w; i += 2) {
                        uint16_t h = n == MAX_N && w == 2 ? (uint16_t)(i / 2) : (uint16_t)tu_next(&seed);
                        memcpy(b + i, &h, 2);
                    }
                    for (size_t i = 0; i < n; i += 97) { /* -0, at mirrored places: -0 + -0 in the pair */
                        uint32_t neg0 = w == 4 ? 0x80000000u : 0x8000u;
                        memcpy(b + i * w, &neg0, w);
                        memcpy(b + (n - 1 - i) * w, &neg0, w);
                    }
                    for (size_t i = 0; i < n; i++) set[i] = add[i] = (float)i + 0.5f; /* overwritten */
                    memset(add, 0, n * sizeof(float));
                    assert_int_equal(vts[v]->decode_add(NULL, 0, b, n * w, add, n), GCOMP_SUCCESS);
                    assert_int_equal(gcomp__cast_decode_set(vts[v], 0, b, n * w, set, n), GCOMP_SUCCESS);
                    if (memcmp(set, add, n * sizeof(float)) != 0)
                        fail_msg("%s, %zu elements at offset %zu%s: one-pass decode differs from zero + decode_add",
                                 vts[v]->name, n, off, reference_only ? " (reference loops)" : "");
                    for (size_t i = 0; i < n; i++) memcpy(rev + 3 - off + i * w, b + (n - 1 - i) * w, w);
                    {
                        gcomp__cast_body first = { b, n * w, 0 }, second = { rev + 3 - off, n * w, 0 };
                        for (size_t i = 0; i < n; i++) set[i] = (float)i + 0.5f;
                        assert_int_equal(vts[v]->decode_add(NULL, 0, second.body, n * w, add, n), GCOMP_SUCCESS);
                        assert_int_equal(gcomp__cast_decode_sum2(vts[v], &first, &second, set, n), GCOMP_SUCCESS);
                        if (!same_sums(set, add, n, first.body, second.body, w, v == 2))
                            fail_msg("%s, %zu elements at offset %zu%s: one-pass pair sum differs from zero + two "
                                     "decode_adds",
                                     vts[v]->name, n, off, reference_only ? " (reference loops)" : "");
                        if (n) {
                            second.bytes--;
                            assert_int_equal(gcomp__cast_decode_sum2(vts[v], &first, &second, set, n), GCOMP_ERR_CORRUPT);
                            second.bytes++, first.flags = 1;
                            assert_int_equal(gcomp__cast_decode_sum2(vts[v], &first, &second, set, n), GCOMP_ERR_CORRUPT);
                        }
                    }
                    if (n) {
                        assert_int_equal(gcomp__cast_decode_set(vts[v], 0, b, n * w - 1, set, n), GCOMP_ERR_CORRUPT);
                        assert_int_equal(gcomp__cast_decode_set(vts[v], 1, b, n * w, set, n), GCOMP_ERR_CORRUPT);
                    }
                }
    }
    gcomp__cast_reference_only = 0;
    assert_int_equal(gcomp__cast_decode_set(gcomp_codec_find("terngrad"), 0, body, 0, set, 0), GCOMP_ERR_UNSUPPORTED);
    free(body), free(rev), free(set), free(add);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_all_values), cmocka_unit_test(test_f16_rounding),
        cmocka_unit_test(test_bf16),           cmocka_unit_test(test_cast_codecs_roundtrip),
        cmocka_unit_test(test_fp16_overflow),  cmocka_unit_test(test_nonfinite_propagates),
        cmocka_unit_test(test_f16c_matches_reference), cmocka_unit_test(test_f16c_loops),
        cmocka_unit_test(test_f16c_no_traps),  cmocka_unit_test(test_decode_set_matches_decode_add),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
