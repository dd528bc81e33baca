/*
 * codec_internal.h — the codec layer's internals shared inside the library: registry, spec
 * chains, the residual store and its protocol, and what the schedules may ask of a codec
 * object (codec.c). Transports never include it. Not installed.
 */
#ifndef GCOMP_CODEC_INTERNAL_H
#define GCOMP_CODEC_INTERNAL_H

#include "gcomp_codec.h"
#include "internal.h"

/* ---- registry (registry.c) ---- */
/* Register the built-in codecs once; safe to call from every entry point. */
void gcomp__registry_init(void);
/* Remove a user codec registered with exactly this vtable (GCOMP_ERR_INVALID_ARG if none).
 * For tests and fuzzers only: no codec object may still use it. */
gcomp_result gcomp__codec_unregister(const gcomp_codec_vtable *vt);

/* ---- spec parsing (spec.c) ---- */
#define GCOMP_MAX_STAGES 4

typedef struct gcomp__stage {
    const gcomp_codec_vtable *vt;
    void *params; /* vt->params_size bytes, filled from the parameter table */
    void *state;  /* vt->state_create(params): scratch or contexts reused across calls */
} gcomp__stage;

typedef struct gcomp__chain {
    size_t n_stages; /* stage 0 is the element codec, later ones are byte stages */
    gcomp__stage stages[GCOMP_MAX_STAGES];
    char canonical[GCOMP_SPEC_MAX]; /* every parameter spelled out */
} gcomp__chain;

gcomp_result gcomp__chain_parse(const char *spec, gcomp__chain *out);
void gcomp__chain_free(gcomp__chain *chain);

/* ---- residual store (residual.c) ---- */
/* One key's error-feedback state. For most codecs two buffers: encode reads buf[cur] and
 * writes the other; commit swaps them. A failed or non-finite encode simply does not commit,
 * which leaves the residual exactly as it was without an extra pass over the data. Codecs
 * with GCOMP_CAP_RESIDUAL_IN_PLACE update buf[cur] in place and buf[1 - cur] stays NULL. */
typedef struct gcomp__residual {
    uint64_t key;
    size_t count;
    uint64_t step; /* calls so far with this key; keys the stochastic rounding */
    float *buf[2];
    int cur;
} gcomp__residual;

typedef struct gcomp__residual_store {
    gcomp__residual **slots; /* open addressing by key; NULL = empty */
    size_t cap;              /* power of two */
    size_t used;
} gcomp__residual_store;

/* Find the key's residual, creating it (zeroed) or resetting it when count changed; with
 * double_buffer, also make sure the second buffer exists. */
gcomp_result gcomp__residual_acquire(gcomp__residual_store *s, uint64_t key, size_t count, int double_buffer,
                                     gcomp__residual **out);
gcomp__residual *gcomp__residual_find(const gcomp__residual_store *s, uint64_t key);
void gcomp__residual_commit(gcomp__residual *r);
void gcomp__residual_drop(gcomp__residual_store *s, uint64_t key);
void gcomp__residual_store_free(gcomp__residual_store *s);
/* Free s's residuals and move with's into s (with is left empty): a state built whole beside
 * the store replaces it at once (checkpoint loads). */
void gcomp__residual_store_replace(gcomp__residual_store *s, gcomp__residual_store *with);

/* ---- the error-feedback protocol (residual.c), shared by the codec object and the
 * engine: begin takes the key's residual slices and the call's step; end commits the new
 * residual unless the call's result was not finite (the old one is then kept exactly). */
typedef struct gcomp__ef {
    gcomp__residual *res; /* NULL: no error feedback for this call */
    float *r_in, *r_out;  /* r_out == r_in: updated in place (GCOMP_CAP_RESIDUAL_IN_PLACE) */
    uint64_t step;        /* keys the stochastic rounding */
    /* The key's count changed: res is a new zeroed residual outside the store, which
     * replaces the key's old one only when the call ends (gcomp__ef_end); a call that fails
     * instead (gcomp__ef_abandon: ranks that disagree on the count) leaves the old one. */
    gcomp__residual_store *store;
    int fresh;
    int created; /* the key was new to the store: a call that fails drops it again */
} gcomp__ef;

gcomp_result gcomp__ef_begin(gcomp__residual_store *s, uint64_t key, size_t count, int in_place, gcomp__ef *ef);
void gcomp__ef_end(gcomp__ef *ef, int nonfinite);
/* keep_step: the step stays advanced (other ranks may have completed the call) */
void gcomp__ef_abandon(gcomp__ef *ef, int keep_step);

/* The same protocol for a key whose residual lives in device memory (codec_device.c):
 * always double-buffered; begin gives the buffers and the step, end commits on the device
 * (the flip and the step kept on the host too, so the next call reads nothing back). */
typedef struct gcomp__dev_ef {
    uint64_t key;
    int active;          /* begun and not yet ended */
    float *r_in, *r_out; /* device memory, count elements each */
    uint64_t step;
    void *fresh; /* the key's count changed: its new residual, installed at the end (as gcomp__ef) */
    int created; /* the key was new to the device (no host residual of its count moved there): a
                  * call that fails drops it again, and a host residual of another count stays */
} gcomp__dev_ef;

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
/* vt->entry args, through gcomp__codec_entry_rc (internal.h; entry may be cuda->x for the
 * CUDA ops): a value that is no gcomp_result becomes GCOMP_ERR_INTERNAL naming both, a failure
 * without a detail of the codec's own gets one. The comma operator orders the begin before the
 * entry runs (the order of a call's arguments is unspecified). */
#define GCOMP_CODEC_CALL(vt, entry, args) \
    (gcomp__codec_entry_begin(), gcomp__codec_entry_rc((vt)->name, #entry, (vt)->entry args))
/* The element codec's body inside a payload, after the byte stages are undone (the pointer
 * is valid until the next call on this codec object; without byte stages it points into the
 * payload itself, so two of them can be held at once). */
gcomp_result gcomp__codec_element_body(gcomp_codec *c, const void *payload, size_t bytes, size_t count,
                                       const uint8_t **body, size_t *body_bytes, uint32_t *flags);
/* dst = decode(first) + decode(second) on the host, first's added first: the bits of zeroing
 * dst and two gcomp_codec_decode_adds (but a NaN + NaN may keep either payload: cast.h), in
 * one pass for a cast codec without byte stages; zeros after a failure. */
gcomp_result gcomp__codec_decode_sum2(gcomp_codec *c, const void *first, size_t fbytes, const void *second,
                                      size_t sbytes, float *dst, size_t count);

/* ---- the codec object on device buffers, for the engine (codec.c -> codec_device.c) ----
 * ops: the device layer's ops of the call's buffers (device.h, an incomplete type here);
 * status/tally/scratch: device memory the engine carved from its workspace; every call only
 * enqueues on stream. See codec_device.h for each one's contract. */
struct gcomp__device_ops;
struct gcomp__device_tally;
/* GCOMP_ERR_UNSUPPORTED, named after api, when the codec cannot run on device buffers (a byte
 * stage, no CUDA ops) */
gcomp_result gcomp__codec_device_usable(const gcomp_codec *c, const char *api);
gcomp_result gcomp__codec_dev_ef_begin(gcomp_codec *c, const struct gcomp__device_ops *ops, uint64_t key, size_t count,
                                       struct CUstream_st *stream, gcomp__dev_ef *ef);
gcomp_result gcomp__codec_dev_ef_end(gcomp_codec *c, gcomp__dev_ef *ef, int keep, struct CUstream_st *stream);
void gcomp__codec_dev_ef_abandon(gcomp_codec *c, gcomp__dev_ef *ef, int keep_step, struct CUstream_st *stream);
gcomp_result gcomp__codec_dev_encode(gcomp_codec *c, const struct gcomp__device_ops *ops, const gcomp_encode_ctx *ctx,
                                     const float *x, const gcomp_cuda_residual *res, size_t count, void *dst,
                                     size_t cap, void *scratch, gcomp_cuda_status *st,
                                     struct gcomp__device_tally *tally, size_t *written, struct CUstream_st *stream);
gcomp_result gcomp__codec_dev_decode_add(gcomp_codec *c, const struct gcomp__device_ops *ops, const void *payload,
                                         size_t bytes, float *acc, size_t count, gcomp_cuda_status *st,
                                         struct gcomp__device_tally *tally, struct CUstream_st *stream);
gcomp_result gcomp__codec_dev_tally_error(const gcomp_codec *c, const struct gcomp__device_tally *t);
/* Device allocations of the object so far (0 without device state). */
uint64_t gcomp__codec_dev_allocs(const gcomp_codec *c);
/* Where a key's residual lives: 1 on the device. move_to_host: a key met on the device that
 * now comes with host buffers takes its residual (and step) into the host store. */
int gcomp__codec_dev_has_key(const gcomp_codec *c, uint64_t key);
gcomp_result gcomp__codec_dev_move_to_host(gcomp_codec *c, uint64_t key);
/* Checkpoints: the device keys, one key's residual into host memory, forget them all. */
size_t gcomp__codec_dev_keys(const gcomp_codec *c, uint64_t *keys, size_t cap);
gcomp_result gcomp__codec_dev_export(gcomp_codec *c, uint64_t key, float *dst, size_t *count, uint64_t *step);
void gcomp__codec_dev_drop_all(gcomp_codec *c);

#endif
