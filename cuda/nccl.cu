/*
 * cuda/nccl.cu — the CUDA runtime calls of the NCCL transport (src/transport_nccl.c): the
 * current device, pinned host memory, a stream of its own and completion events.
 *
 * Why a file of its own: only cuda/*.cu call the CUDA runtime (docs/ARCHITECTURE.md), so
 * src/transport_nccl.c calls NCCL and these few functions, and moves device memory through
 * the device layer's CUDA ops (cuda/device.cu). Nothing here synchronises the host: the
 * transport polls events against its deadlines instead.
 */
#include <cuda_runtime.h>

extern "C" {
#include "internal.h"
}

static gcomp_result nccl_cuda_fail(cudaError_t e, const char *what)
{
    (void)cudaGetLastError(); /* clear a non-sticky error so the next check does not see it */
    if (e == cudaErrorMemoryAllocation)
        return gcomp__fail(GCOMP_ERR_NOMEM, "cuda: %s: %s", what, cudaGetErrorString(e));
    return gcomp__fail(GCOMP_ERR_TRANSPORT, "cuda: %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

#define NCCL_CUDA_TRY(call, what)                               \
    do {                                                        \
        cudaError_t e_ = (call);                                \
        if (e_ != cudaSuccess) return nccl_cuda_fail(e_, what); \
    } while (0)

/* Make dev current on this thread; *prev gets the device that was (restore it with
 * gcomp__nccl_cuda_leave). A progress thread starts on device 0: the communicator's device
 * may be another. */
extern "C" gcomp_result gcomp__nccl_cuda_enter(int dev, int *prev)
{
    int cur = -1;
    NCCL_CUDA_TRY(cudaGetDevice(&cur), "cudaGetDevice");
    *prev = cur;
    if (cur != dev) NCCL_CUDA_TRY(cudaSetDevice(dev), "cudaSetDevice (the NCCL communicator's device)");
    return GCOMP_SUCCESS;
}

extern "C" void gcomp__nccl_cuda_leave(int dev, int prev)
{
    if (prev >= 0 && prev != dev && cudaSetDevice(prev) != cudaSuccess) (void)cudaGetLastError();
}

extern "C" gcomp_result gcomp__nccl_cuda_host_alloc(size_t bytes, void **out)
{
    cudaError_t e = cudaMallocHost(out, bytes ? bytes : 64);
    if (e != cudaSuccess) {
        *out = nullptr;
        return nccl_cuda_fail(e, "cudaMallocHost (pinned scratch of the NCCL transport)");
    }
    return GCOMP_SUCCESS;
}

extern "C" void gcomp__nccl_cuda_host_free(void *p)
{
    if (p && cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
}

/* A non-blocking stream (no implicit order with the legacy default stream). */
extern "C" gcomp_result gcomp__nccl_cuda_stream_create(struct CUstream_st **out)
{
    cudaStream_t s = nullptr;
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    *out = s;
    if (e != cudaSuccess) return nccl_cuda_fail(e, "cudaStreamCreateWithFlags");
    return GCOMP_SUCCESS;
}

extern "C" void gcomp__nccl_cuda_stream_destroy(struct CUstream_st *s)
{
    if (s && cudaStreamDestroy(s) != cudaSuccess) (void)cudaGetLastError();
}

extern "C" gcomp_result gcomp__nccl_cuda_event_create(struct CUevent_st **out)
{
    cudaEvent_t ev = nullptr;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    *out = ev;
    if (e != cudaSuccess) return nccl_cuda_fail(e, "cudaEventCreateWithFlags");
    return GCOMP_SUCCESS;
}

extern "C" void gcomp__nccl_cuda_event_destroy(struct CUevent_st *ev)
{
    if (ev && cudaEventDestroy(ev) != cudaSuccess) (void)cudaGetLastError();
}

extern "C" gcomp_result gcomp__nccl_cuda_event_record(struct CUevent_st *ev, struct CUstream_st *s)
{
    NCCL_CUDA_TRY(cudaEventRecord(ev, s), "cudaEventRecord");
    return GCOMP_SUCCESS;
}

/* 1: the work before the event is done; 0: not yet; -1: the device reported an error (*rc). */
extern "C" int gcomp__nccl_cuda_event_done(struct CUevent_st *ev, gcomp_result *rc)
{
    cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) return 1;
    if (e == cudaErrorNotReady) return 0;
    *rc = nccl_cuda_fail(e, "cudaEventQuery (waiting for NCCL work)");
    return -1;
}

/* 1 when stream is being captured into a CUDA graph (a host wait would break the capture). */
extern "C" int gcomp__nccl_cuda_capturing(struct CUstream_st *s)
{
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &st) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return st != cudaStreamCaptureStatusNone;
}
