/*
 * transport.h — what moves bytes between ranks: non-blocking send/receive of variable-size
 * payloads with a deadline, and the two small collectives the engine needs. A transport
 * knows nothing of codecs, schedules or communicators' state; it is handed to one.
 *
 * Implementations: transport_mpi.c (host memory over Open MPI), transport_loop.c (ranks as
 * threads of one process, for unit tests), transport_nccl.c (CUDA memory over NCCL);
 * decorators wrap another transport and forward to it (transport_fault.c: test faults;
 * transport_staging.c: CUDA memory over a host transport through pinned bounce buffers).
 *
 * Transports of CUDA memory (mem == GCOMP__MEM_CUDA): the buffers of start/finish_sendrecv
 * and of allreduce_sum_f32 are device memory of the current device, and the transport
 * orders its work after what the caller enqueued on `stream` (set by the engine before each
 * call) and before what the caller enqueues there after finish_sendrecv /
 * allreduce_sum_f32 return. allreduce_max_u64 always takes host memory (the agreements).
 */
#ifndef GCOMP_TRANSPORT_H
#define GCOMP_TRANSPORT_H

#include "internal.h"

/* Where the buffers handed to a transport must live. */
typedef enum gcomp__mem_kind {
    GCOMP__MEM_HOST = 0,
    GCOMP__MEM_CUDA = 1
} gcomp__mem_kind;

typedef struct gcomp__transport gcomp__transport;
struct gcomp__transport {
    int rank, size;
    gcomp__mem_kind mem; /* the memory every buffer passed below must be in */
    /* GCOMP__MEM_CUDA: the CUDA device whose memory the buffers must be (NCCL: its
     * communicator's; staging: the device current when it was made); buffers of another
     * device are refused before the call's agreement. Unused for host. */
    int device;
    /* GCOMP__MEM_CUDA: the CUDA stream (cudaStream_t) of the call in progress; the engine
     * sets it before each call (calls of a communicator never overlap). Unused for host. */
    struct CUstream_st *stream;
    /* 1: once finish_sendrecv has returned, even with a timeout, the transport touches the
     * exchange's buffers no more (the loopback transport copies messages). 0 (MPI, which
     * cannot cancel a send): a timed-out exchange may still use them, so a communicator
     * broken by a timeout leaks its workspace rather than free it under the transport. */
    int releases_buffers_on_timeout;
    /* Start sending sbytes to rank `to` while receiving at most rcap bytes from rank `from`
     * (one exchange in flight at a time); finish waits for both, until deadline (absolute
     * gcomp__now() seconds). The caller computes in between: that is the overlap. A message
     * longer than rcap is an error of the exchange (MPI_ERR_TRUNCATE). */
    gcomp_result (*start_sendrecv)(gcomp__transport *t, int to, const void *sbuf, size_t sbytes, int from, void *rbuf,
                                   size_t rcap);
    gcomp_result (*finish_sendrecv)(gcomp__transport *t, size_t *rbytes, double deadline);
    /* Let the exchange in flight advance while the caller computes (MPI moves large
     * messages only inside MPI calls). Cheap; call it every few hundred microseconds. */
    void (*progress)(gcomp__transport *t);
    /* In-place elementwise max of n uint64 over all ranks. */
    gcomp_result (*allreduce_max_u64)(gcomp__transport *t, uint64_t *vals, size_t n, double deadline);
    /* In-place float sum of n floats over all ranks (the uncompressed path). */
    gcomp_result (*allreduce_sum_f32)(gcomp__transport *t, float *vals, size_t n, double deadline);
    void (*destroy)(gcomp__transport *t);
    /* 1 if a progress thread of the library may use this transport while the user's own
     * threads call the library underneath (MPI: MPI_THREAD_MULTIPLE); 0 with the reason in
     * why. Takes no transport, so decorators copy it as is. NULL: always 1 (the loopback
     * transport: each rank's transport is used by one thread at a time, which the
     * communicator's queue guarantees). */
    int (*threads_ok)(char *why, size_t cap);

    /* ---- optional entries (NULL / 0 in transports that do not need them) ---- */
    /* The same exchange as start_sendrecv when both ends know every size: sbytes is exactly
     * what rank `to` passes as its rbytes, and the message from `from` is exactly rbytes long
     * (finish_sendrecv then reports rbytes). Both ranks of a message must use the same entry.
     * NCCL (transport_nccl.c) needs the receive size when it posts a receive: without this,
     * start_sendrecv first exchanges the size (a small NCCL exchange and a host wait per
     * message); with it, nothing but the payload travels and start does not wait. For
     * payloads whose size follows from (count, ranks, codec) -- fp16, bf16, TernGrad's sums --
     * or sizes the ranks shared already (top-k: one allreduce_max_u64 of N sizes per call).
     * A rank that failed locally must still send sbytes (any content: the outcome agreement
     * discards the call), not the empty message of the ring's convention. NULL: callers use
     * start_sendrecv, which is always correct. Proposed by the NCCL transport; the ring and
     * schedules opt in (src/ring.c). */
    gcomp_result (*start_sendrecv_sized)(gcomp__transport *t, int to, const void *sbuf, size_t sbytes, int from,
                                         void *rbuf, size_t rbytes);
    /* The same exchange as start_sendrecv when the left neighbour may disagree on the size
     * (the first N-1 messages of a call on a host transport carry the ranks' agreement on the
     * call, ring.h, and a rank that differs from its neighbour may send anything): a message
     * of any length is received -- never a truncation error -- and one longer than rcap
     * leaves its last rcap bytes in rbuf (the tail, where the ring's trailer lies);
     * finish_sendrecv reports the message's whole length, so the receiver sees that it was
     * longer. MPI matches the message with MPI_Improbe before receiving it. NULL (NCCL,
     * staging): calls on this transport agree by a collective before they start. */
    gcomp_result (*start_sendrecv_any)(gcomp__transport *t, int to, const void *sbuf, size_t sbytes, int from,
                                       void *rbuf, size_t rcap);
    /* NULL, or why this transport cannot carry a spec with byte stages (+zstd): creation
     * (gcomp__comm_create) then refuses such a spec with GCOMP_ERR_UNSUPPORTED and this text. */
    const char *no_byte_stages;
};

/* ---- handing a transport to a communicator (comm.c) ----
 * A transport's constructor (gcomp_comm_create_mpi, gcomp__comm_create_loop) ends here.
 * gcomp__comm_create builds a communicator around tp and takes ownership of it even on
 * failure. Collective: a local failure (out == NULL, bad spec or config, no memory) still
 * joins the creation's agreement, so every rank returns an error.
 * gcomp__comm_join_failed: a rank that failed before it could build a communicator (local
 * holds its error and gcomp_last_error() the detail) still joins that agreement, so the
 * other ranks return an error instead of waiting; destroys tp and returns local. */
gcomp_result gcomp__comm_create(gcomp__transport *tp, const gcomp_config *cfg, gcomp_comm **out);
gcomp_result gcomp__comm_join_failed(gcomp__transport *tp, gcomp_result local);

/* ---- the MPI transport's count limit (transport_mpi.c), for tests ----
 * The most one MPI call moves (bytes of a message, elements of a collective): INT_MAX, MPI's
 * int counts. Longer messages go as one element of a derived datatype, longer collectives
 * in pieces. Tests lower it (before any creation) to run those paths on small buffers. */
extern size_t gcomp__mpi_max_count;

/* ---- the fault-injection decorator (transport_fault.c), for tests ----
 * Wraps inner (taking ownership); *out forwards everything to it, except what is armed. */
gcomp_result gcomp__transport_fault_wrap(gcomp__transport *inner, gcomp__transport **out);
/* The next message this transport sends loses its last byte (a message of 0 bytes is sent
 * as is and keeps the fault armed). t must come from gcomp__transport_fault_wrap. */
void gcomp__transport_fault_truncate_next(gcomp__transport *t);
/* The next message of at least 8 bytes goes out with its last 8 bytes -- a ring message's
 * outcome trailer's failure field (ring.h) -- set to code 0xff, which is no gcomp_result,
 * and rank 0 (a copy is sent; the caller's buffer is untouched). */
void gcomp__transport_fault_garble_next(gcomp__transport *t);

#endif
