/*
 * cast.c — CPU reference of the cast codecs: none (fp32), fp16 and bf16.
 * See cast.h for the wire format and rounding rules.
 */
#include <string.h>

#include "codecs/cast.h"

uint16_t gcomp_f32_to_f16(float f) { return gcomp_f16_from_bits(gcomp_f32_bits(f)); }
float gcomp_f16_to_f32(uint16_t h) { return gcomp_f16_to_f32_inline(h); }
uint16_t gcomp_f32_to_bf16(float f) { return gcomp_bf16_from_bits(gcomp_f32_bits(f)); }
float gcomp_bf16_to_f32(uint16_t h) { return gcomp_bf16_to_f32_inline(h); }

typedef enum {
    CAST_F32,
    CAST_F16,
    CAST_BF16
} cast_kind;

static size_t width_of(cast_kind k) { return k == CAST_F32 ? 4 : 2; }

/* Bodies may sit at any address inside a payload: load and store through memcpy, which
 * compiles to plain moves and keeps the sanitizers quiet about alignment. */
static inline uint16_t load_u16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
static inline void store_u16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static inline float load_f32(const uint8_t *p)
{
    float v;
    memcpy(&v, p, 4);
    return v;
}
static inline void store_f32(uint8_t *p, float v) { memcpy(p, &v, 4); }

static inline int is_nonfinite(float x) { return (gcomp_f32_bits(x) & 0x7f800000u) == 0x7f800000u; }

/* One pass: x = g (+ r_in), store the rounded value, r_out = x - rounded. kind, has_r_in
 * and has_r_out are compile-time constants at each call site, so every instantiation is a
 * straight loop without control flow, which the compiler vectorises. */
static inline __attribute__((always_inline)) void cast_loop(cast_kind kind, int has_r_in, int has_r_out, const float *g,
                                                            const float *r_in, float *r_out, size_t n, uint8_t *body,
                                                            uint32_t *nonfinite, uint64_t *overflow)
{
    uint32_t bad = 0;
    uint64_t over = 0;
    for (size_t i = 0; i < n; i++) {
        float x = has_r_in ? g[i] + r_in[i] : g[i];
        float y;
        uint32_t xfin = !is_nonfinite(x);
        if (kind == CAST_F32) {
            store_f32(body + 4 * i, x);
            y = x;
        } else if (kind == CAST_F16) {
            uint16_t h = gcomp_f16_from_bits(gcomp_f32_bits(x));
            store_u16(body + 2 * i, h);
            y = gcomp_f16_to_f32_inline(h);
        } else {
            uint16_t h = gcomp_bf16_from_bits(gcomp_f32_bits(x));
            store_u16(body + 2 * i, h);
            y = gcomp_bf16_to_f32_inline(h);
        }
        bad |= !xfin;
        over += xfin & is_nonfinite(y);
        if (has_r_out) r_out[i] = x - y;
    }
    *nonfinite = bad || over;
    *overflow += over;
}

/* Instantiate cast_loop for the four residual combinations of one kind. */
static inline __attribute__((always_inline)) void cast_dispatch(cast_kind kind, const float *g, const float *r_in,
                                                                float *r_out, size_t n, uint8_t *body,
                                                                uint32_t *nonfinite, uint64_t *overflow)
{
    if (r_in && r_out)
        cast_loop(kind, 1, 1, g, r_in, r_out, n, body, nonfinite, overflow);
    else if (r_in)
        cast_loop(kind, 1, 0, g, r_in, NULL, n, body, nonfinite, overflow);
    else if (r_out)
        cast_loop(kind, 0, 1, g, NULL, r_out, n, body, nonfinite, overflow);
    else
        cast_loop(kind, 0, 0, g, NULL, NULL, n, body, nonfinite, overflow);
}

static size_t cast_max_body(cast_kind kind, size_t count) { return count * width_of(kind); }

GCOMP_SIMD_CLONES static gcomp_result cast_encode(cast_kind kind, gcomp_encode_ctx *ctx, const float *g,
                                                  const float *r_in, float *r_out, size_t n, uint8_t *body, size_t cap,
                                                  size_t *written, uint32_t *flags)
{
    uint32_t nonfinite = 0;
    size_t need = n * width_of(kind);
    if (cap < need)
        return gcomp_codec_fail(GCOMP_ERR_BUFFER_TOO_SMALL, "cast codec needs %zu body bytes, has %zu", need, cap);
    if (kind == CAST_F32)
        cast_dispatch(CAST_F32, g, r_in, r_out, n, body, &nonfinite, &ctx->overflow);
    else if (kind == CAST_F16)
        cast_dispatch(CAST_F16, g, r_in, r_out, n, body, &nonfinite, &ctx->overflow);
    else
        cast_dispatch(CAST_BF16, g, r_in, r_out, n, body, &nonfinite, &ctx->overflow);
    ctx->nonfinite |= nonfinite;
    *written = need;
    *flags = 0;
    return GCOMP_SUCCESS;
}

GCOMP_SIMD_CLONES static gcomp_result cast_decode_add(cast_kind kind, const char *name, uint32_t flags,
                                                      const uint8_t *body, size_t bytes, float *acc, size_t n)
{
    if (flags != 0) return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "%s: unknown flags 0x%x", name, flags);
    if (bytes != n * width_of(kind))
        return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "%s: body of %zu bytes for %zu elements (expected %zu)", name, bytes,
                                n, n * width_of(kind));
    if (kind == CAST_F32)
        for (size_t i = 0; i < n; i++) acc[i] += load_f32(body + 4 * i);
    else if (kind == CAST_F16)
        for (size_t i = 0; i < n; i++) acc[i] += gcomp_f16_to_f32_inline(load_u16(body + 2 * i));
    else
        for (size_t i = 0; i < n; i++) acc[i] += gcomp_bf16_to_f32_inline(load_u16(body + 2 * i));
    return GCOMP_SUCCESS;
}

/* ---- vtable glue: one set per kind ---- */
#define CAST_GLUE(lower, KIND)                                                                                  \
    static size_t lower##_max_body(const void *p, size_t count)                                                 \
    {                                                                                                           \
        (void)p;                                                                                                \
        return cast_max_body(KIND, count);                                                                      \
    }                                                                                                           \
    static gcomp_result lower##_encode(const void *p, gcomp_encode_ctx *ctx, const float *g, const float *r_in, \
                                       float *r_out, size_t n, uint8_t *body, size_t cap, size_t *written,      \
                                       uint32_t *flags)                                                         \
    {                                                                                                           \
        (void)p;                                                                                                \
        return cast_encode(KIND, ctx, g, r_in, r_out, n, body, cap, written, flags);                            \
    }                                                                                                           \
    static gcomp_result lower##_decode_add(const void *p, uint32_t flags, const uint8_t *body, size_t bytes,    \
                                           float *acc, size_t n)                                                \
    {                                                                                                           \
        (void)p;                                                                                                \
        return cast_decode_add(KIND, #lower, flags, body, bytes, acc, n);                                       \
    }

CAST_GLUE(none, CAST_F32)
CAST_GLUE(fp16, CAST_F16)
CAST_GLUE(bf16, CAST_BF16)

#define CAST_VTABLE(lower, ID)                        \
    const gcomp_codec_vtable gcomp__codec_##lower = { \
        .abi_version = GCOMP_CODEC_ABI_VERSION,       \
        .name = #lower,                               \
        .wire_id = ID,                                \
        .caps = GCOMP_CAP_SUMMABLE,                   \
        .params_size = sizeof(gcomp_cast_params),     \
        .max_body_bytes = lower##_max_body,           \
        .encode = lower##_encode,                     \
        .decode_add = lower##_decode_add,             \
        .cuda = GCOMP_CUDA_OPS(lower),                \
    };

CAST_VTABLE(none, GCOMP_WIRE_ID_NONE)
CAST_VTABLE(fp16, GCOMP_WIRE_ID_FP16)
CAST_VTABLE(bf16, GCOMP_WIRE_ID_BF16)
