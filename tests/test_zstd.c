/*
 * test_zstd.c — the zstd byte stage: lossless (a chain decodes exactly like its element codec
 * alone), worth its cost on compressible data, never more than one header dearer on
 * incompressible data (the RAW path), every allowed level, and one codec object reused for
 * many calls of varying size.
 */
#include <stdio.h>
#include <string.h>
#include <zstd.h>

#include "test_util.h"
#include "gcomp_codec.h"
#include "codecs/zstd.h"

static gcomp_codec *make(const char *spec)
{
    gcomp_codec_options o = gcomp_codec_options_default();
    gcomp_codec *c = NULL;
    o.seed = 17;
    o.rank = 1;
    if (gcomp_codec_create(spec, &o, &c) != GCOMP_SUCCESS) fail_msg("create '%s': %s", spec, gcomp_last_error());
    return c;
}

typedef struct enc {
    uint8_t *p;
    size_t n;
    gcomp_header h;
} enc;

static enc encode(gcomp_codec *c, uint64_t key, const float *x, size_t count)
{
    enc e;
    size_t cap = gcomp_codec_max_encoded_bytes(c, count);
    e.p = malloc(cap);
    if (gcomp_codec_encode(c, key, x, count, GCOMP_F32, e.p, cap, &e.n) != GCOMP_SUCCESS)
        fail_msg("encode '%s' x %zu: %s", gcomp_codec_spec(c), count, gcomp_last_error());
    assert_true(e.n <= cap);
    assert_int_equal(gcomp_header_read(e.p, e.n, &e.h), GCOMP_SUCCESS);
    assert_int_equal(e.h.count, count);
    return e;
}

static float *decode(gcomp_codec *c, const enc *e, size_t count)
{
    float *out = calloc(count ? count : 1, sizeof *out);
    gcomp_result rc = gcomp_codec_decode_add(c, e->p, e->n, out, count);
    if (rc != GCOMP_SUCCESS) fail_msg("decode '%s' x %zu: %s", gcomp_codec_spec(c), count, gcomp_last_error());
    return out;
}

/* The inner payload of a zstd payload, by libzstd itself (not through gcomp). */
static uint8_t *unwrap(const enc *e, size_t *n)
{
    const uint8_t *body = e->p + GCOMP_HEADER_BYTES;
    uint8_t *out;
    assert_int_equal(e->h.wire_id, GCOMP_WIRE_ID_ZSTD);
    if (e->h.flags & GCOMP_ZSTD_FLAG_RAW) {
        *n = (size_t)e->h.body_bytes;
        out = malloc(*n);
        memcpy(out, body, *n);
        return out;
    }
    assert_int_equal(e->h.flags, 0);
    *n = (size_t)ZSTD_getFrameContentSize(body, (size_t)e->h.body_bytes);
    assert_true(*n < (size_t)ZSTD_CONTENTSIZE_ERROR);
    out = malloc(*n ? *n : 1);
    assert_int_equal(ZSTD_decompress(out, *n, body, (size_t)e->h.body_bytes), *n);
    return out;
}

/* The chain spec+zstd... against spec alone on the same data with the same options and key:
 * identical inner payload (byte for byte), identical decode, identical residual. */
static void check_lossless(const char *plain_spec, const char *chain_spec, const float *x, size_t count)
{
    gcomp_codec *plain = make(plain_spec), *chain = make(chain_spec);
    enc a = encode(plain, 3, x, count), b = encode(chain, 3, x, count);
    float *da = decode(plain, &a, count), *db = decode(chain, &b, count);
    float *ra = malloc((count ? count : 1) * sizeof *ra), *rb = malloc((count ? count : 1) * sizeof *rb);
    size_t inner_n;
    uint8_t *inner = unwrap(&b, &inner_n);
    assert_int_equal(inner_n, a.n);
    assert_memory_equal(inner, a.p, a.n);
    if (count) assert_memory_equal(da, db, count * sizeof *da);
    assert_int_equal(gcomp_codec_residual_get(plain, 3, ra, count), GCOMP_SUCCESS);
    assert_int_equal(gcomp_codec_residual_get(chain, 3, rb, count), GCOMP_SUCCESS);
    if (count) assert_memory_equal(ra, rb, count * sizeof *ra);
    /* RAW exactly when the frame would not have been smaller */
    if (b.h.flags & GCOMP_ZSTD_FLAG_RAW)
        assert_int_equal(b.n, a.n + GCOMP_HEADER_BYTES);
    else
        assert_true(b.n < a.n + GCOMP_HEADER_BYTES);
    free(inner), free(da), free(db), free(ra), free(rb), free(a.p), free(b.p);
    gcomp_codec_destroy(plain);
    gcomp_codec_destroy(chain);
}

static void test_lossless(void **state)
{
    static const char *const specs[][2] = {
        { "fp16", "fp16+zstd" },
        { "topk:ratio=0.1", "topk:ratio=0.1+zstd" },
        { "topk:ratio=0.01,values=fp16", "topk:ratio=0.01,values=fp16+zstd:level=3" },
        { "terngrad", "terngrad+zstd" },
        { "terngrad:bucket=64,clip=2.5", "terngrad:bucket=64,clip=2.5+zstd" },
        { "bf16", "bf16+zstd:level=-3" },
        { "none", "none+zstd" },
    };
    static const size_t ns[] = { 0, 1, 7, 1000, 100003 };
    (void)state;
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
            float *x = tu_gauss_array(ns[t], 100 + t);
            check_lossless(specs[s][0], specs[s][1], x, ns[t]);
            /* smooth data compresses: the frame path */
            for (size_t i = 0; i < ns[t]; i++) x[i] = (float)(i % 64) * 0.125f;
            check_lossless(specs[s][0], specs[s][1], x, ns[t]);
            free(x);
        }
    }
}

static void test_compressible(void **state)
{
    const size_t n = 100000;
    float *x = calloc(n, sizeof *x);
    gcomp_codec *plain = make("fp16"), *chain = make("fp16+zstd");
    enc a = encode(plain, GCOMP_KEY_NONE, x, n), b = encode(chain, GCOMP_KEY_NONE, x, n);
    float *d = decode(chain, &b, n);
    gcomp_stats st;
    (void)state;
    assert_int_equal(a.n, GCOMP_HEADER_BYTES + 2 * n);
    assert_int_equal(b.h.flags & GCOMP_ZSTD_FLAG_RAW, 0);
    print_message("    fp16 of %zu zeros: %zu bytes, with zstd %zu bytes\n", n, a.n, b.n);
    assert_true(b.n < 1024);      /* 200 KB of zeros: a few dozen bytes of frame */
    assert_true(b.n * 100 < a.n); /* at least 100x */
    for (size_t i = 0; i < n; i++) assert_true(d[i] == 0.0f);
    assert_int_equal(gcomp_codec_stats_get(chain, &st), GCOMP_SUCCESS);
    assert_int_equal(st.raw_bytes, 4 * n);
    assert_int_equal(st.wire_bytes, b.n);
    free(x), free(d), free(a.p), free(b.p);
    gcomp_codec_destroy(plain);
    gcomp_codec_destroy(chain);
}

/* Random bit patterns (NaN included) through the none codec. From a thousand elements the
 * frame cannot beat its input and the RAW path is taken; below that zstd (level 19) can still
 * gain a byte or two on the inner header's zero fields, so only the +32 bytes limit holds. */
static void test_incompressible_raw(void **state)
{
    static const size_t ns[] = { 1, 2, 7, 100, 1000, 4096, 65537 };
    (void)state;
    for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
        size_t n = ns[t], inner_n;
        uint64_t rng = 0xfeed + n;
        uint32_t *bits = malloc(n * sizeof *bits);
        gcomp_codec *plain = make("none"), *chain = make("none+zstd:level=19");
        enc a, b;
        float *da, *db;
        uint8_t *inner;
        for (size_t i = 0; i < n; i++) bits[i] = (uint32_t)tu_next(&rng); /* NaN patterns included */
        a = encode(plain, GCOMP_KEY_NONE, (const float *)bits, n);
        b = encode(chain, GCOMP_KEY_NONE, (const float *)bits, n);
        assert_true(b.n <= a.n + GCOMP_HEADER_BYTES); /* never more than one header dearer */
        if (n >= 1000) {
            assert_int_equal(b.h.flags, GCOMP_ZSTD_FLAG_RAW); /* bit 0 of the outer header's flags */
            assert_int_equal(b.p[8], GCOMP_ZSTD_FLAG_RAW);
            assert_int_equal(b.n, a.n + GCOMP_HEADER_BYTES); /* RAW: header + the inner payload */
        }
        inner = unwrap(&b, &inner_n);
        assert_memory_equal(inner, a.p, a.n);
        /* the none codec keeps every bit pattern, and so does the chain */
        assert_memory_equal(a.p + GCOMP_HEADER_BYTES, bits, 4 * n);
        da = decode(plain, &a, n);
        db = decode(chain, &b, n);
        assert_memory_equal(da, db, n * sizeof *da);
        free(bits), free(inner), free(da), free(db), free(a.p), free(b.p);
        gcomp_codec_destroy(plain);
        gcomp_codec_destroy(chain);
    }
}

static void test_levels(void **state)
{
    static const char *const ok[] = { "fp16+zstd:level=-7", "fp16+zstd:level=1", "fp16+zstd:level=19",
                                      "fp16+zstd:level=0", "fp16+zstd" };
    static const char *const canon[] = { "fp16+zstd:level=-7", "fp16+zstd:level=1", "fp16+zstd:level=19",
                                         "fp16+zstd:level=0", "fp16+zstd:level=1" };
    static const char *const bad[] = { "fp16+zstd:level=20",
                                       "fp16+zstd:level=-8",
                                       "fp16+zstd:level=1.5",
                                       "fp16+zstd:level=abc",
                                       "fp16+zstd:level=",
                                       "fp16+zstd:lvl=3",
                                       "zstd",
                                       "zstd+fp16",
                                       "fp16+zstd:level=99999999999999999999" };
    const size_t n = 50000;
    float *x = malloc(n * sizeof *x);
    size_t sizes[3];
    (void)state;
    for (size_t i = 0; i < n; i++) x[i] = (float)((i * 37) % 1000) * 0.01f; /* compressible, not trivially */
    for (size_t l = 0; l < sizeof ok / sizeof ok[0]; l++) {
        gcomp_codec *c = make(ok[l]);
        assert_string_equal(gcomp_codec_spec(c), canon[l]);
        gcomp_codec_destroy(c);
        check_lossless("fp16", ok[l], x, n);
        if (l < 3) {
            enc e;
            c = make(ok[l]);
            e = encode(c, GCOMP_KEY_NONE, x, n);
            assert_int_equal(e.h.flags, 0);
            sizes[l] = e.n;
            free(e.p);
            gcomp_codec_destroy(c);
        }
    }
    print_message("    %zu elements of fp16: level -7 %zu B, 1 %zu B, 19 %zu B (fp16 alone %zu B)\n", n, sizes[0],
                  sizes[1], sizes[2], GCOMP_HEADER_BYTES + 2 * n);
    assert_true(sizes[2] <= sizes[0]); /* level 19 is no worse than -7 on this data */
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        gcomp_codec *c = (gcomp_codec *)1;
        gcomp_result rc = gcomp_codec_create(bad[b], NULL, &c);
        if (rc != GCOMP_ERR_INVALID_SPEC) fail_msg("'%s' gave %s", bad[b], gcomp_result_name(rc));
        assert_null(c);
    }
    {
        gcomp_codec *c;
        assert_int_equal(gcomp_codec_create("fp16+zstd:level=20", NULL, &c), GCOMP_ERR_INVALID_SPEC);
        assert_non_null(strstr(gcomp_last_error(), "level"));
    }
    free(x);
}

/* One codec object, 100 calls of varying size and kind of data, each checked against a fresh
 * plain fp16 codec; decodes interleaved with encodes, and payloads from another object. */
static void test_context_reuse(void **state)
{
    const size_t calls = 100;
    gcomp_codec *c = make("fp16+zstd"), *other = make("fp16+zstd:level=5"), *plain = make("fp16");
    uint64_t rng = 99, wire = 0, raw = 0;
    size_t n_raw = 0, n_frame = 0;
    gcomp_stats st;
    (void)state;
    for (size_t t = 0; t < calls; t++) {
        size_t n = t % 10 == 0 ? (size_t)(tu_next(&rng) % 200000) : (size_t)(tu_next(&rng) % 3000);
        float *x = malloc((n ? n : 1) * sizeof *x), *d, *dp, *d2;
        enc e, p, o;
        int kind = (int)(t % 3);
        for (size_t i = 0; i < n; i++)
            x[i] = kind == 0 ? tu_gauss(&rng) : kind == 1 ? (float)(i % 7) : (float)(tu_next(&rng) % 3) - 1.0f;
        if (t == 50) n = 0;
        e = encode(c, GCOMP_KEY_NONE, x, n);
        p = encode(plain, GCOMP_KEY_NONE, x, n);
        o = encode(other, GCOMP_KEY_NONE, x, n);
        d = decode(c, &e, n);
        dp = decode(plain, &p, n);
        d2 = decode(c, &o, n); /* another object's frame, decoded with this one's context */
        if (n) {
            assert_memory_equal(d, dp, n * sizeof *d);
            assert_memory_equal(d2, dp, n * sizeof *d);
        }
        wire += e.n;
        raw += 4 * n;
        if (e.h.flags & GCOMP_ZSTD_FLAG_RAW)
            n_raw++;
        else
            n_frame++;
        free(x), free(d), free(dp), free(d2), free(e.p), free(p.p), free(o.p);
    }
    assert_int_equal(gcomp_codec_stats_get(c, &st), GCOMP_SUCCESS);
    assert_int_equal(st.encode_calls, calls);
    assert_int_equal(st.decode_calls, 2 * calls);
    assert_int_equal(st.wire_bytes, wire);
    assert_int_equal(st.raw_bytes, raw);
    assert_true(n_frame > 0);
    print_message("    %zu calls: %zu frames, %zu raw\n", calls, n_frame, n_raw);
    gcomp_codec_destroy(c);
    gcomp_codec_destroy(other);
    gcomp_codec_destroy(plain);
}

/* Output capacity: the bound always suffices; below the payload's size the call is refused;
 * in between (zstd wants some slack beyond its final frame size) the result is either
 * BUFFER_TOO_SMALL or a valid payload that fits. Buffers are exact-size heap blocks, so the
 * ASan build catches a write past the capacity. */
static void test_output_capacity(void **state)
{
    static const size_t ns[] = { 0, 1, 7, 1000, 30000 };
    (void)state;
    for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
        for (int compressible = 0; compressible < 2; compressible++) {
            size_t n = ns[t];
            uint64_t rng = 5 + n;
            gcomp_codec *c = make("none+zstd");
            uint32_t *x = malloc((n ? n : 1) * sizeof *x);
            size_t bound = gcomp_codec_max_encoded_bytes(c, n);
            enc e;
            for (size_t i = 0; i < n; i++) x[i] = compressible ? (uint32_t)(i % 3) << 23 : (uint32_t)tu_next(&rng);
            e = encode(c, GCOMP_KEY_NONE, (const float *)x, n);
            assert_true(e.n <= bound);
            for (size_t cap = 0;; cap = cap < e.n + 80 ? cap + 1 : cap + 97) {
                uint8_t *buf;
                size_t w = 12345;
                gcomp_result rc;
                if (cap > bound) cap = bound; /* always end on the bound itself */
                buf = malloc(cap ? cap : 1);
                rc = gcomp_codec_encode(c, GCOMP_KEY_NONE, x, n, GCOMP_F32, buf, cap, &w);
                if (cap < e.n || rc != GCOMP_SUCCESS) {
                    if (rc != GCOMP_ERR_BUFFER_TOO_SMALL)
                        fail_msg("n=%zu cap=%zu (payload %zu): %s", n, cap, e.n, gcomp_result_name(rc));
                    assert_int_equal(w, 0);
                    assert_true(cap != bound);
                } else {
                    enc got = { buf, w, { 0 } };
                    float *d1, *d2;
                    assert_true(w <= cap);
                    assert_int_equal(gcomp_header_read(buf, w, &got.h), GCOMP_SUCCESS);
                    d1 = decode(c, &got, n);
                    d2 = decode(c, &e, n);
                    if (n) assert_memory_equal(d1, d2, n * sizeof *d1);
                    free(d1), free(d2);
                }
                free(buf);
                if (cap == bound) break;
            }
            free(x), free(e.p);
            gcomp_codec_destroy(c);
        }
    }
}

/* Stages may repeat: fp16+zstd+zstd peels both. */
static void test_two_zstd_stages(void **state)
{
    const size_t n = 5000;
    float *x = tu_gauss_array(n, 1);
    gcomp_codec *c = make("fp16+zstd+zstd:level=19"), *plain = make("fp16");
    enc e = encode(c, GCOMP_KEY_NONE, x, n), p = encode(plain, GCOMP_KEY_NONE, x, n);
    float *d = decode(c, &e, n), *dp = decode(plain, &p, n);
    size_t mid_n;
    uint8_t *mid = unwrap(&e, &mid_n);
    gcomp_header mh;
    (void)state;
    assert_int_equal(gcomp_header_read(mid, mid_n, &mh), GCOMP_SUCCESS);
    assert_int_equal(mh.wire_id, GCOMP_WIRE_ID_ZSTD); /* the first zstd stage's payload */
    assert_string_equal(gcomp_codec_spec(c), "fp16+zstd:level=1+zstd:level=19");
    assert_memory_equal(d, dp, n * sizeof *d);
    free(x), free(d), free(dp), free(mid), free(e.p), free(p.p);
    gcomp_codec_destroy(c);
    gcomp_codec_destroy(plain);
}

/* Issue 13 item 10: past zstd's largest input the stage has no bound (SIZE_MAX), and a
 * chain's bound is 0 instead of a wrapped sum; below it the bound covers the raw fallback. */
static void test_bound_limits(void **state)
{
    const gcomp_codec_vtable *vt = gcomp_codec_find("zstd");
    gcomp_zstd_params p = { 1 };
    gcomp_codec *c = tu_codec("fp16+zstd");
    (void)state;
    assert_non_null(vt);
    assert_int_equal(vt->stage_bound(&p, SIZE_MAX), SIZE_MAX);
    assert_int_equal(vt->stage_bound(&p, SIZE_MAX - 32), SIZE_MAX);
    assert_true(vt->stage_bound(&p, (size_t)1 << 40) >= (size_t)1 << 40);
    assert_true(vt->stage_bound(&p, 0) > 0);
    assert_int_equal(gcomp_codec_max_encoded_bytes(c, GCOMP_MAX_COUNT + 1), 0);
    assert_true(gcomp_codec_max_encoded_bytes(c, GCOMP_MAX_COUNT) > 2 * (GCOMP_MAX_COUNT - 1));
    gcomp_codec_destroy(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lossless),           cmocka_unit_test(test_compressible),
        cmocka_unit_test(test_incompressible_raw), cmocka_unit_test(test_levels),
        cmocka_unit_test(test_context_reuse),      cmocka_unit_test(test_output_capacity),
        cmocka_unit_test(test_two_zstd_stages),    cmocka_unit_test(test_bound_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
