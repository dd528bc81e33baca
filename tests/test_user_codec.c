/*
 * test_user_codec.c — a codec written outside the library, registered through
 * gcomp_codec_register() and used by name in spec strings like any built-in.
 *
 * randk (tests/randk_codec.h, shared with the multi-rank test) keeps k random elements and
 * carries the key of its choice in the body. A second user codec, xormask, is a byte stage
 * (payload bytes XOR 0x5a) to show a user stage in a chain.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "test_util.h"
#include "gcomp_codec.h"

#include "randk_codec.h"
#include "transport_loop.h"
#include "loop_world.h"

#define XORMASK_WIRE_ID 201

/* ---- the xormask byte stage ------------------------------------------------------------------ */

static size_t xor_bound(const void *params, size_t n)
{
    (void)params;
    return n;
}

static gcomp_result xor_encode(const void *params, void *state, const uint8_t *in, size_t n, uint8_t *out, size_t cap,
                               size_t *written, uint32_t *flags)
{
    (void)params;
    (void)state;
    if (cap < n) return gcomp_codec_fail(GCOMP_ERR_BUFFER_TOO_SMALL, "xormask: need %zu bytes", n);
    for (size_t i = 0; i < n; i++) out[i] = in[i] ^ 0x5a;
    *written = n;
    *flags = 0;
    return GCOMP_SUCCESS;
}

static gcomp_result xor_decode(const void *params, void *state, uint32_t flags, const uint8_t *in, size_t n,
                               uint8_t *out, size_t cap, size_t *written)
{
    (void)params;
    (void)state;
    if (flags) return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "xormask: unknown flags");
    if (n > cap) return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "xormask: %zu bytes > %zu", n, cap);
    for (size_t i = 0; i < n; i++) out[i] = in[i] ^ 0x5a;
    *written = n;
    return GCOMP_SUCCESS;
}

static const gcomp_codec_vtable xormask_vt = {
    .abi_version = GCOMP_CODEC_ABI_VERSION,
    .name = "xormask",
    .wire_id = XORMASK_WIRE_ID,
    .caps = GCOMP_CAP_BYTE_STAGE,
    .stage_bound = xor_bound,
    .stage_encode = xor_encode,
    .stage_decode = xor_decode,
};

/* ---- helpers ---------------------------------------------------------------------------------- */

static gcomp_codec *codec_with(const char *spec, uint64_t seed, uint32_t rank)
{
    gcomp_codec_options o = gcomp_codec_options_default();
    gcomp_codec *c = NULL;
    o.seed = seed;
    o.rank = rank;
    if (gcomp_codec_create(spec, &o, &c) != GCOMP_SUCCESS) fail_msg("create '%s': %s", spec, gcomp_last_error());
    return c;
}

/* Encode x (key), return the payload (caller frees) and its size. */
static uint8_t *encode_with(gcomp_codec *c, uint64_t key, const float *x, size_t n, size_t *bytes)
{
    size_t cap = gcomp_codec_max_encoded_bytes(c, n);
    uint8_t *buf = malloc(cap);
    gcomp_result rc = gcomp_codec_encode(c, key, x, n, GCOMP_F32, buf, cap, bytes);
    if (rc != GCOMP_SUCCESS) fail_msg("encode '%s': %s", gcomp_codec_spec(c), gcomp_last_error());
    assert_true(*bytes <= cap);
    return buf;
}

static float *decode_with(gcomp_codec *c, const uint8_t *p, size_t bytes, size_t n)
{
    float *out = calloc(n ? n : 1, sizeof *out);
    gcomp_result rc = gcomp_codec_decode_add(c, p, bytes, out, n);
    if (rc != GCOMP_SUCCESS) fail_msg("decode '%s': %s", gcomp_codec_spec(c), gcomp_last_error());
    return out;
}

/* Input with no zero element, so "decoded[i] != 0" means "element i was kept". */
static float *nonzero_input(size_t n, uint64_t seed)
{
    float *x = tu_gauss_array(n, seed);
    for (size_t i = 0; i < n; i++)
        if (x[i] == 0.0f) x[i] = 1.0f;
    return x;
}

static int group_setup(void **state)
{
    (void)state;
    if (gcomp_codec_register(&randk_vt) != GCOMP_SUCCESS) return -1;
    if (gcomp_codec_register(&xormask_vt) != GCOMP_SUCCESS) return -1;
    return 0;
}

/* ---- tests ------------------------------------------------------------------------------------- */

static void test_found_and_listed(void **state)
{
    static const char *const builtins[] = { "none", "fp16", "bf16", "terngrad", "topk", "zstd" };
    static const uint16_t wire_ids[] = { 1, 2, 3, 4, 7, 6 }; /* topk's format 1 was 5 */
    int seen_builtin[6] = { 0 }, seen_randk = 0, seen_xor = 0;
    size_t n = 0;
    const char *name;
    (void)state;
    assert_ptr_equal(gcomp_codec_find("randk"), &randk_vt);
    assert_ptr_equal(gcomp_codec_find_id(RANDK_WIRE_ID), &randk_vt);
    assert_ptr_equal(gcomp_codec_find("xormask"), &xormask_vt);
    assert_null(gcomp_codec_find("randk2"));
    assert_null(gcomp_codec_find_id(RANDK_WIRE_ID + 100));
    for (; (name = gcomp_codec_name_at(n)) != NULL; n++) {
        for (size_t b = 0; b < 6; b++) seen_builtin[b] += strcmp(name, builtins[b]) == 0;
        seen_randk += strcmp(name, "randk") == 0;
        seen_xor += strcmp(name, "xormask") == 0;
        assert_ptr_equal(gcomp_codec_find(name)->name, name); /* each name resolves to itself */
        assert_true(n < 64);
    }
    assert_int_equal(n, 8); /* six built-ins and the two registered here */
    for (size_t b = 0; b < 6; b++) {
        if (seen_builtin[b] != 1) fail_msg("built-in '%s' listed %d times", builtins[b], seen_builtin[b]);
        /* the built-ins come first, each with its own wire id */
        assert_string_equal(gcomp_codec_name_at(b), builtins[b]);
        assert_int_equal(gcomp_codec_find(builtins[b])->wire_id, wire_ids[b]);
        assert_ptr_equal(gcomp_codec_find_id(wire_ids[b]), gcomp_codec_find(builtins[b]));
    }
    assert_int_equal(seen_randk, 1);
    assert_int_equal(seen_xor, 1);
    assert_null(gcomp_codec_name_at(n + 1));
    assert_null(gcomp_codec_name_at((size_t)-1));
}

static void test_spec_and_round_trip(void **state)
{
    static const size_t ns[] = { 1, 2, 7, 100, 1001 };
    (void)state;
    for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
        size_t n = ns[t], bytes, kept = 0, k = (n + 1) / 2;
        gcomp_codec *c = codec_with("randk:ratio=0.5", 3, 0);
        float *x = nonzero_input(n, 40 + n), *d;
        uint8_t *p;
        gcomp_header h;
        assert_string_equal(gcomp_codec_spec(c), "randk:ratio=0.5");
        p = encode_with(c, GCOMP_KEY_NONE, x, n, &bytes);
        assert_int_equal(bytes, GCOMP_HEADER_BYTES + 8 + 4 * k);
        assert_int_equal(gcomp_header_read(p, bytes, &h), GCOMP_SUCCESS);
        assert_int_equal(h.wire_id, RANDK_WIRE_ID);
        assert_int_equal(h.count, n);
        d = decode_with(c, p, bytes, n);
        for (size_t i = 0; i < n; i++) {
            if (d[i] != 0.0f) {
                assert_true(d[i] == x[i]); /* a kept element is exact */
                kept++;
            }
        }
        assert_int_equal(kept, k);
        free(p);
        free(d);
        free(x);
        gcomp_codec_destroy(c);
    }
}

static void test_default_and_bad_params(void **state)
{
    static const char *const bad[] = {
        "randk:foo=1",   "randk:ratio=2",
        "randk:ratio=0", "randk:ratio=abc",
        "randk:ratio=",  "randk:ratio=0.5,ratio=0.5",
        "randk:k=3",     "randk:ratio=0.5+randk",
        "xormask",       "xormask+randk",
        "randk:",
    };
    gcomp_codec *c = NULL;
    (void)state;
    c = codec_with("randk", 0, 0);
    assert_string_equal(gcomp_codec_spec(c), "randk:ratio=0.5"); /* the table's default */
    gcomp_codec_destroy(c);
    c = codec_with("randk:ratio=0.25", 0, 0);
    assert_string_equal(gcomp_codec_spec(c), "randk:ratio=0.25");
    gcomp_codec_destroy(c);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gcomp_result rc = gcomp_codec_create(bad[i], NULL, &c);
        if (rc != GCOMP_ERR_INVALID_SPEC) fail_msg("'%s' gave %s", bad[i], gcomp_result_name(rc));
        assert_null(c);
    }
    assert_int_equal(gcomp_codec_create("randk:foo=1", NULL, &c), GCOMP_ERR_INVALID_SPEC);
    assert_non_null(strstr(gcomp_last_error(), "foo")); /* the message names the key */
}

/* The choice is a function of (seed, step, rank): same inputs give the same bytes, and each
 * of the three changes it. */
static void test_deterministic_choice(void **state)
{
    const size_t n = 257;
    float *x = nonzero_input(n, 77);
    size_t b1, b2, b3, b4, b5;
    gcomp_codec *a = codec_with("randk:ratio=0.5", 9, 1), *b = codec_with("randk:ratio=0.5", 9, 1);
    gcomp_codec *other_seed = codec_with("randk:ratio=0.5", 10, 1), *other_rank = codec_with("randk:ratio=0.5", 9, 2);
    uint8_t *p1 = encode_with(a, 5, x, n, &b1), *p2 = encode_with(b, 5, x, n, &b2);
    uint8_t *p3 = encode_with(other_seed, 5, x, n, &b3), *p4 = encode_with(other_rank, 5, x, n, &b4);
    uint8_t *p5 = encode_with(a, 5, x, n, &b5); /* second call of key 5: step 1 */
    (void)state;
    assert_int_equal(b1, b2);
    assert_memory_equal(p1, p2, b1);
    assert_int_equal(b1, b3);
    assert_int_equal(b1, b4);
    assert_int_equal(b1, b5);
    assert_memory_not_equal(p1 + GCOMP_HEADER_BYTES, p3 + GCOMP_HEADER_BYTES, 8);
    assert_memory_not_equal(p1 + GCOMP_HEADER_BYTES, p4 + GCOMP_HEADER_BYTES, 8);
    assert_memory_not_equal(p1 + GCOMP_HEADER_BYTES, p5 + GCOMP_HEADER_BYTES, 8);
    /* a decoder that never saw the encoder's options still finds the kept elements */
    {
        gcomp_codec *rx = codec_with("randk:ratio=0.5", 0, 0);
        float *d = decode_with(rx, p3, b3, n);
        size_t kept = 0;
        for (size_t i = 0; i < n; i++) {
            if (d[i] != 0.0f) assert_true(d[i] == x[i]);
            kept += d[i] != 0.0f;
        }
        assert_int_equal(kept, 129);
        free(d);
        gcomp_codec_destroy(rx);
    }
    free(p1), free(p2), free(p3), free(p4), free(p5), free(x);
    gcomp_codec_destroy(a), gcomp_codec_destroy(b), gcomp_codec_destroy(other_seed), gcomp_codec_destroy(other_rank);
}

/* decoded + residual == g + r_in, exactly, at every step; over steps everything gets sent. */
static void test_error_feedback(void **state)
{
    const size_t n = 300;
    const uint64_t key = 12;
    gcomp_codec *c = codec_with("randk:ratio=0.2", 4, 0);
    float *r = calloc(n, sizeof *r), *res = malloc(n * sizeof *res), *sent = calloc(n, sizeof *sent);
    float *total_in = calloc(n, sizeof *total_in);
    (void)state;
    assert_int_equal(gcomp_codec_residual_get(c, key, res, n), GCOMP_ERR_INVALID_ARG); /* no residual yet */
    for (int step = 0; step < 20; step++) {
        float *g = nonzero_input(n, 500 + (uint64_t)step), *d;
        size_t bytes, kept = 0;
        uint8_t *p = encode_with(c, key, g, n, &bytes);
        d = decode_with(c, p, bytes, n);
        assert_int_equal(gcomp_codec_residual_get(c, key, res, n), GCOMP_SUCCESS);
        for (size_t i = 0; i < n; i++) {
            float x = g[i] + r[i];
            if (d[i] + res[i] != x) fail_msg("step %d, element %zu: %g + %g != %g", step, i, d[i], res[i], x);
            kept += d[i] != 0.0f;
            if (d[i] != 0.0f) assert_true(res[i] == 0.0f);
            sent[i] += d[i];
            total_in[i] += g[i];
        }
        assert_int_equal(kept, 60);
        memcpy(r, res, n * sizeof *r);
        free(p);
        free(d);
        free(g);
    }
    /* what was sent plus what is still owed is what came in (up to float rounding) */
    for (size_t i = 0; i < n; i++) assert_float_equal(sent[i] + r[i], total_in[i], 1e-3);
    /* a wrong count is refused; reset drops the key */
    assert_int_equal(gcomp_codec_residual_get(c, key, res, n - 1), GCOMP_ERR_INVALID_ARG);
    assert_int_equal(gcomp_codec_residual_reset(c, key), GCOMP_SUCCESS);
    assert_int_equal(gcomp_codec_residual_get(c, key, res, n), GCOMP_ERR_INVALID_ARG);
    free(r), free(res), free(sent), free(total_in);
    gcomp_codec_destroy(c);
}

/* In a chain with zstd (and with the user byte stage): the same values as randk alone. */
static void test_chains(void **state)
{
    static const char *const chains[] = { "randk:ratio=0.5+zstd", "randk:ratio=0.5+zstd:level=19",
                                          "randk:ratio=0.5+xormask", "randk:ratio=0.5+xormask+zstd", "fp16+xormask" };
    static const size_t ns[] = { 1, 7, 1001, 20000 };
    (void)state;
    for (size_t ci = 0; ci < sizeof chains / sizeof chains[0]; ci++) {
        for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
            size_t n = ns[t], b_chain, b_alone;
            char alone_spec[64];
            gcomp_codec *chain = codec_with(chains[ci], 21, 3), *alone;
            float *x = nonzero_input(n, 3 * n + ci), *d_chain, *d_alone;
            uint8_t *p_chain, *p_alone;
            gcomp_header h;
            snprintf(alone_spec, sizeof alone_spec, "%.*s", (int)strcspn(chains[ci], "+"), chains[ci]);
            alone = codec_with(alone_spec, 21, 3);
            p_chain = encode_with(chain, 8, x, n, &b_chain);
            p_alone = encode_with(alone, 8, x, n, &b_alone);
            assert_int_equal(gcomp_header_read(p_chain, b_chain, &h), GCOMP_SUCCESS);
            assert_int_equal(h.wire_id, strstr(chains[ci], "zstd") ? 6 : XORMASK_WIRE_ID);
            assert_int_equal(h.count, n);
            d_chain = decode_with(chain, p_chain, b_chain, n);
            d_alone = decode_with(alone, p_alone, b_alone, n);
            assert_memory_equal(d_chain, d_alone, n * sizeof(float));
            /* the chain's own residual matches too */
            {
                float *r1 = malloc(n * sizeof *r1), *r2 = malloc(n * sizeof *r2);
                assert_int_equal(gcomp_codec_residual_get(chain, 8, r1, n), GCOMP_SUCCESS);
                assert_int_equal(gcomp_codec_residual_get(alone, 8, r2, n), GCOMP_SUCCESS);
                assert_memory_equal(r1, r2, n * sizeof(float));
                free(r1), free(r2);
            }
            /* each half refuses the other's payload */
            assert_int_equal(gcomp_codec_decode_add(alone, p_chain, b_chain, d_alone, n), GCOMP_ERR_CORRUPT);
            assert_int_equal(gcomp_codec_decode_add(chain, p_alone, b_alone, d_chain, n), GCOMP_ERR_CORRUPT);
            free(p_chain), free(p_alone), free(d_chain), free(d_alone), free(x);
            gcomp_codec_destroy(chain);
            gcomp_codec_destroy(alone);
        }
    }
}

static void test_corrupt_payloads(void **state)
{
    const size_t n = 64;
    gcomp_codec *c = codec_with("randk:ratio=0.5", 1, 0), *none = codec_with("none", 0, 0);
    float *x = nonzero_input(n, 8), acc[64] = { 0 };
    size_t bytes, nb;
    uint8_t *p = encode_with(c, GCOMP_KEY_NONE, x, n, &bytes), *q = encode_with(none, GCOMP_KEY_NONE, x, n, &nb);
    (void)state;
    for (size_t len = 0; len < bytes; len++)
        assert_int_equal(gcomp_codec_decode_add(c, p, len, acc, n), GCOMP_ERR_CORRUPT);
    assert_int_equal(gcomp_codec_decode_add(c, p, bytes, acc, n - 1), GCOMP_ERR_CORRUPT);
    assert_int_equal(gcomp_codec_decode_add(c, q, nb, acc, n), GCOMP_ERR_CORRUPT);       /* none's payload */
    assert_int_equal(gcomp_codec_decode_add(none, p, bytes, acc, n), GCOMP_ERR_CORRUPT); /* randk's payload */
    p[8] = 1;                                                                            /* header flags */
    assert_int_equal(gcomp_codec_decode_add(c, p, bytes, acc, n), GCOMP_ERR_CORRUPT);
    free(p), free(q), free(x);
    gcomp_codec_destroy(c);
    gcomp_codec_destroy(none);
}

static void test_register_errors(void **state)
{
    gcomp_codec_vtable v;
    (void)state;
    assert_int_equal(gcomp_codec_register(NULL), GCOMP_ERR_INVALID_ARG);
    /* already registered: the same vtable, the same name with a new id, a new name on its id */
    assert_int_equal(gcomp_codec_register(&randk_vt), GCOMP_ERR_EXISTS);
    v = randk_vt;
    v.wire_id = 300;
    assert_int_equal(gcomp_codec_register(&v), GCOMP_ERR_EXISTS);
    v = randk_vt;
    v.name = "randk_copy";
    assert_int_equal(gcomp_codec_register(&v), GCOMP_ERR_EXISTS);
    v.name = "zstd"; /* a built-in's name */
    v.wire_id = 301;
    assert_int_equal(gcomp_codec_register(&v), GCOMP_ERR_EXISTS);
    /* invalid: built-in wire ids (taken or not), id 0, bad names, ABI, missing functions */
    {
        static const uint16_t ids[] = { 0, 1, 4, 6, 100, GCOMP_WIRE_ID_USER_MIN - 1 };
        for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
            v = randk_vt;
            v.name = "fresh";
            v.wire_id = ids[i];
            if (gcomp_codec_register(&v) != GCOMP_ERR_INVALID_ARG) fail_msg("wire id %u accepted", ids[i]);
        }
    }
    {
        static const char *const names[] = { "Bad-Name", "BadName", "bad-name", "bad name",
                                             "",         "a+b",     "a:b",      "123456789012345678901234567890123" };
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            v = randk_vt;
            v.name = names[i];
            v.wire_id = 302;
            if (gcomp_codec_register(&v) != GCOMP_ERR_INVALID_ARG) fail_msg("name '%s' accepted", names[i]);
        }
        v.name = NULL;
        assert_int_equal(gcomp_codec_register(&v), GCOMP_ERR_INVALID_ARG);
    }
    v = randk_vt;
    v.name = "fresh";
    v.wire_id = 303;
    v.abi_version = GCOMP_CODEC_ABI_VERSION + 1;
    assert_int_equal(gcomp_codec_register(&v), GCOMP_ERR_INVALID_ARG);
    v.abi_version = 0;
    assert_int_equal(gcomp_codec_register(&v), GCOMP_ERR_INVALID_ARG);
    v = randk_vt;
    v.name = "fresh";
    v.wire_id = 303;
    v.encode = NULL;
    assert_int_equal(gcomp_codec_register(&v), GCOMP_ERR_INVALID_ARG);
    v = randk_vt;
    v.name = "fresh";
    v.wire_id = 303;
    v.params = NULL; /* n_params = 1 without a table */
    assert_int_equal(gcomp_codec_register(&v), GCOMP_ERR_INVALID_ARG);
    v = xormask_vt;
    v.name = "fresh";
    v.wire_id = 303;
    v.stage_decode = NULL;
    assert_int_equal(gcomp_codec_register(&v), GCOMP_ERR_INVALID_ARG);
    /* capability bits: unknown ones (ABI 1's CAP_CUDA, a future bit), two schedules at once */
    {
        static const uint32_t caps[] = { GCOMP_CAP_SPARSE | 1u << 3, GCOMP_CAP_SPARSE | 1u << 20,
                                         GCOMP_CAP_SUMMABLE | GCOMP_CAP_SPARSE, GCOMP_CAP_SUMMABLE | GCOMP_CAP_INTEGER,
                                         GCOMP_CAP_INTEGER | GCOMP_CAP_SPARSE };
        for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++) {
            v = randk_vt;
            v.name = "fresh";
            v.wire_id = 303;
            v.caps = caps[i];
            if (gcomp_codec_register(&v) != GCOMP_ERR_INVALID_ARG) fail_msg("caps 0x%x accepted", (unsigned)v.caps);
            if (!strstr(gcomp_last_error(), i < 2 ? "capability bits" : "more than one"))
                fail_msg("caps 0x%x: message '%s'", (unsigned)v.caps, gcomp_last_error());
        }
    }
    /* none of the refused ones was registered */
    assert_null(gcomp_codec_find("fresh"));
    assert_null(gcomp_codec_find("randk_copy"));
    assert_null(gcomp_codec_find_id(300));
    assert_null(gcomp_codec_find_id(303));
    assert_non_null(strstr(gcomp_last_error(), "fresh"));
    /* and the registry still works: a valid late registration is found by spec */
    {
        static gcomp_codec_vtable late;
        gcomp_codec *c;
        late = randk_vt;
        late.name = "randk_late";
        late.wire_id = 65535;
        assert_int_equal(gcomp_codec_register(&late), GCOMP_SUCCESS);
        c = codec_with("randk_late:ratio=1", 0, 0);
        assert_string_equal(gcomp_codec_spec(c), "randk_late:ratio=1");
        gcomp_codec_destroy(c);
    }
}

/* ---- issue 13 item 8: parameter tables are validated at registration ------------------------ */

typedef struct ptab_params {
    int64_t i;
    double d;
    int e;
} ptab_params;

typedef struct small_params { /* 12 bytes: an int64 at offset 8 would run 4 bytes past it */
    int32_t a, b, c;
} small_params;

static const char *const two_choices[] = { "lo", "hi", NULL };
static const char *const no_choices[] = { NULL };
static const char *const comma_choice[] = { "a,b", NULL };
static const char *const empty_choice[] = { "", NULL };
static const char *const dup_choices[] = { "x", "x", NULL };
static const char *const many_choices[64] = {
    "c0",  "c1",  "c2",  "c3",  "c4",  "c5",  "c6",  "c7",  "c8",  "c9",  "c10", "c11", "c12", "c13", "c14", "c15",
    "c16", "c17", "c18", "c19", "c20", "c21", "c22", "c23", "c24", "c25", "c26", "c27", "c28", "c29", "c30", "c31",
    "c32", "c33", "c34", "c35", "c36", "c37", "c38", "c39", "c40", "c41", "c42", "c43", "c44", "c45", "c46", "c47",
    "c48", "c49", "c50", "c51", "c52", "c53", "c54", "c55", "c56", "c57", "c58", "c59", "c60", "c61", "c62", "c63",
}; /* no NULL within 64 entries */

#define P_INT(name, off, lo, hi, def)                         \
    {                                                         \
        name, GCOMP_PARAM_INT, off, lo, hi, def, NULL, "test" \
    }
#define P_DBL(name, off, lo, hi, def)                            \
    {                                                            \
        name, GCOMP_PARAM_DOUBLE, off, lo, hi, def, NULL, "test" \
    }
#define P_ENUM(name, off, choices, def)                         \
    {                                                           \
        name, GCOMP_PARAM_ENUM, off, 0, 0, def, choices, "test" \
    }

/* A byte stage (it never reads its params) with the given table: only the table is tested. */
static gcomp_codec_vtable table_vt(const char *name, uint16_t id, const gcomp_param_def *params, size_t n, size_t size)
{
    gcomp_codec_vtable v = xormask_vt;
    v.name = name;
    v.wire_id = id;
    v.params = params;
    v.n_params = n;
    v.params_size = size;
    return v;
}

static void test_register_param_tables(void **state)
{
    static const gcomp_param_def int_past_end[] = { P_INT("x", 8, 0, 100, 1) };
    static const gcomp_param_def dbl_past_end[] = { P_DBL("x", 8, 0, 100, 1) };
    static const gcomp_param_def enum_past_end[] = { P_ENUM("x", 12, two_choices, 0) };
    static const gcomp_param_def offset_wraps[] = { P_INT("x", SIZE_MAX - 3, 0, 100, 1) };
    static const gcomp_param_def misaligned[] = { P_INT("x", 4, 0, 100, 1) };
    static const gcomp_param_def enum_def_past[] = { P_ENUM("e", offsetof(ptab_params, e), two_choices, 5) };
    static const gcomp_param_def enum_def_neg[] = { P_ENUM("e", offsetof(ptab_params, e), two_choices, -1) };
    static const gcomp_param_def enum_def_frac[] = { P_ENUM("e", offsetof(ptab_params, e), two_choices, 0.5) };
    static const gcomp_param_def enum_null[] = { P_ENUM("e", offsetof(ptab_params, e), NULL, 0) };
    static const gcomp_param_def enum_empty[] = { P_ENUM("e", offsetof(ptab_params, e), no_choices, 0) };
    static const gcomp_param_def enum_unterminated[] = { P_ENUM("e", offsetof(ptab_params, e), many_choices, 0) };
    static const gcomp_param_def enum_comma[] = { P_ENUM("e", offsetof(ptab_params, e), comma_choice, 0) };
    static const gcomp_param_def enum_empty_name[] = { P_ENUM("e", offsetof(ptab_params, e), empty_choice, 0) };
    static const gcomp_param_def enum_dup[] = { P_ENUM("e", offsetof(ptab_params, e), dup_choices, 0) };
    static const gcomp_param_def min_gt_max[] = { P_INT("i", 0, 10, 1, 5) };
    static const gcomp_param_def nan_bound[] = { P_DBL("d", 8, 0, NAN, 0) };
    static const gcomp_param_def def_below[] = { P_DBL("d", 8, 1, 2, 0.5) };
    static const gcomp_param_def def_above[] = { P_INT("i", 0, 1, 2, 3) };
    static const gcomp_param_def def_nan[] = { P_DBL("d", 8, -INFINITY, INFINITY, NAN) };
    static const gcomp_param_def def_frac[] = { P_INT("i", 0, 0, 10, 2.5) };
    static const gcomp_param_def dup_names[] = { P_INT("i", 0, 0, 10, 1), P_DBL("i", 8, 0, 1, 0) };
    static const gcomp_param_def overlap[] = { P_DBL("d", 8, 0, 1, 0), P_ENUM("e", 12, two_choices, 0) };
    static const gcomp_param_def bad_name[] = { P_INT("Bad", 0, 0, 10, 1) };
    static const gcomp_param_def eq_name[] = { P_INT("a=b", 0, 0, 10, 1) };
    static const gcomp_param_def null_name[] = { P_INT(NULL, 0, 0, 10, 1) };
    static const gcomp_param_def bad_type[] = { { "i", (gcomp_param_type)7, 0, 0, 10, 1, NULL, "test" } };
    static gcomp_param_def too_many[65];
    static const struct {
        const char *what;
        const gcomp_param_def *params;
        size_t n, size;
    } bad[] = {
        { "int64 at offset 8 of a 12-byte struct", int_past_end, 1, sizeof(small_params) },
        { "double at offset 8 of a 12-byte struct", dbl_past_end, 1, sizeof(small_params) },
        { "int at offset 12 of a 12-byte struct", enum_past_end, 1, sizeof(small_params) },
        { "an offset that wraps", offset_wraps, 1, sizeof(ptab_params) },
        { "a misaligned int64", misaligned, 1, sizeof(ptab_params) },
        { "an enum default past its choices", enum_def_past, 1, sizeof(ptab_params) },
        { "a negative enum default", enum_def_neg, 1, sizeof(ptab_params) },
        { "a fractional enum default", enum_def_frac, 1, sizeof(ptab_params) },
        { "an enum without choices", enum_null, 1, sizeof(ptab_params) },
        { "an enum with an empty choice list", enum_empty, 1, sizeof(ptab_params) },
        { "choices without NULL within 64", enum_unterminated, 1, sizeof(ptab_params) },
        { "a choice holding ','", enum_comma, 1, sizeof(ptab_params) },
        { "an empty choice", enum_empty_name, 1, sizeof(ptab_params) },
        { "a choice given twice", enum_dup, 1, sizeof(ptab_params) },
        { "min > max", min_gt_max, 1, sizeof(ptab_params) },
        { "a NaN bound", nan_bound, 1, sizeof(ptab_params) },
        { "a default below min", def_below, 1, sizeof(ptab_params) },
        { "a default above max", def_above, 1, sizeof(ptab_params) },
        { "a NaN default", def_nan, 1, sizeof(ptab_params) },
        { "a fractional integer default", def_frac, 1, sizeof(ptab_params) },
        { "a parameter name given twice", dup_names, 2, sizeof(ptab_params) },
        { "two fields that overlap", overlap, 2, sizeof(ptab_params) },
        { "an upper-case name", bad_name, 1, sizeof(ptab_params) },
        { "a name holding '='", eq_name, 1, sizeof(ptab_params) },
        { "a NULL name", null_name, 1, sizeof(ptab_params) },
        { "an unknown type", bad_type, 1, sizeof(ptab_params) },
        { "65 parameters", too_many, 65, 65 * sizeof(double) },
        { "a params struct of 1 MiB", int_past_end, 1, (size_t)1 << 20 },
    };
    static gcomp_codec_vtable vts[sizeof bad / sizeof bad[0]];
    static char names[sizeof bad / sizeof bad[0]][16];
    (void)state;
    for (size_t i = 0; i < 65; i++) {
        static char pn[65][8];
        snprintf(pn[i], sizeof pn[i], "p%zu", i);
        too_many[i] = (gcomp_param_def)P_DBL(pn[i], i * sizeof(double), 0, 1, 0);
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gcomp_result rc;
        snprintf(names[i], sizeof names[i], "ptab%zu", i);
        vts[i] = table_vt(names[i], (uint16_t)(400 + i), bad[i].params, bad[i].n, bad[i].size);
        rc = gcomp_codec_register(&vts[i]);
        if (rc == GCOMP_SUCCESS) {
            /* what a wrongly accepted table did before: parsing a spec wrote past the struct or
             * read past the choices (ASan reports it here) */
            char spec[64];
            gcomp_codec *c = NULL;
            snprintf(spec, sizeof spec, "none+%s", names[i]);
            if (gcomp_codec_create(spec, NULL, &c) == GCOMP_SUCCESS) gcomp_codec_destroy(c);
            snprintf(spec, sizeof spec, "none+%s:x=5", names[i]);
            if (gcomp_codec_create(spec, NULL, &c) == GCOMP_SUCCESS) gcomp_codec_destroy(c);
            fail_msg("a table with %s was registered", bad[i].what);
        }
        if (rc != GCOMP_ERR_INVALID_ARG) fail_msg("%s: %s", bad[i].what, gcomp_result_name(rc));
        assert_non_null(strstr(gcomp_last_error(), names[i]));
        assert_null(gcomp_codec_find(names[i]));
    }
}

/* A table whose canonical spec can outgrow GCOMP_SPEC_MAX (511 characters) is refused at
 * registration: it used to register, and then every create failed "canonical spec longer
 * than 511". Nine doubles with 31-character names can reach 5 + 9 * (2 + 31 + 24) = 518;
 * eight reach 461, register, and a create with every value at its longest text works. */
static void test_register_spec_length(void **state)
{
    static gcomp_param_def params[64];
    static char pn[64][40];
    static double fields[64];
    static const struct {
        const char *name;
        uint16_t id;
        size_t n;
        int ok;
    } cases[] = { { "lenno", 470, 64, 0 }, { "lenn9", 471, 9, 0 }, { "lenok", 472, 8, 1 } };
    char spec[1024];
    (void)state;
    for (size_t i = 0; i < 64; i++) {
        snprintf(pn[i], sizeof pn[i], "p%02zu_abcdefghijabcdefghijabcdefg", i); /* 31 characters */
        params[i] = (gcomp_param_def)P_DBL(pn[i], i * sizeof(double), -1e300, 1e300, 0);
    }
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        gcomp_codec_vtable *v = malloc(sizeof *v);
        gcomp_result rc;
        assert_non_null(v);
        *v = table_vt(cases[k].name, cases[k].id, params, cases[k].n, cases[k].n * sizeof fields[0]);
        rc = gcomp_codec_register(v);
        if (!cases[k].ok) {
            if (rc != GCOMP_ERR_INVALID_ARG)
                fail_msg("%zu long parameters: %s %s", cases[k].n, gcomp_result_name(rc), gcomp_last_error());
            assert_non_null(strstr(gcomp_last_error(), "canonical spec"));
            assert_non_null(strstr(gcomp_last_error(), cases[k].name));
            assert_null(gcomp_codec_find(cases[k].name));
            free(v);
            continue;
        }
        assert_int_equal(rc, GCOMP_SUCCESS); /* v stays registered for the process */
        {
            size_t o = (size_t)snprintf(spec, sizeof spec, "none+%s", cases[k].name); /* a byte stage */
            gcomp_codec *c = NULL;
            for (size_t i = 0; i < cases[k].n; i++)
                o += (size_t)snprintf(spec + o, sizeof spec - o, "%c%s=-1.2345678901234567e-300", i ? ',' : ':', pn[i]);
            if (gcomp_codec_create(spec, NULL, &c) != GCOMP_SUCCESS) fail_msg("%s", gcomp_last_error());
            assert_int_equal(strlen(gcomp_codec_spec(c)), 5 + 461);
            gcomp_codec_destroy(c);
        }
    }
}

/* A table that uses every type at its edges registers, and its values parse as declared. */
static void test_register_valid_table(void **state)
{
    static const gcomp_param_def params[] = {
        P_INT("i", offsetof(ptab_params, i), -9223372036854775808.0, 9223372036854775807.0, -5),
        P_DBL("d", offsetof(ptab_params, d), 0, 1, 0.25),
        P_ENUM("e", offsetof(ptab_params, e), two_choices, 1),
    };
    static gcomp_codec_vtable v;
    gcomp_codec *c = NULL;
    (void)state;
    v = table_vt("ptab_ok", 450, params, 3, sizeof(ptab_params));
    assert_int_equal(gcomp_codec_register(&v), GCOMP_SUCCESS);
    c = codec_with("none+ptab_ok", 0, 0);
    assert_string_equal(gcomp_codec_spec(c), "none+ptab_ok:i=-5,d=0.25,e=hi");
    assert_int_equal(gcomp_codec_kept(c, 9), 9);
    gcomp_codec_destroy(c);
    /* a user sparse codec's k is its own: gcomp_codec_kept says it cannot know */
    c = codec_with("randk:ratio=0.5", 0, 0);
    assert_int_equal(gcomp_codec_kept(c, 100), 0);
    assert_non_null(strstr(gcomp_last_error(), "user sparse codec"));
    gcomp_codec_destroy(c);
    /* the whole int64 range, exactly; subnormals are numbers */
    c = codec_with("none+ptab_ok:i=-9223372036854775808,d=4.9e-324,e=lo", 0, 0);
    assert_string_equal(gcomp_codec_spec(c), "none+ptab_ok:i=-9223372036854775808,d=5e-324,e=lo");
    gcomp_codec_destroy(c);
    c = codec_with("none+ptab_ok:i=9223372036854775807", 0, 0);
    assert_string_equal(gcomp_codec_spec(c), "none+ptab_ok:i=9223372036854775807,d=0.25,e=hi");
    gcomp_codec_destroy(c);
    assert_int_equal(gcomp_codec_create("none+ptab_ok:i=9223372036854775808", NULL, &c), GCOMP_ERR_INVALID_SPEC);
    assert_non_null(strstr(gcomp_last_error(), "out of range [-9223372036854775808, 9223372036854775807]"));
    assert_int_equal(gcomp_codec_create("none+ptab_ok:d=1e-400", NULL, &c), GCOMP_ERR_INVALID_SPEC);
    assert_non_null(strstr(gcomp_last_error(), "out of range [0, 1]"));
}

/* ---- a user GCOMP_CAP_INTEGER codec on the integer ring ------------------------------------------
 * tern1: one scale per tensor s = max |x| (x = g + r); codes t = +1 above s/2, -1 below -s/2,
 * else 0 (no randomness); sums of m ranks travel as one int8 per element. The integer ring
 * runs these entries, not TernGrad's: its results are checked against the same arithmetic
 * done here, bit for bit. */
#define TERN1_WIRE_ID 202

static int8_t tern1_code(float x, float s) { return x > 0.5f * s ? 1 : x < -0.5f * s ? -1 : 0; }

static size_t tern1_max_body(const void *params, size_t count)
{
    (void)params;
    return 4 + count;
}

static float tern1_scale(const float *g, const float *r, size_t n)
{
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(r ? g[i] + r[i] : g[i]);
        if (!(a <= s)) s = a; /* NaN wins */
    }
    return s;
}

static gcomp_result tern1_encode(const void *params, gcomp_encode_ctx *ctx, const float *g, const float *r_in,
                                 float *r_out, size_t count, uint8_t *body, size_t cap, size_t *written,
                                 uint32_t *flags)
{
    float s = tern1_scale(g, r_in, count);
    (void)params;
    if (cap < 4 + count) return gcomp_codec_fail(GCOMP_ERR_BUFFER_TOO_SMALL, "tern1: need %zu bytes", 4 + count);
    if (!isfinite(s)) ctx->nonfinite = 1;
    memcpy(body, &s, 4);
    for (size_t i = 0; i < count; i++) {
        float x = r_in ? g[i] + r_in[i] : g[i];
        int8_t t = tern1_code(x, s);
        body[4 + i] = (uint8_t)t;
        if (r_out) r_out[i] = x - (float)t * s;
    }
    *written = 4 + count;
    *flags = 0;
    return GCOMP_SUCCESS;
}

static gcomp_result tern1_decode_add(const void *params, uint32_t flags, const uint8_t *body, size_t bytes, float *acc,
                                     size_t count)
{
    float s;
    (void)params;
    if (flags || bytes != 4 + count) return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "tern1: bad body");
    memcpy(&s, body, 4);
    for (size_t i = 0; i < count; i++) acc[i] += (float)(int8_t)body[4 + i] * s;
    return GCOMP_SUCCESS;
}

static size_t tern1_num_scales(const void *params, size_t count)
{
    (void)params;
    (void)count;
    return 1;
}

static gcomp_result tern1_local_scales(const void *params, gcomp_encode_ctx *ctx, const float *g, const float *r,
                                       size_t count, float *scales)
{
    (void)params;
    (void)ctx;
    scales[0] = tern1_scale(g, r, count);
    return GCOMP_SUCCESS;
}

static size_t tern1_int_align(const void *params, size_t count)
{
    (void)params;
    (void)count;
    return 1;
}

static size_t tern1_int_sum_bytes(const void *params, size_t n, uint32_t m)
{
    (void)params;
    (void)m;
    return n;
}

static int tern1_calls[4]; /* ternarise, add_pack, values: the ring did call this codec */

static gcomp_result tern1_int_ternarise(const void *params, const gcomp_encode_ctx *ctx, const float *g,
                                        const float *r_in, float *r_out, size_t n, const float *scales, int8_t *t)
{
    size_t a = (size_t)ctx->offset;
    (void)params;
    __atomic_fetch_add(&tern1_calls[0], 1, __ATOMIC_RELAXED);
    for (size_t i = a; i < a + n; i++) {
        float x = r_in ? g[i] + r_in[i] : g[i];
        t[i - a] = tern1_code(x, scales[0]);
        if (r_out) r_out[i] = x - (float)t[i - a] * scales[0];
    }
    return GCOMP_SUCCESS;
}

static gcomp_result tern1_int_sums_add_pack(const void *params, const uint8_t *in, size_t in_bytes, uint32_t m_in,
                                            const int8_t *t, size_t n, uint8_t *out)
{
    (void)params;
    __atomic_fetch_add(&tern1_calls[1], 1, __ATOMIC_RELAXED);
    if (m_in && in_bytes != n)
        return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "tern1: %zu bytes of sums, expected %zu", in_bytes, n);
    for (size_t i = 0; i < n; i++) {
        int v = m_in ? (int8_t)in[i] : 0;
        if (v < -(int)m_in || v > (int)m_in) return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "tern1: sum out of range");
        out[i] = (uint8_t)(int8_t)(v + t[i]);
    }
    return GCOMP_SUCCESS;
}

static gcomp_result tern1_int_sums_values(const void *params, const uint8_t *in, size_t bytes, size_t lo, size_t n,
                                          uint32_t m, const float *scales, float divisor, float *out, void *scratch)
{
    (void)params;
    (void)lo;
    (void)scratch;
    __atomic_fetch_add(&tern1_calls[2], 1, __ATOMIC_RELAXED);
    if (bytes != n)
        return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "tern1: %zu bytes of final sums, expected %zu", bytes, n);
    for (size_t i = 0; i < n; i++) {
        int v = (int8_t)in[i];
        if (v < -(int)m || v > (int)m) return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "tern1: final sum out of range");
        out[i] = (float)v * scales[0] / divisor;
    }
    return GCOMP_SUCCESS;
}

static const gcomp_codec_vtable tern1_vt = {
    .abi_version = GCOMP_CODEC_ABI_VERSION,
    .name = "tern1",
    .wire_id = TERN1_WIRE_ID,
    .caps = GCOMP_CAP_INTEGER,
    .max_body_bytes = tern1_max_body,
    .encode = tern1_encode,
    .decode_add = tern1_decode_add,
    .num_scales = tern1_num_scales,
    .local_scales = tern1_local_scales,
    .int_align = tern1_int_align,
    .int_sum_bytes = tern1_int_sum_bytes,
    .int_ternarise = tern1_int_ternarise,
    .int_sums_add_pack = tern1_int_sums_add_pack,
    .int_sums_values = tern1_int_sums_values,
};

/* An INTEGER codec without an entry the ring needs is refused, and the message names it. */
static void test_integer_entries_required(void **state)
{
    static const char *const names[] = { "num_scales",    "local_scales",      "int_align",      "int_sum_bytes",
                                         "int_ternarise", "int_sums_add_pack", "int_sums_values" };
    (void)state;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        gcomp_codec_vtable v = tern1_vt;
        v.name = "tern1_lacking";
        v.wire_id = 203;
        switch (i) {
        case 0:
            v.num_scales = NULL;
            break;
        case 1:
            v.local_scales = NULL;
            break;
        case 2:
            v.int_align = NULL;
            break;
        case 3:
            v.int_sum_bytes = NULL;
            break;
        case 4:
            v.int_ternarise = NULL;
            break;
        case 5:
            v.int_sums_add_pack = NULL;
            break;
        default:
            v.int_sums_values = NULL;
            break;
        }
        assert_int_equal(gcomp_codec_register(&v), GCOMP_ERR_INVALID_ARG);
        if (!strstr(gcomp_last_error(), names[i]) || !strstr(gcomp_last_error(), "GCOMP_CAP_INTEGER"))
            fail_msg("missing %s: the message does not name it: %s", names[i], gcomp_last_error());
    }
    /* a sparse codec gives all three pair entries or none */
    {
        gcomp_codec_vtable v = randk_vt;
        v.name = "randk_half";
        v.wire_id = 204;
        v.sparse_k = tern1_num_scales;
        assert_int_equal(gcomp_codec_register(&v), GCOMP_ERR_INVALID_ARG);
        assert_non_null(strstr(gcomp_last_error(), "sparse_pairs"));
    }
}

#define TERN1_N 3001
#define TERN1_STEPS 3
#define TERN1_MAX_RANKS 4

typedef struct tern1_job {
    loop_rank at; /* first: loop_run_world fills it */
    gcomp_op op;
    gcomp_result rc;
    gcomp_schedule sched;
    float out[TERN1_STEPS][TERN1_N];
} tern1_job;

static float tern1_input(int rank, int step, size_t i)
{
    return (float)((int)((i * 7 + (size_t)rank * 13 + (size_t)step * 5) % 17) - 8) * 0.25f + 0.01f * (float)rank;
}

static void *tern1_rank(void *arg)
{
    tern1_job *j = arg;
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *comm = NULL;
    gcomp_comm_stats st;
    static _Thread_local float x[TERN1_N];
    cfg.codec = "tern1";
    cfg.min_bytes = 0;
    cfg.timeout_ms = 20000;
    j->rc = gcomp__comm_create_loop(j->at.w, j->at.rank, &cfg, &comm);
    for (int t = 0; t < TERN1_STEPS && j->rc == GCOMP_SUCCESS; t++) {
        for (size_t i = 0; i < TERN1_N; i++) x[i] = tern1_input(j->at.rank, t, i);
        j->rc = gcomp_allreduce(comm, x, j->out[t], TERN1_N, GCOMP_F32, j->op, 5, NULL);
    }
    if (j->rc == GCOMP_SUCCESS && gcomp_comm_stats_get(comm, &st) == GCOMP_SUCCESS) j->sched = st.last_schedule;
    gcomp_comm_destroy(comm);
    return NULL;
}

/* The integer ring runs the user codec's entries: results equal tern1's arithmetic done
 * here (shared max scale, codes summed exactly, residuals kept), bit for bit, on 2-4 ranks. */
static void test_user_integer_codec_ring(void **state)
{
    static tern1_job jobs[TERN1_MAX_RANKS];
    static float r[TERN1_MAX_RANKS][TERN1_N], xs[TERN1_MAX_RANKS][TERN1_N];
    (void)state;
    assert_int_equal(gcomp_codec_register(&tern1_vt), GCOMP_SUCCESS);
    for (int n = 2; n <= TERN1_MAX_RANKS; n++) {
        for (int op = 0; op < 2; op++) {
            memset(tern1_calls, 0, sizeof tern1_calls);
            for (int k = 0; k < n; k++) jobs[k].op = op ? GCOMP_AVG : GCOMP_SUM;
            loop_run_world(n, tern1_rank, jobs, sizeof jobs[0]);
            assert_true(tern1_calls[0] > 0 && tern1_calls[1] > 0 && tern1_calls[2] > 0);
            memset(r, 0, sizeof r);
            for (int t = 0; t < TERN1_STEPS; t++) {
                float s = 0.0f;
                for (int k = 0; k < n; k++) {
                    for (size_t i = 0; i < TERN1_N; i++) xs[k][i] = tern1_input(k, t, i) + r[k][i];
                    if (tern1_scale(xs[k], NULL, TERN1_N) > s) s = tern1_scale(xs[k], NULL, TERN1_N);
                }
                for (size_t i = 0; i < TERN1_N; i++) {
                    int sum = 0;
                    float want;
                    for (int k = 0; k < n; k++) {
                        int8_t c = tern1_code(xs[k][i], s);
                        sum += c;
                        r[k][i] = xs[k][i] - (float)c * s;
                    }
                    want = (float)sum * s / (op ? (float)n : 1.0f);
                    for (int k = 0; k < n; k++) {
                        assert_int_equal(jobs[k].rc, GCOMP_SUCCESS);
                        assert_int_equal(jobs[k].sched, GCOMP_SCHED_INTEGER);
                        if (memcmp(&jobs[k].out[t][i], &want, 4) != 0)
                            fail_msg("%d ranks, %s, step %d, rank %d, element %zu: %.9g, expected %.9g", n,
                                     op ? "AVG" : "SUM", t, k, i, jobs[k].out[t][i], want);
                    }
                }
            }
        }
    }
}

/* Register *vt (static: the registry keeps the pointer) as "none" under another name and
 * wire id, with its encode replaced; returns "none"'s vtable, whose encode the new one wraps. */
static const gcomp_codec_vtable *register_none_variant(gcomp_codec_vtable *vt, const char *name, uint16_t wire_id,
                                                       __typeof__(vt->encode) encode)
{
    const gcomp_codec_vtable *none = gcomp_codec_find("none");
    *vt = *none;
    vt->name = name;
    vt->wire_id = wire_id;
    vt->encode = encode;
    vt->cuda = NULL;
    assert_int_equal(gcomp_codec_register(vt), GCOMP_SUCCESS);
    return none;
}

/* ---- a summable codec whose encode depends on the rank ----------------------------------
 * "rknone": fp32 values whose lowest mantissa bit a hash of (seed, step, rank, element)
 * flips, as a user's rank-keyed stochastic rounding would. Every rank must still get the
 * same bits: the dense ring encodes each partial sum on one rank, and recursive doubling (4
 * ranks, small calls) has every rank that holds a partial sum encode it as the lowest rank
 * of its group (gcomp_codec.h, GCOMP_CAP_SUMMABLE). */
static const gcomp_codec_vtable *rk_base;

static gcomp_result rk_encode(const void *params, gcomp_encode_ctx *ctx, const float *g, const float *r_in,
                              float *r_out, size_t count, uint8_t *body, size_t cap, size_t *written, uint32_t *flags)
{
    gcomp_result rc = rk_base->encode(params, ctx, g, r_in, r_out, count, body, cap, written, flags);
    if (rc != GCOMP_SUCCESS) return rc;
    for (size_t i = 0; i < count; i++) {
        uint64_t h = ctx->seed ^ ctx->step * 0x9e3779b97f4a7c15ull ^ (uint64_t)ctx->rank * 0xd1b54a32d192ed03ull ^
                     (ctx->offset + i);
        h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull; /* splitmix64's finaliser */
        h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
        h ^= h >> 31;
        body[4 * i] ^= (uint8_t)(h & 1); /* little-endian fp32: the lowest mantissa bit */
    }
    return GCOMP_SUCCESS;
}

typedef struct rk_job {
    loop_rank at; /* first: loop_run_world fills it */
    size_t count;
    gcomp_result rc;
    gcomp_schedule sched;
    uint64_t hash;
} rk_job;

static void *rk_rank(void *arg)
{
    rk_job *j = arg;
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *comm = NULL;
    gcomp_comm_stats st;
    float *x = malloc(j->count * sizeof(float)), *y = calloc(j->count, sizeof(float));
    cfg.codec = "rknone";
    cfg.min_bytes = 0;
    cfg.timeout_ms = 20000;
    for (size_t i = 0; i < j->count; i++) x[i] = (float)((i * 7 + (size_t)j->at.rank * 13) % 101) / 7.0f;
    j->rc = gcomp__comm_create_loop(j->at.w, j->at.rank, &cfg, &comm);
    for (int t = 0; t < 2 && j->rc == GCOMP_SUCCESS; t++)
        j->rc = gcomp_allreduce(comm, x, y, j->count, GCOMP_F32, GCOMP_SUM, 4, NULL);
    if (j->rc == GCOMP_SUCCESS && gcomp_comm_stats_get(comm, &st) == GCOMP_SUCCESS) j->sched = st.last_schedule;
    j->hash = 1469598103934665603ull;
    for (size_t i = 0; i < j->count * sizeof(float); i++) j->hash = (j->hash ^ ((uint8_t *)y)[i]) * 1099511628211ull;
    gcomp_comm_destroy(comm);
    free(x);
    free(y);
    return NULL;
}

static void test_rank_keyed_summable_codec(void **state)
{
    static const size_t counts[] = { 1000, 40000 };
    static gcomp_codec_vtable vt; /* the registry keeps the pointer: it must outlive the test */
    (void)state;
    rk_base = register_none_variant(&vt, "rknone", 210, rk_encode);
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++)
        for (int n = 2; n <= 5; n++) {
            rk_job jobs[5];
            memset(jobs, 0, sizeof jobs);
            for (int r = 0; r < n; r++) jobs[r].count = counts[k];
            loop_run_world(n, rk_rank, jobs, sizeof jobs[0]);
            for (int r = 0; r < n; r++) {
                assert_int_equal(jobs[r].rc, GCOMP_SUCCESS);
                if (jobs[r].hash != jobs[0].hash)
                    fail_msg("rknone, %zu elements, %d ranks (%s): rank %d's result differs from rank 0's", counts[k],
                             n, gcomp_schedule_name(jobs[0].sched), r);
            }
            print_message("    rknone %5zu elements, %d ranks (%s): the same bits on every rank\n", counts[k], n,
                          gcomp_schedule_name(jobs[0].sched));
        }
}

/* ---- a codec that breaks its contract ------------------------------------------------------
 * "liar" is "none" whose encode, when told to, reports more body bytes than the capacity it
 * was given, or returns a value that is no gcomp_result; "liarstage" is xormask whose decode
 * reports more bytes than its output holds. The library must stop there with
 * GCOMP_ERR_INTERNAL naming the codec: not hand the caller a payload larger than its buffer,
 * and not send one (the ring writes its trailer after the payload). */
static const gcomp_codec_vtable *liar_base;
/* 0: honest; 1: over-reports its body; 2: returns 99; 3: rank 0 over-reports on a key's
 * first call (ctx->step 0: every encode of the engine's first call of the key) */
static _Atomic int liar_mode;
static _Thread_local int liar_thread_rank = -1; /* the loopback rank of this thread (not ctx->rank: doubling sets it) */

static gcomp_result liar_encode(const void *params, gcomp_encode_ctx *ctx, const float *g, const float *r_in,
                                float *r_out, size_t count, uint8_t *body, size_t cap, size_t *written, uint32_t *flags)
{
    gcomp_result rc = liar_base->encode(params, ctx, g, r_in, r_out, count, body, cap, written, flags);
    if (rc != GCOMP_SUCCESS) return rc;
    if (liar_mode == 1 || (liar_mode == 3 && ctx->step == 0 && liar_thread_rank == 0)) *written = cap + 100;
    if (liar_mode == 2) return (gcomp_result)99;
    return GCOMP_SUCCESS;
}

static gcomp_result liar_stage_decode(const void *params, void *state, uint32_t flags, const uint8_t *in, size_t n,
                                      uint8_t *out, size_t cap, size_t *written)
{
    gcomp_result rc = xor_decode(params, state, flags, in, n, out, cap, written);
    if (rc == GCOMP_SUCCESS) *written = cap + 1;
    return rc;
}

static void expect_internal(gcomp_result rc, const char *what, const char *name, const char *words)
{
    if (rc != GCOMP_ERR_INTERNAL) fail_msg("%s: %s, expected GCOMP_ERR_INTERNAL", what, gcomp_result_name(rc));
    if (!strstr(gcomp_last_error(), name) || !strstr(gcomp_last_error(), words))
        fail_msg("%s: the message '%s' names neither '%s' nor '%s'", what, gcomp_last_error(), name, words);
}

typedef struct liar_job {
    loop_rank at; /* first: loop_run_world fills it */
    gcomp_result rc[2];
} liar_job;

/* The key's first call lies on rank 0 (liar_mode 3), its second is honest. */
static void *liar_rank(void *arg)
{
    liar_job *j = arg;
    liar_thread_rank = j->at.rank;
    enum { N = 3000 }; /* 12 KB: recursive doubling at 2 and 4 ranks, the ring at 3 and 5 */
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *comm = NULL;
    float *x = calloc(N, sizeof(float)), *y = calloc(N, sizeof(float));
    cfg.codec = "liar";
    cfg.min_bytes = 0;
    cfg.timeout_ms = 20000;
    j->rc[0] = j->rc[1] = gcomp__comm_create_loop(j->at.w, j->at.rank, &cfg, &comm);
    for (int t = 0; t < 2 && j->rc[0] == GCOMP_SUCCESS; t++)
        j->rc[t] = gcomp_allreduce(comm, x, y, N, GCOMP_F32, GCOMP_SUM, 1, NULL);
    gcomp_comm_destroy(comm);
    free(x);
    free(y);
    return NULL;
}

static void test_codec_breaking_its_contract(void **state)
{
    static gcomp_codec_vtable vt, st; /* the registry keeps the pointers */
    gcomp_codec *c;
    float x[64] = { 1.0f }, acc[64] = { 0 };
    size_t cap, bytes = 0;
    uint8_t *buf, *payload;
    (void)state;
    liar_base = register_none_variant(&vt, "liar", 211, liar_encode);
    st = xormask_vt;
    st.name = "liarstage";
    st.wire_id = 212;
    st.stage_decode = liar_stage_decode;
    assert_int_equal(gcomp_codec_register(&st), GCOMP_SUCCESS);

    c = codec_with("liar", 1, 0);
    cap = gcomp_codec_max_encoded_bytes(c, 64);
    buf = malloc(cap);
    liar_mode = 1;
    expect_internal(gcomp_codec_encode(c, 1, x, 64, GCOMP_F32, buf, cap, &bytes), "encode over-reporting", "liar",
                    "bytes written");
    liar_mode = 2;
    expect_internal(gcomp_codec_encode(c, 1, x, 64, GCOMP_F32, buf, cap, &bytes), "encode returning 99", "liar",
                    "not a gcomp_result");
    liar_mode = 0;
    gcomp_codec_destroy(c);
    free(buf);

    c = codec_with("none+liarstage", 1, 0);
    payload = encode_with(c, 1, x, 64, &bytes);
    expect_internal(gcomp_codec_decode_add(c, payload, bytes, acc, 64), "stage_decode over-reporting", "liarstage",
                    "bytes written");
    gcomp_codec_destroy(c);
    free(payload);

    /* through the engine: rank 0 lies, every rank fails that call (the ring sends nothing past
     * its buffers: ASan would see it; the others learn it from rank 0's messages), and the
     * next call works */
    liar_mode = 3;
    for (int n = 2; n <= 5; n++) {
        liar_job jobs[5];
        memset(jobs, 0, sizeof jobs);
        loop_run_world(n, liar_rank, jobs, sizeof jobs[0]);
        for (int r = 0; r < n; r++) {
            if (jobs[r].rc[0] != GCOMP_ERR_INTERNAL)
                fail_msg("%d ranks, rank %d: the lying call gave %s, expected GCOMP_ERR_INTERNAL", n, r,
                         gcomp_result_name(jobs[r].rc[0]));
            if (jobs[r].rc[1] != GCOMP_SUCCESS)
                fail_msg("%d ranks, rank %d: the honest call after it gave %s", n, r, gcomp_result_name(jobs[r].rc[1]));
        }
        print_message("    liar, %d ranks: GCOMP_ERR_INTERNAL on every rank, then the next call works\n", n);
    }
    liar_mode = 0;
}

/* The same through the integer ring's own entries: "tern99" is tern1 whose int_sums_add_pack
 * returns 99 on rank 0. Every rank gets GCOMP_ERR_INTERNAL, rank 0's message names the entry. */
static gcomp_result tern99_sums_add_pack(const void *params, const uint8_t *in, size_t in_bytes, uint32_t m_in,
                                         const int8_t *t, size_t n, uint8_t *out)
{
    gcomp_result rc = tern1_int_sums_add_pack(params, in, in_bytes, m_in, t, n, out);
    return rc == GCOMP_SUCCESS && liar_thread_rank == 0 ? (gcomp_result)99 : rc;
}

typedef struct tern99_job {
    loop_rank at; /* first: loop_run_world fills it */
    gcomp_result rc;
    char msg[512];
} tern99_job;

static void *tern99_rank(void *arg)
{
    tern99_job *j = arg;
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *comm = NULL;
    static _Thread_local float x[TERN1_N], y[TERN1_N];
    liar_thread_rank = j->at.rank;
    cfg.codec = "tern99";
    cfg.min_bytes = 0;
    cfg.timeout_ms = 20000;
    for (size_t i = 0; i < TERN1_N; i++) x[i] = tern1_input(j->at.rank, 0, i);
    j->rc = gcomp__comm_create_loop(j->at.w, j->at.rank, &cfg, &comm);
    if (j->rc == GCOMP_SUCCESS) j->rc = gcomp_allreduce(comm, x, y, TERN1_N, GCOMP_F32, GCOMP_SUM, 1, NULL);
    snprintf(j->msg, sizeof j->msg, "%s", gcomp_last_error());
    gcomp_comm_destroy(comm);
    return NULL;
}

static void test_integer_entry_breaking_its_contract(void **state)
{
    static gcomp_codec_vtable vt; /* the registry keeps the pointer */
    (void)state;
    vt = tern1_vt;
    vt.name = "tern99";
    vt.wire_id = 213;
    vt.int_sums_add_pack = tern99_sums_add_pack;
    assert_int_equal(gcomp_codec_register(&vt), GCOMP_SUCCESS);
    for (int n = 2; n <= 4; n++) {
        tern99_job jobs[4];
        memset(jobs, 0, sizeof jobs);
        loop_run_world(n, tern99_rank, jobs, sizeof jobs[0]);
        for (int r = 0; r < n; r++)
            if (jobs[r].rc != GCOMP_ERR_INTERNAL)
                fail_msg("%d ranks, rank %d: %s (%s), expected GCOMP_ERR_INTERNAL", n, r, gcomp_result_name(jobs[r].rc),
                         jobs[r].msg);
        if (!strstr(jobs[0].msg, "int_sums_add_pack returned 99"))
            fail_msg("%d ranks: rank 0's message '%s' does not name the entry", n, jobs[0].msg);
    }
}

/* ---- a failure without a detail --------------------------------------------------------------
 * "bare" is "none" whose encode (bare_mode 1) or decode_add (bare_mode 2) returns an error
 * without gcomp_codec_fail, "told" one that calls it. gcomp_last_error() must name the codec
 * and the entry, never keep an older, unrelated failure's detail; a codec's own detail stays. */
static const gcomp_codec_vtable *bare_base;
static _Atomic int bare_mode;

static gcomp_result bare_encode(const void *params, gcomp_encode_ctx *ctx, const float *g, const float *r_in,
                                float *r_out, size_t count, uint8_t *body, size_t cap, size_t *written, uint32_t *flags)
{
    if (bare_mode == 1) return GCOMP_ERR_NOMEM;
    return bare_base->encode(params, ctx, g, r_in, r_out, count, body, cap, written, flags);
}

static gcomp_result bare_decode_add(const void *params, uint32_t flags, const uint8_t *body, size_t bytes, float *acc,
                                    size_t count)
{
    if (bare_mode == 2) return GCOMP_ERR_CORRUPT;
    return bare_base->decode_add(params, flags, body, bytes, acc, count);
}

static gcomp_result told_encode(const void *params, gcomp_encode_ctx *ctx, const float *g, const float *r_in,
                                float *r_out, size_t count, uint8_t *body, size_t cap, size_t *written, uint32_t *flags)
{
    (void)params, (void)ctx, (void)g, (void)r_in, (void)r_out, (void)count, (void)body, (void)cap, (void)written;
    (void)flags;
    return gcomp_codec_fail(GCOMP_ERR_NOMEM, "told: the pool is empty");
}

/* "nested" gives its detail, then runs a built-in codec (an inner entry that succeeds) before
 * it returns the failure: the inner entry must not make its detail look missing. */
static gcomp_result nested_encode(const void *params, gcomp_encode_ctx *ctx, const float *g, const float *r_in,
                                  float *r_out, size_t count, uint8_t *body, size_t cap, size_t *written,
                                  uint32_t *flags)
{
    gcomp_codec *inner = NULL;
    uint8_t tmp[512];
    size_t n = 0;
    gcomp_result rc = gcomp_codec_fail(GCOMP_ERR_NOMEM, "nested: the pool is empty");
    (void)params, (void)ctx, (void)r_in, (void)r_out, (void)body, (void)cap, (void)written, (void)flags;
    if (gcomp_codec_create("fp16", NULL, &inner) == GCOMP_SUCCESS) {
        (void)gcomp_codec_encode(inner, GCOMP_KEY_NONE, g, count < 64 ? count : 64, GCOMP_F32, tmp, sizeof tmp, &n);
        gcomp_codec_destroy(inner);
    }
    return rc;
}

/* An unrelated failure first, so that a stale detail would show. */
static void fail_unrelated(void)
{
    gcomp_codec *junk = NULL;
    assert_int_equal(gcomp_codec_create("topk:ratio=2", NULL, &junk), GCOMP_ERR_INVALID_SPEC);
    assert_non_null(strstr(gcomp_last_error(), "ratio"));
}

static void expect_detail(gcomp_result rc, gcomp_result want, const char *words)
{
    if (rc != want) fail_msg("%s, expected %s", gcomp_result_name(rc), gcomp_result_name(want));
    if (!strstr(gcomp_last_error(), words)) fail_msg("gcomp_last_error() is '%s', not '%s'", gcomp_last_error(), words);
}

typedef struct bare_job {
    loop_rank at; /* first: loop_run_world fills it */
    gcomp_result rc;
    char msg[512];
} bare_job;

/* bare_mode 1: the encode fails inside the engine, on every rank. */
static void *bare_rank(void *arg)
{
    bare_job *j = arg;
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *comm = NULL;
    float x[3000] = { 0 }, y[3000];
    cfg.codec = "bare";
    cfg.min_bytes = 0;
    cfg.timeout_ms = 20000;
    j->rc = gcomp__comm_create_loop(j->at.w, j->at.rank, &cfg, &comm);
    if (j->rc == GCOMP_SUCCESS) {
        gcomp_codec *junk = NULL;
        gcomp_codec_create("topk:ratio=2", NULL, &junk); /* an older, unrelated failure */
        j->rc = gcomp_allreduce(comm, x, y, 3000, GCOMP_F32, GCOMP_SUM, 1, NULL);
    }
    snprintf(j->msg, sizeof j->msg, "%s", gcomp_last_error());
    gcomp_comm_destroy(comm);
    return NULL;
}

static void test_codec_failure_without_detail(void **state)
{
    static gcomp_codec_vtable vt, told, nested; /* the registry keeps the pointers */
    float x[64] = { 1.0f }, acc[64] = { 0 };
    uint8_t buf[512];
    size_t bytes = 0;
    gcomp_codec *c;
    (void)state;
    bare_base = register_none_variant(&vt, "bare", 214, bare_encode);
    vt.decode_add = bare_decode_add; /* read at each call: the registry holds &vt */
    register_none_variant(&told, "told", 215, told_encode);
    register_none_variant(&nested, "nested", 217, nested_encode);

    c = codec_with("bare", 1, 0);
    fail_unrelated();
    bare_mode = 1;
    expect_detail(gcomp_codec_encode(c, 1, x, 64, GCOMP_F32, buf, sizeof buf, &bytes), GCOMP_ERR_NOMEM,
                  "codec 'bare': encode returned GCOMP_ERR_NOMEM (the codec gave no detail)");
    bare_mode = 0;
    assert_int_equal(gcomp_codec_encode(c, 1, x, 64, GCOMP_F32, buf, sizeof buf, &bytes), GCOMP_SUCCESS);
    fail_unrelated();
    bare_mode = 2;
    expect_detail(gcomp_codec_decode_add(c, buf, bytes, acc, 64), GCOMP_ERR_CORRUPT,
                  "codec 'bare': decode_add returned GCOMP_ERR_CORRUPT (the codec gave no detail)");
    bare_mode = 0;
    gcomp_codec_destroy(c);

    c = codec_with("told", 1, 0);
    fail_unrelated();
    expect_detail(gcomp_codec_encode(c, 1, x, 64, GCOMP_F32, buf, sizeof buf, &bytes), GCOMP_ERR_NOMEM,
                  "told: the pool is empty");
    gcomp_codec_destroy(c);

    c = codec_with("nested", 1, 0);
    fail_unrelated();
    expect_detail(gcomp_codec_encode(c, 1, x, 64, GCOMP_F32, buf, sizeof buf, &bytes), GCOMP_ERR_NOMEM,
                  "nested: the pool is empty");
    gcomp_codec_destroy(c);

    /* through the engine: rank 0's encode fails, every rank fails the call, and rank 0's
     * detail names the entry */
    bare_mode = 1;
    for (int n = 2; n <= 3; n++) {
        bare_job jobs[3];
        memset(jobs, 0, sizeof jobs);
        loop_run_world(n, bare_rank, jobs, sizeof jobs[0]);
        for (int r = 0; r < n; r++)
            if (jobs[r].rc != GCOMP_ERR_NOMEM)
                fail_msg("%d ranks, rank %d: %s (%s)", n, r, gcomp_result_name(jobs[r].rc), jobs[r].msg);
        if (!strstr(jobs[0].msg, "encode returned GCOMP_ERR_NOMEM (the codec gave no detail)"))
            fail_msg("%d ranks: rank 0's message is '%s'", n, jobs[0].msg);
    }
    bare_mode = 0;
}

/* ---- a sparse codec whose k breaks its contract -------------------------------------------------
 * "hostk" is top-k whose sparse_k returns more than count: count + 5 (hostk_mode 1), or 2^62 + 1
 * (2), whose product with the ranks and the pair size wrapped to a few bytes, and the codec
 * was handed a pair buffer of that many (a heap overflow). Every rank must refuse the call with
 * GCOMP_ERR_INTERNAL naming the codec and sparse_k, and the next honest call works. */
static const gcomp_codec_vtable *hostk_base;
static _Atomic int hostk_mode;
static pthread_barrier_t hostk_barrier; /* the world's ranks, between the two calls */
#define HOSTK_N 3000                    /* ratio 0.01: 30 pairs, the gather */

static size_t hostk_k(const void *params, size_t count)
{
    if (hostk_mode == 1) return count + 5;
    if (hostk_mode == 2) return ((size_t)1 << 62) + 1;
    return hostk_base->sparse_k(params, count);
}

typedef struct hostk_job {
    loop_rank at; /* first: loop_run_world fills it */
    gcomp_result rc[2];
    char msg[512];
} hostk_job;

static void *hostk_rank(void *arg)
{
    hostk_job *j = arg;
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *comm = NULL;
    float *x = calloc(HOSTK_N, sizeof(float)), *y = calloc(HOSTK_N, sizeof(float));
    for (size_t i = 0; i < HOSTK_N; i++) x[i] = (float)(i % 7) + (float)j->at.rank;
    cfg.codec = "hostk:ratio=0.01";
    cfg.min_bytes = 0;
    cfg.timeout_ms = 20000;
    j->rc[0] = j->rc[1] = gcomp__comm_create_loop(j->at.w, j->at.rank, &cfg, &comm);
    if (j->rc[0] == GCOMP_SUCCESS) j->rc[0] = gcomp_allreduce(comm, x, y, HOSTK_N, GCOMP_F32, GCOMP_SUM, 1, NULL);
    snprintf(j->msg, sizeof j->msg, "%s", gcomp_last_error());
    /* the honest call after it: the mode is shared, so every rank makes the first call first */
    pthread_barrier_wait(&hostk_barrier);
    if (j->at.rank == 0) hostk_mode = 0;
    pthread_barrier_wait(&hostk_barrier);
    if (j->rc[1] == GCOMP_SUCCESS) j->rc[1] = gcomp_allreduce(comm, x, y, HOSTK_N, GCOMP_F32, GCOMP_SUM, 1, NULL);
    gcomp_comm_destroy(comm);
    free(x);
    free(y);
    return NULL;
}

static void test_sparse_k_more_than_count(void **state)
{
    static gcomp_codec_vtable vt; /* the registry keeps the pointer */
    (void)state;
    hostk_base = gcomp_codec_find("topk");
    vt = *hostk_base;
    vt.name = "hostk";
    vt.wire_id = 216;
    vt.sparse_k = hostk_k;
    vt.cuda = NULL;
    assert_int_equal(gcomp_codec_register(&vt), GCOMP_SUCCESS);
    for (int mode = 1; mode <= 2; mode++)
        for (int n = 2; n <= 3; n++) {
            hostk_job jobs[3];
            memset(jobs, 0, sizeof jobs);
            hostk_mode = mode;
            assert_int_equal(pthread_barrier_init(&hostk_barrier, NULL, (unsigned)n), 0);
            loop_run_world(n, hostk_rank, jobs, sizeof jobs[0]);
            pthread_barrier_destroy(&hostk_barrier);
            for (int r = 0; r < n; r++) {
                if (jobs[r].rc[0] != GCOMP_ERR_INTERNAL || !strstr(jobs[r].msg, "hostk") ||
                    !strstr(jobs[r].msg, "sparse_k"))
                    fail_msg("mode %d, %d ranks, rank %d: %s (%s), expected GCOMP_ERR_INTERNAL naming hostk's sparse_k",
                             mode, n, r, gcomp_result_name(jobs[r].rc[0]), jobs[r].msg);
                if (jobs[r].rc[1] != GCOMP_SUCCESS)
                    fail_msg("mode %d, %d ranks, rank %d: the honest call after it gave %s", mode, n, r,
                             gcomp_result_name(jobs[r].rc[1]));
            }
        }
    hostk_mode = 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_found_and_listed),
        cmocka_unit_test(test_spec_and_round_trip),
        cmocka_unit_test(test_default_and_bad_params),
        cmocka_unit_test(test_deterministic_choice),
        cmocka_unit_test(test_error_feedback),
        cmocka_unit_test(test_chains),
        cmocka_unit_test(test_corrupt_payloads),
        cmocka_unit_test(test_register_errors),
        cmocka_unit_test(test_register_param_tables),
        cmocka_unit_test(test_register_valid_table),
        cmocka_unit_test(test_integer_entries_required),
        cmocka_unit_test(test_user_integer_codec_ring),
        cmocka_unit_test(test_register_spec_length),
        cmocka_unit_test(test_rank_keyed_summable_codec),
        cmocka_unit_test(test_codec_breaking_its_contract),
        cmocka_unit_test(test_integer_entry_breaking_its_contract),
        cmocka_unit_test(test_codec_failure_without_detail),
        cmocka_unit_test(test_sparse_k_more_than_count),
    };
    return cmocka_run_group_tests(tests, group_setup, NULL);
}
