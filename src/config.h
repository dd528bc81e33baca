/*
 * config.h — a communicator's resolved configuration (config.c): the gcomp_config the user
 * gave, with GCOMP_* environment variables and defaults filling what it left unset.
 */
#ifndef GCOMP_CONFIG_H
#define GCOMP_CONFIG_H

#include <stdlib.h>
#include <strings.h>

#include "internal.h"

#define GCOMP__TIMEOUT_MS_DEFAULT 300000 /* GCOMP_TIMEOUT_MS when neither the struct nor the environment sets it */

typedef struct gcomp__config {
    char codec[GCOMP_SPEC_MAX];
    int64_t min_bytes;
    int error_feedback;
    uint64_t seed;
    int64_t timeout_ms;
    int debug;
    /* GCOMP_TEST_COMPRESS_ONE_RANK=1, for tests only: a communicator of one rank runs the
     * compressed schedules against itself instead of the bypass (a machine with one GPU can
     * then check them on device buffers, where NCCL allows only one rank per GPU) */
    int compress_one_rank;
} gcomp__config;

/* GCOMP_DEBUG takes words too (the docs and the interposer say GCOMP_DEBUG=INFO), in any case:
 * 1 and *v = the level when s is one of them. */
static inline int gcomp__debug_word(const char *s, int64_t *v)
{
    static const struct {
        const char *word;
        int level;
    } words[] = { { "NONE", 0 }, { "INFO", 1 } };
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        if (strcasecmp(s, words[i].word) == 0) {
            *v = words[i].level;
            return 1;
        }
    return 0;
}

/* GCOMP_DEBUG as a level (0 or 1; 0 when unset or unparsable), for the process-wide logging
 * switch (errors.c). Never fails, never logs: gcomp__fail itself asks it. Inline here, with the
 * configuration's own reading of the variable in config.c, so that errors.c (which config.c
 * calls to report) does not call back into config.c. */
static inline int gcomp__env_debug(void)
{
    const char *s = getenv("GCOMP_DEBUG");
    int64_t v = 0;
    if (!s || !*s) return 0;
    if (gcomp__debug_word(s, &v)) return (int)v;
    return (s[0] == '0' || s[0] == '1') && !s[1] ? s[0] - '0' : 0; /* unparsable: off (creation says why) */
}

/* Fill unset fields of cfg (may be NULL) from GCOMP_* environment variables, then defaults. */
gcomp_result gcomp__config_resolve(const gcomp_config *cfg, gcomp__config *out);

#endif
