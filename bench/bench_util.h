/*
 * bench_util.h — the command-line pieces codec_perf and allreduce_perf share: sizes with
 * K/M/G suffixes (powers of 1024, as nccl-tests), bounded integers, the "bad value" message,
 * and buffers whose pages are touched before timing. Header-only; not a library header.
 */
#ifndef GCOMP_BENCH_UTIL_H
#define GCOMP_BENCH_UTIL_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)

/* "4K", "64M", "1G", "4096"; an optional "B" or "iB" after the suffix. 0 or -1 (bad text,
 * a sign, or more than a size_t holds). */
static inline int bench_parse_size(const char *s, size_t *out)
{
    char *end;
    size_t mult = 1;
    unsigned long long v;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || end == s || *s == '-') return -1;
    switch (*end) {
    case 'k':
    case 'K':
        mult = KIB;
        end++;
        break;
    case 'm':
    case 'M':
        mult = MIB;
        end++;
        break;
    case 'g':
    case 'G':
        mult = GIB;
        end++;
        break;
    default:
        break;
    }
    if (mult > 1 && (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0)) end += strlen(end);
    if (*end != '\0' || v > SIZE_MAX / mult) return -1;
    *out = (size_t)v * mult;
    return 0;
}

/* A decimal integer in [lo, hi], the whole string; 0 or -1. */
static inline int bench_parse_int(const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    long long v;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

/* "<prog>: bad value '<val>' for <opt>: expected <want> (see <help>)" on stderr; returns the
 * bad-usage exit status, 2. */
static inline int bench_bad_value(const char *prog, const char *opt, const char *val, const char *want,
                                  const char *help)
{
    fprintf(stderr, "%s: bad value '%s' for %s: expected %s (see %s)\n", prog, val, opt, want, help);
    return 2;
}

/* bytes (rounded up to whole 4 KiB pages) with every page written now, so page faults stay
 * out of the timed calls. NULL when out of memory; free() it. */
static inline void *bench_alloc_touched(size_t bytes)
{
    size_t rounded = (bytes + 4095) / 4096 * 4096;
    void *p;
    if (bytes > SIZE_MAX - 4095) return NULL; /* the rounding would wrap to a small size */
    p = aligned_alloc(4096, rounded ? rounded : 4096);
    if (p) memset(p, 0, rounded);
    return p;
}

/* Close an output file (f may be NULL: nothing to close) or flush stdout (f == stdout),
 * saying on stderr when any write to it failed (a full disk, /dev/full, a closed pipe):
 * the rows were lost, so the run did not do what it was asked. 0, or 1 after the message. */
static inline int bench_finish_output(FILE *f, const char *prog, const char *name)
{
    int bad;
    if (!f) return 0;
    errno = 0;
    bad = fflush(f) != 0 || ferror(f);
    if (f != stdout) bad |= fclose(f) != 0;
    if (!bad) return 0;
    fprintf(stderr, "%s: cannot write %s%s%s\n", prog, name, errno ? ": " : "", errno ? strerror(errno) : "");
    return 1;
}

#endif /* GCOMP_BENCH_UTIL_H */
