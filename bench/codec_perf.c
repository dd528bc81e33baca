/*
 * codec_perf — single-threaded CPU throughput, compression ratio and error of gcomp codecs;
 * with --device cuda the same on CUDA device buffers (codec_perf_cuda.c).
 *
 * For every codec spec and every buffer size it reports: compression ratio, relative error,
 * encode/decode time, effective encode/decode bandwidth, and the memcpy bandwidth of the
 * same buffer measured in the same run, so a number can be read against what this machine's
 * memory system does for the simplest possible pass over the data.
 *
 * Byte accounting (the same convention for every column, so enc_vs_memcpy is fair): each
 * operation is charged the bytes it must read and write, once each.
 *   encode : gradient read + payload write, plus residual read + residual write with --ef 1
 *   decode : payload read + fp32 accumulator read + accumulator write
 *   memcpy : source read + destination write = 2 x size
 * GB/s = charged bytes / seconds / 1e9.
 *
 * Uses only the public API (gcomp.h); the CUDA mode also calls the CUDA runtime.
 */
#define _GNU_SOURCE /* sched_getaffinity, getopt_long */
#include <errno.h>
#include <float.h>
#include <getopt.h>
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "codec_perf.h"
#include "gcomp.h"

#define DATA_SEED 0x5eed0f9c0a7ULL /* fixed: every run sees the same tensor */
/* A timed sample lasts at least this long, so tiny sizes are not dominated by the clock. */
#define MIN_SAMPLE_S 1e-3
#define MAX_REPS 100000L

static const char *const default_specs[] = {
    "none",
    "fp16",
    "bf16",
    "terngrad",
    "terngrad:bucket=4096",
    "topk:ratio=0.01",
    "topk:ratio=0.001",
    "topk:ratio=0.01,values=fp16",
    "fp16+zstd:level=1",
};

/* Allocated once at the largest size and reused by every row (smaller sizes use a prefix). */
struct buffers {
    float *grad; /* the input tensor */
    float *acc;  /* fp32 accumulator for decode_add */
    void *copy;  /* memcpy destination */
    void *payload;
    size_t payload_cap;
};

struct row {
    const char *spec;
    size_t bytes, wire_bytes;
    double rel_err, enc_s, dec_s, memcpy_s;
    double enc_gbps, dec_gbps, memcpy_gbps;
};

/* ---------------------------------------------------------------------------------------- */
/* Command line                                                                              */
/* ---------------------------------------------------------------------------------------- */

static void usage(FILE *f, const char *prog)
{
    fprintf(f,
            "usage: %s [options] [SPEC ...]\n"
            "\n"
            "Measures gcomp codecs on one CPU thread: compression ratio, relative error, encode and\n"
            "decode time and bandwidth, against memcpy of the same buffer in the same run.\n"
            "With --device cuda: the same on GPU buffers, against cudaMemcpyAsync device to device.\n"
            "\n"
            "SPEC is a codec spec such as 'topk:ratio=0.01,values=fp16' or 'fp16+zstd:level=1'\n"
            "(positional, or repeated --codec SPEC). Default: none fp16 bf16 terngrad\n"
            "terngrad:bucket=4096 topk:ratio=0.01 topk:ratio=0.001 topk:ratio=0.01,values=fp16\n"
            "fp16+zstd:level=1.\n"
            "\n"
            "Sizes (bytes of fp32 data, multiples of 4; suffixes K, M, G are powers of 1024):\n"
            "  -b, --minbytes SIZE   smallest size (default 64M)\n"
            "  -e, --maxbytes SIZE   largest size (default 64M); with only one of -b/-e given the\n"
            "                        other follows it if needed\n"
            "  -f, --stepfactor N    multiply the size by N (integer >= 2) between rows (default 2)\n"
            "  -s, --size SIZE       one size only (same as -b SIZE -e SIZE)\n"
            "  With --device cuda and none of -b/-e/-s/-f: 16M 64M 256M 1G (-b 16M -e 1G -f 4).\n"
            "\n"
            "Device:\n"
            "  --device cpu|cuda     cpu (default): host buffers, one thread. cuda: buffers on the\n"
            "                        current CUDA device; calls run on a stream and are timed with\n"
            "                        CUDA events (encode with gcomp_codec_encode_async, decode with\n"
            "                        gcomp_codec_decode_add_async), memcpy is cudaMemcpyAsync device\n"
            "                        to device. Before timing a spec, its device payloads, residual\n"
            "                        and decode are compared byte for byte with the CPU reference\n"
            "                        (two steps of error feedback at the first size); a spec that\n"
            "                        differs is reported and not timed (exit status 1). Specs the\n"
            "                        device path does not support (+zstd) are skipped with a note.\n"
            "\n"
            "Timing:\n"
            "  -n, --iters N         timed samples (1..%d, default 5)\n"
            "  -w, --warmup N        untimed calls before the samples (default 1); they also size\n"
            "                        the samples: a sample repeats the call until it lasts >= 1 ms\n"
            "      --stat median|best  which sample is reported (default median)\n"
            "\n"
            "Data and codec:\n"
            "  --dist gauss|heavy    gauss: N(0,1) (default); heavy: Student-t, 3 degrees of freedom.\n"
            "                        Deterministic (fixed seed), the same tensor for every codec.\n"
            "  --scale X             multiply the data by X (default 1), e.g. 1e-4 to see fp16\n"
            "                        underflow on realistic gradient magnitudes; one that takes the\n"
            "                        data beyond float's range (inf) is refused\n"
            "  --ef 0|1              1 (default): encode with a key so error feedback is on; the\n"
            "                        timed calls run in steady state (the residual exists).\n"
            "                        0: encode with GCOMP_KEY_NONE (no residual).\n"
            "\n"
            "Output:\n"
            "  --json                one JSON object per row, one per line, instead of the table\n"
            "  --json-out FILE       also write those JSON lines to FILE (with the table or --json)\n"
            "  -h, --help            this text\n"
            "\n"
            "Columns:\n"
            "  cr        raw bytes / wire bytes (headers included)\n"
            "  rel_err   ||x - x^|| / ||x|| in double, x^ decoded (decode_add into zeros) from the\n"
            "            FIRST encode of the tensor in a fresh codec object, i.e. with a zero\n"
            "            residual: the codec's own error, not the error-feedback state. cr and\n"
            "            wire_bytes are of the same payload.\n"
            "  enc_ms, dec_ms   time of one call (median or best sample)\n"
            "  *_GB/s    charged bytes / time / 1e9, each byte charged once:\n"
            "              encode = gradient read + payload write\n"
            "                       (+ residual read + residual write with --ef 1)\n"
            "              decode = payload read + fp32 accumulator read + accumulator write\n"
            "                       (the whole accumulator, even for sparse codecs)\n"
            "              memcpy = source read + destination write = 2 x size\n"
            "  enc/memcpy  enc_GB/s / memcpy_GB/s\n"
            "  cuda mode: copy_GB/s is the device-to-device copy, enc/copy and dec/copy the ratios\n"
            "  JSON keys, both modes: enc_GBps, dec_GBps, copy_GBps (the memcpy, or the device\n"
            "            copy), enc_ratio and dec_ratio (to copy_GBps), enc_ms, dec_ms; memcpy_ms\n"
            "            or copy_ms; device in cuda mode\n"
            "\n"
            "Exit status: 0 ok, 1 a codec call failed or output could not be written, 2 bad usage,\n"
            "a bad spec or no CUDA device for --device cuda.\n",
            prog, MAX_ITERS);
}

/* Sizes, integers and the message for a bad value: bench_util.h, shared with allreduce_perf. */
static int bad_value(const char *prog, const char *opt, const char *val, const char *want)
{
    return bench_bad_value(prog, opt, val, want, "--help");
}

static int add_spec(struct config *cfg, const char *prog, const char *spec)
{
    if (cfg->nspecs == MAX_SPECS) {
        fprintf(stderr, "%s: at most %d specs\n", prog, MAX_SPECS);
        return 2;
    }
    cfg->specs[cfg->nspecs++] = spec;
    return 0;
}

enum {
    OPT_EF = 256,
    OPT_DIST,
    OPT_JSON,
    OPT_JSON_OUT,
    OPT_CODEC,
    OPT_STAT,
    OPT_SCALE,
    OPT_DEVICE
};

/* One option; returns 0, or the exit status (2) on a bad value. */
static int parse_option(struct config *cfg, const char *prog, int c, const char *arg)
{
    long long v;
    char *end;
    switch (c) {
    case 'b':
        if (bench_parse_size(arg, &cfg->min_bytes)) return bad_value(prog, "-b", arg, "a size like 4K");
        cfg->min_set = 1;
        return 0;
    case 'e':
        if (bench_parse_size(arg, &cfg->max_bytes)) return bad_value(prog, "-e", arg, "a size like 64M");
        cfg->max_set = 1;
        return 0;
    case 's':
        if (bench_parse_size(arg, &cfg->min_bytes)) return bad_value(prog, "-s", arg, "a size like 64M");
        cfg->max_bytes = cfg->min_bytes;
        cfg->min_set = cfg->max_set = 1;
        return 0;
    case 'f':
        if (bench_parse_int(arg, 2, 1L << 20, &v)) return bad_value(prog, "-f", arg, "an integer >= 2");
        cfg->factor = (size_t)v;
        cfg->factor_set = 1;
        return 0;
    case 'n':
        if (bench_parse_int(arg, 1, MAX_ITERS, &v)) return bad_value(prog, "-n", arg, "1..1000");
        cfg->iters = (int)v;
        return 0;
    case 'w':
        if (bench_parse_int(arg, 0, MAX_ITERS, &v)) return bad_value(prog, "-w", arg, "0..1000");
        cfg->warmup = (int)v;
        return 0;
    case OPT_EF:
        if (bench_parse_int(arg, 0, 1, &v)) return bad_value(prog, "--ef", arg, "0 or 1");
        cfg->ef = (int)v;
        return 0;
    case OPT_DIST:
        if (strcmp(arg, "gauss") == 0)
            cfg->dist = DIST_GAUSS;
        else if (strcmp(arg, "heavy") == 0)
            cfg->dist = DIST_HEAVY;
        else
            return bad_value(prog, "--dist", arg, "gauss or heavy");
        return 0;
    case OPT_STAT:
        if (strcmp(arg, "median") == 0)
            cfg->stat = STAT_MEDIAN;
        else if (strcmp(arg, "best") == 0)
            cfg->stat = STAT_BEST;
        else
            return bad_value(prog, "--stat", arg, "median or best");
        return 0;
    case OPT_SCALE:
        errno = 0;
        cfg->scale = strtod(arg, &end);
        if (errno || end == arg || *end || !isfinite(cfg->scale) || cfg->scale <= 0)
            return bad_value(prog, "--scale", arg, "a positive finite number");
        return 0;
    case OPT_DEVICE:
        if (strcmp(arg, "cpu") == 0)
            cfg->device = DEVICE_CPU;
        else if (strcmp(arg, "cuda") == 0)
            cfg->device = DEVICE_CUDA;
        else
            return bad_value(prog, "--device", arg, "cpu or cuda");
        return 0;
    case OPT_JSON:
        cfg->json = 1;
        return 0;
    case OPT_JSON_OUT:
        cfg->json_out = arg;
        return 0;
    case OPT_CODEC:
        return add_spec(cfg, prog, arg);
    default:
        return 2;
    }
}

/* Sizes must describe whole floats, and the sweep must be non-empty. */
static int check_sizes(struct config *cfg, const char *prog)
{
    if (cfg->min_bytes > cfg->max_bytes) {
        if (cfg->min_set && !cfg->max_set)
            cfg->max_bytes = cfg->min_bytes;
        else if (cfg->max_set && !cfg->min_set)
            cfg->min_bytes = cfg->max_bytes;
        else {
            fprintf(stderr, "%s: -b %zu is larger than -e %zu\n", prog, cfg->min_bytes, cfg->max_bytes);
            return 2;
        }
    }
    size_t sz[2] = { cfg->min_bytes, cfg->max_bytes };
    for (int i = 0; i < 2; i++) {
        if (sz[i] == 0 || sz[i] % sizeof(float) != 0) {
            fprintf(stderr, "%s: size %zu bytes is not a positive multiple of 4 (the data is fp32)\n", prog, sz[i]);
            return 2;
        }
    }
    return 0;
}

/* Returns -1 to run, or an exit status (0 after --help, 2 on bad usage). */
static int parse_args(int argc, char **argv, struct config *cfg)
{
    static const struct option longopts[] = {
        { "minbytes", required_argument, 0, 'b' },
        { "maxbytes", required_argument, 0, 'e' },
        { "stepfactor", required_argument, 0, 'f' },
        { "size", required_argument, 0, 's' },
        { "iters", required_argument, 0, 'n' },
        { "warmup", required_argument, 0, 'w' },
        { "ef", required_argument, 0, OPT_EF },
        { "dist", required_argument, 0, OPT_DIST },
        { "stat", required_argument, 0, OPT_STAT },
        { "scale", required_argument, 0, OPT_SCALE },
        { "codec", required_argument, 0, OPT_CODEC },
        { "json", no_argument, 0, OPT_JSON },
        { "device", required_argument, 0, OPT_DEVICE },
        { "json-out", required_argument, 0, OPT_JSON_OUT },
        { "help", no_argument, 0, 'h' },
        { 0, 0, 0, 0 },
    };
    const char *prog = argv[0];
    int c, rc;
    /* "-": a SPEC comes back as option 1 where it stands, so positional and --codec specs run
     * in command-line order (those after "--" are left at optind) */
    while ((c = getopt_long(argc, argv, "-b:e:f:s:n:w:h", longopts, NULL)) != -1) {
        if (c == 1) {
            if ((rc = add_spec(cfg, prog, optarg)) != 0) return rc;
            continue;
        }
        if (c == 'h') {
            usage(stdout, prog);
            return bench_finish_output(stdout, prog, "standard output"); /* 1: the help was lost */
        }
        if (c == '?') {
            fprintf(stderr, "%s: see --help\n", prog);
            return 2;
        }
        if ((rc = parse_option(cfg, prog, c, optarg)) != 0) return rc;
    }
    for (int i = optind; i < argc; i++)
        if ((rc = add_spec(cfg, prog, argv[i])) != 0) return rc;
    if (cfg->nspecs == 0)
        for (size_t i = 0; i < sizeof default_specs / sizeof *default_specs; i++)
            cfg->specs[cfg->nspecs++] = default_specs[i];
    /* GPUs are timed where their memory system is the limit: 16M .. 1G unless told. */
    if (cfg->device == DEVICE_CUDA && !cfg->min_set && !cfg->max_set && !cfg->factor_set) {
        cfg->min_bytes = 16 * MIB;
        cfg->max_bytes = GIB;
        cfg->factor = 4;
    }
#ifndef GCOMP_BENCH_CUDA
    if (cfg->device == DEVICE_CUDA) {
        fprintf(stderr,
                "%s: --device cuda: this codec_perf was built without CUDA "
                "(configure with -DGCOMP_WITH_CUDA=ON)\n",
                prog);
        return 2;
    }
#endif
    if ((rc = check_sizes(cfg, prog)) != 0) return rc;
    return -1;
}

/* ---------------------------------------------------------------------------------------- */
/* Data                                                                                      */
/* ---------------------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Uniform in (0, 1): never 0, so log() below is finite. */
static double uniform01(uint64_t *s) { return ((double)(splitmix64(s) >> 11) + 0.5) * 0x1p-53; }

/* Box-Muller; the second value of the pair is dropped, which keeps the code simple and the
 * sequence independent of how the buffer is split. */
static double normal(uint64_t *s)
{
    double u = uniform01(s), v = uniform01(s);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* Student-t with 3 degrees of freedom: Z / sqrt(chi2_3 / 3). Finite variance (3) but
 * infinite kurtosis, like gradients with rare large outliers. */
static double student_t3(uint64_t *s)
{
    double z = normal(s), a = normal(s), b = normal(s), c = normal(s);
    return z / sqrt((a * a + b * b + c * c) / 3.0);
}

/* The next value of the fixed data, at scale 1. */
static double draw(uint64_t *s, enum dist dist) { return dist == DIST_HEAVY ? student_t3(s) : normal(s); }

void fill_data(float *x, size_t count, enum dist dist, double scale)
{
    uint64_t s = DATA_SEED;
    for (size_t i = 0; i < count; i++) x[i] = (float)(scale * draw(&s, dist));
}

/* The largest |value| fill_data writes at scale 1: the data are fixed, so this is the real
 * bound on --scale (the Box-Muller normal is bounded, about 8.65, but the heavy one is not). */
static double data_peak(size_t count, enum dist dist)
{
    uint64_t s = DATA_SEED;
    double peak = 0;
    for (size_t i = 0; i < count; i++) {
        double v = fabs(draw(&s, dist));
        if (v > peak) peak = v;
    }
    return peak;
}

double rel_error(const float *x, const float *xhat, size_t count)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < count; i++) {
        double d = (double)x[i] - (double)xhat[i];
        num += d * d;
        den += (double)x[i] * (double)x[i];
    }
    return den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0.0);
}

/* ---------------------------------------------------------------------------------------- */
/* Timing                                                                                    */
/* ---------------------------------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* An operation to time: returns 0 or a gcomp_result. */
typedef int (*op_fn)(void *ctx);

struct enc_ctx {
    gcomp_codec *codec;
    uint64_t key;
    const float *src;
    size_t count;
    void *dst;
    size_t cap, written;
};

struct dec_ctx {
    gcomp_codec *codec;
    const void *payload;
    size_t bytes;
    float *acc;
    size_t count;
};

struct copy_ctx {
    void *dst;
    const void *src;
    size_t bytes;
};

static int op_encode(void *p)
{
    struct enc_ctx *c = p;
    return gcomp_codec_encode(c->codec, c->key, c->src, c->count, GCOMP_F32, c->dst, c->cap, &c->written);
}

static int op_decode(void *p)
{
    struct dec_ctx *c = p;
    return gcomp_codec_decode_add(c->codec, c->payload, c->bytes, c->acc, c->count);
}

/* Called through a volatile pointer so the compiler cannot merge or drop repeated copies. */
static void *(*volatile memcpy_fn)(void *, const void *, size_t) = memcpy;

static int op_memcpy(void *p)
{
    struct copy_ctx *c = p;
    memcpy_fn(c->dst, c->src, c->bytes);
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The reported sample of n (sorted here): the best, or the median, which for an even n is the
 * mean of the two middle samples (the upper one alone would report the slower of two). */
double pick_sample(double *samples, int n, enum stat stat)
{
    qsort(samples, (size_t)n, sizeof *samples, cmp_double);
    if (stat == STAT_BEST) return samples[0];
    return n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
}

/* Calls per sample so that a sample lasts >= MIN_SAMPLE_S, from one warmup call's time. */
long reps_for(double one_call_s)
{
    if (one_call_s <= 0) return 1;
    double r = ceil(MIN_SAMPLE_S / one_call_s);
    return r < 1 ? 1 : (r > MAX_REPS ? MAX_REPS : (long)r);
}

/* Seconds per call (median or best sample), or -1 if a call failed. */
static double time_op(op_fn fn, void *ctx, const struct config *cfg)
{
    double samples[MAX_ITERS], last = 0;
    for (int i = 0; i < cfg->warmup; i++) {
        double t0 = now_s();
        if (fn(ctx)) return -1;
        last = now_s() - t0;
    }
    long reps = cfg->warmup > 0 ? reps_for(last) : 1;
    for (int i = 0; i < cfg->iters; i++) {
        double t0 = now_s();
        for (long r = 0; r < reps; r++)
            if (fn(ctx)) return -1;
        samples[i] = (now_s() - t0) / (double)reps;
    }
    return pick_sample(samples, cfg->iters, cfg->stat);
}

/* ---------------------------------------------------------------------------------------- */
/* One row: one spec at one size                                                            */
/* ---------------------------------------------------------------------------------------- */

gcomp_codec *make_codec(const char *spec, int ef)
{
    gcomp_codec_options opts = gcomp_codec_options_default();
    opts.error_feedback = ef;
    gcomp_codec *codec = NULL;
    if (gcomp_codec_create(spec, &opts, &codec) != GCOMP_SUCCESS) return NULL;
    return codec;
}

/* The first encode of a fresh object has a zero residual: its error is the codec's own.
 * It also creates the residual, so every later (timed) encode runs in steady state. */
static int first_encode(struct enc_ctx *enc, float *acc, struct row *row)
{
    int rc = op_encode(enc);
    if (rc) return rc;
    memset(acc, 0, enc->count * sizeof(float));
    rc = gcomp_codec_decode_add(enc->codec, enc->dst, enc->written, acc, enc->count);
    if (rc) return rc;
    row->wire_bytes = enc->written;
    row->rel_err = rel_error(enc->src, acc, enc->count);
    return 0;
}

double gbps(double bytes, double s) { return s > 0 ? bytes / s / 1e9 : 0.0; }

/* Fills row; returns 0, or the failing call's result (gcomp_last_error() has the detail). */
static int run_row(const struct config *cfg, struct buffers *buf, const char *spec, size_t bytes, struct row *row)
{
    size_t count = bytes / sizeof(float);
    gcomp_codec *codec = make_codec(spec, cfg->ef);
    if (!codec) return GCOMP_ERR_INVALID_SPEC;
    struct enc_ctx enc = {
        codec, cfg->ef ? BENCH_KEY : GCOMP_KEY_NONE, buf->grad, count, buf->payload, buf->payload_cap, 0
    };
    struct copy_ctx cpy = { buf->copy, buf->grad, bytes };
    struct dec_ctx dec = { codec, buf->payload, 0, buf->acc, count };
    int rc = first_encode(&enc, buf->acc, row);
    if (rc) goto out;
    rc = -1; /* time_op failure: the codec call set gcomp_last_error() */
    /* memcpy first, right before the codec, so both see the same machine state. */
    if ((row->memcpy_s = time_op(op_memcpy, &cpy, cfg)) < 0) goto out;
    if ((row->enc_s = time_op(op_encode, &enc, cfg)) < 0) goto out;
    dec.bytes = enc.written; /* the last timed payload: a steady-state one */
    if ((row->dec_s = time_op(op_decode, &dec, cfg)) < 0) goto out;
    rc = 0;
    row->spec = spec;
    row->bytes = bytes;
    double resid = cfg->ef ? 2.0 * (double)count * sizeof(float) : 0.0;
    row->enc_gbps = gbps((double)bytes + resid + (double)enc.written, row->enc_s);
    row->dec_gbps = gbps((double)enc.written + 2.0 * (double)bytes, row->dec_s);
    row->memcpy_gbps = gbps(2.0 * (double)bytes, row->memcpy_s);
out:
    gcomp_codec_destroy(codec);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Setup                                                                                     */
/* ---------------------------------------------------------------------------------------- */

/* Creates every spec before any output, so a typo fails fast with exit status 2; also
 * finds the payload capacity that fits every codec at the largest size. */
static int check_specs(const struct config *cfg, const char *prog, size_t *payload_cap)
{
    size_t count = cfg->max_bytes / sizeof(float);
    *payload_cap = 0;
    for (size_t i = 0; i < cfg->nspecs; i++) {
        gcomp_codec *codec = make_codec(cfg->specs[i], cfg->ef);
        if (!codec) {
            fprintf(stderr, "%s: %s\n", prog, gcomp_last_error());
            return 2;
        }
        size_t cap = gcomp_codec_max_encoded_bytes(codec, count);
        if (cap > *payload_cap) *payload_cap = cap;
        gcomp_codec_destroy(codec);
    }
    return 0;
}

static void free_buffers(struct buffers *b)
{
    free(b->grad);
    free(b->acc);
    free(b->copy);
    free(b->payload);
}

static int alloc_buffers(struct buffers *b, size_t bytes, size_t payload_cap)
{
    b->grad = bench_alloc_touched(bytes);
    b->acc = bench_alloc_touched(bytes);
    b->copy = bench_alloc_touched(bytes);
    b->payload = bench_alloc_touched(payload_cap);
    b->payload_cap = payload_cap;
    return b->grad && b->acc && b->copy && b->payload ? 0 : -1;
}

static void read_cpu_model(char *out, size_t n)
{
    static const char *const keys[] = { "model name", "Hardware", "cpu model", "Processor" };
    char line[512];
    snprintf(out, n, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!colon) continue;
        for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
            if (strncmp(line, keys[k], strlen(keys[k])) != 0) continue;
            char *v = colon + 1 + strspn(colon + 1, " \t");
            v[strcspn(v, "\n")] = '\0';
            snprintf(out, n, "%s", v);
            fclose(f);
            return;
        }
    }
    fclose(f);
}

/* Like nproc(1): the CPUs this process may run on. */
static long count_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
    return sysconf(_SC_NPROCESSORS_ONLN);
}

static void describe_machine(struct machine *m)
{
    struct utsname u;
    read_cpu_model(m->cpu, sizeof m->cpu);
    snprintf(m->arch, sizeof m->arch, "%s", uname(&u) == 0 ? u.machine : "unknown");
    m->nproc = count_cpus();
}

/* ---------------------------------------------------------------------------------------- */
/* Output                                                                                    */
/* ---------------------------------------------------------------------------------------- */

const char *dist_name(enum dist d) { return d == DIST_HEAVY ? "heavy" : "gauss"; }

void fmt_size(size_t bytes, char *out, size_t n)
{
    if (bytes % GIB == 0)
        snprintf(out, n, "%zuG", bytes / GIB);
    else if (bytes % MIB == 0)
        snprintf(out, n, "%zuM", bytes / MIB);
    else if (bytes % KIB == 0)
        snprintf(out, n, "%zuK", bytes / KIB);
    else
        snprintf(out, n, "%zu", bytes);
}

int spec_width(const struct config *cfg)
{
    size_t w = 4;
    for (size_t i = 0; i < cfg->nspecs; i++)
        if (strlen(cfg->specs[i]) > w) w = strlen(cfg->specs[i]);
    return (int)w;
}

static void print_header(const struct config *cfg, const struct machine *m)
{
    printf("# codec_perf: gcomp %d.%d.%d | %s (%s), nproc %ld | 1 thread\n", GCOMP_VERSION_MAJOR, GCOMP_VERSION_MINOR,
           GCOMP_VERSION_PATCH, m->cpu, m->arch, m->nproc);
    printf("# ef=%d dist=%s scale=%g iters=%d warmup=%d stat=%s\n", cfg->ef, dist_name(cfg->dist), cfg->scale,
           cfg->iters, cfg->warmup, cfg->stat == STAT_BEST ? "best" : "median");
    printf("# GB/s charges each byte once: enc = grad + payload%s, dec = payload + 2 x acc, "
           "memcpy = 2 x size\n",
           cfg->ef ? " + 2 x residual" : "");
    printf("%-*s %6s %8s %10s %11s %11s %9s %9s %11s %10s\n", spec_width(cfg), "spec", "size", "cr", "rel_err",
           "enc_ms", "dec_ms", "enc_GB/s", "dec_GB/s", "memcpy_GB/s", "enc/memcpy");
}

static void print_row_table(const struct config *cfg, const struct row *r)
{
    char size[32];
    fmt_size(r->bytes, size, sizeof size);
    printf("%-*s %6s %8.2f %10.3e %11.6f %11.6f %9.2f %9.2f %11.2f %10.3f\n", spec_width(cfg), r->spec, size,
           (double)r->bytes / (double)r->wire_bytes, r->rel_err, r->enc_s * 1e3, r->dec_s * 1e3, r->enc_gbps,
           r->dec_gbps, r->memcpy_gbps, r->memcpy_gbps > 0 ? r->enc_gbps / r->memcpy_gbps : 0.0);
}

void json_string(FILE *f, const char *key, const char *s)
{
    fprintf(f, "\"%s\":\"", key);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* JSON has no inf/nan: a non-finite value (a broken codec) is written as null. */
void json_number(FILE *f, const char *key, double v)
{
    if (isfinite(v))
        fprintf(f, ",\"%s\":%.6g", key, v);
    else
        fprintf(f, ",\"%s\":null", key);
}

/* Every row carries the machine and settings, so a line pasted alone still says where and
 * how it ran. */
static void print_row_json(FILE *f, const struct config *cfg, const struct machine *m, const struct row *r)
{
    fputc('{', f);
    json_string(f, "spec", r->spec);
    fprintf(f, ",\"bytes\":%zu,\"wire_bytes\":%zu", r->bytes, r->wire_bytes);
    json_number(f, "cr", (double)r->bytes / (double)r->wire_bytes);
    json_number(f, "rel_err", r->rel_err);
    json_number(f, "enc_ms", r->enc_s * 1e3);
    json_number(f, "dec_ms", r->dec_s * 1e3);
    /* the same keys as codec_perf --device cuda (codec_perf_cuda.c): copy = the memcpy here */
    json_number(f, "memcpy_ms", r->memcpy_s * 1e3);
    json_number(f, "enc_GBps", r->enc_gbps);
    json_number(f, "dec_GBps", r->dec_gbps);
    json_number(f, "copy_GBps", r->memcpy_gbps);
    json_number(f, "enc_ratio", r->memcpy_gbps > 0 ? r->enc_gbps / r->memcpy_gbps : 0.0);
    json_number(f, "dec_ratio", r->memcpy_gbps > 0 ? r->dec_gbps / r->memcpy_gbps : 0.0);
    fprintf(f, ",\"ef\":%d,", cfg->ef);
    json_string(f, "dist", dist_name(cfg->dist));
    fprintf(f, ",\"scale\":%g,\"iters\":%d,\"warmup\":%d,", cfg->scale, cfg->iters, cfg->warmup);
    json_string(f, "stat", cfg->stat == STAT_BEST ? "best" : "median");
    fprintf(f, ",\"gcomp_version\":\"%d.%d.%d\",", GCOMP_VERSION_MAJOR, GCOMP_VERSION_MINOR, GCOMP_VERSION_PATCH);
    json_string(f, "cpu", m->cpu);
    fprintf(f, ",\"nproc\":%ld}\n", m->nproc);
}

/* Big tensors take seconds per row; say what is running, on a terminal only. */
void progress(const char *what, const char *spec, size_t bytes)
{
    char size[32];
    if (bytes < 64 * MIB || !isatty(STDERR_FILENO)) return;
    fmt_size(bytes, size, sizeof size);
    fprintf(stderr, "\r%s %s %s ...\033[K", what, spec, size);
}

void progress_done(size_t bytes)
{
    if (bytes >= 64 * MIB && isatty(STDERR_FILENO)) fprintf(stderr, "\r\033[K");
}

/* ---------------------------------------------------------------------------------------- */

static int run_all(const struct config *cfg, struct buffers *buf, const struct machine *m, FILE *json_out,
                   const char *prog)
{
    if (!cfg->json) print_header(cfg, m);
    for (size_t i = 0; i < cfg->nspecs; i++) {
        for (size_t bytes = cfg->min_bytes; bytes <= cfg->max_bytes; bytes *= cfg->factor) {
            struct row row = { 0 };
            progress("running", cfg->specs[i], bytes);
            int rc = run_row(cfg, buf, cfg->specs[i], bytes, &row);
            progress_done(bytes);
            if (rc) {
                fprintf(stderr, "%s: %s at %zu bytes: %s\n", prog, cfg->specs[i], bytes, gcomp_last_error());
                return 1;
            }
            if (cfg->json)
                print_row_json(stdout, cfg, m, &row);
            else
                print_row_table(cfg, &row);
            if (json_out) print_row_json(json_out, cfg, m, &row);
            fflush(stdout);
            if (json_out) fflush(json_out);
            if (bytes > cfg->max_bytes / cfg->factor) break; /* next step would overflow */
        }
    }
    return 0;
}

/* rc, or 1 when it is 0 and the rows could not all be written (the JSON file, stdout). */
static int finish_outputs(int rc, FILE *json_out, const char *json_path, const char *prog)
{
    int lost = bench_finish_output(json_out, prog, json_path);
    lost |= bench_finish_output(stdout, prog, "standard output");
    return rc ? rc : lost;
}

int main(int argc, char **argv)
{
    struct config cfg = { .min_bytes = 64 * MIB,
                          .max_bytes = 64 * MIB,
                          .factor = 2,
                          .iters = 5,
                          .warmup = 1,
                          .ef = 1,
                          .dist = DIST_GAUSS,
                          .stat = STAT_MEDIAN,
                          .scale = 1.0 };
    int rc = parse_args(argc, argv, &cfg);
    if (rc >= 0) return rc;

    size_t payload_cap;
    if ((rc = check_specs(&cfg, argv[0], &payload_cap)) != 0) return rc;

    /* a scale that turns the data into +-inf (rel_err nan) or all of a row's into zeros
     * (rel_err 0, as if every codec were exact) measures nothing. Every row takes a prefix of
     * the same data: the largest row has the largest |value|, the smallest row the smallest
     * peak (the one that must not vanish) */
    if (cfg.scale != 1) {
        double peak = data_peak(cfg.max_bytes / sizeof(float), cfg.dist);
        float top = (float)(cfg.scale * peak);
        if (!isinf(top)) {
            peak = data_peak(cfg.min_bytes / sizeof(float), cfg.dist);
            top = (float)(cfg.scale * peak);
        }
        if (isinf(top) || top == 0) {
            char val[32], want[160];
            snprintf(val, sizeof val, "%g", cfg.scale);
            if (isinf(top))
                snprintf(want, sizeof want,
                         "a scale below %.3g: the data's largest |value| is %.4g, and float ends at %g", FLT_MAX / peak,
                         peak, FLT_MAX);
            else
                snprintf(want, sizeof want,
                         "a scale above %.3g: the smallest size's largest |value| is %.4g, and float's smallest is %g",
                         0x1p-150 / peak, peak, 0x1p-149);
            return bad_value(argv[0], "--scale", val, want);
        }
    }

    struct machine m;
    describe_machine(&m);
    FILE *json_out = NULL;
    if (cfg.json_out && !(json_out = fopen(cfg.json_out, "w"))) {
        fprintf(stderr, "%s: --json-out %s: %s\n", argv[0], cfg.json_out, strerror(errno));
        return 1; /* output that could not be written, as the help says */
    }
#ifdef GCOMP_BENCH_CUDA
    if (cfg.device == DEVICE_CUDA) {
        rc = codec_perf_cuda(&cfg, &m, payload_cap, json_out, argv[0]);
        return finish_outputs(rc, json_out, cfg.json_out, argv[0]);
    }
#endif

    struct buffers buf = { 0 };
    if (alloc_buffers(&buf, cfg.max_bytes, payload_cap)) {
        fprintf(stderr, "%s: out of memory for %zu-byte buffers\n", argv[0], cfg.max_bytes);
        free_buffers(&buf);
        if (json_out) fclose(json_out);
        return 1;
    }
    progress("generating", dist_name(cfg.dist), cfg.max_bytes);
    fill_data(buf.grad, cfg.max_bytes / sizeof(float), cfg.dist, cfg.scale);
    progress_done(cfg.max_bytes);

    rc = run_all(&cfg, &buf, &m, json_out, argv[0]);
    free_buffers(&buf);
    return finish_outputs(rc, json_out, cfg.json_out, argv[0]);
}
