/*
 * allreduce_perf — gcomp_allreduce against plain MPI_Allreduce of the same buffers in the same
 * run, reported in the conventions of nccl-tests' all_reduce_perf. Run it under mpirun.
 *
 * For every codec and every size it creates a communicator, checks the first call's result
 * against every rank's regenerated input (see check_result), times -n calls of
 * gcomp_allreduce and then -n calls of MPI_Allreduce on the same send and receive buffers. A time is the mean over the -n calls of the slowest rank
 * (MPI_Barrier before the loop, max over ranks after it): nccl-tests averages over ranks, but
 * a synchronous training step waits for the slowest one.
 *
 * Bandwidths are always computed from the UNCOMPRESSED size, so a codec that sends fewer
 * bytes shows as more bus bandwidth and the columns stay comparable with nccl-tests:
 *   algbw = size / time,  busbw = algbw * 2(n-1)/n.
 *
 * Each rank's input is a deterministic function of (rank, element index), so rank 0 can
 * regenerate every rank's input and compute the exact sum without any extra communication.
 *
 * --device cuda (builds with NCCL): the same rows on device buffers of each rank's GPU, with
 * the caller's stream, over two transports in turn -- NCCL (gcomp_comm_create_nccl over an
 * NCCL communicator of the benchmark) and MPI (gcomp_comm_create_mpi: device buffers staged
 * through host memory) -- against ncclAllReduce of the same device buffers in the same run
 * (without NCCL, e.g. ranks sharing a GPU: device->host copy, MPI_Allreduce, host->device).
 * Times include a stream synchronisation after the -n calls. The check reads the result back.
 *
 * Uses only the public API (gcomp.h, gcomp_mpi.h, gcomp_nccl.h through allreduce_perf_cuda.c).
 */
#define _GNU_SOURCE /* getopt_long, gethostname */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>

#include "bench_util.h" /* KIB, MIB, GIB, sizes and integers on the command line */
#include "gcomp.h"
#include "gcomp_mpi.h"

#ifdef GCOMP_BENCH_CUDA
#include "allreduce_perf_cuda.h"
#else
/* a build without CUDA and NCCL: --device cuda says so and stops */
static int apc_open(MPI_Comm w, size_t bytes, int want_nccl, char *why, size_t cap)
{
    (void)w, (void)bytes, (void)want_nccl;
    snprintf(why, cap, "this allreduce_perf was built without CUDA and NCCL (GCOMP_WITH_NCCL)");
    return -1;
}
static void apc_close(void) {}
static int apc_has_nccl(void) { return 0; }
static const char *apc_device_name(void) { return ""; }
static int apc_device(void) { return -1; }
static void *apc_send(void) { return NULL; }
static void *apc_recv(void) { return NULL; }
static struct CUstream_st *apc_stream(void) { return NULL; }
static int apc_h2d(void *d, const void *s, size_t n) { return (void)d, (void)s, (void)n, 1; }
static int apc_d2h(void *d, const void *s, size_t n) { return (void)d, (void)s, (void)n, 1; }
static int apc_memset(void *d, size_t n) { return (void)d, (void)n, 1; }
static int apc_sync(void) { return 0; }
static gcomp_result apc_comm_nccl(const gcomp_config *cfg, gcomp_comm **out)
{
    (void)cfg, (void)out;
    return GCOMP_ERR_UNSUPPORTED;
}
static int apc_nccl_allreduce(size_t count, gcomp_dtype dtype, gcomp_op op)
{
    return (void)count, (void)dtype, (void)op, 1;
}
#endif

#define MAX_CODECS 32
#define MAX_ITERS 100000
#define BENCH_KEY 1                /* one tensor; the communicator keeps its residual */
#define DATA_SEED 0x5eed0f9c0a7ULL /* fixed: every run sees the same tensors */
#define GOLDEN 0x9e3779b97f4a7c15ULL

static const char *const default_codecs[] = { "none", "fp16", "terngrad", "topk:ratio=0.01" };

struct options {
    const char *codecs[MAX_CODECS];
    size_t ncodecs;
    size_t min_bytes, max_bytes, factor;
    int iters, warmup, check, ef, verbose;
    long long gcomp_min_bytes;
    gcomp_op op;
    gcomp_dtype dtype;
    const char *json_path;
    int talk;       /* only rank 0 prints usage errors, so they appear once */
    int cuda;       /* --device cuda */
    int transports; /* --transport: TR_NCCL | TR_MPI (device cuda) */
};

enum {
    TR_NCCL = 1,
    TR_MPI = 2
};

/* One rank's state for the whole run; buffers are sized for the largest row. */
struct bench {
    struct options o;
    int rank, nranks;
    void *send, *recv;
    uint64_t *per_rank; /* nranks entries: generator streams, result hashes */
    MPI_Datatype mpi_type;
    MPI_Op mpi_op;
    int own_op; /* mpi_op was created here (half types) and must be freed */
    FILE *json;
    double busbw_sum, base_busbw_sum;
    long long rows, nwrong_total;
    const char *transport; /* of the rows being run: "mpi", or "nccl" (device cuda) */
    char no_nccl[200];     /* device cuda: why NCCL is not used, "" when it is */
};

struct row {
    const char *codec, *transport;
    size_t bytes, count;
    double time_s, base_s;
    double wire_bytes;           /* per rank per call, max over ranks */
    double enc_s, comm_s, dec_s; /* per call, max over ranks (gcomp_comm_stats) */
    long long nwrong;            /* -1 when not checked */
    double rel_err, max_abs_err;
    gcomp_schedule schedule;
};

/* ---------------------------------------------------------------------------------------- */
/* Command line                                                                              */
/* ---------------------------------------------------------------------------------------- */

static void usage(FILE *f, const char *prog)
{
    fprintf(f,
            "usage: mpirun -np N %s [options]\n"
            "\n"
            "Times gcomp_allreduce and plain MPI_Allreduce of the same buffers in the same run and\n"
            "reports them like nccl-tests' all_reduce_perf (out-of-place only).\n"
            "\n"
            "  -b, --minbytes SIZE     smallest size (default 64M, or -e if that is smaller);\n"
            "                          K, M, G are powers of 1024; sizes are whole elements of -d\n"
            "  -e, --maxbytes SIZE     largest size (default 64M, or -b if that is larger)\n"
            "  -f, --stepfactor N      multiply the size by N (integer >= 2) between rows (default 2)\n"
            "  -n, --iters N           timed calls per measurement (default 20)\n"
            "  -w, --warmup_iters N    untimed calls before each measurement (default 5)\n"
            "  -c, --check 0|1         check the first call's result (default 1; see #wrong below)\n"
            "  -o, --op sum|avg        reduction (default sum)\n"
            "  -d, --datatype T        float, half or bfloat16 (default float)\n"
            "      --codec SPEC        gcomp codec spec; repeat for several blocks of rows\n"
            "                          (default: none, fp16, terngrad, topk:ratio=0.01)\n"
            "      --ef 0|1            error feedback (default 1); the timed calls run with the\n"
            "                          residual of the warmup calls, i.e. in steady state\n"
            "      --min-bytes N       gcomp_config.min_bytes (default 0; a size as for -b): tensors\n"
            "                          under N bytes bypass compression. 0 compresses every size, so small\n"
            "                          rows show the codec's own overhead instead of a bypass.\n"
            "      --device host|cuda  host (default): host buffers over MPI. cuda: device buffers\n"
            "                          of each rank's GPU (node-local rank modulo the GPUs) and the\n"
            "                          call's stream; the baseline is ncclAllReduce of the same\n"
            "                          buffers (needs a build with NCCL; without an NCCL\n"
            "                          communicator, e.g. ranks sharing a GPU: copy to the host,\n"
            "                          MPI_Allreduce, copy back)\n"
            "      --transport T       device cuda: nccl, mpi or all (default all): gcomp over NCCL\n"
            "                          (gcomp_comm_create_nccl) and/or over MPI (gcomp_comm_create_mpi,\n"
            "                          device buffers staged through host memory), a block each;\n"
            "                          --device host runs over MPI only (nccl is refused)\n"
            "  -J, --json FILE         also write one JSON object per row to FILE (JSON lines)\n"
            "  -v, --verbose           print where gcomp's time goes (encode, comm, decode)\n"
            "  -h, --help              this text\n"
            "\n"
            "Columns (bandwidths from the uncompressed size, like nccl-tests):\n"
            "  time      us per gcomp_allreduce, mean of -n calls, slowest rank\n"
            "  algbw     size / time (GB/s);  busbw = algbw * 2(n-1)/n\n"
            "  #wrong    elements that are not what the codec must give, plus ranks whose result\n"
            "            differs in any bit from rank 0's. The check uses the FIRST call of a fresh\n"
            "            communicator (zero residual) and regenerates every rank's input:\n"
            "              none, fp16, bf16 (and any codec below --min-bytes): within a bound of the\n"
            "                exact sum, S = sum_r |x_r|: 1e-5 S, (n+1)(1e-3 S + 2^-24),\n"
            "                (n+1)(8e-3 S + 2^-133);\n"
            "              top-k: the sum of each rank's k largest |x| (ties: lower index);\n"
            "              terngrad: the shared scale times an integer that each rank's sign allows,\n"
            "                and no drift from the expected sum beyond a Hoeffding bound (false alarm\n"
            "                1e-12; a drift counts every element). Needs a few thousand elements.\n"
            "            avg divides by n; half/bfloat16 data add one output rounding.\n"
            "  wire_B    bytes one rank sends per call (gcomp_comm_stats), max over ranks\n"
            "  cr        2(n-1)/n * size (what a plain ring sends per rank) / wire_B; n/a (null\n"
            "            in the JSON) at one rank, which sends nothing\n"
            "  rel_err   ||y - exact|| / ||exact|| of the checked call; max_err its max |y - exact|\n"
            "  base_us   us per MPI_Allreduce of the same buffers (half types: a user-defined\n"
            "            MPI_Op summing in fp32; avg: sum, then a local division, timed);\n"
            "            device cuda: per ncclAllReduce of the same device buffers\n"
            "  speedup   base_us / time;  sched  the schedule gcomp ran\n"
            "\n"
            "Data: Gaussian-like (Irwin-Hall sum of 4 uniforms, mean 0, sd 1), a fixed function of\n"
            "(rank, index), the same for every codec. Exit status: 0 ok, 1 wrong results (with -c 1),\n"
            "a failed call or output that could not be written, 2 bad usage.\n",
            prog);
}

/* Only rank 0 says it; every rank returns the bad-usage status. */
static int bad_value(const struct options *o, const char *opt, const char *val, const char *want)
{
    return o->talk ? bench_bad_value("allreduce_perf", opt, val, want, "-h") : 2;
}

static int parse_dtype(const char *s, gcomp_dtype *out)
{
    if (strcmp(s, "float") == 0 || strcmp(s, "f32") == 0)
        *out = GCOMP_F32;
    else if (strcmp(s, "half") == 0 || strcmp(s, "f16") == 0)
        *out = GCOMP_F16;
    else if (strcmp(s, "bfloat16") == 0 || strcmp(s, "bf16") == 0)
        *out = GCOMP_BF16;
    else
        return -1;
    return 0;
}

enum {
    OPT_CODEC = 256,
    OPT_EF,
    OPT_MIN_BYTES,
    OPT_DEVICE,
    OPT_TRANSPORT
};

/* One option; returns 0, or the exit status (2) on a bad value. */
static int parse_option(struct options *o, int c, const char *arg)
{
    long long v;
    switch (c) {
    case 'b':
        return bench_parse_size(arg, &o->min_bytes) ? bad_value(o, "-b", arg, "a size like 64M") : 0;
    case 'e':
        return bench_parse_size(arg, &o->max_bytes) ? bad_value(o, "-e", arg, "a size like 64M") : 0;
    case 'f':
        if (bench_parse_int(arg, 2, 1 << 20, &v)) return bad_value(o, "-f", arg, "an integer >= 2");
        o->factor = (size_t)v;
        return 0;
    case 'n':
    case 'w':
        if (bench_parse_int(arg, c == 'n', MAX_ITERS, &v))
            return bad_value(o, c == 'n' ? "-n" : "-w", arg, c == 'n' ? "1..100000" : "0..100000");
        *(c == 'n' ? &o->iters : &o->warmup) = (int)v;
        return 0;
    case 'c':
    case OPT_EF:
        if (bench_parse_int(arg, 0, 1, &v)) return bad_value(o, c == 'c' ? "-c" : "--ef", arg, "0 or 1");
        *(c == 'c' ? &o->check : &o->ef) = (int)v;
        return 0;
    case 'o':
        if (strcmp(arg, "sum") == 0)
            o->op = GCOMP_SUM;
        else if (strcmp(arg, "avg") == 0)
            o->op = GCOMP_AVG;
        else
            return bad_value(o, "-o", arg, "sum or avg");
        return 0;
    case 'd':
        return parse_dtype(arg, &o->dtype) ? bad_value(o, "-d", arg, "float, half or bfloat16") : 0;
    case OPT_MIN_BYTES: {
        size_t n;
        /* a size like -b's (4K, 1M): the same tool should read bytes one way */
        if (bench_parse_size(arg, &n) || n > LLONG_MAX) return bad_value(o, "--min-bytes", arg, "a size like 4K");
        o->gcomp_min_bytes = (long long)n;
    }
        return 0;
    case OPT_CODEC:
        if (o->ncodecs == MAX_CODECS) return bad_value(o, "--codec", arg, "at most 32 codecs");
        o->codecs[o->ncodecs++] = arg;
        return 0;
    case 'J':
        o->json_path = arg;
        return 0;
    case OPT_DEVICE:
        if (strcmp(arg, "host") != 0 && strcmp(arg, "cpu") != 0 && strcmp(arg, "cuda") != 0)
            return bad_value(o, "--device", arg, "host or cuda");
        o->cuda = strcmp(arg, "cuda") == 0;
        return 0;
    case OPT_TRANSPORT:
        if (strcmp(arg, "nccl") == 0)
            o->transports = TR_NCCL;
        else if (strcmp(arg, "mpi") == 0)
            o->transports = TR_MPI;
        else if (strcmp(arg, "all") == 0)
            o->transports = TR_NCCL | TR_MPI;
        else
            return bad_value(o, "--transport", arg, "nccl, mpi or all");
        return 0;
    case 'v':
        o->verbose = 1;
        return 0;
    default:
        return 2;
    }
}

/* The sweep must describe at least one whole element and fit MPI's int counts. */
static int check_sizes(struct options *o, int min_set, int max_set)
{
    size_t esize = gcomp_dtype_size(o->dtype);
    /* the one of -b/-e not given follows the other past its default */
    if (!max_set && o->max_bytes < o->min_bytes) o->max_bytes = o->min_bytes;
    if (!min_set && o->min_bytes > o->max_bytes) o->min_bytes = o->max_bytes;
    if (o->min_bytes > o->max_bytes) {
        if (o->talk) fprintf(stderr, "allreduce_perf: -b %zu is larger than -e %zu\n", o->min_bytes, o->max_bytes);
        return 2;
    }
    if (o->min_bytes < esize || o->max_bytes / esize > INT_MAX) {
        if (o->talk) fprintf(stderr, "allreduce_perf: sizes must hold 1 to INT_MAX elements of %zu bytes\n", esize);
        return 2;
    }
    /* a row of whole elements only: -b 6 of float would run 4 bytes under a header saying 6
     * (the -f steps of a multiple stay multiples) */
    if (o->min_bytes % esize || o->max_bytes % esize) {
        if (o->talk)
            fprintf(stderr, "allreduce_perf: -b %zu and -e %zu must be multiples of the element size (%zu bytes)\n",
                    o->min_bytes, o->max_bytes, esize);
        return 2;
    }
    return 0;
}

/* Returns -1 to run, or an exit status (0 after -h, 2 on bad usage). */
static int parse_args(int argc, char **argv, struct options *o)
{
    static const struct option longopts[] = {
        { "minbytes", required_argument, 0, 'b' },
        { "maxbytes", required_argument, 0, 'e' },
        { "stepfactor", required_argument, 0, 'f' },
        { "iters", required_argument, 0, 'n' },
        { "warmup_iters", required_argument, 0, 'w' },
        { "check", required_argument, 0, 'c' },
        { "op", required_argument, 0, 'o' },
        { "datatype", required_argument, 0, 'd' },
        { "json", required_argument, 0, 'J' },
        { "verbose", no_argument, 0, 'v' },
        { "codec", required_argument, 0, OPT_CODEC },
        { "ef", required_argument, 0, OPT_EF },
        { "min-bytes", required_argument, 0, OPT_MIN_BYTES },
        { "device", required_argument, 0, OPT_DEVICE },
        { "transport", required_argument, 0, OPT_TRANSPORT },
        { "help", no_argument, 0, 'h' },
        { 0, 0, 0, 0 },
    };
    int c, rc, min_set = 0, max_set = 0;
    opterr = o->talk;
    while ((c = getopt_long(argc, argv, "b:e:f:n:w:c:o:d:J:vh", longopts, NULL)) != -1) {
        if (c == 'h') {
            if (!o->talk) return 0;
            usage(stdout, argv[0]);
            return bench_finish_output(stdout, "allreduce_perf", "standard output"); /* 1: the help was lost */
        }
        if (c == '?') return 2;
        min_set |= c == 'b';
        max_set |= c == 'e';
        if ((rc = parse_option(o, c, optarg)) != 0) return rc;
    }
    if (optind < argc) {
        if (o->talk) fprintf(stderr, "allreduce_perf: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (o->transports == TR_NCCL && !o->cuda) { /* host buffers go over MPI only */
        if (o->talk)
            fprintf(stderr, "allreduce_perf: --transport nccl needs --device cuda (--device host runs over MPI)\n");
        return 2;
    }
    if (o->ncodecs == 0)
        for (size_t i = 0; i < sizeof default_codecs / sizeof *default_codecs; i++)
            o->codecs[o->ncodecs++] = default_codecs[i];
    return check_sizes(o, min_set, max_set) ? 2 : -1;
}

/* Every spec is parsed before any MPI traffic, so a typo fails fast on every rank alike. */
static int check_codecs(const struct options *o)
{
    for (size_t i = 0; i < o->ncodecs; i++) {
        gcomp_codec *codec = NULL;
        if (gcomp_codec_create(o->codecs[i], NULL, &codec) != GCOMP_SUCCESS) {
            if (o->talk) fprintf(stderr, "allreduce_perf: %s\n", gcomp_last_error());
            return 2;
        }
        gcomp_codec_destroy(codec);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Data                                                                                      */
/* ---------------------------------------------------------------------------------------- */

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t rank_stream(int rank) { return mix64(DATA_SEED + GOLDEN * (uint64_t)(rank + 1)); }

/* Element i of a rank's gradient: a counter-based generator, so any rank can compute any
 * element of any rank. Irwin-Hall sum of four 16-bit uniforms: mean 0, sd 1, bell-shaped,
 * bounded by 2*sqrt(3); one hash per element keeps regenerating n tensors cheap. */
static float grad_value(uint64_t stream, size_t i)
{
    uint64_t h = mix64(stream + GOLDEN * (uint64_t)i);
    uint32_t s =
        (uint32_t)(h & 0xffff) + (uint32_t)((h >> 16) & 0xffff) + (uint32_t)((h >> 32) & 0xffff) + (uint32_t)(h >> 48);
    return (float)((((double)s + 2.0) / 65536.0 - 2.0) * 1.7320508075688772);
}

static void store_value(void *buf, size_t i, float v, gcomp_dtype d)
{
    if (d == GCOMP_F16)
        ((uint16_t *)buf)[i] = gcomp_f32_to_f16(v);
    else if (d == GCOMP_BF16)
        ((uint16_t *)buf)[i] = gcomp_f32_to_bf16(v);
    else
        ((float *)buf)[i] = v;
}

static double load_value(const void *buf, size_t i, gcomp_dtype d)
{
    if (d == GCOMP_F16) return gcomp_f16_to_f32(((const uint16_t *)buf)[i]);
    if (d == GCOMP_BF16) return gcomp_bf16_to_f32(((const uint16_t *)buf)[i]);
    return ((const float *)buf)[i];
}

/* What a rank actually sends: the generated value rounded to the benchmark's dtype. */
static double input_value(uint64_t stream, size_t i, gcomp_dtype d)
{
    float v = grad_value(stream, i);
    if (d == GCOMP_F16) return gcomp_f16_to_f32(gcomp_f32_to_f16(v));
    if (d == GCOMP_BF16) return gcomp_bf16_to_f32(gcomp_f32_to_bf16(v));
    return v;
}

static void fill_input(void *buf, size_t count, int rank, gcomp_dtype d)
{
    uint64_t stream = rank_stream(rank);
    for (size_t i = 0; i < count; i++) store_value(buf, i, grad_value(stream, i), d);
}

/* ---------------------------------------------------------------------------------------- */
/* The check (rank 0): every rank's input regenerated, the result compared element by element */
/* ---------------------------------------------------------------------------------------- */

/* The check is written from the codecs' documented definitions (gcomp.h and the codecs' headers), not
 * from the library's code: it is an independent reference. none, fp16 and bf16 must be
 * within a per-element error bound of the exact sum. top-k and TernGrad are checked against
 * what they must produce, since a bound on their error is loose enough to pass a wrong
 * result (an all-zero result is within |exact| <= sum_r |x_r| of the exact sum):
 *   top-k     each rank keeps its k largest |x| (ties: lower index), so the result is the
 *             sum of the kept values (rounded to fp16 with values=fp16);
 *   TernGrad  each element is the shared scale s times an integer m, and each rank's code
 *             is 0 or the sign of its x (the sign, surely, where |x| >= s: clipped), which
 *             bounds m; codes are random with E[s t] = clamp(x, -s, s), so the sum over the
 *             elements of (y - E[y]) sign(E[y]) must be within a Hoeffding bound (a false
 *             alarm once in 10^12 runs): an all-zero or halved result fails it. */

/* Per-element bound on |y - exact| of a SUM (none, fp16, bf16, and every codec at a bypass,
 * which sums exactly): s_abs * S + abs, where S = sum_r |x_r| of the element. */
struct bound {
    double s_abs, abs;
    double out_u, out_abs; /* one rounding of the result to a half dtype */
    double div;            /* n for avg, else 1 */
};

/* The element codec is the spec's first name: "topk" of "topk:ratio=0.01+zstd". */
static int codec_is(const char *spec, const char *name)
{
    size_t n = strcspn(spec, ":+,");
    return strlen(name) == n && strncmp(spec, name, n) == 0;
}

/* The value of parameter `name` of a canonical spec's element codec (gcomp_comm_codec:
 * "topk:ratio=0.05,k=0,values=fp16+zstd:level=1", every parameter given, numbers without a
 * '+'), or def when it has none. */
static double spec_param(const char *spec, const char *name, double def)
{
    const char *end = spec + strcspn(spec, "+"), *p = memchr(spec, ':', (size_t)(end - spec));
    size_t len = strlen(name);
    while (p) {
        p++; /* past the ':' or ',' */
        if (strncmp(p, name, len) == 0 && p[len] == '=') return strtod(p + len + 1, NULL);
        p = memchr(p, ',', (size_t)(end - p));
    }
    return def;
}

static struct bound make_bound(const char *spec, int n, gcomp_op op, gcomp_dtype dtype, int exact_sum)
{
    struct bound b = { 0 };
    if (exact_sum || codec_is(spec, "none"))
        b.s_abs = 1e-5;
    else if (codec_is(spec, "fp16")) {
        /* every hop rounds a partial sum once; subnormals add an absolute 2^-25 each */
        b.s_abs = (n + 1) * 1e-3;
        b.abs = (n + 1) * 0x1p-24;
    } else {
        b.s_abs = (n + 1) * 8e-3; /* bf16: its subnormals are 2^-133 apart */
        b.abs = (n + 1) * 0x1p-133;
    }
    if (dtype == GCOMP_F16)
        b.out_u = 0x1p-11, b.out_abs = 0x1p-25;
    else if (dtype == GCOMP_BF16)
        b.out_u = 0x1p-8, b.out_abs = 0x1p-134;
    b.div = op == GCOMP_AVG ? n : 1;
    return b;
}

/* codec: a bound on the error of the (undivided) sum; adds the division and the output
 * rounding of the result's dtype. */
static double output_bound(const struct bound *b, double s, double codec)
{
    codec /= b->div;
    return codec + b->out_u * (s / b->div + codec) + b->out_abs;
}

struct check {
    long long nwrong;
    double rel_err, max_abs_err;
};

/* The codec's error against the exact sum (what rel_err and max_err report). */
static void add_error(struct check *out, double y, double exact, double *num, double *den)
{
    double err = fabs(y - exact);
    /* a NaN element makes max_err NaN, as it makes rel_err: a later finite one must not hide it */
    if (!(err <= out->max_abs_err) && !isnan(out->max_abs_err)) out->max_abs_err = err;
    *num += err * err;
    *den += exact * exact;
}

static void finish_error(struct check *out, double num, double den)
{
    out->rel_err = den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0.0);
}

/* |x| as top-k compares it: the bits of the fp32 value without the sign. */
static uint32_t magnitude_key(double x)
{
    float f = (float)x;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u & 0x7fffffffu;
}

/* Rank r keeps the elements whose key is above *thr, and the first *ties (lowest indices)
 * of those equal to it: two histogram passes (high, then low 16 bits) over its input. */
static void topk_threshold(uint64_t stream, size_t count, gcomp_dtype d, uint64_t k, size_t *hist, uint32_t *thr,
                           uint64_t *ties)
{
    uint64_t above = 0;
    uint32_t hi = 0, lo = 0;
    memset(hist, 0, 65536 * sizeof *hist);
    for (size_t i = 0; i < count; i++) hist[magnitude_key(input_value(stream, i, d)) >> 16]++;
    for (hi = 65535; hi > 0 && above + hist[hi] < k; hi--) above += hist[hi];
    memset(hist, 0, 65536 * sizeof *hist);
    for (size_t i = 0; i < count; i++) {
        uint32_t key = magnitude_key(input_value(stream, i, d));
        if (key >> 16 == hi) hist[key & 0xffff]++;
    }
    for (lo = 65535; lo > 0 && above + hist[lo] < k; lo--) above += hist[lo];
    *thr = hi << 16 | lo;
    *ties = k - above;
}

/* k of a top-k spec for count elements (codecs/topk.h): k= if given, else ceil(ratio n),
 * within [1, n]. */
static uint64_t topk_k(const char *spec, size_t count)
{
    double k = spec_param(spec, "k", 0), ratio = spec_param(spec, "ratio", 0.01);
    double want = k > 0 ? k : ceil(ratio * (double)count);
    if (want < 1) want = 1;
    return want > (double)count ? count : (uint64_t)want;
}

/* Zeroed memory for the check, or the end of the run (the check runs on rank 0 alone). */
static void *check_calloc(size_t n, size_t size)
{
    void *p = calloc(n, size);
    if (!p) {
        fprintf(stderr, "allreduce_perf: out of memory for the check\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return p;
}

/* b->per_rank holds every rank's generator stream (check_result). */
static void check_topk(const struct bench *b, const char *spec, size_t count, struct check *out)
{
    int n = b->nranks, fp16 = strstr(spec, "values=fp16") != NULL; /* only top-k has values= */
    const uint64_t *streams = b->per_rank;
    uint64_t k = topk_k(spec, count), *ties = check_calloc((size_t)n, sizeof *ties);
    uint64_t *kept_ties = check_calloc((size_t)n, sizeof *kept_ties);
    uint32_t *thr = check_calloc((size_t)n, sizeof *thr);
    size_t *hist = check_calloc(65536, sizeof *hist);
    struct bound bd = make_bound(spec, n, b->o.op, b->o.dtype, 0);
    double num = 0, den = 0;
    for (int r = 0; r < n; r++) topk_threshold(streams[r], count, b->o.dtype, k, hist, &thr[r], &ties[r]);
    for (size_t i = 0; i < count; i++) {
        double sum = 0, kept = 0, kept_abs = 0, y = load_value(b->recv, i, b->o.dtype);
        for (int r = 0; r < n; r++) {
            double x = input_value(streams[r], i, b->o.dtype);
            uint32_t key = magnitude_key(x);
            sum += x;
            if (key > thr[r] || (key == thr[r] && kept_ties[r]++ < ties[r])) kept += x, kept_abs += fabs(x);
        }
        /* fp32 sums of at most n kept values; values=fp16 rounds each kept value once */
        double codec = n * 0x1p-23 * kept_abs + (fp16 ? 0x1p-11 * kept_abs + n * 0x1p-24 : 0);
        if (!(fabs(y - kept / bd.div) <= output_bound(&bd, kept_abs, codec))) out->nwrong++; /* NaN too */
        add_error(out, y, sum / bd.div, &num, &den);
    }
    finish_error(out, num, den);
    free(ties), free(kept_ties), free(thr), free(hist);
}

/* TernGrad's shared scale of each bucket (codecs/terngrad.h): each rank's max |x| over the
 * bucket, or with clip > 0 min(max |x|, clip * rms) rounded to fp32; the max over ranks. */
static float *terngrad_scales(const struct bench *b, size_t count, size_t bucket, double clip)
{
    size_t nb = (count + bucket - 1) / bucket;
    float *scale = check_calloc(nb, sizeof *scale);
    for (int r = 0; r < b->nranks; r++) {
        uint64_t stream = b->per_rank[r];
        for (size_t j = 0; j < nb; j++) {
            size_t lo = j * bucket, hi = lo + bucket < count ? lo + bucket : count;
            double mx = 0, ss = 0;
            for (size_t i = lo; i < hi; i++) {
                double x = (float)input_value(stream, i, b->o.dtype);
                mx = fabs(x) > mx ? fabs(x) : mx;
                ss += x * x;
            }
            double rms_cap = clip * sqrt(ss / (double)(hi - lo));
            float s = (float)(clip > 0 && rms_cap < mx ? rms_cap : mx);
            scale[j] = s > scale[j] ? s : scale[j];
        }
    }
    return scale;
}

static void check_terngrad(const struct bench *b, const char *spec, size_t count, struct check *out)
{
    int n = b->nranks;
    const uint64_t *streams = b->per_rank;
    double bucket_param = spec_param(spec, "bucket", 0);
    size_t bucket = bucket_param > 0 ? (size_t)bucket_param : count;
    float *scale = terngrad_scales(b, count, bucket, spec_param(spec, "clip", 2.5));
    struct bound bd = make_bound(spec, n, b->o.op, b->o.dtype, 0);
    double num = 0, den = 0, drift = 0, width2 = 0, rounding = 0;
    for (size_t i = 0; i < count; i++) {
        double s = scale[i / bucket], y = load_value(b->recv, i, b->o.dtype), sum = 0, mean = 0;
        if (s == 0) { /* every rank's bucket is zero: so is the result */
            out->nwrong += y != 0;
            continue;
        }
        int m_lo = 0, m_hi = 0, free_codes = 0;
        for (int r = 0; r < n; r++) {
            double x = (float)input_value(streams[r], i, b->o.dtype);
            int sign = (x > 0) - (x < 0);
            sum += x;
            mean += x > s ? s : x < -s ? -s : x;
            if (fabs(x) > s * (1 + 1e-6)) { /* clipped: the sign, surely */
                m_lo += sign, m_hi += sign;
            } else if (sign) { /* 0 or the sign (within 1e-6 of s too: no code is sure) */
                if (sign > 0)
                    m_hi++;
                else
                    m_lo--;
                free_codes++;
            }
        }
        double q = y * bd.div / s, m = nearbyint(q);
        /* fp32 products and the avg's division round once each; a half dtype once more */
        double slack = 1e-5 * (1 + fabs(q)) + (bd.out_u * fabs(y) + bd.out_abs) * bd.div / s;
        if (!(fabs(q - m) <= slack && m >= m_lo && m <= m_hi)) out->nwrong++; /* NaN too */
        drift += (y * bd.div - mean) * ((mean > 0) - (mean < 0));
        width2 += s * s * free_codes; /* each free code is its own variable, of range s */
        rounding += slack * s;
        add_error(out, y, sum / bd.div, &num, &den);
    }
    /* Hoeffding: P(|drift| >= t) <= 2 exp(-2 t^2 / width2) = 1e-12 at t^2 = width2 * 14.2 */
    if (!(fabs(drift) <= sqrt(14.2 * width2) + rounding)) {
        fprintf(stderr, "allreduce_perf: %s: the result's drift from its expectation, %g, is beyond %g\n", spec, drift,
                sqrt(14.2 * width2) + rounding);
        out->nwrong = (long long)count; /* the result as a whole is wrong */
    }
    finish_error(out, num, den);
    free(scale);
}

/* none, fp16, bf16, and every codec at a bypass: within the bound of the exact sum. */
static void check_bounded(const struct bench *b, const char *spec, size_t count, int exact_sum, struct check *out)
{
    struct bound bd = make_bound(spec, b->nranks, b->o.op, b->o.dtype, exact_sum);
    double num = 0, den = 0;
    for (size_t i = 0; i < count; i++) {
        double sum = 0, s_abs = 0, y = load_value(b->recv, i, b->o.dtype);
        for (int r = 0; r < b->nranks; r++) {
            double x = input_value(b->per_rank[r], i, b->o.dtype);
            sum += x;
            s_abs += fabs(x);
        }
        if (!(fabs(y - sum / bd.div) <= output_bound(&bd, s_abs, bd.s_abs * s_abs + bd.abs))) out->nwrong++;
        add_error(out, y, sum / bd.div, &num, &den);
    }
    finish_error(out, num, den);
}

/* Regenerates every rank's input and checks y (b->recv) against it; sched: the schedule the
 * call ran (a bypass sums exactly, whatever the codec). */
static void check_result(const struct bench *b, const char *spec, gcomp_schedule sched, size_t count, struct check *out)
{
    memset(out, 0, sizeof *out);
    for (int r = 0; r < b->nranks; r++) b->per_rank[r] = rank_stream(r);
    if (sched == GCOMP_SCHED_BYPASS || codec_is(spec, "none") || codec_is(spec, "fp16") || codec_is(spec, "bf16"))
        check_bounded(b, spec, count, sched == GCOMP_SCHED_BYPASS, out);
    else if (codec_is(spec, "topk"))
        check_topk(b, spec, count, out);
    else
        check_terngrad(b, spec, count, out);
}

/* FNV-1a over 8-byte words of the result (sizes are whole elements, the tail is bytes):
 * every rank must hold the same bits. */
static uint64_t hash_bytes(const void *p, size_t n)
{
    const unsigned char *c = p;
    uint64_t h = 0xcbf29ce484222325ULL, w;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&w, c + i, 8);
        h = (h ^ w) * 0x100000001b3ULL;
    }
    for (; i < n; i++) h = (h ^ c[i]) * 0x100000001b3ULL;
    return h;
}

/* Ranks whose result differs in any bit from rank 0's (valid on rank 0). */
static int count_divergent(const struct bench *b, size_t bytes)
{
    uint64_t mine = hash_bytes(b->recv, bytes), *all = b->per_rank;
    int bad = 0;
    MPI_Gather(&mine, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    if (b->rank != 0) return 0;
    for (int r = 1; r < b->nranks; r++) {
        if (all[r] == all[0]) continue;
        fprintf(stderr, "allreduce_perf: rank %d's result differs from rank 0's\n", r);
        bad++;
    }
    return bad;
}

/* ---------------------------------------------------------------------------------------- */
/* Calls and timing                                                                          */
/* ---------------------------------------------------------------------------------------- */

static void die_gcomp(const struct bench *b, const char *what, gcomp_result rc)
{
    fprintf(stderr, "allreduce_perf: rank %d: %s: %s (%s)\n", b->rank, what, gcomp_last_error(), gcomp_result_name(rc));
    MPI_Abort(MPI_COMM_WORLD, 1); /* a failed collective would leave the others hanging */
}

/* The buffers of gcomp's calls and of the baseline: host, or this rank's device buffers. */
static void *call_send(const struct bench *b) { return b->o.cuda ? apc_send() : b->send; }
static void *call_recv(const struct bench *b) { return b->o.cuda ? apc_recv() : b->recv; }

/* What the baseline column times: MPI_Allreduce (host), ncclAllReduce (device cuda), or
 * the host MPI_Allreduce between copies (device cuda without NCCL). */
static const char *baseline_name(const struct bench *b)
{
    if (!b->o.cuda) return "MPI_Allreduce";
    return apc_has_nccl() ? "ncclAllReduce" : "host MPI_Allreduce";
}

/* Half types have no MPI datatype: the baseline sums them through a user op, in fp32 per
 * pair as NCCL does, with the same bytes on the wire as gcomp's input. */
static void sum_f16(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    const uint16_t *a = in;
    uint16_t *y = inout;
    (void)dt;
    for (int i = 0; i < *len; i++) y[i] = gcomp_f32_to_f16(gcomp_f16_to_f32(a[i]) + gcomp_f16_to_f32(y[i]));
}

static void sum_bf16(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    const uint16_t *a = in;
    uint16_t *y = inout;
    (void)dt;
    for (int i = 0; i < *len; i++) y[i] = gcomp_f32_to_bf16(gcomp_bf16_to_f32(a[i]) + gcomp_bf16_to_f32(y[i]));
}

static void setup_baseline_op(struct bench *b)
{
    b->own_op = b->o.dtype != GCOMP_F32;
    b->mpi_type = b->own_op ? MPI_UINT16_T : MPI_FLOAT;
    b->mpi_op = MPI_SUM;
    if (b->o.dtype == GCOMP_F16)
        MPI_Op_create(sum_f16, 1, &b->mpi_op);
    else if (b->o.dtype == GCOMP_BF16)
        MPI_Op_create(sum_bf16, 1, &b->mpi_op);
}

/* MPI has no average: sum, then divide locally (part of the timed call). */
static void host_baseline_call(const struct bench *b, size_t count)
{
    int err = MPI_Allreduce(b->send, b->recv, (int)count, b->mpi_type, b->mpi_op, MPI_COMM_WORLD);
    if (err != MPI_SUCCESS) MPI_Abort(MPI_COMM_WORLD, 1);
    if (b->o.op != GCOMP_AVG) return;
    float inv = 1.0f / (float)b->nranks;
    for (size_t i = 0; i < count; i++)
        store_value(b->recv, i, (float)load_value(b->recv, i, b->o.dtype) * inv, b->o.dtype);
}

/* Device cuda: ncclAllReduce of the device buffers; without NCCL, what a program with a
 * CUDA-unaware MPI does (device to host, MPI_Allreduce, host to device). */
static void baseline_call(const struct bench *b, size_t count)
{
    size_t bytes = count * gcomp_dtype_size(b->o.dtype);
    if (!b->o.cuda) {
        host_baseline_call(b, count);
        return;
    }
    if (apc_has_nccl()) {
        if (apc_nccl_allreduce(count, b->o.dtype, b->o.op)) MPI_Abort(MPI_COMM_WORLD, 1);
        return;
    }
    if (apc_d2h(b->send, apc_send(), bytes)) MPI_Abort(MPI_COMM_WORLD, 1);
    host_baseline_call(b, count);
    if (apc_h2d(apc_recv(), b->recv, bytes)) MPI_Abort(MPI_COMM_WORLD, 1);
}

/* One call of gcomp (comm != NULL) or of the baseline (comm == NULL). */
static void one_call(const struct bench *b, gcomp_comm *comm, size_t count)
{
    if (!comm) {
        baseline_call(b, count);
        return;
    }
    gcomp_result rc = gcomp_allreduce(comm, call_send(b), call_recv(b), count, b->o.dtype, b->o.op, BENCH_KEY,
                                      b->o.cuda ? apc_stream() : NULL);
    if (rc != GCOMP_SUCCESS) die_gcomp(b, "gcomp_allreduce", rc);
}

/* Seconds per call of the slowest rank, after the warmup calls. */
static double time_calls(const struct bench *b, gcomp_comm *comm, size_t count)
{
    for (int i = 0; i < b->o.warmup; i++) one_call(b, comm, count);
    if (comm) gcomp_comm_stats_reset(comm); /* wire bytes and phases of the timed calls */
    if (b->o.cuda && apc_sync()) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < b->o.iters; i++) one_call(b, comm, count);
    if (b->o.cuda && apc_sync()) MPI_Abort(MPI_COMM_WORLD, 1); /* the calls' work is done */
    double t = (MPI_Wtime() - t0) / b->o.iters, tmax;
    MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return tmax;
}

/* ---------------------------------------------------------------------------------------- */
/* One row: one codec at one size                                                           */
/* ---------------------------------------------------------------------------------------- */

static gcomp_comm *make_comm(const struct bench *b, const char *spec)
{
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *comm = NULL;
    cfg.codec = spec;
    cfg.min_bytes = b->o.gcomp_min_bytes;
    cfg.error_feedback = b->o.ef;
    int nccl = b->o.cuda && strcmp(b->transport, "nccl") == 0;
    gcomp_result rc = nccl ? apc_comm_nccl(&cfg, &comm) : gcomp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &comm);
    if (rc != GCOMP_SUCCESS) die_gcomp(b, nccl ? "gcomp_comm_create_nccl" : "gcomp_comm_create_mpi", rc);
    return comm;
}

/* The first call of a fresh communicator has a zero residual, so its error is the codec's
 * own and the bounds above apply; later calls carry error feedback. */
static void first_call_check(const struct bench *b, gcomp_comm *comm, struct row *row)
{
    gcomp_comm_stats st;
    memset(b->recv, 0, row->bytes); /* a stale result from another row cannot pass */
    if (b->o.cuda && apc_memset(apc_recv(), row->bytes)) MPI_Abort(MPI_COMM_WORLD, 1);
    one_call(b, comm, row->count);
    if (b->o.cuda && (apc_sync() || apc_d2h(b->recv, apc_recv(), row->bytes))) MPI_Abort(MPI_COMM_WORLD, 1);
    int divergent = count_divergent(b, row->bytes);
    gcomp_comm_stats_get(comm, &st);
    if (b->rank == 0) {
        struct check ck;
        /* the canonical spec names every parameter, defaults included, in plain numbers */
        check_result(b, gcomp_comm_codec(comm), st.last_schedule, row->count, &ck);
        row->nwrong = ck.nwrong + divergent;
        row->rel_err = ck.rel_err;
        row->max_abs_err = ck.max_abs_err;
    }
    MPI_Barrier(MPI_COMM_WORLD); /* rank 0's check is slow: keep it out of the warmup */
}

/* Per-call wire bytes and phase times of the timed calls, max over ranks. */
static void collect_stats(gcomp_comm *comm, struct row *row)
{
    gcomp_comm_stats st;
    gcomp_comm_stats_get(comm, &st);
    double calls = st.calls ? (double)st.calls : 1.0, mine[4], mx[4];
    mine[0] = (double)st.wire_bytes / calls;
    mine[1] = st.encode_s / calls;
    mine[2] = st.comm_s / calls;
    mine[3] = st.decode_s / calls;
    MPI_Reduce(mine, mx, 4, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    row->wire_bytes = mx[0];
    row->enc_s = mx[1];
    row->comm_s = mx[2];
    row->dec_s = mx[3];
    row->schedule = st.last_schedule;
}

static void run_row(const struct bench *b, const char *spec, size_t count, struct row *row)
{
    memset(row, 0, sizeof *row);
    row->codec = spec;
    row->transport = b->transport;
    row->count = count;
    row->bytes = count * gcomp_dtype_size(b->o.dtype);
    row->nwrong = -1;
    row->rel_err = row->max_abs_err = NAN;
    gcomp_comm *comm = make_comm(b, spec);
    if (b->o.check) first_call_check(b, comm, row);
    row->time_s = time_calls(b, comm, count);
    collect_stats(comm, row);
    gcomp_comm_destroy(comm); /* frees its scratch before the baseline runs */
    row->base_s = time_calls(b, NULL, count);
}

/* ---------------------------------------------------------------------------------------- */
/* Output (rank 0)                                                                           */
/* ---------------------------------------------------------------------------------------- */

static const char *dtype_name(gcomp_dtype d)
{
    return d == GCOMP_F16 ? "half" : d == GCOMP_BF16 ? "bfloat16" : "float";
}

static const char *op_name(gcomp_op op) { return op == GCOMP_AVG ? "avg" : "sum"; }

static double bus_factor(int n) { return n > 1 ? 2.0 * (n - 1) / n : 0.0; }

static double algbw(size_t bytes, double s) { return s > 0 ? (double)bytes / s / 1e9 : 0.0; }

/* What a plain ring sends per rank over what gcomp sent: NaN when nothing moves (n = 1). */
static double ratio(const struct bench *b, const struct row *r)
{
    return r->wire_bytes > 0 ? bus_factor(b->nranks) * (double)r->bytes / r->wire_bytes : NAN;
}

struct peer {
    int pid, device;
    char host[64], dev[64];
};

/* nccl-tests names every rank's host and device; here the "device" is host memory. */
static void print_ranks(const struct bench *b)
{
    struct peer me = { (int)getpid(), b->o.cuda ? apc_device() : -1, "", "" }, *all = NULL;
    gethostname(me.host, sizeof me.host - 1);
    snprintf(me.dev, sizeof me.dev, "%s", b->o.cuda ? apc_device_name() : "");
    if (b->rank == 0 && !(all = malloc(sizeof *all * (size_t)b->nranks))) return;
    MPI_Gather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (b->rank != 0) return;
    printf("# Using devices\n");
    for (int r = 0; r < b->nranks; r++)
        if (b->o.cuda)
            printf("#  Rank %2d Group  0 Pid %6d on %10s device %2d [%s]\n", r, all[r].pid, all[r].host, all[r].device,
                   all[r].dev);
        else
            printf("#  Rank %2d Group  0 Pid %6d on %10s device host [host memory, MPI]\n", r, all[r].pid, all[r].host);
    free(all);
}

static void print_header(const struct bench *b)
{
    const struct options *o = &b->o;
    printf("# nThread 1 nGpus %d minBytes %zu maxBytes %zu step: %zu(factor) warmup iters: %d "
           "iters: %d agg iters: 1 validation: %d graph: 0\n",
           o->cuda, o->min_bytes, o->max_bytes, o->factor, o->warmup, o->iters, o->check);
    printf("#\n# gcomp %d.%d.%d allreduce_perf: nranks %d, ef %d, min_bytes %lld, codecs:", GCOMP_VERSION_MAJOR,
           GCOMP_VERSION_MINOR, GCOMP_VERSION_PATCH, b->nranks, o->ef, o->gcomp_min_bytes);
    for (size_t i = 0; i < o->ncodecs; i++) printf(" %s", o->codecs[i]);
    if (!o->cuda)
        printf("\n# baseline: MPI_Allreduce on MPI_COMM_WORLD, same buffers, same run\n#\n");
    else if (apc_has_nccl())
        printf("\n# device cuda; baseline: ncclAllReduce of the same device buffers, same stream, same run\n#\n");
    else
        printf("\n# device cuda; baseline: device->host copy, MPI_Allreduce, host->device copy (no NCCL: %s)\n#\n",
               b->no_nccl);
}

static void print_block_header(const struct bench *b, const char *spec)
{
    gcomp_codec *codec = NULL;
    gcomp_codec_create(spec, NULL, &codec); /* checked at startup */
    printf("#\n# codec %s (%s), nranks %d", spec, codec ? gcomp_codec_spec(codec) : "?", b->nranks);
    if (b->o.cuda)
        printf(", device buffers, gcomp over %s", strcmp(b->transport, "nccl") == 0
                                                      ? "NCCL (gcomp_comm_create_nccl)"
                                                      : "MPI (gcomp_comm_create_mpi, staged through host memory)");
    printf("\n");
    gcomp_codec_destroy(codec);
    printf("#                                                    gcomp_allreduce, out-of-place"
           "                                                   %s\n",
           baseline_name(b));
    printf("#       size         count      type   redop    root       time    algbw    busbw "
           "#wrong        wire_B       cr    rel_err    max_err      base_us  speedup  sched\n");
    printf("#        (B)    (elements)                                 (us)   (GB/s)   (GB/s) "
           "       (B/rank/call)                                        (us)\n");
    fflush(stdout); /* rows on slow links take minutes: show what is running */
}

/* A ratio's cell: "n/a" where it is undefined (cr at one rank, which sends nothing), as the
 * JSON's null. */
static const char *ratio_cell(char *buf, size_t n, double v)
{
    if (!isfinite(v)) return "n/a";
    snprintf(buf, n, "%.2f", v);
    return buf;
}

static void print_row(const struct bench *b, const struct row *r)
{
    double bw = algbw(r->bytes, r->time_s);
    char wrong[24] = "N/A", rel[24] = "N/A", max_err[24] = "N/A"; /* -c 0: not checked */
    char cr[24], speedup[24];
    if (r->nwrong >= 0) {
        snprintf(wrong, sizeof wrong, "%lld", r->nwrong);
        snprintf(rel, sizeof rel, "%.3e", r->rel_err);
        snprintf(max_err, sizeof max_err, "%.3e", r->max_abs_err);
    }
    printf("%12zu  %12zu  %8s  %6s  %6d %10.1f %8.3f %8.3f %6s %13.0f %8s %10s %10s "
           "%12.1f %8s  %s\n",
           r->bytes, r->count, dtype_name(b->o.dtype), op_name(b->o.op), -1, r->time_s * 1e6, bw,
           bw * bus_factor(b->nranks), wrong, r->wire_bytes, ratio_cell(cr, sizeof cr, ratio(b, r)), rel, max_err,
           r->base_s * 1e6, ratio_cell(speedup, sizeof speedup, r->base_s / r->time_s),
           gcomp_schedule_name(r->schedule));
    if (b->o.verbose)
        printf("#   phases per call, us, each the max over ranks: encode %.1f  comm %.1f  "
               "decode %.1f  (call %.1f)\n",
               r->enc_s * 1e6, r->comm_s * 1e6, r->dec_s * 1e6, r->time_s * 1e6);
    fflush(stdout);
}

/* JSON has no inf/nan: a non-finite value is written as null. */
static void json_num(FILE *f, const char *key, double v)
{
    if (isfinite(v))
        fprintf(f, ",\"%s\":%.9g", key, v);
    else
        fprintf(f, ",\"%s\":null", key);
}

/* Spec strings are plain ASCII without quotes (the parser rejects anything else). */
static void json_row(const struct bench *b, const struct row *r)
{
    FILE *f = b->json;
    double bw = algbw(r->bytes, r->time_s), base_bw = algbw(r->bytes, r->base_s);
    fprintf(f, "{\"size\":%zu,\"count\":%zu,\"type\":\"%s\",\"redop\":\"%s\",\"root\":-1", r->bytes, r->count,
            dtype_name(b->o.dtype), op_name(b->o.op));
    json_num(f, "time_us", r->time_s * 1e6);
    json_num(f, "algbw", bw);
    json_num(f, "busbw", bw * bus_factor(b->nranks));
    if (r->nwrong < 0)
        fprintf(f, ",\"nwrong\":null");
    else
        fprintf(f, ",\"nwrong\":%lld", r->nwrong);
    fprintf(f, ",\"codec\":\"%s\",\"schedule\":\"%s\",\"nranks\":%d", r->codec, gcomp_schedule_name(r->schedule),
            b->nranks);
    fprintf(f, ",\"device\":\"%s\",\"transport\":\"%s\",\"baseline\":\"%s\"", b->o.cuda ? "cuda" : "host", r->transport,
            baseline_name(b));
    json_num(f, "wire_bytes", r->wire_bytes);
    json_num(f, "cr", ratio(b, r));
    json_num(f, "rel_err", r->rel_err);
    json_num(f, "max_abs_err", r->max_abs_err);
    json_num(f, "baseline_time_us", r->base_s * 1e6);
    json_num(f, "baseline_busbw", base_bw * bus_factor(b->nranks));
    json_num(f, "speedup", r->base_s / r->time_s);
    json_num(f, "encode_us", r->enc_s * 1e6);
    json_num(f, "comm_us", r->comm_s * 1e6);
    json_num(f, "decode_us", r->dec_s * 1e6);
    fprintf(f, ",\"ef\":%d,\"min_bytes\":%lld,\"iters\":%d,\"warmup\":%d}\n", b->o.ef, b->o.gcomp_min_bytes, b->o.iters,
            b->o.warmup);
    fflush(f);
}

static void record_row(struct bench *b, const struct row *r)
{
    if (b->rank != 0) return;
    print_row(b, r);
    if (b->json) json_row(b, r);
    b->busbw_sum += algbw(r->bytes, r->time_s) * bus_factor(b->nranks);
    b->base_busbw_sum += algbw(r->bytes, r->base_s) * bus_factor(b->nranks);
    b->rows++;
    if (r->nwrong > 0) b->nwrong_total += r->nwrong;
}

/* The two footer lines scripts parse from nccl-tests, plus the baseline's average. */
static void print_footer(const struct bench *b)
{
    double n = b->rows ? (double)b->rows : 1.0;
    printf("#\n# %s avg bus bandwidth : %g\n", baseline_name(b), b->base_busbw_sum / n);
    printf("# Out of bounds values : %lld %s\n", b->nwrong_total, b->nwrong_total ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g \n#\n", b->busbw_sum / n);
}

/* ---------------------------------------------------------------------------------------- */
/* Setup                                                                                     */
/* ---------------------------------------------------------------------------------------- */

/* Rank 0 only; opened before any row so a bad path fails before minutes of work. */
static int open_json(struct bench *b)
{
    int ok = 1;
    if (b->rank == 0 && b->o.json_path) {
        b->json = fopen(b->o.json_path, "w");
        if (!b->json) {
            fprintf(stderr, "allreduce_perf: cannot write %s: %s\n", b->o.json_path, strerror(errno));
            ok = 0;
        }
    }
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    return ok ? 0 : 1; /* output that could not be written, as the help says */
}

static int setup(struct bench *b)
{
    size_t count = b->o.max_bytes / gcomp_dtype_size(b->o.dtype);
    b->send = bench_alloc_touched(b->o.max_bytes);
    b->recv = bench_alloc_touched(b->o.max_bytes);
    b->per_rank = malloc(sizeof *b->per_rank * (size_t)b->nranks);
    int ok = b->send && b->recv && b->per_rank, all_ok;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all_ok) {
        if (!ok) fprintf(stderr, "allreduce_perf: rank %d: out of memory\n", b->rank);
        return 1;
    }
    /* smaller rows use a prefix: element i has the same value at every size */
    fill_input(b->send, count, b->rank, b->o.dtype);
    setup_baseline_op(b);
    if (b->o.cuda) {
        char why[200];
        int mine = apc_open(MPI_COMM_WORLD, b->o.max_bytes, (b->o.transports & TR_NCCL) != 0, why, sizeof why) == 0;
        mine = mine && apc_h2d(apc_send(), b->send, b->o.max_bytes) == 0;
        MPI_Allreduce(&mine, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (!all_ok) {
            if (!mine) fprintf(stderr, "allreduce_perf: rank %d: --device cuda: %s\n", b->rank, why);
            return 2;
        }
        snprintf(b->no_nccl, sizeof b->no_nccl, "%s", apc_has_nccl() ? "" : why);
    }
    return open_json(b);
}

/* Frees what setup made; 1 if rank 0's rows could not be written (its JSON file or its
 * standard output), else 0. */
static int teardown(struct bench *b)
{
    int lost = bench_finish_output(b->json, "allreduce_perf", b->o.json_path);
    if (b->rank == 0) lost |= bench_finish_output(stdout, "allreduce_perf", "standard output");
    if (b->own_op) MPI_Op_free(&b->mpi_op);
    if (b->o.cuda) apc_close();
    free(b->send);
    free(b->recv);
    free(b->per_rank);
    return lost;
}

/* The rows of one codec over one transport. */
static void run_block(struct bench *b, const char *spec)
{
    size_t esize = gcomp_dtype_size(b->o.dtype);
    if (b->rank == 0) print_block_header(b, spec);
    for (size_t bytes = b->o.min_bytes; bytes <= b->o.max_bytes; bytes *= b->o.factor) {
        struct row row;
        run_row(b, spec, bytes / esize, &row);
        record_row(b, &row);
        if (bytes > b->o.max_bytes / b->o.factor) break; /* the next step would overflow */
    }
}

static void run_all(struct bench *b)
{
    if (b->rank == 0) print_header(b);
    print_ranks(b);
    if (b->o.cuda && b->rank == 0 && !apc_has_nccl()) printf("# NCCL not used: %s\n", b->no_nccl);
    for (size_t c = 0; c < b->o.ncodecs; c++) {
        if (b->o.cuda && (b->o.transports & TR_NCCL) && apc_has_nccl()) {
            b->transport = "nccl";
            run_block(b, b->o.codecs[c]);
        }
        if (!b->o.cuda || (b->o.transports & TR_MPI)) {
            b->transport = "mpi";
            run_block(b, b->o.codecs[c]);
        }
    }
    if (b->rank == 0) print_footer(b);
}

/* Parses and checks the arguments: -1 to run, 0 after -h, 2 for bad usage. */
static int usage_status(int argc, char **argv, struct options *o)
{
    int rc = parse_args(argc, argv, o);
    return rc < 0 && check_codecs(o) ? 2 : rc;
}

/* Ranks may be launched with different arguments (mpirun -np 1 A : -np 1 B): bad usage on
 * any rank ends every rank with status 2, where the others would wait for it in the first
 * collective, and -h on any rank (none refused) ends every rank with status 0. Only rank 0
 * prints, so when its own arguments ran the lowest rank that refused (or asked for help)
 * parses its arguments again, aloud. */
static int agree_usage(int rc, int rank, int argc, char **argv, struct options defaults)
{
    int mine[3] = { rc, rc == 2 ? -rank : INT_MIN, rc == 0 ? -rank : INT_MIN }, all[3];
    MPI_Allreduce(mine, all, 3, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    int speaker = all[0] == 2 ? -all[1] : all[0] == 0 ? -all[2] : 0;
    if (speaker != 0 && rank == speaker) {
        if (all[0] == 2)
            fprintf(stderr, "allreduce_perf: rank %d refused its arguments (rank 0 did not):\n", rank);
        else
            printf("allreduce_perf: rank %d was asked for help (-h); no rank runs:\n", rank);
        defaults.talk = 1;
        optind = 0; /* getopt_long starts over */
        (void)usage_status(argc, argv, &defaults);
    }
    return all[0];
}

/* Ranks launched with other arguments (mpirun's MPMD "A : B") would run other loops, e.g. another
 * -n, and wait for each other for good: every rank compares a hash of its arguments (argv[0]
 * aside) with the others' and all refuse to run, with status 2, when any differs. */
static int agree_arguments(int rank, int argc, char **argv)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a, each argument with its terminating NUL */
    for (int i = 1; i < argc; i++)
        for (const char *p = argv[i];; p++) {
            h = (h ^ (unsigned char)*p) * 1099511628211ull;
            if (!*p) break;
        }
    uint64_t mine[2] = { h, ~h }, all[2];
    MPI_Allreduce(mine, all, 2, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    if (all[0] == h && all[1] == ~h) return -1;
    if (rank == 0)
        fprintf(stderr, "allreduce_perf: the ranks were launched with different arguments: give every rank the "
                        "same ones\n");
    return 2;
}

int main(int argc, char **argv)
{
    struct bench b = { 0 };
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &b.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &b.nranks);
    b.o = (struct options){ .min_bytes = 64 * MIB,
                            .max_bytes = 64 * MIB,
                            .factor = 2,
                            .iters = 20,
                            .warmup = 5,
                            .check = 1,
                            .ef = 1,
                            .gcomp_min_bytes = 0,
                            .op = GCOMP_SUM,
                            .dtype = GCOMP_F32,
                            .talk = b.rank == 0,
                            .transports = TR_NCCL | TR_MPI };
    const struct options defaults = b.o;
    int rc = agree_usage(usage_status(argc, argv, &b.o), b.rank, argc, argv, defaults);
    if (rc < 0) rc = agree_arguments(b.rank, argc, argv);
    if (rc >= 0) { /* -h or bad usage: nothing was allocated */
        MPI_Finalize();
        return rc;
    }
    rc = setup(&b);
    if (rc == 0) run_all(&b);
    if (rc == 0 && b.rank == 0 && b.o.check && b.nwrong_total > 0) rc = 1;
    if (teardown(&b) && rc == 0) rc = 1;
    MPI_Finalize();
    return rc;
}
