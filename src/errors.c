/* errors.c — result names and messages, the thread-local last error, debug logging. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config.h"      /* gcomp__env_debug */
#include "gcomp_codec.h" /* gcomp_codec_fail */
#include "internal.h"

const char *gcomp_strerror(gcomp_result rc)
{
    switch (rc) {
#define GCOMP_X_MSG(name, value, msg) \
    case name:                        \
        return msg;
        GCOMP_RESULT_LIST(GCOMP_X_MSG)
#undef GCOMP_X_MSG
    }
    return "unknown result code";
}

const char *gcomp_result_name(gcomp_result rc)
{
    switch (rc) {
#define GCOMP_X_NAME(name, value, msg) \
    case name:                         \
        return #name;
        GCOMP_RESULT_LIST(GCOMP_X_NAME)
#undef GCOMP_X_NAME
    }
    return "GCOMP_ERR_UNKNOWN";
}

int gcomp__result_known(gcomp_result rc)
{
    switch (rc) {
#define GCOMP_X_KNOWN(name, value, msg) \
    case name:                          \
        return 1;
        GCOMP_RESULT_LIST(GCOMP_X_KNOWN)
#undef GCOMP_X_KNOWN
    }
    return 0;
}

static _Thread_local char last_error[512];
/* Whether a codec entry that failed gave its own detail (gcomp_codec_fail) or left an older,
 * unrelated one: the failures recorded on this thread so far, and their number when each
 * entry in progress began. A stack, since an entry may call into gcomp (a user codec
 * running a built-in one): an inner entry that succeeds must not hide the outer one's
 * detail. Past ENTRY_DEPTH nested entries the check is skipped (the detail is kept). */
enum {
    ENTRY_DEPTH = 16
};
static _Thread_local unsigned long failures;
static _Thread_local unsigned long entry_mark[ENTRY_DEPTH];
static _Thread_local int entry_depth;

void gcomp__codec_entry_begin(void)
{
    if (entry_depth < ENTRY_DEPTH) entry_mark[entry_depth] = failures;
    entry_depth++;
}

gcomp_result gcomp__codec_not_a_result(const char *codec, const char *entry, gcomp_result rc)
{
    return gcomp__fail(GCOMP_ERR_INTERNAL, "codec '%s': %s returned %d, which is not a gcomp_result", codec, entry,
                       (int)rc);
}

gcomp_result gcomp__codec_entry_rc(const char *codec, const char *entry, gcomp_result rc)
{
    int depth = entry_depth > 0 ? --entry_depth : 0; /* pairs with the entry's begin */
    int detailed = depth >= ENTRY_DEPTH || failures != entry_mark[depth];
    if (rc == GCOMP_SUCCESS) return rc;
    if (!gcomp__result_known(rc)) return gcomp__codec_not_a_result(codec, entry, rc);
    if (!detailed)
        return gcomp__fail(rc, "codec '%s': %s returned %s (the codec gave no detail)", codec, entry,
                           gcomp_result_name(rc));
    return rc;
}

const char *gcomp_last_error(void) { return last_error; }

void gcomp__error_clear(void) { last_error[0] = '\0'; }

void gcomp__error_restore(const char *saved) { snprintf(last_error, sizeof last_error, "%s", saved); }

gcomp_result gcomp__fail_again(gcomp_result rc, const char *detail)
{
    if (rc != GCOMP_SUCCESS) {
        failures++; /* a failure on this thread (a codec entry passing it on gave its detail) */
        gcomp__error_restore(detail);
    }
    return rc;
}

static void log_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static gcomp_result vfail(gcomp_result rc, const char *fmt, va_list ap)
{
    failures++;
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    if (gcomp__debug_enabled()) log_line("%s: %s", gcomp_result_name(rc), last_error);
    return rc;
}

/* Messages echo user text (specs, values, environment variables): control and non-ASCII
 * bytes become \xNN so a message stays one printable line, and text past max_chars is cut
 * with "..." so the reason, printed first, is never pushed out of the 512-byte buffer. */
const char *gcomp__quote(char *out, size_t cap, const char *s, size_t max_chars)
{
    return gcomp__quote_bytes(out, cap, s ? s : "(null)", s ? strlen(s) : 6, max_chars);
}

const char *gcomp__quote_bytes(char *out, size_t cap, const char *s, size_t len, size_t max_chars)
{
    size_t o = 0, i = 0;
    if (!cap) return out;
    for (; i < len && i < max_chars; i++) {
        unsigned char ch = (unsigned char)s[i];
        int printable = ch >= 0x20 && ch < 0x7f && ch != '\\';
        size_t need = printable ? 1 : 4;
        if (o + need + 4 > cap) break; /* room for "..." and the NUL */
        if (printable)
            out[o++] = (char)ch;
        else
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", ch);
    }
    if (i < len && o + 4 <= cap) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o < cap ? o : cap - 1] = '\0';
    return out;
}

gcomp_result gcomp__fail(gcomp_result rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(rc, fmt, ap);
    va_end(ap);
    return rc;
}

/* The codecs' name for gcomp__fail, for text the library did not write: a user codec's
 * message may hold anything, so its control and non-ASCII bytes become \xNN (gcomp__quote)
 * as user text in the library's own messages does (gcomp.h, gcomp_last_error). */
gcomp_result gcomp_codec_fail(gcomp_result rc, const char *fmt, ...)
{
    char raw[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    failures++;
    gcomp__quote(last_error, sizeof last_error, raw, sizeof raw);
    if (gcomp__debug_enabled()) log_line("%s: %s", gcomp_result_name(rc), last_error);
    return rc;
}

/* The process-wide switch (failures, GCOMP_CHECK traces, lines outside any communicator):
 * GCOMP_DEBUG, read once through config.c the first time anything asks. A communicator's
 * own lines follow its gcomp_config.debug instead (gcomp__log). */
static int debug_level;
static pthread_once_t debug_once = PTHREAD_ONCE_INIT;

static void read_debug_env(void) { debug_level = gcomp__env_debug(); }

int gcomp__debug_enabled(void)
{
    pthread_once(&debug_once, read_debug_env);
    return debug_level;
}

/* One line on stderr, "gcomp: " first, written by one stdio call: ranks that are threads of
 * one process (the loopback transport, the progress thread) and processes sharing a pipe
 * under mpirun log at the same time, and a prefix, message and newline written by three
 * calls interleaved into "gcomp: gcomp: <one line><another line>". A line longer than the
 * buffer (gcomp's lines are far shorter) is cut with "...". */
static void vlog(const char *fmt, va_list ap)
{
    static const char prefix[] = "gcomp: ";
    char line[1024];
    size_t n = sizeof prefix - 1, room = sizeof line - 2; /* characters before the newline and NUL */
    int m;
    memcpy(line, prefix, n);
    m = vsnprintf(line + n, room - n + 1, fmt, ap);
    if (m < 0) m = 0;
    if ((size_t)m > room - n) { /* cut: vsnprintf kept room - n characters */
        memcpy(line + room - 3, "...", 3);
        m = (int)(room - n);
    }
    n += (size_t)m;
    line[n++] = '\n';
    line[n] = '\0';
    fputs(line, stderr);
}

static void log_line(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(fmt, ap);
    va_end(ap);
}

void gcomp__debug(const char *fmt, ...)
{
    va_list ap;
    if (!gcomp__debug_enabled()) return;
    va_start(ap, fmt);
    vlog(fmt, ap);
    va_end(ap);
}

void gcomp__log(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(fmt, ap);
    va_end(ap);
}

size_t gcomp_dtype_size(gcomp_dtype dtype)
{
    switch (dtype) {
    case GCOMP_F32:
        return 4;
    case GCOMP_F16:
        return 2;
    case GCOMP_BF16:
        return 2;
    default:
        return 0;
    }
}

gcomp_result gcomp__reserve(void **buf, size_t *cap, size_t bytes)
{
    void *p;
    if (bytes <= *cap) return GCOMP_SUCCESS;
    p = realloc(*buf, bytes);
    if (!p) return gcomp__fail(GCOMP_ERR_NOMEM, "cannot allocate %zu bytes of scratch", bytes);
    *buf = p;
    *cap = bytes;
    return GCOMP_SUCCESS;
}

double gcomp__now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
