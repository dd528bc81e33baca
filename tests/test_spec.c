/* test_spec.c — the one spec parser: canonical forms and every kind of error message. */
#include <string.h>

#include "test_util.h"

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
        print_error("spec '%s': rc=%s msg='%s' (wanted '%s')\n", spec, gcomp_result_name(rc), gcomp_last_error(), needle);
    assert_int_equal(rc, GCOMP_ERR_INVALID_SPEC);
    assert_non_null(strstr(gcomp_last_error(), needle));
    assert_null(c);
}

static void test_errors_name_the_problem(void **state)
{
    (void)state;
    expect_error("bogus", "unknown codec 'bogus'");
    expect_error("topk:foo=1", "no parameter 'foo'");
    expect_error("topk:ratio=abc", "ratio='abc' is not a finite number");
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
        cmocka_unit_test(test_valid_specs),
        cmocka_unit_test(test_errors_name_the_problem),
        cmocka_unit_test(test_long_spec),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
