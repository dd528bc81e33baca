/*
 * engine.h — what the allreduce engine's files share: the communicator, the transport
 * interface and the schedules. Schedules know codecs only through the vtable; transports
 * know nothing of codecs.
 */
#ifndef GCOMP_ENGINE_H
#define GCOMP_ENGINE_H

#include "internal.h"

/* ---- configuration (config.c) ---- */
typedef struct gcomp__config {
    char codec[GCOMP_SPEC_MAX];
    int64_t min_bytes;
    int error_feedback;
    uint64_t seed;
    int64_t timeout_ms;
    int debug;
} gcomp__config;

/* Fill unset fields of cfg (may be NULL) from GCOMP_* environment variables, then defaults. */
gcomp_result gcomp__config_resolve(const gcomp_config *cfg, gcomp__config *out);

/* ---- transport: moves bytes between ranks, knows nothing of codecs ---- */
typedef struct gcomp__transport gcomp__transport;
struct gcomp__transport {
    int rank, size;
    /* Start sending sbytes to rank `to` while receiving at most rcap bytes from rank `from`
     * (one exchange in flight at a time); finish waits for both, until deadline (absolute
     * CLOCK_MONOTONIC seconds). The caller computes in between: that is the overlap. */
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
};

/* ---- per-key state ---- */
typedef struct gcomp__key {
    uint64_t key;
    size_t count;
    /* calls without error feedback so far: keys the stochastic rounding then (with error
     * feedback the residual's own step does, and is checkpointed with it) */
    uint64_t step;
    gcomp_comm_stats stats;
    struct gcomp__key *next;
} gcomp__key;

/* ---- the communicator ---- */
struct gcomp_comm {
    gcomp__config cfg;
    gcomp__transport *tp;
    gcomp_codec *codec; /* the parsed chain, its residuals and scratch */
    int broken;         /* set by a timeout or transport failure: refuse further calls */
    int fault;          /* GCOMP__FAULT_*: a test hook armed for the next call */
    gcomp__key *keys;
    uint64_t nokey_step; /* the step of GCOMP_KEY_NONE calls without error feedback */
    gcomp_comm_stats stats;
    /* scratch reused across calls (grown on demand, never per call in steady state) */
    void *x;       size_t x_cap;       /* fp32 input x = send (widened, pre-scaled) */
    void *acc;     size_t acc_cap;     /* fp32 or int32 accumulator */
    void *sbuf;    size_t sbuf_cap;    /* outgoing payloads */
    void *rbuf;    size_t rbuf_cap;    /* incoming payloads */
    void *pay;     size_t pay_cap;     /* per-chunk or per-rank payloads */
    void *tmp;     size_t tmp_cap;
    void *res;     size_t res_cap;     /* fp32 result for f16/bf16 outputs */
    void *spx;     size_t spx_cap;     /* top-k: decoded sparse input of the dense fallback */
    gcomp_codec *dense_codec;          /* top-k fallback: fp32 ring */
};

/* Build a communicator around a transport (takes ownership of tp even on failure). Collective:
 * a local failure (out == NULL, bad spec or config, no memory) still joins the creation's
 * agreement, so every rank returns an error. */
gcomp_result gcomp__comm_create(gcomp__transport *tp, const gcomp_config *cfg, gcomp_comm **out);
/* A rank that failed before it could build a communicator (local holds its error and
 * gcomp_last_error() the detail) still joins the creation's agreement, so the other ranks
 * return an error instead of waiting; destroys tp and returns local. */
gcomp_result gcomp__comm_join_failed(gcomp__transport *tp, gcomp_result local);

double gcomp__now(void);

/* ---- codec-object internals the schedules use (codec.c) ---- */
const gcomp__chain *gcomp__codec_chain(const gcomp_codec *c);
/* Encode x (with explicit ctx; residual slices given by the caller) through the whole chain. */
gcomp_result gcomp__codec_encode_ctx(gcomp_codec *c, gcomp_encode_ctx *ctx, const float *x, const float *r_in,
                                     float *r_out, size_t count, void *dst, size_t cap, size_t *written);
/* Run only the byte stages (zstd) over raw bytes, and back; a plain copy without stages. */
size_t gcomp__codec_stages_bound(const gcomp_codec *c, size_t bytes);
gcomp_result gcomp__codec_stages_encode(gcomp_codec *c, const void *in, size_t n, size_t count, void *out, size_t cap,
                                        size_t *written);
gcomp_result gcomp__codec_stages_decode(gcomp_codec *c, const void *in, size_t n, size_t count, void *out, size_t cap,
                                        size_t *written);
gcomp__residual_store *gcomp__codec_residuals(gcomp_codec *c);
/* The element codec's body inside a payload, after the byte stages are undone (the pointer
 * is valid until the next call on this codec object). */
gcomp_result gcomp__codec_element_body(gcomp_codec *c, const void *payload, size_t bytes, size_t count,
                                       const uint8_t **body, size_t *body_bytes, uint32_t *flags);

/* ---- schedules ---- */
typedef struct gcomp__call {
    gcomp_comm *comm;
    const float *x;     /* fp32 input (pre-scaled for AVG on the dense ring) */
    float *result;      /* fp32 output, count elements */
    size_t count;
    float *r_in, *r_out; /* residual of the key, NULL without error feedback */
    uint64_t step;
    double deadline;
    gcomp_comm_stats *st; /* this call's numbers, added to key and comm stats */
    float divisor;      /* AVG on the integer and sparse schedules: result = sum / divisor (else 1) */
    int divided;        /* the schedule applied divisor in its last pass over the result */
    int nonfinite;
    /* A local failure after the ranks agreed to run (a corrupt payload): the rank keeps
     * stepping the ring with empty messages so nobody waits for it, and the end-of-call
     * agreement returns the error on every rank. */
    gcomp_result error;
} gcomp__call;

/* Each schedule: prepare reserves every buffer the run needs (before the ranks agree, so an
 * allocation failure becomes an error on every rank); run allocates nothing. Transport
 * failures return at once; local failures go to call->error. */
gcomp_result gcomp__sched_dense_prepare(gcomp__call *call, gcomp_codec *codec);
gcomp_result gcomp__sched_dense(gcomp__call *call, gcomp_codec *codec, int use_ef);
gcomp_result gcomp__sched_integer_prepare(gcomp__call *call);
gcomp_result gcomp__sched_integer(gcomp__call *call);
gcomp_result gcomp__sched_sparse_prepare(gcomp__call *call);
gcomp_result gcomp__sched_sparse(gcomp__call *call);

/* Record a local failure of the call (the first one wins). */
#define GCOMP_STEP(call, expr)                                                                  \
    do {                                                                                        \
        if (!(call)->error) {                                                                   \
            gcomp_result step_rc_ = (expr);                                                     \
            if (step_rc_ != GCOMP_SUCCESS) (call)->error = step_rc_;                            \
        }                                                                                       \
    } while (0)

/* One ring step of any schedule: send sbytes to the right neighbour, receive at most rcap
 * bytes from the left one. Counts wire bytes and time. A call that failed locally sends
 * empty messages, which fail the receiver's checks in turn (or carry nothing, for an empty
 * chunk); either way the end-of-call agreement reports the failure on every rank. */
gcomp_result gcomp__ring_exchange(gcomp__call *call, const void *sbuf, size_t sbytes, void *rbuf, size_t rcap,
                                  size_t *rbytes);
/* The same in two halves, to compute while the bytes travel. sbuf and rbuf must stay
 * untouched until gcomp__ring_finish returns. */
gcomp_result gcomp__ring_start(gcomp__call *call, const void *sbuf, size_t sbytes, void *rbuf, size_t rcap);
gcomp_result gcomp__ring_finish(gcomp__call *call, size_t *rbytes);

/* Test hooks (tests only): make this rank's next call fail its allocation, or truncate the
 * next message it sends by one byte. */
enum { GCOMP__FAULT_NONE = 0, GCOMP__FAULT_ALLOC = 1, GCOMP__FAULT_TRUNCATE_WIRE = 2 };
void gcomp__comm_inject_fault(gcomp_comm *c, int fault);

/* Chunk c of N over count elements, boundaries at multiples of align. */
void gcomp__chunk(size_t count, int n_chunks, int c, size_t align, size_t *lo, size_t *hi);

#endif
