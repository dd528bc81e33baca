/*
 * codec_device.h — the codec object's path for buffers in device memory (codec_device.c).
 * codec.c owns the codec object and hands this path the parts it needs; the path never
 * calls back into codec.c.
 */
#ifndef GCOMP_CODEC_DEVICE_H
#define GCOMP_CODEC_DEVICE_H

#include "codec_internal.h"

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

#endif
