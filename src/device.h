/*
 * device.h — the device layer: one ops table per kind of memory (host, CUDA), chosen per
 * pointer by gcomp__device_for(). Everything the library does to memory that may live on a
 * GPU goes through these tables, so the codec object and the engine read the same for host
 * and device buffers and only cuda/device.cu calls the CUDA runtime.
 *
 * Every function with a stream only enqueues work on it (the host ops ignore the stream and
 * run at once), so a sequence of them can be captured in a CUDA graph; only wait() blocks.
 * Host-side failures (a launch that did not start, an allocation) come back as a
 * gcomp_result; what kernels find lands in device memory (gcomp_cuda_status, the tally
 * below) and is read back at a sync.
 */
#ifndef GCOMP_DEVICE_H
#define GCOMP_DEVICE_H

#include "gcomp_codec.h"
#include "internal.h"

typedef enum gcomp__device_kind {
    GCOMP__DEVICE_HOST = 0,
    GCOMP__DEVICE_CUDA = 1
} gcomp__device_kind;

/* What a codec object's device calls add up to between two syncs, in the device's memory.
 * Kernels fold each call into it (atomically: calls on different streams may overlap). */
typedef struct gcomp__device_tally {
    uint64_t encode_calls;    /* encodes (a replayed CUDA graph's too) */
    uint64_t raw_bytes;       /* their count * dtype size */
    uint64_t wire_bytes;      /* payload bytes written by encodes, headers included */
    uint64_t overflow;        /* finite inputs that became +-inf */
    uint64_t nonfinite_calls; /* encodes whose result was not finite (residual kept) */
    uint64_t decode_calls;    /* decodes that found no error */
    uint32_t error;           /* first gcomp_result != 0 of any call */
    uint32_t where;           /* GCOMP__WHERE_*: which check found it */
} gcomp__device_tally;

enum {
    GCOMP__WHERE_NONE = 0,
    GCOMP__WHERE_HEADER = 1, /* the payload header did not fit the codec, count or size */
    GCOMP__WHERE_BODY = 2,   /* the codec's decode found the body corrupt */
    GCOMP__WHERE_SIZE = 3    /* an encode wrote another body size than the host assumed */
};

typedef struct gcomp__device_ops {
    gcomp__device_kind kind;
    const char *name;

    /* ---- memory ---- */
    /* bytes of device memory (at least 256-byte aligned; bytes 0 gives a valid pointer);
     * GCOMP_ERR_NOMEM with the size in the message. Not for the hot path: callers keep it. */
    gcomp_result (*alloc)(size_t bytes, void **out);
    void (*free)(void *p); /* NULL is a no-op; waits for work using p to finish (CUDA) */
    /* Optional: bytes of zeroed memory, at once, freed with free(); errors as alloc. Only
     * as aligned as malloc (16 bytes), not 256: the host's comes from calloc, whose fresh
     * pages the kernel maps lazily, so a large residual costs nothing until first touched.
     * NULL where zeroing is stream work (CUDA): use alloc, then memset_async on the stream. */
    gcomp_result (*alloc_zeroed)(size_t bytes, void **out);
    gcomp_result (*memset_async)(void *dst, int value, size_t bytes, struct CUstream_st *stream);
    /* Either side may be host or this device's memory (direction from the pointers). A copy
     * into pageable host memory returns when done. */
    gcomp_result (*copy_async)(void *dst, const void *src, size_t bytes, struct CUstream_st *stream);

    /* ---- elementwise ---- */
    /* dst[i] = (float)src[i] of a f16/bf16 array (f32: a copy); rounding as in codecs/cast.h */
    gcomp_result (*widen)(const void *src, gcomp_dtype dtype, size_t count, float *dst, struct CUstream_st *stream);
    /* dst[i] = src[i] rounded to dtype (nearest even); f32: a copy */
    gcomp_result (*narrow)(const float *src, size_t count, gcomp_dtype dtype, void *dst, struct CUstream_st *stream);
    /* x[i] /= d, bit for bit as the division (codecs/common.h) */
    gcomp_result (*divide)(float *x, size_t count, float d, struct CUstream_st *stream);
    /* x[i] *= s, one rounding (the dense ring's AVG pre-scale); NaN bits as on x86 */
    gcomp_result (*scale)(float *x, size_t count, float s, struct CUstream_st *stream);
    /* *flag = 1 (flag in this device's memory) when x, count elements of dtype, holds a NaN
     * or an Inf; a finite x leaves *flag as it was, so one flag can collect several checks */
    gcomp_result (*flag_nonfinite)(const void *x, size_t count, gcomp_dtype dtype, uint32_t *flag,
                                   struct CUstream_st *stream);
    /* Page-locked host memory (cudaHostAlloc) that copies to and from this device can use
     * without staging (the staging transport's bounce buffers); host: plain memory. Errors
     * as alloc. Not for the hot path. */
    gcomp_result (*alloc_pinned)(size_t bytes, void **out);
    void (*free_pinned)(void *p); /* NULL is a no-op */

    /* Block until the work enqueued on stream is done; timeout_ms < 0: no limit. Work still
     * running at the deadline is GCOMP_ERR_TIMEOUT (the stream is then left running); an
     * error of the device or of a kernel is GCOMP_ERR_TRANSPORT with the runtime's message. */
    gcomp_result (*wait)(struct CUstream_st *stream, int64_t timeout_ms);
    /* *yes = 1 when stream is being captured into a CUDA graph, where a host wait (a call's
     * steps over the network) would break the capture; the host's: 0. A stream the runtime
     * cannot query is GCOMP_ERR_TRANSPORT. */
    gcomp_result (*capturing)(struct CUstream_st *stream, int *yes);

    /* ---- the codec object's steps between the codec's own kernels ---- */
    /* Write the 32-byte header at payload: dtype, wire_id and count from h, flags and
     * body_bytes from *st (what the codec's encode reported). expect_body != UINT64_MAX: a
     * body of another size is an error (GCOMP__WHERE_SIZE) in the tally -- the host already
     * told the caller that size. Folds the encode into *tally (calls, raw bytes from h's count
     * and dtype, wire bytes, overflows, non-finite), and an error its kernels set in
     * st->error as GCOMP__WHERE_NONE (a fixed-size codec's encode is not read back: the next
     * sync finds it there). */
    gcomp_result (*header_write)(uint8_t *payload, const gcomp_header *h, const gcomp_cuda_status *st,
                                 uint64_t expect_body, gcomp__device_tally *tally, struct CUstream_st *stream);
    /* Check the header of a payload of `bytes` bytes as gcomp_header_read does, plus the wire
     * id and count the caller expects: a mismatch sets st->error = GCOMP_ERR_CORRUPT (so the
     * codec's decode kernels that follow write nothing) and st->reserved = GCOMP__WHERE_HEADER
     * (the status block is the library's: codecs leave reserved alone). Reads nothing past
     * payload + bytes. */
    gcomp_result (*header_check)(const uint8_t *payload, size_t bytes, uint16_t wire_id, uint64_t count,
                                 gcomp_cuda_status *st, struct CUstream_st *stream);
    /* After an encode with a residual: flip res->cur when res->buf[1] is set (double
     * buffered) unless st->nonfinite or st->error (the encode failed: the old residual
     * stays), and advance res->step either way (as the CPU path). */
    gcomp_result (*residual_commit)(gcomp_cuda_residual *res, const gcomp_cuda_status *st, struct CUstream_st *stream);
    /* Fold a decode into the tally: its st->error (first error wins), else one more decode. */
    gcomp_result (*status_fold)(const gcomp_cuda_status *st, gcomp__device_tally *tally, struct CUstream_st *stream);
} gcomp__device_ops;

/* The host implementation (always built). */
extern const gcomp__device_ops gcomp__device_host;

/* Which ops serve ptr: the CUDA ops for memory of a CUDA device (device or managed memory),
 * the host ops otherwise (NULL, plain and pinned host memory, or a build or a machine
 * without CUDA). *device (may be NULL) receives the CUDA device, -1 for host. A pointer of
 * a CUDA device other than the calling thread's current one is GCOMP_ERR_INVALID_ARG: every
 * device op runs on the current device. */
gcomp_result gcomp__device_for(const void *ptr, const gcomp__device_ops **ops, int *device);

/* The current CUDA device, or -1 when there is none (or no CUDA in the build). */
int gcomp__device_current(void);
/* Make CUDA device `device` current on the calling thread (a call issued on one thread and
 * run on the progress thread runs where it was issued); a no-op when it already is. */
gcomp_result gcomp__device_use(int device);

#endif
