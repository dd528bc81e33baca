/*
 * codec_device.h — the codec object's path for buffers in device memory (codec_device.c).
 * codec.c owns the codec object and hands this path the parts it needs; the path never
 * calls back into codec.c.
 */
#ifndef GCOMP_CODEC_DEVICE_H
#define GCOMP_CODEC_DEVICE_H

#include "codec_internal.h"
#include "device.h"

/* A codec object's device state: status and tally blocks, scratch, per-key residuals in
 * device memory. Created at the object's first device call, on the then current device. */
typedef struct gcomp__codec_device gcomp__codec_device;

/* What of a codec object the device path reads and updates. */
typedef struct gcomp__codec_parts {
    const gcomp__chain *chain;
    const gcomp_codec_options *opts;
    gcomp_stats *stats;
    gcomp__residual_store *host_residuals; /* a key met first on the host moves to the device */
    uint64_t *nokey_step;                  /* step counter of calls without error feedback */
    gcomp__codec_device **dev;
} gcomp__codec_parts;

/* 1 when a or b (either may be NULL) is device memory, or a pointer the device layer refuses
 * (another device's): the call takes the device path, which checks the combination. */
int gcomp__codec_device_wanted(const void *a, const void *b);

/* The public calls of gcomp.h on device buffers. blocking: run on `stream` and sync it
 * (the plain functions pass the legacy default stream, NULL). */
gcomp_result gcomp__codec_device_encode(const gcomp__codec_parts *c, uint64_t key, const void *src, size_t count,
                                        gcomp_dtype dtype, void *dst, size_t dst_cap, size_t *written,
                                        struct CUstream_st *stream, int blocking);
gcomp_result gcomp__codec_device_decode_add(const gcomp__codec_parts *c, const void *payload, size_t bytes, float *acc,
                                            size_t count, struct CUstream_st *stream, int blocking);
gcomp_result gcomp__codec_device_decode(const gcomp__codec_parts *c, const void *payload, size_t bytes, void *dst,
                                        size_t count, gcomp_dtype dtype, struct CUstream_st *stream, int blocking);
gcomp_result gcomp__codec_device_sync(const gcomp__codec_parts *c, struct CUstream_st *stream);

/* Residuals: whether the key lives on the device; get (dst host or device; a key kept on the
 * host is copied from host_residuals), set (src host or device; the key then lives on the
 * device), drop. */
int gcomp__codec_device_has_key(const gcomp__codec_device *d, uint64_t key);
gcomp_result gcomp__codec_device_residual_get(const gcomp__codec_device *d, const gcomp__residual_store *host,
                                              uint64_t key, float *dst, size_t count);
gcomp_result gcomp__codec_device_residual_set(const gcomp__codec_parts *c, uint64_t key, const float *src,
                                              size_t count);
void gcomp__codec_device_residual_drop(gcomp__codec_device *d, uint64_t key);

void gcomp__codec_device_free(gcomp__codec_device *d);

/* ---- the engine's device path (through codec.c: schedules never include this header) ----
 * Everything is enqueued on the call's stream, with the status and tally blocks and the
 * codec scratch the engine carved from its device workspace, so nothing here allocates
 * except a key's residual at its first call (or when its count changes). */

/* The key's residual for one call (ensure_dev and acquire as the public path): r_in is the
 * committed buffer, r_out the other one, step the call's. The host knows cur and step (it
 * commits), so this reads nothing back unless the public path ran the key last. A key whose
 * count changed gets a new zeroed residual that replaces the old one only at ef_end. */
gcomp_result gcomp__codec_device_ef_begin(const gcomp__codec_parts *c, const gcomp__device_ops *ops, uint64_t key,
                                          size_t count, struct CUstream_st *stream, gcomp__dev_ef *ef);
/* The end of that call: flip to r_out unless keep (the ranks agreed the call was not
 * finite, or it failed), and advance the step either way (the object's status block feeds
 * the commit kernel). A no-op once done or when ef is inactive. */
gcomp_result gcomp__codec_device_ef_end(const gcomp__codec_parts *c, gcomp__dev_ef *ef, int keep,
                                        struct CUstream_st *stream);
/* A call that failed: the residual and its step as they were (keep_step: as ef_end with keep,
 * the step advanced, where other ranks may have completed the call); a key whose count
 * changed keeps its old residual (the new one is freed once the stream is done with it). */
void gcomp__codec_device_ef_abandon(const gcomp__codec_parts *c, gcomp__dev_ef *ef, int keep_step,
                                    struct CUstream_st *stream);
/* GCOMP_ERR_UNSUPPORTED, with the reason named after api (the call), when the chain cannot
 * run on the device. */
gcomp_result gcomp__codec_device_check(const char *api, const gcomp__chain *chain);
/* Header and body of x[0..count) into dst (cap bytes) with the residual block res (device
 * memory, NULL: none), ctx as on the host; the encode is folded into *tally. *written: a
 * fixed-size codec's from the host's bound; a GCOMP_CAP_SPARSE one's is read back (one wait
 * on the stream) with the codec's status, whose error is then returned before the header is
 * written (a fixed-size codec's error reaches *tally through the header kernel instead). */
gcomp_result gcomp__codec_device_encode_block(const gcomp__chain *chain, const gcomp__device_ops *ops,
                                              const gcomp_encode_ctx *ctx, const float *x,
                                              const gcomp_cuda_residual *res, size_t count, uint8_t *dst, size_t cap,
                                              void *scratch, gcomp_cuda_status *st, gcomp__device_tally *tally,
                                              size_t *written, struct CUstream_st *stream);
/* acc[0..count) += decode(payload of `bytes` bytes): header check, the codec's decode-add,
 * the outcome folded into *tally (a corrupt payload leaves acc untouched). */
gcomp_result gcomp__codec_device_decode_block(const gcomp__chain *chain, const gcomp__device_ops *ops,
                                              const uint8_t *payload, size_t bytes, float *acc, size_t count,
                                              gcomp_cuda_status *st, gcomp__device_tally *tally,
                                              struct CUstream_st *stream);
/* The first error a tally read back holds, as a gcomp_result with its message. */
gcomp_result gcomp__codec_device_tally_error(const gcomp__chain *chain, const gcomp__device_tally *t);
/* Device allocations the object made so far (its blocks, scratch and residuals). */
uint64_t gcomp__codec_device_allocs(const gcomp__codec_device *d);

/* ---- checkpoints (checkpoint.c, through codec.c) ----
 * keys: the keys whose residual lives on the device (all of them when cap allows; returns
 * how many there are). export: a key's count and step, and its residual into dst (host
 * memory; NULL: only count and step). drop_all: forget every device residual. */
size_t gcomp__codec_device_keys(const gcomp__codec_device *d, uint64_t *keys, size_t cap);
gcomp_result gcomp__codec_device_residual_export(gcomp__codec_device *d, uint64_t key, float *dst, size_t *count,
                                                 uint64_t *step);
void gcomp__codec_device_residual_drop_all(gcomp__codec_device *d);

#endif
