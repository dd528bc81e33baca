/*
 * test_config.c — a communicator's configuration (src/config.c): what an explicit value in
 * gcomp_config means next to the GCOMP_* environment variables.
 *
 *  - test_empty_codec_refused: gcomp_config.codec = "" is GCOMP_ERR_INVALID_SPEC (resolved
 *    directly and through a one-rank loopback communicator), as gcomp_codec_create("") is;
 *    it used to mean "terngrad" silently.
 *  - test_empty_env_is_unset: an empty GCOMP_CODEC still counts as unset (terngrad), and a
 *    set one is used when the struct leaves codec NULL; the struct's value wins over it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "config.h"
#include "transport_loop.h"

/* A one-rank loopback communicator with cfg: the result of its creation; on success
 * *spec receives the canonical codec spec (copied) and the communicator is destroyed. */
static gcomp_result create_one_rank(const gcomp_config *cfg, char *spec, size_t cap)
{
    gcomp__loop_world *w = NULL;
    gcomp_comm *comm = NULL;
    gcomp_result rc;
    assert_int_equal(gcomp__loop_world_create(1, &w), GCOMP_SUCCESS);
    rc = gcomp__comm_create_loop(w, 0, cfg, &comm);
    if (rc == GCOMP_SUCCESS) {
        snprintf(spec, cap, "%s", gcomp_comm_codec(comm));
        gcomp_comm_destroy(comm);
    } else {
        assert_null(comm);
    }
    gcomp__loop_world_destroy(w);
    return rc;
}

static void test_empty_codec_refused(void **state)
{
    gcomp_config cfg = gcomp_config_default();
    gcomp__config out;
    char spec[GCOMP_SPEC_MAX];
    (void)state;
    unsetenv("GCOMP_CODEC");
    cfg.codec = "";
    assert_int_equal(gcomp__config_resolve(&cfg, &out), GCOMP_ERR_INVALID_SPEC);
    assert_non_null(strstr(gcomp_last_error(), "gcomp_config.codec is an empty spec"));
    /* the environment does not stand in for an explicit (empty) value either */
    setenv("GCOMP_CODEC", "fp16", 1);
    assert_int_equal(gcomp__config_resolve(&cfg, &out), GCOMP_ERR_INVALID_SPEC);
    assert_int_equal(create_one_rank(&cfg, spec, sizeof spec), GCOMP_ERR_INVALID_SPEC);
    assert_non_null(strstr(gcomp_last_error(), "empty spec"));
    unsetenv("GCOMP_CODEC");
    assert_int_equal(create_one_rank(&cfg, spec, sizeof spec), GCOMP_ERR_INVALID_SPEC);
    /* as the codec API says of the same string */
    {
        gcomp_codec *c = NULL;
        assert_int_equal(gcomp_codec_create("", NULL, &c), GCOMP_ERR_INVALID_SPEC);
        assert_null(c);
    }
}

static void test_empty_env_is_unset(void **state)
{
    gcomp_config cfg = gcomp_config_default();
    gcomp__config out;
    char spec[GCOMP_SPEC_MAX];
    (void)state;
    setenv("GCOMP_CODEC", "", 1);
    assert_int_equal(gcomp__config_resolve(&cfg, &out), GCOMP_SUCCESS);
    assert_string_equal(out.codec, "terngrad");
    assert_int_equal(gcomp__config_resolve(NULL, &out), GCOMP_SUCCESS);
    assert_string_equal(out.codec, "terngrad");
    assert_int_equal(create_one_rank(&cfg, spec, sizeof spec), GCOMP_SUCCESS);
    assert_true(strncmp(spec, "terngrad", 8) == 0);

    setenv("GCOMP_CODEC", "fp16", 1);
    assert_int_equal(gcomp__config_resolve(&cfg, &out), GCOMP_SUCCESS);
    assert_string_equal(out.codec, "fp16");
    cfg.codec = "bf16"; /* the struct's value wins over the environment */
    assert_int_equal(gcomp__config_resolve(&cfg, &out), GCOMP_SUCCESS);
    assert_string_equal(out.codec, "bf16");
    assert_int_equal(create_one_rank(&cfg, spec, sizeof spec), GCOMP_SUCCESS);
    assert_string_equal(spec, "bf16");
    unsetenv("GCOMP_CODEC");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_codec_refused),
        cmocka_unit_test(test_empty_env_is_unset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
