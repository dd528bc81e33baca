/*
 * test_codec_args.c — the buffer rules of the codec API (gcomp.h, "Buffers"): element
 * buffers (encode's src, decode's dst, decode_add's acc) aligned to their element size, a
 * payload at any address, no output overlapping the input. Checked before the host or the
 * device path runs, so the _async forms refuse the same.
 *
 *  - test_misaligned_elements: src/acc/dst one byte (and, for f32, two bytes) off their
 *    element alignment -> GCOMP_ERR_INVALID_ARG naming the buffer, nothing written; count 0
 *    reads nothing, so any address passes.
 *  - test_payload_any_alignment: a payload encoded at an odd address and decoded from there
 *    equals the aligned one byte for byte and decodes to the same values.
 *  - test_overlap: an output overlapping the input (encode dst over src, decode/decode_add
 *    over the payload) -> GCOMP_ERR_INVALID_ARG; buffers that only touch pass.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#define N 64

static const char *const SPECS[] = { "none", "fp16", "terngrad", "topk:ratio=0.25", "fp16+zstd" };
#define N_SPECS (sizeof SPECS / sizeof SPECS[0])

/* Storage aligned for anything, so base + k is exactly k bytes off alignment. */
typedef union {
    max_align_t a;
    uint8_t b[16384];
} arena;

static void expect_refused(gcomp_result rc, const char *what)
{
    if (rc != GCOMP_ERR_INVALID_ARG) print_error("%s: got %s (%s)\n", what, gcomp_result_name(rc), gcomp_last_error());
    assert_int_equal(rc, GCOMP_ERR_INVALID_ARG);
}

static void test_misaligned_elements(void **state)
{
    static arena in, out, acc;
    float x[N];
    (void)state;
    for (int i = 0; i < N; i++) x[i] = (float)i - 20.5f;
    for (size_t s = 0; s < N_SPECS; s++) {
        gcomp_codec *c = tu_codec(SPECS[s]);
        size_t cap = gcomp_codec_max_encoded_bytes(c, N), w = 7, pw = 0;
        gcomp_stats st;
        assert_true(cap <= sizeof out.b - 8);
        /* a good payload to decode from */
        assert_int_equal(gcomp_codec_encode(c, GCOMP_KEY_NONE, x, N, GCOMP_F32, out.b, cap, &pw), GCOMP_SUCCESS);
        for (size_t off = 1; off < 4; off++) {
            /* f32 src: 1, 2 and 3 bytes off; f16 src: 1 and 3 bytes off (2 is aligned) */
            memcpy(in.b + off, x, sizeof x);
            memset(out.b + 4096, 0xab, cap);
            w = 7;
            expect_refused(gcomp_codec_encode(c, 1, in.b + off, N, GCOMP_F32, out.b + 4096, cap, &w), "encode f32");
            assert_non_null(strstr(gcomp_last_error(), "src"));
            assert_non_null(strstr(gcomp_last_error(), "not aligned to its 4-byte elements"));
            assert_int_equal(w, 0);
            assert_int_equal(out.b[4096], 0xab); /* nothing written */
            expect_refused(gcomp_codec_encode_async(c, 1, in.b + off, N, GCOMP_F32, out.b + 4096, cap, &w, NULL),
                           "encode_async f32");
            if (off % 2) {
                expect_refused(gcomp_codec_encode(c, 1, in.b + off, N, GCOMP_F16, out.b + 4096, cap, &w), "encode f16");
                assert_non_null(strstr(gcomp_last_error(), "not aligned to its 2-byte elements"));
                expect_refused(gcomp_codec_decode(c, out.b, pw, acc.b + off, N, GCOMP_BF16), "decode bf16");
                expect_refused(gcomp_codec_decode_async(c, out.b, pw, acc.b + off, N, GCOMP_F16, NULL),
                               "decode_async f16");
            }
            memset(acc.b, 0x5c, sizeof acc.b);
            expect_refused(gcomp_codec_decode_add(c, out.b, pw, (float *)(void *)(acc.b + off), N), "decode_add");
            assert_non_null(strstr(gcomp_last_error(), "acc"));
            expect_refused(gcomp_codec_decode_add_async(c, out.b, pw, (float *)(void *)(acc.b + off), N, NULL),
                           "decode_add_async");
            expect_refused(gcomp_codec_decode(c, out.b, pw, acc.b + off, N, GCOMP_F32), "decode f32");
            for (size_t i = 0; i < 64; i++) assert_int_equal(acc.b[i], 0x5c); /* untouched */
        }
        /* the refused calls counted nothing and kept no residual */
        assert_int_equal(gcomp_codec_stats_get(c, &st), GCOMP_SUCCESS);
        assert_int_equal(st.encode_calls, 1);
        assert_int_equal(st.decode_calls, 0);
        assert_int_equal(gcomp_codec_residual_get(c, 1, x, N), GCOMP_ERR_INVALID_ARG);
        /* count 0 reads and writes no element: any address passes */
        assert_int_equal(gcomp_codec_encode(c, 2, in.b + 1, 0, GCOMP_F32, out.b + 4096, cap, &w), GCOMP_SUCCESS);
        assert_int_equal(gcomp_codec_decode_add(c, out.b + 4096, w, (float *)(void *)(acc.b + 1), 0), GCOMP_SUCCESS);
        gcomp_codec_destroy(c);
    }
}

static void test_payload_any_alignment(void **state)
{
    static arena pay;
    float x[N], a[N], b[N];
    uint8_t ref[8192];
    (void)state;
    for (int i = 0; i < N; i++) x[i] = 0.37f * (float)(i * i % 17) - 3.0f;
    for (size_t s = 0; s < N_SPECS; s++) {
        for (size_t off = 0; off < 8; off++) {
            gcomp_codec *c = tu_codec(SPECS[s]), *d = tu_codec(SPECS[s]);
            size_t cap = gcomp_codec_max_encoded_bytes(c, N), w0 = 0, w = 0;
            assert_true(cap <= sizeof ref && cap + off <= sizeof pay.b);
            /* two fresh objects, the same key and step: the same payload */
            assert_int_equal(gcomp_codec_encode(c, 3, x, N, GCOMP_F32, ref, cap, &w0), GCOMP_SUCCESS);
            assert_int_equal(gcomp_codec_encode(d, 3, x, N, GCOMP_F32, pay.b + off, cap, &w), GCOMP_SUCCESS);
            assert_int_equal(w, w0);
            assert_memory_equal(pay.b + off, ref, w);
            assert_int_equal(gcomp_codec_decode(c, ref, w0, a, N, GCOMP_F32), GCOMP_SUCCESS);
            assert_int_equal(gcomp_codec_decode(d, pay.b + off, w, b, N, GCOMP_F32), GCOMP_SUCCESS);
            assert_memory_equal(a, b, sizeof a);
            gcomp_codec_destroy(c);
            gcomp_codec_destroy(d);
        }
    }
}

static void test_overlap(void **state)
{
    static arena m;
    float x[N];
    (void)state;
    for (int i = 0; i < N; i++) x[i] = (float)(i % 7) - 3.0f;
    for (size_t s = 0; s < N_SPECS; s++) {
        gcomp_codec *c = tu_codec(SPECS[s]);
        size_t cap = gcomp_codec_max_encoded_bytes(c, N), w = 0, pw = 0;
        uint8_t *src = m.b, *pay = m.b + 4096;
        memcpy(src, x, sizeof x);
        /* encode: dst over the tail of src, dst == src, src inside dst */
        expect_refused(gcomp_codec_encode(c, 1, src, N, GCOMP_F32, src + sizeof x - 4, cap, &w), "encode dst over src");
        assert_non_null(strstr(gcomp_last_error(), "overlaps"));
        expect_refused(gcomp_codec_encode(c, 1, src, N, GCOMP_F32, src, cap, &w), "encode dst == src");
        expect_refused(gcomp_codec_encode_async(c, 1, src + 8, N, GCOMP_F32, src, cap, &w, NULL), "encode_async");
        /* touching is fine: dst right after src */
        assert_int_equal(gcomp_codec_encode(c, 1, src, N, GCOMP_F32, src + sizeof x, cap, &w), GCOMP_SUCCESS);
        memmove(pay, src + sizeof x, w);
        pw = w;
        /* decode_add / decode: the output over the payload */
        expect_refused(gcomp_codec_decode_add(c, pay, pw, (float *)(void *)(pay + pw - 4), N), "decode_add over");
        expect_refused(gcomp_codec_decode_add_async(c, pay, pw, (float *)(void *)(pay - 8), N, NULL),
                       "decode_add_async over");
        expect_refused(gcomp_codec_decode(c, pay, pw, pay, N, GCOMP_F32), "decode dst == payload");
        expect_refused(gcomp_codec_decode_async(c, pay, pw, pay - 2 * N + 2, N, GCOMP_F16, NULL), "decode_async f16");
        /* touching: acc ends where the payload starts */
        memset(pay - sizeof x, 0, sizeof x);
        assert_int_equal(gcomp_codec_decode(c, pay, pw, pay - sizeof x, N, GCOMP_F32), GCOMP_SUCCESS);
        gcomp_codec_destroy(c);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_misaligned_elements),
        cmocka_unit_test(test_payload_any_alignment),
        cmocka_unit_test(test_overlap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
