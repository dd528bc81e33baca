/*
 * config.h — a communicator's resolved configuration (config.c): the gcomp_config the user
 * gave, with GCOMP_* environment variables and defaults filling what it left unset.
 */
#ifndef GCOMP_CONFIG_H
#define GCOMP_CONFIG_H

#include "internal.h"

#define GCOMP__TIMEOUT_MS_DEFAULT 300000 /* GCOMP_TIMEOUT_MS when neither the struct nor the environment sets it */

typedef struct gcomp__config {
    char codec[GCOMP_SPEC_MAX];
    int64_t min_bytes;
    int error_feedback;
    uint64_t seed;
    int64_t timeout_ms;
    int debug;
} gcomp__config;

/* GCOMP_DEBUG as a level (0 or 1; 0 when unset or unparsable), for the process-wide logging
 * switch (errors.c). Never fails, never logs: gcomp__fail itself asks it. */
int gcomp__env_debug(void);

/* Fill unset fields of cfg (may be NULL) from GCOMP_* environment variables, then defaults. */
gcomp_result gcomp__config_resolve(const gcomp_config *cfg, gcomp__config *out);

#endif
