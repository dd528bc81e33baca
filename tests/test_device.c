/*
 * test_device.c — the device layer's host ops (src/device_host.c), which the CUDA ops mirror,
 * and the selector on host memory: conversions against the public half helpers, divide bit
 * for bit as a division, the header written from a status block and checked back, the
 * residual commit and the tally.
 */
#include <string.h>

#include "device.h"
#include "test_util.h"

static const gcomp__device_ops *host(void)
{
    const gcomp__device_ops *ops = NULL;
    int dev = 7;
    float x = 0.0f;
    assert_int_equal(gcomp__device_for(&x, &ops, &dev), GCOMP_SUCCESS);
    assert_int_equal(ops->kind, GCOMP__DEVICE_HOST);
    assert_int_equal(dev, -1);
    assert_int_equal(gcomp__device_for(NULL, &ops, NULL), GCOMP_SUCCESS);
    assert_int_equal(ops->kind, GCOMP__DEVICE_HOST);
    return ops;
}

static void test_memory(void **state)
{
    const gcomp__device_ops *ops = host();
    uint8_t *p = NULL, src[100];
    (void)state;
    assert_int_equal(ops->alloc(1000, (void **)&p), GCOMP_SUCCESS);
    assert_true(((uintptr_t)p & 255) == 0);
    assert_int_equal(ops->memset_async(p, 0xab, 1000, NULL), GCOMP_SUCCESS);
    for (int i = 0; i < 100; i++) src[i] = (uint8_t)i;
    assert_int_equal(ops->copy_async(p + 1, src, 100, NULL), GCOMP_SUCCESS);
    assert_int_equal(ops->wait(NULL, 10), GCOMP_SUCCESS);
    assert_int_equal(p[0], 0xab);
    assert_memory_equal(p + 1, src, 100);
    assert_int_equal(p[101], 0xab);
    ops->free(p);
    ops->free(NULL);
    /* the residual store's buffers: zeroed at once (calloc), including a size of 0 */
    assert_non_null(ops->alloc_zeroed);
    assert_int_equal(ops->alloc_zeroed(1 << 20, (void **)&p), GCOMP_SUCCESS);
    for (size_t i = 0; i < (1u << 20); i += 4093) assert_int_equal(p[i], 0);
    assert_int_equal(p[(1 << 20) - 1], 0);
    ops->free(p);
    p = NULL;
    assert_int_equal(ops->alloc_zeroed(0, (void **)&p), GCOMP_SUCCESS);
    assert_non_null(p);
    ops->free(p);
}

static void test_widen_narrow_divide(void **state)
{
    const gcomp__device_ops *ops = host();
    enum {
        N = 65536
    };
    uint16_t *h = malloc(N * 2), *back = malloc(N * 2);
    float *f = malloc(N * 4), *x = tu_gauss_array(N, 5), *y = malloc(N * 4);
    (void)state;
    for (int i = 0; i < N; i++) h[i] = (uint16_t)i; /* every half bit pattern */
    assert_int_equal(ops->widen(h, GCOMP_F16, N, f, NULL), GCOMP_SUCCESS);
    for (int i = 0; i < N; i++) {
        float want = gcomp_f16_to_f32(h[i]);
        assert_memory_equal(&f[i], &want, 4);
    }
    assert_int_equal(ops->narrow(f, N, GCOMP_F16, back, NULL), GCOMP_SUCCESS);
    for (int i = 0; i < N; i++) assert_int_equal(back[i], gcomp_f32_to_f16(f[i]));
    assert_int_equal(ops->widen(h, GCOMP_BF16, N, f, NULL), GCOMP_SUCCESS);
    for (int i = 0; i < N; i++) {
        float want = gcomp_bf16_to_f32(h[i]);
        assert_memory_equal(&f[i], &want, 4);
    }
    assert_int_equal(ops->narrow(x, N, GCOMP_BF16, back, NULL), GCOMP_SUCCESS);
    for (int i = 0; i < N; i++) assert_int_equal(back[i], gcomp_f32_to_bf16(x[i]));
    assert_int_equal(ops->widen(h, GCOMP_DTYPE_COUNT, N, f, NULL), GCOMP_ERR_INVALID_ARG);
    assert_int_equal(ops->narrow(x, N, GCOMP_DTYPE_COUNT, back, NULL), GCOMP_ERR_INVALID_ARG);

    for (int d = 1; d <= 9; d++) { /* powers of two multiply, the rest divide: the same bits */
        memcpy(y, x, N * 4);
        for (int i = 0; i < 8; i++) y[i] = ldexpf(1.0f, -140 + i); /* subnormal results */
        assert_int_equal(ops->divide(y, N, (float)d, NULL), GCOMP_SUCCESS);
        for (int i = 0; i < N; i++) {
            volatile float src = i < 8 ? ldexpf(1.0f, -140 + i) : x[i];
            float want = src / (float)d;
            assert_memory_equal(&y[i], &want, 4);
        }
    }
    free(h), free(back), free(f), free(x), free(y);
}

static void test_header_status_commit(void **state)
{
    const gcomp__device_ops *ops = host();
    uint8_t payload[32 + 10];
    gcomp_header h = { 0 }, back;
    gcomp_cuda_status st = { 0 };
    gcomp__device_tally t = { 0 };
    float b0[1], b1[1];
    gcomp_cuda_residual res = { { b0, b1 }, 5, 0, 0 };
    (void)state;
    h.dtype = GCOMP_F16;
    h.wire_id = 2;
    h.count = 5;
    st.body_bytes = 10;
    st.flags = 0x1234;
    st.overflow = 3;
    st.nonfinite = 1;
    memset(payload + 32, 0, 10);
    assert_int_equal(ops->header_write(payload, &h, &st, 10, &t, NULL), GCOMP_SUCCESS);
    assert_int_equal(gcomp_header_read(payload, sizeof payload, &back), GCOMP_SUCCESS);
    assert_int_equal(back.flags, 0x1234);
    assert_int_equal(back.body_bytes, 10);
    assert_int_equal(back.count, 5);
    assert_int_equal(back.wire_id, 2);
    assert_int_equal(back.dtype, GCOMP_F16);
    assert_int_equal(t.wire_bytes, 42);
    assert_int_equal(t.encode_calls, 1);
    assert_int_equal(t.raw_bytes, 10);
    assert_int_equal(t.overflow, 3);
    assert_int_equal(t.nonfinite_calls, 1);
    assert_int_equal(t.error, 0);
    /* a body size other than the one announced is flagged */
    assert_int_equal(ops->header_write(payload, &h, &st, 12, &t, NULL), GCOMP_SUCCESS);
    assert_int_equal(t.error, GCOMP_ERR_INTERNAL);
    assert_int_equal(t.where, GCOMP__WHERE_SIZE);

    /* commit: non-finite keeps the buffer and advances the step */
    assert_int_equal(ops->residual_commit(&res, &st, NULL), GCOMP_SUCCESS);
    assert_int_equal(res.cur, 0);
    assert_int_equal(res.step, 6);
    st.nonfinite = 0;
    assert_int_equal(ops->residual_commit(&res, &st, NULL), GCOMP_SUCCESS);
    assert_int_equal(res.cur, 1);
    res.buf[1] = NULL; /* single-buffered: never flips */
    res.cur = 0;
    assert_int_equal(ops->residual_commit(&res, &st, NULL), GCOMP_SUCCESS);
    assert_int_equal(res.cur, 0);
    assert_int_equal(res.step, 8);
    /* a failed encode keeps the buffer and the step, as the CPU path abandons a failed call */
    res.buf[1] = b1; /* double-buffered again: an error still does not flip */
    st.error = GCOMP_ERR_INTERNAL;
    assert_int_equal(ops->residual_commit(&res, &st, NULL), GCOMP_SUCCESS);
    assert_int_equal(res.cur, 0);
    assert_int_equal(res.step, 8);
    st.error = 0;

    /* header check: the right header passes, each wrong field sets the status */
    {
        gcomp_cuda_status cs = { 0 };
        gcomp__device_tally ct = { 0 };
        assert_int_equal(ops->header_check(payload, sizeof payload, 2, 5, &cs, NULL), GCOMP_SUCCESS);
        assert_int_equal(cs.error, 0);
        assert_int_equal(ops->status_fold(&cs, &ct, NULL), GCOMP_SUCCESS);
        assert_int_equal(ct.decode_calls, 1);
        assert_int_equal(ops->header_check(payload, sizeof payload, 3, 5, &cs, NULL), GCOMP_SUCCESS);
        assert_int_equal(cs.error, GCOMP_ERR_CORRUPT);
        assert_int_equal(cs.reserved, GCOMP__WHERE_HEADER);
        assert_int_equal(ops->status_fold(&cs, &ct, NULL), GCOMP_SUCCESS);
        assert_int_equal(ct.error, GCOMP_ERR_CORRUPT);
        assert_int_equal(ct.where, GCOMP__WHERE_HEADER);
        assert_int_equal(ct.decode_calls, 1);
        memset(&cs, 0, sizeof cs);
        assert_int_equal(ops->header_check(payload, sizeof payload, 2, 6, &cs, NULL), GCOMP_SUCCESS);
        assert_int_equal(cs.error, GCOMP_ERR_CORRUPT);
        memset(&cs, 0, sizeof cs);
        assert_int_equal(ops->header_check(payload, sizeof payload - 1, 2, 5, &cs, NULL), GCOMP_SUCCESS);
        assert_int_equal(cs.error, GCOMP_ERR_CORRUPT);
        memset(&cs, 0, sizeof cs);
        assert_int_equal(ops->header_check(payload, 7, 2, 5, &cs, NULL), GCOMP_SUCCESS);
        assert_int_equal(cs.error, GCOMP_ERR_CORRUPT);
    }
}

/* the async API on host buffers runs at once, like the plain calls */
static void test_async_on_host(void **state)
{
    gcomp_codec *c = tu_codec("fp16"), *ref = tu_codec("fp16");
    float *x = tu_gauss_array(1000, 9), *acc = calloc(1000, 4), *acc_ref = calloc(1000, 4);
    size_t cap = gcomp_codec_max_encoded_bytes(c, 1000), w, wr;
    uint8_t *p = malloc(cap), *pr = malloc(cap);
    (void)state;
    assert_int_equal(gcomp_codec_encode_async(c, 1, x, 1000, GCOMP_F32, p, cap, &w, NULL), GCOMP_SUCCESS);
    assert_int_equal(gcomp_codec_encode(ref, 1, x, 1000, GCOMP_F32, pr, cap, &wr), GCOMP_SUCCESS);
    assert_int_equal(w, wr);
    assert_memory_equal(p, pr, w);
    assert_int_equal(gcomp_codec_decode_add_async(c, p, w, acc, 1000, NULL), GCOMP_SUCCESS);
    assert_int_equal(gcomp_codec_decode_add(ref, pr, wr, acc_ref, 1000), GCOMP_SUCCESS);
    assert_memory_equal(acc, acc_ref, 4000);
    assert_int_equal(gcomp_codec_decode_async(c, p, w, acc, 1000, GCOMP_F32, NULL), GCOMP_SUCCESS);
    assert_int_equal(gcomp_codec_sync(c, NULL), GCOMP_SUCCESS);
    assert_int_equal(gcomp_codec_sync(NULL, NULL), GCOMP_ERR_INVALID_ARG);
    free(x), free(acc), free(acc_ref), free(p), free(pr);
    gcomp_codec_destroy(c), gcomp_codec_destroy(ref);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memory),
        cmocka_unit_test(test_widen_narrow_divide),
        cmocka_unit_test(test_header_status_commit),
        cmocka_unit_test(test_async_on_host),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
