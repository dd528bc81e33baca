/*
 * config.c — communicator configuration. One table names every GCOMP_* environment
 * variable; they are read once, when a communicator is created, and only for the fields
 * the caller's struct leaves unset. This is the only place gcomp reads the environment:
 * the process-wide logging switch (errors.c) reads GCOMP_DEBUG through gcomp__env_debug.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config.h"

gcomp_config gcomp_config_default(void)
{
    gcomp_config c;
    c.codec = NULL;
    c.min_bytes = GCOMP_UNSET;
    c.error_feedback = GCOMP_UNSET;
    c.seed = GCOMP_UNSET;
    c.timeout_ms = GCOMP_UNSET;
    c.debug = GCOMP_UNSET;
    return c;
}

typedef struct env_param {
    const char *env;
    const char *field; /* its gcomp_config field, named in messages when the value came from there */
    int64_t def;
    int64_t min, max;
    size_t offset; /* of the int64_t-sized or int field in gcomp__config */
    int is_int;    /* field is an int (else int64_t/uint64_t) */
} env_param;

static const env_param params[] = {
    { "GCOMP_MIN_BYTES", "gcomp_config.min_bytes", 65536, 0, INT64_MAX, offsetof(gcomp__config, min_bytes), 0 },
    { "GCOMP_EF", "gcomp_config.error_feedback", 1, 0, 1, offsetof(gcomp__config, error_feedback), 1 },
    { "GCOMP_SEED", "gcomp_config.seed", 0, 0, INT64_MAX, offsetof(gcomp__config, seed), 0 },
    { "GCOMP_TIMEOUT_MS", "gcomp_config.timeout_ms", GCOMP__TIMEOUT_MS_DEFAULT, 1, INT64_MAX,
      offsetof(gcomp__config, timeout_ms), 0 },
    { "GCOMP_DEBUG", "gcomp_config.debug", 0, 0, 1, offsetof(gcomp__config, debug), 1 },
};

static gcomp_result from_env(const env_param *p, int64_t *v)
{
    const char *s = getenv(p->env);
    char *end, q[4 * 32 + 8];
    long long x;
    *v = p->def;
    if (!s || !*s) return GCOMP_SUCCESS;
    if (p->offset == offsetof(gcomp__config, debug)) {
        if (gcomp__debug_word(s, v)) return GCOMP_SUCCESS;
        if ((s[0] == '0' || s[0] == '1') && !s[1]) {
            *v = s[0] - '0';
            return GCOMP_SUCCESS;
        }
        return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                           "environment variable GCOMP_DEBUG='%s' is not one of 0, 1, NONE "
                           "(= 0) or INFO (= 1)",
                           gcomp__quote(q, sizeof q, s, 32));
    }
    errno = 0;
    x = strtoll(s, &end, 10);
    /* strtoll would skip leading whitespace: refuse it like any other stray character */
    if (*end || errno || x < p->min || x > p->max || !(*s == '-' || *s == '+' || (*s >= '0' && *s <= '9')))
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "environment variable %s='%s' is not an integer in [%lld, %lld]",
                           p->env, gcomp__quote(q, sizeof q, s, 32), (long long)p->min, (long long)p->max);
    *v = x;
    return GCOMP_SUCCESS;
}

static int64_t user_value(const gcomp_config *cfg, const env_param *p)
{
    if (!cfg) return GCOMP_UNSET;
    if (p->offset == offsetof(gcomp__config, min_bytes)) return cfg->min_bytes;
    if (p->offset == offsetof(gcomp__config, error_feedback)) return cfg->error_feedback;
    if (p->offset == offsetof(gcomp__config, seed)) return cfg->seed;
    if (p->offset == offsetof(gcomp__config, timeout_ms)) return cfg->timeout_ms;
    return cfg->debug;
}

gcomp_result gcomp__config_resolve(const gcomp_config *cfg, gcomp__config *out)
{
    const char *codec = cfg && cfg->codec ? cfg->codec : getenv("GCOMP_CODEC");
    memset(out, 0, sizeof *out);
    /* An empty spec in the struct is a mistake (a typo or an empty string passed through),
     * not a request for the default: gcomp_codec_create refuses it too, and NULL is how the
     * caller asks for the default. An empty GCOMP_CODEC stays "unset", as with every other
     * variable here (from_env), so `GCOMP_CODEC= prog` is the same as not setting it. */
    if (cfg && cfg->codec && !*cfg->codec)
        return gcomp__fail(GCOMP_ERR_INVALID_SPEC,
                           "gcomp_config.codec is an empty spec: leave it NULL for the default (GCOMP_CODEC, "
                           "else terngrad)");
    if (!codec || !*codec) codec = "terngrad";
    if (strlen(codec) >= sizeof out->codec)
        return gcomp__fail(GCOMP_ERR_INVALID_SPEC, "the codec spec of %s is longer than %zu characters",
                           cfg && cfg->codec ? "gcomp_config.codec" : "GCOMP_CODEC", sizeof out->codec - 1);
    strcpy(out->codec, codec);
    for (size_t i = 0; i < sizeof params / sizeof params[0]; i++) {
        const env_param *p = &params[i];
        int64_t v = user_value(cfg, p);
        if (v == GCOMP_UNSET)
            GCOMP_CHECK(from_env(p, &v));
        else if (v < p->min || v > p->max)
            return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                               "%s = %lld is out of range [%lld, %lld] (GCOMP_UNSET = -1 "
                               "leaves it to %s)",
                               p->field, (long long)v, (long long)p->min, (long long)p->max, p->env);
        if (p->is_int)
            *(int *)((char *)out + p->offset) = (int)v;
        else
            *(int64_t *)((char *)out + p->offset) = v;
    }
    /* test-only, no gcomp_config field: any value but unset, empty or "0" turns it on */
    {
        const char *t = getenv("GCOMP_TEST_COMPRESS_ONE_RANK");
        out->compress_one_rank = t && *t && strcmp(t, "0") != 0;
    }
    return GCOMP_SUCCESS;
}
