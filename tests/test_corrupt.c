/*
 * test_corrupt.c — decoders treat payloads as untrusted input.
 *
 * For every built-in spec and a few odd counts, a valid payload is made through the public
 * API and then damaged: truncated to every length, extended, each header byte changed,
 * decoded with the wrong count or with the codec of another spec, and fuzzed with a
 * deterministic PRNG. Every damaged payload must give GCOMP_ERR_CORRUPT (or, for the fuzz,
 * SUCCESS or CORRUPT) and never a crash; the ASan build (GCOMP_SANITIZE=ON) is the check for
 * out-of-bounds access, which is why every payload and accumulator handed to a decoder is a
 * heap block of exactly its size.
 *
 * zstd chains are also unwrapped (the inner payload is the element codec's header and body)
 * and rewrapped by hand, so the inner header, the RAW path and hostile frames are reached.
 */
#include <stdio.h>
#include <string.h>
#include <zstd.h>

#include "test_util.h"
#include "gcomp_codec.h"
#include "codecs/cast.h"
#include "codecs/terngrad.h"
#include "codecs/topk.h"
#include "codecs/zstd.h"

typedef struct spec_case {
    const char *spec;
    uint16_t el_wire;  /* wire id of the element codec */
    const char *inner; /* the element codec alone, for zstd chains; NULL otherwise */
} spec_case;

static const spec_case cases[] = {
    { "none", GCOMP_WIRE_ID_NONE, NULL },
    { "fp16", GCOMP_WIRE_ID_FP16, NULL },
    { "bf16", GCOMP_WIRE_ID_BF16, NULL },
    { "terngrad", GCOMP_WIRE_ID_TERNGRAD, NULL },
    { "terngrad:bucket=8", GCOMP_WIRE_ID_TERNGRAD, NULL },
    { "terngrad:clip=2.5", GCOMP_WIRE_ID_TERNGRAD, NULL },
    { "topk:ratio=0.1", GCOMP_WIRE_ID_TOPK, NULL },
    { "topk:ratio=0.1,values=fp16", GCOMP_WIRE_ID_TOPK, NULL },
    { "fp16+zstd", GCOMP_WIRE_ID_FP16, "fp16" },
    { "topk:ratio=0.1+zstd", GCOMP_WIRE_ID_TOPK, "topk:ratio=0.1" },
    { "terngrad+zstd", GCOMP_WIRE_ID_TERNGRAD, "terngrad" },
};
#define N_CASES (sizeof cases / sizeof cases[0])

static const size_t counts[] = { 1, 7, 1001 };
#define N_COUNTS (sizeof counts / sizeof counts[0])

/* ---- helpers ------------------------------------------------------------------------------ */

typedef struct blob {
    uint8_t *p;
    size_t n;
} blob;

static gcomp_codec *make_codec(const char *spec)
{
    gcomp_codec_options o = gcomp_codec_options_default();
    gcomp_codec *c = NULL;
    gcomp_result rc;
    o.seed = 11;
    o.rank = 2;
    rc = gcomp_codec_create(spec, &o, &c);
    if (rc != GCOMP_SUCCESS) fail_msg("create '%s': %s", spec, gcomp_last_error());
    return c;
}

/* Gradient-like input with a few exact ties, so top-k and the scales see realistic data. */
static float *make_input(size_t count, uint64_t seed)
{
    float *x = tu_gauss_array(count, seed);
    for (size_t i = 5; i < count; i += 13) x[i] = (i / 13) % 2 ? 1.5f : -1.5f;
    return x;
}

static blob encode(gcomp_codec *c, const float *x, size_t count)
{
    blob b;
    size_t cap = gcomp_codec_max_encoded_bytes(c, count);
    uint8_t *buf = malloc(cap);
    gcomp_result rc = gcomp_codec_encode(c, GCOMP_KEY_NONE, x, count, GCOMP_F32, buf, cap, &b.n);
    if (rc != GCOMP_SUCCESS) fail_msg("encode '%s' x %zu: %s", gcomp_codec_spec(c), count, gcomp_last_error());
    assert_true(b.n >= GCOMP_HEADER_BYTES && b.n <= cap);
    b.p = malloc(b.n);
    memcpy(b.p, buf, b.n);
    free(buf);
    return b;
}

/* Decode bytes [0, n) of p, copied into a heap block of exactly n bytes, into a zeroed heap
 * accumulator of exactly count floats. On success the values go to out (if not NULL). */
static gcomp_result decode_exact(gcomp_codec *c, const uint8_t *p, size_t n, size_t count, float *out)
{
    uint8_t *copy = malloc(n ? n : 1);
    float *acc = calloc(count ? count : 1, sizeof(float));
    gcomp_result rc;
    if (n) memcpy(copy, p, n);
    rc = gcomp_codec_decode_add(c, copy, n, acc, count);
    if (rc == GCOMP_SUCCESS && out && count) memcpy(out, acc, count * sizeof(float));
    free(copy);
    free(acc);
    return rc;
}

#define EXPECT_RC(got, want, ...)                                                                           \
    do {                                                                                                    \
        gcomp_result got_ = (got), want_ = (want);                                                          \
        if (got_ != want_) {                                                                                \
            print_error(__VA_ARGS__);                                                                       \
            fail_msg("got %s, want %s (last error: %s)", gcomp_result_name(got_), gcomp_result_name(want_), \
                     gcomp_last_error());                                                                   \
        }                                                                                                   \
    } while (0)

static void expect_same_floats(const float *a, const float *b, size_t n, const char *what)
{
    if (n && memcmp(a, b, n * sizeof(float)) != 0) {
        for (size_t i = 0; i < n; i++)
            if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
                fail_msg("%s: element %zu decodes to %.9g, expected %.9g", what, i, a[i], b[i]);
    }
}

/* A payload plus the reference decode of it, per (spec, count). */
typedef struct fixture {
    const spec_case *sc;
    size_t count;
    gcomp_codec *codec;
    float *x;
    blob pay;
    float *ref; /* decode of pay */
} fixture;

static void fixture_make(fixture *f, const spec_case *sc, size_t count)
{
    f->sc = sc;
    f->count = count;
    f->codec = make_codec(sc->spec);
    f->x = make_input(count, 1000 + count);
    f->pay = encode(f->codec, f->x, count);
    f->ref = calloc(count ? count : 1, sizeof(float));
    EXPECT_RC(decode_exact(f->codec, f->pay.p, f->pay.n, count, f->ref), GCOMP_SUCCESS, "%s x %zu: valid payload",
              sc->spec, count);
}

static void fixture_free(fixture *f)
{
    gcomp_codec_destroy(f->codec);
    free(f->x);
    free(f->pay.p);
    free(f->ref);
}

/* ---- zstd chains: unwrap the outer stage, rewrap by hand ------------------------------------ */

/* The inner payload (element header + body) of a zstd-chain payload. */
static blob zstd_unwrap(const blob *outer)
{
    gcomp_header h;
    blob in;
    const uint8_t *body = outer->p + GCOMP_HEADER_BYTES;
    assert_int_equal(gcomp_header_read(outer->p, outer->n, &h), GCOMP_SUCCESS);
    assert_int_equal(h.wire_id, GCOMP_WIRE_ID_ZSTD);
    if (h.flags & GCOMP_ZSTD_FLAG_RAW) {
        in.n = (size_t)h.body_bytes;
        in.p = malloc(in.n);
        memcpy(in.p, body, in.n);
    } else {
        unsigned long long size = ZSTD_getFrameContentSize(body, (size_t)h.body_bytes);
        assert_true(size != ZSTD_CONTENTSIZE_UNKNOWN && size != ZSTD_CONTENTSIZE_ERROR);
        in.n = (size_t)size;
        in.p = malloc(in.n ? in.n : 1);
        assert_int_equal(ZSTD_decompress(in.p, in.n, body, (size_t)h.body_bytes), in.n);
    }
    return in;
}

/* An outer zstd payload with the given flags around an arbitrary body. */
static blob zstd_wrap_body(const uint8_t *body, size_t n, size_t count, uint32_t flags)
{
    gcomp_header h = { 0 };
    blob b;
    h.dtype = GCOMP_F32;
    h.wire_id = GCOMP_WIRE_ID_ZSTD;
    h.flags = flags;
    h.count = count;
    h.body_bytes = n;
    b.n = GCOMP_HEADER_BYTES + n;
    b.p = malloc(b.n);
    gcomp_header_write(b.p, &h);
    if (n) memcpy(b.p + GCOMP_HEADER_BYTES, body, n);
    return b;
}

/* Wrap inner bytes as the zstd stage would: a frame (raw == 0) or the RAW path. */
static blob zstd_wrap(const uint8_t *inner, size_t n, size_t count, int raw)
{
    blob b;
    size_t cap, z;
    uint8_t *frame;
    if (raw) return zstd_wrap_body(inner, n, count, GCOMP_ZSTD_FLAG_RAW);
    cap = ZSTD_compressBound(n);
    frame = malloc(cap);
    z = ZSTD_compress(frame, cap, inner, n, 1);
    assert_false(ZSTD_isError(z));
    b = zstd_wrap_body(frame, z, count, 0);
    free(frame);
    return b;
}

/* ---- per-spec tests ------------------------------------------------------------------------- */

static void test_truncation(void **state)
{
    const spec_case *sc = *state;
    for (size_t ci = 0; ci < N_COUNTS; ci++) {
        fixture f;
        fixture_make(&f, sc, counts[ci]);
        uint8_t *p = malloc(f.pay.n);
        for (size_t len = 0; len < f.pay.n; len++) {
            EXPECT_RC(decode_exact(f.codec, f.pay.p, len, f.count, NULL), GCOMP_ERR_CORRUPT,
                      "%s x %zu: payload truncated to %zu of %zu bytes\n", sc->spec, f.count, len, f.pay.n);
            if (len < GCOMP_HEADER_BYTES) continue;
            /* body_bytes made to agree with the shorter body: the codec itself must object */
            memcpy(p, f.pay.p, len);
            gcomp_store_u64(p + 24, len - GCOMP_HEADER_BYTES);
            EXPECT_RC(decode_exact(f.codec, p, len, f.count, NULL), GCOMP_ERR_CORRUPT,
                      "%s x %zu: body truncated to %zu of %zu bytes, body_bytes updated\n", sc->spec, f.count,
                      len - GCOMP_HEADER_BYTES, f.pay.n - GCOMP_HEADER_BYTES);
        }
        free(p);
        fixture_free(&f);
    }
}

static void test_trailing_bytes(void **state)
{
    const spec_case *sc = *state;
    static const size_t extra[] = { 1, 2, 7, 64 };
    for (size_t ci = 0; ci < N_COUNTS; ci++) {
        fixture f;
        fixture_make(&f, sc, counts[ci]);
        for (size_t e = 0; e < sizeof extra / sizeof extra[0]; e++) {
            for (int fill = 0; fill < 2; fill++) {
                uint8_t *p = malloc(f.pay.n + extra[e]);
                memcpy(p, f.pay.p, f.pay.n);
                memset(p + f.pay.n, fill ? 0xff : 0x00, extra[e]);
                EXPECT_RC(decode_exact(f.codec, p, f.pay.n + extra[e], f.count, NULL), GCOMP_ERR_CORRUPT,
                          "%s x %zu: %zu trailing 0x%02x bytes\n", sc->spec, f.count, extra[e], fill ? 0xff : 0);
                /* body_bytes updated to cover the extra bytes: the codec itself must object */
                gcomp_store_u64(p + 24, f.pay.n + extra[e] - GCOMP_HEADER_BYTES);
                EXPECT_RC(decode_exact(f.codec, p, f.pay.n + extra[e], f.count, NULL), GCOMP_ERR_CORRUPT,
                          "%s x %zu: %zu trailing 0x%02x bytes counted in body_bytes\n", sc->spec, f.count, extra[e],
                          fill ? 0xff : 0);
                free(p);
            }
        }
        fixture_free(&f);
    }
}

/* Every single-byte change of a 32-byte header at hdr (inside p) must be CORRUPT, except a
 * dtype byte that still names a valid gcomp dtype: the header's dtype only records what the
 * sender's tensor was, the body does not depend on it, so that payload must decode exactly
 * as before. decode(p) is what the caller runs on the damaged bytes. */
static const uint8_t header_masks[] = { 0x01, 0x02, 0x04, 0x10, 0x40, 0x80, 0xff };

static int header_change_is_harmless(size_t pos, uint8_t newval) { return pos == 5 && newval < GCOMP_DTYPE_COUNT; }

static void test_header_bytes(void **state)
{
    const spec_case *sc = *state;
    for (size_t ci = 0; ci < N_COUNTS; ci++) {
        fixture f;
        float *out;
        fixture_make(&f, sc, counts[ci]);
        out = calloc(f.count, sizeof(float));
        for (size_t pos = 0; pos < GCOMP_HEADER_BYTES; pos++) {
            for (size_t m = 0; m < sizeof header_masks; m++) {
                uint8_t *p = malloc(f.pay.n);
                gcomp_result rc;
                memcpy(p, f.pay.p, f.pay.n);
                p[pos] ^= header_masks[m];
                rc = decode_exact(f.codec, p, f.pay.n, f.count, out);
                if (header_change_is_harmless(pos, p[pos])) {
                    EXPECT_RC(rc, GCOMP_SUCCESS, "%s x %zu: header dtype byte set to %u\n", sc->spec, f.count, p[pos]);
                    expect_same_floats(out, f.ref, f.count, "dtype byte changed");
                } else {
                    EXPECT_RC(rc, GCOMP_ERR_CORRUPT, "%s x %zu: header byte %zu xor 0x%02x\n", sc->spec, f.count, pos,
                              header_masks[m]);
                }
                free(p);
            }
        }
        free(out);
        fixture_free(&f);
    }
}

static void test_wrong_count(void **state)
{
    const spec_case *sc = *state;
    for (size_t ci = 0; ci < N_COUNTS; ci++) {
        fixture f;
        size_t n = counts[ci];
        size_t wrong[] = { 0, n - 1, n + 1, 2 * n + 3, n + 1024 };
        fixture_make(&f, sc, n);
        for (size_t w = 0; w < sizeof wrong / sizeof wrong[0]; w++) {
            if (wrong[w] == n) continue;
            EXPECT_RC(decode_exact(f.codec, f.pay.p, f.pay.n, wrong[w], NULL), GCOMP_ERR_CORRUPT,
                      "%s: payload of %zu elements decoded as %zu\n", sc->spec, n, wrong[w]);
        }
        fixture_free(&f);
    }
}

/* Another spec's codec: CORRUPT when the wire ids differ anywhere in the chain. When they do
 * not (terngrad vs terngrad:clip=2.5, topk fp32 vs fp16 values), the header cannot tell the
 * specs apart and the body may be self-describing: then the decoder either rejects the body
 * or decodes exactly what the right codec decodes, nothing in between. */
static void test_other_spec(void **state)
{
    const spec_case *sc = *state;
    for (size_t ci = 0; ci < N_COUNTS; ci++) {
        fixture f;
        float *out;
        fixture_make(&f, sc, counts[ci]);
        out = calloc(f.count, sizeof(float));
        for (size_t j = 0; j < N_CASES; j++) {
            const spec_case *other = &cases[j];
            gcomp_codec *oc;
            gcomp_result rc;
            if (other == sc) continue;
            oc = make_codec(other->spec);
            rc = decode_exact(oc, f.pay.p, f.pay.n, f.count, out);
            if (other->el_wire != sc->el_wire || !other->inner != !sc->inner) {
                EXPECT_RC(rc, GCOMP_ERR_CORRUPT, "%s x %zu payload decoded by '%s'\n", sc->spec, f.count, other->spec);
            } else if (rc == GCOMP_SUCCESS) {
                expect_same_floats(out, f.ref, f.count, other->spec);
            } else {
                EXPECT_RC(rc, GCOMP_ERR_CORRUPT, "%s x %zu payload decoded by '%s'\n", sc->spec, f.count, other->spec);
            }
            gcomp_codec_destroy(oc);
        }
        free(out);
        fixture_free(&f);
    }
}

/* One random mutation of p[lo, hi). */
static void mutate(uint8_t *p, size_t lo, size_t hi, size_t count, uint64_t *rng)
{
    size_t span = hi - lo, pos = lo + (size_t)(tu_next(rng) % span);
    switch (tu_next(rng) % 5) {
    case 0: /* one bit */
    case 1:
        p[pos] ^= (uint8_t)(1u << (tu_next(rng) % 8));
        break;
    case 2:
        p[pos] = (uint8_t)tu_next(rng);
        break;
    case 3:
        p[pos] = (tu_next(rng) & 1) ? 0xff : 0x00;
        break;
    default: { /* a 64-bit field set to a value a length check might trust */
        uint64_t v[] = { 0, 1, count, count + 1, UINT64_MAX, UINT64_MAX / 2, (uint64_t)1 << 32, 64, 65 };
        uint64_t val = v[tu_next(rng) % (sizeof v / sizeof v[0])];
        size_t room = hi - pos < 8 ? hi - pos : 8;
        for (size_t k = 0; k < room; k++) p[pos + k] = (uint8_t)(val >> (8 * k));
        break;
    }
    }
}

#define FUZZ_TRIALS 1000 /* per count: 3000 per spec */

static void test_fuzz_body(void **state)
{
    const spec_case *sc = *state;
    uint64_t rng = 0xc0ffee;
    size_t ok = 0, corrupt = 0;
    for (size_t ci = 0; ci < N_COUNTS; ci++) {
        fixture f;
        uint16_t *half;
        fixture_make(&f, sc, counts[ci]);
        half = malloc(f.count * sizeof *half);
        for (size_t t = 0; t < FUZZ_TRIALS; t++) {
            uint8_t *p = malloc(f.pay.n);
            int edits = 1 + (int)(tu_next(&rng) % 4);
            /* mostly the body; one trial in ten anywhere, header included */
            size_t lo = (t % 10 == 9 || f.pay.n == GCOMP_HEADER_BYTES) ? 0 : GCOMP_HEADER_BYTES;
            gcomp_result rc;
            memcpy(p, f.pay.p, f.pay.n);
            for (int e = 0; e < edits; e++) mutate(p, lo, f.pay.n, f.count, &rng);
            if (t % 4 == 3) { /* the converting entry point too */
                rc = gcomp_codec_decode(f.codec, p, f.pay.n, half, f.count, GCOMP_F16);
            } else {
                rc = decode_exact(f.codec, p, f.pay.n, f.count, NULL);
            }
            if (rc != GCOMP_SUCCESS && rc != GCOMP_ERR_CORRUPT)
                fail_msg("%s x %zu: fuzz trial %zu gave %s (%s)", sc->spec, f.count, t, gcomp_result_name(rc),
                         gcomp_last_error());
            /* a cast body is any bit pattern: damage inside it can never be detected */
            if (lo && !sc->inner && sc->el_wire <= GCOMP_WIRE_ID_BF16) assert_int_equal(rc, GCOMP_SUCCESS);
            if (rc == GCOMP_SUCCESS)
                ok++;
            else
                corrupt++;
            free(p);
        }
        free(half);
        fixture_free(&f);
    }
    print_message("    %s: %zu fuzzed payloads decoded, %zu rejected as corrupt\n", sc->spec, ok, corrupt);
}

/* Damage aimed at what each format documents as invalid (the fuzz may miss it). zstd chains
 * get the same damage through test_zstd_inner's rewrap and fuzz; cast bodies have no invalid
 * bit pattern. */
static void test_targeted(void **state)
{
    const spec_case *sc = *state;
    for (size_t ci = 0; ci < N_COUNTS; ci++) {
        fixture f;
        uint8_t *p;
        uint8_t *body;
        fixture_make(&f, sc, counts[ci]);
        p = malloc(f.pay.n);
        body = p + GCOMP_HEADER_BYTES;
#define RESET() memcpy(p, f.pay.p, f.pay.n)
#define EXPECT_CORRUPT(what)                                                                                   \
    EXPECT_RC(decode_exact(f.codec, p, f.pay.n, f.count, NULL), GCOMP_ERR_CORRUPT, "%s x %zu: %s\n", sc->spec, \
              f.count, what)
        if (sc->el_wire == GCOMP_WIRE_ID_TERNGRAD && !sc->inner) {
            size_t nb = strstr(sc->spec, "bucket=8") ? (f.count + 7) / 8 : 1, codes = 4 * nb;
            float neg = -1.0f;
            RESET();
            body[codes] |= 3u; /* element 0's code becomes 3 */
            EXPECT_CORRUPT("code 3");
            RESET();
            memcpy(body, &neg, 4);
            EXPECT_CORRUPT("negative scale");
            if (f.count % 4) { /* an unused high bit of the last code byte set */
                RESET();
                body[f.pay.n - GCOMP_HEADER_BYTES - 1] |= 0x80;
                EXPECT_CORRUPT("unused code bits set");
            }
        } else if (sc->el_wire == GCOMP_WIRE_ID_TOPK && !sc->inner) {
            uint64_t k = gcomp_load_u64(f.pay.p + GCOMP_HEADER_BYTES);
            uint64_t bad_k[] = { 0, k - 1, k + 1, f.count + 1, UINT64_MAX, UINT64_MAX / 2 + 1 };
            for (size_t i = 0; i < sizeof bad_k / sizeof bad_k[0]; i++) {
                if (bad_k[i] == k) continue;
                RESET();
                gcomp_store_u64(body, bad_k[i]);
                EXPECT_CORRUPT("k changed");
            }
            /* the first block's header: a Rice parameter over 63 or an exponent offset wider
             * than the value type's exponent must be refused; other values only change the
             * stream's meaning (SUCCESS or CORRUPT, and no crash; test_topk checks that a
             * CORRUPT decode leaves acc alone) */
            for (unsigned field = 0; field < 3; field++) {
                const unsigned limit = field == 0                 ? 63
                                       : strstr(sc->spec, "fp16") ? (field == 1 ? 31 : 5)
                                                                  : (field == 1 ? 255 : 8);
                for (unsigned v = 0, v0 = f.pay.p[GCOMP_HEADER_BYTES + 8 + field]; v < 256; v++) {
                    gcomp_result rc;
                    if (v == v0) continue;
                    RESET();
                    body[8 + field] = (uint8_t)v;
                    rc = decode_exact(f.codec, p, f.pay.n, f.count, NULL);
                    if (v > limit) {
                        if (rc != GCOMP_ERR_CORRUPT)
                            fail_msg("%s x %zu: block field %u = %u (was %u) gave %s", sc->spec, f.count, field, v, v0,
                                     gcomp_result_name(rc));
                    } else if (rc != GCOMP_SUCCESS && rc != GCOMP_ERR_CORRUPT) {
                        fail_msg("%s x %zu: block field %u = %u gave %s", sc->spec, f.count, field, v,
                                 gcomp_result_name(rc));
                    }
                }
            }
        }
#undef RESET
#undef EXPECT_CORRUPT
        free(p);
        fixture_free(&f);
    }
}

/* ---- zstd chains: the inner payload, reached by rewrapping ---------------------------------- */

static void test_zstd_inner(void **state)
{
    const spec_case *sc = *state;
    uint64_t rng = 0xbadc0de;
    gcomp_codec *plain = make_codec(sc->inner);
    for (size_t ci = 0; ci < N_COUNTS; ci++) {
        fixture f;
        blob in, b;
        float *out, *out_plain;
        fixture_make(&f, sc, counts[ci]);
        out = calloc(f.count, sizeof(float));
        out_plain = calloc(f.count, sizeof(float));
        in = zstd_unwrap(&f.pay);
        /* the inner payload is exactly what the element codec alone writes */
        {
            gcomp_codec *fresh = make_codec(sc->inner); /* same options and step as f.codec */
            blob direct = encode(fresh, f.x, f.count);
            assert_int_equal(direct.n, in.n);
            assert_memory_equal(direct.p, in.p, in.n);
            free(direct.p);
            gcomp_codec_destroy(fresh);
        }
        /* the rewrap is valid both ways, so the failures below are the damage's doing */
        for (int raw = 0; raw < 2; raw++) {
            b = zstd_wrap(in.p, in.n, f.count, raw);
            EXPECT_RC(decode_exact(f.codec, b.p, b.n, f.count, out), GCOMP_SUCCESS, "%s: rewrapped raw=%d\n", sc->spec,
                      raw);
            expect_same_floats(out, f.ref, f.count, "rewrapped");
            free(b.p);
        }
        /* inner header: every byte */
        for (size_t pos = 0; pos < GCOMP_HEADER_BYTES; pos++) {
            for (size_t m = 0; m < sizeof header_masks; m++) {
                uint8_t *p = malloc(in.n);
                memcpy(p, in.p, in.n);
                p[pos] ^= header_masks[m];
                for (int raw = 0; raw < 2; raw++) {
                    gcomp_result rc;
                    b = zstd_wrap(p, in.n, f.count, raw);
                    rc = decode_exact(f.codec, b.p, b.n, f.count, out);
                    if (header_change_is_harmless(pos, p[pos])) {
                        EXPECT_RC(rc, GCOMP_SUCCESS, "%s: inner dtype byte %u\n", sc->spec, p[pos]);
                        expect_same_floats(out, f.ref, f.count, "inner dtype byte changed");
                    } else {
                        EXPECT_RC(rc, GCOMP_ERR_CORRUPT, "%s x %zu: inner header byte %zu xor 0x%02x, raw=%d\n",
                                  sc->spec, f.count, pos, header_masks[m], raw);
                    }
                    free(b.p);
                }
                free(p);
            }
        }
        /* inner truncation: every length on the RAW path, every 17th inside a frame */
        for (size_t len = 0; len < in.n; len++) {
            for (int raw = 1; raw >= 0; raw--) {
                if (!raw && len % 17) continue;
                b = zstd_wrap(in.p, len, f.count, raw);
                EXPECT_RC(decode_exact(f.codec, b.p, b.n, f.count, NULL), GCOMP_ERR_CORRUPT,
                          "%s x %zu: inner payload truncated to %zu of %zu, raw=%d\n", sc->spec, f.count, len, in.n,
                          raw);
                free(b.p);
            }
        }
        /* inner body fuzz: the chain must give exactly what the element codec alone gives */
        for (size_t t = 0; t < FUZZ_TRIALS / 2; t++) {
            uint8_t *p = malloc(in.n);
            gcomp_result rc, rc_plain;
            memcpy(p, in.p, in.n);
            for (int e = 0, edits = 1 + (int)(tu_next(&rng) % 3); e < edits; e++)
                mutate(p, in.n > GCOMP_HEADER_BYTES ? GCOMP_HEADER_BYTES : 0, in.n, f.count, &rng);
            b = zstd_wrap(p, in.n, f.count, (int)(t % 8 != 0));
            rc = decode_exact(f.codec, b.p, b.n, f.count, out);
            rc_plain = decode_exact(plain, p, in.n, f.count, out_plain);
            EXPECT_RC(rc, rc_plain, "%s x %zu: inner fuzz trial %zu\n", sc->spec, f.count, t);
            if (rc == GCOMP_SUCCESS) expect_same_floats(out, out_plain, f.count, "inner fuzz");
            free(b.p);
            free(p);
        }
        free(in.p);
        free(out);
        free(out_plain);
        fixture_free(&f);
    }
    gcomp_codec_destroy(plain);
}

/* ---- zstd: hostile frames -------------------------------------------------------------------- */

/* A frame that declares `declared` content bytes but holds none: magic, a frame header with
 * single-segment and an 8-byte content size, then one empty last raw block. */
static size_t forged_frame(uint8_t out[16], uint64_t declared)
{
    gcomp_store_u32(out, 0xFD2FB528u);
    out[4] = 0xE0; /* FCS field 8 bytes, single segment, no checksum, no dict id */
    gcomp_store_u64(out + 5, declared);
    out[13] = 0x01; /* last block, raw, size 0 */
    out[14] = 0x00;
    out[15] = 0x00;
    return 16;
}

static void test_zstd_declared_size(void **state)
{
    static const char *const inners[] = { "fp16", "topk:ratio=0.1" };
    static const size_t ns[] = { 1, 7, 1001 };
    size_t padded_checks = 0;
    (void)state;
    for (size_t ii = 0; ii < 2; ii++) {
        for (size_t ci = 0; ci < sizeof ns / sizeof ns[0]; ci++) {
            size_t n = ns[ci];
            char chain[64];
            gcomp_codec *c, *inner_c = make_codec(inners[ii]);
            size_t cap = gcomp_codec_max_encoded_bytes(inner_c, n); /* the receiver's bound */
            float *x = make_input(n, 5);
            blob inner = encode(inner_c, x, n), b;
            uint8_t *content = calloc(cap + 1, 1), *frame, forged[16];
            size_t fcap = ZSTD_compressBound(cap + 1), z;
            snprintf(chain, sizeof chain, "%s+zstd", inners[ii]);
            c = make_codec(chain);
            assert_true(inner.n <= cap);
            memcpy(content, inner.p, inner.n);
            frame = malloc(fcap);

            /* a genuine frame of cap + 1 bytes: declares more than the receiver accepts */
            z = ZSTD_compress(frame, fcap, content, cap + 1, 1);
            assert_false(ZSTD_isError(z));
            assert_int_equal(ZSTD_getFrameContentSize(frame, z), cap + 1);
            b = zstd_wrap_body(frame, z, n, 0);
            EXPECT_RC(decode_exact(c, b.p, b.n, n, NULL), GCOMP_ERR_CORRUPT, "%s: frame declaring %zu > %zu\n", chain,
                      cap + 1, cap);
            free(b.p);

            /* forged frames declaring cap + 1, 2^40 and 2^64 - 3 bytes (nothing that size is
             * allocated or read) */
            {
                uint64_t decl[] = { (uint64_t)cap + 1, (uint64_t)1 << 40, UINT64_MAX - 2 };
                for (size_t d = 0; d < sizeof decl / sizeof decl[0]; d++) {
                    size_t fz = forged_frame(forged, decl[d]);
                    b = zstd_wrap_body(forged, fz, n, 0);
                    EXPECT_RC(decode_exact(c, b.p, b.n, n, NULL), GCOMP_ERR_CORRUPT, "forged frame declaring %llu\n",
                              (unsigned long long)decl[d]);
                    free(b.p);
                }
                /* the forgery is well formed: declaring 0 bytes it is a valid empty frame,
                 * rejected only because an empty inner payload has no header */
                b = zstd_wrap_body(forged, forged_frame(forged, 0), n, 0);
                assert_int_equal(ZSTD_getFrameContentSize(forged, 16), 0);
                EXPECT_RC(decode_exact(c, b.p, b.n, n, NULL), GCOMP_ERR_CORRUPT, "empty frame\n");
                free(b.p);
            }

            /* the valid payload zero-padded to exactly cap bytes: zstd accepts the frame, the
             * inner header's body_bytes does not */
            if (cap > inner.n) {
                z = ZSTD_compress(frame, fcap, content, cap, 1);
                assert_false(ZSTD_isError(z));
                b = zstd_wrap_body(frame, z, n, 0);
                EXPECT_RC(decode_exact(c, b.p, b.n, n, NULL), GCOMP_ERR_CORRUPT, "%s: padded inner payload\n", chain);
                free(b.p);
                padded_checks++;
            }

            /* RAW: a body larger than the bound, and the valid payload with one extra byte */
            b = zstd_wrap_body(content, cap + 1, n, GCOMP_ZSTD_FLAG_RAW);
            EXPECT_RC(decode_exact(c, b.p, b.n, n, NULL), GCOMP_ERR_CORRUPT, "%s: RAW body of %zu > %zu\n", chain,
                      cap + 1, cap);
            free(b.p);
            b = zstd_wrap_body(content, inner.n + 1, n, GCOMP_ZSTD_FLAG_RAW);
            EXPECT_RC(decode_exact(c, b.p, b.n, n, NULL), GCOMP_ERR_CORRUPT, "%s: RAW body + 1 byte\n", chain);
            free(b.p);
            /* and the RAW path with the exact payload works */
            b = zstd_wrap_body(inner.p, inner.n, n, GCOMP_ZSTD_FLAG_RAW);
            EXPECT_RC(decode_exact(c, b.p, b.n, n, NULL), GCOMP_SUCCESS, "%s: RAW body, exact\n", chain);
            free(b.p);

            free(frame);
            free(content);
            free(inner.p);
            free(x);
            gcomp_codec_destroy(c);
            gcomp_codec_destroy(inner_c);
        }
    }
    assert_true(padded_checks > 0); /* top-k's bound leaves room for padding at n = 1001 */
}

static void test_zstd_bad_frames(void **state)
{
    const size_t n = 1001;
    gcomp_codec *c = make_codec("fp16+zstd"), *inner_c = make_codec("fp16"), *bf = make_codec("bf16");
    float *x = make_input(n, 9);
    blob inner = encode(inner_c, x, n), other = encode(bf, x, n), b;
    size_t fcap = 2 * ZSTD_compressBound(inner.n) + 64, z, z2;
    uint8_t *frame = malloc(fcap);
    ZSTD_CCtx *cctx = ZSTD_createCCtx();
    (void)state;

    z = ZSTD_compress(frame, fcap, inner.p, inner.n, 3);
    assert_false(ZSTD_isError(z));
    b = zstd_wrap_body(frame, z, n, 0);
    EXPECT_RC(decode_exact(c, b.p, b.n, n, NULL), GCOMP_SUCCESS, "hand-made frame\n");
    free(b.p);

    /* unknown flag bits, with a frame body and with a RAW body */
    {
        static const uint32_t bad[] = { 2, 3, 4, 0x100, 0x10000, 0x80000000u, 0x80000001u, 0xffffffffu };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            b = zstd_wrap_body(frame, z, n, bad[i]);
            EXPECT_RC(decode_exact(c, b.p, b.n, n, NULL), GCOMP_ERR_CORRUPT, "frame with flags 0x%x\n", bad[i]);
            free(b.p);
            b = zstd_wrap_body(inner.p, inner.n, n, bad[i] | GCOMP_ZSTD_FLAG_RAW);
            EXPECT_RC(decode_exact(c, b.p, b.n, n, NULL), GCOMP_ERR_CORRUPT, "RAW body with flags 0x%x\n",
                      bad[i] | GCOMP_ZSTD_FLAG_RAW);
            free(b.p);
        }
    }

    /* two frames back to back (each alone is valid), and a frame with a trailing byte */
    memcpy(frame + z, frame, z);
    b = zstd_wrap_body(frame, 2 * z, n, 0);
    EXPECT_RC(decode_exact(c, b.p, b.n, n, NULL), GCOMP_ERR_CORRUPT, "two frames\n");
    free(b.p);
    frame[z] = 0;
    b = zstd_wrap_body(frame, z + 1, n, 0);
    EXPECT_RC(decode_exact(c, b.p, b.n, n, NULL), GCOMP_ERR_CORRUPT, "frame + trailing byte\n");
    free(b.p);

    /* a skippable frame, alone and in front of a valid frame */
    {
        uint8_t *sk = malloc(8 + 4 + z);
        gcomp_store_u32(sk, 0x184D2A50u);
        gcomp_store_u32(sk + 4, 4);
        gcomp_store_u32(sk + 8, 0xdeadbeef);
        memcpy(sk + 12, frame, z);
        b = zstd_wrap_body(sk, 12, n, 0);
        EXPECT_RC(decode_exact(c, b.p, b.n, n, NULL), GCOMP_ERR_CORRUPT, "skippable frame\n");
        free(b.p);
        b = zstd_wrap_body(sk, 12 + z, n, 0);
        EXPECT_RC(decode_exact(c, b.p, b.n, n, NULL), GCOMP_ERR_CORRUPT, "skippable frame + frame\n");
        free(b.p);
        free(sk);
    }

    /* a frame that does not declare its content size */
    assert_false(ZSTD_isError(ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0)));
    z2 = ZSTD_compress2(cctx, frame, fcap, inner.p, inner.n);
    assert_false(ZSTD_isError(z2));
    assert_true(ZSTD_getFrameContentSize(frame, z2) == ZSTD_CONTENTSIZE_UNKNOWN);
    b = zstd_wrap_body(frame, z2, n, 0);
    EXPECT_RC(decode_exact(c, b.p, b.n, n, NULL), GCOMP_ERR_CORRUPT, "frame without a content size\n");
    free(b.p);

    /* a frame with a checksum, the checksum damaged */
    assert_false(ZSTD_isError(ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 1)));
    assert_false(ZSTD_isError(ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1)));
    z2 = ZSTD_compress2(cctx, frame, fcap, inner.p, inner.n);
    assert_false(ZSTD_isError(z2));
    b = zstd_wrap_body(frame, z2, n, 0);
    EXPECT_RC(decode_exact(c, b.p, b.n, n, NULL), GCOMP_SUCCESS, "frame with a checksum\n");
    b.p[b.n - 1] ^= 0x5a;
    EXPECT_RC(decode_exact(c, b.p, b.n, n, NULL), GCOMP_ERR_CORRUPT, "frame with a bad checksum\n");
    free(b.p);

    /* empty bodies */
    b = zstd_wrap_body(NULL, 0, n, 0);
    EXPECT_RC(decode_exact(c, b.p, b.n, n, NULL), GCOMP_ERR_CORRUPT, "empty frame body\n");
    free(b.p);
    b = zstd_wrap_body(NULL, 0, n, GCOMP_ZSTD_FLAG_RAW);
    EXPECT_RC(decode_exact(c, b.p, b.n, n, NULL), GCOMP_ERR_CORRUPT, "empty RAW body\n");
    free(b.p);

    /* a valid frame of another element codec, of the same size (bf16 instead of fp16) */
    assert_int_equal(other.n, inner.n);
    for (int raw = 0; raw < 2; raw++) {
        b = zstd_wrap(other.p, other.n, n, raw);
        EXPECT_RC(decode_exact(c, b.p, b.n, n, NULL), GCOMP_ERR_CORRUPT, "bf16 inside fp16+zstd, raw=%d\n", raw);
        free(b.p);
    }
    /* a zstd payload inside a zstd payload */
    {
        blob outer = zstd_wrap(inner.p, inner.n, n, 0);
        for (int raw = 0; raw < 2; raw++) {
            b = zstd_wrap(outer.p, outer.n, n, raw);
            EXPECT_RC(decode_exact(c, b.p, b.n, n, NULL), GCOMP_ERR_CORRUPT, "zstd inside zstd, raw=%d\n", raw);
            free(b.p);
        }
        free(outer.p);
    }

    ZSTD_freeCCtx(cctx);
    free(frame);
    free(inner.p);
    free(other.p);
    free(x);
    gcomp_codec_destroy(c);
    gcomp_codec_destroy(inner_c);
    gcomp_codec_destroy(bf);
}

/* ---- count 0 and NULL arguments ------------------------------------------------------------ */

static void test_count_zero(void **state)
{
    const spec_case *sc = *state;
    gcomp_codec *c = make_codec(sc->spec);
    blob b;
    size_t cap = gcomp_codec_max_encoded_bytes(c, 0);
    uint8_t *buf = malloc(cap);
    assert_int_equal(gcomp_codec_encode(c, GCOMP_KEY_NONE, NULL, 0, GCOMP_F32, buf, cap, &b.n), GCOMP_SUCCESS);
    b.p = buf;
    assert_int_equal(gcomp_codec_decode_add(c, b.p, b.n, NULL, 0), GCOMP_SUCCESS);
    for (size_t len = 0; len < b.n; len++)
        EXPECT_RC(decode_exact(c, b.p, len, 0, NULL), GCOMP_ERR_CORRUPT, "%s x 0: truncated to %zu\n", sc->spec, len);
    {
        uint8_t *p = malloc(b.n + 1);
        memcpy(p, b.p, b.n);
        p[b.n] = 0;
        EXPECT_RC(decode_exact(c, p, b.n + 1, 0, NULL), GCOMP_ERR_CORRUPT, "%s x 0: trailing byte\n", sc->spec);
        free(p);
    }
    EXPECT_RC(decode_exact(c, b.p, b.n, 1, NULL), GCOMP_ERR_CORRUPT, "%s: 0 elements decoded as 1\n", sc->spec);
    free(buf);
    gcomp_codec_destroy(c);
}

static void test_null_arguments(void **state)
{
    const spec_case *sc = *state;
    fixture f;
    uint16_t half[7];
    fixture_make(&f, sc, 7);
    {
        float acc[7] = { 0 };
        assert_int_equal(gcomp_codec_decode_add(f.codec, NULL, f.pay.n, acc, 7), GCOMP_ERR_INVALID_ARG);
        assert_int_equal(gcomp_codec_decode_add(f.codec, f.pay.p, f.pay.n, NULL, 7), GCOMP_ERR_INVALID_ARG);
        assert_int_equal(gcomp_codec_decode_add(f.codec, NULL, 0, acc, 0), GCOMP_ERR_INVALID_ARG);
        assert_int_equal(gcomp_codec_decode_add(NULL, f.pay.p, f.pay.n, acc, 7), GCOMP_ERR_INVALID_ARG);
        assert_int_equal(gcomp_codec_decode(f.codec, NULL, f.pay.n, acc, 7, GCOMP_F32), GCOMP_ERR_INVALID_ARG);
        assert_int_equal(gcomp_codec_decode(f.codec, f.pay.p, f.pay.n, NULL, 7, GCOMP_F32), GCOMP_ERR_INVALID_ARG);
        assert_int_equal(gcomp_codec_decode(f.codec, f.pay.p, f.pay.n, NULL, 7, GCOMP_F16), GCOMP_ERR_INVALID_ARG);
        assert_int_equal(gcomp_codec_decode(NULL, f.pay.p, f.pay.n, acc, 7, GCOMP_F32), GCOMP_ERR_INVALID_ARG);
        assert_int_equal(gcomp_codec_decode(f.codec, f.pay.p, f.pay.n, half, 7, (gcomp_dtype)9), GCOMP_ERR_INVALID_ARG);
        /* nothing was written by the refused calls */
        for (int i = 0; i < 7; i++) assert_true(acc[i] == 0.0f);
        /* the arguments were the only problem */
        assert_int_equal(gcomp_codec_decode(f.codec, f.pay.p, f.pay.n, acc, 7, GCOMP_F32), GCOMP_SUCCESS);
        expect_same_floats(acc, f.ref, 7, "after the NULL checks");
    }
    fixture_free(&f);
}

/* ---- registration of the per-spec tests ----------------------------------------------------- */

typedef struct per_spec {
    const char *what;
    CMUnitTestFunction fn;
    int zstd_only;
} per_spec;

static const per_spec per_spec_tests[] = {
    { "truncation", test_truncation, 0 },     { "trailing_bytes", test_trailing_bytes, 0 },
    { "header_bytes", test_header_bytes, 0 }, { "wrong_count", test_wrong_count, 0 },
    { "other_spec", test_other_spec, 0 },     { "fuzz_body", test_fuzz_body, 0 },
    { "count_zero", test_count_zero, 0 },     { "null_arguments", test_null_arguments, 0 },
    { "targeted", test_targeted, 0 },         { "zstd_inner", test_zstd_inner, 1 },
};

int main(void)
{
    enum {
        MAX_TESTS = N_CASES * (sizeof per_spec_tests / sizeof per_spec_tests[0]) + 8
    };
    struct CMUnitTest tests[MAX_TESTS];
    char names[MAX_TESTS][96];
    size_t n = 0;
    int rc;
    for (size_t t = 0; t < sizeof per_spec_tests / sizeof per_spec_tests[0]; t++) {
        for (size_t i = 0; i < N_CASES; i++) {
            if (per_spec_tests[t].zstd_only && !cases[i].inner) continue;
            snprintf(names[n], sizeof names[n], "%s/%s", per_spec_tests[t].what, cases[i].spec);
            tests[n] = (struct CMUnitTest){ names[n], per_spec_tests[t].fn, NULL, NULL, (void *)&cases[i] };
            n++;
        }
    }
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_zstd_declared_size);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_zstd_bad_frames);
    rc = _cmocka_run_group_tests("corrupt", tests, n, NULL, NULL);
    return rc;
}
