/*
 * cuda/device.cu — the device layer's CUDA ops (see src/device.h): memory, copies and
 * elementwise kernels on the caller's stream, the small kernels of the codec object's device
 * path (header write/check, residual commit, status fold), and where a pointer lives.
 *
 * Every op only enqueues on the given stream and checks the launch; nothing here synchronises
 * the host except wait() and free(), so the codec object's fixed-size calls can be captured
 * in a CUDA graph.
 */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <time.h>

extern "C" {
#include "codecs/cast.h"
#include "device.h"
}

/* A CUDA runtime failure as a gcomp_result, with the runtime's own words. cudaGetLastError
 * clears a non-sticky error so that it is not reported again by the next, unrelated check. */
static gcomp_result cuda_fail(cudaError_t e, const char *what)
{
    (void)cudaGetLastError();
    if (e == cudaErrorMemoryAllocation)
        return gcomp__fail(GCOMP_ERR_NOMEM, "cuda: %s: %s", what, cudaGetErrorString(e));
    return gcomp__fail(GCOMP_ERR_TRANSPORT, "cuda: %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

#define CUDA_TRY(call, what)                               \
    do {                                                   \
        cudaError_t e_ = (call);                           \
        if (e_ != cudaSuccess) return cuda_fail(e_, what); \
    } while (0)

/* after a launch: a bad configuration or a dead context shows up here, not in the kernel */
#define CUDA_LAUNCHED(what) CUDA_TRY(cudaGetLastError(), what)

/* Grid of a grid-stride loop: enough blocks to cover n items (capped: the loop does the rest). */
static unsigned grid_for(size_t n, unsigned per_block)
{
    size_t b = (n + per_block - 1) / per_block;
    if (b == 0) b = 1;
    return b > (1u << 20) ? (1u << 20) : (unsigned)b;
}

/* ---- where a pointer lives ------------------------------------------------------------- */

/* cudaPointerGetAttributes would create a CUDA context on the current device the first time
 * it runs: a CPU-only user of a CUDA build on a GPU node must not pay for (or hold) one. So
 * ask the driver first, through dlopen (the library must load where no driver is installed):
 * without a current context on this thread and without an active primary context anywhere,
 * no runtime allocation can exist and the pointer is host memory. */
typedef int (*cu_init_fn)(unsigned);
typedef int (*cu_ctx_get_current_fn)(void **);
typedef int (*cu_device_get_count_fn)(int *);
typedef int (*cu_primary_state_fn)(int, unsigned *, int *);

struct driver {
    int usable;
    cu_ctx_get_current_fn ctx_get_current;
    cu_primary_state_fn primary_state;
    int devices;
};

static driver load_driver()
{
    driver d = { 0, nullptr, nullptr, 0 };
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return d;
    cu_init_fn init = (cu_init_fn)dlsym(lib, "cuInit");
    cu_device_get_count_fn count = (cu_device_get_count_fn)dlsym(lib, "cuDeviceGetCount");
    d.ctx_get_current = (cu_ctx_get_current_fn)dlsym(lib, "cuCtxGetCurrent");
    d.primary_state = (cu_primary_state_fn)dlsym(lib, "cuDevicePrimaryCtxGetState");
    if (!init || !count || !d.ctx_get_current || !d.primary_state || init(0) != 0 || count(&d.devices) != 0 ||
        d.devices <= 0)
        return d; /* the handle stays open: the process may ask again, cheaply, with usable = 0 */
    d.usable = 1;
    return d;
}

static const driver &the_driver()
{
    static const driver d = load_driver(); /* thread-safe one-time initialisation (C++11) */
    return d;
}

static int any_context(const driver &d)
{
    void *ctx = nullptr;
    if (d.ctx_get_current(&ctx) == 0 && ctx) return 1;
    for (int i = 0; i < d.devices; i++) {
        unsigned flags = 0;
        int active = 0;
        if (d.primary_state(i, &flags, &active) == 0 && active) return 1;
    }
    return 0;
}

extern "C" int gcomp__cuda_locate(const void *ptr, int *device)
{
    const driver &d = the_driver();
    cudaPointerAttributes a;
    if (!d.usable || !any_context(d)) return 0;
    if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) return 0;
    *device = a.device;
    return 1;
}

extern "C" int gcomp__cuda_current_device(void)
{
    int dev = -1;
    if (!the_driver().usable) return -1;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return dev;
}

extern "C" int gcomp__cuda_set_device(int device)
{
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) (void)cudaGetLastError();
    return (int)e;
}

/* ---- memory ------------------------------------------------------------------------------ */

static gcomp_result cu_alloc(size_t bytes, void **out)
{
    cudaError_t e = cudaMalloc(out, bytes ? bytes : 256);
    if (e != cudaSuccess) {
        *out = nullptr;
        (void)cudaGetLastError();
        return gcomp__fail(e == cudaErrorMemoryAllocation ? GCOMP_ERR_NOMEM : GCOMP_ERR_TRANSPORT,
                           "cuda: cannot allocate %zu bytes of device memory: %s", bytes, cudaGetErrorString(e));
    }
    return GCOMP_SUCCESS;
}

static void cu_free(void *p)
{
    if (p && cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
}

static gcomp_result cu_memset(void *dst, int value, size_t bytes, struct CUstream_st *stream)
{
    if (!bytes) return GCOMP_SUCCESS;
    CUDA_TRY(cudaMemsetAsync(dst, value, bytes, stream), "memset");
    return GCOMP_SUCCESS;
}

static gcomp_result cu_copy(void *dst, const void *src, size_t bytes, struct CUstream_st *stream)
{
    if (!bytes) return GCOMP_SUCCESS;
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream), "copy");
    return GCOMP_SUCCESS;
}

/* ---- elementwise ------------------------------------------------------------------------- */

static __global__ void widen_kernel(const uint16_t *src, int bf16, size_t n, float *dst)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = bf16 ? gcomp_bf16_to_f32_inline(src[i]) : gcomp_f16_to_f32_inline(src[i]);
}

static __global__ void narrow_kernel(const float *src, int bf16, size_t n, uint16_t *dst)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t x = gcomp_f32_bits(src[i]);
        dst[i] = bf16 ? gcomp_bf16_from_bits(x) : gcomp_f16_from_bits(x);
    }
}

/* x * inv when d is a power of two (exactly x / d, see codecs/common.h), else x / d: both
 * correctly rounded (nvcc's default -prec-div=true; no fast math). */
static __global__ void divide_kernel(float *x, size_t n, float d, float inv, int pow2)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = gcomp_x86_nan_f32(pow2 ? x[i] * inv : x[i] / d, x[i], d); /* the CPU's NaN bits */
}

static __global__ void scale_kernel(float *x, size_t n, float s)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = gcomp_x86_nan_f32(__fmul_rn(x[i], s), x[i], s); /* the CPU's NaN bits */
}

/* *flag = 1 when some element's exponent is all ones; threads that find none write nothing. */
static __global__ void flag_nonfinite_kernel(const void *x, size_t n, int wide, uint32_t mask, uint32_t *flag)
{
    uint32_t bad = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t v = wide ? ((const uint32_t *)x)[i] : ((const uint16_t *)x)[i];
        bad |= (v & mask) == mask;
    }
    if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

static gcomp_result cu_widen(const void *src, gcomp_dtype dtype, size_t count, float *dst, struct CUstream_st *stream)
{
    if (dtype == GCOMP_F32) return cu_copy(dst, src, count * sizeof(float), stream);
    if (dtype != GCOMP_F16 && dtype != GCOMP_BF16)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "widen: invalid dtype %d", (int)dtype);
    if (!count) return GCOMP_SUCCESS;
    widen_kernel<<<grid_for(count, 256), 256, 0, stream>>>((const uint16_t *)src, dtype == GCOMP_BF16, count, dst);
    CUDA_LAUNCHED("widen kernel");
    return GCOMP_SUCCESS;
}

static gcomp_result cu_narrow(const float *src, size_t count, gcomp_dtype dtype, void *dst, struct CUstream_st *stream)
{
    if (dtype == GCOMP_F32) return cu_copy(dst, src, count * sizeof(float), stream);
    if (dtype != GCOMP_F16 && dtype != GCOMP_BF16)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "narrow: invalid dtype %d", (int)dtype);
    if (!count) return GCOMP_SUCCESS;
    narrow_kernel<<<grid_for(count, 256), 256, 0, stream>>>(src, dtype == GCOMP_BF16, count, (uint16_t *)dst);
    CUDA_LAUNCHED("narrow kernel");
    return GCOMP_SUCCESS;
}

static gcomp_result cu_divide(float *x, size_t count, float d, struct CUstream_st *stream)
{
    int e = 0;
    int pow2 = frexpf(d, &e) == 0.5f;
    float inv = pow2 ? ldexpf(1.0f, 1 - e) : 0.0f;
    if (!count) return GCOMP_SUCCESS;
    divide_kernel<<<grid_for(count, 256), 256, 0, stream>>>(x, count, d, inv, pow2);
    CUDA_LAUNCHED("divide kernel");
    return GCOMP_SUCCESS;
}

static gcomp_result cu_scale(float *x, size_t count, float s, struct CUstream_st *stream)
{
    if (!count) return GCOMP_SUCCESS;
    scale_kernel<<<grid_for(count, 256), 256, 0, stream>>>(x, count, s);
    CUDA_LAUNCHED("scale kernel");
    return GCOMP_SUCCESS;
}

static gcomp_result cu_flag_nonfinite(const void *x, size_t count, gcomp_dtype dtype, uint32_t *flag,
                                      struct CUstream_st *stream)
{
    uint32_t mask = dtype == GCOMP_F32 ? 0x7f800000u : dtype == GCOMP_F16 ? 0x7c00u : 0x7f80u;
    if (dtype != GCOMP_F32 && dtype != GCOMP_F16 && dtype != GCOMP_BF16)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "flag_nonfinite: invalid dtype %d", (int)dtype);
    if (!count) return GCOMP_SUCCESS;
    flag_nonfinite_kernel<<<grid_for(count, 256), 256, 0, stream>>>(x, count, dtype == GCOMP_F32, mask, flag);
    CUDA_LAUNCHED("non-finite check kernel");
    return GCOMP_SUCCESS;
}

static gcomp_result cu_alloc_pinned(size_t bytes, void **out)
{
    cudaError_t e = cudaHostAlloc(out, bytes ? bytes : 256, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        *out = nullptr;
        (void)cudaGetLastError();
        return gcomp__fail(e == cudaErrorMemoryAllocation ? GCOMP_ERR_NOMEM : GCOMP_ERR_TRANSPORT,
                           "cuda: cannot allocate %zu bytes of pinned host memory: %s", bytes, cudaGetErrorString(e));
    }
    return GCOMP_SUCCESS;
}

static void cu_free_pinned(void *p)
{
    if (p && cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
}

/* Poll instead of cudaStreamSynchronize so that a kernel that never ends (a hung peer in a
 * later NCCL step) becomes GCOMP_ERR_TIMEOUT; the sleep grows to 1 ms so a long wait costs
 * little CPU and a short one adds little latency. */
static gcomp_result cu_wait(struct CUstream_st *stream, int64_t timeout_ms)
{
    struct timespec start, now, nap = { 0, 1000 };
    if (timeout_ms < 0) {
        CUDA_TRY(cudaStreamSynchronize(stream), "stream synchronize");
        return GCOMP_SUCCESS;
    }
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        cudaError_t e = cudaStreamQuery(stream);
        if (e == cudaSuccess) return GCOMP_SUCCESS;
        if (e != cudaErrorNotReady) return cuda_fail(e, "stream query");
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000 >= timeout_ms)
            return gcomp__fail(GCOMP_ERR_TIMEOUT, "cuda: stream work still running after %lld ms",
                               (long long)timeout_ms);
        nanosleep(&nap, nullptr);
        if (nap.tv_nsec < 1000000) nap.tv_nsec *= 2;
    }
}

/* ---- the codec object's steps ------------------------------------------------------------ */

static gcomp_result cu_capturing(struct CUstream_st *stream, int *yes)
{
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    *yes = 0;
    CUDA_TRY(cudaStreamIsCapturing(stream, &st), "cudaStreamIsCapturing");
    *yes = st != cudaStreamCaptureStatusNone;
    return GCOMP_SUCCESS;
}

static __device__ void tally_error(gcomp__device_tally *t, uint32_t error, uint32_t where)
{
    /* first error wins; `where` is written by the winner only */
    if (error && atomicCAS(&t->error, 0u, error) == 0u) t->where = where;
}

static __global__ void header_write_kernel(uint8_t *out, gcomp_header h, const gcomp_cuda_status *st,
                                           uint64_t expect_body, gcomp__device_tally *tally)
{
    uint64_t body = st->body_bytes;
    /* the same bytes as gcomp_header_write (src/header.c) */
    gcomp_le_store_u32(out + 0, GCOMP_HEADER_MAGIC);
    out[4] = GCOMP_FORMAT_VERSION;
    out[5] = h.dtype;
    out[6] = (uint8_t)h.wire_id;
    out[7] = (uint8_t)(h.wire_id >> 8);
    gcomp_le_store_u32(out + 8, st->flags);
    gcomp_le_store_u32(out + 12, 0);
    gcomp_le_store_u64(out + 16, h.count);
    gcomp_le_store_u64(out + 24, body);
    /* the encode's own error first, as status_fold does a decode's: a fixed-size codec's call
     * is not read back, so the tally is where the next sync (or the engine's finish) finds
     * it. It has no WHERE of its own: NONE is what the readers take for an encode's. */
    tally_error(tally, st->error, GCOMP__WHERE_NONE);
    if (expect_body != UINT64_MAX && body != expect_body) tally_error(tally, GCOMP_ERR_INTERNAL, GCOMP__WHERE_SIZE);
    atomicAdd((unsigned long long *)&tally->encode_calls, 1ull);
    atomicAdd((unsigned long long *)&tally->raw_bytes,
              (unsigned long long)(h.count * (h.dtype == GCOMP_F32 ? 4u : 2u)));
    atomicAdd((unsigned long long *)&tally->wire_bytes, (unsigned long long)(GCOMP_HEADER_BYTES + body));
    atomicAdd((unsigned long long *)&tally->overflow, (unsigned long long)st->overflow);
    if (st->nonfinite) atomicAdd((unsigned long long *)&tally->nonfinite_calls, 1ull);
}

/* The checks of gcomp_header_read plus the caller's wire id and count; the 32 header bytes
 * are read only when bytes >= 32. */
static __global__ void header_check_kernel(const uint8_t *p, size_t bytes, uint16_t wire_id, uint64_t count,
                                           gcomp_cuda_status *st)
{
    int ok;
    if (st->error) return;
    ok = bytes >= GCOMP_HEADER_BYTES;
    if (ok) {
        ok = gcomp_le_load_u32(p) == GCOMP_HEADER_MAGIC && p[4] == GCOMP_FORMAT_VERSION &&
             gcomp_le_load_u32(p + 12) == 0 && p[5] < GCOMP_DTYPE_COUNT && (uint16_t)(p[6] | p[7] << 8) == wire_id &&
             gcomp_le_load_u64(p + 16) == count && gcomp_le_load_u64(p + 24) == bytes - GCOMP_HEADER_BYTES;
    }
    if (!ok) {
        st->error = GCOMP_ERR_CORRUPT;
        st->reserved = GCOMP__WHERE_HEADER;
    }
}

/* A non-finite encode keeps its residual and advances the step (the rounding of a skipped
 * step is not replayed); one that failed (st->error) keeps both, as the CPU path abandons a
 * failed call. */
static __global__ void residual_commit_kernel(gcomp_cuda_residual *res, const gcomp_cuda_status *st)
{
    if (res->buf[1] && !st->nonfinite && !st->error) res->cur ^= 1u;
    if (!st->error) res->step++;
}

static __global__ void status_fold_kernel(const gcomp_cuda_status *st, gcomp__device_tally *tally)
{
    if (st->error)
        tally_error(tally, st->error, st->reserved == GCOMP__WHERE_HEADER ? GCOMP__WHERE_HEADER : GCOMP__WHERE_BODY);
    else
        atomicAdd((unsigned long long *)&tally->decode_calls, 1ull);
}

static gcomp_result cu_header_write(uint8_t *payload, const gcomp_header *h, const gcomp_cuda_status *st,
                                    uint64_t expect_body, gcomp__device_tally *tally, struct CUstream_st *stream)
{
    header_write_kernel<<<1, 1, 0, stream>>>(payload, *h, st, expect_body, tally);
    CUDA_LAUNCHED("header kernel");
    return GCOMP_SUCCESS;
}

static gcomp_result cu_header_check(const uint8_t *payload, size_t bytes, uint16_t wire_id, uint64_t count,
                                    gcomp_cuda_status *st, struct CUstream_st *stream)
{
    header_check_kernel<<<1, 1, 0, stream>>>(payload, bytes, wire_id, count, st);
    CUDA_LAUNCHED("header check kernel");
    return GCOMP_SUCCESS;
}

static gcomp_result cu_residual_commit(gcomp_cuda_residual *res, const gcomp_cuda_status *st,
                                       struct CUstream_st *stream)
{
    residual_commit_kernel<<<1, 1, 0, stream>>>(res, st);
    CUDA_LAUNCHED("residual commit kernel");
    return GCOMP_SUCCESS;
}

static gcomp_result cu_status_fold(const gcomp_cuda_status *st, gcomp__device_tally *tally, struct CUstream_st *stream)
{
    status_fold_kernel<<<1, 1, 0, stream>>>(st, tally);
    CUDA_LAUNCHED("status fold kernel");
    return GCOMP_SUCCESS;
}

static gcomp__device_ops make_ops()
{
    gcomp__device_ops o = {};
    o.kind = GCOMP__DEVICE_CUDA;
    o.name = "cuda";
    o.alloc = cu_alloc;
    o.free = cu_free;
    o.memset_async = cu_memset;
    o.copy_async = cu_copy;
    o.widen = cu_widen;
    o.narrow = cu_narrow;
    o.divide = cu_divide;
    o.scale = cu_scale;
    o.flag_nonfinite = cu_flag_nonfinite;
    o.alloc_pinned = cu_alloc_pinned;
    o.free_pinned = cu_free_pinned;
    o.wait = cu_wait;
    o.capturing = cu_capturing;
    o.header_write = cu_header_write;
    o.header_check = cu_header_check;
    o.residual_commit = cu_residual_commit;
    o.status_fold = cu_status_fold;
    return o;
}

extern "C" const gcomp__device_ops gcomp__device_cuda = make_ops();
