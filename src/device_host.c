/*
 * device_host.c — the device layer's host implementation: plain memory, work done at once
 * (streams are ignored, so wait() has nothing to wait for). Always built: host buffers take
 * this path, and it is the reference the CUDA ops (cuda/device.cu) mirror.
 */
#include <stdlib.h>
#include <string.h>

#include "codecs/cast.h"
#include "codecs/common.h"
#include "device.h"

static gcomp_result host_alloc(size_t bytes, void **out)
{
    /* 256-byte alignment as cudaMalloc gives, so callers may carve regions the same way */
    size_t rounded = (bytes + 255) & ~(size_t)255;
    *out = NULL;
    if (rounded < bytes) return gcomp__fail(GCOMP_ERR_NOMEM, "host memory: %zu bytes is too large", bytes);
    *out = aligned_alloc(256, rounded ? rounded : 256);
    if (!*out) return gcomp__fail(GCOMP_ERR_NOMEM, "host memory: cannot allocate %zu bytes", bytes);
    return GCOMP_SUCCESS;
}

static void host_free(void *p) { free(p); }

static gcomp_result host_alloc_zeroed(size_t bytes, void **out)
{
    *out = calloc(bytes ? bytes : 1, 1);
    if (!*out) return gcomp__fail(GCOMP_ERR_NOMEM, "host memory: cannot allocate %zu zeroed bytes", bytes);
    return GCOMP_SUCCESS;
}

static gcomp_result host_memset(void *dst, int value, size_t bytes, struct CUstream_st *stream)
{
    (void)stream;
    if (bytes) memset(dst, value, bytes);
    return GCOMP_SUCCESS;
}

static gcomp_result host_copy(void *dst, const void *src, size_t bytes, struct CUstream_st *stream)
{
    (void)stream;
    if (bytes) memmove(dst, src, bytes);
    return GCOMP_SUCCESS;
}

static gcomp_result host_widen(const void *src, gcomp_dtype dtype, size_t count, float *dst, struct CUstream_st *stream)
{
    const uint16_t *h = (const uint16_t *)src;
    (void)stream;
    if (dtype == GCOMP_F32) return host_copy(dst, src, count * sizeof(float), NULL);
    if (dtype == GCOMP_F16)
        for (size_t i = 0; i < count; i++) dst[i] = gcomp_f16_to_f32_inline(h[i]);
    else if (dtype == GCOMP_BF16)
        for (size_t i = 0; i < count; i++) dst[i] = gcomp_bf16_to_f32_inline(h[i]);
    else
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "widen: invalid dtype %d", (int)dtype);
    return GCOMP_SUCCESS;
}

static gcomp_result host_narrow(const float *src, size_t count, gcomp_dtype dtype, void *dst,
                                struct CUstream_st *stream)
{
    uint16_t *h = (uint16_t *)dst;
    (void)stream;
    if (dtype == GCOMP_F32) return host_copy(dst, src, count * sizeof(float), NULL);
    if (dtype == GCOMP_F16)
        for (size_t i = 0; i < count; i++) h[i] = gcomp_f16_from_bits(gcomp_f32_bits(src[i]));
    else if (dtype == GCOMP_BF16)
        for (size_t i = 0; i < count; i++) h[i] = gcomp_bf16_from_bits(gcomp_f32_bits(src[i]));
    else
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "narrow: invalid dtype %d", (int)dtype);
    return GCOMP_SUCCESS;
}

static gcomp_result host_divide(float *x, size_t count, float d, struct CUstream_st *stream)
{
    (void)stream;
    gcomp_divide_f32(x, count, d);
    return GCOMP_SUCCESS;
}

static gcomp_result host_scale(float *x, size_t count, float s, struct CUstream_st *stream)
{
    (void)stream;
    for (size_t i = 0; i < count; i++) x[i] *= s;
    return GCOMP_SUCCESS;
}

/* Branch-free so it vectorises. */
static gcomp_result host_flag_nonfinite(const void *x, size_t count, gcomp_dtype dtype, uint32_t *flag,
                                        struct CUstream_st *stream)
{
    uint32_t bad = 0;
    (void)stream;
    if (dtype == GCOMP_F32) {
        const uint32_t *b = (const uint32_t *)x;
        for (size_t i = 0; i < count; i++) bad |= (b[i] & 0x7f800000u) == 0x7f800000u;
    } else if (dtype == GCOMP_F16 || dtype == GCOMP_BF16) {
        const uint16_t *h = (const uint16_t *)x;
        uint16_t e = dtype == GCOMP_F16 ? 0x7c00u : 0x7f80u;
        for (size_t i = 0; i < count; i++) bad |= (h[i] & e) == e;
    } else {
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "flag_nonfinite: invalid dtype %d", (int)dtype);
    }
    if (bad) *flag = 1;
    return GCOMP_SUCCESS;
}

static gcomp_result host_wait(struct CUstream_st *stream, int64_t timeout_ms)
{
    (void)stream;
    (void)timeout_ms;
    return GCOMP_SUCCESS;
}

static gcomp_result host_capturing(struct CUstream_st *stream, int *yes)
{
    (void)stream;
    *yes = 0;
    return GCOMP_SUCCESS;
}

static void tally_error(gcomp__device_tally *t, uint32_t error, uint32_t where)
{
    if (t->error == 0 && error != 0) {
        t->error = error;
        t->where = where;
    }
}

static gcomp_result host_header_write(uint8_t *payload, const gcomp_header *h, const gcomp_cuda_status *st,
                                      uint64_t expect_body, gcomp__device_tally *tally, struct CUstream_st *stream)
{
    gcomp_header full = *h;
    (void)stream;
    full.flags = st->flags;
    full.body_bytes = st->body_bytes;
    gcomp_header_write(payload, &full);
    tally_error(tally, st->error, GCOMP__WHERE_NONE); /* the encode's own error (device.cu) */
    if (expect_body != UINT64_MAX && st->body_bytes != expect_body)
        tally_error(tally, GCOMP_ERR_INTERNAL, GCOMP__WHERE_SIZE);
    tally->encode_calls++;
    tally->raw_bytes += h->count * gcomp_dtype_size((gcomp_dtype)h->dtype);
    tally->wire_bytes += GCOMP_HEADER_BYTES + st->body_bytes;
    tally->overflow += st->overflow;
    tally->nonfinite_calls += st->nonfinite != 0;
    return GCOMP_SUCCESS;
}

static gcomp_result host_header_check(const uint8_t *payload, size_t bytes, uint16_t wire_id, uint64_t count,
                                      gcomp_cuda_status *st, struct CUstream_st *stream)
{
    gcomp_header h;
    (void)stream;
    if (st->error) return GCOMP_SUCCESS;
    /* gcomp_header_read records a message: the device path reports through the tally */
    if (gcomp_header_read(payload, bytes, &h) != GCOMP_SUCCESS || h.wire_id != wire_id || h.count != count) {
        st->error = GCOMP_ERR_CORRUPT;
        st->reserved = GCOMP__WHERE_HEADER;
    }
    return GCOMP_SUCCESS;
}

static gcomp_result host_residual_commit(gcomp_cuda_residual *res, const gcomp_cuda_status *st,
                                         struct CUstream_st *stream)
{
    (void)stream;
    if (res->buf[1] && !st->nonfinite && !st->error) res->cur ^= 1;
    if (!st->error) res->step++;
    return GCOMP_SUCCESS;
}

static gcomp_result host_status_fold(const gcomp_cuda_status *st, gcomp__device_tally *tally,
                                     struct CUstream_st *stream)
{
    (void)stream;
    tally_error(tally, st->error, st->reserved == GCOMP__WHERE_HEADER ? GCOMP__WHERE_HEADER : GCOMP__WHERE_BODY);
    tally->decode_calls += st->error == 0;
    return GCOMP_SUCCESS;
}

const gcomp__device_ops gcomp__device_host = {
    .kind = GCOMP__DEVICE_HOST,
    .name = "host",
    .alloc = host_alloc,
    .free = host_free,
    .alloc_zeroed = host_alloc_zeroed,
    .memset_async = host_memset,
    .copy_async = host_copy,
    .widen = host_widen,
    .narrow = host_narrow,
    .divide = host_divide,
    .scale = host_scale,
    .flag_nonfinite = host_flag_nonfinite,
    .alloc_pinned = host_alloc,
    .free_pinned = host_free,
    .wait = host_wait,
    .capturing = host_capturing,
    .header_write = host_header_write,
    .header_check = host_header_check,
    .residual_commit = host_residual_commit,
    .status_fold = host_status_fold,
};
