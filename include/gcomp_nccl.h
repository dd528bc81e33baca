/*
 * gcomp_nccl.h — gcomp communicators over NCCL, for gradients in CUDA device memory.
 *
 * Separate from gcomp.h so that only users of NCCL need nccl.h. Present in builds with NCCL
 * (CMake: GCOMP_WITH_NCCL); the functions are exported by libgcomp there.
 *
 * A gcomp communicator over NCCL takes device buffers of the calling thread's current device
 * in gcomp_allreduce / gcomp_iallreduce with the caller's CUDA stream (gcomp.h): its payloads
 * travel with grouped ncclSend/ncclRecv on that stream. gcomp works on an NCCL communicator
 * of its own and never aborts, destroys or otherwise changes the user's: a stuck peer becomes
 * GCOMP_ERR_TIMEOUT (after timeout_ms), gcomp aborts its own NCCL communicator and the gcomp
 * communicator refuses further calls (GCOMP_ERR_COMM_INVALID) until it is destroyed.
 *
 * Not supported on NCCL: codec specs with byte stages ("+zstd": zstd runs on host memory),
 * refused at creation with GCOMP_ERR_UNSUPPORTED -- use gcomp_comm_create_mpi, whose device
 * buffers go through host memory; and calls during CUDA graph capture (gcomp waits on the
 * host between steps), refused with GCOMP_ERR_UNSUPPORTED.
 *
 * NCCL: built against NCCL 2.18 or later (nccl.h; older headers stop the build), and the
 * library loaded at run time must be 2.18 or later too (checked at creation with
 * ncclGetVersion: GCOMP_ERR_UNSUPPORTED naming both versions).
 */
#ifndef GCOMP_NCCL_H
#define GCOMP_NCCL_H

#include <nccl.h>

#include "gcomp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Collective over comm: every rank of comm calls it, with the same codec. Creates gcomp's
 * own NCCL communicator from comm (ncclCommSplit with one color, ranks in comm's order, no
 * resource sharing, non-blocking so that every wait has a deadline: NCCL >= 2.18) on comm's
 * CUDA device, and a gcomp communicator over it. comm stays the caller's and must outlive
 * nothing of gcomp's: it may be destroyed before or after *out. cfg may be NULL (every
 * field from the GCOMP_* environment, as gcomp_comm_create_mpi). Blocking. The
 * configuration's timeout_ms bounds the wait when comm is non-blocking (ncclConfig_t.blocking
 * = 0); on a blocking comm (NCCL's default) ncclCommSplit itself waits for every rank with
 * no deadline of gcomp's, so a rank that never calls this blocks the others inside NCCL
 * (until NCCL gives up, or the program aborts comm). Everything after the split has
 * timeout_ms.
 * Errors: GCOMP_ERR_INVALID_ARG (NULL comm or out), GCOMP_ERR_UNSUPPORTED (a "+zstd" spec,
 * or an NCCL older than 2.18 loaded at run time),
 * GCOMP_ERR_TRANSPORT (NCCL or CUDA failed; NCCL's message in gcomp_last_error()),
 * GCOMP_ERR_TIMEOUT (a rank did not join), GCOMP_ERR_MISMATCH (ranks gave different codecs),
 * and gcomp_comm_create's errors. Free *out with gcomp_comm_destroy (which frees gcomp's
 * NCCL communicator). */
GCOMP_API gcomp_result gcomp_comm_create_nccl(ncclComm_t comm, const gcomp_config *cfg, gcomp_comm **out);

/* For launchers without NCCL bindings (Python through ctypes): a new NCCL unique id
 * (ncclGetUniqueId) in the 128 bytes at id128, to be sent to every rank by the caller. */
GCOMP_API gcomp_result gcomp_nccl_get_unique_id(void *id128);

/* Collective over nranks ranks that got the same id128 (gcomp_nccl_get_unique_id): creates
 * an NCCL communicator on the calling thread's current CUDA device (ncclCommInitRankConfig)
 * and a gcomp communicator over it, which owns it: gcomp_comm_destroy frees it. rank is this
 * rank in [0, nranks). Blocking, up to timeout_ms. Errors as gcomp_comm_create_nccl, and
 * GCOMP_ERR_INVALID_ARG for a NULL id128, nranks < 1, a rank out of range or no CUDA device. */
GCOMP_API gcomp_result gcomp_comm_create_nccl_rank(const void *id128, int nranks, int rank, const gcomp_config *cfg,
                                                   gcomp_comm **out);

/* For a program that aborts its NCCL communicator (a watchdog thread calling ncclCommAbort
 * on a hang): stop comm's NCCL work from any thread, also while another thread is inside a
 * call on comm. Only sets a flag, at once: the call in flight sees it at its next poll (within
 * microseconds when it waits on NCCL), aborts gcomp's own NCCL communicator and returns
 * GCOMP_ERR_TRANSPORT; later calls return GCOMP_ERR_COMM_INVALID; gcomp_comm_destroy then
 * aborts gcomp's NCCL communicator instead of finalising it (no wait for peers that may be
 * gone). The user's NCCL communicator is not touched. comm must still be destroyed with
 * gcomp_comm_destroy, after the call in flight has returned (never concurrently with it or
 * after it). Errors: GCOMP_ERR_INVALID_ARG (NULL, or a communicator not made by the two
 * functions above). */
GCOMP_API gcomp_result gcomp_nccl_abort(gcomp_comm *comm);

#ifdef __cplusplus
}
#endif

#endif
