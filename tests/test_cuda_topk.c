/*
 * test_cuda_topk.c — the top-k codec's CUDA ops (cuda/topk.cu) against the CPU reference
 * (codecs/topk.c), byte for byte: payload bodies, flags, non-finite and overflow outcomes,
 * residuals over steps of error feedback, decode_add, the sparse pair sum, and corrupt
 * payloads (both decoders must refuse the same bodies, and the device must leave acc alone).
 *
 * The ops are called directly through the vtable's `cuda` table, on the legacy default stream,
 * with a device-resident gcomp_cuda_residual as the library keeps it (buf[cur] the residual,
 * buf[cur ^ 1] written by the encode, cur flipped by the caller unless non-finite).
 *
 * Exits 77 (skipped) without a CUDA device. GCOMP_TEST_QUICK=1 leaves out the 64 Mi sizes
 * (for compute-sanitizer runs); GCOMP_TEST_ONLY=<pattern> runs only the matching tests.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "cuda_test_util.h"
#include "codecs/common.h"
#include "codecs/topk.h"
#include "gcomp_codec.h"

#define SIZE_64MI ((size_t)64 << 20)

static const gcomp_codec_vtable *vt;
static const gcomp_codec_cuda_ops *ops;
static int quick;

/* ---- data ------------------------------------------------------------------------------------ */

enum gen {
    GEN_GAUSS,
    GEN_TIES,
    GEN_NONFINITE,
    GEN_BIG,
    GEN_ZEROS_AND_GAUSS
};

/* Gaussian-ish (a sum of four uniforms), from one stream per (seed, step). */
static float gauss_ish(uint64_t *s)
{
    uint64_t a = tu_next(s), b = tu_next(s);
    double u = (double)(a & 0xffffffffu) + (double)(a >> 32) + (double)(b & 0xffffffffu) + (double)(b >> 32);
    return (float)((u * 0x1p-32 - 2.0) * 1.7320508);
}

static void generate(float *g, size_t n, enum gen kind, uint64_t seed, float scale)
{
    static const float ties[] = { 0.5f, -0.5f, 1.0f, -1.0f, 0.25f, 2.0f, -2.0f, 0.0f };
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) {
        switch (kind) {
        case GEN_TIES:
            g[i] = ties[tu_next(&s) % 8] * scale;
            break;
        case GEN_BIG:
            g[i] = gauss_ish(&s) * 30000.0f * scale;
            break; /* fp16 overflows */
        case GEN_ZEROS_AND_GAUSS:
            g[i] = (tu_next(&s) & 3) ? 0.0f : gauss_ish(&s) * scale;
            break;
        default:
            g[i] = gauss_ish(&s) * scale;
            break;
        }
    }
    if (kind == GEN_NONFINITE && n >= 3) {
        /* a negative NaN with a payload, not CUDA's own 0x7fffffff: x = g + r, the kept value
         * and the decoded sum must keep the CPU's bits (before, the GPU's sums wrote
         * 0x7fffffff, and a canonical NaN here hid it) */
        uint32_t nan = 0xffc00123u;
        memcpy(&g[n / 3], &nan, 4);
        g[n / 2] = INFINITY;
        g[n - 1] = -INFINITY;
    } else if (kind == GEN_NONFINITE) {
        g[0] = INFINITY;
    }
}

/* a == b bit for bit, NaNs included: the kernels give the CPU's NaN bits (gcomp_x86_nan_f32) */
static int same_float(float a, float b) { return memcmp(&a, &b, 4) == 0; }

static void check_floats(const char *what, const float *want, const float *got, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!same_float(want[i], got[i]))
            fail_msg("%s: element %zu of %zu: CPU %a (0x%08x), GPU %a (0x%08x)", what, i, n, (double)want[i],
                     gcomp_f32_bits(want[i]), (double)got[i], gcomp_f32_bits(got[i]));
}

static void check_bytes(const char *what, const uint8_t *want, const uint8_t *got, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (want[i] != got[i]) fail_msg("%s: byte %zu of %zu: CPU 0x%02x, GPU 0x%02x", what, i, n, want[i], got[i]);
}

/* ---- device buffers of one size ----------------------------------------------------------------- */

typedef struct dev {
    size_t n, cap, scratch_bytes;
    float *g, *r[2], *acc;
    gcomp_cuda_residual *res;
    gcomp_cuda_status *status;
    uint8_t *body, *payload;
    void *scratch;
} dev;

static dev dev_alloc(const gcomp_topk_params *p, size_t n)
{
    dev d;
    size_t m = n ? n : 1;
    d.n = n;
    d.cap = vt->max_body_bytes(p, n);
    d.scratch_bytes = ops->scratch_bytes(p, n);
    CU(cudaMalloc((void **)&d.g, m * 4));
    CU(cudaMalloc((void **)&d.r[0], m * 4));
    CU(cudaMalloc((void **)&d.r[1], m * 4));
    CU(cudaMalloc((void **)&d.acc, m * 4));
    CU(cudaMalloc((void **)&d.res, sizeof *d.res));
    CU(cudaMalloc((void **)&d.status, sizeof *d.status));
    CU(cudaMalloc((void **)&d.body, d.cap));
    CU(cudaMalloc((void **)&d.payload, d.cap + GCOMP_HEADER_BYTES));
    CU(cudaMalloc(&d.scratch, d.scratch_bytes ? d.scratch_bytes : 1));
    return d;
}

static void dev_free(dev *d)
{
    CU(cudaFree(d->g));
    CU(cudaFree(d->r[0]));
    CU(cudaFree(d->r[1]));
    CU(cudaFree(d->acc));
    CU(cudaFree(d->res));
    CU(cudaFree(d->status));
    CU(cudaFree(d->body));
    CU(cudaFree(d->payload));
    CU(cudaFree(d->scratch));
}

static gcomp_cuda_status status_get(const dev *d)
{
    gcomp_cuda_status st;
    CU(cudaMemcpy(&st, d->status, sizeof st, cudaMemcpyDeviceToHost));
    return st;
}

static void status_zero(const dev *d) { CU(cudaMemset(d->status, 0, sizeof(gcomp_cuda_status))); }

/* header + body as the library sends it */
static void make_payload(uint8_t *out, const uint8_t *body, size_t bytes, size_t count, uint32_t flags)
{
    gcomp_header h = {
        GCOMP_HEADER_MAGIC, GCOMP_FORMAT_VERSION, GCOMP_F32, GCOMP_WIRE_ID_TOPK, flags, 0, count, bytes
    };
    gcomp_header_write(out, &h);
    memcpy(out + GCOMP_HEADER_BYTES, body, bytes);
}

/* The device decode_add of a host payload into acc (host in, host out). Returns status.error. */
static uint32_t gpu_decode_add(dev *d, const gcomp_topk_params *p, const uint8_t *payload, size_t bytes, float *acc,
                               uint32_t preset_error)
{
    gcomp_cuda_status st;
    CU(cudaMemcpy(d->payload, payload, bytes, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(d->acc, acc, d->n * 4, cudaMemcpyHostToDevice));
    status_zero(d);
    if (preset_error) CU(cudaMemcpy(&d->status->error, &preset_error, 4, cudaMemcpyHostToDevice));
    assert_int_equal(ops->decode_add(p, d->payload, bytes, d->acc, d->n, d->status, NULL), GCOMP_SUCCESS);
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(acc, d->acc, d->n * 4, cudaMemcpyDeviceToHost));
    st = status_get(d);
    return st.error;
}

/* ---- encode against the CPU, steps of error feedback ------------------------------------------- */

typedef struct enc_case {
    const char *name;
    double ratio;
    int64_t k;
    int fp16;
    enum gen gen;
    int residual; /* 0: res = NULL (x = g) */
    int steps;
} enc_case;

static void run_encode_case(const enc_case *ec, size_t n, uint64_t seed)
{
    gcomp_topk_params p = { ec->ratio, ec->k, ec->fp16 };
    dev d = dev_alloc(&p, n);
    const size_t m = n ? n : 1;
    float *g = malloc(m * 4), *r_in = calloc(m, 4), *r_out = malloc(m * 4), *r_gpu = malloc(m * 4);
    float *acc_cpu = malloc(m * 4), *acc_gpu = malloc(m * 4);
    uint8_t *body_cpu = malloc(d.cap), *body_gpu = malloc(d.cap), *payload = malloc(d.cap + GCOMP_HEADER_BYTES);
    void *state = vt->state_create(&p);
    gcomp_cuda_residual rh = { { d.r[0], d.r[1] }, 0, 0, 0 };
    char what[200];

    CU(cudaMemset(d.r[0], 0, m * 4));
    CU(cudaMemset(d.r[1], 0x7f, m * 4)); /* garbage the encode must overwrite */
    for (int step = 0; step < ec->steps; step++) {
        gcomp_encode_ctx ctx = { 0, (uint64_t)step, 0, 0, 0, 0, state };
        gcomp_cuda_status st;
        size_t written = 0;
        uint32_t flags = 0;
        gcomp_result rc;
        snprintf(what, sizeof what, "%s n=%zu step %d", ec->name, n, step);
        generate(g, n, ec->gen, seed + (uint64_t)step, 1.0f + 0.25f * (float)step);
        CU(cudaMemcpy(d.g, g, n * 4, cudaMemcpyHostToDevice));

        rc = vt->encode(&p, &ctx, g, ec->residual ? r_in : NULL, ec->residual ? r_out : NULL, n, body_cpu, d.cap,
                        &written, &flags);
        if (rc != GCOMP_SUCCESS) fail_msg("%s: CPU encode: %s", what, gcomp_last_error());

        rh.step = (uint64_t)step;
        CU(cudaMemcpy(d.res, &rh, sizeof rh, cudaMemcpyHostToDevice));
        status_zero(&d);
        {
            gcomp_encode_ctx gctx = { 0, (uint64_t)step, 0, 0, 0, 0, NULL };
            rc = ops->encode(&p, &gctx, d.g, ec->residual ? d.res : NULL, n, d.body, d.cap, d.scratch, d.status, NULL);
        }
        if (rc != GCOMP_SUCCESS) fail_msg("%s: GPU encode: %s", what, gcomp_last_error());
        CU(cudaDeviceSynchronize());
        st = status_get(&d);
        if (st.error) fail_msg("%s: GPU encode set status error %u", what, st.error);
        if (st.body_bytes != written)
            fail_msg("%s: body of %llu bytes on the GPU, %zu on the CPU", what, (unsigned long long)st.body_bytes,
                     written);
        if (st.flags != flags) fail_msg("%s: flags 0x%x on the GPU, 0x%x on the CPU", what, st.flags, flags);
        if (st.nonfinite != ctx.nonfinite)
            fail_msg("%s: nonfinite %u on the GPU, %u on the CPU", what, st.nonfinite, ctx.nonfinite);
        if (st.overflow != ctx.overflow)
            fail_msg("%s: overflow %llu on the GPU, %llu on the CPU", what, (unsigned long long)st.overflow,
                     (unsigned long long)ctx.overflow);
        CU(cudaMemcpy(body_gpu, d.body, written, cudaMemcpyDeviceToHost));
        check_bytes(what, body_cpu, body_gpu, written);

        if (ec->residual) {
            if (!ctx.nonfinite) { /* committed: both sides move to the new residual */
                CU(cudaMemcpy(r_gpu, d.r[rh.cur ^ 1], n * 4, cudaMemcpyDeviceToHost));
                check_floats(what, r_out, r_gpu, n);
                memcpy(r_in, r_out, n * 4);
                rh.cur ^= 1;
            } else { /* discarded: the residual in use must be the one from before */
                CU(cudaMemcpy(r_gpu, d.r[rh.cur], n * 4, cudaMemcpyDeviceToHost));
                check_floats(what, r_in, r_gpu, n);
            }
        }

        /* the GPU's payload decodes on the GPU as the CPU decodes it */
        generate(acc_cpu, n, GEN_GAUSS, seed + 1000 + (uint64_t)step, 0.5f);
        memcpy(acc_gpu, acc_cpu, n * 4);
        make_payload(payload, body_gpu, written, n, flags);
        rc = vt->decode_add(&p, flags, body_gpu, written, acc_cpu, n);
        if (rc != GCOMP_SUCCESS) fail_msg("%s: CPU decode of the GPU body: %s", what, gcomp_last_error());
        if (gpu_decode_add(&d, &p, payload, written + GCOMP_HEADER_BYTES, acc_gpu, 0))
            fail_msg("%s: GPU decode refused its own body", what);
        snprintf(what, sizeof what, "%s n=%zu step %d decode_add", ec->name, n, step);
        check_floats(what, acc_cpu, acc_gpu, n);
    }
    vt->state_destroy(state);
    free(g), free(r_in), free(r_out), free(r_gpu), free(acc_cpu), free(acc_gpu);
    free(body_cpu), free(body_gpu), free(payload);
    dev_free(&d);
}

static const size_t sizes[] = { 1, 127, 4099, ((size_t)1 << 20) + 3, SIZE_64MI };

/* Every size up to max_n. The quick (sanitizer) run leaves out 64 Mi, and 2^20 + 3 too
 * unless big_in_quick: instrumented kernels are slow. */
static void run_sizes_q(const enc_case *ec, size_t max_n, int big_in_quick)
{
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        if (sizes[s] > max_n || (quick && (sizes[s] >= SIZE_64MI || (!big_in_quick && sizes[s] > 4099)))) continue;
        run_encode_case(ec, sizes[s], 17 + s);
    }
}

static void run_sizes(const enc_case *ec, size_t max_n) { run_sizes_q(ec, max_n, 0); }

static void test_gauss_ef(void **state)
{
    (void)state;
    const enc_case c = { "gauss ratio 0.01 fp32", 0.01, 0, 0, GEN_GAUSS, 1, 5 };
    run_sizes_q(&c, SIZE_64MI, 1);
}

static void test_fp16_values(void **state)
{
    (void)state;
    const enc_case c = { "gauss ratio 0.01 fp16", 0.01, 0, 1, GEN_GAUSS, 1, 3 };
    const enc_case big = { "fp16 overflow", 0.05, 0, 1, GEN_BIG, 1, 2 };
    run_sizes(&c, SIZE_64MI);
    run_sizes(&big, (size_t)1 << 21);
}

static void test_no_residual(void **state)
{
    (void)state;
    const enc_case c = { "no residual", 0.02, 0, 0, GEN_GAUSS, 0, 2 };
    run_sizes(&c, (size_t)1 << 21);
}

static void test_ties(void **state)
{
    (void)state;
    /* many equal |x|: the threshold bin is huge and the lowest indices must win */
    const enc_case c[] = { { "ties ratio 0.3", 0.3, 0, 0, GEN_TIES, 1, 3 },
                           { "ties ratio 0.01", 0.01, 0, 0, GEN_TIES, 1, 3 },
                           { "zeros and gauss ratio 0.5", 0.5, 0, 0, GEN_ZEROS_AND_GAUSS, 1, 3 },
                           { "ties fp16", 0.1, 0, 1, GEN_TIES, 0, 2 } };
    /* 64 Mi only at ratio 0.01: a device decode parses its pairs one after another (about
     * 0.3 us each), and 0.3 or 0.5 of 64 Mi would take a minute per step */
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        run_sizes(&c[i], c[i].ratio <= 0.01 ? SIZE_64MI : (size_t)1 << 21);
}

static void test_k_extremes(void **state)
{
    (void)state;
    const enc_case c[] = { { "k = n", 1.0, 0, 0, GEN_GAUSS, 1, 2 },      { "k = 1", 0.01, 1, 0, GEN_GAUSS, 1, 3 },
                           { "k = 1 ties", 0.01, 1, 0, GEN_TIES, 1, 2 }, { "k = 128", 0.01, 128, 0, GEN_GAUSS, 1, 2 },
                           { "k = 129", 0.01, 129, 1, GEN_GAUSS, 1, 2 }, { "k = n fp16", 1.0, 0, 1, GEN_GAUSS, 0, 1 } };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) run_sizes(&c[i], (size_t)1 << 21);
    run_encode_case(&c[0], 0, 3); /* n = 0: the body is k = 0 */
}

static void test_nonfinite(void **state)
{
    (void)state;
    /* NaN/Inf: reported, the residual kept as it was, and the same body (the NaN is the
     * canonical one, so x = g + r has the same bits on both) */
    const enc_case c[] = { { "nan/inf", 0.01, 0, 0, GEN_NONFINITE, 1, 2 },
                           { "nan/inf fp16", 0.01, 0, 1, GEN_NONFINITE, 1, 2 },
                           { "nan/inf no residual", 0.01, 0, 0, GEN_NONFINITE, 0, 1 } };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) run_sizes(&c[i], (size_t)1 << 21);
}

/* ---- corrupt payloads: the device refuses what the CPU refuses, and touches nothing ------------ */

/* Both decoders on one (possibly corrupt) payload; they must agree. Returns 1 if refused. */
static int decode_both(dev *d, const gcomp_topk_params *p, const uint8_t *payload, size_t bytes, const float *acc0,
                       float *acc_cpu, float *acc_gpu, const char *what)
{
    gcomp_header h;
    gcomp_result rc = gcomp_header_read(payload, bytes, &h);
    uint32_t err;
    memcpy(acc_cpu, acc0, d->n * 4);
    memcpy(acc_gpu, acc0, d->n * 4);
    if (rc == GCOMP_SUCCESS)
        rc = vt->decode_add(p, h.flags, payload + GCOMP_HEADER_BYTES, (size_t)h.body_bytes, acc_cpu, d->n);
    err = gpu_decode_add(d, p, payload, bytes, acc_gpu, 0);
    if ((rc == GCOMP_SUCCESS) != (err == 0))
        fail_msg("%s: CPU says %s, GPU status error %u", what, gcomp_result_name(rc), err);
    if (err) {
        if (err != GCOMP_ERR_CORRUPT) fail_msg("%s: GPU error %u, expected GCOMP_ERR_CORRUPT", what, err);
        check_floats(what, acc0, acc_gpu, d->n); /* untouched */
        return 1;
    }
    check_floats(what, acc_cpu, acc_gpu, d->n);
    return 0;
}

static void corrupt_set(size_t n, int fp16)
{
    gcomp_topk_params p = { 0.01, 0, fp16 };
    dev d = dev_alloc(&p, n);
    float *g = malloc(n * 4), *acc0 = malloc(n * 4), *acc_cpu = malloc(n * 4), *acc_gpu = malloc(n * 4);
    uint8_t *body = malloc(d.cap), *payload = malloc(d.cap + GCOMP_HEADER_BYTES),
            *bad = malloc(d.cap + GCOMP_HEADER_BYTES);
    gcomp_encode_ctx ctx = { 0, 0, 0, 0, 0, 0, NULL };
    size_t written = 0, total;
    uint32_t flags = 0;
    uint64_t s = 99 + n, k;
    int refused = 0;
    char what[160];

    generate(g, n, GEN_GAUSS, 5, 1.0f);
    generate(acc0, n, GEN_GAUSS, 6, 1.0f);
    assert_int_equal(vt->encode(&p, &ctx, g, NULL, NULL, n, body, d.cap, &written, &flags), GCOMP_SUCCESS);
    make_payload(payload, body, written, n, flags);
    total = written + GCOMP_HEADER_BYTES;
    k = gcomp_le_load_u64(body);

    snprintf(what, sizeof what, "n=%zu fp16=%d intact", n, fp16);
    assert_int_equal(decode_both(&d, &p, payload, total, acc0, acc_cpu, acc_gpu, what), 0);

    /* a status error already set (say by the header check): nothing is added */
    memcpy(acc_gpu, acc0, n * 4);
    assert_int_equal(gpu_decode_add(&d, &p, payload, total, acc_gpu, GCOMP_ERR_CORRUPT), GCOMP_ERR_CORRUPT);
    check_floats("preset error", acc0, acc_gpu, n);

    /* truncated: the header says fewer bytes */
    for (size_t cut = 1; cut < written; cut = cut * 3 + 1) {
        size_t b = written - cut;
        make_payload(bad, body, b, n, flags);
        snprintf(what, sizeof what, "n=%zu fp16=%d truncated by %zu", n, fp16, cut);
        assert_int_equal(decode_both(&d, &p, bad, b + GCOMP_HEADER_BYTES, acc0, acc_cpu, acc_gpu, what), 1);
    }
    /* wrong k */
    {
        const uint64_t ks[] = { k + 1, k - 1, 0, k + 128, n + 1, ~0ull, k ^ (1ull << 40) };
        for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
            memcpy(bad, payload, total);
            gcomp_le_store_u64(bad + GCOMP_HEADER_BYTES, ks[i]);
            snprintf(what, sizeof what, "n=%zu fp16=%d k=%llu instead of %llu", n, fp16, (unsigned long long)ks[i],
                     (unsigned long long)k);
            assert_int_equal(decode_both(&d, &p, bad, total, acc0, acc_cpu, acc_gpu, what), 1);
        }
    }
    /* unknown flags */
    make_payload(bad, body, written, n, flags | 2u);
    assert_int_equal(decode_both(&d, &p, bad, total, acc0, acc_cpu, acc_gpu, "unknown flags"), 1);
    /* flipped bytes anywhere in the body: whatever the CPU decides, the GPU decides too */
    const int trials = quick ? 60 : 300;
    for (int t = 0; t < trials; t++) {
        int flips = 1 + (int)(tu_next(&s) % 3);
        memcpy(bad, payload, total);
        for (int f = 0; f < flips; f++) {
            size_t at = GCOMP_HEADER_BYTES + (size_t)(tu_next(&s) % written);
            bad[at] ^= (uint8_t)(1u << (tu_next(&s) % 8));
        }
        snprintf(what, sizeof what, "n=%zu fp16=%d flip trial %d", n, fp16, t);
        refused += decode_both(&d, &p, bad, total, acc0, acc_cpu, acc_gpu, what);
    }
    print_message("n=%zu fp16=%d: %d of %d flipped bodies refused by both decoders\n", n, fp16, refused, trials);
    assert_true(refused > 0);
    free(g), free(acc0), free(acc_cpu), free(acc_gpu), free(body), free(payload), free(bad);
    dev_free(&d);
}

static void test_corrupt(void **state)
{
    (void)state;
    corrupt_set(4099, 0);
    corrupt_set(4099, 1);
    corrupt_set(((size_t)1 << 16) + 5, 0);
}

/* ---- a body buffer under max_body_bytes: the CPU's rule --------------------------------------- */

/* The CPU encode accepts any cap its body fits in and refuses a smaller one with
 * GCOMP_ERR_BUFFER_TOO_SMALL, writing nothing (codecs/topk.c); the GPU's does the same, its
 * refusal in status->error (the size is known on the device only), the body untouched and the
 * residual in use too. It used to refuse every cap under max_body_bytes. The body buffer is
 * exactly cap bytes of device memory, so the sanitizer sees a write past it. */
static void small_cap_case(const char *name, gcomp_topk_params p, size_t n, int residual)
{
    dev d = dev_alloc(&p, n);
    float *g = malloc(n * 4), *r_in = malloc(n * 4), *r_out = malloc(n * 4), *r_gpu = malloc(n * 4);
    uint8_t *body_full = malloc(d.cap), *body_cpu = malloc(d.cap), *body_gpu = malloc(d.cap), *d_body;
    void *state = vt->state_create(&p);
    gcomp_cuda_residual rh = { { d.r[0], d.r[1] }, 0, 0, 0 };
    gcomp_encode_ctx ctx = { 0, 0, 0, 0, 0, 0, state }, gctx = { 0, 0, 0, 0, 0, 0, NULL };
    size_t need = 0, w = 0;
    uint32_t flags = 0;
    char what[160];

    generate(g, n, GEN_GAUSS, 61, 1.0f);
    generate(r_in, n, GEN_GAUSS, 62, 0.1f);
    CU(cudaMemcpy(d.g, g, n * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(d.r[0], r_in, n * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(d.res, &rh, sizeof rh, cudaMemcpyHostToDevice));
    assert_int_equal(
        vt->encode(&p, &ctx, g, residual ? r_in : NULL, residual ? r_out : NULL, n, body_full, d.cap, &need, &flags),
        GCOMP_SUCCESS);
    if (need >= d.cap) fail_msg("%s: a body of %zu bytes is not under the bound %zu", name, need, d.cap);
    for (int fits = 1; fits >= 0; fits--) { /* exactly the body's size, then one byte less */
        const size_t cap = need - (fits ? 0 : 1);
        gcomp_cuda_status st;
        gcomp_result rc;
        snprintf(what, sizeof what, "%s n=%zu cap %zu of %zu", name, n, cap, need);
        memset(body_cpu, 0x5a, cap);
        rc = vt->encode(&p, &ctx, g, residual ? r_in : NULL, residual ? r_out : NULL, n, body_cpu, cap, &w, &flags);
        assert_int_equal(rc, fits ? GCOMP_SUCCESS : GCOMP_ERR_BUFFER_TOO_SMALL);
        CU(cudaMalloc((void **)&d_body, cap));
        CU(cudaMemset(d_body, 0x5a, cap));
        status_zero(&d);
        assert_int_equal(
            ops->encode(&p, &gctx, d.g, residual ? d.res : NULL, n, d_body, cap, d.scratch, d.status, NULL),
            GCOMP_SUCCESS);
        CU(cudaDeviceSynchronize());
        st = status_get(&d);
        CU(cudaMemcpy(body_gpu, d_body, cap, cudaMemcpyDeviceToHost));
        CU(cudaFree(d_body));
        check_bytes(what, body_cpu, body_gpu, cap); /* the body, or the untouched 0x5a of a refusal */
        if (!fits) {
            if (st.error != GCOMP_ERR_BUFFER_TOO_SMALL)
                fail_msg("%s: GPU status error %u, expected GCOMP_ERR_BUFFER_TOO_SMALL", what, st.error);
            CU(cudaMemcpy(r_gpu, d.r[0], n * 4, cudaMemcpyDeviceToHost)); /* the residual in use */
            check_floats(what, r_in, r_gpu, n);
            continue;
        }
        if (st.error) fail_msg("%s: GPU status error %u", what, st.error);
        if (st.body_bytes != w)
            fail_msg("%s: %llu bytes on the GPU, %zu on the CPU", what, (unsigned long long)st.body_bytes, w);
        check_bytes(what, body_full, body_gpu, w);
        if (residual) {
            CU(cudaMemcpy(r_gpu, d.r[1], n * 4, cudaMemcpyDeviceToHost));
            check_floats(what, r_out, r_gpu, n);
        }
    }
    /* under the 8 bytes of k: refused at once by both */
    assert_int_equal(vt->encode(&p, &ctx, g, NULL, NULL, n, body_cpu, 7, &w, &flags), GCOMP_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(ops->encode(&p, &gctx, d.g, NULL, n, d.body, 7, d.scratch, d.status, NULL),
                     GCOMP_ERR_BUFFER_TOO_SMALL);
    vt->state_destroy(state);
    free(g), free(r_in), free(r_out), free(r_gpu), free(body_full), free(body_cpu), free(body_gpu);
    dev_free(&d);
}

static void test_small_cap(void **state)
{
    (void)state;
    small_cap_case("ratio 0.01 fp32", (gcomp_topk_params){ 0.01, 0, 0 }, 4099, 1);
    small_cap_case("ratio 0.05 fp16", (gcomp_topk_params){ 0.05, 0, 1 }, 65541, 1);
    small_cap_case("k = 1 no residual", (gcomp_topk_params){ 0.01, 1, 0 }, 4099, 0);
}

/* The codec object on device buffers with an output under gcomp_codec_max_encoded_bytes, as
 * on host buffers: a payload that fits is written (the same bytes and residual), one that
 * does not is GCOMP_ERR_BUFFER_TOO_SMALL, returned by the call itself (from the status read
 * back for the body size; it used to be left there unread), with the output untouched, the
 * residual kept and a key's failed first call leaving no key. */
#define CODEC_KEY 42

/* Bytes of the next payload of CODEC_KEY for g: encoded on the host object probe with the
 * residual of `from` (zero while from has none). */
static size_t next_size(gcomp_codec *probe, gcomp_codec *from, const float *g, size_t n, uint8_t *out, size_t cap)
{
    float *r = calloc(n, 4);
    size_t w = 0;
    if (gcomp_codec_residual_get(from, CODEC_KEY, r, n) != GCOMP_SUCCESS) memset(r, 0, n * 4);
    assert_int_equal(gcomp_codec_residual_set(probe, CODEC_KEY, r, n), GCOMP_SUCCESS);
    assert_int_equal(gcomp_codec_encode(probe, CODEC_KEY, g, n, GCOMP_F32, out, cap, &w), GCOMP_SUCCESS);
    free(r);
    return w;
}

/* Both objects hold the same residual for CODEC_KEY, or neither holds one. */
static void same_key_state(const char *what, gcomp_codec *cpu, gcomp_codec *gpu, size_t n)
{
    float *rc = malloc(n * 4), *rg = malloc(n * 4);
    gcomp_result hc = gcomp_codec_residual_get(cpu, CODEC_KEY, rc, n),
                 hg = gcomp_codec_residual_get(gpu, CODEC_KEY, rg, n);
    if (hc != hg)
        fail_msg("%s: residual_get %s on the host, %s on the device", what, gcomp_result_name(hc),
                 gcomp_result_name(hg));
    if (hc == GCOMP_SUCCESS) check_floats(what, rc, rg, n);
    free(rc), free(rg);
}

static void test_small_output_codec(void **state)
{
    const size_t n = 4099;
    gcomp_codec *cpu = NULL, *gpu = NULL, *probe = NULL;
    gcomp_codec_options o = gcomp_codec_options_default();
    size_t cap, w, wc = 0, wg = 0;
    float *g = malloc(n * 4), *d_g;
    uint8_t *pc, *pg, *pat, *d_p;
    gcomp_stats sc, sg;
    char what[96];
    (void)state;
    assert_int_equal(gcomp_codec_create("topk:ratio=0.05", &o, &cpu), GCOMP_SUCCESS);
    assert_int_equal(gcomp_codec_create("topk:ratio=0.05", &o, &gpu), GCOMP_SUCCESS);
    assert_int_equal(gcomp_codec_create("topk:ratio=0.05", &o, &probe), GCOMP_SUCCESS);
    cap = gcomp_codec_max_encoded_bytes(cpu, n);
    pc = malloc(cap), pg = malloc(cap), pat = malloc(cap);
    memset(pat, 0xa5, cap);
    CU(cudaMalloc((void **)&d_g, n * 4));
    CU(cudaMalloc((void **)&d_p, cap));
    for (int step = 0; step < 3; step++) {
        generate(g, n, GEN_GAUSS, 70 + (uint64_t)step, 1.0f);
        CU(cudaMemcpy(d_g, g, n * 4, cudaMemcpyHostToDevice));
        w = next_size(probe, cpu, g, n, pc, cap);
        if (w >= cap) fail_msg("step %d: a payload of %zu bytes is not under the bound %zu", step, w, cap);
        snprintf(what, sizeof what, "step %d, output of %zu bytes for %zu", step, w - 1, w);
        CU(cudaMemcpy(d_p, pat, cap, cudaMemcpyHostToDevice));
        EXPECT(gcomp_codec_encode(cpu, CODEC_KEY, g, n, GCOMP_F32, pc, w - 1, &wc), GCOMP_ERR_BUFFER_TOO_SMALL, NULL);
        if (step == 1) /* async: the read-back of the size brings the refusal at once */
            EXPECT(gcomp_codec_encode_async(gpu, CODEC_KEY, d_g, n, GCOMP_F32, d_p, w - 1, &wg, NULL),
                   GCOMP_ERR_BUFFER_TOO_SMALL, "body needs");
        else
            EXPECT(gcomp_codec_encode(gpu, CODEC_KEY, d_g, n, GCOMP_F32, d_p, w - 1, &wg), GCOMP_ERR_BUFFER_TOO_SMALL,
                   "body needs");
        CU(cudaMemcpy(pg, d_p, cap, cudaMemcpyDeviceToHost));
        check_bytes(what, pat, pg, cap);
        same_key_state(what, cpu, gpu, n); /* step 0: no key on either */

        snprintf(what, sizeof what, "step %d, output of exactly %zu bytes", step, w);
        OK(gcomp_codec_encode(cpu, CODEC_KEY, g, n, GCOMP_F32, pc, w, &wc));
        OK(gcomp_codec_encode(gpu, CODEC_KEY, d_g, n, GCOMP_F32, d_p, w, &wg));
        if (wc != w || wg != w) fail_msg("%s: %zu bytes on the host, %zu on the device", what, wc, wg);
        CU(cudaMemcpy(pg, d_p, w, cudaMemcpyDeviceToHost));
        check_bytes(what, pc, pg, w);
        same_key_state(what, cpu, gpu, n);
    }
    OK(gcomp_codec_sync(gpu, NULL)); /* the refusals left nothing in the tally */
    OK(gcomp_codec_stats_get(cpu, &sc));
    OK(gcomp_codec_stats_get(gpu, &sg));
    assert_int_equal(sc.encode_calls, 3);
    assert_int_equal(sg.encode_calls, sc.encode_calls);
    assert_int_equal(sg.wire_bytes, sc.wire_bytes);
    CU(cudaFree(d_g));
    CU(cudaFree(d_p));
    free(g), free(pc), free(pg), free(pat);
    gcomp_codec_destroy(cpu), gcomp_codec_destroy(gpu), gcomp_codec_destroy(probe);
}

/* ---- a payload shorter than its header --------------------------------------------------------- */

/* Given to the ops directly (no header check before it: status clear), 16 bytes of device
 * memory are refused (GCOMP_ERR_CORRUPT, acc and the sum's result untouched) without a byte
 * read past them. tk_payload_body read the header's size field at payload + 24 before it
 * compared cap with the header's 32 bytes: invisible in the results, an out-of-bounds read
 * for the sanitizer step of scripts/gpu-check.sh, which is where this test fails without the
 * check first. */
static void test_payload_shorter_than_header(void **state)
{
    gcomp_topk_params p = { 0.01, 0, 0 };
    const size_t n = 4099, tiny_cap = 16;
    dev d = dev_alloc(&p, n);
    uint8_t head[GCOMP_HEADER_BYTES], *tiny;
    const uint8_t **dptr;
    float *acc0 = malloc(n * 4), *acc = malloc(n * 4);
    gcomp_header h = { GCOMP_HEADER_MAGIC, GCOMP_FORMAT_VERSION, GCOMP_F32, GCOMP_WIRE_ID_TOPK, 0, 0, n, 0 };
    (void)state;
    gcomp_header_write(head, &h); /* the first 16 bytes of a real header */
    CU(cudaMalloc((void **)&tiny, tiny_cap));
    CU(cudaMemcpy(tiny, head, tiny_cap, cudaMemcpyHostToDevice));
    CU(cudaMalloc((void **)&dptr, sizeof *dptr));
    CU(cudaMemcpy(dptr, &tiny, sizeof tiny, cudaMemcpyHostToDevice));
    generate(acc0, n, GEN_GAUSS, 81, 1.0f);

    CU(cudaMemcpy(d.acc, acc0, n * 4, cudaMemcpyHostToDevice));
    status_zero(&d);
    assert_int_equal(ops->decode_add(&p, tiny, tiny_cap, d.acc, n, d.status, NULL), GCOMP_SUCCESS);
    CU(cudaDeviceSynchronize());
    assert_int_equal(status_get(&d).error, GCOMP_ERR_CORRUPT);
    CU(cudaMemcpy(acc, d.acc, n * 4, cudaMemcpyDeviceToHost));
    check_floats("decode_add of 16 bytes", acc0, acc, n);

    status_zero(&d);
    assert_int_equal(ops->sum_payloads(&p, dptr, 1, tiny_cap, d.acc, n, 1.0f, d.scratch, d.status, NULL),
                     GCOMP_SUCCESS);
    CU(cudaDeviceSynchronize());
    assert_int_equal(status_get(&d).error, GCOMP_ERR_CORRUPT);
    CU(cudaMemcpy(acc, d.acc, n * 4, cudaMemcpyDeviceToHost));
    check_floats("sum_payloads of 16 bytes", acc0, acc, n);

    CU(cudaFree(tiny));
    CU(cudaFree((void *)dptr));
    free(acc0), free(acc);
    dev_free(&d);
}

/* ---- sparse gather: the pair sum of N payloads in rank order ----------------------------------- */

/* opposite_inf: odd ranks put -inf and even ranks +inf at one index (a NaN sum) */
static void sum_case(size_t n, int ranks, float divisor, int fp16, int corrupt_rank, int opposite_inf)
{
    gcomp_topk_params p = { 0.02, 0, fp16 };
    const size_t cap = vt->max_body_bytes(&p, n) + GCOMP_HEADER_BYTES, per = ops->scratch_bytes(&p, n);
    const uint64_t k = gcomp_topk_k(&p, n);
    uint8_t *payloads = malloc(cap * (size_t)ranks), *dpay = NULL, *scratch = NULL;
    const uint8_t **dptr_h = malloc(sizeof(uint8_t *) * (size_t)ranks), **dptr = NULL;
    gcomp_topk_pairs *lists = malloc(sizeof *lists * (size_t)ranks);
    uint64_t *idx = malloc(sizeof *idx * (size_t)k * (size_t)ranks);
    float *val = malloc(sizeof *val * (size_t)k * (size_t)ranks), *g = malloc(n * 4);
    float *want = malloc(n * 4), *got = malloc(n * 4), *dres = NULL;
    gcomp_cuda_status *dst = NULL, st;
    char what[160];

    snprintf(what, sizeof what, "sum n=%zu ranks=%d divisor=%g fp16=%d corrupt=%d inf=%d", n, ranks, (double)divisor,
             fp16, corrupt_rank, opposite_inf);
    CU(cudaMalloc((void **)&dpay, cap * (size_t)ranks));
    CU(cudaMalloc((void **)&dptr, sizeof(uint8_t *) * (size_t)ranks));
    CU(cudaMalloc((void **)&scratch, per * (size_t)ranks));
    CU(cudaMalloc((void **)&dres, n * 4));
    CU(cudaMalloc((void **)&dst, sizeof *dst));
    for (int j = 0; j < ranks; j++) {
        gcomp_encode_ctx ctx = { 0, 0, 0, (uint32_t)j, 0, 0, NULL };
        uint8_t *body = malloc(cap);
        size_t written = 0, got_k = 0;
        uint32_t flags = 0;
        generate(g, n, j == 1 ? GEN_TIES : GEN_GAUSS, 40 + (uint64_t)j, 1.0f + (float)j);
        if (opposite_inf) g[n / 2] = (j % 2) ? -INFINITY : INFINITY; /* sums to the CPU's NaN 0xffc00000 */
        assert_int_equal(vt->encode(&p, &ctx, g, NULL, NULL, n, body, cap, &written, &flags), GCOMP_SUCCESS);
        make_payload(payloads + (size_t)j * cap, body, written, n, flags);
        assert_int_equal(gcomp__topk_body_pairs(flags, body, written, n, (size_t)k, idx + (size_t)j * k,
                                                val + (size_t)j * k, &got_k),
                         GCOMP_SUCCESS);
        lists[j].idx = idx + (size_t)j * k;
        lists[j].val = val + (size_t)j * k;
        lists[j].k = got_k;
        if (j == corrupt_rank) payloads[(size_t)j * cap + GCOMP_HEADER_BYTES + written / 2] ^= 0x5a;
        dptr_h[j] = dpay + (size_t)j * cap;
        free(body);
    }
    gcomp__topk_sum_pairs(lists, ranks, want, n, divisor);
    CU(cudaMemcpy(dpay, payloads, cap * (size_t)ranks, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dptr, dptr_h, sizeof(uint8_t *) * (size_t)ranks, cudaMemcpyHostToDevice));
    generate(got, n, GEN_GAUSS, 77, 1.0f); /* what must stay when a payload is corrupt */
    CU(cudaMemcpy(dres, got, n * 4, cudaMemcpyHostToDevice));
    CU(cudaMemset(dst, 0, sizeof *dst));
    assert_int_equal(ops->sum_payloads(&p, dptr, ranks, cap, dres, n, divisor, scratch, dst, NULL), GCOMP_SUCCESS);
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(&st, dst, sizeof st, cudaMemcpyDeviceToHost));
    if (corrupt_rank >= 0) {
        float *before = malloc(n * 4);
        memcpy(before, got, n * 4);
        CU(cudaMemcpy(got, dres, n * 4, cudaMemcpyDeviceToHost));
        /* a flipped byte may still decode (a different value); if so, the sum is simply different */
        if (st.error) {
            if (st.error != GCOMP_ERR_CORRUPT) fail_msg("%s: status error %u", what, st.error);
            check_floats(what, before, got, n);
        }
        free(before);
    } else {
        if (st.error) fail_msg("%s: status error %u", what, st.error);
        CU(cudaMemcpy(got, dres, n * 4, cudaMemcpyDeviceToHost));
        check_floats(what, want, got, n);
    }
    CU(cudaFree(dpay));
    CU(cudaFree(dptr));
    CU(cudaFree(scratch));
    CU(cudaFree(dres));
    CU(cudaFree(dst));
    free(payloads), free(dptr_h), free(lists), free(idx), free(val), free(g), free(want), free(got);
}

static void test_sum_payloads(void **state)
{
    (void)state;
    sum_case(1, 1, 1.0f, 0, -1, 0);
    sum_case(127, 3, 3.0f, 0, -1, 0);
    sum_case(4099, 4, 4.0f, 0, -1, 0);
    sum_case(4099, 5, 5.0f, 1, -1, 0);
    sum_case(((size_t)1 << 20) + 3, 3, 1.0f, 0, -1, 0);
    sum_case(((size_t)1 << 20) + 3, 8, 8.0f, 1, -1, 0);
    sum_case(4099, 3, 3.0f, 0, 1, 0);
    sum_case(((size_t)1 << 16) + 1, 2, 2.0f, 0, 0, 0);
    sum_case(4099, 2, 2.0f, 0, -1, 1); /* +inf and -inf at one index */
    sum_case(4099, 3, 3.0f, 1, -1, 1);
    /* a k that is not the expected one is refused, as the CPU's sparse gather refuses it */
    {
        gcomp_topk_params p = { 0.02, 0, 0 }, q = { 0.03, 0, 0 };
        const size_t n = 4099, cap = vt->max_body_bytes(&q, n) + GCOMP_HEADER_BYTES;
        uint8_t *payload = malloc(cap), *body = malloc(cap), *dpay, *scratch;
        const uint8_t **dptr;
        float *g = malloc(n * 4), *dres;
        gcomp_cuda_status *dst, st;
        gcomp_encode_ctx ctx = { 0, 0, 0, 0, 0, 0, NULL };
        size_t written = 0;
        uint32_t flags = 0;
        generate(g, n, GEN_GAUSS, 3, 1.0f);
        assert_int_equal(vt->encode(&q, &ctx, g, NULL, NULL, n, body, cap, &written, &flags), GCOMP_SUCCESS);
        make_payload(payload, body, written, n, flags);
        CU(cudaMalloc((void **)&dpay, cap));
        CU(cudaMalloc((void **)&dptr, sizeof *dptr));
        CU(cudaMalloc((void **)&scratch, ops->scratch_bytes(&p, n)));
        CU(cudaMalloc((void **)&dres, n * 4));
        CU(cudaMalloc((void **)&dst, sizeof *dst));
        CU(cudaMemcpy(dpay, payload, cap, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dptr, &dpay, sizeof dpay, cudaMemcpyHostToDevice));
        CU(cudaMemset(dst, 0, sizeof *dst));
        assert_int_equal(ops->sum_payloads(&p, dptr, 1, cap, dres, n, 1.0f, scratch, dst, NULL), GCOMP_SUCCESS);
        CU(cudaDeviceSynchronize());
        CU(cudaMemcpy(&st, dst, sizeof st, cudaMemcpyDeviceToHost));
        assert_int_equal(st.error, GCOMP_ERR_CORRUPT);
        CU(cudaFree(dpay));
        CU(cudaFree(dptr));
        CU(cudaFree(scratch));
        CU(cudaFree(dres));
        CU(cudaFree(dst));
        free(payload), free(body), free(g);
    }
}

/* ---- timing (printed, not asserted: bench/codec_perf --device cuda is the benchmark) ------------ */

static void test_timing(void **state)
{
    (void)state;
    if (quick) { /* the sanitizer run: nothing to time there */
        skip();
        return;
    }
    const size_t n = SIZE_64MI;
    gcomp_topk_params p = { 0.01, 0, 0 };
    dev d = dev_alloc(&p, n);
    gcomp_cuda_residual rh = { { d.r[0], d.r[1] }, 0, 0, 0 };
    gcomp_encode_ctx ctx = { 0, 0, 0, 0, 0, 0, NULL };
    float *g = malloc(n * 4), ms_enc = 0, ms_copy = 0, ms_dec = 0;
    cudaEvent_t e0, e1;
    gcomp_cuda_status st;
    const int reps = 10;
    generate(g, n, GEN_GAUSS, 8, 1.0f);
    CU(cudaMemcpy(d.g, g, n * 4, cudaMemcpyHostToDevice));
    CU(cudaMemset(d.r[0], 0, n * 4));
    CU(cudaMemcpy(d.res, &rh, sizeof rh, cudaMemcpyHostToDevice));
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    for (int w = 0; w < 2; w++) /* warm-up */
        assert_int_equal(ops->encode(&p, &ctx, d.g, d.res, n, d.body, d.cap, d.scratch, d.status, NULL), GCOMP_SUCCESS);
    CU(cudaEventRecord(e0, NULL));
    for (int i = 0; i < reps; i++)
        assert_int_equal(ops->encode(&p, &ctx, d.g, d.res, n, d.body, d.cap, d.scratch, d.status, NULL), GCOMP_SUCCESS);
    CU(cudaEventRecord(e1, NULL));
    CU(cudaEventSynchronize(e1));
    CU(cudaEventElapsedTime(&ms_enc, e0, e1));
    CU(cudaEventRecord(e0, NULL));
    for (int i = 0; i < reps; i++) CU(cudaMemcpyAsync(d.r[1], d.g, n * 4, cudaMemcpyDeviceToDevice, NULL));
    CU(cudaEventRecord(e1, NULL));
    CU(cudaEventSynchronize(e1));
    CU(cudaEventElapsedTime(&ms_copy, e0, e1));
    st = status_get(&d);
    assert_int_equal(st.error, 0);
    {
        uint8_t *payload = malloc(st.body_bytes + GCOMP_HEADER_BYTES), *body = malloc(st.body_bytes);
        CU(cudaMemcpy(body, d.body, st.body_bytes, cudaMemcpyDeviceToHost));
        make_payload(payload, body, st.body_bytes, n, st.flags);
        CU(cudaMemcpy(d.payload, payload, st.body_bytes + GCOMP_HEADER_BYTES, cudaMemcpyHostToDevice));
        CU(cudaMemset(d.acc, 0, n * 4));
        status_zero(&d);
        CU(cudaEventRecord(e0, NULL));
        assert_int_equal(ops->decode_add(&p, d.payload, st.body_bytes + GCOMP_HEADER_BYTES, d.acc, n, d.status, NULL),
                         GCOMP_SUCCESS);
        CU(cudaEventRecord(e1, NULL));
        CU(cudaEventSynchronize(e1));
        CU(cudaEventElapsedTime(&ms_dec, e0, e1));
        free(payload), free(body);
    }
    /* effective bytes as codec_perf counts them: encode reads g and r, writes r and the body;
     * the copy reads and writes n floats */
    {
        const double enc = ms_enc / reps, copy = ms_copy / reps;
        const double enc_gbs = (12.0 * (double)n + (double)st.body_bytes) / (enc * 1e6),
                     copy_gbs = 8.0 * (double)n / (copy * 1e6);
        print_message("top-k 1%% of %zu floats: encode %.3f ms (%.0f GB/s effective), D2D copy %.3f ms (%.0f GB/s), "
                      "ratio %.2f; decode_add %.3f ms (serial block chain)\n",
                      n, enc, enc_gbs, copy, copy_gbs, enc_gbs / copy_gbs, (double)ms_dec);
    }
    CU(cudaEventDestroy(e0));
    CU(cudaEventDestroy(e1));
    free(g);
    dev_free(&d);
}

int main(void)
{
    const char *q = getenv("GCOMP_TEST_QUICK");
    if (cuda_test_no_device("test_cuda_topk")) return 77;
    quick = q && *q && strcmp(q, "0") != 0;
    vt = gcomp_codec_find("topk");
    if (!vt || !vt->cuda) {
        printf("test_cuda_topk: the topk codec has no CUDA ops in this build\n");
        return 1;
    }
    ops = vt->cuda;
    if (getenv("GCOMP_TEST_ONLY")) cmocka_set_test_filter(getenv("GCOMP_TEST_ONLY")); /* e.g. test_timing */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gauss_ef),
        cmocka_unit_test(test_fp16_values),
        cmocka_unit_test(test_no_residual),
        cmocka_unit_test(test_ties),
        cmocka_unit_test(test_k_extremes),
        cmocka_unit_test(test_nonfinite),
        cmocka_unit_test(test_corrupt),
        cmocka_unit_test(test_sum_payloads),
        cmocka_unit_test(test_small_cap),
        cmocka_unit_test(test_small_output_codec),
        cmocka_unit_test(test_payload_shorter_than_header),
        cmocka_unit_test(test_timing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
