/*
 * internal.h — what the library's own files share. Not installed.
 * Internal non-static names use the gcomp__ prefix.
 */
#ifndef GCOMP_INTERNAL_H
#define GCOMP_INTERNAL_H

#include "gcomp.h"
#include "gcomp_codec.h"

/* ---- errors and logging (errors.c) ---- */
/* Record a detail for gcomp_last_error() and return rc (same as gcomp_codec_fail). */
gcomp_result gcomp__fail(gcomp_result rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Debug log to stderr when GCOMP_DEBUG is set. */
void gcomp__debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int gcomp__debug_enabled(void);
/* s made safe to echo in a message: control/non-ASCII bytes as \xNN, at most max_chars
 * characters of s then "..."; written to out (cap bytes), which is returned. */
const char *gcomp__quote(char *out, size_t cap, const char *s, size_t max_chars);

/* Propagate a failure; at debug level, log where it passed through. */
#define GCOMP_CHECK(x)                                                                      \
    do {                                                                                    \
        gcomp_result gcomp_rc_ = (x);                                                       \
        if (gcomp_rc_ != GCOMP_SUCCESS) {                                                   \
            if (gcomp__debug_enabled())                                                     \
                gcomp__debug("%s:%d %s -> %s", __FILE__, __LINE__, #x,                      \
                             gcomp_result_name(gcomp_rc_));                                 \
            return gcomp_rc_;                                                               \
        }                                                                                   \
    } while (0)

#define GCOMP_CHECK_GOTO(x, rc, label)                                                      \
    do {                                                                                    \
        (rc) = (x);                                                                         \
        if ((rc) != GCOMP_SUCCESS) {                                                        \
            if (gcomp__debug_enabled())                                                     \
                gcomp__debug("%s:%d %s -> %s", __FILE__, __LINE__, #x, gcomp_result_name(rc)); \
            goto label;                                                                     \
        }                                                                                   \
    } while (0)

/* ---- registry (registry.c) ---- */
/* Register the built-in codecs once; safe to call from every entry point. */
void gcomp__registry_init(void);
/* Remove a user codec registered with exactly this vtable (GCOMP_ERR_INVALID_ARG if none).
 * For tests and fuzzers only: no codec object may still use it. */
gcomp_result gcomp__codec_unregister(const gcomp_codec_vtable *vt);

/* ---- spec parsing (spec.c) ---- */
#define GCOMP_MAX_STAGES 4
#define GCOMP_SPEC_MAX 512

typedef struct gcomp__stage {
    const gcomp_codec_vtable *vt;
    void *params; /* vt->params_size bytes, filled from the parameter table */
    void *state;  /* vt->state_create(params): scratch or contexts reused across calls */
} gcomp__stage;

typedef struct gcomp__chain {
    size_t n_stages; /* stage 0 is the element codec, later ones are byte stages */
    gcomp__stage stages[GCOMP_MAX_STAGES];
    char canonical[GCOMP_SPEC_MAX]; /* every parameter spelled out */
} gcomp__chain;

gcomp_result gcomp__chain_parse(const char *spec, gcomp__chain *out);
void gcomp__chain_free(gcomp__chain *chain);

/* ---- residual store (residual.c) ---- */
/* One key's error-feedback state. For most codecs two buffers: encode reads buf[cur] and
 * writes the other; commit swaps them. A failed or non-finite encode simply does not commit,
 * which leaves the residual exactly as it was without an extra pass over the data. Codecs
 * with GCOMP_CAP_RESIDUAL_IN_PLACE update buf[cur] in place and buf[1 - cur] stays NULL. */
typedef struct gcomp__residual {
    uint64_t key;
    size_t count;
    uint64_t step; /* calls so far with this key; keys the stochastic rounding */
    float *buf[2];
    int cur;
} gcomp__residual;

typedef struct gcomp__residual_store {
    gcomp__residual **slots; /* open addressing by key; NULL = empty */
    size_t cap;              /* power of two */
    size_t used;
} gcomp__residual_store;

/* Find the key's residual, creating it (zeroed) or resetting it when count changed; with
 * double_buffer, also make sure the second buffer exists. */
gcomp_result gcomp__residual_acquire(gcomp__residual_store *s, uint64_t key, size_t count, int double_buffer,
                                     gcomp__residual **out);
gcomp__residual *gcomp__residual_find(const gcomp__residual_store *s, uint64_t key);
void gcomp__residual_commit(gcomp__residual *r);
void gcomp__residual_drop(gcomp__residual_store *s, uint64_t key);
void gcomp__residual_store_free(gcomp__residual_store *s);

/* ---- scratch buffers ---- */
/* Grow *buf to at least bytes (never shrinks). */
gcomp_result gcomp__reserve(void **buf, size_t *cap, size_t bytes);

#endif
