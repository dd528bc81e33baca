/*
 * cuda_mpi_staging.c — device buffers over MPI (issue 15 check (b)): 2 to 4 MPI ranks sharing
 * the GPUs (rank r on device r % devices), each with two communicators made alike over
 * MPI_COMM_WORLD: one gets device buffers (through the staging decorator: Open MPI without
 * CUDA support), the other host buffers with the same inputs. For every built-in spec,
 * f32/f16/bf16, SUM and AVG, several steps with error feedback (one in place, one with a NaN
 * on rank 0): the results and the residual checkpoints (keys, counts, steps, residual bits)
 * must be the same bytes on both, and the same schedule, wire bytes and non-finite count
 * must show in the stats. (No allocation per call is test_cuda_engine's check: it needs the
 * library's internals.)
 *
 * Public API only (gcomp.h, gcomp_mpi.h; cuda_test_util.h uses nothing else) and the CUDA
 * runtime. Every rank exits 77 (skipped) when one has no CUDA device; 0 when every check
 * passed on every rank, 1 otherwise.
 * Usage: mpirun -np N cuda_mpi_staging [--count N]
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gcomp.h"
#include "gcomp_mpi.h"
#include "cuda_test_util.h"

static int g_rank, g_failed;

#define CHECK(cond, ...)                                                     \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "rank %d: %s:%d: ", g_rank, __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                    \
            fprintf(stderr, "\n");                                           \
            g_failed = 1;                                                    \
        }                                                                    \
    } while (0)

#define OK(x)                                                                                      \
    do {                                                                                           \
        gcomp_result r_ = (x);                                                                     \
        CHECK(r_ == GCOMP_SUCCESS, "%s -> %s: %s", #x, gcomp_result_name(r_), gcomp_last_error()); \
    } while (0)

#define CU(x)                                                                         \
    do {                                                                              \
        cudaError_t e_ = (x);                                                         \
        if (e_ != cudaSuccess) {                                                      \
            fprintf(stderr, "rank %d: %s: %s\n", g_rank, #x, cudaGetErrorString(e_)); \
            MPI_Abort(MPI_COMM_WORLD, 2);                                             \
        }                                                                             \
    } while (0)

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* count elements of dtype: sums of uniforms (about normal), different per rank and step */
static void fill(void *x, size_t count, gcomp_dtype dtype, int rank, int step, int nan)
{
    uint64_t s = 1000003ull * (uint64_t)rank + 7919ull * (uint64_t)step + 17;
    for (size_t i = 0; i < count; i++) {
        double u = 0;
        for (int k = 0; k < 4; k++) u += (double)(splitmix(&s) >> 11) * 0x1p-53;
        float v = (float)((u - 2.0) * 1.7);
        if (dtype == GCOMP_F32)
            ((float *)x)[i] = v;
        else
            ((uint16_t *)x)[i] = dtype == GCOMP_F16 ? gcomp_f32_to_f16(v) : gcomp_f32_to_bf16(v);
    }
    if (nan) {
        if (dtype == GCOMP_F32)
            ((float *)x)[count / 2] = NAN;
        else
            ((uint16_t *)x)[count / 2] = dtype == GCOMP_F16 ? 0x7e00u : 0x7fc0u; /* quiet NaN of each */
    }
}

static int is_nan_at(const void *p, size_t i, gcomp_dtype dtype)
{
    if (dtype == GCOMP_F32) return isnan(((const float *)p)[i]);
    uint16_t h = ((const uint16_t *)p)[i];
    return isnan(dtype == GCOMP_F16 ? gcomp_f16_to_f32(h) : gcomp_bf16_to_f32(h));
}

/* Results equal bit for bit; where both are NaN, the NaN's payload may differ. */
static void compare(const char *what, const void *dev, const void *host, size_t count, gcomp_dtype dtype)
{
    size_t es = gcomp_dtype_size(dtype);
    if (memcmp(dev, host, count * es) == 0) return;
    for (size_t i = 0; i < count; i++) {
        if (memcmp((const char *)dev + i * es, (const char *)host + i * es, es) == 0) continue;
        if (is_nan_at(dev, i, dtype) && is_nan_at(host, i, dtype)) continue;
        CHECK(0, "%s: element %zu of %zu differs between device and host buffers", what, i, count);
        return;
    }
}

static void same_residuals(const char *what, gcomp_comm *host, gcomp_comm *dev)
{
    char why[160];
    int differ = residual_checkpoints_differ(host, dev, why, sizeof why);
    CHECK(!differ, "%s: %s", what, why);
}

static const char *const SPECS[] = {
    "none",
    "fp16",
    "bf16",
    "terngrad",
    "terngrad:bucket=4096",
    "topk:ratio=0.01",
    "topk:ratio=0.01,values=fp16",
    "topk:ratio=1", /* sparse-as-dense */
    "fp16+zstd",    /* a byte stage: the call runs on host copies of the device buffers */
};

#define STEPS 4

static void run_case(const char *spec, const variant *v, size_t count, cudaStream_t s)
{
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *host = NULL, *dev = NULL;
    gcomp_comm_stats hs, ds;
    size_t bytes = count * gcomp_dtype_size(v->dtype);
    void *x = malloc(bytes), *hres = malloc(bytes), *dres = malloc(bytes), *dsend, *drecv;
    char what[160];
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    cfg.codec = spec;
    cfg.seed = 5;
    cfg.min_bytes = 4096;
    cfg.timeout_ms = 120000;
    OK(gcomp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &host));
    OK(gcomp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &dev));
    if (!host || !dev) return;
    CU(cudaMalloc(&dsend, bytes));
    CU(cudaMalloc(&drecv, bytes));
    for (int t = 0; t < STEPS; t++) {
        int in_place = t == 2, nan = t == 1 && g_rank == 0;
        snprintf(what, sizeof what, "%s %s step %d (%d ranks)", spec, v->name, t, size);
        fill(x, count, v->dtype, g_rank, t, nan);
        CU(cudaMemcpy(dsend, x, bytes, cudaMemcpyHostToDevice));
        CU(cudaDeviceSynchronize()); /* from pageable memory: may still be in flight, and s does not wait for it */
        if (in_place) {
            memcpy(hres, x, bytes);
            OK(gcomp_allreduce(host, hres, hres, count, v->dtype, v->op, 7, NULL));
            OK(gcomp_allreduce(dev, dsend, dsend, count, v->dtype, v->op, 7, (struct CUstream_st *)s));
            CU(cudaMemcpy(dres, dsend, bytes, cudaMemcpyDeviceToHost));
        } else {
            OK(gcomp_allreduce(host, x, hres, count, v->dtype, v->op, 7, NULL));
            OK(gcomp_allreduce(dev, dsend, drecv, count, v->dtype, v->op, 7, (struct CUstream_st *)s));
            CU(cudaMemcpy(dres, drecv, bytes, cudaMemcpyDeviceToHost));
        }
        compare(what, dres, hres, count, v->dtype);
        same_residuals(what, host, dev);
    }
    OK(gcomp_comm_stats_get(host, &hs));
    OK(gcomp_comm_stats_get(dev, &ds));
    CHECK(hs.last_schedule == ds.last_schedule, "%s %s: schedule %s (host) vs %s (device)", spec, v->name,
          gcomp_schedule_name(hs.last_schedule), gcomp_schedule_name(ds.last_schedule));
    CHECK(hs.compressed_calls == STEPS && ds.compressed_calls == STEPS, "%s %s: compressed calls %llu / %llu", spec,
          v->name, (unsigned long long)hs.compressed_calls, (unsigned long long)ds.compressed_calls);
    /* host buffers add a 16-byte outcome trailer per ring message (gcomp.h, wire_bytes): N
     * messages on the sparse gather, 2(N-1) on the rings; a byte stage (+zstd) runs the
     * device buffers on host copies, trailers included. Besides TernGrad (whose agreement
     * is an allreduce) the ranks agree in 144-byte blocks of N-1 messages: the ring's own on
     * the host path and on host copies (+zstd), a pass of N-1 block-and-trailer messages
     * before the device path (src/ring.h, docs/ARCHITECTURE.md "agree"). Dense codecs at 4,
     * 8, ... ranks agree on the butterfly, in log2 N messages: recursive doubling's own (2 log2 N
     * messages with its outcome hops), or a pass before any other schedule */
    {
        int copies = strstr(spec, "+zstd") != NULL, in_band = strstr(spec, "terngrad") == NULL;
        int log2n = 0, doubling = hs.last_schedule == GCOMP_SCHED_DOUBLING;
        while ((1 << log2n) < size) log2n++;
        int bfly = in_band && strstr(spec, "topk") == NULL && size >= 4 && (1 << log2n) == size;
        uint64_t agree_msgs = bfly ? (uint64_t)log2n : (uint64_t)(size - 1);
        uint64_t msgs = doubling                               ? 2 * (uint64_t)log2n
                        : hs.last_schedule == GCOMP_SCHED_SPARSE ? (uint64_t)size
                                                                 : 2 * (uint64_t)(size - 1);
        uint64_t trailers = copies ? 0 : STEPS * 16 * msgs;
        uint64_t host_agree = in_band ? STEPS * (bfly && !doubling ? 144 + 16 : 144) * agree_msgs : 0;
        uint64_t dev_agree =
            in_band ? STEPS * (copies ? (bfly && !doubling ? 144 + 16 : 144) : 144 + 16) * agree_msgs : 0;
        CHECK(hs.wire_bytes - host_agree == ds.wire_bytes - dev_agree + trailers,
              "%s %s: wire bytes %llu (host, %llu of them agreement) vs %llu (device, %llu of them agreement) + "
              "%llu (trailers)",
              spec, v->name, (unsigned long long)hs.wire_bytes, (unsigned long long)host_agree,
              (unsigned long long)ds.wire_bytes, (unsigned long long)dev_agree, (unsigned long long)trailers);
    }
    CHECK(hs.nonfinite_calls == 1 && ds.nonfinite_calls == 1, "%s %s: non-finite calls %llu / %llu, expected 1", spec,
          v->name, (unsigned long long)hs.nonfinite_calls, (unsigned long long)ds.nonfinite_calls);
    if (g_rank == 0)
        printf("  %-30s %-8s %d ranks, %d steps (%s): device = host, bit for bit\n", spec, v->name, size, STEPS,
               gcomp_schedule_name(ds.last_schedule));
    CU(cudaFree(dsend));
    CU(cudaFree(drecv));
    gcomp_comm_destroy(host);
    gcomp_comm_destroy(dev);
    free(x);
    free(hres);
    free(dres);
}

int main(int argc, char **argv)
{
    int ndev = 0, have, all, provided, failed_any;
    size_t count = 100003;
    cudaStream_t s;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--count") == 0) count = (size_t)strtoull(argv[i + 1], NULL, 10);
    have = cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0;
    MPI_Allreduce(&have, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all) {
        if (g_rank == 0) printf("no CUDA device on some rank: skipped\n");
        MPI_Finalize();
        return 77;
    }
    CU(cudaSetDevice(g_rank % ndev));
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (size_t k = 0; k < sizeof SPECS / sizeof SPECS[0]; k++)
        for (size_t v = 0; v < N_VARIANTS; v++) run_case(SPECS[k], &VARIANTS[v], count, s);
    CU(cudaStreamDestroy(s));
    MPI_Allreduce(&g_failed, &failed_any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (g_rank == 0) printf("cuda_mpi_staging: %s\n", failed_any ? "FAILED" : "all checks passed");
    MPI_Finalize();
    return failed_any ? 1 : 0;
}
