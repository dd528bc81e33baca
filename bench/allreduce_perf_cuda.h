/*
 * allreduce_perf_cuda.h — the device side of allreduce_perf --device cuda
 * (allreduce_perf_cuda.c): this rank's GPU, stream, device buffers and NCCL communicator.
 * Functions returning int give 0 on success, non-zero after printing the failure.
 */
#ifndef GCOMP_ALLREDUCE_PERF_CUDA_H
#define GCOMP_ALLREDUCE_PERF_CUDA_H

#include <stddef.h>

#include <mpi.h>

#include "gcomp.h"

/* Collective over world: picks this rank's GPU (node-local rank modulo the GPUs), a stream,
 * send and receive buffers of `bytes`, and, with want_nccl, an NCCL communicator over world
 * (not when ranks share a GPU: why says so). -1 when no GPU is usable (why says why). */
int apc_open(MPI_Comm world, size_t bytes, int want_nccl, char *why, size_t cap);
void apc_close(void);
int apc_has_nccl(void);
const char *apc_device_name(void);
int apc_device(void);
void *apc_send(void);
void *apc_recv(void);
struct CUstream_st *apc_stream(void);
int apc_h2d(void *dst, const void *src, size_t bytes);
int apc_d2h(void *dst, const void *src, size_t bytes);
int apc_memset(void *dst, size_t bytes);
int apc_sync(void); /* waits for the stream */
/* gcomp_comm_create_nccl over the benchmark's NCCL communicator */
gcomp_result apc_comm_nccl(const gcomp_config *cfg, gcomp_comm **out);
/* ncclAllReduce of the device buffers on the stream (the baseline) */
int apc_nccl_allreduce(size_t count, gcomp_dtype dtype, gcomp_op op);

#endif
