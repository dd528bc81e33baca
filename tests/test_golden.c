/*
 * test_golden.c — the golden files in tests/golden freeze every built-in codec's wire format.
 *
 * For each case of golden/golden_cases.h:
 *  - the payload header says what it should (magic, version, dtype, wire id, count, length);
 *  - decoding the golden payload gives <name>.out.bin bit for bit;
 *  - re-encoding the same input with the same options gives the golden bytes exactly.
 *    zstd chains are the exception: a frame's bytes depend on the libzstd version, so for
 *    them the body is unwrapped with libzstd (decompression is version-independent) and must
 *    equal the element codec's golden payload byte for byte, and a re-encode must decode to
 *    the same values;
 *  - the payload follows the format its codec header documents, checked here by code written
 *    from that documentation (not by the codec): the cast bodies, terngrad's scales and
 *    stochastic codes, top-k's gap blocks and its choice of elements (ties to the lower index).
 *
 * A failure here means a wire-format change. See tests/golden/README.md before regenerating.
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
#include "golden/golden_cases.h"

#define GOLDEN_MAX_FILE (20 * 1024)

typedef struct bytes {
    uint8_t *p;
    size_t n;
} bytes;

static bytes load(const char *name, const char *suffix)
{
    char path[1024];
    bytes b = { NULL, 0 };
    FILE *f;
    long len;
    snprintf(path, sizeof path, "%s/%s%s", GCOMP_GOLDEN_DIR, name, suffix);
    f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s (see tests/golden/README.md)", path);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    len = ftell(f);
    assert_true(len >= 0);
    rewind(f);
    b.n = (size_t)len;
    b.p = malloc(b.n ? b.n : 1);
    assert_int_equal(fread(b.p, 1, b.n, f), b.n);
    fclose(f);
    return b;
}

static gcomp_codec *golden_codec(const char *spec)
{
    gcomp_codec_options o = golden_options();
    gcomp_codec *c = NULL;
    if (gcomp_codec_create(spec, &o, &c) != GCOMP_SUCCESS) fail_msg("create '%s': %s", spec, gcomp_last_error());
    return c;
}

/* The first encode of a fresh codec object, exactly as make_golden does it. */
static bytes golden_encode(const char *spec, const float *x)
{
    gcomp_codec *c = golden_codec(spec);
    bytes b;
    size_t cap = gcomp_codec_max_encoded_bytes(c, GOLDEN_COUNT);
    b.p = malloc(cap);
    assert_int_equal(gcomp_codec_encode(c, GCOMP_KEY_NONE, x, GOLDEN_COUNT, GCOMP_F32, b.p, cap, &b.n), GCOMP_SUCCESS);
    gcomp_codec_destroy(c);
    return b;
}

static void expect_same_bytes(const uint8_t *got, size_t got_n, const uint8_t *want, size_t want_n, const char *what)
{
    size_t n = got_n < want_n ? got_n : want_n;
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i])
            fail_msg("%s: byte %zu is 0x%02x, golden has 0x%02x (sizes %zu and %zu)", what, i, got[i], want[i], got_n,
                     want_n);
    if (got_n != want_n) fail_msg("%s: %zu bytes, golden has %zu", what, got_n, want_n);
}

static void expect_same_floats(const float *got, const void *want, const char *what)
{
    for (size_t i = 0; i < GOLDEN_COUNT; i++) {
        float w;
        memcpy(&w, (const uint8_t *)want + 4 * i, 4);
        if (memcmp(&got[i], &w, 4) != 0) fail_msg("%s: element %zu is %.9g, golden has %.9g", what, i, got[i], w);
    }
}

static float *decode_all(const char *spec, const bytes *payload)
{
    gcomp_codec *c = golden_codec(spec);
    float *out = malloc(GOLDEN_COUNT * sizeof *out);
    gcomp_result rc = gcomp_codec_decode(c, payload->p, payload->n, out, GOLDEN_COUNT, GCOMP_F32);
    if (rc != GCOMP_SUCCESS) fail_msg("decode golden '%s': %s", spec, gcomp_last_error());
    gcomp_codec_destroy(c);
    return out;
}

/* The inner payload of a zstd payload, by libzstd directly. */
static bytes unwrap_zstd(const bytes *outer)
{
    gcomp_header h;
    bytes in;
    const uint8_t *body = outer->p + GCOMP_HEADER_BYTES;
    assert_int_equal(gcomp_header_read(outer->p, outer->n, &h), GCOMP_SUCCESS);
    assert_int_equal(h.wire_id, GCOMP_WIRE_ID_ZSTD);
    assert_true(h.flags == 0 || h.flags == GCOMP_ZSTD_FLAG_RAW);
    if (h.flags & GCOMP_ZSTD_FLAG_RAW) {
        in.n = (size_t)h.body_bytes;
        in.p = malloc(in.n);
        memcpy(in.p, body, in.n);
    } else {
        unsigned long long size = ZSTD_getFrameContentSize(body, (size_t)h.body_bytes);
        assert_true(size < ZSTD_CONTENTSIZE_ERROR);
        in.n = (size_t)size;
        in.p = malloc(in.n ? in.n : 1);
        assert_int_equal(ZSTD_decompress(in.p, in.n, body, (size_t)h.body_bytes), in.n);
    }
    return in;
}

/* ---- the documented formats, checked independently of the codecs ----------------------------- */

static void check_header_fields(const uint8_t *p, size_t n, uint16_t wire_id)
{
    assert_true(n >= GCOMP_HEADER_BYTES);
    assert_memory_equal(p, "GCMP", 4);
    assert_int_equal(p[4], GCOMP_FORMAT_VERSION);
    assert_int_equal(p[5], GCOMP_F32);
    assert_int_equal(p[6] | p[7] << 8, wire_id);
    assert_int_equal(gcomp_load_u32(p + 12), 0);
    assert_int_equal(gcomp_load_u64(p + 16), GOLDEN_COUNT);
    assert_int_equal(gcomp_load_u64(p + 24), n - GCOMP_HEADER_BYTES);
}

static void check_cast(const uint8_t *p, size_t n, uint16_t wire_id, const float *x)
{
    const uint8_t *body = p + GCOMP_HEADER_BYTES;
    assert_int_equal(gcomp_load_u32(p + 8), 0); /* flags */
    if (wire_id == GCOMP_WIRE_ID_NONE) {
        assert_int_equal(n, GCOMP_HEADER_BYTES + 4 * GOLDEN_COUNT);
        assert_memory_equal(body, x, 4 * GOLDEN_COUNT); /* every bit, -0 included */
        return;
    }
    assert_int_equal(n, GCOMP_HEADER_BYTES + 2 * GOLDEN_COUNT);
    /* the pinned rounding corner cases of golden_input, as hand-computed bit patterns */
    if (wire_id == GCOMP_WIRE_ID_FP16) {
        assert_int_equal(body[2 * 3] | body[2 * 3 + 1] << 8, 0x8000);   /* -0 */
        assert_int_equal(body[2 * 5] | body[2 * 5 + 1] << 8, 0x0000);   /* 2^-130 underflows */
        assert_int_equal(body[2 * 6] | body[2 * 6 + 1] << 8, 0x3c00);   /* 1 + 2^-11 ties to 1.0 */
        assert_int_equal(body[2 * 9] | body[2 * 9 + 1] << 8, 0x3800);   /* 0.5 */
        assert_int_equal(body[2 * 19] | body[2 * 19 + 1] << 8, 0xb800); /* -0.5 */
    } else {
        assert_int_equal(body[2 * 3] | body[2 * 3 + 1] << 8, 0x8000); /* -0 */
        assert_int_equal(body[2 * 5] | body[2 * 5 + 1] << 8, 0x0008); /* 2^-130 = 2^19 f32 ulps */
        assert_int_equal(body[2 * 7] | body[2 * 7 + 1] << 8, 0xbf80); /* -(1 + 2^-8) ties to -1.0 */
        assert_int_equal(body[2 * 9] | body[2 * 9 + 1] << 8, 0x3f00); /* 0.5 */
    }
    /* and everywhere: the value is the input to the format's precision, rounded to nearest */
    for (size_t i = 0; i < GOLDEN_COUNT; i++) {
        uint16_t h = (uint16_t)(body[2 * i] | body[2 * i + 1] << 8);
        float v = wire_id == GCOMP_WIRE_ID_FP16 ? gcomp_f16_to_f32(h) : gcomp_bf16_to_f32(h);
        float rel = wire_id == GCOMP_WIRE_ID_FP16 ? 0x1p-11f : 0x1p-8f;
        float tol = fabsf(x[i]) * rel + (wire_id == GCOMP_WIRE_ID_FP16 ? 0x1p-25f : 0.0f);
        if (!(fabsf(v - x[i]) <= tol)) fail_msg("element %zu: %.9g encoded as %.9g", i, x[i], v);
    }
}

/* Where terngrad.h puts element i's 2-bit code: each bucket's codes start at byte
 * (bucket start) / 4, in tiles of GCOMP_TG_TILE elements from the bucket start; in a tile of
 * m elements (q = ceil(m / 4) bytes) element k sits in byte k % q at bits 2 * (k / q). */
static void tg_code_slot(size_t i, size_t B, size_t n, size_t *byte, unsigned *shift)
{
    size_t a = i / B * B, end = a + B < n ? a + B : n;
    size_t ts = a + (i - a) / GCOMP_TG_TILE * GCOMP_TG_TILE;
    size_t m = end - ts < GCOMP_TG_TILE ? end - ts : GCOMP_TG_TILE, q = (m + 3) / 4, k = i - ts;
    *byte = ts / 4 + k % q;
    *shift = (unsigned)(2 * (k / q));
}

/* terngrad.h: scales, then the planar 2-bit codes; code i is gcomp_tg_code(x_i, s_j, u_i)
 * with the documented key and uniform. The whole code array is rebuilt here and compared,
 * unused bits included. */
static void check_terngrad(const uint8_t *p, size_t n, const gcomp_terngrad_params *prm, const float *x,
                           const float *out)
{
    const uint8_t *body = p + GCOMP_HEADER_BYTES;
    size_t B = prm->bucket > 0 ? (size_t)prm->bucket : GOLDEN_COUNT;
    size_t nb = (GOLDEN_COUNT + B - 1) / B, codes_at = 4 * nb, code_bytes = (GOLDEN_COUNT + 3) / 4;
    uint64_t key = gcomp_tg_key(GOLDEN_SEED, 0, GOLDEN_RANK);
    uint8_t want_codes[(GOLDEN_COUNT + 3) / 4] = { 0 };
    size_t nonzero = 0;
    assert_int_equal(gcomp_load_u32(p + 8), 0);
    assert_int_equal(n, GCOMP_HEADER_BYTES + 4 * nb + code_bytes);
    for (size_t j = 0; j < nb; j++) {
        size_t a = j * B, m = GOLDEN_COUNT - a < B ? GOLDEN_COUNT - a : B;
        float s = 0.0f, got;
        for (size_t i = a; i < a + m; i++) s = fabsf(x[i]) > s ? fabsf(x[i]) : s;
        if (prm->clip > 0) {
            double c = prm->clip * gcomp__tg_rms(x + a, NULL, m);
            if (c < (double)s) s = (float)c;
        }
        memcpy(&got, body + 4 * j, 4);
        if (memcmp(&got, &s, 4) != 0) fail_msg("bucket %zu: scale %.9g, documented rule gives %.9g", j, got, s);
        for (size_t i = a; i < a + m; i++) {
            unsigned want = gcomp_tg_code(x[i], s, gcomp_tg_uniform(key, i)), shift;
            float t = want == 1 ? 1.0f : want == 2 ? -1.0f : 0.0f;
            size_t byte;
            tg_code_slot(i, B, GOLDEN_COUNT, &byte, &shift);
            assert_true(byte < code_bytes);
            assert_int_equal((want_codes[byte] >> shift) & 3u, 0); /* no two elements share a slot */
            want_codes[byte] |= (uint8_t)(want << shift);
            if (out[i] != t * s) fail_msg("element %zu: decodes to %.9g, not %.9g", i, out[i], t * s);
            nonzero += want != 0;
        }
    }
    for (size_t b = 0; b < code_bytes; b++)
        if (body[codes_at + b] != want_codes[b])
            fail_msg("code byte %zu is 0x%02x, the documented rule and layout give 0x%02x", b, body[codes_at + b],
                     want_codes[b]);
    assert_true(nonzero > 0 && nonzero < GOLDEN_COUNT); /* the codes say something */
}

/* Read w bits at bit offset pos, LSB first, one bit at a time. */
static uint64_t read_bits(const uint8_t *p, size_t pos, unsigned w)
{
    uint64_t v = 0;
    for (unsigned b = 0; b < w; b++, pos++) v |= (uint64_t)((p[pos / 8] >> (pos % 8)) & 1u) << b;
    return v;
}

/* topk.h, format 2: u64 k, blocks of 128 pairs (u8 Rice parameter, u8 exponent base, u8 offset
 * width, then Rice gaps and sign/offset/mantissa values in one LSB-first stream). The
 * kept set is recomputed here: the k largest (bits & 0x7fffffff), ties to the lower index. */
static float g_x[GOLDEN_COUNT];

static int cmp_topk(const void *a, const void *b)
{
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    uint32_t ki = gcomp_f32_bits(g_x[i]) & 0x7fffffffu, kj = gcomp_f32_bits(g_x[j]) & 0x7fffffffu;
    if (ki != kj) return ki > kj ? -1 : 1;
    return i < j ? -1 : 1;
}

static int cmp_index(const void *a, const void *b)
{
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    return i < j ? -1 : (i > j);
}

static void check_topk(const uint8_t *p, size_t n, int fp16, const float *x, const float *out)
{
    const uint8_t *body = p + GCOMP_HEADER_BYTES;
    const size_t k = 101; /* ceil(0.1 * 1001) */
    size_t order[GOLDEN_COUNT], got_idx[GOLDEN_COUNT], pos = 8, prev_end = 0;
    uint32_t got_val[GOLDEN_COUNT];
    memcpy(g_x, x, sizeof g_x);
    assert_int_equal(gcomp_load_u32(p + 8), fp16 ? GCOMP_TOPK_FLAG_FP16 : 0);
    assert_int_equal(gcomp_load_u64(body), k);
    for (size_t b = 0; b * 128 < k; b++) {
        size_t m = k - b * 128 < 128 ? k - b * 128 : 128, bit = 0;
        unsigned rice = body[pos], e0 = body[pos + 1], ew = body[pos + 2];
        const unsigned ebits = fp16 ? 5 : 8, mbits = fp16 ? 10 : 23;
        assert_true(rice <= 63 && ew <= ebits);
        pos += 3;
        for (size_t j = 0; j < m; j++) {
            uint64_t q = 0, gap, sign, off, mant;
            while (read_bits(body + pos, bit++, 1)) q++; /* q ones, then a zero */
            gap = q << rice | read_bits(body + pos, bit, rice);
            bit += rice;
            sign = read_bits(body + pos, bit, 1);
            off = read_bits(body + pos, bit + 1, ew);
            mant = read_bits(body + pos, bit + 1 + ew, mbits);
            bit += 1 + ew + mbits;
            got_idx[b * 128 + j] = prev_end + (size_t)gap;
            prev_end = got_idx[b * 128 + j] + 1;
            got_val[b * 128 + j] = (uint32_t)(sign << (ebits + mbits) | (e0 + off) << mbits | mant);
        }
        if (bit % 8) assert_int_equal(body[pos + bit / 8] >> (bit % 8), 0); /* zero padding */
        pos += (bit + 7) / 8;
    }
    assert_int_equal(n - GCOMP_HEADER_BYTES, pos);
    for (size_t i = 0; i < GOLDEN_COUNT; i++) order[i] = i;
    qsort(order, GOLDEN_COUNT, sizeof order[0], cmp_topk);
    qsort(order, k, sizeof order[0], cmp_index);
    for (size_t j = 0; j < k; j++) {
        size_t i = got_idx[j];
        float v;
        if (i != order[j]) fail_msg("kept element %zu is index %zu, the documented choice is %zu", j, i, order[j]);
        if (fp16) {
            assert_int_equal(got_val[j], gcomp_f32_to_f16(x[i]));
            v = gcomp_f16_to_f32((uint16_t)got_val[j]);
        } else {
            memcpy(&v, &got_val[j], 4);
            assert_memory_equal(&v, &x[i], 4);
        }
        assert_memory_equal(&out[i], &v, 4);
    }
    /* everything not kept decodes to +0 */
    for (size_t i = 0, j = 0; i < GOLDEN_COUNT; i++) {
        if (j < k && order[j] == i) {
            j++;
            continue;
        }
        assert_int_equal(gcomp_f32_bits(out[i]), 0);
    }
}

/* The element codec's payload against its documented format. */
static void check_format(const char *el_spec, const uint8_t *p, size_t n, const float *x, const float *out)
{
    gcomp_header h;
    assert_int_equal(gcomp_header_read(p, n, &h), GCOMP_SUCCESS);
    check_header_fields(p, n, h.wire_id);
    if (strcmp(el_spec, "none") == 0) {
        assert_int_equal(h.wire_id, GCOMP_WIRE_ID_NONE);
        check_cast(p, n, h.wire_id, x);
    } else if (strcmp(el_spec, "fp16") == 0) {
        assert_int_equal(h.wire_id, GCOMP_WIRE_ID_FP16);
        check_cast(p, n, h.wire_id, x);
    } else if (strcmp(el_spec, "bf16") == 0) {
        assert_int_equal(h.wire_id, GCOMP_WIRE_ID_BF16);
        check_cast(p, n, h.wire_id, x);
    } else if (strncmp(el_spec, "terngrad", 8) == 0) {
        gcomp_terngrad_params prm = { 0, 0.0 };
        assert_int_equal(h.wire_id, GCOMP_WIRE_ID_TERNGRAD);
        if (strstr(el_spec, "bucket=8")) prm.bucket = 8;
        if (strstr(el_spec, "clip=2.5")) prm.clip = 2.5;
        check_terngrad(p, n, &prm, x, out);
    } else if (strncmp(el_spec, "topk", 4) == 0) {
        assert_int_equal(h.wire_id, GCOMP_WIRE_ID_TOPK);
        check_topk(p, n, strstr(el_spec, "values=fp16") != NULL, x, out);
    } else {
        fail_msg("no format check for '%s'", el_spec);
    }
}

/* ---- the tests -------------------------------------------------------------------------------- */

static void test_golden_case(void **state)
{
    const char *spec = *state;
    char name[GOLDEN_NAME_MAX], inner_buf[GOLDEN_NAME_MAX];
    const char *inner = golden_inner_spec(spec, inner_buf);
    float x[GOLDEN_COUNT], *dec;
    bytes bin, out, again;
    golden_input(x, GOLDEN_COUNT);
    golden_name(spec, name);
    bin = load(name, ".bin");
    out = load(name, ".out.bin");
    assert_true(bin.n <= GOLDEN_MAX_FILE && out.n <= GOLDEN_MAX_FILE);
    assert_int_equal(out.n, 4 * GOLDEN_COUNT);
    check_header_fields(bin.p, bin.n, inner ? GCOMP_WIRE_ID_ZSTD : ((bin.p[6] | bin.p[7] << 8)));

    /* the golden payload decodes to the golden values, bit for bit */
    dec = decode_all(spec, &bin);
    expect_same_floats(dec, out.p, "decode of the golden payload");
    again = golden_encode(spec, x);

    if (!inner) {
        /* this library writes the same bytes today */
        expect_same_bytes(again.p, again.n, bin.p, bin.n, "re-encode");
        check_format(spec, bin.p, bin.n, x, dec);
    } else {
        /* zstd: the frame's bytes are libzstd's business; what it holds is ours */
        char inner_name[GOLDEN_NAME_MAX];
        bytes inner_bin, inner_out, unwrapped, unwrapped_again;
        float *dec_again;
        golden_name(inner, inner_name);
        inner_bin = load(inner_name, ".bin");
        inner_out = load(inner_name, ".out.bin");
        unwrapped = unwrap_zstd(&bin);
        expect_same_bytes(unwrapped.p, unwrapped.n, inner_bin.p, inner_bin.n, "inner payload of the golden frame");
        assert_memory_equal(out.p, inner_out.p, out.n);
        /* a re-encode round-trips to the golden values and holds the same inner payload */
        dec_again = decode_all(spec, &again);
        expect_same_floats(dec_again, out.p, "decode of a re-encode");
        unwrapped_again = unwrap_zstd(&again);
        expect_same_bytes(unwrapped_again.p, unwrapped_again.n, inner_bin.p, inner_bin.n,
                          "inner payload of a re-encode");
        check_format(inner, unwrapped.p, unwrapped.n, x, dec);
        free(inner_bin.p), free(inner_out.p), free(unwrapped.p), free(unwrapped_again.p), free(dec_again);
    }
    free(dec), free(bin.p), free(out.p), free(again.p);
}

/* The input has what the cases rely on: top-k's threshold falls inside the run of ties. */
static void test_input(void **state)
{
    float x[GOLDEN_COUNT], y[GOLDEN_COUNT];
    size_t above = 0, ties = 0;
    (void)state;
    golden_input(x, GOLDEN_COUNT);
    golden_input(y, GOLDEN_COUNT);
    assert_memory_equal(x, y, sizeof x);
    for (size_t i = 0; i < GOLDEN_COUNT; i++) {
        above += fabsf(x[i]) > GOLDEN_TIE;
        ties += fabsf(x[i]) == GOLDEN_TIE;
    }
    assert_true(above < 101 && above + ties > 101);
    assert_true(signbit(x[3]) && x[3] == 0.0f);
}

/* Names are unique, so no case overwrites another's files. */
static void test_names(void **state)
{
    char a[GOLDEN_NAME_MAX], b[GOLDEN_NAME_MAX];
    (void)state;
    golden_name("topk:ratio=0.1+zstd", a);
    assert_string_equal(a, "topk_ratio_0.1_zstd");
    for (size_t i = 0; i < GOLDEN_N_SPECS; i++)
        for (size_t j = i + 1; j < GOLDEN_N_SPECS; j++) {
            golden_name(golden_specs[i], a);
            golden_name(golden_specs[j], b);
            assert_string_not_equal(a, b);
        }
}

int main(void)
{
    struct CMUnitTest tests[GOLDEN_N_SPECS + 2];
    char names[GOLDEN_N_SPECS][GOLDEN_NAME_MAX + 8];
    size_t n = 0;
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_input);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_names);
    for (size_t i = 0; i < GOLDEN_N_SPECS; i++) {
        snprintf(names[i], sizeof names[i], "golden/%s", golden_specs[i]);
        tests[n++] = (struct CMUnitTest){ names[i], test_golden_case, NULL, NULL, (void *)golden_specs[i] };
    }
    return _cmocka_run_group_tests("golden", tests, n, NULL, NULL);
}
