/*
 * fuzz_roundtrip — encode then decode fuzzer-chosen tensors with every spec, with error
 * feedback over two calls on one key, and check what each codec promises.
 *
 * Input: selector byte (fuzz_specs[] index in bits 0-4), flags byte, then the data.
 *   flags bit 0:    dictionary mode: each data byte picks a value from fuzz_special_bits[]
 *                   (NaN, Inf, ties, overflow and subnormal boundaries); else the data are
 *                   raw little-endian elements of the source dtype
 *   flags bits 1-2: source dtype, modulo 3: f32, f16, bf16
 * At most RT_MAX_N elements.
 *
 * Per call, with x = g + r (g the source widened to f32, r the key's residual before it):
 *  - encode succeeds and writes at most gcomp_codec_max_encoded_bytes; decode succeeds;
 *  - none: decoded == x; fp16/bf16: decoded == x through gcomp_f32_to_f16/bf16 and back;
 *    topk: exactly the k = gcomp_topk_k elements of largest |x| (ties to the lower index)
 *    hold x (fp16 values: x through fp16), every other element is 0;
 *    terngrad: each element of bucket j is 0 or sign(x) * s_j, s_j recomputed here from the
 *    rule in codecs/terngrad.h (max |x|, clipped at clip * rms); 0 where x is 0;
 *  - a non-finite x gives a non-finite decoded value somewhere;
 *  - if x or the decoded result holds a non-finite value, the call counts in
 *    stats.nonfinite_calls and the residual is left bit for bit as it was; otherwise the
 *    residual becomes x - decoded;
 * and once per input, on a second key: a decode with another count or a truncated payload is
 * GCOMP_ERR_CORRUPT, and an encode into one byte less than the first call needed fails with
 * GCOMP_ERR_BUFFER_TOO_SMALL and leaves that key's new residual all zero (the library
 * promises that a failed encode does not commit the residual: src/internal.h).
 */
#include "fuzz_common.h"

#include "codecs/terngrad.h"
#include "codecs/topk.h"

#define RT_MAX_N ((size_t)1 << 14)
#define KEY 42u
#define KEY2 43u

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

FUZZ_NO_COVERAGE static void check_cast(fuzz_kind kind, const float *x, const float *dec, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float want = x[i];
        if (kind == FK_FP16) want = gcomp_f16_to_f32(gcomp_f32_to_f16(x[i]));
        if (kind == FK_BF16) want = gcomp_bf16_to_f32(gcomp_f32_to_bf16(x[i]));
        FUZZ_CHECK(fuzz_same(dec[i], want));
    }
}

FUZZ_NO_COVERAGE static int cmp_desc(const void *a, const void *b)
{
    uint32_t u = *(const uint32_t *)a, v = *(const uint32_t *)b;
    return u < v ? 1 : u > v ? -1 : 0;
}

FUZZ_NO_COVERAGE static void check_topk(const fuzz_spec *fs, const float *x, const float *dec, size_t n)
{
    gcomp_topk_params p = { fs->ratio, fs->k, fs->fp16 };
    uint64_t k = gcomp_topk_k(&p, n), above = 0, ties;
    uint32_t *keys, thr;
    if (n == 0) return;
    keys = malloc(n * sizeof *keys);
    FUZZ_CHECK(keys != NULL);
    for (size_t i = 0; i < n; i++) keys[i] = gcomp_topk_key(fuzz_f32_bits(x[i]));
    qsort(keys, n, sizeof *keys, cmp_desc);
    thr = keys[k - 1]; /* the k-th largest magnitude */
    free(keys);
    for (size_t i = 0; i < n; i++) above += gcomp_topk_key(fuzz_f32_bits(x[i])) > thr;
    ties = k - above; /* elements at the threshold that are kept: the lowest indices */
    for (size_t i = 0; i < n; i++) {
        uint32_t key = gcomp_topk_key(fuzz_f32_bits(x[i]));
        int kept = key > thr || (key == thr && ties > 0);
        float v = fs->fp16 ? gcomp_f16_to_f32(gcomp_f32_to_f16(x[i])) : x[i];
        if (key == thr && ties > 0) ties--;
        FUZZ_CHECK(fuzz_same(dec[i], kept ? v : 0.0f));
    }
}

FUZZ_NO_COVERAGE static void check_terngrad(const fuzz_spec *fs, const float *x, const float *dec, size_t n)
{
    size_t B = fs->bucket > 0 ? (size_t)fs->bucket : n;
    for (size_t a = 0; a < n; a += B) {
        size_t m = n - a < B ? n - a : B;
        uint32_t mbits = 0;
        float s;
        for (size_t i = a; i < a + m; i++) {
            uint32_t key = fuzz_f32_bits(x[i]) & 0x7fffffffu;
            mbits = key > mbits ? key : mbits;
        }
        s = fuzz_bits_f32(mbits);
        if (fs->clip > 0 && fuzz_isfinite(s)) {
            double c = fs->clip * gcomp__tg_rms(x + a, NULL, m);
            if (c < (double)s) s = (float)c;
        }
        for (size_t i = a; i < a + m; i++) {
            if (!fuzz_isfinite(s)) {
                FUZZ_CHECK(!fuzz_isfinite(dec[i])); /* t * s with s = Inf/NaN, t = 0 included */
            } else {
                FUZZ_CHECK(dec[i] == 0.0f || dec[i] == (x[i] < 0 ? -s : s));
                if (x[i] == 0.0f) FUZZ_CHECK(dec[i] == 0.0f);
            }
        }
    }
}

FUZZ_NO_COVERAGE static int any_nonfinite(const float *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!fuzz_isfinite(v[i])) return 1;
    return 0;
}

/* After a call: the residual r_next is r (left alone) or x - dec (committed). */
FUZZ_NO_COVERAGE static void check_residual(int kept, const float *r, const float *r_next, const float *x,
                                            const float *dec, size_t n)
{
    if (kept) {
        FUZZ_CHECK(memcmp(r_next, r, n * sizeof(float)) == 0);
    } else {
        for (size_t i = 0; i < n; i++) FUZZ_CHECK(fuzz_same(r_next[i], x[i] - dec[i]));
    }
}

FUZZ_NO_COVERAGE static void add(const float *a, const float *b, float *out, size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

FUZZ_NO_COVERAGE static int all_zero_bits(const float *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (fuzz_f32_bits(v[i]) != 0) return 0;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const fuzz_spec *fs;
    gcomp_codec *c;
    gcomp_dtype dtype;
    size_t n, esize, cap, written = 0, first_written = 0;
    int dict;
    uint8_t *src, *buf;
    float *g, *x, *dec, *r, *r_next;

    if (size < 2) return 0;
    fs = &fuzz_specs[fuzz_spec_index(data[0])];
    c = fuzz_codec(fuzz_spec_index(data[0]));
    dict = data[1] & 1u;
    dtype = (gcomp_dtype)(((data[1] >> 1) & 3u) % 3u);
    esize = gcomp_dtype_size(dtype);
    data += 2;
    size -= 2;
    n = dict ? size : size / esize;
    if (n > RT_MAX_N) n = RT_MAX_N;

    src = malloc(n * esize + 1);
    g = malloc((n + 1) * sizeof(float));
    x = malloc((n + 1) * sizeof(float));
    dec = malloc((n + 1) * sizeof(float));
    r = calloc(n + 1, sizeof(float));
    r_next = malloc((n + 1) * sizeof(float));
    FUZZ_CHECK(src && g && x && dec && r && r_next);
    for (size_t i = 0; i < n; i++) {
        if (dict) {
            float f = fuzz_bits_f32(fuzz_special_bits[data[i] % FUZZ_N_SPECIAL]);
            uint16_t h = dtype == GCOMP_F16 ? gcomp_f32_to_f16(f) : gcomp_f32_to_bf16(f);
            if (dtype == GCOMP_F32)
                memcpy(src + 4 * i, &f, 4);
            else
                memcpy(src + 2 * i, &h, 2);
        } else {
            memcpy(src + esize * i, data + esize * i, esize);
        }
        if (dtype == GCOMP_F32) {
            memcpy(&g[i], src + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            g[i] = dtype == GCOMP_F16 ? gcomp_f16_to_f32(h) : gcomp_bf16_to_f32(h);
        }
    }

    /* the codec object outlives the input: start both keys afresh (residual 0, step 0) */
    FUZZ_CHECK(gcomp_codec_residual_reset(c, KEY) == GCOMP_SUCCESS);
    FUZZ_CHECK(gcomp_codec_residual_reset(c, KEY2) == GCOMP_SUCCESS);
    cap = gcomp_codec_max_encoded_bytes(c, n);
    buf = malloc(cap);
    FUZZ_CHECK(buf != NULL);

    for (int call = 0; call < 2; call++) {
        gcomp_stats before, after;
        int nf_x, nf_dec;
        float *t;
        add(g, r, x, n);
        FUZZ_CHECK(gcomp_codec_stats_get(c, &before) == GCOMP_SUCCESS);
        FUZZ_CHECK(gcomp_codec_encode(c, KEY, src, n, dtype, buf, cap, &written) == GCOMP_SUCCESS);
        FUZZ_CHECK(written >= GCOMP_HEADER_BYTES && written <= cap);
        FUZZ_CHECK(gcomp_codec_stats_get(c, &after) == GCOMP_SUCCESS);
        FUZZ_CHECK(gcomp_codec_decode(c, buf, written, dec, n, GCOMP_F32) == GCOMP_SUCCESS);

        if (fs->kind == FK_TOPK)
            check_topk(fs, x, dec, n);
        else if (fs->kind == FK_TERNGRAD)
            check_terngrad(fs, x, dec, n);
        else
            check_cast(fs->kind, x, dec, n);

        nf_x = any_nonfinite(x, n);
        nf_dec = any_nonfinite(dec, n);
        if (nf_x) FUZZ_CHECK(nf_dec);
        FUZZ_CHECK(after.nonfinite_calls - before.nonfinite_calls == (uint64_t)(nf_x || nf_dec));
        FUZZ_CHECK(gcomp_codec_residual_get(c, KEY, r_next, n) == GCOMP_SUCCESS);
        check_residual(nf_x || nf_dec, r, r_next, x, dec, n);
        t = r;
        r = r_next;
        r_next = t;
        if (call == 0) first_written = written;
    }

    /* wrong count and truncated payloads are rejected (buf holds the second call's payload) */
    FUZZ_CHECK(gcomp_codec_decode(c, buf, written, dec, n + 1, GCOMP_F32) == GCOMP_ERR_CORRUPT);
    FUZZ_CHECK(gcomp_codec_decode(c, buf, written - 1, dec, n, GCOMP_F32) == GCOMP_ERR_CORRUPT);

    /* A fresh key sees the same x and step as the first call, so needs first_written bytes. */
    FUZZ_CHECK(gcomp_codec_encode(c, KEY2, src, n, dtype, buf, first_written - 1, &written) ==
               GCOMP_ERR_BUFFER_TOO_SMALL);
    /* the failed call leaves the key without a residual, or with an untouched (zero) one */
    {
        gcomp_result rr = gcomp_codec_residual_get(c, KEY2, r, n);
        FUZZ_CHECK(rr == GCOMP_SUCCESS || rr == GCOMP_ERR_INVALID_ARG);
        if (rr == GCOMP_SUCCESS) FUZZ_CHECK(all_zero_bits(r, n));
    }

    free(buf);
    free(r_next);
    free(r);
    free(dec);
    free(x);
    free(g);
    free(src);
    return 0;
}
