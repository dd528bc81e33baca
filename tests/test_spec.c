/* test_spec.c — the one spec parser: canonical forms and every kind of error message. */
#include <stdio.h>
#include <string.h>

#include "test_util.h"
#include "gcomp_codec.h"

#define GCOMP_SPEC_MAX_TEST 1024

static void expect_canonical(const char *spec, const char *canonical)
{
    gcomp_codec *c = tu_codec(spec);
    assert_string_equal(gcomp_codec_spec(c), canonical);
    gcomp_codec_destroy(c);
    /* the canonical form parses to itself */
    c = tu_codec(canonical);
    assert_string_equal(gcomp_codec_spec(c), canonical);
    gcomp_codec_destroy(c);
}

static void test_valid_specs(void **state)
{
    (void)state;
    expect_canonical("none", "none");
    expect_canonical("fp16", "fp16");
    expect_canonical("bf16", "bf16");
    expect_canonical("terngrad", "terngrad:bucket=0,clip=2.5");
    expect_canonical("terngrad:clip=2.5,bucket=512", "terngrad:bucket=512,clip=2.5");
    expect_canonical("terngrad:clip=100", "terngrad:bucket=0,clip=1e02"); /* no "+" in a canonical spec */
    expect_canonical("topk:ratio=0.01", "topk:ratio=0.01,k=0,values=fp32");
    expect_canonical("topk:k=100,values=fp16", "topk:ratio=0.01,k=100,values=fp16");
    expect_canonical("topk:ratio=0.001,values=fp16+zstd:level=1", "topk:ratio=0.001,k=0,values=fp16+zstd:level=1");
    expect_canonical("fp16+zstd", "fp16+zstd:level=1");
    expect_canonical("fp16+zstd:level=-7+zstd:level=19", "fp16+zstd:level=-7+zstd:level=19");
}

/* The call fails with INVALID_SPEC and the message contains `needle`. */
static void expect_error(const char *spec, const char *needle)
{
    gcomp_codec *c = (gcomp_codec *)0x1;
    gcomp_result rc = gcomp_codec_create(spec, NULL, &c);
    if (rc != GCOMP_ERR_INVALID_SPEC || !strstr(gcomp_last_error(), needle))
        print_error("spec '%s': rc=%s msg='%s' (wanted '%s')\n", spec, gcomp_result_name(rc), gcomp_last_error(),
                    needle);
    assert_int_equal(rc, GCOMP_ERR_INVALID_SPEC);
    assert_non_null(strstr(gcomp_last_error(), needle));
    assert_null(c);
}

static void test_errors_name_the_problem(void **state)
{
    (void)state;
    expect_error("bogus", "unknown codec 'bogus'");
    expect_error("topk:foo=1", "no parameter 'foo'");
    expect_error("topk:ratio=abc", "ratio='abc' is not a number");
    expect_error("topk:ratio=nan", "not a finite number");
    expect_error("topk:ratio=", "empty value");
    expect_error("topk:ratio=2", "ratio=2 is out of range");
    expect_error("topk:ratio=0", "out of range");
    expect_error("topk:k=1.5", "k='1.5' is not an integer");
    expect_error("topk:k=-3", "out of range");
    expect_error("topk:values=fp8", "values='fp8' is not one of");
    expect_error("topk:ratio=0.1,ratio=0.2", "'ratio' is given twice");
    expect_error("topk:ratio", "'ratio' is not key=value");
    expect_error("topk:", "must be followed by key=value");
    expect_error("topk:ratio=0.1,", "empty element");
    expect_error("fp16++zstd", "empty element");
    expect_error("+zstd", "empty element");
    expect_error("zstd", "byte stage");
    expect_error("fp16+topk", "element codec");
    expect_error("fp16 + zstd", "whitespace");
    expect_error("", "empty codec spec");
    expect_error("terngrad:bucket=6", "multiple of 4");
    expect_error("zstd:level=20", "byte stage");
    expect_error("fp16+zstd:level=20", "level=20 is out of range");
    expect_error("fp16+zstd+zstd+zstd+zstd", "more than 4 stages");
    expect_error(":ratio=1", "no codec name");
}

/* Issue 13 item 9: what the parser got wrong, each case refused or accepted as it should. */
static void test_numbers(void **state)
{
    (void)state;
    /* an empty element right after ':' */
    expect_error("topk:,ratio=0.1", "empty element at character 6");
    /* integers are compared as integers: 2^62 is the bound, 2^62 + 1 is past it */
    expect_canonical("topk:k=4611686018427387904", "topk:ratio=0.01,k=4611686018427387904,values=fp32");
    expect_error("topk:k=4611686018427387905", "k=4611686018427387905 is out of range [0, 4611686018427387904]");
    expect_error("topk:k=9223372036854775808", "is out of range [0, 4611686018427387904]"); /* past int64 */
    expect_error("topk:k=-1", "k=-1 is out of range [0, 4611686018427387904]");
    expect_error("topk:k=+", "is not an integer");
    expect_error("topk:k=0x10", "is not an integer");
    /* a '+' inside a number is part of it; a '+' before a codec name separates stages */
    expect_canonical("topk:ratio=+0.5", "topk:ratio=0.5,k=0,values=fp32");
    expect_canonical("topk:k=+7", "topk:ratio=0.01,k=7,values=fp32");
    expect_canonical("terngrad:clip=1e+3", "terngrad:bucket=0,clip=1e03");
    expect_canonical("terngrad:clip=1E+2,bucket=4", "terngrad:bucket=4,clip=1e02");
    expect_canonical("terngrad:clip=0x1p+3", "terngrad:bucket=0,clip=8");
    expect_canonical("terngrad:clip=1e+2+zstd", "terngrad:bucket=0,clip=1e02+zstd:level=1");
    expect_canonical("topk:ratio=+0.5+zstd:level=+3", "topk:ratio=0.5,k=0,values=fp32+zstd:level=3");
    expect_canonical("topk:ratio=0.5+zstd", "topk:ratio=0.5,k=0,values=fp32+zstd:level=1");
    expect_error("topk:ratio=1e+", "ratio='1e+' is not a number");
    expect_error("topk:ratio=1e+3x", "ratio='1e+3x' is not a number");
    /* subnormals are finite numbers; under- and overflow are out of range */
    expect_canonical("terngrad:clip=4.9e-324", "terngrad:bucket=0,clip=5e-324");
    expect_error("topk:ratio=4.9e-324", "ratio=4.9e-324 is out of range [1e-06, 1]");
    expect_error("terngrad:clip=1e-400", "clip=1e-400 is out of range [0, 1e03] (too small for a double");
    expect_error("terngrad:clip=1e400", "clip=1e400 is out of range [0, 1e03] (too large for a double");
    expect_error("terngrad:clip=-1e400", "out of range");
    expect_error("terngrad:clip=inf", "clip='inf' is not a finite number");
    expect_error("terngrad:clip=-nan", "is not a finite number");
    /* -0 is 0: one canonical spelling, so ranks writing either agree on the codec */
    expect_canonical("terngrad:clip=-0", "terngrad:bucket=0,clip=0");
    expect_canonical("terngrad:clip=-0.0e5", "terngrad:bucket=0,clip=0");
}

/* Issue 13 item 12: the reason comes first, the quoted spec is shortened and escaped. */
static void test_messages(void **state)
{
    char spec[GCOMP_SPEC_MAX_TEST];
    gcomp_codec *c = NULL;
    (void)state;
    /* none + 100 x "+zstd" is 504 characters: the reason must still be there */
    strcpy(spec, "none");
    for (int i = 0; i < 100; i++) strcat(spec, "+zstd");
    expect_error(spec, "more than 4 stages");
    assert_true(strncmp(gcomp_last_error(), "more than 4 stages", 18) == 0);
    assert_non_null(strstr(gcomp_last_error(), "..."));
    assert_true(strlen(gcomp_last_error()) < 200);
    /* a long value is cut too, and the reason is still first */
    strcpy(spec, "topk:ratio=");
    for (int i = 0; i < 400; i++) strcat(spec, "1");
    expect_error(spec, "is out of range [1e-06, 1]");
    assert_true(strncmp(gcomp_last_error(), "topk: ratio=111", 15) == 0);
    /* control characters are escaped, never echoed */
    expect_error("fp16\n+zstd", "control character 0x0a at character 5");
    assert_non_null(strstr(gcomp_last_error(), "fp16\\x0a+zstd"));
    assert_null(strchr(gcomp_last_error(), '\n'));
    expect_error("fp16+zstd\x1b[31m", "control character 0x1b");
    assert_null(strchr(gcomp_last_error(), 0x1b));
    expect_error("topk:values=\x7f", "control character 0x7f");
    expect_error("topk:values=fp8\xff", "is not one of the allowed values (fp32, fp16)");
    assert_non_null(strstr(gcomp_last_error(), "fp8\\xff"));
    /* integer bounds print as integers, double bounds in their shortest form */
    expect_error("fp16+zstd:level=20", "level=20 is out of range [-7, 19]");
    expect_error("topk:ratio=2", "topk: ratio=2 is out of range [1e-06, 1] (spec 'topk:ratio=2')");
    assert_int_equal(gcomp_codec_create("topk:ratio=0.5", NULL, &c), GCOMP_SUCCESS);
    gcomp_codec_destroy(c);
}

/* Issue 13 item 13: what the canonical spec's k=0 means, readable without the codec's source. */
static void test_kept(void **state)
{
    static const struct {
        const char *spec;
        size_t count, kept;
    } cases[] = {
        { "topk", 1000, 10 }, /* k=0: ceil(0.01 * 1000) */
        { "topk", 1001, 11 }, /* ceil(10.01) */
        { "topk", 1, 1 },     /* at least one */
        { "topk", 0, 0 },
        { "topk:ratio=0.3", 7, 3 },     /* ceil(2.1) */
        { "topk:k=5", 100, 5 },         /* k > 0 overrides ratio */
        { "topk:k=5,ratio=0.5", 3, 3 }, /* at most count */
        { "topk:ratio=1,values=fp16+zstd", 123, 123 },
        { "none", 77, 77 },
        { "fp16+zstd", 77, 77 },
        { "bf16", 5, 5 },
        { "terngrad:bucket=8", 9, 9 },
    };
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gcomp_codec *c = tu_codec(cases[i].spec);
        if (gcomp_codec_kept(c, cases[i].count) != cases[i].kept)
            fail_msg("%s, %zu elements: kept %zu, want %zu", cases[i].spec, cases[i].count,
                     gcomp_codec_kept(c, cases[i].count), cases[i].kept);
        gcomp_codec_destroy(c);
    }
    assert_int_equal(gcomp_codec_kept(NULL, 10), 0);
    /* past GCOMP_MAX_COUNT: 0 and a message, never a wrapped double->size_t (ratio=1 made
     * SIZE_MAX a 2^64 double, and kept returned 1); below it top-k's k is still exact */
    {
        static const char *const specs[] = { "topk:ratio=1", "topk", "none", "topk:k=3" };
        for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
            gcomp_codec *c = tu_codec(specs[i]);
            if (gcomp_codec_kept(c, SIZE_MAX) != 0 || !strstr(gcomp_last_error(), "GCOMP_MAX_COUNT"))
                fail_msg("%s, SIZE_MAX elements: kept %zu (%s)", specs[i], gcomp_codec_kept(c, SIZE_MAX),
                         gcomp_last_error());
            gcomp_codec_destroy(c);
        }
    }
    {
        gcomp_codec *c = tu_codec("topk:ratio=1");
        assert_true(gcomp_codec_kept(c, GCOMP_MAX_COUNT) == GCOMP_MAX_COUNT);
        gcomp_codec_destroy(c);
    }
}

/* Issue 18 item 5: check_params refuses as every codec entry fails (gcomp_codec_fail), or
 * through its msg buffer; either way the message names the codec and the spec, and a
 * refusal without a reason does not echo an older, unrelated message. */
static int chk_mode;

static gcomp_result chk_check_params(const void *params, char *msg, size_t cap)
{
    (void)params;
    if (chk_mode == 0) return gcomp_codec_fail(GCOMP_ERR_INVALID_SPEC, "refused through gcomp_codec_fail");
    if (chk_mode == 1) snprintf(msg, cap, "refused through msg");
    if (chk_mode == 4) return (gcomp_result)77; /* no gcomp_result */
    return chk_mode == 3 ? GCOMP_SUCCESS : GCOMP_ERR_INVALID_SPEC;
}

static void test_check_params(void **state)
{
    static gcomp_codec_vtable chk;
    gcomp_codec *c = NULL;
    (void)state;
    expect_error("terngrad:bucket=6",
                 "terngrad: bucket=6 must be a multiple of 4 (codes pack 4 per byte) (spec 'terngrad:bucket=6')");
    chk = *gcomp_codec_find("fp16");
    chk.name = "chk";
    chk.wire_id = 150;
    chk.check_params = chk_check_params;
    assert_int_equal(gcomp_codec_register(&chk), GCOMP_SUCCESS);
    chk_mode = 0;
    expect_error("chk+zstd", "chk: refused through gcomp_codec_fail (spec 'chk+zstd')");
    chk_mode = 1;
    expect_error("chk", "chk: refused through msg (spec 'chk')");
    chk_mode = 2;
    expect_error("bogus", "unknown codec"); /* an older message that must not be echoed */
    expect_error("chk", "chk: its parameters were refused (no reason given) (spec 'chk')");
    chk_mode = 4; /* a value outside the enum is the codec's bug, as from every entry */
    assert_int_equal(gcomp_codec_create("chk", NULL, &c), GCOMP_ERR_INTERNAL);
    assert_null(c);
    assert_non_null(strstr(gcomp_last_error(), "codec 'chk': check_params returned 77, which is not a gcomp_result"));
    chk_mode = 3;
    assert_int_equal(gcomp_codec_create("chk", NULL, &c), GCOMP_SUCCESS);
    gcomp_codec_destroy(c);
    /* a create whose codec has a parameter check (terngrad) leaves the last error alone */
    expect_error("bogus", "unknown codec");
    assert_int_equal(gcomp_codec_create("terngrad+zstd", NULL, &c), GCOMP_SUCCESS);
    assert_non_null(strstr(gcomp_last_error(), "unknown codec 'bogus'"));
    gcomp_codec_destroy(c);
}

static void test_long_spec(void **state)
{
    char spec[1024];
    (void)state;
    memset(spec, 'a', sizeof spec - 1);
    spec[sizeof spec - 1] = '\0';
    expect_error(spec, "longer than");
    assert_int_equal(gcomp_codec_create(NULL, NULL, (gcomp_codec **)spec), GCOMP_ERR_INVALID_ARG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_specs),  cmocka_unit_test(test_errors_name_the_problem),
        cmocka_unit_test(test_long_spec),    cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_messages),     cmocka_unit_test(test_kept),
        cmocka_unit_test(test_check_params),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
