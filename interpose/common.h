/*
 * common.h — what the two interposers (mpi_allreduce.c: libgcomp_mpi.so, nccl_allreduce.c:
 * libgcomp_nccl.so) share: reading their environment switches, the growth of their
 * per-communicator key tables, and the GCOMP_STATS_FILE plumbing. Static inline, so each .so
 * keeps its own copy and exports nothing more.
 */
#ifndef GCOMP_INTERPOSE_COMMON_H
#define GCOMP_INTERPOSE_COMMON_H

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "gcomp.h"
#include "gcomp_codec.h"

/* A switch as gcomp's config.c reads one: set to any value but "" or "0". */
static inline int ip_env_on(const char *name)
{
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

/* GCOMP_DEBUG as gcomp reads it: "0" and "NONE" (any case) are off, as is unset or "";
 * anything else is on ("1", "INFO"; gcomp's config.c refuses other values, this only logs). */
static inline int ip_env_debug(void)
{
    const char *v = getenv("GCOMP_DEBUG");
    return v && *v && strcmp(v, "0") != 0 && strcasecmp(v, "none") != 0;
}

/* GCOMP_CODEC into codec (empty when unset); 1 when set and not empty (the opt-in). */
static inline int ip_env_codec(char *codec, size_t cap)
{
    const char *v = getenv("GCOMP_CODEC");
    int on = v && *v;
    snprintf(codec, cap, "%s", on ? v : "");
    return on;
}

/* 1 when the spec's first stage is an exact codec ("none", "none+zstd": GCOMP_CAP_EXACT),
 * which keeps no residual: the interposers then give its calls no residual key
 * (GCOMP_KEY_NONE), so their summaries count them as without error feedback and hold no
 * residual keys. An unknown name: 0 (gcomp refuses the spec at creation and says why). */
static inline int ip_codec_exact(const char *spec)
{
    char name[64];
    size_t n = strcspn(spec, ":+");
    const gcomp_codec_vtable *vt;
    if (n >= sizeof name) return 0;
    memcpy(name, spec, n);
    name[n] = 0;
    vt = gcomp_codec_find(name);
    return vt && (vt->caps & GCOMP_CAP_EXACT);
}

/* A program under an interposer expects MPI's and NCCL's own patience: a collective waits
 * for a late peer (one rank checkpointing or evaluating for half an hour while the others
 * wait at the next allreduce is normal), and the job's own watchdog, if any, decides when
 * to give up (PyTorch's process-group timeout aborts through ncclCommAbort, which the NCCL
 * interposer handles). So unless GCOMP_TIMEOUT_MS says otherwise, the interposers give
 * gcomp a deadline of a week instead of gcomp's 300 s (finite: deadlines are doubles of
 * seconds and some waits convert them back to milliseconds). */
#define IP_DEFAULT_TIMEOUT_MS (7LL * 24 * 3600 * 1000)

static inline int64_t ip_timeout_ms(void)
{
    const char *v = getenv("GCOMP_TIMEOUT_MS");
    return v && *v ? GCOMP_UNSET /* gcomp reads (and checks) the variable */ : IP_DEFAULT_TIMEOUT_MS;
}

/* Counters that several threads may bump. */
static inline void ip_bump(uint64_t *c) { __atomic_fetch_add(c, 1, __ATOMIC_RELAXED); }

/* items (n used of *cap, elem bytes each) with room for one more: the same array, or a larger
 * one (*cap updated), or NULL when out of memory (items and *cap unchanged). */
static inline void *ip_room_for_one(void *items, size_t *cap, size_t n, size_t elem)
{
    size_t want = *cap ? 2 * *cap : 16;
    void *p;
    if (n < *cap) return items;
    if (!(p = realloc(items, want * elem))) return NULL;
    *cap = want;
    return p;
}

/* s as the inside of a JSON string (the codec spec comes from the environment). */
static inline void ip_json_string(FILE *f, const char *s)
{
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
}

/* The sum of n counters (the pass-through reasons). */
static inline uint64_t ip_sum(const uint64_t *counts, int n)
{
    uint64_t sum = 0;
    for (int i = 0; i < n; i++) sum += counts[i];
    return sum;
}

/* The stats file's call counts, as both interposers write them: "calls_compressed",
 * "calls_compressed_without_ef", "calls_passed_through" (the sum) and "passed_through", an
 * object of the n reasons by name. */
static inline void ip_json_calls(FILE *f, uint64_t compressed, uint64_t no_ef, uint64_t failed, const uint64_t *passed,
                                 const char *const *names, int n)
{
    fprintf(f,
            "\"calls_compressed\": %" PRIu64 ", \"calls_compressed_without_ef\": %" PRIu64
            ", \"calls_failed\": %" PRIu64 ", \"calls_passed_through\": %" PRIu64 ", \"passed_through\": {",
            compressed, no_ef, failed, ip_sum(passed, n));
    for (int i = 0; i < n; i++) fprintf(f, "%s\"%s\": %" PRIu64, i ? ", " : "", names[i], passed[i]);
    fputc('}', f);
}

/* GCOMP_STATS_FILE's file for this rank, open for writing: every %r in pattern becomes the
 * rank, else ".rank<N>" is appended. NULL (after a line on stderr, who: the library) when it
 * cannot be written. */
static inline FILE *ip_open_stats_file(const char *who, const char *pattern, int rank)
{
    char path[4096];
    size_t o = 0;
    FILE *f;
    for (const char *p = pattern; *p && o + 1 < sizeof path;) {
        if (p[0] == '%' && p[1] == 'r') {
            int w = snprintf(path + o, sizeof path - o, "%d", rank);
            o = w > 0 && (size_t)w < sizeof path - o ? o + (size_t)w : sizeof path - 1;
            p += 2;
        } else {
            path[o++] = *p++;
        }
    }
    path[o] = '\0';
    if (!strstr(pattern, "%r")) snprintf(path + o, sizeof path - o, ".rank%d", rank);
    if (!(f = fopen(path, "w"))) fprintf(stderr, "%s: cannot write GCOMP_STATS_FILE '%s'\n", who, path);
    return f;
}

#endif
