/*
 * test_cuda_engine.c — gcomp_allreduce on device buffers through the engine (issue 15), one
 * rank over the loopback transport: device buffers go through the staging decorator
 * (transport_staging.c) and GCOMP_TEST_COMPRESS_ONE_RANK=1 makes the one rank run the
 * compressed schedules (dense ring, integer ring, sparse gather) against itself. The same
 * calls on host buffers, on a second communicator made the same way, are the reference:
 *
 *   - every built-in spec, f32/f16/bf16, SUM and AVG, 3 steps with error feedback: results
 *     and residuals (gcomp_comm_residuals_save blobs: keys, counts, steps, residual bits)
 *     bit-identical to the host engine's; the same schedule ran;
 *   - no device allocation after a key's first call (gcomp__comm_device_allocs);
 *   - a NaN input: the same outcome as on the host (success, nonfinite_calls, residual kept);
 *   - a checkpoint saved on the device communicator loads into a fresh one and the next step
 *     equals the host's (residuals copied across devices);
 *   - gcomp_iallreduce on device buffers (run by the progress thread) equals gcomp_allreduce;
 *   - wrong combinations are clear errors: host and device buffers mixed, a stream with host
 *     buffers;
 *   - a byte stage (+zstd) on device buffers runs on host copies: the same bits as the host;
 *   - an encode whose kernels report an error in the status block fails its call with it (the
 *     codec object's blocking, async and sync calls, and the engine), the residual kept.
 *
 * Exits 77 (skipped) without a CUDA device. GCOMP_TEST_QUICK=1 (the compute-sanitizer run)
 * uses smaller tensors.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "comm.h"
#include "gcomp_codec.h"
#include "test_util.h"
#include "cuda_test_util.h"
#include "transport_loop.h"

#define KEY 42
#define ONE_RANK_SWITCH "GCOMP_TEST_COMPRESS_ONE_RANK"

static size_t base_count(void)
{
    const char *q = getenv("GCOMP_TEST_QUICK");
    return q && *q == '1' ? 20011 : 100003;
}

/* One rank on a loopback world of its own, the compressed schedules forced on. */
typedef struct one {
    gcomp__loop_world *w;
    gcomp_comm *c;
} one;

static one make_one(const char *spec)
{
    one o;
    gcomp_config cfg = gcomp_config_default();
    cfg.codec = spec;
    cfg.seed = 3;
    cfg.min_bytes = 4096;
    setenv(ONE_RANK_SWITCH, "1", 1);
    OK(gcomp__loop_world_create(1, &o.w));
    OK(gcomp__comm_create_loop(o.w, 0, &cfg, &o.c));
    unsetenv(ONE_RANK_SWITCH);
    return o;
}

static void free_one(one *o)
{
    gcomp_comm_destroy(o->c);
    gcomp__loop_world_destroy(o->w);
}

static void first_difference(const char *what, const void *a, const void *b, size_t count, size_t esize)
{
    for (size_t i = 0; i < count; i++)
        if (memcmp((const char *)a + i * esize, (const char *)b + i * esize, esize) != 0)
            fail_msg("%s: element %zu of %zu differs between the device and the host engine", what, i, count);
    fail_msg("%s: results differ", what);
}

/* The residual checkpoints of both communicators must be the same bytes (keys, counts, steps,
 * residual bits). */
static void same_residuals(const char *what, gcomp_comm *host, gcomp_comm *dev)
{
    char why[160];
    if (residual_checkpoints_differ(host, dev, why, sizeof why)) fail_msg("%s: %s", what, why);
}

/* One call on both with the same input (device: on stream s, in place when asked); results
 * compared bit for bit, or NaN for NaN when nan_ok. */
static void same_call(const char *what, gcomp_comm *host, gcomp_comm *dev, size_t count, gcomp_dtype dtype, gcomp_op op,
                      uint64_t seed, int in_place, int nan_at, cudaStream_t s)
{
    size_t esize = gcomp_dtype_size(dtype), bytes = count * esize;
    void *x = gauss_inputs(count, dtype, seed), *hres = malloc(bytes + 1), *dres = malloc(bytes + 1);
    void *dsend = dmalloc(bytes), *drecv = in_place ? dsend : dmalloc(bytes);
    if (nan_at >= 0) {
        if (dtype == GCOMP_F32)
            ((float *)x)[nan_at] = NAN;
        else
            ((uint16_t *)x)[nan_at] = dtype == GCOMP_F16 ? 0x7e00u : 0x7fc0u;
    }
    h2d_wait(dsend, x, bytes);
    if (in_place) {
        memcpy(hres, x, bytes);
        OK(gcomp_allreduce(host, hres, hres, count, dtype, op, KEY, NULL));
    } else {
        OK(gcomp_allreduce(host, x, hres, count, dtype, op, KEY, NULL));
    }
    OK(gcomp_allreduce(dev, dsend, drecv, count, dtype, op, KEY, (struct CUstream_st *)s));
    /* no synchronisation here: gcomp_allreduce returns with its device work done */
    d2h(dres, drecv, bytes);
    if (memcmp(dres, hres, bytes) != 0) {
        if (nan_at < 0) first_difference(what, dres, hres, count, esize);
        for (size_t i = 0; i < count; i++) { /* NaN payloads may differ in their bits only */
            float a, b;
            if (dtype == GCOMP_F32) {
                a = ((float *)dres)[i];
                b = ((float *)hres)[i];
            } else {
                uint16_t ha = ((uint16_t *)dres)[i], hb = ((uint16_t *)hres)[i];
                a = dtype == GCOMP_F16 ? gcomp_f16_to_f32(ha) : gcomp_bf16_to_f32(ha);
                b = dtype == GCOMP_F16 ? gcomp_f16_to_f32(hb) : gcomp_bf16_to_f32(hb);
            }
            if (!(isnan(a) && isnan(b)) && memcmp(&a, &b, sizeof a) != 0)
                fail_msg("%s: element %zu differs (device %g, host %g)", what, i, (double)a, (double)b);
        }
    }
    CU(cudaFree(dsend));
    if (!in_place) CU(cudaFree(drecv));
    free(x);
    free(hres);
    free(dres);
}

static const char *const SPECS[] = {
    "none", "fp16", "bf16", "terngrad", "terngrad:bucket=4096", "topk:ratio=0.01", "topk:ratio=0.01,values=fp16",
};
#define N_SPECS (sizeof SPECS / sizeof SPECS[0])

static void test_codecs_match_host(void **state)
{
    cudaStream_t s;
    (void)state;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (size_t k = 0; k < N_SPECS; k++) {
        for (size_t v = 0; v < N_VARIANTS; v++) {
            one h = make_one(SPECS[k]), d = make_one(SPECS[k]);
            gcomp_comm_stats hs, ds;
            char what[128];
            size_t count = base_count() + 64 * v;
            snprintf(what, sizeof what, "%s %s", SPECS[k], VARIANTS[v].name);
            for (int step = 0; step < 3; step++) {
                same_call(what, h.c, d.c, count, VARIANTS[v].dtype, VARIANTS[v].op, 100 * k + 10 * v + (uint64_t)step,
                          step == 2, -1, step == 1 ? (cudaStream_t)0 : s);
                same_residuals(what, h.c, d.c);
            }
            OK(gcomp_comm_stats_get(h.c, &hs));
            OK(gcomp_comm_stats_get(d.c, &ds));
            if (ds.compressed_calls != 3 || hs.compressed_calls != 3)
                fail_msg("%s: compressed calls host %llu device %llu, expected 3 each", what,
                         (unsigned long long)hs.compressed_calls, (unsigned long long)ds.compressed_calls);
            assert_int_equal(ds.last_schedule, hs.last_schedule);
            assert_int_not_equal(ds.last_schedule, GCOMP_SCHED_BYPASS);
            assert_int_equal(ds.wire_bytes, hs.wire_bytes);
            assert_int_equal(ds.overflow_count, hs.overflow_count);
            assert_int_equal(ds.nonfinite_calls, hs.nonfinite_calls);
            /* a small call bypasses the codec on both */
            same_call(what, h.c, d.c, 1000, VARIANTS[v].dtype, GCOMP_SUM, 77, 0, -1, s);
            OK(gcomp_comm_stats_get(d.c, &ds));
            assert_int_equal(ds.last_schedule, GCOMP_SCHED_BYPASS);
            printf("  %-30s %-8s 3 steps (%s) + 1 bypassed: results and residuals bit-identical\n", SPECS[k],
                   VARIANTS[v].name, gcomp_schedule_name(hs.last_schedule));
            free_one(&h);
            free_one(&d);
        }
    }
    CU(cudaStreamDestroy(s));
}

/* After a key's first call, further calls of the same key allocate no device memory (the
 * workspace, the residual, the codec state and the staging buffers are kept). */
static void test_no_allocation_per_call(void **state)
{
    static const char *const specs[] = { "fp16", "terngrad", "terngrad:bucket=4096", "topk:ratio=0.01" };
    const size_t count = (size_t)1 << 20;
    cudaStream_t s;
    (void)state;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++) {
        one d = make_one(specs[k]);
        float *x = tu_gauss_array(count, k), *dx = dmalloc(count * sizeof(float));
        uint64_t first;
        h2d_wait(dx, x, count * sizeof(float));
        OK(gcomp_allreduce(d.c, dx, dx, count, GCOMP_F32, GCOMP_SUM, KEY, (struct CUstream_st *)s));
        first = gcomp__comm_device_allocs(d.c);
        assert_true(first > 0);
        for (int i = 0; i < 5; i++)
            OK(gcomp_allreduce(d.c, dx, dx, count, GCOMP_F32, GCOMP_SUM, KEY, (struct CUstream_st *)s));
        if (gcomp__comm_device_allocs(d.c) != first)
            fail_msg("%s: %llu device allocations after the first call, %llu after five more", specs[k],
                     (unsigned long long)first, (unsigned long long)gcomp__comm_device_allocs(d.c));
        printf("  %-22s %llu allocations at the first call, none in the next 5\n", specs[k], (unsigned long long)first);
        CU(cudaFree(dx));
        free(x);
        free_one(&d);
    }
    CU(cudaStreamDestroy(s));
}

/* NaN in the input: success on both, the call counted non-finite, the residual kept (the
 * checkpoints stay equal), and the next finite step equal again. */
static void test_nonfinite(void **state)
{
    static const char *const specs[] = { "fp16", "terngrad", "topk:ratio=0.01" };
    (void)state;
    for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++) {
        one h = make_one(specs[k]), d = make_one(specs[k]);
        gcomp_comm_stats hs, ds;
        size_t count = base_count();
        same_call(specs[k], h.c, d.c, count, GCOMP_F32, GCOMP_SUM, 5, 0, -1, 0);
        same_call(specs[k], h.c, d.c, count, GCOMP_F32, GCOMP_SUM, 6, 0, 1234, 0);
        same_residuals(specs[k], h.c, d.c);
        same_call(specs[k], h.c, d.c, count, GCOMP_F32, GCOMP_SUM, 7, 0, -1, 0);
        same_residuals(specs[k], h.c, d.c);
        OK(gcomp_comm_stats_get(h.c, &hs));
        OK(gcomp_comm_stats_get(d.c, &ds));
        assert_int_equal(hs.nonfinite_calls, 1);
        assert_int_equal(ds.nonfinite_calls, 1);
        free_one(&h);
        free_one(&d);
    }
}

/* A checkpoint of the device communicator loads into a fresh one (residuals through host
 * memory, back to the device at the next call): the next step equals the host's. */
static void test_checkpoint_across(void **state)
{
    one h = make_one("fp16"), d = make_one("fp16"), d2 = make_one("fp16");
    size_t count = base_count(), n = 0;
    uint8_t *blob;
    (void)state;
    for (int step = 0; step < 2; step++) same_call("fp16", h.c, d.c, count, GCOMP_F32, GCOMP_SUM, 11 + step, 0, -1, 0);
    OK(gcomp_comm_residuals_save(d.c, NULL, 0, &n));
    blob = malloc(n);
    OK(gcomp_comm_residuals_save(d.c, blob, n, &n));
    OK(gcomp_comm_residuals_load(d2.c, blob, n));
    same_residuals("fp16 loaded", h.c, d2.c);
    same_call("fp16 after load", h.c, d2.c, count, GCOMP_F32, GCOMP_SUM, 13, 0, -1, 0);
    same_residuals("fp16 after load", h.c, d2.c);
    free(blob);
    free_one(&h);
    free_one(&d);
    free_one(&d2);
}

/* gcomp_iallreduce with device buffers runs on the progress thread (made current on the
 * issuing thread's device): the same results as blocking calls. */
static void test_nonblocking(void **state)
{
    one h = make_one("terngrad"), d = make_one("terngrad");
    size_t count = base_count();
    float *x = tu_gauss_array(count, 21), *hres = malloc(count * 4), *dres = malloc(count * 4);
    float *dx = dmalloc(count * 4), *dy = dmalloc(count * 4);
    gcomp_request *req = NULL;
    (void)state;
    h2d_wait(dx, x, count * 4);
    for (int step = 0; step < 2; step++) {
        OK(gcomp_allreduce(h.c, x, hres, count, GCOMP_F32, GCOMP_SUM, KEY, NULL));
        OK(gcomp_iallreduce(d.c, dx, dy, count, GCOMP_F32, GCOMP_SUM, KEY, NULL, &req));
        OK(gcomp_wait(&req));
        d2h(dres, dy, count * 4);
        if (memcmp(dres, hres, count * 4) != 0) first_difference("terngrad nonblocking", dres, hres, count, 4);
    }
    same_residuals("terngrad nonblocking", h.c, d.c);
    CU(cudaFree(dx));
    CU(cudaFree(dy));
    free(x);
    free(hres);
    free(dres);
    free_one(&h);
    free_one(&d);
}

static void test_wrong_combinations(void **state)
{
    one d = make_one("fp16");
    size_t count = base_count();
    float *x = tu_gauss_array(count, 1), *dx = dmalloc(count * 4), *dy = dmalloc(count * 4);
    cudaStream_t s;
    (void)state;
    CU(cudaStreamCreate(&s));
    h2d_wait(dx, x, count * 4);
    EXPECT(gcomp_allreduce(d.c, x, dy, count, GCOMP_F32, GCOMP_SUM, KEY, NULL), GCOMP_ERR_INVALID_ARG, "same device");
    EXPECT(gcomp_allreduce(d.c, dx, x, count, GCOMP_F32, GCOMP_SUM, KEY, NULL), GCOMP_ERR_INVALID_ARG, "same device");
    EXPECT(gcomp_allreduce(d.c, x, x, count, GCOMP_F32, GCOMP_SUM, KEY, (struct CUstream_st *)s), GCOMP_ERR_INVALID_ARG,
           "stream");
    /* the communicator still works */
    OK(gcomp_allreduce(d.c, dx, dy, count, GCOMP_F32, GCOMP_SUM, KEY, (struct CUstream_st *)s));
    CU(cudaStreamDestroy(s));
    CU(cudaFree(dx));
    CU(cudaFree(dy));
    free(x);
    free_one(&d);
}

/* A byte stage (zstd) has no device kernels: over a host transport the call runs on host
 * copies of the device buffers (residual in host memory), the same bits as host buffers. */
static void test_byte_stage_on_host_copies(void **state)
{
    static const char *const specs[] = { "fp16+zstd", "terngrad+zstd:level=3" };
    (void)state;
    for (size_t k = 0; k < 2; k++) {
        one h = make_one(specs[k]), d = make_one(specs[k]);
        for (int step = 0; step < 3; step++) {
            same_call(specs[k], h.c, d.c, base_count(), GCOMP_F32, GCOMP_SUM, 30 + (uint64_t)step, step == 2, -1, 0);
            same_residuals(specs[k], h.c, d.c);
        }
        printf("  %-22s on host copies of device buffers: 3 steps bit-identical\n", specs[k]);
        free_one(&h);
        free_one(&d);
    }
}

/* ---- an encode whose kernels report an error ----------------------------------------------- */

/* fp16 and top-k under other names and wire ids whose CUDA encode, after the real kernels,
 * sets status->error = GCOMP_ERR_INTERNAL as a kernel that finds a fault does (top-k's select
 * and scan may). Nothing read an encode's status error back: the call succeeded and its
 * payload went out. Now top-k's read-back of its size returns it at once, and fp16's reaches
 * the tally through the header kernel (the next sync, or the engine's finish). */
enum {
    FAIL_FP16,
    FAIL_TOPK,
    N_FAIL
};
static const char *const fail_base[N_FAIL] = { "fp16", "topk" };
static const char *const fail_spec[N_FAIL] = { "fail_fp16", "fail_topk" };
static gcomp_codec_vtable fail_vt[N_FAIL];
static gcomp_codec_cuda_ops fail_ops[N_FAIL];

static gcomp_result fail_after(int which, const void *params, const gcomp_encode_ctx *ctx, const float *g,
                               const gcomp_cuda_residual *res, size_t count, uint8_t *body, size_t cap, void *scratch,
                               gcomp_cuda_status *status, struct CUstream_st *stream)
{
    const gcomp_codec_cuda_ops *base = gcomp_codec_find(fail_base[which])->cuda;
    gcomp_result rc = base->encode(params, ctx, g, res, count, body, cap, scratch, status, stream);
    if (rc != GCOMP_SUCCESS) return rc;
    /* the library zeroed the block before the encode: its low byte makes the error */
    if (cudaMemsetAsync(&status->error, GCOMP_ERR_INTERNAL, 1, (cudaStream_t)stream) != cudaSuccess)
        return GCOMP_ERR_TRANSPORT;
    return GCOMP_SUCCESS;
}

static gcomp_result fail_encode_fp16(const void *params, const gcomp_encode_ctx *ctx, const float *g,
                                     const gcomp_cuda_residual *res, size_t count, uint8_t *body, size_t cap,
                                     void *scratch, gcomp_cuda_status *status, struct CUstream_st *stream)
{
    return fail_after(FAIL_FP16, params, ctx, g, res, count, body, cap, scratch, status, stream);
}

static gcomp_result fail_encode_topk(const void *params, const gcomp_encode_ctx *ctx, const float *g,
                                     const gcomp_cuda_residual *res, size_t count, uint8_t *body, size_t cap,
                                     void *scratch, gcomp_cuda_status *status, struct CUstream_st *stream)
{
    return fail_after(FAIL_TOPK, params, ctx, g, res, count, body, cap, scratch, status, stream);
}

static void register_failing(void)
{
    static int done;
    if (done) return;
    done = 1;
    for (int w = 0; w < N_FAIL; w++) {
        const gcomp_codec_vtable *base = gcomp_codec_find(fail_base[w]);
        assert_non_null(base);
        assert_non_null(base->cuda);
        fail_vt[w] = *base;
        fail_ops[w] = *base->cuda;
        fail_vt[w].name = fail_spec[w];
        fail_vt[w].wire_id = (uint16_t)(230 + w);
        fail_vt[w].cuda = &fail_ops[w];
    }
    fail_ops[FAIL_FP16].encode = fail_encode_fp16;
    fail_ops[FAIL_TOPK].encode = fail_encode_topk;
    for (int w = 0; w < N_FAIL; w++) OK(gcomp_codec_register(&fail_vt[w]));
}

/* The codec object: the blocking call fails, an async one at once (top-k) or at the next
 * sync (fp16), which reports it once; the key's residual stays as it was set. */
static void failing_codec_object(int w, const float *dx, size_t count)
{
    gcomp_codec_options o = gcomp_codec_options_default();
    gcomp_codec *c = NULL;
    size_t cap, written = 0;
    float *r0 = tu_gauss_array(count, 90 + (uint64_t)w), *r1 = malloc(count * 4);
    uint8_t *dp;
    OK(gcomp_codec_create(fail_spec[w], &o, &c));
    cap = gcomp_codec_max_encoded_bytes(c, count);
    dp = dmalloc(cap);
    OK(gcomp_codec_residual_set(c, KEY, r0, count));
    EXPECT(gcomp_codec_encode(c, KEY, dx, count, GCOMP_F32, dp, cap, &written), GCOMP_ERR_INTERNAL,
           "failed on the device");
    if (w == FAIL_TOPK) {
        EXPECT(gcomp_codec_encode_async(c, KEY, dx, count, GCOMP_F32, dp, cap, &written, NULL), GCOMP_ERR_INTERNAL,
               "failed on the device");
    } else {
        OK(gcomp_codec_encode_async(c, KEY, dx, count, GCOMP_F32, dp, cap, &written, NULL));
        EXPECT(gcomp_codec_sync(c, NULL), GCOMP_ERR_INTERNAL, "failed on the device");
    }
    OK(gcomp_codec_sync(c, NULL));
    OK(gcomp_codec_residual_get(c, KEY, r1, count));
    if (memcmp(r0, r1, count * 4) != 0) fail_msg("%s: the residual changed after failed encodes", fail_spec[w]);
    CU(cudaFree(dp));
    free(r0);
    free(r1);
    gcomp_codec_destroy(c);
}

static void test_encode_status_error(void **state)
{
    const size_t count = base_count();
    float *x = tu_gauss_array(count, 8), *dx = dmalloc(count * 4), *dy = dmalloc(count * 4);
    (void)state;
    register_failing();
    h2d_wait(dx, x, count * 4);
    for (int w = 0; w < N_FAIL; w++) {
        one d = make_one(fail_spec[w]);
        failing_codec_object(w, dx, count);
        /* the engine: the call fails with the encode's error instead of sending its payload */
        EXPECT(gcomp_allreduce(d.c, dx, dy, count, GCOMP_F32, GCOMP_SUM, KEY, NULL), GCOMP_ERR_INTERNAL, NULL);
        printf("  %-10s an encode's status error fails the codec object's calls and the engine's\n", fail_spec[w]);
        free_one(&d);
    }
    CU(cudaFree(dx));
    CU(cudaFree(dy));
    free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codecs_match_host),
        cmocka_unit_test(test_no_allocation_per_call),
        cmocka_unit_test(test_nonfinite),
        cmocka_unit_test(test_checkpoint_across),
        cmocka_unit_test(test_nonblocking),
        cmocka_unit_test(test_wrong_combinations),
        cmocka_unit_test(test_byte_stage_on_host_copies),
        cmocka_unit_test(test_encode_status_error),
    };
    if (cuda_test_no_device("test_cuda_engine")) return 77;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
