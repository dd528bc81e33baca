/*
 * codec_perf.h — what codec_perf.c (command line, data, CPU mode, output helpers) shares with
 * its CUDA mode (codec_perf_cuda.c, built only with CUDA). Not a library header.
 */
#ifndef GCOMP_BENCH_CODEC_PERF_H
#define GCOMP_BENCH_CODEC_PERF_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "bench_util.h" /* KIB, MIB, GIB */
#include "gcomp.h"

#define MAX_ITERS 1000
#define MAX_SPECS 64
#define BENCH_KEY 1 /* any key but GCOMP_KEY_NONE enables the residual */

enum dist {
    DIST_GAUSS,
    DIST_HEAVY
};
enum stat {
    STAT_MEDIAN,
    STAT_BEST
};
enum device {
    DEVICE_CPU,
    DEVICE_CUDA
};

struct config {
    const char *specs[MAX_SPECS];
    size_t nspecs;
    size_t min_bytes, max_bytes, factor;
    int min_set, max_set, factor_set;
    int iters, warmup, ef, json;
    enum dist dist;
    enum stat stat;
    enum device device;
    double scale;
    const char *json_out; /* --json-out FILE: the JSON lines also go there */
};

struct machine {
    char cpu[256];
    char arch[128];
    long nproc;
};

/* Data: the same deterministic tensor in both modes (fixed seed). */
void fill_data(float *x, size_t count, enum dist dist, double scale);
/* ||x - xhat|| / ||x|| in double. */
double rel_error(const float *x, const float *xhat, size_t count);

/* Timing helpers: calls per sample so a sample lasts >= 1 ms; the sample reported. */
long reps_for(double one_call_s);
double pick_sample(double *samples, int n, enum stat stat);
double gbps(double bytes, double s);

gcomp_codec *make_codec(const char *spec, int ef);

/* Output helpers (stdout; progress on stderr when it is a terminal). */
const char *dist_name(enum dist d);
void fmt_size(size_t bytes, char *out, size_t n);
int spec_width(const struct config *cfg);
void json_string(FILE *f, const char *key, const char *s);
void json_number(FILE *f, const char *key, double v);
void progress(const char *what, const char *spec, size_t bytes);
void progress_done(size_t bytes);

/* The --device cuda run: every spec and size on device buffers. payload_cap fits every spec's
 * payload at the largest size. Returns the exit status (0 ok, 1 a failure). */
int codec_perf_cuda(const struct config *cfg, const struct machine *m, size_t payload_cap, FILE *json_out,
                    const char *prog);

#endif /* GCOMP_BENCH_CODEC_PERF_H */
