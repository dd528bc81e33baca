/*
 * cast.c — CPU reference of the cast codecs: none (fp32), fp16 and bf16.
 * See cast.h for the wire format and rounding rules.
 */
#include <string.h>

#include "codecs/cast.h"

/* Test switch: nonzero makes the fp16 loops use only the reference conversions (test_cast). */
int gcomp__cast_reference_only = 0;

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

/* ---- fp16 on x86's F16C conversions --------------------------------------------------------
 * VCVTPS2PH (with its rounding given in the instruction: to nearest, ties to even, whatever
 * MXCSR says) and VCVTPH2PS compute exactly the conversions above -- the reference's NaN rule
 * was chosen to be the hardware's -- 8 elements per instruction instead of a dozen integer
 * operations each. Where the CPU has them, the fp16 loops run their multiples of 8 here and
 * leave the rest to the reference loops. test_cast's test_f16c_matches_reference compares both
 * on every float (sampled; every one with GCOMP_TEST_EXHAUSTIVE=1) in every MXCSR rounding
 * mode, with flush-to-zero and denormals-are-zero off and on; test_f16c_loops with random
 * residuals and sums, each residual case, odd lengths and unaligned bodies. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#include <stdatomic.h>

#define F16C_TARGET __attribute__((target("avx2,f16c")))

static int have_f16c(void)
{
    static _Atomic int known = -1; /* every thread computes the same answer */
    int k = atomic_load_explicit(&known, memory_order_relaxed);
    if (k < 0) {
        unsigned a, b, c = 0, d;
        __builtin_cpu_init();
        /* avx2 also says the OS saves the ymm registers; F16C from CPUID (clang's
         * __builtin_cpu_supports does not know "f16c") */
        k = __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
        atomic_store_explicit(&known, k, memory_order_relaxed);
    }
    return k;
}

/* lanes whose bits have an all-ones exponent (Inf, NaN) */
static inline __attribute__((always_inline)) F16C_TARGET __m256i nonfinite_lanes(__m256 v)
{
    const __m256i exp = _mm256_set1_epi32(0x7f800000);
    return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(v), exp), exp);
}

/* cast_loop(CAST_F16, ...) on the first n & ~7 elements; returns how many it did. */
static inline __attribute__((always_inline)) F16C_TARGET size_t f16c_loop(int has_r_in, int has_r_out, const float *g,
                                                                          const float *r_in, float *r_out, size_t n,
                                                                          uint8_t *body, uint32_t *nonfinite,
                                                                          uint64_t *overflow)
{
    size_t m = n & ~(size_t)7;
    __m256i bad = _mm256_setzero_si256();
    uint64_t over = 0;
    for (size_t i = 0; i < m; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        if (has_r_in) x = _mm256_add_ps(x, _mm256_loadu_ps(r_in + i));
        __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256 y = _mm256_cvtph_ps(h);
        __m256i xbad = nonfinite_lanes(x);
        _mm_storeu_si128((__m128i *)(void *)(body + 2 * i), h);
        bad = _mm256_or_si256(bad, xbad);
        over += (uint64_t)__builtin_popcount(
            (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_andnot_si256(xbad, nonfinite_lanes(y)))));
        if (has_r_out) _mm256_storeu_ps(r_out + i, _mm256_sub_ps(x, y));
    }
    *nonfinite = !_mm256_testz_si256(bad, bad) || over;
    *overflow += over;
    return m;
}

/* VCVTPS2PH raises the overflow and underflow exceptions that the reference's integer rounding
 * does not (its "no exceptions" bit does not apply to them): with the caller's traps enabled a
 * gradient that overflows f16 -- counted, not an error -- would kill the process. So the loop
 * runs with every exception masked, and MXCSR is put back as it was, flags included. */
F16C_TARGET static size_t f16c_encode(const float *g, const float *r_in, float *r_out, size_t n, uint8_t *body,
                                      uint32_t *nonfinite, uint64_t *overflow)
{
    const unsigned csr = _mm_getcsr();
    size_t done;
    _mm_setcsr(csr | 0x1f80u); /* mask all six exceptions */
    if (r_in && r_out)
        done = f16c_loop(1, 1, g, r_in, r_out, n, body, nonfinite, overflow);
    else if (r_in)
        done = f16c_loop(1, 0, g, r_in, NULL, n, body, nonfinite, overflow);
    else if (r_out)
        done = f16c_loop(0, 1, g, NULL, r_out, n, body, nonfinite, overflow);
    else
        done = f16c_loop(0, 0, g, NULL, NULL, n, body, nonfinite, overflow);
    _mm_setcsr(csr);
    return done;
}

/* acc[i] += the half at body[2i] (add), or acc[i] = 0 + it (the bits of adding to zeros:
 * -0 becomes +0), for the first n & ~7 elements; returns how many. */
static inline __attribute__((always_inline)) F16C_TARGET size_t f16c_decode_loop(const uint8_t *body, float *acc,
                                                                                 size_t n, int add)
{
    size_t m = n & ~(size_t)7;
    for (size_t i = 0; i < m; i += 8) {
        __m256 y = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(body + 2 * i)));
        __m256 base = add ? _mm256_loadu_ps(acc + i) : _mm256_setzero_ps();
        _mm256_storeu_ps(acc + i, _mm256_add_ps(base, y));
    }
    return m;
}

F16C_TARGET static size_t f16c_decode(const uint8_t *body, float *acc, size_t n, int add)
{
    return add ? f16c_decode_loop(body, acc, n, 1) : f16c_decode_loop(body, acc, n, 0);
}

/* dst[i] = (0 + the half at a[2i]) + the half at b[2i], for the first n & ~7; returns how many. */
F16C_TARGET static size_t f16c_sum2(const uint8_t *a, const uint8_t *b, float *dst, size_t n)
{
    size_t m = n & ~(size_t)7;
    for (size_t i = 0; i < m; i += 8) {
        __m256 ya = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(a + 2 * i)));
        __m256 yb = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(b + 2 * i)));
        _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_add_ps(_mm256_setzero_ps(), ya), yb));
    }
    return m;
}
#else
static int have_f16c(void) { return 0; }
static size_t f16c_encode(const float *g, const float *r_in, float *r_out, size_t n, uint8_t *body,
                          uint32_t *nonfinite, uint64_t *overflow)
{
    (void)g, (void)r_in, (void)r_out, (void)n, (void)body, (void)nonfinite, (void)overflow;
    return 0;
}
static size_t f16c_decode(const uint8_t *body, float *acc, size_t n, int add)
{
    (void)body, (void)acc, (void)n, (void)add;
    return 0;
}
static size_t f16c_sum2(const uint8_t *a, const uint8_t *b, float *dst, size_t n)
{
    (void)a, (void)b, (void)dst, (void)n;
    return 0;
}
#endif

int gcomp__cast_f16c_active(void) { return have_f16c() && !gcomp__cast_reference_only; }

/* fp16 encode: F16C for the multiples of 8 where the CPU has it, the reference loop for the
 * rest (or all). */
static void f16_encode(const float *g, const float *r_in, float *r_out, size_t n, uint8_t *body, uint32_t *nonfinite,
                       uint64_t *overflow)
{
    uint32_t hw_bad = 0;
    size_t done = gcomp__cast_f16c_active() ? f16c_encode(g, r_in, r_out, n, body, &hw_bad, overflow) : 0;
    cast_dispatch(CAST_F16, g + done, r_in ? r_in + done : NULL, r_out ? r_out + done : NULL, n - done,
                  body + 2 * done, nonfinite, overflow);
    *nonfinite |= hw_bad;
}

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
        f16_encode(g, r_in, r_out, n, body, &nonfinite, &ctx->overflow);
    else
        cast_dispatch(CAST_BF16, g, r_in, r_out, n, body, &nonfinite, &ctx->overflow);
    ctx->nonfinite |= nonfinite;
    *written = need;
    *flags = 0;
    return GCOMP_SUCCESS;
}

static inline __attribute__((always_inline)) float decoded_at(cast_kind kind, const uint8_t *body, size_t i)
{
    return kind == CAST_F32   ? load_f32(body + 4 * i)
           : kind == CAST_F16 ? gcomp_f16_to_f32_inline(load_u16(body + 2 * i))
                              : gcomp_bf16_to_f32_inline(load_u16(body + 2 * i));
}

/* acc[i] += decoded element i (add), or acc[i] = 0 + it: the bits of zeroing acc first (-0
 * becomes +0, as there), in one pass instead of two. kind and add are constants at each call
 * site (decode_dispatch), so every instantiation is a straight loop the compiler vectorises. */
static inline __attribute__((always_inline)) void decode_loop(cast_kind kind, const uint8_t *body, float *acc,
                                                              size_t n, int add)
{
    size_t done = kind == CAST_F16 && gcomp__cast_f16c_active() ? f16c_decode(body, acc, n, add) : 0;
    for (size_t i = done; i < n; i++) acc[i] = (add ? acc[i] : 0.0f) + decoded_at(kind, body, i);
}

static inline __attribute__((always_inline)) void decode_dispatch(cast_kind kind, const uint8_t *body, float *acc,
                                                                  size_t n, int add)
{
    if (kind == CAST_F32)
        add ? decode_loop(CAST_F32, body, acc, n, 1) : decode_loop(CAST_F32, body, acc, n, 0);
    else if (kind == CAST_F16)
        add ? decode_loop(CAST_F16, body, acc, n, 1) : decode_loop(CAST_F16, body, acc, n, 0);
    else
        add ? decode_loop(CAST_BF16, body, acc, n, 1) : decode_loop(CAST_BF16, body, acc, n, 0);
}

static gcomp_result check_body(cast_kind kind, const char *name, uint32_t flags, size_t bytes, size_t n)
{
    if (flags != 0) return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "%s: unknown flags 0x%x", name, flags);
    if (bytes != n * width_of(kind))
        return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "%s: body of %zu bytes for %zu elements (expected %zu)", name, bytes,
                                n, n * width_of(kind));
    return GCOMP_SUCCESS;
}

GCOMP_SIMD_CLONES static gcomp_result cast_decode(cast_kind kind, const char *name, uint32_t flags,
                                                  const uint8_t *body, size_t bytes, float *acc, size_t n, int add)
{
    gcomp_result rc = check_body(kind, name, flags, bytes, n);
    if (rc != GCOMP_SUCCESS) return rc;
    decode_dispatch(kind, body, acc, n, add);
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
        return cast_decode(KIND, #lower, flags, body, bytes, acc, n, 1);                                        \
    }

CAST_GLUE(none, CAST_F32)
CAST_GLUE(fp16, CAST_F16)
CAST_GLUE(bf16, CAST_BF16)

#define CAST_VTABLE(lower, ID, CAPS)                  \
    const gcomp_codec_vtable gcomp__codec_##lower = { \
        .abi_version = GCOMP_CODEC_ABI_VERSION,       \
        .name = #lower,                               \
        .wire_id = ID,                                \
        .caps = CAPS,                                 \
        .params_size = sizeof(gcomp_cast_params),     \
        .max_body_bytes = lower##_max_body,           \
        .encode = lower##_encode,                     \
        .decode_add = lower##_decode_add,             \
        .cuda = GCOMP_CUDA_OPS(lower),                \
    };

/* fp32 stored as fp32 drops nothing: "none" keeps no residual (GCOMP_CAP_EXACT) */
CAST_VTABLE(none, GCOMP_WIRE_ID_NONE, GCOMP_CAP_SUMMABLE | GCOMP_CAP_EXACT)
CAST_VTABLE(fp16, GCOMP_WIRE_ID_FP16, GCOMP_CAP_SUMMABLE)
CAST_VTABLE(bf16, GCOMP_WIRE_ID_BF16, GCOMP_CAP_SUMMABLE)

/* The engine's overwriting decode (cast.h): dst = 0 + decoded, one pass. */
gcomp_result gcomp__cast_decode_set(const gcomp_codec_vtable *vt, uint32_t flags, const uint8_t *body, size_t bytes,
                                    float *dst, size_t n)
{
    if (vt == &gcomp__codec_none) return cast_decode(CAST_F32, "none", flags, body, bytes, dst, n, 0);
    if (vt == &gcomp__codec_fp16) return cast_decode(CAST_F16, "fp16", flags, body, bytes, dst, n, 0);
    if (vt == &gcomp__codec_bf16) return cast_decode(CAST_BF16, "bf16", flags, body, bytes, dst, n, 0);
    return GCOMP_ERR_UNSUPPORTED;
}

/* dst[i] = (0 + decoded a[i]) + decoded b[i] from element `from` on; kind is a constant at
 * each call site (as in decode_dispatch), so each is a straight, vectorised loop. */
static inline __attribute__((always_inline)) void sum2_loop(cast_kind kind, const uint8_t *a, const uint8_t *b,
                                                            float *dst, size_t from, size_t n)
{
    for (size_t i = from; i < n; i++) dst[i] = (0.0f + decoded_at(kind, a, i)) + decoded_at(kind, b, i);
}

/* dst[i] = (0 + decoded a[i]) + decoded b[i]: zeroing dst, then two decode_adds, in one pass. */
GCOMP_SIMD_CLONES static gcomp_result cast_sum2(cast_kind kind, const char *name, const gcomp__cast_body *a,
                                                const gcomp__cast_body *b, float *dst, size_t n)
{
    size_t done;
    gcomp_result rc = check_body(kind, name, a->flags, a->bytes, n);
    if (rc == GCOMP_SUCCESS) rc = check_body(kind, name, b->flags, b->bytes, n);
    if (rc != GCOMP_SUCCESS) return rc;
    done = kind == CAST_F16 && gcomp__cast_f16c_active() ? f16c_sum2(a->body, b->body, dst, n) : 0;
    if (kind == CAST_F32)
        sum2_loop(CAST_F32, a->body, b->body, dst, done, n);
    else if (kind == CAST_F16)
        sum2_loop(CAST_F16, a->body, b->body, dst, done, n);
    else
        sum2_loop(CAST_BF16, a->body, b->body, dst, done, n);
    return GCOMP_SUCCESS;
}

/* The engine's pair sum (cast.h). */
gcomp_result gcomp__cast_decode_sum2(const gcomp_codec_vtable *vt, const gcomp__cast_body *a, const gcomp__cast_body *b,
                                     float *dst, size_t n)
{
    if (vt == &gcomp__codec_none) return cast_sum2(CAST_F32, "none", a, b, dst, n);
    if (vt == &gcomp__codec_fp16) return cast_sum2(CAST_F16, "fp16", a, b, dst, n);
    if (vt == &gcomp__codec_bf16) return cast_sum2(CAST_BF16, "bf16", a, b, dst, n);
    return GCOMP_ERR_UNSUPPORTED;
}
