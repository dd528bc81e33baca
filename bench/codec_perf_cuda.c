/*
 * codec_perf_cuda.c — codec_perf --device cuda: gcomp codecs on CUDA device buffers.
 *
 * Every spec and size runs on buffers of the current CUDA device: encode with error feedback
 * in steady state (gcomp_codec_encode_async; the key's residual already exists), decode_add
 * (gcomp_codec_decode_add_async), and a cudaMemcpyAsync device to device of the same buffer
 * in the same run, all on one stream and timed with CUDA events around `reps` back-to-back
 * calls (a sample lasts >= 1 ms), median (or best) of --iters samples. Host work per call
 * (pointer checks, launches, top-k's one size read-back) is inside the time: a call that
 * starves the GPU is slower, as it would be for a user.
 *
 * Bytes are charged as in the CPU mode: encode = gradient read + payload write (+ residual
 * read + write with --ef 1), decode = payload read + accumulator read + write, copy = 2 x size.
 *
 * A fast number from a broken kernel is worthless, so before a spec is timed its device
 * output is compared byte for byte with the CPU reference (the same spec through
 * gcomp_codec_encode on host buffers, same seed and rank): the payloads of two encode steps
 * with error feedback, the residual after them and the decode_add of the last payload, at the
 * first size. A spec that differs is reported and not timed. Every row also decodes its first
 * payload and reports the error against the input and any non-finite value.
 *
 * Uses the public API (gcomp.h) and the CUDA runtime (buffers, stream, events).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "codec_perf.h"
#include "gcomp.h"

#define CHECK_STEPS 2 /* encode steps compared with the CPU: step 1 sees a non-zero residual */

struct gpu {
    int id, cc_major, cc_minor, runtime, driver;
    char name[256];
    size_t mem_bytes;
    cudaStream_t stream;
    cudaEvent_t start, stop;
};

/* Device buffers at the largest size (smaller sizes use a prefix), and two host ones. */
struct dbuffers {
    float *grad, *acc;
    void *copy, *payload;
    size_t payload_cap;
    float *host_grad; /* the tensor, also the CPU reference's input */
    float *host_out;  /* read-back of a device result */
};

struct drow {
    const char *spec;
    size_t bytes, wire_bytes, nonfinite;
    double rel_err, enc_s, dec_s, copy_s;
    double enc_gbps, dec_gbps, copy_gbps;
};

/* Prints a CUDA failure; returns 1 on failure, 0 on success. */
static int cuda_failed(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return 0;
    fprintf(stderr, "codec_perf: %s: %s (%s)\n", what, cudaGetErrorString(e), cudaGetErrorName(e));
    return 1;
}

/* ---------------------------------------------------------------------------------------- */
/* Operations and their timing                                                               */
/* ---------------------------------------------------------------------------------------- */

/* An operation enqueued on a stream: returns 0, a gcomp_result (gcomp_last_error() has the
 * detail), or -1 for a failed CUDA call (already printed). The rest of this file keeps that
 * convention. */
typedef int (*dop_fn)(void *ctx, cudaStream_t stream);

struct denc {
    gcomp_codec *codec;
    uint64_t key;
    const float *src;
    size_t count;
    void *dst;
    size_t cap, written;
};

struct ddec {
    gcomp_codec *codec;
    const void *payload;
    size_t bytes;
    float *acc;
    size_t count;
};

struct dcopy {
    void *dst;
    const void *src;
    size_t bytes;
};

static int dop_encode(void *p, cudaStream_t stream)
{
    struct denc *c = p;
    return gcomp_codec_encode_async(c->codec, c->key, c->src, c->count, GCOMP_F32, c->dst, c->cap, &c->written, stream);
}

static int dop_decode(void *p, cudaStream_t stream)
{
    struct ddec *c = p;
    return gcomp_codec_decode_add_async(c->codec, c->payload, c->bytes, c->acc, c->count, stream);
}

static int dop_copy(void *p, cudaStream_t stream)
{
    struct dcopy *c = p;
    if (cuda_failed(cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDeviceToDevice, stream),
                    "cudaMemcpyAsync device to device"))
        return -1;
    return 0;
}

/* Seconds between the two events once `stop` has completed, or -1. */
static double events_elapsed(struct gpu *d)
{
    float ms = 0;
    if (cuda_failed(cudaEventRecord(d->stop, d->stream), "cudaEventRecord") ||
        cuda_failed(cudaEventSynchronize(d->stop), "cudaEventSynchronize") ||
        cuda_failed(cudaEventElapsedTime(&ms, d->start, d->stop), "cudaEventElapsedTime"))
        return -1;
    return 1e-3 * (double)ms;
}

/* `reps` calls between two events; seconds per call, or -1 if a call failed (*rc says how). */
static double sample(dop_fn fn, void *ctx, struct gpu *d, long reps, int *rc)
{
    *rc = -1;
    if (cuda_failed(cudaEventRecord(d->start, d->stream), "cudaEventRecord")) return -1;
    for (long r = 0; r < reps; r++)
        if ((*rc = fn(ctx, d->stream)) != 0) return -1;
    *rc = -1;
    double s = events_elapsed(d);
    if (s < 0) return -1;
    *rc = 0;
    return s / (double)reps;
}

/* Seconds per call (median or best sample), or -1 if a call failed (*rc says how). The
 * warm-up calls size the samples, as in the CPU mode. */
static double time_dop(dop_fn fn, void *ctx, const struct config *cfg, struct gpu *d, int *rc)
{
    double samples[MAX_ITERS], last = 0;
    for (int i = 0; i < cfg->warmup; i++)
        if ((last = sample(fn, ctx, d, 1, rc)) < 0) return -1;
    long reps = cfg->warmup > 0 ? reps_for(last) : 1;
    for (int i = 0; i < cfg->iters; i++)
        if ((samples[i] = sample(fn, ctx, d, reps, rc)) < 0) return -1;
    return pick_sample(samples, cfg->iters, cfg->stat);
}

/* ---------------------------------------------------------------------------------------- */
/* The check against the CPU reference                                                       */
/* ---------------------------------------------------------------------------------------- */

enum check {
    CHECK_OK,
    CHECK_FAILED,
    CHECK_UNSUPPORTED
};

/* Index of the first differing byte, or n when equal. */
static size_t first_diff(const void *a, const void *b, size_t n)
{
    const unsigned char *x = a, *y = b;
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i]) return i;
    return n;
}

/* The first differing float of two arrays as a message; 0 when equal. */
static int floats_differ(const char *what, const float *dev, const float *cpu, size_t count, char *msg, size_t cap)
{
    size_t i = first_diff(dev, cpu, count * sizeof(float)) / sizeof(float);
    if (i >= count) return 0;
    snprintf(msg, cap, "%s element %zu of %zu differs: device %a, CPU %a", what, i, count, (double)dev[i],
             (double)cpu[i]);
    return 1;
}

struct check_bufs {
    gcomp_codec *cpu, *dev;
    size_t count, cap;
    unsigned char *cpu_payload, *dev_payload;
    float *cpu_out, *dev_out;
};

/* One encode step on both sides; their payload sizes must match and the bytes be equal. */
static enum check check_encode_step(struct check_bufs *k, struct dbuffers *b, struct gpu *d, int step, size_t *written,
                                    char *msg, size_t cap)
{
    size_t wc = 0, wd = 0;
    int rc = gcomp_codec_encode(k->cpu, BENCH_KEY, b->host_grad, k->count, GCOMP_F32, k->cpu_payload, k->cap, &wc);
    if (rc) {
        snprintf(msg, cap, "CPU encode step %d: %s", step, gcomp_last_error());
        return CHECK_FAILED;
    }
    rc = gcomp_codec_encode_async(k->dev, BENCH_KEY, b->grad, k->count, GCOMP_F32, b->payload, b->payload_cap, &wd,
                                  d->stream);
    if (rc == GCOMP_SUCCESS) rc = gcomp_codec_sync(k->dev, d->stream);
    if (rc) {
        snprintf(msg, cap, "device encode step %d: %s: %s", step, gcomp_result_name(rc), gcomp_last_error());
        return rc == GCOMP_ERR_UNSUPPORTED ? CHECK_UNSUPPORTED : CHECK_FAILED;
    }
    if (wc != wd) {
        snprintf(msg, cap, "step %d: payload of %zu bytes on the device, %zu on the CPU", step, wd, wc);
        return CHECK_FAILED;
    }
    if (cuda_failed(cudaMemcpy(k->dev_payload, b->payload, wd, cudaMemcpyDeviceToHost), "cudaMemcpy payload to host")) {
        snprintf(msg, cap, "step %d: reading the payload back failed", step);
        return CHECK_FAILED;
    }
    size_t i = first_diff(k->dev_payload, k->cpu_payload, wd);
    if (i < wd) {
        snprintf(msg, cap, "step %d: payload byte %zu of %zu differs: device 0x%02x, CPU 0x%02x%s", step, i, wd,
                 k->dev_payload[i], k->cpu_payload[i], i < 32 ? " (in the 32-byte header)" : "");
        return CHECK_FAILED;
    }
    *written = wd;
    return CHECK_OK;
}

/* Residuals after the steps (the device one read into host memory), then decode_add of the
 * last payload into zeros on both sides. */
static enum check check_residual_decode(struct check_bufs *k, struct dbuffers *b, struct gpu *d, size_t written,
                                        char *msg, size_t cap)
{
    size_t bytes = k->count * sizeof(float);
    if (gcomp_codec_residual_get(k->cpu, BENCH_KEY, k->cpu_out, k->count)) {
        snprintf(msg, cap, "CPU residual_get: %s", gcomp_last_error());
        return CHECK_FAILED;
    }
    if (gcomp_codec_residual_get(k->dev, BENCH_KEY, k->dev_out, k->count)) {
        snprintf(msg, cap, "device residual_get into host memory: %s", gcomp_last_error());
        return CHECK_FAILED;
    }
    if (floats_differ("residual", k->dev_out, k->cpu_out, k->count, msg, cap)) return CHECK_FAILED;

    memset(k->cpu_out, 0, bytes);
    if (gcomp_codec_decode_add(k->cpu, k->cpu_payload, written, k->cpu_out, k->count)) {
        snprintf(msg, cap, "CPU decode_add: %s", gcomp_last_error());
        return CHECK_FAILED;
    }
    int rc = cuda_failed(cudaMemsetAsync(b->acc, 0, bytes, d->stream), "cudaMemsetAsync")
                 ? GCOMP_ERR_TRANSPORT
                 : gcomp_codec_decode_add_async(k->dev, b->payload, written, b->acc, k->count, d->stream);
    if (rc == GCOMP_SUCCESS) rc = gcomp_codec_sync(k->dev, d->stream);
    if (rc) {
        snprintf(msg, cap, "device decode_add: %s: %s", gcomp_result_name(rc), gcomp_last_error());
        return CHECK_FAILED;
    }
    if (cuda_failed(cudaMemcpy(k->dev_out, b->acc, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy acc to host")) {
        snprintf(msg, cap, "reading the decoded values back failed");
        return CHECK_FAILED;
    }
    return floats_differ("decode_add", k->dev_out, k->cpu_out, k->count, msg, cap) ? CHECK_FAILED : CHECK_OK;
}

/* Compares the device path of spec with the CPU reference on the first `count` elements of
 * the tensor, with error feedback on. msg says what differed. */
static enum check check_spec(struct dbuffers *b, struct gpu *d, const char *spec, size_t count, char *msg, size_t cap)
{
    struct check_bufs k = { make_codec(spec, 1), make_codec(spec, 1), count, 0, NULL, NULL, NULL, NULL };
    enum check verdict = CHECK_FAILED;
    snprintf(msg, cap, "out of host memory for the check");
    if (!k.cpu || !k.dev) {
        snprintf(msg, cap, "%s", gcomp_last_error());
        goto out;
    }
    k.cap = gcomp_codec_max_encoded_bytes(k.cpu, count);
    k.cpu_payload = malloc(k.cap);
    k.dev_payload = malloc(k.cap);
    k.cpu_out = malloc(count * sizeof(float));
    k.dev_out = malloc(count * sizeof(float));
    if (!k.cpu_payload || !k.dev_payload || !k.cpu_out || !k.dev_out) goto out;
    size_t written = 0;
    for (int step = 0; step < CHECK_STEPS; step++)
        if ((verdict = check_encode_step(&k, b, d, step, &written, msg, cap)) != CHECK_OK) goto out;
    verdict = check_residual_decode(&k, b, d, written, msg, cap);
out:
    free(k.cpu_payload);
    free(k.dev_payload);
    free(k.cpu_out);
    free(k.dev_out);
    gcomp_codec_destroy(k.cpu);
    gcomp_codec_destroy(k.dev);
    return verdict;
}

/* ---------------------------------------------------------------------------------------- */
/* One row                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* The first encode of a fresh object (zero residual: the codec's own error), decoded on the
 * device into zeros and read back; it also creates the residual for the timed calls. */
static int first_encode(struct denc *enc, struct dbuffers *b, struct gpu *d, struct drow *row)
{
    size_t bytes = enc->count * sizeof(float);
    int rc = dop_encode(enc, d->stream);
    if (!rc) rc = gcomp_codec_sync(enc->codec, d->stream);
    if (!rc && cuda_failed(cudaMemsetAsync(b->acc, 0, bytes, d->stream), "cudaMemsetAsync")) rc = -1;
    if (!rc) rc = gcomp_codec_decode_add_async(enc->codec, enc->dst, enc->written, b->acc, enc->count, d->stream);
    if (!rc) rc = gcomp_codec_sync(enc->codec, d->stream);
    if (!rc && cuda_failed(cudaMemcpy(b->host_out, b->acc, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy acc to host"))
        rc = -1;
    if (rc) return rc;
    row->wire_bytes = enc->written;
    row->rel_err = rel_error(b->host_grad, b->host_out, enc->count);
    row->nonfinite = 0;
    for (size_t i = 0; i < enc->count; i++) row->nonfinite += !isfinite(b->host_out[i]);
    return 0;
}

/* Fills row; returns 0, a failing call's gcomp_result, or -1 (a CUDA call, printed). */
static int run_row(const struct config *cfg, struct dbuffers *b, struct gpu *d, const char *spec, size_t bytes,
                   struct drow *row)
{
    size_t count = bytes / sizeof(float);
    gcomp_codec *codec = make_codec(spec, cfg->ef);
    if (!codec) return GCOMP_ERR_INVALID_SPEC;
    struct denc enc = { codec, cfg->ef ? BENCH_KEY : GCOMP_KEY_NONE, b->grad, count, b->payload, b->payload_cap, 0 };
    struct dcopy cpy = { b->copy, b->grad, bytes };
    struct ddec dec = { codec, b->payload, 0, b->acc, count };
    int rc = first_encode(&enc, b, d, row);
    if (rc) goto out;
    /* the copy first, right before the codec, so both see the same GPU state (clocks, L2) */
    if ((row->copy_s = time_dop(dop_copy, &cpy, cfg, d, &rc)) < 0) goto out;
    if ((row->enc_s = time_dop(dop_encode, &enc, cfg, d, &rc)) < 0) goto out;
    if ((rc = gcomp_codec_sync(codec, d->stream)) != 0) goto out; /* device-side errors */
    dec.bytes = enc.written;                                      /* the last timed payload: a steady-state one */
    if ((row->dec_s = time_dop(dop_decode, &dec, cfg, d, &rc)) < 0) goto out;
    if ((rc = gcomp_codec_sync(codec, d->stream)) != 0) goto out;
    row->spec = spec;
    row->bytes = bytes;
    double resid = cfg->ef ? 2.0 * (double)bytes : 0.0;
    row->enc_gbps = gbps((double)bytes + resid + (double)enc.written, row->enc_s);
    row->dec_gbps = gbps((double)enc.written + 2.0 * (double)bytes, row->dec_s);
    row->copy_gbps = gbps(2.0 * (double)bytes, row->copy_s);
out:
    gcomp_codec_destroy(codec);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Output                                                                                    */
/* ---------------------------------------------------------------------------------------- */

static double ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

static void print_header(const struct config *cfg, const struct machine *m, const struct gpu *d)
{
    printf("# codec_perf: gcomp %d.%d.%d | cuda device %d: %s (sm_%d%d, %.1f GiB), runtime %d.%d, "
           "driver %d.%d | host %s\n",
           GCOMP_VERSION_MAJOR, GCOMP_VERSION_MINOR, GCOMP_VERSION_PATCH, d->id, d->name, d->cc_major, d->cc_minor,
           (double)d->mem_bytes / (double)GIB, d->runtime / 1000, d->runtime % 1000 / 10, d->driver / 1000,
           d->driver % 1000 / 10, m->cpu);
    printf("# ef=%d dist=%s scale=%g iters=%d warmup=%d stat=%s; CUDA events on one stream\n", cfg->ef,
           dist_name(cfg->dist), cfg->scale, cfg->iters, cfg->warmup, cfg->stat == STAT_BEST ? "best" : "median");
    printf("# every spec below matched the CPU reference byte for byte (payloads of %d encode "
           "steps, residual, decode_add) before it was timed\n",
           CHECK_STEPS);
    printf("# GB/s charges each byte once: enc = grad + payload%s, dec = payload + 2 x acc, "
           "copy = 2 x size (cudaMemcpyAsync device to device)\n",
           cfg->ef ? " + 2 x residual" : "");
    printf("%-*s %6s %8s %10s %9s %9s %9s %9s %9s %8s %8s\n", spec_width(cfg), "spec", "size", "cr", "rel_err",
           "enc_ms", "dec_ms", "enc_GB/s", "dec_GB/s", "copy_GB/s", "enc/copy", "dec/copy");
}

static void print_row_table(const struct config *cfg, const struct drow *r)
{
    char size[32];
    fmt_size(r->bytes, size, sizeof size);
    printf("%-*s %6s %8.2f %10.3e %9.4f %9.4f %9.1f %9.1f %9.1f %8.3f %8.3f\n", spec_width(cfg), r->spec, size,
           (double)r->bytes / (double)r->wire_bytes, r->rel_err, r->enc_s * 1e3, r->dec_s * 1e3, r->enc_gbps,
           r->dec_gbps, r->copy_gbps, ratio(r->enc_gbps, r->copy_gbps), ratio(r->dec_gbps, r->copy_gbps));
}

/* The settings and the machine, after a row's own keys: a line pasted alone says where and
 * how it ran. */
static void print_json_context(FILE *f, const struct config *cfg, const struct machine *m, const struct gpu *d)
{
    fprintf(f, ",\"ef\":%d,", cfg->ef);
    json_string(f, "dist", dist_name(cfg->dist));
    fprintf(f, ",\"scale\":%g,\"iters\":%d,\"warmup\":%d,", cfg->scale, cfg->iters, cfg->warmup);
    json_string(f, "stat", cfg->stat == STAT_BEST ? "best" : "median");
    fprintf(f, ",\"gcomp_version\":\"%d.%d.%d\",", GCOMP_VERSION_MAJOR, GCOMP_VERSION_MINOR, GCOMP_VERSION_PATCH);
    json_string(f, "device", d->name);
    fprintf(f, ",\"sm\":%d%d,\"cuda_runtime\":%d,\"cuda_driver\":%d,", d->cc_major, d->cc_minor, d->runtime, d->driver);
    json_string(f, "cpu", m->cpu);
    fprintf(f, "}\n");
}

static void print_row_json(FILE *f, const struct config *cfg, const struct machine *m, const struct gpu *d,
                           const struct drow *r)
{
    fputc('{', f);
    json_string(f, "spec", r->spec);
    fprintf(f, ",\"bytes\":%zu,\"wire_bytes\":%zu", r->bytes, r->wire_bytes);
    json_number(f, "cr", (double)r->bytes / (double)r->wire_bytes);
    json_number(f, "rel_err", r->rel_err);
    json_number(f, "enc_ms", r->enc_s * 1e3);
    json_number(f, "dec_ms", r->dec_s * 1e3);
    json_number(f, "copy_ms", r->copy_s * 1e3);
    json_number(f, "enc_GBps", r->enc_gbps);
    json_number(f, "dec_GBps", r->dec_gbps);
    json_number(f, "copy_GBps", r->copy_gbps);
    json_number(f, "enc_ratio", ratio(r->enc_gbps, r->copy_gbps));
    json_number(f, "dec_ratio", ratio(r->dec_gbps, r->copy_gbps));
    fprintf(f, ",\"nonfinite\":%zu,\"check\":\"identical\"", r->nonfinite);
    print_json_context(f, cfg, m, d);
}

/* A spec that was not timed: a comment line in the table, an object with the reason in JSON
 * (so a JSON file records that the spec failed or was skipped). */
static void print_untimed_json(FILE *f, const struct config *cfg, const struct machine *m, const struct gpu *d,
                               const char *spec, const char *what, const char *msg)
{
    fputc('{', f);
    json_string(f, "spec", spec);
    fputc(',', f);
    json_string(f, "check", what);
    fputc(',', f);
    json_string(f, "detail", msg);
    print_json_context(f, cfg, m, d);
}

static void print_untimed(const struct config *cfg, const struct machine *m, const struct gpu *d, FILE *json_out,
                          const char *spec, const char *what, const char *msg)
{
    if (cfg->json)
        print_untimed_json(stdout, cfg, m, d, spec, what, msg);
    else
        printf("# %s: %s: %s\n", spec, what, msg);
    if (json_out) print_untimed_json(json_out, cfg, m, d, spec, what, msg);
}

/* ---------------------------------------------------------------------------------------- */
/* Setup                                                                                     */
/* ---------------------------------------------------------------------------------------- */

/* 0, 1 on a CUDA error, 2 when there is no device (exit status 2, as without CUDA) */
static int open_device(struct gpu *d)
{
    int n = 0;
    struct cudaDeviceProp prop;
    memset(d, 0, sizeof *d);
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        fprintf(stderr, "codec_perf: --device cuda: no CUDA device (%s)\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "count is 0");
        return 2;
    }
    if (cuda_failed(cudaGetDevice(&d->id), "cudaGetDevice") ||
        cuda_failed(cudaGetDeviceProperties(&prop, d->id), "cudaGetDeviceProperties") ||
        cuda_failed(cudaRuntimeGetVersion(&d->runtime), "cudaRuntimeGetVersion") ||
        cuda_failed(cudaDriverGetVersion(&d->driver), "cudaDriverGetVersion"))
        return 1;
    snprintf(d->name, sizeof d->name, "%s", prop.name);
    d->cc_major = prop.major;
    d->cc_minor = prop.minor;
    d->mem_bytes = prop.totalGlobalMem;
    /* non-blocking: no implicit ordering with the legacy default stream */
    if (cuda_failed(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags") ||
        cuda_failed(cudaEventCreate(&d->start), "cudaEventCreate") ||
        cuda_failed(cudaEventCreate(&d->stop), "cudaEventCreate"))
        return 1;
    return 0;
}

static void close_device(struct gpu *d)
{
    if (d->start) cudaEventDestroy(d->start);
    if (d->stop) cudaEventDestroy(d->stop);
    if (d->stream) cudaStreamDestroy(d->stream);
}

static void free_dbuffers(struct dbuffers *b)
{
    cudaFree(b->grad);
    cudaFree(b->acc);
    cudaFree(b->copy);
    cudaFree(b->payload);
    free(b->host_grad);
    free(b->host_out);
}

/* Allocates everything at the largest size, fills the tensor on the host and copies it over. */
static int alloc_dbuffers(struct dbuffers *b, const struct config *cfg, size_t payload_cap)
{
    size_t bytes = cfg->max_bytes;
    memset(b, 0, sizeof *b);
    b->payload_cap = payload_cap;
    b->host_grad = malloc(bytes);
    b->host_out = malloc(bytes);
    if (!b->host_grad || !b->host_out) {
        fprintf(stderr, "codec_perf: out of host memory for %zu-byte buffers\n", bytes);
        return 1;
    }
    if (cuda_failed(cudaMalloc((void **)&b->grad, bytes), "cudaMalloc gradient") ||
        cuda_failed(cudaMalloc((void **)&b->acc, bytes), "cudaMalloc accumulator") ||
        cuda_failed(cudaMalloc(&b->copy, bytes), "cudaMalloc copy destination") ||
        cuda_failed(cudaMalloc(&b->payload, payload_cap), "cudaMalloc payload") ||
        cuda_failed(cudaMemset(b->acc, 0, bytes), "cudaMemset") ||
        cuda_failed(cudaMemset(b->copy, 0, bytes), "cudaMemset") ||
        cuda_failed(cudaMemset(b->payload, 0, payload_cap), "cudaMemset"))
        return 1;
    progress("generating", dist_name(cfg->dist), bytes);
    fill_data(b->host_grad, bytes / sizeof(float), cfg->dist, cfg->scale);
    progress_done(bytes);
    return cuda_failed(cudaMemcpy(b->grad, b->host_grad, bytes, cudaMemcpyHostToDevice), "cudaMemcpy tensor to device");
}

/* Check, then every size of one spec. Returns 0, or 1 when the spec failed. */
static int run_spec(const struct config *cfg, struct dbuffers *b, struct gpu *d, const struct machine *m,
                    FILE *json_out, const char *spec, const char *prog)
{
    char msg[512];
    progress("checking", spec, cfg->min_bytes);
    enum check verdict = check_spec(b, d, spec, cfg->min_bytes / sizeof(float), msg, sizeof msg);
    progress_done(cfg->min_bytes);
    if (verdict == CHECK_UNSUPPORTED) {
        fprintf(stderr, "%s: %s: skipped, not supported on device buffers: %s\n", prog, spec, msg);
        print_untimed(cfg, m, d, json_out, spec, "skipped: unsupported on device buffers", msg);
        return 0;
    }
    if (verdict != CHECK_OK) {
        fprintf(stderr,
                "%s: %s: NOT TIMED: the device result differs from the CPU reference "
                "at %zu bytes: %s\n",
                prog, spec, cfg->min_bytes, msg);
        print_untimed(cfg, m, d, json_out, spec, "failed: differs from the CPU reference", msg);
        return 1;
    }
    for (size_t bytes = cfg->min_bytes; bytes <= cfg->max_bytes; bytes *= cfg->factor) {
        struct drow row = { 0 };
        progress("running", spec, bytes);
        int rc = run_row(cfg, b, d, spec, bytes, &row);
        progress_done(bytes);
        if (rc) {
            const char *why = rc > 0 ? gcomp_last_error() : "a CUDA call failed (see stderr)";
            fprintf(stderr, "%s: %s at %zu bytes: %s\n", prog, spec, bytes, why);
            print_untimed(cfg, m, d, json_out, spec, "failed: a call failed", why);
            return 1;
        }
        if (row.nonfinite)
            fprintf(stderr,
                    "%s: %s at %zu bytes: %zu non-finite values decoded from a finite "
                    "tensor\n",
                    prog, spec, bytes, row.nonfinite);
        if (cfg->json)
            print_row_json(stdout, cfg, m, d, &row);
        else
            print_row_table(cfg, &row);
        if (json_out) print_row_json(json_out, cfg, m, d, &row);
        fflush(stdout);
        if (json_out) fflush(json_out);
        if (bytes > cfg->max_bytes / cfg->factor) break; /* next step would overflow */
    }
    return 0;
}

int codec_perf_cuda(const struct config *cfg, const struct machine *m, size_t payload_cap, FILE *json_out,
                    const char *prog)
{
    struct gpu d;
    struct dbuffers b = { 0 };
    int opened = open_device(&d), failed = 1;
    if (opened == 2) return 2;
    if (opened || alloc_dbuffers(&b, cfg, payload_cap)) goto out;
    if (!cfg->json) print_header(cfg, m, &d);
    failed = 0;
    for (size_t i = 0; i < cfg->nspecs; i++) failed |= run_spec(cfg, &b, &d, m, json_out, cfg->specs[i], prog);
out:
    free_dbuffers(&b);
    close_device(&d);
    return failed ? 1 : 0;
}
