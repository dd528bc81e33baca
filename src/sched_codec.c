/*
 * sched_codec.c — what the schedules do to element memory, on the call's device (schedule.h):
 * encode, decode-add, zero and copy, through the codec object's CPU path and plain memory for
 * host buffers, or the codec's CUDA ops and the device layer on the caller's stream for
 * device buffers. The schedules' arithmetic order is the same either way, so device results
 * equal the host's bit for bit (the kernels equal the CPU reference per element), but for the
 * payload of a NaN + NaN in a pair sum (gcomp__call_decode_sum2: cast.h).
 */
#include <stdint.h>
#include <string.h>

#include "schedule.h"

size_t gcomp__call_scratch_bytes(const gcomp__call *call, size_t count, int n)
{
    const gcomp_codec_cuda_ops *cu = call->vt->cuda;
    size_t one;
    if (!call->on_device || !cu || !cu->scratch_bytes) return 0;
    one = cu->scratch_bytes(call->params, count);
    if (n <= 1) return one;
    /* saturates, as gcomp__ws_take does, so the workspace sizing fails instead of wrapping */
    return one > SIZE_MAX / (size_t)n ? SIZE_MAX : one * (size_t)n;
}

gcomp_result gcomp__call_res_blocks(gcomp__call *call, int n, const size_t *lo, gcomp_cuda_residual *host_tmp,
                                    gcomp_cuda_residual *dev)
{
    if (!call->on_device || !call->r_in) return GCOMP_SUCCESS;
    for (int i = 0; i < n; i++) {
        memset(&host_tmp[i], 0, sizeof host_tmp[i]);
        host_tmp[i].buf[0] = call->r_in + lo[i];
        host_tmp[i].buf[1] = call->r_out + lo[i]; /* device residuals are double-buffered */
        host_tmp[i].step = call->step;
        host_tmp[i].cur = 0;
    }
    return gcomp__call_to_device(call, dev, host_tmp, (size_t)n * sizeof *dev);
}

gcomp_result gcomp__call_encode(gcomp__call *call, gcomp_encode_ctx *ctx, const float *x, size_t lo, size_t n,
                                int with_residual, const gcomp_cuda_residual *res_block, void *scratch, uint8_t *out,
                                size_t cap, size_t *bytes)
{
    with_residual = with_residual && call->r_in;
    if (!call->on_device)
        return gcomp__codec_encode_ctx(call->codec, ctx, x + lo, with_residual ? call->r_in + lo : NULL,
                                       with_residual ? call->r_out + lo : NULL, n, out, cap, bytes);
    return gcomp__codec_dev_encode(call->codec, call->dev, ctx, x + lo, with_residual ? res_block : NULL, n, out, cap,
                                   scratch, call->status, call->tally, bytes, call->stream);
}

gcomp_result gcomp__call_decode_add(gcomp__call *call, const void *payload, size_t bytes, float *acc, size_t n)
{
    if (!call->on_device) return gcomp_codec_decode_add(call->codec, payload, bytes, acc, n);
    return gcomp__codec_dev_decode_add(call->codec, call->dev, payload, bytes, acc, n, call->status, call->tally,
                                       call->stream);
}

gcomp_result gcomp__call_decode(gcomp__call *call, const void *payload, size_t bytes, float *dst, size_t n)
{
    if (!call->on_device) return gcomp_codec_decode(call->codec, payload, bytes, dst, n, GCOMP_F32);
    GCOMP_CHECK(gcomp__call_zero(call, dst, n * sizeof(float)));
    return gcomp__call_decode_add(call, payload, bytes, dst, n);
}

gcomp_result gcomp__call_decode_sum2(gcomp__call *call, const void *first, size_t fbytes, const void *second,
                                     size_t sbytes, float *dst, size_t n)
{
    if (!call->on_device) return gcomp__codec_decode_sum2(call->codec, first, fbytes, second, sbytes, dst, n);
    GCOMP_CHECK(gcomp__call_decode(call, first, fbytes, dst, n));
    return gcomp__call_decode_add(call, second, sbytes, dst, n);
}

gcomp_result gcomp__call_zero(gcomp__call *call, void *dst, size_t bytes)
{
    return call->dev->memset_async(dst, 0, bytes, call->stream);
}

/* Milliseconds left before the call's deadline (0 past it: a wait then only looks once).
 * timeout_ms may be as large as INT64_MAX: a double that far out no longer fits an int64. */
static int64_t ms_left(const gcomp__call *call)
{
    double left_ms = 1e3 * (call->ring.deadline - gcomp__now());
    return left_ms >= 0x1p62 ? INT64_MAX : left_ms > 0 ? (int64_t)left_ms + 1 : 0;
}

gcomp_result gcomp__call_wait(gcomp__call *call)
{
    if (!call->on_device) return GCOMP_SUCCESS;
    return call->dev->wait(call->stream, ms_left(call));
}

gcomp_result gcomp__call_wait_on(const gcomp__call *call, const gcomp__device_ops *dev, struct CUstream_st *stream)
{
    return dev->wait(stream, ms_left(call));
}

/* The same copy as gcomp__call_to_device, then waited for (a no-op for host buffers). */
gcomp_result gcomp__call_to_host(gcomp__call *call, void *dst, const void *src, size_t bytes)
{
    GCOMP_CHECK(gcomp__call_to_device(call, dst, src, bytes));
    return gcomp__call_wait(call);
}

gcomp_result gcomp__call_to_device(gcomp__call *call, void *dst, const void *src, size_t bytes)
{
    if (!call->on_device) {
        if (bytes && dst != src) memmove(dst, src, bytes);
        return GCOMP_SUCCESS;
    }
    return call->dev->copy_async(dst, src, bytes, call->stream);
}
