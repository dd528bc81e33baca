/*
 * test_cuda_cast.c — the cast codecs (none, fp16, bf16) and the codec object's device path
 * on a CUDA device, against the CPU reference (the same spec through the public API on host
 * buffers, same seed, rank and key): payload bytes, residuals after every step, decode and
 * decode-add results, bit for bit. Also: non-finite inputs, corrupt payloads (error, acc
 * untouched; run under compute-sanitizer for the out-of-bounds part), a CUDA graph replay,
 * wrong pointer combinations, residual get/set across host and device.
 *
 * Exits 77 (skipped) without a CUDA device. GCOMP_CUDA_TEST_MAX_COUNT=N leaves out sizes
 * above N elements, GCOMP_TEST_QUICK=1 those above 4 Mi (the compute-sanitizer run of
 * scripts/gpu-check.sh: 64 Mi elements take long there);
 * GCOMP_CUDA_TEST_FILTER=test_name runs the matching tests only.
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>

#include "test_util.h"
#include "cuda_test_util.h"
#include "gcomp_codec.h"

#define KEY 42
static const char *const SPECS[] = { "none", "fp16", "bf16" };
#define N_SPECS 3

static size_t max_count(void)
{
    const char *e = getenv("GCOMP_CUDA_TEST_MAX_COUNT"), *q = getenv("GCOMP_TEST_QUICK");
    if (e && *e) return (size_t)strtoull(e, NULL, 10);
    return q && *q == '1' ? (size_t)4 << 20 : SIZE_MAX;
}

static void *hmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}

static gcomp_codec *codec(const char *spec)
{
    gcomp_codec_options o = gcomp_codec_options_default();
    gcomp_codec *c = NULL;
    o.seed = 7;
    o.rank = 3;
    OK(gcomp_codec_create(spec, &o, &c));
    return c;
}

/* Gaussian values over many binades (f16 subnormals to large), as gradients look after a
 * few steps, plus exact halfway cases of the half formats to test ties-to-even. */
static void fill(void *dst, gcomp_dtype dtype, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        float x = tu_gauss(&seed) * ldexpf(1.0f, (int)(tu_next(&seed) % 40) - 30);
        if (i % 97 == 5) x = (float)(1.0 + 0x1p-11) * (i % 2 ? 1.0f : -3.0f); /* fp16 tie */
        if (i % 89 == 7) x = (float)(1.0 + 0x1p-8);                           /* bf16 tie */
        if (dtype == GCOMP_F32)
            ((float *)dst)[i] = x;
        else if (dtype == GCOMP_F16)
            ((uint16_t *)dst)[i] = gcomp_f32_to_f16(x);
        else
            ((uint16_t *)dst)[i] = gcomp_f32_to_bf16(x);
    }
}

static void same_bytes(const char *what, const char *spec, size_t n, int step, const void *cpu, const void *gpu,
                       size_t bytes)
{
    const uint8_t *a = cpu, *b = gpu;
    if (!memcmp(a, b, bytes)) return;
    for (size_t i = 0; i < bytes; i++)
        if (a[i] != b[i])
            fail_msg("%s n=%zu step %d: %s differ at byte %zu of %zu: cpu 0x%02x, gpu 0x%02x", spec, n, step, what, i,
                     bytes, a[i], b[i]);
}

/* ---- bit-identical to the CPU ----------------------------------------------------------- */

/* steps encodes with error feedback of fresh data; after each, payload and residual equal the
 * CPU's; then decode-add into a random acc and decode into dtype equal the CPU's. off: element
 * offset of the device source (and byte offset 4 * off of the payload), for the unaligned
 * path. */
static void compare(const char *spec, size_t n, gcomp_dtype dtype, int steps, size_t off)
{
    size_t es = gcomp_dtype_size(dtype);
    gcomp_codec *cpu = codec(spec), *gpu = codec(spec);
    size_t cap = gcomp_codec_max_encoded_bytes(cpu, n), wc = 0, wg = 0;
    uint8_t *g = hmalloc(n * es), *pc = hmalloc(cap), *pg = hmalloc(cap);
    float *rc = hmalloc(n * 4), *rg = hmalloc(n * 4), *acc = hmalloc(n * 4), *accg = hmalloc(n * 4);
    uint8_t *outc = hmalloc(n * es), *outg = hmalloc(n * es);
    uint8_t *d_g = dmalloc(n * es + 4 * off), *d_p = dmalloc(cap + 4 * off), *d_out = dmalloc(n * es + 4 * off);
    float *d_acc = dmalloc(n * 4 + 4 * off);
    gcomp_stats sc, sg;

    for (int step = 0; step < steps; step++) {
        fill(g, dtype, n, 1000 * (uint64_t)n + step);
        OK(gcomp_codec_encode(cpu, KEY, g, n, dtype, pc, cap, &wc));
        h2d(d_g + 4 * off, g, n * es);
        OK(gcomp_codec_encode(gpu, KEY, d_g + 4 * off, n, dtype, d_p + 4 * off, cap, &wg));
        assert_int_equal(wc, wg);
        d2h(pg, d_p + 4 * off, wg);
        same_bytes("payloads", spec, n, step, pc, pg, wc);
        OK(gcomp_codec_residual_get(cpu, KEY, rc, n));
        OK(gcomp_codec_residual_get(gpu, KEY, rg, n));
        same_bytes("residuals", spec, n, step, rc, rg, n * 4);
    }
    fill(acc, GCOMP_F32, n, 99);
    h2d(d_acc + off, acc, n * 4);
    OK(gcomp_codec_decode_add(cpu, pc, wc, acc, n));
    OK(gcomp_codec_decode_add(gpu, d_p + 4 * off, wg, d_acc + off, n));
    d2h(accg, d_acc + off, n * 4);
    same_bytes("decode_add results", spec, n, steps, acc, accg, n * 4);
    OK(gcomp_codec_decode(cpu, pc, wc, outc, n, dtype));
    OK(gcomp_codec_decode(gpu, d_p + 4 * off, wg, d_out + 4 * off, n, dtype));
    d2h(outg, d_out + 4 * off, n * es);
    same_bytes("decode results", spec, n, steps, outc, outg, n * es);

    OK(gcomp_codec_stats_get(cpu, &sc));
    OK(gcomp_codec_stats_get(gpu, &sg));
    assert_int_equal(sc.encode_calls, sg.encode_calls);
    assert_int_equal(sc.decode_calls, sg.decode_calls);
    assert_int_equal(sc.raw_bytes, sg.raw_bytes);
    assert_int_equal(sc.wire_bytes, sg.wire_bytes);
    assert_int_equal(sc.overflow_count, sg.overflow_count);
    assert_int_equal(sc.nonfinite_calls, sg.nonfinite_calls);

    CU(cudaFree(d_g));
    CU(cudaFree(d_p));
    CU(cudaFree(d_out));
    CU(cudaFree(d_acc));
    free(g), free(pc), free(pg), free(rc), free(rg), free(acc), free(accg), free(outc), free(outg);
    gcomp_codec_destroy(cpu);
    gcomp_codec_destroy(gpu);
}

static void test_bit_identical_f32(void **state)
{
    static const size_t sizes[] = { 1, 127, 4099, (1u << 20) + 3, (size_t)64 << 20 };
    (void)state;
    for (int s = 0; s < N_SPECS; s++)
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
            if (sizes[i] > max_count()) continue;
            compare(SPECS[s], sizes[i], GCOMP_F32, sizes[i] > (1u << 22) ? 2 : 5, 0);
        }
}

/* f16 / bf16 inputs are widened on the device; f16 / bf16 outputs narrowed */
static void test_bit_identical_half_inputs(void **state)
{
    (void)state;
    for (int s = 0; s < N_SPECS; s++) {
        compare(SPECS[s], 4099, GCOMP_F16, 3, 0);
        compare(SPECS[s], 4099, GCOMP_BF16, 3, 0);
        compare(SPECS[s], (1u << 20) + 3, GCOMP_BF16, 2, 0);
    }
}

/* pointers off the 16-byte grid take the scalar kernels */
static void test_bit_identical_unaligned(void **state)
{
    (void)state;
    for (int s = 0; s < N_SPECS; s++) {
        compare(SPECS[s], 4099, GCOMP_F32, 3, 1);
        compare(SPECS[s], 1027, GCOMP_F32, 3, 3);
        compare(SPECS[s], 1027, GCOMP_F16, 2, 1);
    }
}

/* ---- non-finite input --------------------------------------------------------------------- */

/* A NaN, an Inf, and (fp16) a finite value past 65504: the same payload bytes as the CPU,
 * counted as non-finite, and the residual left as it was; the next finite step goes on
 * from there on both. */
static void nonfinite_case(const char *spec, float bad)
{
    const size_t n = 4099;
    gcomp_codec *cpu = codec(spec), *gpu = codec(spec);
    size_t cap = gcomp_codec_max_encoded_bytes(cpu, n), wc, wg;
    float *g = hmalloc(n * 4), *r0 = hmalloc(n * 4), *rc = hmalloc(n * 4), *rg = hmalloc(n * 4);
    uint8_t *pc = hmalloc(cap), *pg = hmalloc(cap);
    float *d_g = dmalloc(n * 4);
    uint8_t *d_p = dmalloc(cap);
    gcomp_stats sc, sg;
    for (int step = 0; step < 3; step++) {
        fill(g, GCOMP_F32, n, 5 + step);
        if (step == 1) g[n / 2] = bad, g[n - 1] = bad;
        h2d(d_g, g, n * 4);
        OK(gcomp_codec_encode(cpu, KEY, g, n, GCOMP_F32, pc, cap, &wc));
        OK(gcomp_codec_encode(gpu, KEY, d_g, n, GCOMP_F32, d_p, cap, &wg));
        assert_int_equal(wc, wg);
        d2h(pg, d_p, wg);
        same_bytes("non-finite payloads", spec, n, step, pc, pg, wc);
        OK(gcomp_codec_residual_get(cpu, KEY, rc, n));
        OK(gcomp_codec_residual_get(gpu, KEY, rg, n));
        same_bytes("non-finite residuals", spec, n, step, rc, rg, n * 4);
        if (step == 0) memcpy(r0, rg, n * 4);
        if (step == 1) {
            float *acc = hmalloc(n * 4), *accg = hmalloc(n * 4), *d_acc = dmalloc(n * 4);
            same_bytes("residual kept (before/after)", spec, n, step, r0, rg, n * 4);
            /* the non-finite payload decodes to the same bits too */
            fill(acc, GCOMP_F32, n, 77);
            h2d(d_acc, acc, n * 4);
            OK(gcomp_codec_decode_add(cpu, pc, wc, acc, n));
            OK(gcomp_codec_decode_add(gpu, d_p, wg, d_acc, n));
            d2h(accg, d_acc, n * 4);
            same_bytes("non-finite decode_add results", spec, n, step, acc, accg, n * 4);
            CU(cudaFree(d_acc));
            free(acc), free(accg);
        }
    }
    OK(gcomp_codec_stats_get(cpu, &sc));
    OK(gcomp_codec_stats_get(gpu, &sg));
    assert_int_equal(sg.nonfinite_calls, 1);
    assert_int_equal(sc.nonfinite_calls, sg.nonfinite_calls);
    assert_int_equal(sc.overflow_count, sg.overflow_count);
    CU(cudaFree(d_g));
    CU(cudaFree(d_p));
    free(g), free(r0), free(rc), free(rg), free(pc), free(pg);
    gcomp_codec_destroy(cpu);
    gcomp_codec_destroy(gpu);
}

static void test_nonfinite(void **state)
{
    (void)state;
    for (int s = 0; s < N_SPECS; s++) {
        nonfinite_case(SPECS[s], NAN);
        nonfinite_case(SPECS[s], -INFINITY);
    }
    nonfinite_case("fp16", 1e6f); /* overflow: counted in overflow_count too */
    nonfinite_case("bf16", 3.4e38f);
}

/* ---- corrupt payloads --------------------------------------------------------------------- */

/* Decode `bad` (len bytes, copied into a device buffer of exactly len bytes so the sanitizer
 * sees any read past it) into acc: GCOMP_ERR_CORRUPT and acc bit for bit unchanged. */
static void expect_corrupt(gcomp_codec *gpu, const char *what, const uint8_t *bad, size_t len, size_t n,
                           const float *acc0, float *d_acc)
{
    uint8_t *d_bad = dmalloc(len);
    float *acc = hmalloc(n * 4);
    h2d(d_bad, bad, len);
    h2d(d_acc, acc0, n * 4);
    {
        gcomp_result r = gcomp_codec_decode_add(gpu, d_bad, len, d_acc, n);
        if (r != GCOMP_ERR_CORRUPT)
            fail_msg("%s: decode_add -> %s, expected GCOMP_ERR_CORRUPT (%s)", what, gcomp_result_name(r),
                     gcomp_last_error());
    }
    d2h(acc, d_acc, n * 4);
    same_bytes("acc after a corrupt payload", what, n, 0, acc0, acc, n * 4);
    CU(cudaFree(d_bad));
    free(acc);
}

static void test_corrupt(void **state)
{
    (void)state;
    for (int s = 0; s < N_SPECS; s++) {
        const size_t n = 1029;
        gcomp_codec *gpu = codec(SPECS[s]);
        size_t cap = gcomp_codec_max_encoded_bytes(gpu, n), w;
        float *g = hmalloc(n * 4), *acc0 = hmalloc(n * 4), *d_g = dmalloc(n * 4), *d_acc = dmalloc(n * 4);
        uint8_t *p = hmalloc(cap), *bad = hmalloc(cap + 8), *d_p = dmalloc(cap);
        fill(g, GCOMP_F32, n, 11);
        fill(acc0, GCOMP_F32, n, 12);
        h2d(d_g, g, n * 4);
        OK(gcomp_codec_encode(gpu, KEY, d_g, n, GCOMP_F32, d_p, cap, &w));
        d2h(p, d_p, w);

#define MUTATE(what, len, stmt)                              \
    do {                                                     \
        memcpy(bad, p, w);                                   \
        stmt;                                                \
        expect_corrupt(gpu, what, bad, len, n, acc0, d_acc); \
    } while (0)
        MUTATE("truncated payload", w - 1, (void)0);
        MUTATE("payload longer than its header says", w + 8, memset(bad + w, 0, 8));
        MUTATE("shorter than a header", 5, (void)0);
        MUTATE("bad magic", w, bad[0] ^= 1);
        MUTATE("bad version", w, bad[4] = 9);
        MUTATE("bad dtype", w, bad[5] = 7);
        MUTATE("other codec's wire id", w, bad[6] = (uint8_t)(bad[6] == 2 ? 3 : 2));
        MUTATE("flags set", w, bad[8] = 1);
        MUTATE("reserved set", w, bad[12] = 1);
        MUTATE("count + 1", w, bad[16] += 1);
        MUTATE("body_bytes - 2", w, bad[24] -= 2);
        MUTATE("body_bytes huge", w, bad[31] = 0x80);
#undef MUTATE
        /* the caller's count differs from the payload's */
        {
            uint8_t *d_x = dmalloc(w);
            float *acc = hmalloc(n * 4);
            h2d(d_x, p, w);
            h2d(d_acc, acc0, n * 4);
            EXPECT(gcomp_codec_decode_add(gpu, d_x, w, d_acc, n - 1), GCOMP_ERR_CORRUPT, "header");
            d2h(acc, d_acc, n * 4);
            same_bytes("acc after a count mismatch", SPECS[s], n, 0, acc0, acc, n * 4);
            /* async: the call succeeds, the sync reports; the next sync is clean again */
            OK(gcomp_codec_decode_add_async(gpu, d_x, w - 1, d_acc, n, NULL));
            EXPECT(gcomp_codec_sync(gpu, NULL), GCOMP_ERR_CORRUPT, NULL);
            OK(gcomp_codec_decode_add_async(gpu, d_x, w, d_acc, n, NULL));
            OK(gcomp_codec_sync(gpu, NULL));
            CU(cudaFree(d_x));
            free(acc);
        }
        CU(cudaFree(d_g));
        CU(cudaFree(d_acc));
        CU(cudaFree(d_p));
        free(g), free(acc0), free(p), free(bad);
        gcomp_codec_destroy(gpu);
    }
}

typedef struct refusal {
    const char *what;
    size_t at, len; /* bad[at] ^= 0x40 when at < len, then len bytes decoded */
} refusal;

/* A refused payload decoded into f16/bf16: GCOMP_ERR_CORRUPT and dst exactly as it was, as
 * the CPU leaves it (the blocking device call reads its status back before narrowing; it used
 * to narrow the zeroed f32 scratch into dst). Every codec's payload, refused by the header
 * check or, for top-k, by the body check; an intact one still decodes to the CPU's bits. */
static void refused_half_case(const char *spec, gcomp_dtype dtype)
{
    const size_t n = 1029, es = gcomp_dtype_size(dtype);
    gcomp_codec *cpu = codec(spec), *gpu = codec(spec);
    size_t cap = gcomp_codec_max_encoded_bytes(cpu, n), w = 0;
    float *g = hmalloc(n * 4), *d_g = dmalloc(n * 4);
    uint8_t *p = hmalloc(cap), *bad = hmalloc(cap), *d_p = dmalloc(cap), *d_dst = dmalloc(n * es);
    uint8_t *dst0 = hmalloc(n * es), *hdst = hmalloc(n * es), *ddst = hmalloc(n * es);
    refusal cases[3];
    int ncases = 0;
    fill(g, GCOMP_F32, n, 51);
    fill(dst0, dtype, n, 52);
    h2d(d_g, g, n * 4);
    OK(gcomp_codec_encode(gpu, GCOMP_KEY_NONE, d_g, n, GCOMP_F32, d_p, cap, &w));
    d2h(p, d_p, w);
    cases[ncases++] = (refusal){ "truncated", w, w - 1 };
    cases[ncases++] = (refusal){ "bad magic", 0, w };
    if (!strncmp(spec, "topk", 4)) /* k gains bit 46: the body check refuses it, the header passes */
        cases[ncases++] = (refusal){ "k past count", GCOMP_HEADER_BYTES + 5, w };
    for (int i = 0; i < ncases; i++) {
        char what[96];
        snprintf(what, sizeof what, "%s into %s: %s", spec, dtype == GCOMP_F16 ? "f16" : "bf16", cases[i].what);
        memcpy(bad, p, w);
        if (cases[i].at < cases[i].len) bad[cases[i].at] ^= 0x40;
        memcpy(hdst, dst0, n * es);
        assert_int_equal(gcomp_codec_decode(cpu, bad, cases[i].len, hdst, n, dtype), GCOMP_ERR_CORRUPT);
        same_bytes("host dst after a refused payload", what, n, 0, dst0, hdst, n * es);
        h2d(d_p, bad, cases[i].len);
        h2d(d_dst, dst0, n * es);
        EXPECT(gcomp_codec_decode(gpu, d_p, cases[i].len, d_dst, n, dtype), GCOMP_ERR_CORRUPT, NULL);
        d2h(ddst, d_dst, n * es);
        same_bytes("device dst after a refused payload", what, n, 0, dst0, ddst, n * es);
    }
    h2d(d_p, p, w);
    OK(gcomp_codec_decode(cpu, p, w, hdst, n, dtype));
    OK(gcomp_codec_decode(gpu, d_p, w, d_dst, n, dtype));
    d2h(ddst, d_dst, n * es);
    same_bytes("decode results after the refusals", spec, n, 0, hdst, ddst, n * es);
    CU(cudaFree(d_g));
    CU(cudaFree(d_p));
    CU(cudaFree(d_dst));
    free(g), free(p), free(bad), free(dst0), free(hdst), free(ddst);
    gcomp_codec_destroy(cpu), gcomp_codec_destroy(gpu);
}

static void test_decode_refused_keeps_half_dst(void **state)
{
    static const char *const specs[] = { "none", "fp16", "bf16", "terngrad", "topk:ratio=0.05" };
    (void)state;
    for (size_t s = 0; s < sizeof specs / sizeof *specs; s++) {
        refused_half_case(specs[s], GCOMP_F16);
        refused_half_case(specs[s], GCOMP_BF16);
    }
}

/* ---- CUDA graph --------------------------------------------------------------------------- */

/* fp16 encode + decode-add with error feedback, captured once and replayed 3 times, gives the
 * same payload, residual and accumulator as 3 async calls, and as the CPU: the fixed-size
 * path never needs the host, and the residual's buffer index and step advance on the device. */
static void test_graph_replay(void **state)
{
    const size_t n = (1u << 20) + 3;
    gcomp_codec *a = codec("fp16"), *b = codec("fp16"), *cpu = codec("fp16");
    size_t cap = gcomp_codec_max_encoded_bytes(a, n), w = 0, wc = 0;
    float *g = hmalloc(n * 4), *acc = hmalloc(n * 4), *ra = hmalloc(n * 4), *rb = hmalloc(n * 4), *rc = hmalloc(n * 4);
    float *acc_a = hmalloc(n * 4), *acc_b = hmalloc(n * 4);
    uint8_t *pa = hmalloc(cap), *pb = hmalloc(cap), *pc = hmalloc(cap);
    float *d_g = dmalloc(n * 4), *d_acc_a = dmalloc(n * 4), *d_acc_b = dmalloc(n * 4);
    uint8_t *d_pa = dmalloc(cap), *d_pb = dmalloc(cap);
    cudaStream_t s;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    (void)state;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    fill(g, GCOMP_F32, n, 21);
    fill(acc, GCOMP_F32, n, 22);
    h2d(d_g, g, n * 4);
    h2d(d_acc_a, acc, n * 4);
    h2d_wait(d_acc_b, acc, n * 4); /* the calls below run on a non-blocking stream */

    /* warm-up call on each (allocates the residual and the status blocks) */
    OK(gcomp_codec_encode_async(a, KEY, d_g, n, GCOMP_F32, d_pa, cap, &w, s));
    OK(gcomp_codec_decode_add_async(a, d_pa, w, d_acc_a, n, s));
    OK(gcomp_codec_encode_async(b, KEY, d_g, n, GCOMP_F32, d_pb, cap, &w, s));
    OK(gcomp_codec_decode_add_async(b, d_pb, w, d_acc_b, n, s));
    OK(gcomp_codec_sync(a, s));
    OK(gcomp_codec_sync(b, s));
    for (int i = 0; i < 4; i++) {
        OK(gcomp_codec_encode(cpu, KEY, g, n, GCOMP_F32, pc, cap, &wc));
        OK(gcomp_codec_decode_add(cpu, pc, wc, acc, n));
    }

    CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    OK(gcomp_codec_encode_async(a, KEY, d_g, n, GCOMP_F32, d_pa, cap, &w, s));
    OK(gcomp_codec_decode_add_async(a, d_pa, w, d_acc_a, n, s));
    CU(cudaStreamEndCapture(s, &graph));
    assert_int_equal(w, wc);
    CU(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 3; i++) CU(cudaGraphLaunch(exec, s));
    for (int i = 0; i < 3; i++) {
        OK(gcomp_codec_encode_async(b, KEY, d_g, n, GCOMP_F32, d_pb, cap, &w, s));
        OK(gcomp_codec_decode_add_async(b, d_pb, w, d_acc_b, n, s));
    }
    OK(gcomp_codec_sync(a, s));
    OK(gcomp_codec_sync(b, s));

    d2h(pa, d_pa, w);
    d2h(pb, d_pb, w);
    d2h(acc_a, d_acc_a, n * 4);
    d2h(acc_b, d_acc_b, n * 4);
    OK(gcomp_codec_residual_get(a, KEY, ra, n));
    OK(gcomp_codec_residual_get(b, KEY, rb, n));
    OK(gcomp_codec_residual_get(cpu, KEY, rc, n));
    same_bytes("graph vs async payloads", "fp16", n, 3, pb, pa, w);
    same_bytes("graph vs async residuals", "fp16", n, 3, rb, ra, n * 4);
    same_bytes("graph vs async accumulators", "fp16", n, 3, acc_b, acc_a, n * 4);
    same_bytes("cpu vs graph payloads", "fp16", n, 3, pc, pa, w);
    same_bytes("cpu vs graph residuals", "fp16", n, 3, rc, ra, n * 4);
    same_bytes("cpu vs graph accumulators", "fp16", n, 3, acc, acc_a, n * 4);
    { /* the kernels count the replays: the same stats as the async calls and the CPU */
        gcomp_stats sa, sb, sc;
        OK(gcomp_codec_stats_get(a, &sa));
        OK(gcomp_codec_stats_get(b, &sb));
        OK(gcomp_codec_stats_get(cpu, &sc));
        assert_memory_equal(&sa, &sb, sizeof sa);
        assert_memory_equal(&sa, &sc, sizeof sa);
    }

    CU(cudaGraphExecDestroy(exec));
    CU(cudaGraphDestroy(graph));
    CU(cudaStreamDestroy(s));
    CU(cudaFree(d_g));
    CU(cudaFree(d_acc_a));
    CU(cudaFree(d_acc_b));
    CU(cudaFree(d_pa));
    CU(cudaFree(d_pb));
    free(g), free(acc), free(ra), free(rb), free(rc), free(acc_a), free(acc_b), free(pa), free(pb), free(pc);
    gcomp_codec_destroy(a), gcomp_codec_destroy(b), gcomp_codec_destroy(cpu);
}

/* ---- wrong combinations -------------------------------------------------------------------- */

static void test_wrong_combinations(void **state)
{
    const size_t n = 1000;
    gcomp_codec *c = codec("fp16"), *z = codec("fp16+zstd");
    size_t cap = gcomp_codec_max_encoded_bytes(z, n), w;
    float *g = hmalloc(n * 4), *d_g = dmalloc(n * 4);
    uint8_t *p = hmalloc(cap), *d_p = dmalloc(cap);
    int ndev = 0;
    (void)state;
    fill(g, GCOMP_F32, n, 3);
    h2d(d_g, g, n * 4);
    EXPECT(gcomp_codec_encode(c, KEY, d_g, n, GCOMP_F32, p, cap, &w), GCOMP_ERR_INVALID_ARG, "host memory");
    EXPECT(gcomp_codec_encode(c, KEY, g, n, GCOMP_F32, d_p, cap, &w), GCOMP_ERR_INVALID_ARG, "host memory");
    EXPECT(gcomp_codec_encode(z, KEY, d_g, n, GCOMP_F32, d_p, cap, &w), GCOMP_ERR_UNSUPPORTED, "host buffers");
    OK(gcomp_codec_encode(c, KEY, d_g, n, GCOMP_F32, d_p, cap, &w));
    EXPECT(gcomp_codec_decode_add(c, d_p, w, g, n), GCOMP_ERR_INVALID_ARG, "host memory");
    EXPECT(gcomp_codec_encode(c, KEY, d_g, n, GCOMP_F32, d_p, 16, &w), GCOMP_ERR_BUFFER_TOO_SMALL, NULL);
    EXPECT(gcomp_codec_encode(c, KEY, d_g, n, GCOMP_F32, d_p, 100, &w), GCOMP_ERR_BUFFER_TOO_SMALL, NULL);
    EXPECT(gcomp_codec_residual_get(c, KEY, g, n - 1), GCOMP_ERR_INVALID_ARG, "elements");
    CU(cudaGetDeviceCount(&ndev));
    if (ndev > 1) { /* a pointer of another device than the current one */
        float *other = NULL;
        CU(cudaSetDevice(1));
        CU(cudaMalloc((void **)&other, n * 4));
        CU(cudaSetDevice(0));
        EXPECT(gcomp_codec_encode(c, KEY, other, n, GCOMP_F32, d_p, cap, &w), GCOMP_ERR_INVALID_ARG, "device 1");
        CU(cudaFree(other));
    } else {
        print_message("one CUDA device: the other-device case is not exercised\n");
    }
    CU(cudaFree(d_g));
    CU(cudaFree(d_p));
    free(g), free(p);
    gcomp_codec_destroy(c), gcomp_codec_destroy(z);
}

/* ---- residual get / set across host and device -------------------------------------------- */

static void test_residual_get_set(void **state)
{
    const size_t n = 5003;
    gcomp_codec *cpu = codec("bf16"), *gpu = codec("bf16");
    size_t cap = gcomp_codec_max_encoded_bytes(cpu, n), wc, wg;
    float *g = hmalloc(n * 4), *r = hmalloc(n * 4), *rc = hmalloc(n * 4), *rg = hmalloc(n * 4);
    float *d_g = dmalloc(n * 4), *d_r = dmalloc(n * 4);
    uint8_t *pc = hmalloc(cap), *pg = hmalloc(cap), *d_p = dmalloc(cap);
    (void)state;
    fill(g, GCOMP_F32, n, 31);
    fill(r, GCOMP_F32, n, 32);
    h2d(d_g, g, n * 4);

    /* set from the host before any device call: the first device encode starts from it */
    OK(gcomp_codec_residual_set(cpu, KEY, r, n));
    OK(gcomp_codec_residual_set(gpu, KEY, r, n));
    OK(gcomp_codec_encode(cpu, KEY, g, n, GCOMP_F32, pc, cap, &wc));
    OK(gcomp_codec_encode(gpu, KEY, d_g, n, GCOMP_F32, d_p, cap, &wg));
    d2h(pg, d_p, wg);
    same_bytes("payload after a host residual_set", "bf16", n, 0, pc, pg, wc);

    /* get into host and into device memory */
    OK(gcomp_codec_residual_get(cpu, KEY, rc, n));
    OK(gcomp_codec_residual_get(gpu, KEY, rg, n));
    same_bytes("residual to host", "bf16", n, 1, rc, rg, n * 4);
    OK(gcomp_codec_residual_get(gpu, KEY, d_r, n));
    d2h(rg, d_r, n * 4);
    same_bytes("residual to device", "bf16", n, 1, rc, rg, n * 4);

    /* set from device memory, then from the host, onto the device-resident key */
    fill(r, GCOMP_F32, n, 33);
    h2d(d_r, r, n * 4);
    OK(gcomp_codec_residual_set(gpu, KEY, d_r, n));
    OK(gcomp_codec_residual_get(gpu, KEY, rg, n));
    same_bytes("residual set from device", "bf16", n, 2, r, rg, n * 4);
    fill(r, GCOMP_F32, n, 34);
    OK(gcomp_codec_residual_set(gpu, KEY, r, n));
    OK(gcomp_codec_residual_set(cpu, KEY, r, n));
    OK(gcomp_codec_encode(cpu, KEY, g, n, GCOMP_F32, pc, cap, &wc));
    OK(gcomp_codec_encode(gpu, KEY, d_g, n, GCOMP_F32, d_p, cap, &wg));
    d2h(pg, d_p, wg);
    same_bytes("payload after a device residual_set", "bf16", n, 3, pc, pg, wc);

    /* a NaN or an Inf in device memory is refused, and the key keeps its residual */
    {
        float bad = (float)NAN, *before = hmalloc(n * 4);
        OK(gcomp_codec_residual_get(gpu, KEY, before, n));
        h2d(d_r + n - 1, &bad, 4);
        EXPECT(gcomp_codec_residual_set(gpu, KEY, d_r, n), GCOMP_ERR_INVALID_ARG, "NaN or an Inf");
        bad = (float)INFINITY;
        h2d(d_r + 7, &bad, 4);
        EXPECT(gcomp_codec_residual_set(gpu, KEY + 2, d_r, n), GCOMP_ERR_INVALID_ARG, "NaN or an Inf");
        EXPECT(gcomp_codec_residual_get(gpu, KEY + 2, rg, n), GCOMP_ERR_INVALID_ARG, "no residual");
        OK(gcomp_codec_residual_get(gpu, KEY, rg, n));
        same_bytes("residual kept after a refused set", "bf16", n, 5, before, rg, n * 4);
        free(before);
        h2d(d_r, r, n * 4);
    }

    /* a new key set from device memory lives on the device */
    OK(gcomp_codec_residual_set(gpu, KEY + 1, d_r, n));
    OK(gcomp_codec_residual_get(gpu, KEY + 1, rg, n));
    d2h(r, d_r, n * 4);
    same_bytes("new key set from device", "bf16", n, 4, r, rg, n * 4);

    OK(gcomp_codec_residual_reset(gpu, KEY));
    EXPECT(gcomp_codec_residual_get(gpu, KEY, rg, n), GCOMP_ERR_INVALID_ARG, "no residual");

    CU(cudaFree(d_g));
    CU(cudaFree(d_r));
    CU(cudaFree(d_p));
    free(g), free(r), free(rc), free(rg), free(pc), free(pg);
    gcomp_codec_destroy(cpu), gcomp_codec_destroy(gpu);
}

/* count 0 and no error feedback (GCOMP_KEY_NONE) on the device */
static void test_edges(void **state)
{
    gcomp_codec *cpu = codec("fp16"), *gpu = codec("fp16");
    const size_t n = 300;
    size_t cap = gcomp_codec_max_encoded_bytes(cpu, n), wc, wg;
    float *g = hmalloc(n * 4), *d_g = dmalloc(n * 4);
    uint8_t *pc = hmalloc(cap), *pg = hmalloc(cap), *d_p = dmalloc(cap);
    (void)state;
    OK(gcomp_codec_encode(gpu, KEY, d_g, 0, GCOMP_F32, d_p, cap, &wg));
    OK(gcomp_codec_encode(cpu, KEY, g, 0, GCOMP_F32, pc, cap, &wc));
    assert_int_equal(wc, wg);
    d2h(pg, d_p, wg);
    same_bytes("empty payload", "fp16", 0, 0, pc, pg, wc);
    fill(g, GCOMP_F32, n, 41);
    h2d(d_g, g, n * 4);
    OK(gcomp_codec_encode(gpu, GCOMP_KEY_NONE, d_g, n, GCOMP_F32, d_p, cap, &wg));
    OK(gcomp_codec_encode(cpu, GCOMP_KEY_NONE, g, n, GCOMP_F32, pc, cap, &wc));
    d2h(pg, d_p, wg);
    same_bytes("payload without a key", "fp16", n, 0, pc, pg, wc);
    CU(cudaFree(d_g));
    CU(cudaFree(d_p));
    free(g), free(pc), free(pg);
    gcomp_codec_destroy(cpu), gcomp_codec_destroy(gpu);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bit_identical_f32),
        cmocka_unit_test(test_bit_identical_half_inputs),
        cmocka_unit_test(test_bit_identical_unaligned),
        cmocka_unit_test(test_nonfinite),
        cmocka_unit_test(test_corrupt),
        cmocka_unit_test(test_decode_refused_keeps_half_dst),
        cmocka_unit_test(test_graph_replay),
        cmocka_unit_test(test_wrong_combinations),
        cmocka_unit_test(test_residual_get_set),
        cmocka_unit_test(test_edges),
    };
    if (cuda_test_no_device("test_cuda_cast")) return 77;
    if (getenv("GCOMP_CUDA_TEST_FILTER")) cmocka_set_test_filter(getenv("GCOMP_CUDA_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
