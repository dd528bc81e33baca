/*
 * ring.h — the ring primitives every schedule is written against (ring.c): neighbours,
 * chunk arithmetic, one exchange with the neighbours (whole or in two halves, to compute
 * while bytes travel), the agreement-sized collectives, and the accounting of wire bytes
 * and time. A ring sees a transport and a stats block, never a communicator or a codec.
 *
 * The peers: message m goes to the right neighbour and comes from the left one -- or, on a
 * butterfly (gcomp__ring_use_butterfly: a power-of-two N >= 4, for recursive doubling),
 * both ways with rank ^ 2^(m mod log2 N). Everything below that counts hops counts them
 * in r->reach, the messages after which a rank's news has reached every rank: N-1 on the
 * ring, log2 N on the butterfly.
 *
 * The local-failure convention: a rank whose call failed after the ranks agreed to run it
 * (a corrupt payload) keeps stepping the ring, sending empty messages, so nobody waits for
 * it. Without the trailer (device buffers) an empty message fails the receiver's checks in
 * turn (or carries nothing, for an empty chunk) and the engine's end-of-call agreement
 * reports the failure on every rank. Transport failures (timeout, a broken peer) return at
 * once instead.
 *
 * The outcome trailer (calls on host buffers, r->trailer): every message of the call ends
 * with GCOMP__RING_TRAILER_BASE bytes that say what the sender knows of the call's outcome --
 * the worst failure it has seen or heard of, and whether some encode saw a non-finite
 * value -- so the ranks decide the outcome (error, non-finite, commit) without a collective
 * of their own. Each rank ORs (max for the failure) what arrives into what it sends next:
 * news travels one hop per step, so what a rank knows when it sends message m reaches every
 * rank iff the call sends at least m + reach messages. The schedules arrange that every
 * outcome that matters is known in time (sched_*.c say how); gcomp__ring_outcome tells the
 * engine when this rank's own news went out too late (only a payload corrupted in transit
 * late in the call: MPI guarantees integrity). A rank that hears of a failure stops its
 * work (as after its own) and sends empty payloads. Device buffers keep the end-of-call
 * agreement (engine.c): what their kernels find lives in device memory.
 *
 * Trailer layout (little-endian, 16 bytes): u16 magic 0x6f47 ("Go"), u8 version 1, u8 flags
 * (bit 0: some rank's encode saw a non-finite value; bit 1: the agreement block of
 * GCOMP__RING_AGREE_MAX u64, 144 bytes, precedes the trailer), u32 the call's sequence number on the
 * communicator (a message of another call is recognised), u64 failure: 0, or (error code <<
 * 32 | rank) of the worst failure known, the max over ranks as in the agreements (comm.c).
 * Every buffer a schedule passes to gcomp__ring_start* holds GCOMP__RING_TRAILER bytes after
 * its capacity (the trailer is written after the payload and read from a message's end);
 * the sizes the schedules see are the payloads' only.
 */
#ifndef GCOMP_RING_H
#define GCOMP_RING_H

#include "transport.h"

#define GCOMP__RING_TRAILER_BASE 16 /* bytes of the outcome trailer */
#define GCOMP__RING_AGREE_MAX 18    /* uint64 of an agreement block */
/* room every ring buffer keeps after its capacity: the trailer and an agreement block */
#define GCOMP__RING_TRAILER (GCOMP__RING_TRAILER_BASE + 8 * GCOMP__RING_AGREE_MAX)
#define GCOMP__RING_NONFINITE 1u /* trailer flag: some rank's encode saw a non-finite value */
#define GCOMP__RING_AGREEING 2u  /* trailer flag: an agreement block precedes the trailer */

/* The verdict on an agreement (comm.c): mine is this rank's block, all the max over every
 * rank; GCOMP_SUCCESS lets the call go on, anything else stops it on every rank. */
typedef gcomp_result (*gcomp__ring_verdict)(void *ctx, const uint64_t *mine, const uint64_t *all, size_t n);

typedef struct gcomp__ring {
    gcomp__transport *tp;
    int rank, size;
    double deadline;      /* absolute, gcomp__now() seconds */
    gcomp_comm_stats *st; /* this call's numbers: wire_bytes and comm_s are counted here */
    gcomp_result error;   /* the first failure of the call on this rank (GCOMP_STEP), or one
                           * heard of in a trailer: later steps skip their work */
    int nonfinite;        /* this rank's encode saw a non-finite value (or a shared scale is one) */
    /* the outcome trailer (trailer = 1: host buffers; the engine sets trailer and seq) */
    int trailer;
    uint32_t seq;          /* the call's sequence number on the communicator */
    uint64_t fail;         /* 0 or (code << 32 | rank): the worst failure known here */
    uint32_t flags;        /* GCOMP__RING_NONFINITE: this rank's or heard of */
    int heard;             /* error was heard of, not found here */
    uint64_t msgs;         /* messages sent so far in this call */
    uint64_t fail_at;      /* index of the first message that carried this rank's own failure */
    uint64_t nonfinite_at; /* the same for this rank's own non-finite flag */
    uint8_t *rbuf;         /* the receive in flight (its trailer is read at finish) */
    size_t rcap;           /* its capacity, trailer room included */
    int block_in_flight;   /* the messages in flight carry the agreement block */
    int butterfly;         /* messages go to the butterfly's partners (gcomp__ring_use_butterfly) */
    int reach;             /* messages after which news reaches every rank: N-1, or log2 N */
    int peer;              /* the rank the receive in flight (or the last one) comes from */
    /* the in-band agreement (gcomp__ring_agree): a block of agree_n uint64 that the first
     * `reach` messages carry before their trailer, each rank sending the max of its own and
     * what it heard, so that after them every rank holds the max over all ranks */
    size_t agree_n;                     /* 0: no agreement in this call's messages */
    uint64_t agree_mine[GCOMP__RING_AGREE_MAX];
    uint64_t agree_all[GCOMP__RING_AGREE_MAX];
    gcomp__ring_verdict verdict;        /* called once, when the block is complete */
    void *verdict_ctx;
    gcomp_result stop;                  /* the verdict when it stopped the call */
} gcomp__ring;

/* What the trailers decided, at the end of a call (gcomp__ring_outcome_get). */
typedef struct gcomp__ring_outcome {
    uint64_t fail; /* 0, or (code << 32 | rank) of the worst failure any rank had */
    int nonfinite; /* some rank's encode saw a non-finite value */
    int late;      /* this rank's own news went out too late to reach every rank */
} gcomp__ring_outcome;

static inline int gcomp__ring_right(const gcomp__ring *r) { return (r->rank + 1) % r->size; }
static inline int gcomp__ring_left(const gcomp__ring *r) { return (r->rank + r->size - 1) % r->size; }
/* log2 n when n is a power of two >= 4 (a butterfly's steps), else 0 */
int gcomp__ring_butterfly_steps(int n);
/* Recursive doubling's exchanges: log2 n at a power-of-two n >= 2, else 0. At n = 2 its one
 * partner is the ring's neighbour, so it runs on the plain ring (no butterfly). */
int gcomp__ring_doubling_steps(int n);
/* (r->rank + k) mod size for any k, negative included */
static inline int gcomp__ring_rel(const gcomp__ring *r, int k) { return ((r->rank + k) % r->size + r->size) % r->size; }

/* Chunk c of n_chunks over count elements, boundaries at multiples of align. */
void gcomp__chunk(size_t count, int n_chunks, int c, size_t align, size_t *lo, size_t *hi);
/* The most elements any chunk of gcomp__chunk holds: what a buffer for one chunk must hold.
 * Not count / n_chunks plus a margin: the rounding down to align of every chunk start leaves
 * the last chunk up to n_chunks - 1 + align - 1 more elements than count / n_chunks. */
size_t gcomp__chunk_max(size_t count, int n_chunks, size_t align);

/* Record a local failure of the call (the first one wins); later steps still run the ring. */
#define GCOMP_STEP(ring, expr)                                       \
    do {                                                             \
        if (!(ring)->error) {                                        \
            gcomp_result step_rc_ = (expr);                          \
            if (step_rc_ != GCOMP_SUCCESS) (ring)->error = step_rc_; \
        }                                                            \
    } while (0)

/* Prepare a ring for one call: no failure, no news, no message yet; trailer and seq as given;
 * messages to the neighbours (r->rank and r->size set before). */
void gcomp__ring_begin(gcomp__ring *r, int trailer, uint32_t seq);
/* Send this call's messages on the butterfly instead (reach log2 N); nothing when N is not a
 * power of two >= 4 or a message was sent already. */
void gcomp__ring_use_butterfly(gcomp__ring *r);

/* The in-band agreement: this call's first r->reach messages carry block (n <= GCOMP__RING_AGREE_MAX
 * uint64, combined by max over ranks) after their payload, and their receives take a message
 * of any size (transport.h: start_sendrecv_any), so a neighbour that disagrees on the call
 * cannot overflow them. When the last of them is in, every rank holds the same max, and
 * verdict(ctx, mine, all, n) decides on every rank alike: a failure stops the call at that
 * point on every rank (gcomp__ring_finish returns it, and every later start), so ranks that
 * disagreed on the call never run their different schedules past it. (Alike given intact
 * messages, which MPI guarantees: a message without a valid trailer is a local failure of its
 * receiver, whose max then lacks blocks. When the ranks agree, a partial max is the same max;
 * only if they also disagree on this very call can that rank's verdict differ -- it goes on
 * and fails on its next message while the others stop, and the next call fails on every
 * rank on the messages it left: docs/RELIABILITY.md.)  Every call on a host transport sends
 * reach such messages to the same peers on every rank whatever it planned: its schedule's
 * first ones, or a pass before it (gcomp__ring_agree_pass: a bypass, device buffers, a dense
 * ring on a butterfly communicator; engine.c picks ring or butterfly per communicator); what
 * runs before the verdict must be safe on a neighbour's payload of another call (the decoders
 * check sizes; an oversized message is a local failure). After ring_begin; host transports
 * with start_sendrecv_any only, after gcomp__ring_use_butterfly if at all; n = 0 or one
 * rank: no agreement. */
void gcomp__ring_agree(gcomp__ring *r, const uint64_t *block, size_t n, gcomp__ring_verdict verdict, void *ctx);
/* The agreement alone, for a call whose schedule sends no ring messages on this transport
 * (bypassed, empty, device buffers, failed before it could plan): reach steps of trailers and
 * blocks only. buf: 2 * GCOMP__RING_TRAILER bytes that outlive a timed-out exchange. Returns
 * the verdict (or a transport failure). */
gcomp_result gcomp__ring_agree_pass(gcomp__ring *r, uint8_t *buf);

/* One ring step: send sbytes to the right neighbour, receive at most rcap bytes from the
 * left one (on a butterfly: both with this message's partner; 0 bytes sent after a local
 * failure). Counts wire bytes and time. With the
 * trailer, sbuf and rbuf hold GCOMP__RING_TRAILER bytes more than sbytes and rcap; the
 * trailer counts as wire bytes, *rbytes is the payload's size, and a message without a valid
 * trailer is a local failure (GCOMP_ERR_CORRUPT) of the receiver, not an error returned. */
gcomp_result gcomp__ring_exchange(gcomp__ring *r, void *sbuf, size_t sbytes, void *rbuf, size_t rcap, size_t *rbytes);
/* The same in two halves; sbuf and rbuf must stay untouched until gcomp__ring_finish (the
 * payload of sbuf may be read meanwhile). */
gcomp_result gcomp__ring_start(gcomp__ring *r, void *sbuf, size_t sbytes, void *rbuf, size_t rcap);
gcomp_result gcomp__ring_finish(gcomp__ring *r, size_t *rbytes);
/* The same when both ends know every size (device buffers of fixed-size payloads: sbytes is
 * what the right neighbour expects, rbytes exactly what the left one sends): a transport
 * with start_sendrecv_sized (NCCL) then skips its size exchange. The message keeps its size
 * after a local failure (its bytes are discarded by the outcome agreement); without that
 * entry this is gcomp__ring_start with rbytes as the capacity. */
gcomp_result gcomp__ring_start_sized(gcomp__ring *r, void *sbuf, size_t sbytes, void *rbuf, size_t rbytes);
/* One more step that carries only the trailer (a schedule whose last hops could otherwise
 * find news that never gets out: the sparse gather, recursive doubling; an empty call after
 * its agreement's pass, engine.c). buf: 2 * GCOMP__RING_TRAILER bytes of
 * workspace (a timed-out MPI exchange may still use it). Nothing without the trailer. */
gcomp_result gcomp__ring_outcome_hop(gcomp__ring *r, uint8_t *buf);
/* At the end of a call with the trailer: what every rank knows of the outcome. */
gcomp__ring_outcome gcomp__ring_outcome_get(const gcomp__ring *r);
/* The trailer bytes one rank sends in a call of schedule `sched` over n ranks (host buffers):
 * one trailer per message, 2(n-1) messages on the rings, n on the sparse gather (its outcome
 * hop included), 2 log2 n for recursive doubling (its outcome hops included), 0 at one rank
 * or for a bypassed call. Agreement blocks not included: */
uint64_t gcomp__ring_trailer_bytes(gcomp_schedule sched, int n);
/* the bytes of the in-band agreement's blocks one rank sends in a call over n ranks, on the
 * ring or (butterfly = 1, n a power of two >= 4) the butterfly (and of the trailers of
 * gcomp__ring_agree_pass, which has no schedule of its own: pass = 1). */
uint64_t gcomp__ring_agree_bytes(int n, int butterfly, int pass);
/* Let the exchange in flight advance (between pieces of computation). */
void gcomp__ring_progress(gcomp__ring *r);
/* In-place max of n uint64 over all ranks, counted as 8n wire bytes and comm time. */
gcomp_result gcomp__ring_max_u64(gcomp__ring *r, uint64_t *vals, size_t n);

#endif
