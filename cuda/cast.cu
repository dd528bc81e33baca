/*
 * cuda/cast.cu — CUDA kernels of the cast codecs (none, fp16, bf16); wire format and rounding
 * in codecs/cast.h, CPU reference in codecs/cast.c. Every element goes through the same
 * GCOMP_HD helpers as the CPU (gcomp_f16_from_bits, ...), and the only float operations are
 * one add (g + r), one subtract (x - y) and, on decode, one add into acc: with --fmad=false
 * nothing can be contracted, so payloads and residuals equal the CPU's bit for bit. The adds
 * go through gcomp_x86_nan_f32 so that a NaN input leaves the CPU's NaN bits in the payload
 * (the GPU's own add would write 0x7fffffff).
 *
 * Encode is one pass with the residual fused: read g and r, write the body and the new
 * residual. Memory-bound, so each thread moves 4 elements with 16-byte loads and stores (8
 * for a half-precision body) when the pointers allow it; a scalar tail finishes the count.
 */
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "codecs/cast.h"
}

enum {
    KIND_F32 = 0,
    KIND_F16 = 1,
    KIND_BF16 = 2
};

static size_t width_of(int kind) { return kind == KIND_F32 ? 4 : 2; }

static const char *name_of(int kind) { return kind == KIND_F32 ? "none" : kind == KIND_F16 ? "fp16" : "bf16"; }

static gcomp_result launch_failed(const char *what)
{
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return GCOMP_SUCCESS;
    return gcomp_codec_fail(GCOMP_ERR_TRANSPORT, "cuda %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

static unsigned grid_for(size_t n, unsigned per_block)
{
    size_t b = (n + per_block - 1) / per_block;
    if (b == 0) b = 1;
    return b > (1u << 20) ? (1u << 20) : (unsigned)b;
}

static int aligned(const void *p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

/* ---- one element, as cast_loop in codecs/cast.c --------------------------------------- */

static __device__ __forceinline__ int nonfinite_f32(float x)
{
    return (gcomp_f32_bits(x) & 0x7f800000u) == 0x7f800000u;
}

/* The wire code of x (f32: its bits) and the value it decodes to. */
template <int KIND> static __device__ __forceinline__ uint32_t cast_code(float x, float *y)
{
    if (KIND == KIND_F32) {
        *y = x;
        return gcomp_f32_bits(x);
    } else if (KIND == KIND_F16) {
        uint16_t h = gcomp_f16_from_bits(gcomp_f32_bits(x));
        *y = gcomp_f16_to_f32_inline(h);
        return h;
    } else {
        uint16_t h = gcomp_bf16_from_bits(gcomp_f32_bits(x));
        *y = gcomp_bf16_to_f32_inline(h);
        return h;
    }
}

template <int KIND> static __device__ __forceinline__ float cast_value(uint32_t code)
{
    if (KIND == KIND_F32) return gcomp_bits_f32(code);
    if (KIND == KIND_F16) return gcomp_f16_to_f32_inline((uint16_t)code);
    return gcomp_bf16_to_f32_inline((uint16_t)code);
}

/* x = g (+ r); code; r_out = x - y; counts as the CPU does: bad = !finite(x), over = finite
 * x that became inf. */
template <int KIND, bool HAS_R> struct elem {
    static __device__ __forceinline__ uint32_t run(float g, float r, float *r_new, uint32_t *bad, uint32_t *over)
    {
        float x = HAS_R ? gcomp_x86_nan_f32(g + r, g, r) : g; /* a NaN g keeps its bits, as on the CPU */
        float y;
        uint32_t code = cast_code<KIND>(x, &y);
        uint32_t xfin = !nonfinite_f32(x);
        *bad |= !xfin;
        *over += xfin & nonfinite_f32(y);
        *r_new = x - y;
        return code;
    }
};

template <int KIND> static __device__ __forceinline__ void store_code(uint8_t *body, size_t i, uint32_t code)
{
    if (KIND == KIND_F32)
        gcomp_le_store_u32(body + 4 * i, code);
    else {
        body[2 * i] = (uint8_t)code;
        body[2 * i + 1] = (uint8_t)(code >> 8);
    }
}

template <int KIND> static __device__ __forceinline__ uint32_t load_code(const uint8_t *body, size_t i)
{
    if (KIND == KIND_F32) return gcomp_le_load_u32(body + 4 * i);
    return (uint32_t)body[2 * i] | (uint32_t)body[2 * i + 1] << 8;
}

/* Report a thread's counts: rare (non-finite input or overflow), so plain atomics suffice. */
static __device__ __forceinline__ void report(gcomp_cuda_status *st, uint32_t bad, uint32_t over)
{
    if (over) atomicAdd((unsigned long long *)&st->overflow, (unsigned long long)over);
    if (bad | over) st->nonfinite = 1;
}

/* ---- encode ------------------------------------------------------------------------------ */

/* VEC: g, body and the residual buffers are aligned for 4-element vectors; groups of 4 go
 * vectorised and the last n % 4 elements scalar. Without VEC every element is scalar. The
 * residual is read at run time (res->cur), so a replayed graph uses the committed buffer. */
template <int KIND, bool HAS_R, bool VEC>
static __global__ void encode_kernel(const float *__restrict__ g, const gcomp_cuda_residual *res, size_t n,
                                     uint8_t *__restrict__ body, gcomp_cuda_status *st)
{
    const float *r_in = nullptr;
    float *r_out = nullptr;
    uint32_t bad = 0, over = 0;
    size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    size_t done = 0;
    if (HAS_R) {
        r_in = res->buf[res->cur];
        r_out = res->buf[res->cur ^ 1u]; /* NULL: keep no residual (single-buffered) */
    }
    if (tid == 0) {
        st->body_bytes = (uint64_t)n * (KIND == KIND_F32 ? 4 : 2);
        st->flags = 0;
    }
    if (VEC) {
        size_t groups = n / 4;
        for (size_t j = tid; j < groups; j += stride) {
            float4 gv = reinterpret_cast<const float4 *>(g)[j];
            float4 rv = HAS_R ? reinterpret_cast<const float4 *>(r_in)[j] : make_float4(0.f, 0.f, 0.f, 0.f);
            float4 nv;
            uint32_t c0 = elem<KIND, HAS_R>::run(gv.x, rv.x, &nv.x, &bad, &over);
            uint32_t c1 = elem<KIND, HAS_R>::run(gv.y, rv.y, &nv.y, &bad, &over);
            uint32_t c2 = elem<KIND, HAS_R>::run(gv.z, rv.z, &nv.z, &bad, &over);
            uint32_t c3 = elem<KIND, HAS_R>::run(gv.w, rv.w, &nv.w, &bad, &over);
            if (KIND == KIND_F32)
                reinterpret_cast<uint4 *>(body)[j] = make_uint4(c0, c1, c2, c3);
            else
                reinterpret_cast<uint2 *>(body)[j] = make_uint2(c0 | c1 << 16, c2 | c3 << 16);
            if (HAS_R && r_out) reinterpret_cast<float4 *>(r_out)[j] = nv;
        }
        done = groups * 4;
    }
    for (size_t i = done + tid; i < n; i += stride) {
        float nr;
        uint32_t c = elem<KIND, HAS_R>::run(g[i], HAS_R ? r_in[i] : 0.0f, &nr, &bad, &over);
        store_code<KIND>(body, i, c);
        if (HAS_R && r_out) r_out[i] = nr;
    }
    report(st, bad, over);
}

template <int KIND, bool HAS_R>
static void launch_encode(int vec, const float *g, const gcomp_cuda_residual *res, size_t n, uint8_t *body,
                          gcomp_cuda_status *st, cudaStream_t s)
{
    if (vec)
        encode_kernel<KIND, HAS_R, true><<<grid_for(n / 4 + 1, 256), 256, 0, s>>>(g, res, n, body, st);
    else
        encode_kernel<KIND, HAS_R, false><<<grid_for(n, 256), 256, 0, s>>>(g, res, n, body, st);
}

/* The residual buffers are the library's own allocations (256-byte aligned), so only g and
 * the body decide whether the vector path applies. */
template <int KIND>
static gcomp_result cast_encode(const gcomp_encode_ctx *ctx, const float *g, const gcomp_cuda_residual *res, size_t n,
                                uint8_t *body, size_t cap, gcomp_cuda_status *st, cudaStream_t s)
{
    size_t need = n * width_of(KIND);
    int vec = aligned(g, 16) && aligned(body, 4 * width_of(KIND));
    (void)ctx;
    if (cap < need)
        return gcomp_codec_fail(GCOMP_ERR_BUFFER_TOO_SMALL, "%s (cuda): needs %zu body bytes, has %zu", name_of(KIND),
                                need, cap);
    if (res)
        launch_encode<KIND, true>(vec, g, res, n, body, st, s);
    else
        launch_encode<KIND, false>(vec, g, res, n, body, st, s);
    return launch_failed("cast encode kernel");
}

/* ---- decode-add -------------------------------------------------------------------------- */

/* The header was checked against the caller's count and the payload size (body_bytes <=
 * cap - 32) by the library; what is the codec's to check is as on the CPU: flags 0 and a
 * body of exactly count * width bytes. One thread; the add kernel runs only on success. */
static __global__ void check_kernel(const uint8_t *payload, size_t cap, size_t n, unsigned width, gcomp_cuda_status *st)
{
    uint64_t body_bytes;
    if (st->error) return;
    if (cap < GCOMP_HEADER_BYTES) {
        st->error = GCOMP_ERR_CORRUPT;
        return;
    }
    body_bytes = gcomp_le_load_u64(payload + 24);
    if (gcomp_le_load_u32(payload + 8) != 0 || body_bytes != (uint64_t)n * width ||
        body_bytes > cap - GCOMP_HEADER_BYTES)
        st->error = GCOMP_ERR_CORRUPT;
}

/* acc += v with the CPU's NaN bits (a NaN payload value, or a NaN already in acc) */
static __device__ __forceinline__ float add_acc(float acc, float v) { return gcomp_x86_nan_f32(acc + v, acc, v); }

template <int KIND, bool VEC>
static __global__ void add_kernel(const uint8_t *__restrict__ body, float *__restrict__ acc, size_t n,
                                  const gcomp_cuda_status *st)
{
    size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    size_t done = 0;
    if (st->error) return; /* a corrupt payload leaves acc untouched */
    if (VEC) {
        size_t groups = n / 4;
        for (size_t j = tid; j < groups; j += stride) {
            float4 a = reinterpret_cast<float4 *>(acc)[j];
            uint32_t c0, c1, c2, c3;
            if (KIND == KIND_F32) {
                uint4 v = reinterpret_cast<const uint4 *>(body)[j];
                c0 = v.x, c1 = v.y, c2 = v.z, c3 = v.w;
            } else {
                uint2 v = reinterpret_cast<const uint2 *>(body)[j];
                c0 = v.x & 0xffffu, c1 = v.x >> 16, c2 = v.y & 0xffffu, c3 = v.y >> 16;
            }
            a.x = add_acc(a.x, cast_value<KIND>(c0));
            a.y = add_acc(a.y, cast_value<KIND>(c1));
            a.z = add_acc(a.z, cast_value<KIND>(c2));
            a.w = add_acc(a.w, cast_value<KIND>(c3));
            reinterpret_cast<float4 *>(acc)[j] = a;
        }
        done = groups * 4;
    }
    for (size_t i = done + tid; i < n; i += stride)
        acc[i] = add_acc(acc[i], cast_value<KIND>(load_code<KIND>(body, i)));
}

template <int KIND>
static gcomp_result cast_decode_add(const uint8_t *payload, size_t cap, float *acc, size_t n, gcomp_cuda_status *st,
                                    cudaStream_t s)
{
    const uint8_t *body = payload + GCOMP_HEADER_BYTES;
    check_kernel<<<1, 1, 0, s>>>(payload, cap, n, (unsigned)width_of(KIND), st);
    {
        gcomp_result rc = launch_failed("cast check kernel");
        if (rc != GCOMP_SUCCESS) return rc;
    }
    if (!n) return GCOMP_SUCCESS;
    if (aligned(body, 4 * width_of(KIND)) && aligned(acc, 16))
        add_kernel<KIND, true><<<grid_for(n / 4 + 1, 256), 256, 0, s>>>(body, acc, n, st);
    else
        add_kernel<KIND, false><<<grid_for(n, 256), 256, 0, s>>>(body, acc, n, st);
    return launch_failed("cast decode-add kernel");
}

/* ---- ops tables -------------------------------------------------------------------------- */

static size_t no_scratch(const void *params, size_t count)
{
    (void)params;
    (void)count;
    return 0;
}

#define CAST_CUDA_OPS(lower, KIND)                                                                               \
    static gcomp_result lower##_cuda_encode(const void *p, const gcomp_encode_ctx *ctx, const float *g,          \
                                            const gcomp_cuda_residual *res, size_t n, uint8_t *body, size_t cap, \
                                            void *scratch, gcomp_cuda_status *st, struct CUstream_st *s)         \
    {                                                                                                            \
        (void)p;                                                                                                 \
        (void)scratch;                                                                                           \
        return cast_encode<KIND>(ctx, g, res, n, body, cap, st, s);                                              \
    }                                                                                                            \
    static gcomp_result lower##_cuda_decode_add(const void *p, const uint8_t *payload, size_t cap, float *acc,   \
                                                size_t n, gcomp_cuda_status *st, struct CUstream_st *s)          \
    {                                                                                                            \
        (void)p;                                                                                                 \
        return cast_decode_add<KIND>(payload, cap, acc, n, st, s);                                               \
    }                                                                                                            \
    static gcomp_codec_cuda_ops lower##_make_ops()                                                               \
    {                                                                                                            \
        gcomp_codec_cuda_ops o = {};                                                                             \
        o.scratch_bytes = no_scratch;                                                                            \
        o.encode = lower##_cuda_encode;                                                                          \
        o.decode_add = lower##_cuda_decode_add;                                                                  \
        return o;                                                                                                \
    }                                                                                                            \
    extern "C" const gcomp_codec_cuda_ops gcomp__cuda_ops_##lower = lower##_make_ops();

CAST_CUDA_OPS(none, KIND_F32)
CAST_CUDA_OPS(fp16, KIND_F16)
CAST_CUDA_OPS(bf16, KIND_BF16)
