/*
 * ring.h — the ring primitives every schedule is written against (ring.c): neighbours,
 * chunk arithmetic, one exchange with the neighbours (whole or in two halves, to compute
 * while bytes travel), the agreement-sized collectives, and the accounting of wire bytes
 * and time. A ring sees a transport and a stats block, never a communicator or a codec.
 *
 * The local-failure convention: a rank whose call failed after the ranks agreed to run it
 * (a corrupt payload) keeps stepping the ring, sending empty messages, so nobody waits for
 * it. An empty message fails the receiver's checks in turn (or carries nothing, for an
 * empty chunk); either way the engine's end-of-call agreement reports the failure on every
 * rank. Transport failures (timeout, a broken peer) return at once instead.
 */
#ifndef GCOMP_RING_H
#define GCOMP_RING_H

#include "transport.h"

typedef struct gcomp__ring {
    gcomp__transport *tp;
    int rank, size;
    double deadline;      /* absolute, gcomp__now() seconds */
    gcomp_comm_stats *st; /* this call's numbers: wire_bytes and comm_s are counted here */
    gcomp_result error;   /* the first local failure of the call (GCOMP_STEP) */
} gcomp__ring;

static inline int gcomp__ring_right(const gcomp__ring *r) { return (r->rank + 1) % r->size; }
static inline int gcomp__ring_left(const gcomp__ring *r) { return (r->rank + r->size - 1) % r->size; }
/* (r->rank + k) mod size for any k, negative included */
static inline int gcomp__ring_rel(const gcomp__ring *r, int k) { return ((r->rank + k) % r->size + r->size) % r->size; }

/* Chunk c of n_chunks over count elements, boundaries at multiples of align. */
void gcomp__chunk(size_t count, int n_chunks, int c, size_t align, size_t *lo, size_t *hi);

/* Record a local failure of the call (the first one wins); later steps still run the ring. */
#define GCOMP_STEP(ring, expr)                                       \
    do {                                                             \
        if (!(ring)->error) {                                        \
            gcomp_result step_rc_ = (expr);                          \
            if (step_rc_ != GCOMP_SUCCESS) (ring)->error = step_rc_; \
        }                                                            \
    } while (0)

/* One ring step: send sbytes to the right neighbour, receive at most rcap bytes from the
 * left one (0 bytes sent after a local failure). Counts wire bytes and time. */
gcomp_result gcomp__ring_exchange(gcomp__ring *r, const void *sbuf, size_t sbytes, void *rbuf, size_t rcap,
                                  size_t *rbytes);
/* The same in two halves; sbuf and rbuf must stay untouched until gcomp__ring_finish. */
gcomp_result gcomp__ring_start(gcomp__ring *r, const void *sbuf, size_t sbytes, void *rbuf, size_t rcap);
gcomp_result gcomp__ring_finish(gcomp__ring *r, size_t *rbytes);
/* The same when both ends know every size (device buffers of fixed-size payloads: sbytes is
 * what the right neighbour expects, rbytes exactly what the left one sends): a transport
 * with start_sendrecv_sized (NCCL) then skips its size exchange. The message keeps its size
 * after a local failure (its bytes are discarded by the outcome agreement); without that
 * entry this is gcomp__ring_start with rbytes as the capacity. */
gcomp_result gcomp__ring_start_sized(gcomp__ring *r, const void *sbuf, size_t sbytes, void *rbuf, size_t rbytes);
/* Let the exchange in flight advance (between pieces of computation). */
void gcomp__ring_progress(gcomp__ring *r);
/* In-place max of n uint64 over all ranks, counted as 8n wire bytes and comm time. */
gcomp_result gcomp__ring_max_u64(gcomp__ring *r, uint64_t *vals, size_t n);

#endif
