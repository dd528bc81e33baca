/*
 * cuda_nccl_interpose.c — an NCCL program that knows nothing of gcomp, for libgcomp_nccl.so:
 * one rank (ncclCommInitRank with a unique id) calls ncclAllReduce directly on device
 * buffers and checks every result.
 *
 *   GCOMP_CODEC=fp16 GCOMP_TEST_COMPRESS_ONE_RANK=1 GCOMP_STATS_FILE=/tmp/s_%r.json \
 *     LD_PRELOAD=libgcomp_nccl.so cuda_nccl_interpose --codec fp16
 *
 * Calls that libgcomp_nccl.so compresses (float, half, bfloat16 sums and averages of at least
 * min_bytes) are checked against the codec's bound at one rank (the input itself for none,
 * its fp16/bf16 rounding, TernGrad's three values and unbiasedness, top-k's exactly k largest
 * values kept exactly), and, for a lossy codec, must differ from the input somewhere (they
 * were compressed). Calls it must pass through are bit-exact (the input, at one rank): int32,
 * ncclMax, a small buffer, a call inside ncclGroupStart/End, a call captured in a CUDA graph.
 * After ncclCommDestroy, the interposer's GCOMP_STATS_FILE must count exactly those calls.
 * Then, on communicators of their own: ncclCommAbort from another thread while a call is in
 * flight (held behind a host function on its stream, as PyTorch's watchdog aborts a hung
 * call) returns within seconds and the call returns (the sanitizer build checks for a use
 * after free); and with two GPUs, a call made while another device is current succeeds and
 * leaves that device current.
 * --codec off: run without GCOMP_CODEC (or without the interposer): every call is exact.
 * --no-state (after --codec): the interposer acts as if it had no memory for any
 * communicator's state (the program sets GCOMP_TEST_INTERPOSE_NO_STATE=1 before its first NCCL
 * call): it still makes and checks each gcomp communicator, then passes every call through, so
 * every call is exact, no stats file is written, and two communicators live at once (the
 * interposer's fixed slots for them) and communicators made after others were destroyed (the
 * slots taken back) work too.
 *
 * Exits 77 without a CUDA device, 1 with a message on the first failed check.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nccl.h>

#define N ((size_t)1 << 18) /* 1 MiB of floats: above the default min_bytes */
#define SMALL 1000          /* 4000 bytes: below it */

static int failures;

#define CHECK(cond, ...)                                 \
    do {                                                 \
        if (!(cond)) {                                   \
            fprintf(stderr, "FAIL line %d: ", __LINE__); \
            fprintf(stderr, __VA_ARGS__);                \
            fprintf(stderr, "\n");                       \
            failures++;                                  \
        }                                                \
    } while (0)

#define CU(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

#define NC(x)                                                                                  \
    do {                                                                                       \
        ncclResult_t e_ = (x);                                                                 \
        if (e_ != ncclSuccess) {                                                               \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, ncclGetErrorString(e_)); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static uint64_t rng = 12345;
static float gauss(void)
{
    double u1, u2;
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    u1 = ((rng >> 11) + 1.0) * 0x1p-53;
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    u2 = (rng >> 11) * 0x1p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* float <-> half / bfloat16 (round to nearest even; inputs are finite and normal-ish) */
static uint16_t to_bf16(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    return (uint16_t)((b + 0x7fff + ((b >> 16) & 1)) >> 16);
}
static float from_bf16(uint16_t h)
{
    uint32_t b = (uint32_t)h << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}
static float from_half(uint16_t h)
{
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023, b;
    float f;
    if (e == 0) return (s ? -1.0f : 1.0f) * (float)m * 0x1p-24f;
    b = s | ((e + 112) << 23) | (m << 13);
    memcpy(&f, &b, 4);
    return f;
}
static uint16_t to_half(float f)
{
    /* via the exact value: scale, round to nearest even with rint, for |f| in the normal range */
    int e;
    float m = frexpf(fabsf(f), &e); /* f = m * 2^e, m in [0.5, 1) */
    uint32_t s = f < 0 ? 0x8000u : 0, mant;
    if (f == 0) return (uint16_t)s;
    if (e < -13) { /* subnormal half: units of 2^-24 */
        mant = (uint32_t)rintf(fabsf(f) * 0x1p24f);
        return (uint16_t)(s | mant);
    }
    mant = (uint32_t)rintf(m * 2048.0f); /* 11 bits, 1024..2048 */
    if (mant == 2048) {
        mant = 1024;
        e++;
    }
    return (uint16_t)(s | ((uint32_t)(e + 14) << 10) | (mant - 1024));
}

typedef enum {
    F32,
    F16,
    BF16
} kind;

static size_t esize(kind k) { return k == F32 ? 4 : 2; }
static ncclDataType_t nccl_type(kind k) { return k == F32 ? ncclFloat : k == F16 ? ncclHalf : ncclBfloat16; }

/* n values of kind k from N(0,1), as raw bytes, and as floats in *f */
static void *make_input(kind k, size_t n, float *f)
{
    void *raw = malloc(n * esize(k));
    for (size_t i = 0; i < n; i++) {
        float x = gauss();
        if (k == F32) {
            ((float *)raw)[i] = f[i] = x;
        } else if (k == F16) {
            ((uint16_t *)raw)[i] = to_half(x);
            f[i] = from_half(to_half(x));
        } else {
            ((uint16_t *)raw)[i] = to_bf16(x);
            f[i] = from_bf16(to_bf16(x));
        }
    }
    return raw;
}

static void as_floats(kind k, const void *raw, size_t n, float *f)
{
    for (size_t i = 0; i < n; i++)
        f[i] = k == F32   ? ((const float *)raw)[i]
               : k == F16 ? from_half(((const uint16_t *)raw)[i])
                          : from_bf16(((const uint16_t *)raw)[i]);
}

static int cmp_abs_desc(const void *a, const void *b)
{
    float x = fabsf(*(const float *)a), y = fabsf(*(const float *)b);
    return x < y ? 1 : x > y ? -1 : 0;
}

/* res (the result at one rank) against x (the input) for codec, output kind k. */
static void check_bound(const char *codec, const char *what, kind k, const float *x, const float *res, size_t n)
{
    double out_rel = k == F32 ? 0 : k == F16 ? 0x1p-11 : 0x1p-8;
    size_t differ = 0;
    for (size_t i = 0; i < n; i++) differ += memcmp(&x[i], &res[i], 4) != 0;
    if (!strcmp(codec, "none")) {
        CHECK(differ == 0, "%s (%s): %zu of %zu elements differ from the input", what, codec, differ, n);
        return;
    }
    /* a lossy codec changes some float input (a half or bfloat16 one may fit it exactly) */
    if (k == F32) CHECK(differ > 0, "%s (%s): the result is the input bit for bit: not compressed?", what, codec);
    if (!strcmp(codec, "fp16") || !strcmp(codec, "bf16")) {
        double rel = (!strcmp(codec, "fp16") ? 0x1p-11 : 0x1p-8);
        if (out_rel > rel) rel = out_rel;
        for (size_t i = 0; i < n; i++)
            if (fabs((double)res[i] - x[i]) > rel * 1.001 * fabs(x[i]) + 0x1p-24) {
                CHECK(0, "%s (%s): element %zu: %.9g for %.9g, beyond the rounding bound", what, codec, i, res[i],
                      x[i]);
                return;
            }
    } else if (!strncmp(codec, "terngrad", 8)) {
        /* one scale s: every value is -s, 0 or s (within the output's rounding); unbiased */
        double s = 0, dot = 0, xx = 0;
        for (size_t i = 0; i < n; i++)
            if (fabsf(res[i]) > s) s = fabsf(res[i]);
        for (size_t i = 0; i < n; i++) {
            if (res[i] != 0 && fabs(fabs(res[i]) - s) > s * 0x1p-7) {
                CHECK(0, "%s (%s): element %zu is %.9g, not 0 or +-%.9g", what, codec, i, res[i], s);
                return;
            }
            dot += (double)res[i] * x[i];
            xx += (double)x[i] * x[i];
        }
        CHECK(s > 0 && dot / xx > 0.8 && dot / xx < 1.2, "%s (%s): <res, x> / <x, x> = %.3f, expected about 1", what,
              codec, dot / xx);
    } else if (!strncmp(codec, "topk", 4)) {
        /* exactly k = ceil(0.01 n) values kept, each exactly, the largest |x| */
        size_t k = (size_t)ceil(0.01 * (double)n), kept = 0;
        float *sorted = malloc(n * sizeof(float)), smallest_kept = INFINITY;
        for (size_t i = 0; i < n; i++) {
            if (res[i] == 0) continue;
            kept++;
            if (res[i] != x[i]) {
                CHECK(0, "%s (%s): element %zu kept as %.9g, input %.9g", what, codec, i, res[i], x[i]);
                break;
            }
            if (fabsf(x[i]) < smallest_kept) smallest_kept = fabsf(x[i]);
        }
        memcpy(sorted, x, n * sizeof(float));
        qsort(sorted, n, sizeof(float), cmp_abs_desc);
        CHECK(kept == k, "%s (%s): %zu values kept, expected k = %zu", what, codec, kept, k);
        CHECK(smallest_kept >= fabsf(sorted[k - 1]), "%s (%s): a kept value is not among the k largest", what, codec);
        free(sorted);
    } else {
        fprintf(stderr, "unknown --codec %s\n", codec);
        exit(2);
    }
}

/* One ncclAllReduce of kind k, n elements, op; returns the result as floats (caller frees)
 * and the input as floats in *xin. in_place: sendbuff == recvbuff. */
static float *one_call(ncclComm_t comm, cudaStream_t s, kind k, size_t n, ncclRedOp_t op, int in_place, float **xin)
{
    float *x = malloc(n * sizeof(float)), *res = malloc(n * sizeof(float));
    void *raw = make_input(k, n, x), *back = malloc(n * esize(k)), *dsend, *drecv;
    CU(cudaMalloc(&dsend, n * esize(k)));
    drecv = dsend;
    if (!in_place) CU(cudaMalloc(&drecv, n * esize(k)));
    CU(cudaMemcpy(dsend, raw, n * esize(k), cudaMemcpyHostToDevice));
    CU(cudaDeviceSynchronize()); /* the call runs on a non-blocking stream */
    NC(ncclAllReduce(dsend, drecv, n, nccl_type(k), op, comm, s));
    CU(cudaStreamSynchronize(s));
    CU(cudaMemcpy(back, drecv, n * esize(k), cudaMemcpyDeviceToHost));
    as_floats(k, back, n, res);
    /* the device buffers are kept to the end: an address freed here and handed out again
     * would be the same residual key (communicator, buffer, count) for the next call */
    free(raw);
    free(back);
    *xin = x;
    return res;
}

/* A call that must pass through: the input back, bit for bit, at one rank. mode: 0 plain,
 * 1 inside a group, 2 captured in a CUDA graph and replayed. */
static void exact_call(ncclComm_t comm, cudaStream_t s, ncclDataType_t type, size_t n, ncclRedOp_t op, int mode,
                       const char *what)
{
    size_t bytes = n * 4;
    uint32_t *h = malloc(bytes), *back = malloc(bytes);
    void *d, *r;
    for (size_t i = 0; i < n; i++) {
        float f = gauss();
        if (type == ncclInt32) {
            int32_t v = (int32_t)(f * 1000);
            memcpy(&h[i], &v, 4);
        } else {
            memcpy(&h[i], &f, 4);
        }
    }
    CU(cudaMalloc(&d, bytes));
    CU(cudaMalloc(&r, bytes));
    CU(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    CU(cudaMemset(r, 0, bytes));
    /* s is a non-blocking stream: it does not wait for the legacy stream's copy and memset */
    CU(cudaDeviceSynchronize());
    if (mode == 1) {
        NC(ncclGroupStart());
        NC(ncclAllReduce(d, r, n, type, op, comm, s));
        NC(ncclGroupEnd());
    } else if (mode == 2) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        NC(ncclAllReduce(d, r, n, type, op, comm, s));
        CU(cudaStreamEndCapture(s, &g));
        CU(cudaGraphInstantiate(&ge, g, 0));
        CU(cudaGraphLaunch(ge, s));
        CU(cudaStreamSynchronize(s));
        CU(cudaGraphExecDestroy(ge));
        CU(cudaGraphDestroy(g));
    } else {
        NC(ncclAllReduce(d, r, n, type, op, comm, s));
    }
    CU(cudaStreamSynchronize(s));
    CU(cudaMemcpy(back, r, bytes, cudaMemcpyDeviceToHost));
    CHECK(memcmp(back, h, bytes) == 0, "%s: not the input bit for bit (was it compressed?)", what);
    CU(cudaFree(d));
    CU(cudaFree(r));
    free(h);
    free(back);
}

/* The number after "key": in the interposer's JSON stats, or -1. */
static long long json_count(const char *json, const char *key)
{
    char pat[96];
    const char *p;
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    p = strstr(json, pat);
    return p ? strtoll(p + strlen(pat), NULL, 10) : -1;
}

/* The variables libgcomp_nccl.so names its stats file by (interpose/nccl_allreduce.c,
 * process_rank), cleared in main. */
static const char *const launcher_rank_vars[] = { "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID",
                                                  "RANK" };

/* The interposer's GCOMP_STATS_FILE for rank 0 into path; 0 when the variable is not set. */
static int stats_path(char *path, size_t cap)
{
    const char *spec = getenv("GCOMP_STATS_FILE"), *r;
    if (!spec || !*spec) return 0;
    r = strstr(spec, "%r");
    if (r)
        snprintf(path, cap, "%.*s0%s", (int)(r - spec), spec, r + 2);
    else
        snprintf(path, cap, "%s.rank0", spec);
    return 1;
}

static void check_stats(int compressed)
{
    char path[4096], json[8192];
    size_t n;
    FILE *f;
    if (!stats_path(path, sizeof path)) {
        CHECK(0, "GCOMP_STATS_FILE is not set: cannot check the interposer's counts");
        return;
    }
    f = fopen(path, "r");
    CHECK(f != NULL, "no stats file %s: was libgcomp_nccl.so preloaded?", path);
    if (!f) return;
    n = fread(json, 1, sizeof json - 1, f);
    json[n] = 0;
    fclose(f);
    printf("stats: %s", json);
    CHECK(json_count(json, "calls_compressed") == compressed, "calls_compressed %lld, expected %d",
          json_count(json, "calls_compressed"), compressed);
    CHECK(json_count(json, "group") == 1, "passed through in a group: %lld, expected 1", json_count(json, "group"));
    CHECK(json_count(json, "capture") == 1, "passed through in capture: %lld, expected 1", json_count(json, "capture"));
    CHECK(json_count(json, "datatype") == 1, "passed through for the datatype: %lld, expected 1",
          json_count(json, "datatype"));
    CHECK(json_count(json, "op") == 1, "passed through for the op: %lld, expected 1", json_count(json, "op"));
    CHECK(json_count(json, "small") == 1, "passed through as small: %lld, expected 1", json_count(json, "small"));
    /* raw bytes of the compressed calls (at one rank the ring sends nothing: no wire bytes) */
    CHECK(json_count(json, "raw_bytes") == (long long)(2 * N * 4 + 2 * N * 2), "raw_bytes %lld, expected %lld",
          json_count(json, "raw_bytes"), (long long)(2 * N * 4 + 2 * N * 2));
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* A host function on the stream: what the stream holds after it waits (a hung peer's stand-in). */
static void CUDART_CB hold_stream(void *ms) { sleep_ms((long)(intptr_t)ms); }

typedef struct abort_job {
    ncclComm_t comm;
    cudaStream_t s;
    float *d;
    ncclResult_t r;
    int started;
} abort_job;

static void *call_in_flight(void *arg)
{
    abort_job *j = arg;
    __atomic_store_n(&j->started, 1, __ATOMIC_RELEASE);
    j->r = ncclAllReduce(j->d, j->d, N, ncclFloat, ncclSum, j->comm, j->s);
    return NULL;
}

/* ncclCommAbort on this thread while another is inside ncclAllReduce on the communicator. */
static void abort_in_flight(cudaStream_t s)
{
    ncclUniqueId id;
    abort_job j = { 0 };
    pthread_t th;
    ncclResult_t r;
    double t0, took;
    NC(ncclGetUniqueId(&id));
    NC(ncclCommInitRank(&j.comm, 1, id, 0));
    CU(cudaMalloc((void **)&j.d, N * 4));
    CU(cudaMemset(j.d, 0, N * 4));
    CU(cudaDeviceSynchronize());
    j.s = s;
    NC(ncclAllReduce(j.d, j.d, N, ncclFloat, ncclSum, j.comm, s)); /* the interposer's state exists */
    CU(cudaStreamSynchronize(s));
    CU(cudaLaunchHostFunc(s, hold_stream, (void *)(intptr_t)1500));
    CHECK(pthread_create(&th, NULL, call_in_flight, &j) == 0, "pthread_create");
    while (!__atomic_load_n(&j.started, __ATOMIC_ACQUIRE)) sched_yield();
    sleep_ms(200); /* inside the call, which waits behind the held stream */
    t0 = now_s();
    r = ncclCommAbort(j.comm);
    took = now_s() - t0;
    pthread_join(th, NULL);
    printf("ncclCommAbort with a call in flight: %.3f s (%s); the call returned %s\n", took, ncclGetErrorString(r),
           ncclGetErrorString(j.r));
    CHECK(r == ncclSuccess, "ncclCommAbort: %s", ncclGetErrorString(r));
    CHECK(took < 10.0, "ncclCommAbort took %.1f s with a call in flight", took);
    CU(cudaStreamSynchronize(s));
    CU(cudaFree(j.d));
}

/* With two GPUs: the communicator on device 0, device 1 current when the program calls
 * ncclAllReduce (NCCL accepts that): the call succeeds and device 1 is still current. */
static void other_device_current(void)
{
    ncclUniqueId id;
    ncclComm_t comm;
    cudaStream_t s;
    float *d;
    int devices = 0, cur = -1;
    ncclResult_t r;
    CU(cudaGetDeviceCount(&devices));
    if (devices < 2) {
        printf("one GPU: the other-device-current case is skipped\n");
        return;
    }
    CU(cudaSetDevice(0));
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    NC(ncclGetUniqueId(&id));
    NC(ncclCommInitRank(&comm, 1, id, 0));
    CU(cudaMalloc((void **)&d, N * 4));
    CU(cudaMemset(d, 0, N * 4));
    CU(cudaDeviceSynchronize());
    CU(cudaSetDevice(1));
    r = ncclAllReduce(d, d, N, ncclFloat, ncclSum, comm, s);
    CU(cudaGetDevice(&cur));
    CHECK(r == ncclSuccess, "ncclAllReduce with device 1 current, communicator on device 0: %s", ncclGetErrorString(r));
    CHECK(cur == 1, "the current device after the call is %d, not the caller's 1", cur);
    CU(cudaSetDevice(0));
    CU(cudaStreamSynchronize(s));
    NC(ncclCommDestroy(comm));
    CU(cudaFree(d));
    CU(cudaStreamDestroy(s));
}

int main(int argc, char **argv)
{
    const char *codec = argc > 2 && !strcmp(argv[1], "--codec") ? argv[2] : NULL;
    int devices = 0, off, no_state = argc > 3 && !strcmp(argv[3], "--no-state");
    char path[4096];
    ncclUniqueId id;
    ncclComm_t comm;
    cudaStream_t s;
    float *x, *res;
    if (!codec || argc > 3 + no_state) {
        fprintf(stderr, "usage: %s --codec none|fp16|bf16|terngrad|topk:ratio=0.01|off [--no-state]\n", argv[0]);
        return 2;
    }
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    off = !strcmp(codec, "off");
    /* One process, rank 0 of its one communicator: the interposer names its stats file by the
     * launcher's rank before the communicator's, so a launcher around the test (mpirun, srun,
     * torchrun's RANK left exported) would otherwise put it under another number. */
    for (size_t i = 0; i < sizeof launcher_rank_vars / sizeof launcher_rank_vars[0]; i++)
        unsetenv(launcher_rank_vars[i]);
    if (no_state) {
        /* read at the interposer's first call; a stats file would only come from a gcomp
         * communicator that was used */
        setenv("GCOMP_TEST_INTERPOSE_NO_STATE", "1", 1);
        if (stats_path(path, sizeof path)) remove(path);
    }
    CU(cudaSetDevice(0));
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    NC(ncclGetUniqueId(&id));
    NC(ncclCommInitRank(&comm, 1, id, 0));

    /* compressed (unless off): float sum, float average in place, half and bfloat16 sums */
    {
        static const struct {
            kind k;
            ncclRedOp_t op;
            int in_place;
            const char *what;
        } calls[] = { { F32, ncclSum, 0, "float sum" },
                      { F32, ncclAvg, 1, "float average in place" },
                      { F16, ncclSum, 0, "half sum" },
                      { BF16, ncclSum, 1, "bfloat16 sum in place" } };
        for (size_t c = 0; c < sizeof calls / sizeof calls[0]; c++) {
            res = one_call(comm, s, calls[c].k, N, calls[c].op, calls[c].in_place, &x);
            check_bound(off || no_state ? "none" : codec, calls[c].what, calls[c].k, x, res, N);
            free(x);
            free(res);
        }
    }
    /* passed through, bit for bit */
    exact_call(comm, s, ncclInt32, N, ncclSum, 0, "int32 sum");
    exact_call(comm, s, ncclFloat, N, ncclMax, 0, "float max");
    exact_call(comm, s, ncclFloat, SMALL, ncclSum, 0, "small float sum");
    exact_call(comm, s, ncclFloat, N, ncclSum, 1, "float sum inside a group");
    exact_call(comm, s, ncclFloat, N, ncclSum, 2, "float sum captured in a CUDA graph");
    if (no_state) {
        /* a second communicator without state while the first still has its own */
        ncclComm_t other;
        NC(ncclGetUniqueId(&id));
        NC(ncclCommInitRank(&other, 1, id, 0));
        exact_call(other, s, ncclFloat, N, ncclSum, 0, "float sum on a second communicator, no state");
        exact_call(comm, s, ncclFloat, N, ncclSum, 0, "float sum on the first again, no state");
        exact_call(other, s, ncclFloat, N, ncclSum, 0, "float sum on the second again, no state");
        NC(ncclCommDestroy(other));
    }

    NC(ncclCommDestroy(comm));
    if (no_state && stats_path(path, sizeof path)) {
        FILE *f = fopen(path, "r");
        CHECK(f == NULL, "a stats file %s without state: a gcomp communicator was used", path);
        if (f) fclose(f);
    } else if (!off) {
        check_stats(4);
    }
    abort_in_flight(s);
    other_device_current();
    CU(cudaStreamDestroy(s));
    if (failures) {
        fprintf(stderr, "cuda_nccl_interpose --codec %s%s: %d check(s) failed\n", codec, no_state ? " --no-state" : "",
                failures);
        return 1;
    }
    printf("cuda_nccl_interpose --codec %s%s: all checks passed\n", codec, no_state ? " --no-state" : "");
    return 0;
}
