/* zstd.c — the lossless byte stage. See zstd.h for the format. */
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "codecs/zstd.h"

typedef struct zstd_state {
    ZSTD_CCtx *cctx;
    ZSTD_DCtx *dctx;
} zstd_state;

static const gcomp_param_def zstd_params[] = {
    { "level", GCOMP_PARAM_INT, offsetof(gcomp_zstd_params, level), -7, 19, 1, NULL,
      "zstd compression level; negative levels are faster" },
};

static void *zstd_create(const void *params)
{
    zstd_state *s = calloc(1, sizeof *s);
    (void)params;
    if (!s) return NULL;
    s->cctx = ZSTD_createCCtx();
    s->dctx = ZSTD_createDCtx();
    if (!s->cctx || !s->dctx) {
        ZSTD_freeCCtx(s->cctx);
        ZSTD_freeDCtx(s->dctx);
        free(s);
        return NULL;
    }
    return s;
}

static void zstd_destroy(void *state)
{
    zstd_state *s = state;
    if (!s) return;
    ZSTD_freeCCtx(s->cctx);
    ZSTD_freeDCtx(s->dctx);
    free(s);
}

/* The raw fallback needs n bytes, so the bound is the larger of the two. Past zstd's
 * largest input ZSTD_compressBound says 0 (an error): SIZE_MAX then tells the library that
 * no buffer can hold the result (gcomp_codec_max_encoded_bytes returns 0). */
static size_t zstd_bound(const void *params, size_t n)
{
    size_t b = ZSTD_compressBound(n);
    (void)params;
    if (b == 0 || ZSTD_isError(b)) return SIZE_MAX;
    return b > n ? b : n;
}

static gcomp_result zstd_encode(const void *params, void *state, const uint8_t *in, size_t n, uint8_t *out, size_t cap,
                                size_t *written, uint32_t *flags)
{
    const gcomp_zstd_params *p = params;
    zstd_state *s = state;
    size_t z = ZSTD_compressCCtx(s->cctx, out, cap, in, n, (int)p->level);
    if (!ZSTD_isError(z) && z < n) {
        *written = z;
        *flags = 0;
        return GCOMP_SUCCESS;
    }
    if (cap < n) return gcomp_codec_fail(GCOMP_ERR_BUFFER_TOO_SMALL, "zstd: need %zu bytes, have %zu", n, cap);
    memcpy(out, in, n);
    *written = n;
    *flags = GCOMP_ZSTD_FLAG_RAW;
    return GCOMP_SUCCESS;
}

static gcomp_result zstd_decode(const void *params, void *state, uint32_t flags, const uint8_t *in, size_t n,
                                uint8_t *out, size_t cap, size_t *written)
{
    zstd_state *s = state;
    unsigned long long declared;
    size_t frame, got;
    (void)params;
    if (flags & ~GCOMP_ZSTD_FLAG_RAW) return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "zstd: unknown flags 0x%x", flags);
    if (flags & GCOMP_ZSTD_FLAG_RAW) {
        if (n > cap)
            return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "zstd: raw body of %zu bytes exceeds the %zu expected", n, cap);
        memcpy(out, in, n);
        *written = n;
        return GCOMP_SUCCESS;
    }
    declared = ZSTD_getFrameContentSize(in, n);
    if (declared == ZSTD_CONTENTSIZE_UNKNOWN || declared == ZSTD_CONTENTSIZE_ERROR)
        return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "zstd: not a frame with a declared content size");
    if (declared > cap)
        return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "zstd: frame declares %llu bytes, at most %zu expected", declared,
                                cap);
    frame = ZSTD_findFrameCompressedSize(in, n);
    if (ZSTD_isError(frame) || frame != n)
        return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "zstd: frame does not span the %zu-byte body", n);
    got = ZSTD_decompressDCtx(s->dctx, out, (size_t)declared, in, n);
    if (ZSTD_isError(got)) return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "zstd: %s", ZSTD_getErrorName(got));
    if (got != declared)
        return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "zstd: frame decoded to %zu bytes, declared %llu", got, declared);
    *written = got;
    return GCOMP_SUCCESS;
}

const gcomp_codec_vtable gcomp__codec_zstd = {
    .abi_version = GCOMP_CODEC_ABI_VERSION,
    .name = "zstd",
    .wire_id = GCOMP_WIRE_ID_ZSTD,
    .caps = GCOMP_CAP_BYTE_STAGE,
    .params = zstd_params,
    .n_params = sizeof zstd_params / sizeof zstd_params[0],
    .params_size = sizeof(gcomp_zstd_params),
    .state_create = zstd_create,
    .state_destroy = zstd_destroy,
    .stage_bound = zstd_bound,
    .stage_encode = zstd_encode,
    .stage_decode = zstd_decode,
};
