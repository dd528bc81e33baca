/*
 * internal.h — what every file of the library shares: errors, logging, the clock, scratch.
 * Nothing of codecs (that is codec_internal.h), so a transport can include it alone.
 * Not installed. Internal non-static names use the gcomp__ prefix.
 */
#ifndef GCOMP_INTERNAL_H
#define GCOMP_INTERNAL_H

#include "gcomp.h"

/* ---- errors and logging (errors.c) ---- */
/* Record a detail for gcomp_last_error() and return rc (same as gcomp_codec_fail). */
gcomp_result gcomp__fail(gcomp_result rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Debug log to stderr when GCOMP_DEBUG is set. */
void gcomp__debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A line to stderr unconditionally: for a communicator's own lines, gated by its cfg.debug. */
void gcomp__log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int gcomp__debug_enabled(void);
/* Empty this thread's gcomp_last_error(), so a caller can tell whether a callee recorded one. */
void gcomp__error_clear(void);
/* 1 when rc is a value of gcomp_result (a user codec's entry may return anything). */
int gcomp__result_known(gcomp_result rc);
/* Call before a codec entry, then pass what it returned to gcomp__codec_entry_rc: rc as codec
 * `codec`'s entry `entry` returned it; a value that is no gcomp_result (a faulty user codec)
 * becomes GCOMP_ERR_INTERNAL naming the codec and the entry, and a failure the codec gave no
 * detail for (no gcomp_codec_fail since the begin) gets one naming both, instead of leaving
 * gcomp_last_error() at an older, unrelated failure. */
void gcomp__codec_entry_begin(void);
gcomp_result gcomp__codec_entry_rc(const char *codec, const char *entry, gcomp_result rc);
/* GCOMP_ERR_INTERNAL for a codec entry that returned rc, a value outside gcomp_result. */
gcomp_result gcomp__codec_not_a_result(const char *codec, const char *entry, gcomp_result rc);
/* Put back a detail saved from gcomp_last_error() (a call that succeeds leaves it as it was). */
void gcomp__error_restore(const char *saved);
/* A failure already recorded (and logged under GCOMP_DEBUG) on some thread, passed on as this
 * thread's last error: rc with detail, without logging it again. For the outcome of a call
 * another thread ran, and for this rank's own failure restated after an agreement. */
gcomp_result gcomp__fail_again(gcomp_result rc, const char *detail);
/* s made safe to echo in a message: control/non-ASCII bytes as \xNN, at most max_chars
 * characters of s then "..."; written to out (cap bytes), which is returned. */
const char *gcomp__quote(char *out, size_t cap, const char *s, size_t max_chars);
/* The same for len bytes that need not end in a NUL (a NUL among them becomes \x00): text
 * read from a file. */
const char *gcomp__quote_bytes(char *out, size_t cap, const char *s, size_t len, size_t max_chars);

/* Propagate a failure; at debug level, log where it passed through. */
#define GCOMP_CHECK(x)                                                                                \
    do {                                                                                              \
        gcomp_result gcomp_rc_ = (x);                                                                 \
        if (gcomp_rc_ != GCOMP_SUCCESS) {                                                             \
            if (gcomp__debug_enabled())                                                               \
                gcomp__debug("%s:%d %s -> %s", __FILE__, __LINE__, #x, gcomp_result_name(gcomp_rc_)); \
            return gcomp_rc_;                                                                         \
        }                                                                                             \
    } while (0)

#define GCOMP_CHECK_GOTO(x, rc, label)                                                                                 \
    do {                                                                                                               \
        (rc) = (x);                                                                                                    \
        if ((rc) != GCOMP_SUCCESS) {                                                                                   \
            if (gcomp__debug_enabled()) gcomp__debug("%s:%d %s -> %s", __FILE__, __LINE__, #x, gcomp_result_name(rc)); \
            goto label;                                                                                                \
        }                                                                                                              \
    } while (0)

#define GCOMP_SPEC_MAX 512 /* longest codec spec string, terminator included */

/* CLOCK_MONOTONIC seconds: every deadline of the library is on this clock. */
double gcomp__now(void);

/* ---- scratch buffers ---- */
/* Grow *buf to at least bytes (never shrinks). */
gcomp_result gcomp__reserve(void **buf, size_t *cap, size_t bytes);

#endif
