/*
 * gcomp.h — compressed gradient allreduce: the user API.
 *
 * This header needs none of CUDA, MPI or NCCL. It compiles as C11 and as C++.
 *
 * Conventions (apply to every function below unless it says otherwise):
 *  - Every function returns a gcomp_result. GCOMP_SUCCESS is 0.
 *  - On failure a human-readable detail is available from gcomp_last_error() on the
 *    calling thread until the next failing call on that thread.
 *  - Handles are opaque. Destroy functions accept NULL and do nothing.
 *  - The caller owns every buffer it passes in; the library never keeps a pointer to a
 *    caller buffer after a call returns.
 *  - Buffers: a buffer of elements (a tensor of gcomp_dtype values: encode's src, decode's
 *    dst, gcomp_allreduce's send and recv; a float accumulator: decode_add's acc) must be
 *    aligned to its element size, 4 bytes for f32 and 2 for f16/bf16, on the host and on a
 *    device alike: the library reads it through typed pointers (in C and in CUDA kernels).
 *    An encoded payload is bytes and may sit at any address. An output buffer must not
 *    overlap an input buffer of the same call, except where a function says so
 *    (gcomp_allreduce's send == recv: in place). A misaligned or overlapping buffer is
 *    GCOMP_ERR_INVALID_ARG (with count 0 nothing is read, and any address passes).
 *  - The library never prints to stdout and never calls exit/abort. With GCOMP_DEBUG=1 (or
 *    INFO) in the environment it logs failures to stderr; a communicator logs its creation
 *    and each call when its gcomp_config.debug is 1 (unset: GCOMP_DEBUG).
 */
#ifndef GCOMP_H
#define GCOMP_H

#include <stddef.h>
#include <stdint.h>

struct CUstream_st; /* cudaStream_t without including CUDA */

/* What the shared library exports: the library is built with hidden visibility, and only
 * declarations marked GCOMP_API (the public API of gcomp.h, gcomp_codec.h, gcomp_mpi.h) are
 * visible outside it; internal gcomp__ names never are. */
#if defined(__GNUC__) || defined(__clang__)
#define GCOMP_API __attribute__((visibility("default")))
#else
#define GCOMP_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define GCOMP_VERSION_MAJOR 0
#define GCOMP_VERSION_MINOR 1
#define GCOMP_VERSION_PATCH 0
#define GCOMP_VERSION (GCOMP_VERSION_MAJOR * 10000 + GCOMP_VERSION_MINOR * 100 + GCOMP_VERSION_PATCH)

/* Result codes. One X-macro generates the enum, the names and the messages. */
#define GCOMP_RESULT_LIST(X)                                                                               \
    X(GCOMP_SUCCESS, 0, "success")                                                                         \
    X(GCOMP_ERR_INVALID_ARG, 1, "invalid argument")                                                        \
    X(GCOMP_ERR_INVALID_SPEC, 2, "invalid codec spec")                                                     \
    X(GCOMP_ERR_UNSUPPORTED, 3, "unsupported dtype, op or feature")                                        \
    X(GCOMP_ERR_NOMEM, 4, "out of memory")                                                                 \
    X(GCOMP_ERR_CORRUPT, 5, "malformed or corrupted payload")                                              \
    X(GCOMP_ERR_BUFFER_TOO_SMALL, 6, "output buffer too small")                                            \
    X(GCOMP_ERR_MISMATCH, 7, "ranks disagree on the call (count, dtype, op, codec, min_bytes or version)") \
    X(GCOMP_ERR_TIMEOUT, 8, "timed out waiting for a peer")                                                \
    X(GCOMP_ERR_TRANSPORT, 9, "transport (MPI/NCCL/CUDA) error")                                           \
    X(GCOMP_ERR_COMM_INVALID, 10, "communicator unusable after an earlier failure")                        \
    X(GCOMP_ERR_EXISTS, 11, "a codec with this name or wire id is already registered")                     \
    X(GCOMP_ERR_INTERNAL, 12, "internal error (a bug in gcomp)")

typedef enum gcomp_result {
#define GCOMP_X_ENUM(name, value, msg) name = value,
    GCOMP_RESULT_LIST(GCOMP_X_ENUM)
#undef GCOMP_X_ENUM
} gcomp_result;

/* Static message for a result code ("unknown result code" for values not in the enum). */
GCOMP_API const char *gcomp_strerror(gcomp_result rc);

/* The enum name of a result code, e.g. "GCOMP_ERR_CORRUPT". */
GCOMP_API const char *gcomp_result_name(gcomp_result rc);

/* Detail of the last failure on the calling thread, the reason first, e.g.
 * "topk: ratio=2 is out of range [1e-06, 1] (spec 'topk:ratio=2')". User text in a message
 * is shortened and its control characters escaped (\xNN). Thread-local storage owned by
 * the library; valid until the next failing gcomp call on this thread. Never NULL. */
GCOMP_API const char *gcomp_last_error(void);

/* Element types of gradient buffers. Codecs compute in fp32; f16/bf16 inputs are widened. */
typedef enum gcomp_dtype {
    GCOMP_F32 = 0,
    GCOMP_F16 = 1,  /* IEEE 754 binary16 */
    GCOMP_BF16 = 2, /* bfloat16 */
    GCOMP_DTYPE_COUNT
} gcomp_dtype;

/* Size in bytes of one element, 0 for an invalid dtype. */
GCOMP_API size_t gcomp_dtype_size(gcomp_dtype dtype);

/* Key value meaning "no error feedback for this call". */
#define GCOMP_KEY_NONE UINT64_MAX

/* ------------------------------------------------------------------------------------ */
/* Codec objects: compress a tensor without any communicator.                              */
/* ------------------------------------------------------------------------------------ */

typedef struct gcomp_codec gcomp_codec;

/* Options a codec object is created with. Zero-initialise, then set what you need;
 * gcomp_codec_options_default() gives the documented defaults. */
typedef struct gcomp_codec_options {
    uint64_t seed;      /* seed of stochastic codecs (terngrad rounding). Default 0. */
    uint32_t rank;      /* this process's rank, part of the RNG key. Default 0. */
    int error_feedback; /* 1: keep per-key residuals (default); 0: ignore keys; else INVALID_ARG. */
} gcomp_codec_options;

GCOMP_API gcomp_codec_options gcomp_codec_options_default(void);

/* Create a codec chain from a spec string, e.g. "terngrad", "topk:ratio=0.01,values=fp16",
 * "fp16+zstd:level=1". Grammar: name[:key=value[,key=value]*][+name[:...]]*, at most 4
 * stages and 511 characters, no whitespace or control characters.
 * A '+' separates stages, except inside a number: a value's first character ("ratio=+0.5")
 * and the sign right after the exponent letter of a number ("clip=1e+3", "0x1p+4") belong
 * to the value. Integer parameters are parsed and bounded as 64-bit integers; numbers are
 * decimal or hex floats (strtod), subnormals included; a value that overflows a double
 * (1e400) or underflows to zero (1e-400) is out of range, as is one outside the
 * parameter's bounds; inf and nan are refused.
 * The first stage must be an element codec (none, fp16, bf16, terngrad, topk or a
 * registered one); later stages must be byte stages (zstd).
 * top-k keeps k = ceil(ratio * count) elements (at least 1, at most count) of each tensor,
 * the product taken in double precision on the double nearest the spec's ratio (ratio=0.07
 * of 100 keeps 8: that double is a little above 0.07, the product above 7), or exactly k
 * when k > 0 is given; the canonical spec's "k=0" means "k from ratio".
 * opts may be NULL (defaults). On success *out owns the object; free with
 * gcomp_codec_destroy. Errors: GCOMP_ERR_INVALID_ARG (NULL spec/out),
 * GCOMP_ERR_INVALID_SPEC (unknown codec or key, malformed or out-of-range value; the
 * message names it), GCOMP_ERR_NOMEM. */
GCOMP_API gcomp_result gcomp_codec_create(const char *spec, const gcomp_codec_options *opts, gcomp_codec **out);

/* Free the object and its residuals. Accepts NULL. Destroying an object twice or using it
 * after destroy is undefined, like free(). */
GCOMP_API void gcomp_codec_destroy(gcomp_codec *codec);

/* The canonical spec of the chain with every parameter spelled out, e.g.
 * "topk:ratio=0.01,k=0,values=fp32". Owned by the codec object. */
GCOMP_API const char *gcomp_codec_spec(const gcomp_codec *codec);

/* Elements whose values an encode of count elements carries: top-k's k (see
 * gcomp_codec_create; e.g. 10 for "topk:ratio=0.01" and count 1000), count for none, fp16,
 * bf16 and terngrad (every element), and for user codecs that are not GCOMP_CAP_SPARSE.
 * 0 for count 0, and 0 with gcomp_last_error() set for a NULL codec, a user sparse codec
 * (whose k the library cannot know) or count > GCOMP_MAX_COUNT. */
GCOMP_API size_t gcomp_codec_kept(const gcomp_codec *codec, size_t count);

/* Largest count the codec API accepts (encode refuses more with GCOMP_ERR_INVALID_ARG):
 * no buffer of this many elements fits in memory anyway, and below it no codec's bound
 * arithmetic can wrap. */
#define GCOMP_MAX_COUNT (SIZE_MAX / 64)

/* Upper bound on the encoded size (header included) of count elements. Like
 * ZSTD_compressBound: size the output buffer of gcomp_codec_encode with it.
 * Returns 0, with gcomp_last_error() set, if codec is NULL or the bound does not fit in a
 * size_t (count > GCOMP_MAX_COUNT, or a user codec's bound that large). */
GCOMP_API size_t gcomp_codec_max_encoded_bytes(const gcomp_codec *codec, size_t count);

/* Encode count elements of src (dtype, element-aligned) into dst (capacity dst_cap bytes,
 * any alignment, overlapping no byte of src). *written receives
 * the payload size. With error feedback on and key != GCOMP_KEY_NONE, the residual of the
 * key is added before encoding and replaced by what the codec dropped (the residual is
 * created zero at the first call of a key and reset when the key's count changes). Each call
 * with a key advances that key's step, which keys the stochastic rounding (calls without
 * one advance the codec object's own step); a call that fails leaves the residual and the
 * step as they were (a failed first call of a key leaves no key).
 * If src (or src plus the key's residual) holds or overflows to NaN/Inf, or an fp16/bf16 cast
 * overflows a finite value to +-Inf, the payload decodes to a non-finite result and the
 * residual is left untouched (stats: nonfinite_calls); the key's step still advances (the
 * call did not fail), so TernGrad's later rounding differs from a run without that call.
 * count may be 0.
 * A dst_cap of gcomp_codec_max_encoded_bytes() always suffices (and is required with
 * error feedback on for codecs that update the residual in place, terngrad); a smaller
 * dst is encoded into scratch first. A failing call writes nothing to dst.
 * Errors: GCOMP_ERR_INVALID_ARG (NULL pointers with count > 0, bad dtype,
 * count > GCOMP_MAX_COUNT, src misaligned, dst overlapping src), GCOMP_ERR_BUFFER_TOO_SMALL,
 * GCOMP_ERR_NOMEM.
 * Not thread-safe on the same codec object. */
GCOMP_API gcomp_result gcomp_codec_encode(gcomp_codec *codec, uint64_t key, const void *src, size_t count,
                                          gcomp_dtype dtype, void *dst, size_t dst_cap, size_t *written);

/* Decode a payload made by a codec of the same spec and ADD it to acc[0..count) in fp32.
 * The payload is untrusted: every length, index and declared size is checked. acc is
 * 4-byte aligned and overlaps no byte of payload[0..bytes); the payload may sit at any
 * address. Errors: GCOMP_ERR_INVALID_ARG (NULL pointers, acc misaligned or overlapping the
 * payload), GCOMP_ERR_CORRUPT (malformed payload, other codec, or a count other than the
 * caller's). On error acc may be partly updated. */
GCOMP_API gcomp_result gcomp_codec_decode_add(gcomp_codec *codec, const void *payload, size_t bytes, float *acc,
                                              size_t count);

/* Decode a payload into dst (count elements of dtype, element-aligned, overlapping no byte
 * of the payload), overwriting it. Same checks as gcomp_codec_decode_add; for f16/bf16 dst
 * the fp32 result is rounded to nearest even. Uses a scratch buffer owned by the codec
 * object when dtype is not f32. */
GCOMP_API gcomp_result gcomp_codec_decode(gcomp_codec *codec, const void *payload, size_t bytes, void *dst,
                                          size_t count, gcomp_dtype dtype);

/* ---- device buffers (CUDA builds) ----
 * Every gcomp_codec_* data function above accepts CUDA device memory, detected per pointer;
 * all buffers of a call must then be memory of the calling thread's current device (a host
 * buffer next to a device one, or another device's pointer, is GCOMP_ERR_INVALID_ARG). The
 * plain functions run on the legacy default stream and return when done, with any error the
 * device found. A key's residual lives in device memory once the key is used with device
 * buffers (created zero at its first call, reset when its count changes; a residual set from
 * the host before moves there); gcomp_codec_residual_get/set copy across: dst/src may be host
 * or device memory. Byte stages (+zstd) run on host buffers only: GCOMP_ERR_UNSUPPORTED.
 * A codec object works on one device: the current one at its first device call.
 *
 * The _async variants enqueue the same work on `stream` (cudaStream_t; NULL: the legacy
 * default stream) and return without waiting: the caller keeps the buffers alive and
 * unchanged until the work is done, and calls gcomp_codec_sync before it reads the stats or
 * relies on the absence of device-side errors. *written is known at once for the fixed-size
 * codecs (none, fp16, bf16, terngrad): their async calls never synchronise the host, so they
 * can be captured in a CUDA graph and replayed (each replay advances the residual's step and
 * buffers on the device, as a call would; a call without a residual -- error feedback off,
 * GCOMP_KEY_NONE -- takes its step on the host at capture, so every replay of a TernGrad
 * encode rounds as the captured call did). top-k's size depends on the data: its encode
 * waits for the stream once to read it back. A call's first use of a key, size or dtype
 * allocates device memory (not allowed during capture): capture after one warm-up call.
 * Calls on one codec object must be ordered (one stream, or streams the caller orders).
 * Host buffers given to an _async function are processed at once, as by the plain function.
 * Errors found before launching are returned at once (as by the plain functions, plus
 * GCOMP_ERR_TRANSPORT for a CUDA runtime error); errors found by kernels (a corrupt
 * payload: acc is then left untouched) are returned by the next gcomp_codec_sync. */
GCOMP_API gcomp_result gcomp_codec_encode_async(gcomp_codec *codec, uint64_t key, const void *src, size_t count,
                                                gcomp_dtype dtype, void *dst, size_t dst_cap, size_t *written,
                                                struct CUstream_st *stream);
GCOMP_API gcomp_result gcomp_codec_decode_add_async(gcomp_codec *codec, const void *payload, size_t bytes, float *acc,
                                                    size_t count, struct CUstream_st *stream);
GCOMP_API gcomp_result gcomp_codec_decode_async(gcomp_codec *codec, const void *payload, size_t bytes, void *dst,
                                                size_t count, gcomp_dtype dtype, struct CUstream_st *stream);

/* Wait for stream, then return the first device-side error of this object's async calls since
 * the last sync (GCOMP_ERR_CORRUPT for a bad payload; GCOMP_SUCCESS if none) and fold their
 * counts (wire bytes, overflows, non-finite calls, decodes) into the stats. Blocks the host.
 * A codec object never used with device buffers returns GCOMP_SUCCESS at once. */
GCOMP_API gcomp_result gcomp_codec_sync(gcomp_codec *codec, struct CUstream_st *stream);

/* Residuals (error feedback). Copy a key's residual out (count must equal the key's
 * count; GCOMP_ERR_INVALID_ARG if the key has none), set it (creates or resizes the key; for
 * restoring checkpoints; count at most GCOMP_MAX_COUNT, as for encode; a NaN or Inf in a host
 * src is refused, GCOMP_ERR_INVALID_ARG, and the
 * key keeps its residual; so is GCOMP_KEY_NONE, which holds none), or drop it. An object
 * created with error_feedback 0 keeps no residuals: get and set are GCOMP_ERR_INVALID_ARG
 * there ("error feedback off"), and reset has nothing to drop. The residual is not the key's
 * whole state: its step count, which keys TernGrad's stochastic rounding, is not copied, so a
 * TernGrad codec object restored this way rounds differently from the one saved (fp16, bf16,
 * top-k and none resume bit for bit). A communicator's checkpoints
 * (gcomp_comm_residuals_save) carry the steps. */
GCOMP_API gcomp_result gcomp_codec_residual_get(const gcomp_codec *codec, uint64_t key, float *dst, size_t count);
GCOMP_API gcomp_result gcomp_codec_residual_set(gcomp_codec *codec, uint64_t key, const float *src, size_t count);
GCOMP_API gcomp_result gcomp_codec_residual_reset(gcomp_codec *codec, uint64_t key);

/* Counters since creation (or the last gcomp_codec_stats_reset). */
typedef struct gcomp_stats {
    uint64_t encode_calls;
    uint64_t decode_calls;
    uint64_t raw_bytes;       /* bytes of the input tensors encoded (count * dtype size) */
    uint64_t wire_bytes;      /* bytes of the payloads produced, headers included */
    uint64_t overflow_count;  /* finite inputs that became +-inf in fp16/bf16 */
    uint64_t nonfinite_calls; /* encodes whose input held NaN/Inf, or whose payload did (an fp16/bf16
                               * overflow of a finite input); the residual is left untouched */
} gcomp_stats;

/* Every object's counters are read with <object>_stats_get and zeroed with <object>_stats_reset
 * (gcomp_codec_*, gcomp_comm_*, and gcomp_comm_key_stats_get for one key). */
GCOMP_API gcomp_result gcomp_codec_stats_get(const gcomp_codec *codec, gcomp_stats *out);
GCOMP_API gcomp_result gcomp_codec_stats_reset(gcomp_codec *codec);

/* ------------------------------------------------------------------------------------ */
/* Communicators and the compressed allreduce.                                            */
/* ------------------------------------------------------------------------------------ */

typedef struct gcomp_comm gcomp_comm;

typedef enum gcomp_op {
    GCOMP_SUM = 0,
    GCOMP_AVG = 1, /* SUM divided by the number of ranks */
    GCOMP_OP_COUNT
} gcomp_op;

/* Which schedule a call ran (stats). */
typedef enum gcomp_schedule {
    GCOMP_SCHED_NONE = 0,            /* no call yet */
    GCOMP_SCHED_BYPASS = 1,          /* plain allreduce: below min_bytes, or not compressible */
    GCOMP_SCHED_DENSE = 2,           /* ring: decode, add in fp32, re-encode at each hop */
    GCOMP_SCHED_INTEGER = 3,         /* terngrad: exact integer sums of codes under a shared scale */
    GCOMP_SCHED_SPARSE = 4,          /* top-k: ring allgather of payloads, summed in rank order */
    GCOMP_SCHED_SPARSE_AS_DENSE = 5, /* top-k whose gather would cost more than a dense ring */
    GCOMP_SCHED_DOUBLING = 6         /* dense calls at 2 ranks (up to 2 GiB of payload), small
                                      * ones at a power-of-two N >= 4: recursive doubling,
                                      * log2 N exchanges of the whole payload */
} gcomp_schedule;

GCOMP_API const char *gcomp_schedule_name(gcomp_schedule s);

/* Configuration of a communicator. Start from gcomp_config_default() (everything unset);
 * an unset field is filled from the environment variable named beside it, read once at
 * communicator creation, else the default. */
typedef struct gcomp_config {
    const char *codec;  /* GCOMP_CODEC; default "terngrad". Copied at creation. NULL is
                            * unset; an empty string "" is not: it is GCOMP_ERR_INVALID_SPEC,
                            * as in gcomp_codec_create. An empty GCOMP_CODEC variable counts
                            * as unset (like every GCOMP_* variable). */
    int64_t min_bytes;  /* GCOMP_MIN_BYTES; default 65536: smaller tensors bypass */
    int error_feedback; /* GCOMP_EF (0/1); default 1 */
    int64_t seed;       /* GCOMP_SEED; default 0 */
    int64_t timeout_ms; /* GCOMP_TIMEOUT_MS; default 300000; a stuck peer (or one that
                            * never joins the creation) -> TIMEOUT */
    int debug;          /* GCOMP_DEBUG: 0 or NONE, 1 or INFO (any case); default 0.
                            * 1: this communicator logs its creation and each call to stderr */
} gcomp_config;

#define GCOMP_UNSET (-1)

/* All fields unset (codec NULL, numbers GCOMP_UNSET). */
GCOMP_API gcomp_config gcomp_config_default(void);

/* Statistics of a communicator (all keys) or of one key. Times are this rank's, in seconds.
 * A call of count 0 counts in the communicator's calls (with its agreement's bytes and time),
 * not in a key's: its key holds nothing. A call that fails (refused by the agreement, timed
 * out, a corrupt payload) counts nowhere, though it may have sent messages. */
typedef struct gcomp_comm_stats {
    uint64_t calls;
    uint64_t compressed_calls; /* calls that ran a compressed schedule */
    uint64_t raw_bytes;        /* count * dtype size, summed over calls */
    uint64_t wire_bytes;       /* bytes this rank sent, headers included; compressed calls on
                                 * host buffers include each ring message's 16-byte outcome
                                 * trailer (2(N-1) messages per call on the rings, N on the
                                 * sparse gather). On host transports (MPI) the call's
                                 * agreement counts too: a 144-byte block in each of the first
                                 * N-1 ring messages, or N-1 messages of 160 bytes of its own
                                 * (log2 N at 4, 8, ... ranks, but for sparse codecs such as
                                 * top-k) for a bypassed call, a call of count 0 or device
                                 * buffers (so a bypassed call sends that much more than
                                 * baseline_bytes; a call of count 0 then sends as many
                                 * 16-byte trailers to settle its outcome); allreduce
                                 * agreements (TernGrad, NCCL) are not counted, except
                                 * TernGrad's shared scales (8 bytes a scale) */
    uint64_t baseline_bytes;   /* bytes an uncompressed ring would have sent: 2(N-1)/N * raw */
    uint64_t overflow_count;   /* fp16/bf16 overflows to inf in this rank's own encodes (a
                                 * partial sum re-encoded at another rank counts there) */
    uint64_t nonfinite_calls;  /* calls whose result held NaN/Inf, or whose input did on any
                                 * rank; counted on every rank, bypassed calls included; the
                                 * residual is kept on every rank */
    double encode_s, comm_s, decode_s;
    double agree_s; /* the call's agreement when it is not carried by the call's ring
                                 * (which counts it in comm_s): the allreduces of TernGrad
                                 * (with its shared scales on host fp32 buffers) and of NCCL
                                 * communicators, the pass of N-1 messages of a bypassed call
                                 * or of device buffers on MPI, and the outcome agreement of
                                 * device buffers; this is also where a rank waits for ranks
                                 * that arrive late */
    gcomp_schedule last_schedule;
} gcomp_comm_stats;

/* Collective over the communicator: every rank calls it with the same arguments, but for key,
 * which is each rank's own (as error_feedback, seed and timeout_ms of the configuration are):
 * ranks that differ in it get identical results, each feeding back its own residual.
 * Reduce count elements of send (dtype) over all ranks with op and write the result to recv
 * (send == recv is in place; send and recv that partly overlap are invalid, and both are
 * aligned to the dtype's element size: see "Buffers" at the top). key names the tensor for
 * error feedback (e.g. a layer index); calls with the same key must have the same count, or
 * the residual is reset.
 * Buffers may be host memory or CUDA device memory (CUDA builds; detected per pointer): send
 * and recv must both be host memory, or both memory of the calling thread's current device
 * (else GCOMP_ERR_INVALID_ARG). Host buffers take stream NULL (a stream with host buffers is
 * GCOMP_ERR_INVALID_ARG). Device buffers run the same schedules on the device, with the key's
 * residual and the scratch in device memory, over the communicator's transport of device
 * memory: NCCL (gcomp_nccl.h), or MPI through page-locked host bounce buffers (the MPI
 * communicator stages them itself; Open MPI needs no CUDA support). Stream semantics: every
 * piece of device work of the call is enqueued on `stream` (cudaStream_t; NULL: the legacy
 * default stream), so it starts after the work the caller enqueued there before the call --
 * that is what orders the call after the kernels that wrote send. The call returns when all
 * of its own device work is done: it waits for `stream` (polling, within timeout_ms) at
 * least once, at its end, after which recv holds the result, send may be reused and the
 * key's residual is committed; over MPI it also waits for the stream before each message
 * leaves the device. Work on other streams is neither waited for nor ordered: synchronise
 * those with `stream` first. Calls of a key must be ordered with each other (they are: the
 * communicator runs its calls one at a time). A codec without CUDA kernels for its schedule
 * (a byte stage such as +zstd, a user codec without them) runs on host copies of the device
 * buffers over MPI (copied after the stream's earlier work, the result copied back before the
 * call returns; the key's residual then lives in host memory), and is GCOMP_ERR_UNSUPPORTED
 * over NCCL. The first call of a key, size or dtype allocates device memory (workspace,
 * residual, and over MPI the bounce buffers); later ones allocate nothing. A communicator
 * works on one device: its first call with device buffers (or its NCCL communicator) fixes
 * it, and buffers of another device are GCOMP_ERR_INVALID_ARG. A stream being captured into a
 * CUDA graph is GCOMP_ERR_UNSUPPORTED (the call waits on the host between its steps), before
 * anything is enqueued, on every rank. The calling thread's current device is the same when
 * the call returns.
 * Error feedback covers each rank's own encode of its input; the calls of a codec whose
 * encode drops nothing ("none": GCOMP_CAP_EXACT in gcomp_codec.h) neither make nor read a
 * residual (its checkpoints name no keys; a loaded one is checked and its records dropped).
 * On the dense ring (GCOMP_SCHED_DENSE: fp16, bf16) the partial sums are decoded, added in fp32 and
 * re-encoded at every hop; the rounding of those re-encodes is not fed back to any
 * residual. Recursive doubling (GCOMP_SCHED_DOUBLING) does the same at each of its log2 N
 * exchanges, except the last, whose fp32 sum is the result: at 2 ranks (one exchange) no sum
 * is re-encoded, so an fp16 sum past 65504 of two finite inputs stays finite there (in f32
 * or bf16 buffers; narrowed to f16 buffers it is +-inf, counted as non-finite). At more
 * ranks a partial sum past 65504 becomes +-inf when re-encoded to fp16 (a non-finite call on
 * every rank): the fp16 bounds below hold while every partial sum stays within fp16's range,
 * under GCOMP_AVG too, whose inputs are each scaled by 1/N and rounded to fp16 before the sum,
 * so an average within one rounding of 65504 can still sum past it (65504 on every rank: +inf
 * at 3 and 5 ranks, where each scaled input rounds up),
 * which bf16 (and fp32 for none) make no concern. The
 * bound's absolute terms (2^-24, 2^-133) are the spacing of fp16's and bf16's subnormals. (top-k's dense fallback, GCOMP_SCHED_SPARSE_AS_DENSE, sums in fp32 and
 * re-encodes nothing.)
 * Accuracy of a call whose key holds a zero residual (its first; later calls also return what
 * earlier ones dropped), per element, with S = sum over ranks of |x_r| of that element and
 * M = the largest |x| of any element on any rank: |result - exact sum| <= 1e-5 S (none),
 * (N+1) (1e-3 S + 2^-24) (fp16), (N+1) (8e-3 S + 2^-133) (bf16), 1.00001 (N M + S) (terngrad),
 * 1.00001 S + N 2^-24 (top-k: values=fp16 may store a kept value as a subnormal); a byte stage
 * (+zstd) adds nothing. GCOMP_AVG: the exact average and the bound are both divided by N; the
 * dense ring, recursive doubling and the bypass scale each input by 1/N before the sum (as
 * ncclAvg does; a subnormal input then loses bits: add N 2^-150 to their bound), while the
 * integer ring (terngrad), the sparse gather and its dense fallback (top-k) divide the sum,
 * so where the fp32 sum of N finite inputs overflows their AVG is +-inf there (a non-finite
 * call) although the exact average is finite. A
 * GCOMP_F16 or GCOMP_BF16 result adds its own rounding: u (S' + B) + 2^-25 (f16) or u (S' + B) +
 * 2^-134 (bf16), u = 2^-11 (f16) or 2^-8 (bf16), B the bound above, S' = S (SUM) or S / N (AVG).
 * bench/allreduce_perf -c 1 checks every element of host buffers against these (ctest
 * allreduce_bounds_np3 and _np5: every codec, SUM and AVG, f32, f16 and bf16; device buffers
 * are not checked by them).
 * Every rank gets a bitwise-identical result. Blocking; returns when recv holds the result.
 * Errors (on every rank): GCOMP_ERR_UNSUPPORTED (a stream under CUDA graph capture; a codec
 * without CUDA kernels over NCCL), GCOMP_ERR_INVALID_ARG (NULL buffer with count > 0, bad dtype/op,
 * a misaligned buffer, send and recv partly overlapping, count > 2^40 elements; on any rank;
 * a call of an MPI communicator kept past MPI_Finalize, where MPI itself would abort), GCOMP_ERR_MISMATCH
 * (ranks disagree on count, dtype, op, codec, min_bytes, host or device buffers, or library
 * version; the message
 * names which), GCOMP_ERR_TIMEOUT (a peer did not answer within timeout_ms; the communicator is
 * then unusable), GCOMP_ERR_COMM_INVALID (after an earlier timeout or transport error),
 * GCOMP_ERR_TRANSPORT, GCOMP_ERR_CORRUPT (a payload failed its checks), GCOMP_ERR_NOMEM.
 * A call that fails on every rank (refused or mismatched) leaves the key's residual and
 * rounding step as they were, so the calls after it give the bits of a run without it.
 * Not thread-safe on the same communicator. */
GCOMP_API gcomp_result gcomp_allreduce(gcomp_comm *comm, const void *send, void *recv, size_t count, gcomp_dtype dtype,
                                       gcomp_op op, uint64_t key, struct CUstream_st *stream);

/* A nonblocking allreduce in flight (gcomp_iallreduce); freed by the gcomp_wait or
 * gcomp_test that completes it, which sets the caller's pointer to NULL (as MPI_Wait does). */
typedef struct gcomp_request gcomp_request;

/* Nonblocking gcomp_allreduce: the same arguments, guarantees and errors, reported by the
 * gcomp_wait (or gcomp_test) that completes *req, on every rank. Collective: every rank
 * issues the same calls in the same order. Calls on one communicator run one after another
 * in the order issued (gcomp_allreduce included: it is iallreduce + wait); several may be in
 * flight. send and recv stay the caller's and must not be touched (recv read, send written)
 * until the request completes. Device buffers: the call may run on the progress thread,
 * which makes the issuing thread's current device its own for the call; the stream
 * semantics of gcomp_allreduce hold when the request completes (gcomp_wait/gcomp_test
 * return after the call's device work is done), and the work the caller enqueues on
 * `stream` after gcomp_iallreduce returns may run before the call's own, so order what
 * reads recv after gcomp_wait. cudaStreamPerThread is not supported here (on the progress
 * thread that handle names the progress thread's own stream): pass a created stream, or the
 * legacy default stream (NULL). Each call's timeout_ms starts when it starts to run; a
 * timeout or transport error of one marks the communicator unusable, so the calls queued
 * behind it complete with GCOMP_ERR_COMM_INVALID.
 * Progress: at the first call the communicator starts a progress thread (joined by
 * gcomp_comm_destroy) that runs the queued calls while the caller computes. Over MPI that
 * thread needs MPI_THREAD_MULTIPLE (MPI_Init_thread): with a lower level (MPI_Query_thread,
 * checked at creation and at the first call) no thread is started and the calls run inside
 * gcomp_test and gcomp_wait on the caller's thread instead, without overlap (GCOMP_DEBUG=1
 * logs which). A wait then runs whole calls of its own communicator only, so with requests
 * on several communicators every rank must complete them in the same order (as blocking
 * calls): a rank waiting on A while the others wait on B stalls until B's timeout_ms, which
 * then breaks B. With a progress thread each communicator advances on its own, in any order
 * of waits. Also over MPI, the progress thread sets MPI_COMM_WORLD's error handler to
 * MPI_ERRORS_RETURN while it waits (see gcomp_allreduce over MPI).
 * Returns at once: GCOMP_ERR_INVALID_ARG (comm or req NULL; *req is then NULL),
 * GCOMP_ERR_NOMEM. Not thread-safe on the same communicator: issue, test and wait its
 * calls from one thread at a time. Complete every request before gcomp_comm_destroy
 * (destroy lets the calls in flight finish; a request never completed is leaked). */
GCOMP_API gcomp_result gcomp_iallreduce(gcomp_comm *comm, const void *send, void *recv, size_t count, gcomp_dtype dtype,
                                        gcomp_op op, uint64_t key, struct CUstream_st *stream, gcomp_request **req);
/* *done = 1 and the call's result if *req has completed (then *req is freed and set to
 * NULL), else *done = 0 and GCOMP_SUCCESS. Does not block with a progress thread; without
 * one it runs the queued calls up to *req and returns when they are done.
 * GCOMP_ERR_INVALID_ARG if req, *req or done is NULL. */
GCOMP_API gcomp_result gcomp_test(gcomp_request **req, int *done);
/* Blocks until *req completes (each call ends by its own timeout_ms), frees it, sets *req
 * to NULL and returns the call's result (gcomp_last_error() holds its detail on this
 * thread). GCOMP_ERR_INVALID_ARG if req or *req is NULL. */
GCOMP_API gcomp_result gcomp_wait(gcomp_request **req);

/* Free the communicator and its residuals; does not touch the user's MPI/NCCL communicator.
 * Not collective. Accepts NULL. Destroying a communicator twice or using it after destroy
 * is undefined, like free(); so is destroying it while another thread is in a call on it
 * (gcomp_wait or gcomp_allreduce there may be running a call itself, which destroy does not
 * wait for). After a timeout, the MPI duplicate communicator and the buffers
 * its pending requests use are left to MPI_Finalize (freeing them under a pending collective
 * crashes Open MPI when the late peer arrives); MPI_Barrier and MPI_Finalize stay safe. */
GCOMP_API void gcomp_comm_destroy(gcomp_comm *comm);

/* Stats are written by the thread that runs each call: read or reset them when no
 * gcomp_iallreduce of this communicator is in flight and no other thread is in a call on it
 * (else GCOMP_ERR_INVALID_ARG, as the residual checkpoint calls, and nothing is read or reset).
 * A checkpoint call on another thread counts as a call; stats calls do not: readers on several
 * threads never refuse each other, nor make a checkpoint call refuse. */
GCOMP_API gcomp_result gcomp_comm_stats_get(const gcomp_comm *comm, gcomp_comm_stats *out);
/* Stats of one key; GCOMP_ERR_INVALID_ARG if the key was never used (no call on it succeeded:
 * a refused or failed first call leaves no key behind, in the stats or in a checkpoint).
 * GCOMP_KEY_NONE has stats too, those of the calls made without a key, once one succeeded. */
GCOMP_API gcomp_result gcomp_comm_key_stats_get(const gcomp_comm *comm, uint64_t key, gcomp_comm_stats *out);
GCOMP_API gcomp_result gcomp_comm_stats_reset(gcomp_comm *comm);

/* Rank and size of the communicator. */
GCOMP_API int gcomp_comm_rank(const gcomp_comm *comm);
GCOMP_API int gcomp_comm_size(const gcomp_comm *comm);
/* The canonical codec spec the communicator uses. */
GCOMP_API const char *gcomp_comm_codec(const gcomp_comm *comm);

/* The communicator's resolved configuration: every field set (from the struct it was created
 * with, the environment, then defaults); out->codec points at the canonical spec, owned by
 * the communicator. Errors: GCOMP_ERR_INVALID_ARG (NULL argument). */
GCOMP_API gcomp_result gcomp_comm_config_get(const gcomp_comm *comm, gcomp_config *out);

/* Residual checkpoints: this rank's error-feedback state (every key's residual and step, and
 * the step of the calls made with GCOMP_KEY_NONE, which keys their TernGrad rounding) as a
 * versioned little-endian blob, to store with the trainer's checkpoint (format version 2 where
 * it holds that step, else 1; a load reads both). Not collective: each
 * rank saves and loads its own. Save with buf NULL sets *written to the size needed; else
 * buf must hold cap >= that many bytes (GCOMP_ERR_BUFFER_TOO_SMALL). Load replaces the whole
 * state (keys the blob does not name start from zero) and is all or nothing: it refuses a blob
 * saved with another codec spec, by another rank or communicator size, or with a key whose
 * count differs from the one this communicator already uses (GCOMP_ERR_MISMATCH), a damaged
 * or truncated blob (GCOMP_ERR_CORRUPT, checksummed; also a residual holding a NaN or Inf,
 * which no call commits, a record of 0 elements, which no save makes, and format version 0,
 * which none writes), a newer format version
 * (GCOMP_ERR_UNSUPPORTED, read before the checksum, whose place a newer format may move: so
 * a damaged version field reads as one too; also flags it does not know), or memory for the new state
 * (GCOMP_ERR_NOMEM: the new state is built whole before it replaces the old one). Save and
 * load both refuse a communicator with error feedback off (GCOMP_ERR_INVALID_ARG): it has no
 * residuals. The _file variants write (through a temporary file renamed over path) and read a
 * regular file, to its end whatever size it states; I/O failures (a directory too) are
 * GCOMP_ERR_INVALID_ARG naming the path.
 * All four run only when no gcomp_iallreduce of this communicator is in flight: while one is
 * issued and not yet completed by gcomp_wait/gcomp_test (queued, running on the progress
 * thread, or already done but not waited for) they return GCOMP_ERR_INVALID_ARG and change
 * nothing. The refusal depends only on the calls this rank issued and completed, so ranks
 * that run the same program refuse alike; it is local (no rank waits for another), and a
 * program whose ranks differ there gets different states on different ranks, as with any
 * load that one rank makes and another does not. The blob does not record the seed: a TernGrad
 * resume continues bit for bit only with the seed it was saved under (GCOMP_SEED, cfg.seed).
 * Not thread-safe with calls on the same communicator. */
GCOMP_API gcomp_result gcomp_comm_residuals_save(gcomp_comm *comm, void *buf, size_t cap, size_t *written);
GCOMP_API gcomp_result gcomp_comm_residuals_load(gcomp_comm *comm, const void *buf, size_t bytes);
GCOMP_API gcomp_result gcomp_comm_residuals_save_file(gcomp_comm *comm, const char *path);
GCOMP_API gcomp_result gcomp_comm_residuals_load_file(gcomp_comm *comm, const char *path);

/* ------------------------------------------------------------------------------------ */
/* Half-precision helpers (round to nearest even; NaN stays NaN).                          */
/* ------------------------------------------------------------------------------------ */
GCOMP_API uint16_t gcomp_f32_to_f16(float f);
GCOMP_API float gcomp_f16_to_f32(uint16_t h);
GCOMP_API uint16_t gcomp_f32_to_bf16(float f);
GCOMP_API float gcomp_bf16_to_f32(uint16_t h);

/* Names of the registered codecs, one per call: idx from 0 until NULL is returned. */
GCOMP_API const char *gcomp_codec_name_at(size_t idx);

#ifdef __cplusplus
}
#endif
#endif /* GCOMP_H */
