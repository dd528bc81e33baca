/*
 * allreduce_perf_cuda.c — the device side of allreduce_perf --device cuda: the CUDA device of
 * this rank, its stream and device buffers, an NCCL communicator for the baseline and for
 * gcomp_comm_create_nccl, and ncclAllReduce itself. One set per process (a benchmark).
 *
 * Uses the CUDA runtime, NCCL and the public API (gcomp_nccl.h).
 */
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include "allreduce_perf_cuda.h"
#include "gcomp_nccl.h"

static struct {
    int device;
    char name[256];
    cudaStream_t stream;
    void *send, *recv;
    ncclComm_t nccl; /* NULL: no NCCL here (ranks sharing a GPU, or NCCL failed) */
} D = { -1, "", NULL, NULL, NULL, NULL };

static int cuda_ok(cudaError_t e, const char *what, char *why, size_t cap)
{
    if (e == cudaSuccess) return 1;
    snprintf(why, cap, "%s: %s", what, cudaGetErrorString(e));
    return 0;
}

/* Ranks on one node share its GPUs round-robin; NCCL needs a GPU per rank. */
int apc_open(MPI_Comm world, size_t bytes, int want_nccl, char *why, size_t cap)
{
    MPI_Comm node;
    int local = 0, local_n = 1, ndev = 0, rank = 0, nranks = 1, ok;
    ncclUniqueId id;
    struct cudaDeviceProp prop;
    why[0] = 0;
    MPI_Comm_rank(world, &rank);
    MPI_Comm_size(world, &nranks);
    MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local);
    MPI_Comm_size(node, &local_n);
    MPI_Comm_free(&node);
    if (!cuda_ok(cudaGetDeviceCount(&ndev), "cudaGetDeviceCount", why, cap) || ndev == 0) {
        if (!why[0]) snprintf(why, cap, "no CUDA device");
        return -1;
    }
    D.device = local % ndev;
    if (!cuda_ok(cudaSetDevice(D.device), "cudaSetDevice", why, cap) ||
        !cuda_ok(cudaGetDeviceProperties(&prop, D.device), "cudaGetDeviceProperties", why, cap) ||
        !cuda_ok(cudaStreamCreateWithFlags(&D.stream, cudaStreamNonBlocking), "cudaStreamCreate", why, cap) ||
        !cuda_ok(cudaMalloc(&D.send, bytes), "cudaMalloc", why, cap) ||
        !cuda_ok(cudaMalloc(&D.recv, bytes), "cudaMalloc", why, cap))
        return -1;
    snprintf(D.name, sizeof D.name, "%s", prop.name);
    if (!want_nccl) {
        snprintf(why, cap, "not asked for (--transport mpi)");
        return 0;
    }
    /* every rank decides alike: NCCL refuses two ranks on one GPU */
    ok = local_n <= ndev;
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, world);
    if (!ok) {
        snprintf(why, cap, "%d ranks share %d GPU(s) on a node, and NCCL takes one rank per GPU", local_n, ndev);
        return 0;
    }
    if (rank == 0 && ncclGetUniqueId(&id) != ncclSuccess) memset(&id, 0, sizeof id);
    MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, world);
    ok = ncclCommInitRank(&D.nccl, nranks, id, rank) == ncclSuccess;
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, world);
    if (!ok) {
        snprintf(why, cap, "ncclCommInitRank failed on some rank");
        if (D.nccl) ncclCommAbort(D.nccl);
        D.nccl = NULL;
    }
    return 0;
}

void apc_close(void)
{
    if (D.nccl) ncclCommDestroy(D.nccl);
    cudaFree(D.send);
    cudaFree(D.recv);
    if (D.stream) cudaStreamDestroy(D.stream);
}

int apc_has_nccl(void) { return D.nccl != NULL; }
const char *apc_device_name(void) { return D.name; }
int apc_device(void) { return D.device; }
void *apc_send(void) { return D.send; }
void *apc_recv(void) { return D.recv; }
struct CUstream_st *apc_stream(void) { return (struct CUstream_st *)D.stream; }

static int done(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return 0;
    fprintf(stderr, "allreduce_perf: %s: %s\n", what, cudaGetErrorString(e));
    return 1;
}

int apc_h2d(void *dst, const void *src, size_t bytes)
{
    return done(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "copy to the device");
}

int apc_d2h(void *dst, const void *src, size_t bytes)
{
    return done(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "copy from the device");
}

int apc_memset(void *dst, size_t bytes) { return done(cudaMemset(dst, 0, bytes), "cudaMemset"); }

int apc_sync(void) { return done(cudaStreamSynchronize(D.stream), "cudaStreamSynchronize"); }

gcomp_result apc_comm_nccl(const gcomp_config *cfg, gcomp_comm **out)
{
    return gcomp_comm_create_nccl(D.nccl, cfg, out);
}

int apc_nccl_allreduce(size_t count, gcomp_dtype dtype, gcomp_op op)
{
    ncclDataType_t t = dtype == GCOMP_F16 ? ncclHalf : dtype == GCOMP_BF16 ? ncclBfloat16 : ncclFloat;
    ncclResult_t r = ncclAllReduce(D.send, D.recv, count, t, op == GCOMP_AVG ? ncclAvg : ncclSum, D.nccl, D.stream);
    if (r == ncclSuccess) return 0;
    fprintf(stderr, "allreduce_perf: ncclAllReduce: %s\n", ncclGetErrorString(r));
    return 1;
}
