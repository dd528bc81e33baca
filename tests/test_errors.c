/* test_errors.c — result codes, messages, dtype sizes and argument checking of the API. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fcntl.h>
#include <unistd.h>

#include "test_util.h"
#include "gcomp_codec.h"
#include "config.h"
#include "transport_loop.h"

static void test_result_strings(void **state)
{
    (void)state;
    for (int rc = GCOMP_SUCCESS; rc <= GCOMP_ERR_INTERNAL; rc++) {
        assert_true(strlen(gcomp_strerror((gcomp_result)rc)) > 3);
        assert_non_null(strstr(gcomp_result_name((gcomp_result)rc), "GCOMP_"));
        for (int other = rc + 1; other <= GCOMP_ERR_INTERNAL; other++)
            assert_string_not_equal(gcomp_strerror((gcomp_result)rc), gcomp_strerror((gcomp_result)other));
    }
    assert_string_equal(gcomp_result_name(GCOMP_ERR_CORRUPT), "GCOMP_ERR_CORRUPT");
    assert_string_equal(gcomp_strerror((gcomp_result)999), "unknown result code");
}

static void test_dtype_size(void **state)
{
    (void)state;
    assert_int_equal(gcomp_dtype_size(GCOMP_F32), 4);
    assert_int_equal(gcomp_dtype_size(GCOMP_F16), 2);
    assert_int_equal(gcomp_dtype_size(GCOMP_BF16), 2);
    assert_int_equal(gcomp_dtype_size((gcomp_dtype)7), 0);
}

static void test_null_arguments(void **state)
{
    gcomp_codec *c = tu_codec("fp16");
    float x[4] = { 1, 2, 3, 4 };
    uint8_t buf[256];
    size_t w;
    (void)state;
    gcomp_codec_destroy(NULL); /* accepted, does nothing */
    assert_int_equal(gcomp_codec_create("fp16", NULL, NULL), GCOMP_ERR_INVALID_ARG);
    assert_int_equal(gcomp_codec_encode(NULL, 1, x, 4, GCOMP_F32, buf, sizeof buf, &w), GCOMP_ERR_INVALID_ARG);
    assert_int_equal(gcomp_codec_encode(c, 1, NULL, 4, GCOMP_F32, buf, sizeof buf, &w), GCOMP_ERR_INVALID_ARG);
    assert_non_null(strstr(gcomp_last_error(), "NULL"));
    assert_int_equal(gcomp_codec_encode(c, 1, x, 4, GCOMP_F32, NULL, sizeof buf, &w), GCOMP_ERR_INVALID_ARG);
    assert_int_equal(gcomp_codec_encode(c, 1, x, 4, GCOMP_F32, buf, sizeof buf, NULL), GCOMP_ERR_INVALID_ARG);
    assert_int_equal(gcomp_codec_encode(c, 1, x, 4, (gcomp_dtype)9, buf, sizeof buf, &w), GCOMP_ERR_INVALID_ARG);
    assert_non_null(strstr(gcomp_last_error(), "dtype"));
    assert_int_equal(gcomp_codec_decode_add(c, NULL, 10, x, 4), GCOMP_ERR_INVALID_ARG);
    assert_int_equal(gcomp_codec_decode(c, NULL, 0, NULL, 0, GCOMP_F32), GCOMP_ERR_INVALID_ARG);
    assert_non_null(strstr(gcomp_last_error(), "gcomp_codec_decode: NULL codec or payload"));
    assert_int_equal(gcomp_codec_decode_async(NULL, buf, 10, x, 4, GCOMP_F32, NULL), GCOMP_ERR_INVALID_ARG);
    assert_non_null(strstr(gcomp_last_error(), "gcomp_codec_decode_async:"));
    assert_int_equal(gcomp_codec_decode_add(c, buf, 10, NULL, 4), GCOMP_ERR_INVALID_ARG);
    assert_int_equal(gcomp_codec_stats_get(c, NULL), GCOMP_ERR_INVALID_ARG);
    /* the file forms of the checkpoint calls name themselves, not the buffer forms */
    assert_int_equal(gcomp_comm_residuals_save_file(NULL, "/tmp/gcomp_never_written"), GCOMP_ERR_INVALID_ARG);
    assert_non_null(strstr(gcomp_last_error(), "gcomp_comm_residuals_save_file: NULL comm"));
    assert_int_equal(gcomp_comm_residuals_load_file(NULL, "/tmp/gcomp_never_written"), GCOMP_ERR_INVALID_ARG);
    assert_non_null(strstr(gcomp_last_error(), "gcomp_comm_residuals_load_file: NULL comm"));
    assert_int_equal(gcomp_codec_residual_get(c, 42, x, 4), GCOMP_ERR_INVALID_ARG);
    assert_int_equal(gcomp_codec_max_encoded_bytes(NULL, 10), 0);
    gcomp_codec_destroy(c);
}

static void test_buffer_too_small(void **state)
{
    gcomp_codec *c = tu_codec("terngrad");
    float x[100] = { 0 };
    uint8_t buf[1024];
    size_t w = 123;
    gcomp_stats st;
    (void)state;
    x[3] = 1.0f;
    for (size_t cap = 0; cap < gcomp_codec_max_encoded_bytes(c, 100); cap++)
        assert_int_equal(gcomp_codec_encode(c, 7, x, 100, GCOMP_F32, buf, cap, &w), GCOMP_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(w, 0);
    /* failed calls leave no trace in the stats */
    assert_int_equal(gcomp_codec_stats_get(c, &st), GCOMP_SUCCESS);
    assert_int_equal(st.encode_calls, 0);
    gcomp_codec_destroy(c);
}

/* Half-precision inputs are widened; decoding into a half dtype rounds back. */
static void test_half_dtypes(void **state)
{
    gcomp_codec *c = tu_codec("none");
    enum {
        N = 1001
    };
    uint16_t h[N], back[N];
    uint8_t buf[N * 4 + 64];
    size_t w;
    (void)state;
    for (gcomp_dtype dt = GCOMP_F16; dt <= GCOMP_BF16; dt++) {
        for (int i = 0; i < N; i++)
            h[i] = dt == GCOMP_F16 ? gcomp_f32_to_f16((float)(i - 500) / 7.0f)
                                   : gcomp_f32_to_bf16((float)(i - 500) / 7.0f);
        assert_int_equal(gcomp_codec_encode(c, GCOMP_KEY_NONE, h, N, dt, buf, sizeof buf, &w), GCOMP_SUCCESS);
        assert_int_equal(buf[5], dt); /* header records the caller's dtype */
        assert_int_equal(gcomp_codec_decode(c, buf, w, back, N, dt), GCOMP_SUCCESS);
        assert_memory_equal(h, back, sizeof h);
    }
    gcomp_codec_destroy(c);
}

static void test_zero_count(void **state)
{
    const char *specs[] = { "none", "fp16", "bf16", "terngrad", "terngrad:bucket=8", "topk", "fp16+zstd" };
    (void)state;
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        gcomp_codec *c = tu_codec(specs[s]);
        uint8_t buf[256];
        size_t w;
        assert_int_equal(gcomp_codec_encode(c, 1, NULL, 0, GCOMP_F32, buf, sizeof buf, &w), GCOMP_SUCCESS);
        assert_true(w >= 32);
        assert_int_equal(gcomp_codec_decode_add(c, buf, w, NULL, 0), GCOMP_SUCCESS);
        gcomp_codec_destroy(c);
    }
}

/* Issue 13 item 10: a bound that does not fit in a size_t is 0 with a message, never a
 * wrapped small number, and encode refuses such counts before touching anything. */
static void test_bound_overflow(void **state)
{
    static const struct {
        const char *spec;
        size_t num, den; /* the bound is at least count * num / den bytes */
    } specs[] = { { "none", 4, 1 },
                  { "fp16", 2, 1 },
                  { "bf16", 2, 1 },
                  { "terngrad", 1, 4 },
                  { "terngrad:bucket=8", 1, 4 },
                  { "topk:ratio=1", 4, 1 },
                  { "topk", 0, 1 },
                  { "topk:k=1", 0, 1 },
                  { "fp16+zstd", 2, 1 },
                  { "none+zstd+zstd+zstd", 4, 1 } };
    const size_t huge[] = {
        (size_t)1 << 62, SIZE_MAX / 8 + 1, SIZE_MAX / 4, SIZE_MAX - 1, SIZE_MAX, GCOMP_MAX_COUNT + 1
    };
    float x[4] = { 0 };
    uint8_t buf[64];
    (void)state;
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        gcomp_codec *c = tu_codec(specs[s].spec);
        size_t bound;
        for (size_t h = 0; h < sizeof huge / sizeof huge[0]; h++) {
            size_t w = 99;
            if (gcomp_codec_max_encoded_bytes(c, huge[h]) != 0)
                fail_msg("%s: bound of %zu elements is %zu, not 0", specs[s].spec, huge[h],
                         gcomp_codec_max_encoded_bytes(c, huge[h]));
            assert_non_null(strstr(gcomp_last_error(), "GCOMP_MAX_COUNT"));
            /* the pointers are never read: the count is refused first */
            assert_int_equal(gcomp_codec_encode(c, 1, x, huge[h], GCOMP_F32, buf, sizeof buf, &w),
                             GCOMP_ERR_INVALID_ARG);
            assert_int_equal(w, 0);
            /* named as the count, not as an overlap of src reaching past dst */
            assert_non_null(strstr(gcomp_last_error(), "GCOMP_MAX_COUNT"));
            assert_int_equal(gcomp_codec_decode(c, buf, sizeof buf, x, huge[h], GCOMP_F32), GCOMP_ERR_INVALID_ARG);
            assert_non_null(strstr(gcomp_last_error(), "GCOMP_MAX_COUNT"));
        }
        /* the largest accepted count has a bound that did not wrap */
        bound = gcomp_codec_max_encoded_bytes(c, GCOMP_MAX_COUNT);
        if (bound == 0 || bound / 2 < GCOMP_MAX_COUNT / specs[s].den / 2 * specs[s].num)
            fail_msg("%s: bound of GCOMP_MAX_COUNT elements is %zu", specs[s].spec, bound);
        gcomp_codec_destroy(c);
    }
}

/* Issue 13 item 11: an encode that fails with GCOMP_ERR_BUFFER_TOO_SMALL writes nothing to
 * dst, whatever stage found the buffer too small; an exactly sized buffer smaller than the
 * bound gets the same payload as a bound-sized one. */
static void test_failed_encode_writes_nothing(void **state)
{
    static const char *const specs[] = {
        "none+zstd", "fp16+zstd", "bf16+zstd:level=19", "topk:ratio=0.5+zstd", "topk:ratio=0.5", "topk:k=3,values=fp16",
        "terngrad",  "none",      "fp16+zstd+zstd"
    };
    const size_t n = 1000;
    float *x = tu_gauss_array(n, 5);
    (void)state;
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        gcomp_codec *c = tu_codec(specs[s]);
        size_t bound = gcomp_codec_max_encoded_bytes(c, n), need = 0, w;
        uint8_t *ref = malloc(bound), *dst = malloc(bound);
        int deterministic =
            strncmp(specs[s], "terngrad", 8) != 0; /* terngrad's step advances (+zstd would vary in size) */
        const size_t caps[] = { 0, 16, 31, 32, 33, 100, bound / 3, bound / 2 };
        assert_int_equal(gcomp_codec_encode(c, GCOMP_KEY_NONE, x, n, GCOMP_F32, ref, bound, &need), GCOMP_SUCCESS);
        for (size_t k = 0; k <= sizeof caps / sizeof caps[0]; k++) {
            size_t cap = k < sizeof caps / sizeof caps[0] ? caps[k] : need - 1;
            if (cap >= need) continue;
            memset(dst, 0xab, bound);
            w = 99;
            assert_int_equal(gcomp_codec_encode(c, GCOMP_KEY_NONE, x, n, GCOMP_F32, dst, cap, &w),
                             GCOMP_ERR_BUFFER_TOO_SMALL);
            assert_int_equal(w, 0);
            for (size_t i = 0; i < bound; i++)
                if (dst[i] != 0xab) fail_msg("%s: cap %zu: byte %zu of dst was written", specs[s], cap, i);
        }
        /* exactly the payload's size: fits, the same bytes as with the bound */
        memset(dst, 0xab, bound);
        assert_int_equal(gcomp_codec_encode(c, GCOMP_KEY_NONE, x, n, GCOMP_F32, dst, need, &w), GCOMP_SUCCESS);
        assert_int_equal(w, need);
        if (deterministic) assert_memory_equal(dst, ref, need);
        for (size_t i = need; i < bound; i++) assert_int_equal(dst[i], 0xab);
        free(ref);
        free(dst);
        gcomp_codec_destroy(c);
    }
    free(x);
}

/* A codec's own message may hold anything: gcomp_codec_fail escapes control and non-ASCII
 * bytes as the library's messages do (gcomp.h), once (not again when the spec parser
 * reports a check_params refusal it carried). */
static int esc_long; /* esc_check's reason: 198 'a' then \x01, whose escape the 200-character cut would split */

static gcomp_result esc_check(const void *params, char *msg, size_t cap)
{
    (void)params;
    (void)msg;
    (void)cap;
    if (esc_long) return gcomp_codec_fail(GCOMP_ERR_INVALID_ARG, "%0198d\x01", 0);
    return gcomp_codec_fail(GCOMP_ERR_INVALID_ARG, "bad\x01mix\n");
}

static void test_codec_fail_escapes(void **state)
{
    static gcomp_codec_vtable vt; /* the registry keeps the pointer */
    gcomp_codec *c = NULL;
    (void)state;
    assert_int_equal(gcomp_codec_fail(GCOMP_ERR_CORRUPT, "hello\x01\n%s", "\xff"), GCOMP_ERR_CORRUPT);
    assert_string_equal(gcomp_last_error(), "hello\\x01\\x0a\\xff");
    vt = *gcomp_codec_find("none");
    vt.name = "escapes";
    vt.wire_id = 220;
    vt.check_params = esc_check;
    vt.cuda = NULL;
    assert_int_equal(gcomp_codec_register(&vt), GCOMP_SUCCESS);
    assert_int_equal(gcomp_codec_create("escapes", NULL, &c), GCOMP_ERR_INVALID_SPEC);
    if (!strstr(gcomp_last_error(), "escapes: bad\\x01mix\\x0a"))
        fail_msg("check_params' reason escaped twice or not at all: '%s'", gcomp_last_error());
    esc_long = 1; /* cut at 200 characters: before the escape, not inside it */
    assert_int_equal(gcomp_codec_create("escapes", NULL, &c), GCOMP_ERR_INVALID_SPEC);
    {
        char want[256];
        snprintf(want, sizeof want, "escapes: %0198d...", 0);
        if (!strstr(gcomp_last_error(), want)) fail_msg("a long reason cut inside an escape: '%s'", gcomp_last_error());
    }
    esc_long = 0;
}

/* Issue 13 item 12 (configuration): a bad value names where it came from -- the
 * gcomp_config field when the struct set it, the environment variable otherwise -- and an
 * environment value is echoed escaped. */
static void test_config_messages(void **state)
{
    gcomp_config cfg = gcomp_config_default();
    gcomp__config out;
    (void)state;
    cfg.min_bytes = -5;
    assert_int_equal(gcomp__config_resolve(&cfg, &out), GCOMP_ERR_INVALID_ARG);
    assert_true(
        strncmp(gcomp_last_error(), "gcomp_config.min_bytes = -5 is out of range [0, 9223372036854775807]", 68) == 0);
    cfg = gcomp_config_default();
    cfg.error_feedback = 2;
    assert_int_equal(gcomp__config_resolve(&cfg, &out), GCOMP_ERR_INVALID_ARG);
    assert_non_null(strstr(gcomp_last_error(), "gcomp_config.error_feedback = 2 is out of range [0, 1]"));
    { /* a codec object's options are held to the same range */
        gcomp_codec_options o = gcomp_codec_options_default();
        gcomp_codec *c = (gcomp_codec *)&o;
        o.error_feedback = -1;
        assert_int_equal(gcomp_codec_create("fp16", &o, &c), GCOMP_ERR_INVALID_ARG);
        assert_null(c);
        assert_non_null(strstr(gcomp_last_error(), "error_feedback must be 0 or 1, not -1"));
    }
    cfg = gcomp_config_default();
    cfg.timeout_ms = 0;
    assert_int_equal(gcomp__config_resolve(&cfg, &out), GCOMP_ERR_INVALID_ARG);
    assert_non_null(strstr(gcomp_last_error(), "gcomp_config.timeout_ms = 0"));
    /* from the environment: the variable is named, control characters escaped */
    setenv("GCOMP_MIN_BYTES", "12\x1b[2J", 1);
    assert_int_equal(gcomp__config_resolve(NULL, &out), GCOMP_ERR_INVALID_ARG);
    assert_non_null(strstr(gcomp_last_error(), "GCOMP_MIN_BYTES='12\\x1b[2J' is not an integer"));
    assert_null(strchr(gcomp_last_error(), 0x1b));
    setenv("GCOMP_MIN_BYTES", " 12", 1); /* strtoll would skip the space */
    assert_int_equal(gcomp__config_resolve(NULL, &out), GCOMP_ERR_INVALID_ARG);
    setenv("GCOMP_MIN_BYTES", "4096", 1);
    assert_int_equal(gcomp__config_resolve(NULL, &out), GCOMP_SUCCESS);
    assert_int_equal(out.min_bytes, 4096);
    unsetenv("GCOMP_MIN_BYTES");
    cfg = gcomp_config_default();
    {
        char spec[600];
        memset(spec, 'a', sizeof spec - 1);
        spec[sizeof spec - 1] = '\0';
        cfg.codec = spec;
        assert_int_equal(gcomp__config_resolve(&cfg, &out), GCOMP_ERR_INVALID_SPEC);
        assert_non_null(strstr(gcomp_last_error(), "gcomp_config.codec"));
    }
}

/* GCOMP_DEBUG takes 0, 1 and the words the docs use (GCOMP_DEBUG=INFO made every
 * communicator creation fail: "not an integer in [0, 1]"). */
static void test_debug_env_words(void **state)
{
    static const struct {
        const char *value;
        int level;
    } ok[] = { { "INFO", 1 }, { "info", 1 }, { "1", 1 }, { "0", 0 }, { "NONE", 0 }, { "none", 0 }, { "", 0 } };
    static const char *const bad[] = { "2", "yes", " 1", "INFO2", "-1" };
    gcomp__config out;
    (void)state;
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        setenv("GCOMP_DEBUG", ok[i].value, 1);
        if (gcomp__config_resolve(NULL, &out) != GCOMP_SUCCESS || out.debug != ok[i].level)
            fail_msg("GCOMP_DEBUG='%s': %s, debug %d", ok[i].value, gcomp_last_error(), out.debug);
        assert_int_equal(gcomp__env_debug(), ok[i].level);
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("GCOMP_DEBUG", bad[i], 1);
        assert_int_equal(gcomp__config_resolve(NULL, &out), GCOMP_ERR_INVALID_ARG);
        assert_non_null(strstr(gcomp_last_error(), "GCOMP_DEBUG="));
        assert_non_null(strstr(gcomp_last_error(), "INFO"));
        assert_int_equal(gcomp__env_debug(), 0);
    }
    unsetenv("GCOMP_DEBUG");
}

/* What a one-rank loopback communicator with gcomp_config.debug = debug writes to stderr
 * while it is created, runs one compressed call and is destroyed (into out, cap bytes). */
static void debug_output(int debug, char *out, size_t cap)
{
    gcomp__loop_world *w = NULL;
    gcomp_comm *c = NULL;
    gcomp_config cfg = gcomp_config_default();
    float x[256];
    int fds[2], saved;
    ssize_t got;
    for (size_t i = 0; i < 256; i++) x[i] = (float)i;
    cfg.codec = "fp16";
    cfg.min_bytes = 0;
    cfg.debug = debug;
    fflush(stderr);
    assert_int_equal(pipe(fds), 0);
    saved = dup(2);
    dup2(fds[1], 2);
    assert_int_equal(gcomp__loop_world_create(1, &w), GCOMP_SUCCESS);
    assert_int_equal(gcomp__comm_create_loop(w, 0, &cfg, &c), GCOMP_SUCCESS);
    assert_int_equal(gcomp_allreduce(c, x, x, 256, GCOMP_F32, GCOMP_SUM, 7, NULL), GCOMP_SUCCESS);
    gcomp_comm_destroy(c);
    gcomp__loop_world_destroy(w);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fds[1]);
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    got = read(fds[0], out, cap - 1);
    out[got > 0 ? got : 0] = '\0';
    close(fds[0]);
}

/* Issue 18 item 5: gcomp_config.debug was resolved and ignored (the lines followed the
 * environment only). A communicator's own lines follow its cfg.debug. */
static void test_config_debug_logs(void **state)
{
    char out[8192];
    (void)state;
    unsetenv("GCOMP_DEBUG");
    debug_output(1, out, sizeof out);
    if (!strstr(out, "gcomp: rank 0 key 7: ") || !strstr(out, "gcomp: rank 0/1: codec fp16"))
        fail_msg("cfg.debug = 1 logged: '%s'", out);
    debug_output(0, out, sizeof out);
    if (strstr(out, "gcomp: rank")) fail_msg("cfg.debug = 0 logged: '%s'", out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_result_strings),    cmocka_unit_test(test_dtype_size),
        cmocka_unit_test(test_null_arguments),    cmocka_unit_test(test_buffer_too_small),
        cmocka_unit_test(test_half_dtypes),       cmocka_unit_test(test_zero_count),
        cmocka_unit_test(test_bound_overflow),    cmocka_unit_test(test_failed_encode_writes_nothing),
        cmocka_unit_test(test_config_messages),   cmocka_unit_test(test_debug_env_words),
        cmocka_unit_test(test_config_debug_logs), cmocka_unit_test(test_codec_fail_escapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
