/*
 * randk_codec.h — a codec written outside the library, shared by the tests that register it
 * (test_user_codec for the codec API, test_mpi_allreduce for the engine's sparse gather of a
 * user GCOMP_CAP_SPARSE codec).
 *
 * randk keeps k = ceil(ratio * n) elements chosen at random: element i's priority is a hash
 * of (ctx->seed, ctx->step, ctx->rank, i) and the k elements of lowest priority are kept
 * (ties by index). The body carries the 64-bit key of that hash, so a decoder that never saw
 * the encode context recomputes the same choice:
 *     u64 key, then the k kept values as f32 in increasing index order.
 */
#ifndef GCOMP_TESTS_RANDK_CODEC_H
#define GCOMP_TESTS_RANDK_CODEC_H

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "gcomp_codec.h"

#define RANDK_WIRE_ID 200

/* ---- the randk codec ------------------------------------------------------------------------ */

typedef struct randk_params {
    double ratio;
} randk_params;

static const gcomp_param_def randk_param_defs[] = {
    { "ratio", GCOMP_PARAM_DOUBLE, offsetof(randk_params, ratio), 1e-6, 1.0, 0.5, NULL,
      "fraction of the elements kept" },
};

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static size_t randk_k(const randk_params *p, size_t n)
{
    double want = p->ratio * (double)n;
    size_t k = (size_t)want;
    if ((double)k < want) k++;
    if (n && k < 1) k = 1;
    return k > n ? n : k;
}

typedef struct prio {
    uint64_t h;
    size_t i;
} prio;

static int prio_cmp(const void *a, const void *b)
{
    const prio *x = a, *y = b;
    if (x->h != y->h) return x->h < y->h ? -1 : 1;
    return x->i < y->i ? -1 : (x->i > y->i);
}

static int index_cmp(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : (x > y);
}

/* The k kept indices, increasing, into idx (k entries). Returns 0 on out of memory. */
static int randk_select(uint64_t key, size_t n, size_t k, size_t *idx)
{
    prio *p = malloc((n ? n : 1) * sizeof *p);
    if (!p) return 0;
    for (size_t i = 0; i < n; i++) p[i] = (prio){ mix(key ^ mix(i)), i };
    qsort(p, n, sizeof *p, prio_cmp);
    for (size_t j = 0; j < k; j++) idx[j] = p[j].i;
    qsort(idx, k, sizeof *idx, index_cmp);
    free(p);
    return 1;
}

static size_t randk_max_body(const void *params, size_t n) { return 8 + 4 * randk_k(params, n); }

static gcomp_result randk_encode(const void *params, gcomp_encode_ctx *ctx, const float *g, const float *r_in,
                                 float *r_out, size_t n, uint8_t *body, size_t cap, size_t *written, uint32_t *flags)
{
    size_t k = randk_k(params, n), *idx;
    uint64_t key = mix(mix(mix(ctx->seed) ^ ctx->step) ^ ctx->rank);
    if (cap < 8 + 4 * k) return gcomp_codec_fail(GCOMP_ERR_BUFFER_TOO_SMALL, "randk: need %zu bytes", 8 + 4 * k);
    idx = malloc((k ? k : 1) * sizeof *idx);
    if (!idx || !randk_select(key, n, k, idx)) {
        free(idx);
        return gcomp_codec_fail(GCOMP_ERR_NOMEM, "randk: out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        float x = r_in ? g[i] + r_in[i] : g[i];
        if (!isfinite(x)) ctx->nonfinite = 1;
        if (r_out) r_out[i] = x; /* kept ones are overwritten below */
    }
    gcomp_store_u64(body, key);
    for (size_t j = 0; j < k; j++) {
        size_t i = idx[j];
        float x = r_in ? g[i] + r_in[i] : g[i];
        memcpy(body + 8 + 4 * j, &x, 4);
        if (r_out) r_out[i] = 0.0f;
    }
    if (ctx->nonfinite && k) { /* the body must decode to something non-finite */
        float nan = NAN;
        memcpy(body + 8, &nan, 4);
    }
    free(idx);
    *written = 8 + 4 * k;
    *flags = 0;
    return GCOMP_SUCCESS;
}

static gcomp_result randk_decode_add(const void *params, uint32_t flags, const uint8_t *body, size_t bytes, float *acc,
                                     size_t n)
{
    size_t k = randk_k(params, n), *idx;
    if (flags) return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "randk: unknown flags 0x%x", flags);
    if (bytes != 8 + 4 * k) return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "randk: body of %zu bytes for k=%zu", bytes, k);
    idx = malloc((k ? k : 1) * sizeof *idx);
    if (!idx || !randk_select(gcomp_load_u64(body), n, k, idx)) {
        free(idx);
        return gcomp_codec_fail(GCOMP_ERR_NOMEM, "randk: out of memory");
    }
    for (size_t j = 0; j < k; j++) {
        float v;
        memcpy(&v, body + 8 + 4 * j, 4);
        acc[idx[j]] += v;
    }
    free(idx);
    return GCOMP_SUCCESS;
}

static const gcomp_codec_vtable randk_vt = {
    .abi_version = GCOMP_CODEC_ABI_VERSION,
    .name = "randk",
    .wire_id = RANDK_WIRE_ID,
    .caps = GCOMP_CAP_SPARSE,
    .params = randk_param_defs,
    .n_params = 1,
    .params_size = sizeof(randk_params),
    .max_body_bytes = randk_max_body,
    .encode = randk_encode,
    .decode_add = randk_decode_add,
};

#endif
