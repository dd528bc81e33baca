/*
 * test_cuda_terngrad.c — TernGrad's CUDA ops (cuda/terngrad.cu) against the CPU reference
 * (codecs/terngrad.c), byte for byte: encode payloads and residuals over five steps of error
 * feedback (no residual, in place, double-buffered), NaN/Inf, decode-add and corrupt payloads,
 * and the integer ring's entries (local scales, ternarise, packed sums, final values).
 * Exits 77 (skipped) without a CUDA device. GCOMP_CUDA_TEST_MAX_COUNT=N leaves out sizes above
 * N elements, GCOMP_TEST_QUICK=1 those above 4 Mi (the compute-sanitizer run: 64 Mi elements
 * take long there).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "codecs/terngrad.h"
#include "test_util.h"
#include "cuda_test_util.h"

static const gcomp_codec_vtable *vt = &gcomp__codec_terngrad;
static size_t max_n = SIZE_MAX; /* sizes above are left out (environment, see above) */

static void *dup_to_dev(const void *h, size_t bytes)
{
    void *d = dmalloc(bytes);
    if (bytes) CU(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}
static void to_host(void *h, const void *d, size_t bytes)
{
    CU(cudaDeviceSynchronize());
    if (bytes) CU(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

/* Fails with the first differing byte (and its element, for float arrays). */
static void same_bytes(const void *want, const void *got, size_t bytes, const char *what, const char *ctx)
{
    const uint8_t *a = want, *b = got;
    for (size_t i = 0; i < bytes; i++)
        if (a[i] != b[i])
            fail_msg("%s (%s): byte %zu differs: cpu 0x%02x gpu 0x%02x (of %zu bytes)", what, ctx, i, a[i], b[i],
                     bytes);
}
static void same_floats(const float *want, const float *got, size_t n, const char *what, const char *ctx)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&want[i], &got[i], 4))
            fail_msg("%s (%s): element %zu differs: cpu %.9g gpu %.9g (of %zu)", what, ctx, i, want[i], got[i], n);
}

/* Gaussian-ish data for step s without a new Gaussian draw per step. */
static void step_data(const float *base, size_t n, int s, float *g)
{
    float f = 1.0f + 0.25f * (float)s;
    for (size_t i = 0; i < n; i++) g[i] = base[(i + (size_t)s * 7919u) % n] * f;
}

static const size_t sizes[] = { 1, 127, 4099, (1u << 20) + 3, (size_t)64 << 20 };
#define NSIZES (sizeof sizes / sizeof sizes[0])

typedef struct spec {
    int64_t bucket;
    double clip;
} spec;
/* one scale (with and without clip), fused buckets (4096, 100, 8192), the passes with
 * buckets (8196: just above the fused limit; 300000: more than one rms group per bucket) */
static const spec specs[] = { { 0, 2.5 },    { 0, 0 },      { 4096, 2.5 },  { 100, 0 },
                              { 8192, 2.5 }, { 8196, 2.5 }, { 300000, 2.5 } };
#define NSPECS (sizeof specs / sizeof specs[0])

enum {
    RES_NONE,
    RES_IN_PLACE,
    RES_DOUBLE
};

/* ---- encode: payload, residual and status against the CPU over `steps` steps ----------- */

typedef struct enc_case {
    spec sp;
    size_t n;
    int mode;
    uint64_t offset;
    int steps;
    int bad_step; /* step whose gradient holds a NaN (and an Inf one step later), or -1 */
    int shift;    /* device arrays start this many floats into their allocation (alignment) */
} enc_case;

static void run_encode(const enc_case *c)
{
    gcomp_terngrad_params p = { c->sp.bucket, c->sp.clip };
    const gcomp_codec_cuda_ops *ops = vt->cuda;
    size_t n = c->n, cap = vt->max_body_bytes(&p, n), scratch_bytes = ops->scratch_bytes(&p, n);
    char name[160];
    float *base = tu_gauss_array(n, 1234 + n), *g = malloc(n * 4 + 4), *r = malloc(n * 4 + 4), *rg = malloc(n * 4 + 4);
    uint8_t *body = malloc(cap + 1), *gbody = malloc(cap + 1);
    const size_t sh = (size_t)c->shift;
    float *dg0 = dmalloc((n + sh) * 4),
          *dr0[2] = { dmalloc((n + sh) * 4), c->mode == RES_DOUBLE ? dmalloc((n + sh) * 4) : NULL };
    float *dg = dg0 + sh, *dr[2] = { dr0[0] + sh, dr0[1] ? dr0[1] + sh : NULL };
    uint8_t *dbody = dmalloc(cap);
    void *dscratch = dmalloc(scratch_bytes);
    gcomp_cuda_residual hres = { { NULL, NULL }, 0, 0, 0 }, *dres = dmalloc(sizeof hres);
    gcomp_cuda_status st, *dst = dmalloc(sizeof st);
    for (size_t i = 0; i < n; i++) r[i] = 0.1f * base[(i * 31 + 7) % n]; /* a residual from step 0 */
    CU(cudaMemcpy(dr[0], r, n * 4, cudaMemcpyHostToDevice));
    for (int s = 0; s < c->steps; s++) {
        gcomp_encode_ctx cc = { 0 }, gc = { 0 };
        size_t written = 0;
        uint32_t flags = 7;
        snprintf(name, sizeof name, "bucket=%lld clip=%g n=%zu mode=%d offset=%llu shift=%d step %d",
                 (long long)p.bucket, p.clip, n, c->mode, (unsigned long long)c->offset, c->shift, s);
        step_data(base, n, s, g);
        if (s == c->bad_step) g[n / 2] = NAN;
        if (s == c->bad_step + 1 && c->bad_step >= 0) g[n - 1] = -INFINITY;
        cc.seed = gc.seed = 42;
        cc.step = (uint64_t)s;
        gc.step = c->mode == RES_NONE ? (uint64_t)s : 999; /* with a residual, the step is res->step */
        cc.rank = gc.rank = 3;
        cc.offset = gc.offset = c->offset;
        assert_int_equal(vt->encode(&p, &cc, g, c->mode ? r : NULL, c->mode ? r : NULL, n, body, cap, &written, &flags),
                         GCOMP_SUCCESS);
        CU(cudaMemcpy(dg, g, n * 4, cudaMemcpyHostToDevice));
        hres.buf[hres.cur] = dr[0];
        hres.buf[hres.cur ^ 1] = dr[1];
        hres.step = (uint64_t)s;
        CU(cudaMemcpy(dres, &hres, sizeof hres, cudaMemcpyHostToDevice));
        CU(cudaMemset(dst, 0xff, sizeof st)); /* encode must fill every field it owns */
        CU(cudaMemset(&dst->error, 0, 4));
        CU(cudaMemset(dbody, 0xa5, cap));
        assert_int_equal(ops->encode(&p, &gc, dg, c->mode ? dres : NULL, n, dbody, cap, dscratch, dst, NULL),
                         GCOMP_SUCCESS);
        to_host(gbody, dbody, cap);
        to_host(&st, dst, sizeof st);
        if (st.body_bytes != written)
            fail_msg("%s: body_bytes %llu, cpu %zu", name, (unsigned long long)st.body_bytes, written);
        if (st.flags != flags || st.overflow != 0 || st.error != 0)
            fail_msg("%s: status flags %u overflow %llu error %u", name, st.flags, (unsigned long long)st.overflow,
                     st.error);
        if (st.nonfinite != cc.nonfinite) fail_msg("%s: nonfinite gpu %u cpu %u", name, st.nonfinite, cc.nonfinite);
        same_bytes(body, gbody, written, "payload", name);
        if (c->mode == RES_NONE) continue;
        if (!st.nonfinite) { /* what the library's commit kernel does */
            if (c->mode == RES_DOUBLE) {
                float *t = dr[0];
                dr[0] = dr[1];
                dr[1] = t;
                hres.cur ^= 1;
            }
        }
        to_host(rg, dr[0], n * 4);
        same_floats(r, rg, n, st.nonfinite ? "residual (must be untouched)" : "residual", name);
    }
    CU(cudaFree(dg0));
    CU(cudaFree(dr0[0]));
    if (dr0[1]) CU(cudaFree(dr0[1]));
    CU(cudaFree(dbody));
    CU(cudaFree(dscratch));
    CU(cudaFree(dres));
    CU(cudaFree(dst));
    free(base), free(g), free(r), free(rg), free(body), free(gbody);
}

static void test_encode(void **state)
{
    (void)state;
    for (size_t k = 0; k < NSIZES; k++) {
        if (sizes[k] > max_n) continue;
        for (size_t j = 0; j < NSPECS; j++)
            for (int mode = RES_NONE; mode <= RES_DOUBLE; mode++) {
                enc_case c = { specs[j], sizes[k], mode, 0, 5, -1, 0 };
                if (sizes[k] > (4u << 20)) { /* 64 Mi: the specs that differ in kind, fewer steps */
                    if (j != 0 && j != 2 && j != 6) continue;
                    c.steps = 2;
                }
                run_encode(&c);
            }
    }
}

/* RNG indices across 2^32 (the salt changes there), a tensor that starts at an offset. */
static void test_encode_offset(void **state)
{
    (void)state;
    const uint64_t off[] = { (1ull << 32) - 3000, (5ull << 32) + 12 };
    for (size_t o = 0; o < 2; o++)
        for (size_t j = 0; j < NSPECS; j++) {
            enc_case c = { specs[j], 4099, RES_IN_PLACE, off[o], 2, -1, 0 };
            run_encode(&c);
            c.n = (1u << 20) + 3;
            c.mode = RES_DOUBLE;
            run_encode(&c);
        }
}

/* Arrays that are not 16-byte aligned (the vector paths must fall back). */
static void test_encode_unaligned(void **state)
{
    (void)state;
    for (size_t j = 0; j < NSPECS; j++)
        for (int shift = 1; shift <= 2; shift++) {
            enc_case c = { specs[j], (1u << 20) + 3, RES_IN_PLACE, 0, 2, -1, shift };
            run_encode(&c);
            c.n = 4099;
            c.mode = RES_DOUBLE;
            run_encode(&c);
        }
}

/* NaN at step 1 and -Inf at step 2: the same payload, nonfinite set, residual untouched. */
static void test_encode_nonfinite(void **state)
{
    (void)state;
    for (size_t j = 0; j < NSPECS; j++)
        for (int mode = RES_NONE; mode <= RES_DOUBLE; mode++) {
            enc_case c = { specs[j], 4099, mode, 0, 4, 1, 0 };
            run_encode(&c);
            c.n = (1u << 20) + 3;
            run_encode(&c);
        }
}

/* ---- decode-add ---------------------------------------------------------------------------- */

/* payload = header + CPU body of n elements (poison 1: a NaN in the input, 2: an Inf, so the
 * scale of its bucket is not finite); returns its size. */
static size_t make_payload(const gcomp_terngrad_params *p, size_t n, uint8_t *payload, int poison)
{
    float *g = tu_gauss_array(n, 99 + n);
    if (poison) g[n / 2] = poison == 1 ? NAN : INFINITY;
    gcomp_encode_ctx ctx = { 0 };
    size_t written = 0;
    uint32_t flags = 0;
    gcomp_header h = { GCOMP_HEADER_MAGIC, GCOMP_FORMAT_VERSION, GCOMP_F32, GCOMP_WIRE_ID_TERNGRAD, 0, 0, n, 0 };
    ctx.seed = 5;
    ctx.step = 2;
    assert_int_equal(
        vt->encode(p, &ctx, g, NULL, NULL, n, payload + GCOMP_HEADER_BYTES, vt->max_body_bytes(p, n), &written, &flags),
        GCOMP_SUCCESS);
    h.flags = flags;
    h.body_bytes = written;
    gcomp_header_write(payload, &h);
    free(g);
    return GCOMP_HEADER_BYTES + written;
}

/* decode_add of payload on the device; returns status.error; acc_out gets the accumulator. */
static uint32_t gpu_decode(const gcomp_terngrad_params *p, const uint8_t *payload, size_t cap, const float *acc0,
                           size_t n, float *acc_out, uint32_t error_in)
{
    uint8_t *dp = dup_to_dev(payload, cap);
    float *dacc = dup_to_dev(acc0, n * 4);
    gcomp_cuda_status st = { 0, 0, 0, 0, error_in, 0 }, *dst = dup_to_dev(&st, sizeof st);
    assert_int_equal(vt->cuda->decode_add(p, dp, cap, dacc, n, dst, NULL), GCOMP_SUCCESS);
    to_host(acc_out, dacc, n * 4);
    to_host(&st, dst, sizeof st);
    CU(cudaFree(dp));
    CU(cudaFree(dacc));
    CU(cudaFree(dst));
    return st.error;
}

static void test_decode_add(void **state)
{
    (void)state;
    char name[128];
    for (size_t k = 0; k < NSIZES - 1; k++)
        for (size_t j = 0; j < NSPECS; j++) {
            gcomp_terngrad_params p = { specs[j].bucket, specs[j].clip };
            size_t n = sizes[k], cap = GCOMP_HEADER_BYTES + vt->max_body_bytes(&p, n);
            uint8_t *payload = malloc(cap);
            float *acc = tu_gauss_array(n, 7), *want = malloc(n * 4), *got = malloc(n * 4);
            for (int poison = 0; poison < 3; poison++) { /* finite, a NaN scale, an infinite one */
                size_t bytes = make_payload(&p, n, payload, poison);
                snprintf(name, sizeof name, "bucket=%lld n=%zu poison=%d", (long long)p.bucket, n, poison);
                memcpy(want, acc, n * 4);
                assert_int_equal(
                    vt->decode_add(&p, 0, payload + GCOMP_HEADER_BYTES, bytes - GCOMP_HEADER_BYTES, want, n),
                    GCOMP_SUCCESS);
                assert_int_equal(gpu_decode(&p, payload, bytes, acc, n, got, 0), 0);
                same_floats(want, got, n, "decode_add", name);
            }
            free(payload), free(acc), free(want), free(got);
        }
}

/* Every corruption the CPU refuses: an error on the device and acc untouched. */
static void test_decode_corrupt(void **state)
{
    (void)state;
    const size_t ns[] = { 4099, 127, (1u << 20) + 3 };
    for (size_t k = 0; k < 3; k++)
        for (size_t j = 0; j < NSPECS; j++) {
            gcomp_terngrad_params p = { specs[j].bucket, specs[j].clip };
            size_t n = ns[k], cap = GCOMP_HEADER_BYTES + vt->max_body_bytes(&p, n);
            size_t nb = (size_t)gcomp_tg_num_scales(&p, n), B = p.bucket ? (size_t)p.bucket : n;
            size_t last_tile = (nb - 1) * B + (n - (nb - 1) * B - 1) / 1024 * 1024; /* tiles start at buckets */
            uint8_t *good = malloc(cap), *bad = malloc(cap);
            size_t bytes = make_payload(&p, n, good, 0);
            float *acc = tu_gauss_array(n, 8), *got = malloc(n * 4);
            uint8_t *codes = bad + GCOMP_HEADER_BYTES + 4 * nb;
            for (int kind = 0; kind < 7; kind++) {
                size_t cap_used = bytes;
                memcpy(bad, good, bytes);
                switch (kind) {
                case 0:
                    gcomp_store_u32(bad + 8, 1);
                    break; /* flags */
                case 1:
                    gcomp_store_u64(bad + 24, gcomp_load_u64(bad + 24) - 1);
                    cap_used--;
                    break; /* size */
                case 2:
                    gcomp_store_u32(bad + GCOMP_HEADER_BYTES + 4 * (nb - 1), 0xbf800000u);
                    break; /* -1.0 */
                case 3:
                    codes[(n + 3) / 4 / 2] |= 3u << 2;
                    break; /* code 3 */
                case 4:    /* a padding bit of the last tile (n % 4 != 0 here: 4099, 127, 2^20+3) */
                    codes[last_tile / 4 + ((n - last_tile) + 3) / 4 - 1] |= 1u << 6;
                    break;
                case 5:
                    cap_used = bytes - 1;
                    break; /* a capacity below the body's size */
                case 6:
                    break; /* an error already set: nothing written */
                }
                uint32_t err = gpu_decode(&p, bad, cap_used, acc, n, got, kind == 6 ? GCOMP_ERR_CORRUPT : 0);
                if (err != GCOMP_ERR_CORRUPT)
                    fail_msg("corruption %d, n=%zu bucket=%lld: error %u", kind, n, (long long)p.bucket, err);
                same_floats(acc, got, n, "acc after a corrupt payload", "must be untouched");
                if (kind <= 4) /* the CPU refuses it too */
                    assert_int_equal(vt->decode_add(&p, gcomp_load_u32(bad + 8), bad + GCOMP_HEADER_BYTES,
                                                    gcomp_load_u64(bad + 24), got, n),
                                     GCOMP_ERR_CORRUPT);
            }
            free(good), free(bad), free(acc), free(got);
        }
}

/* ---- integer ring ------------------------------------------------------------------------ */

static void test_local_scales_ternarise(void **state)
{
    (void)state;
    char name[128];
    for (size_t k = 0; k < NSIZES; k++) {
        if (sizes[k] > max_n) continue;
        for (size_t j = 0; j < NSPECS; j++) {
            if (sizes[k] > (4u << 20) && j != 0 && j != 2) continue;
            gcomp_terngrad_params p = { specs[j].bucket, specs[j].clip };
            size_t n = sizes[k], nb = (size_t)gcomp_tg_num_scales(&p, n), B = p.bucket ? (size_t)p.bucket : n;
            float *g = tu_gauss_array(n, 3 + n), *r = tu_gauss_array(n, 4 + n), *sc = malloc(nb * 4),
                  *gsc = malloc(nb * 4);
            float *r_gpu = malloc(n * 4);
            int8_t *t = malloc(n), *gt = malloc(n);
            gcomp_encode_ctx ctx = { 0 };
            snprintf(name, sizeof name, "bucket=%lld clip=%g n=%zu", (long long)p.bucket, p.clip, n);
            for (size_t i = 0; i < n; i++) r[i] *= 0.05f;
            float *dg = dup_to_dev(g, n * 4), *dr = dup_to_dev(r, n * 4), *dsc = dmalloc(nb * 4);
            int8_t *dt = dmalloc(n);
            void *dscr = dmalloc(vt->cuda->scratch_bytes(&p, n));
            gcomp_cuda_residual hres = { { dr, NULL }, 0, 0, 0 }, *dres = dup_to_dev(&hres, sizeof hres);
            gcomp_cuda_status st = { 0 }, *dst = dup_to_dev(&st, sizeof st);
            assert_int_equal(vt->local_scales(&p, &ctx, g, r, n, sc), GCOMP_SUCCESS);
            assert_int_equal(vt->cuda->local_scales(&p, dg, dres, n, dsc, dscr, NULL), GCOMP_SUCCESS);
            to_host(gsc, dsc, nb * 4);
            same_floats(sc, gsc, nb, "local_scales", name);
            /* the ring's chunks: whole buckets, ternarised one after the other */
            size_t cut = n / 3 / B * B;
            size_t lo[2] = { 0, cut }, hi[2] = { cut, n };
            for (int c = 0; c < 2; c++) {
                size_t m = hi[c] - lo[c];
                if (!m) continue;
                ctx.seed = 11;
                ctx.step = 4;
                ctx.rank = 1;
                ctx.offset = lo[c];
                hres.step = 4;
                CU(cudaMemcpy(dres, &hres, sizeof hres, cudaMemcpyHostToDevice));
                assert_int_equal(gcomp__tg_ternarise(&p, &ctx, g + lo[c], r + lo[c], r + lo[c], m,
                                                     sc + (p.bucket ? lo[c] / B : 0), t + lo[c]),
                                 GCOMP_SUCCESS);
                ctx.step = 999; /* the device reads res->step */
                assert_int_equal(vt->cuda->ternarise(&p, &ctx, dg, dres, m, dsc, dt + lo[c], dst, NULL), GCOMP_SUCCESS);
            }
            to_host(gt, dt, n);
            to_host(r_gpu, dr, n * 4);
            to_host(&st, dst, sizeof st);
            assert_int_equal(st.nonfinite, 0);
            same_bytes(t, gt, n, "ternarise codes", name);
            same_floats(r, r_gpu, n, "ternarise residual", name);
            /* a non-finite scale: codes still written, the residual untouched, nonfinite set */
            gsc[0] = NAN;
            CU(cudaMemcpy(dsc, gsc, 4, cudaMemcpyHostToDevice));
            ctx.offset = 0;
            assert_int_equal(vt->cuda->ternarise(&p, &ctx, dg, dres, n < B ? n : B, dsc, dt, dst, NULL), GCOMP_SUCCESS);
            to_host(r_gpu, dr, n * 4);
            to_host(&st, dst, sizeof st);
            assert_int_equal(st.nonfinite, 1);
            same_floats(r, r_gpu, n, "residual under a NaN scale", name);
            CU(cudaFree(dg));
            CU(cudaFree(dr));
            CU(cudaFree(dsc));
            CU(cudaFree(dt));
            CU(cudaFree(dscr));
            CU(cudaFree(dres));
            CU(cudaFree(dst));
            free(g), free(r), free(sc), free(gsc), free(r_gpu), free(t), free(gt);
        }
    }
}

static const size_t sum_sizes[] = { 1, 239, 240, 241, 4099, (1u << 20) + 3 };
static const uint32_t ranks[] = { 1, 2, 3, 4, 5, 6, 200 };

/* m ranks' codes summed hop by hop on both sides; every hop's bytes equal; then the final
 * values with a scale (one, or per bucket) and AVG's divisor. */
static void test_sums(void **state)
{
    (void)state;
    char name[128];
    for (size_t k = 0; k < sizeof sum_sizes / sizeof sum_sizes[0]; k++)
        for (size_t q = 0; q < sizeof ranks / sizeof ranks[0]; q++) {
            size_t n = sum_sizes[k];
            uint32_t M = ranks[q];
            size_t maxb = (size_t)gcomp_tg_sum_bytes(n, M + 1) + 8; /* the corrupt test packs for M + 1 */
            uint8_t *in = calloc(maxb, 1), *out = calloc(maxb, 1), *gout = calloc(maxb, 1);
            int8_t *t = malloc(n);
            uint64_t seed = 77 + n * 13 + M;
            uint8_t *din = dmalloc(maxb), *dout = dmalloc(maxb);
            int8_t *dt = dmalloc(n);
            gcomp_cuda_status st = { 0 }, *dst = dup_to_dev(&st, sizeof st);
            for (uint32_t m_in = 0; m_in < M; m_in++) {
                /* rank m_in's codes: a bias so that sums reach +-m (the extreme digits) */
                for (size_t i = 0; i < n; i++) {
                    uint64_t v = tu_next(&seed) % 8;
                    t[i] = (int8_t)(i % 3 == 0 ? 1 : i % 3 == 1 ? (v < 6 ? -1 : 0) : (int)(v % 3) - 1);
                }
                size_t in_bytes = m_in ? (size_t)gcomp_tg_sum_bytes(n, m_in) : 0,
                       ob = (size_t)gcomp_tg_sum_bytes(n, m_in + 1);
                snprintf(name, sizeof name, "n=%zu m_in=%u", n, m_in);
                assert_int_equal(gcomp__tg_sums_add_pack(in, in_bytes, m_in, t, n, out), GCOMP_SUCCESS);
                if (in_bytes) CU(cudaMemcpy(din, in, in_bytes, cudaMemcpyHostToDevice));
                CU(cudaMemcpy(dt, t, n, cudaMemcpyHostToDevice));
                CU(cudaMemset(dout, 0xcc, maxb));
                assert_int_equal(vt->cuda->sums_add_pack(din, m_in, dt, n, dout, dst, NULL), GCOMP_SUCCESS);
                to_host(gout, dout, ob);
                to_host(&st, dst, sizeof st);
                assert_int_equal(st.error, 0);
                same_bytes(out, gout, ob, "sums_add_pack", name);
                memcpy(in, out, ob);
            }
            /* final values: one scale, then buckets of 8 (lo = 16: a chunk inside the tensor) */
            size_t fb = (size_t)gcomp_tg_sum_bytes(n, M);
            int16_t *sums = malloc(n * 2);
            float *want = malloc(n * 4), *got = malloc(n * 4), sc[4] = { 0.37f, 1.5e-3f, 3.0f, 7.25f };
            float *dsc = dup_to_dev(sc, sizeof sc), *dv = dmalloc(n * 4);
            assert_int_equal(gcomp__tg_sums_unpack(in, fb, n, M, sums), GCOMP_SUCCESS);
            CU(cudaMemcpy(din, in, fb, cudaMemcpyHostToDevice));
            for (int bucketed = 0; bucketed < 2; bucketed++) {
                gcomp_terngrad_params p = { bucketed ? (int64_t)(n + 16 + 3) / 4 / 4 * 4 + 4 : 0, 2.5 };
                size_t lo = bucketed ? 16 : 0;
                float div = bucketed ? 3.0f : (float)M;
                if (!bucketed) {
                    float *value = malloc((2 * M + 1) * 4);
                    for (int32_t v = -(int32_t)M; v <= (int32_t)M; v++) value[v + M] = (float)v * sc[0] / div;
                    assert_int_equal(gcomp__tg_sums_values(in, fb, n, M, value, want), GCOMP_SUCCESS);
                    free(value);
                } else {
                    for (size_t i = 0; i < n; i++) want[i] = (float)sums[i] * sc[(lo + i) / (size_t)p.bucket] / div;
                }
                assert_int_equal(vt->cuda->sums_values(&p, din, lo, n, M, dsc, div, dv, dst, NULL), GCOMP_SUCCESS);
                to_host(got, dv, n * 4);
                to_host(&st, dst, sizeof st);
                assert_int_equal(st.error, 0);
                snprintf(name, sizeof name, "n=%zu m=%u bucketed=%d", n, M, bucketed);
                same_floats(want, got, n, "sums_values", name);
            }
            /* an out-of-range code (the first group all ones) is refused by both */
            {
                uint8_t save = in[0];
                unsigned w = gcomp_tg_bits_below(gcomp_tg_sum_pow(M, gcomp_tg_sum_group(M)));
                int16_t *tmp = malloc(n * 2);
                in[0] |= (uint8_t)((1u << (w < 8 ? w : 8)) - 1);
                if (n >= gcomp_tg_sum_group(M) && (1ull << w) > gcomp_tg_sum_pow(M, gcomp_tg_sum_group(M)) && w <= 8) {
                    assert_int_equal(gcomp__tg_sums_unpack(in, fb, n, M, tmp), GCOMP_ERR_CORRUPT);
                    CU(cudaMemcpy(din, in, fb, cudaMemcpyHostToDevice));
                    gcomp_terngrad_params p0 = { 0, 2.5 };
                    assert_int_equal(vt->cuda->sums_values(&p0, din, 0, n, M, dsc, 1.0f, dv, dst, NULL), GCOMP_SUCCESS);
                    to_host(&st, dst, sizeof st);
                    if (st.error != GCOMP_ERR_CORRUPT)
                        fail_msg("sums_values n=%zu m=%u: corrupt code not refused", n, M);
                    st.error = 0;
                    CU(cudaMemcpy(dst, &st, sizeof st, cudaMemcpyHostToDevice));
                    assert_int_equal(vt->cuda->sums_add_pack(din, M, dt, n, dout, dst, NULL), GCOMP_SUCCESS);
                    to_host(&st, dst, sizeof st);
                    if (st.error != GCOMP_ERR_CORRUPT)
                        fail_msg("sums_add_pack n=%zu m=%u: corrupt code not refused", n, M);
                    st.error = 0;
                    CU(cudaMemcpy(dst, &st, sizeof st, cudaMemcpyHostToDevice));
                }
                in[0] = save;
                free(tmp);
            }
            CU(cudaFree(din));
            CU(cudaFree(dout));
            CU(cudaFree(dt));
            CU(cudaFree(dst));
            CU(cudaFree(dsc));
            CU(cudaFree(dv));
            free(in), free(out), free(gout), free(t), free(sums), free(want), free(got);
        }
}

int main(void)
{
    const char *q = getenv("GCOMP_TEST_QUICK"), *mc = getenv("GCOMP_CUDA_TEST_MAX_COUNT");
    if (cuda_test_no_device("test_cuda_terngrad")) return 77;
    if (q && *q && strcmp(q, "0") != 0) max_n = (size_t)4 << 20;
    if (mc && *mc) max_n = (size_t)strtoull(mc, NULL, 10);
    assert_non_null(vt->cuda);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encode),
        cmocka_unit_test(test_encode_offset),
        cmocka_unit_test(test_encode_unaligned),
        cmocka_unit_test(test_encode_nonfinite),
        cmocka_unit_test(test_decode_add),
        cmocka_unit_test(test_decode_corrupt),
        cmocka_unit_test(test_local_scales_ternarise),
        cmocka_unit_test(test_sums),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
