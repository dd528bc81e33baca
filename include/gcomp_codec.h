/*
 * gcomp_codec.h — the codec author's ABI.
 *
 * A codec is a const vtable: a name, a stable wire id, capability bits, a parameter table
 * and functions. Built-in codecs are registered by the library; users register their own
 * with gcomp_codec_register() and then name them in spec strings like any built-in.
 *
 * Two kinds of codec:
 *  - element codecs (first stage of a spec) turn fp32 values into a body of bytes and back
 *    (decode_add: decode and ACCUMULATE into fp32, which is what a ring hop needs);
 *  - byte stages (GCOMP_CAP_BYTE_STAGE; later stages, e.g. zstd) turn a whole payload into
 *    another byte string and back.
 *
 * The library writes and checks the 32-byte payload header (see GCOMP_HEADER_*); codecs only
 * see their body. Bodies are untrusted on decode: check every length and index and return
 * GCOMP_ERR_CORRUPT, never read or write out of bounds.
 */
#ifndef GCOMP_CODEC_H
#define GCOMP_CODEC_H

#include "gcomp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ABI 2 (2026-11): the vtable gained `cuda`, an optional pointer to the codec's CUDA ops
 * (gcomp_codec_cuda_ops below), which replaces the GCOMP_CAP_CUDA bit; the integer ring's
 * steps became entries of the vtable (int_align, int_sum_bytes, int_scratch_bytes,
 * int_ternarise, int_sums_add_pack, int_sums_values, required with GCOMP_CAP_INTEGER, next to
 * num_scales and local_scales), so the ring runs a codec's own functions instead of TernGrad's;
 * the sparse gather's fast path became optional entries (sparse_k, sparse_pairs,
 * sparse_sum_pairs; NULL: decode_add of every payload in rank order); encode_scaled, which
 * the library never called, is gone. A codec built for ABI 1 must be rebuilt. */
#define GCOMP_CODEC_ABI_VERSION 2

/* Wire ids: 1..127 are reserved for built-in codecs (never reused); 128..65535 are free for
 * user codecs. 0 is invalid. */
#define GCOMP_WIRE_ID_USER_MIN 128

/* Capability bits. */
enum {
    GCOMP_CAP_SUMMABLE = 1u << 0, /* dense: decode, add in fp32, re-encode at each hop */
    GCOMP_CAP_INTEGER = 1u << 1,  /* integer codes under a shared scale (integer ring) */
    GCOMP_CAP_SPARSE = 1u << 2,   /* (index, value) payloads forwarded unchanged */
    /* 1u << 3 was GCOMP_CAP_CUDA (ABI 1): a non-NULL vtable.cuda says it now */
    GCOMP_CAP_BYTE_STAGE = 1u << 4, /* lossless byte stage after an element codec */
    /* encode writes r_out only when the whole result is finite (it knows before writing),
     * so the library may pass r_out == r_in and skip the second residual buffer */
    GCOMP_CAP_RESIDUAL_IN_PLACE = 1u << 5,
    /* encode is exact (decode gives back every value encoded, bit for bit): it never drops
     * anything, so a communicator keeps no residual for its keys (it would stay zero) and
     * skips reading and writing one on every call; ctx->step then counts the key's calls
     * but is not part of a residual checkpoint */
    GCOMP_CAP_EXACT = 1u << 6
};

/* ---- parameters: one table per codec, parsed by the library for every codec ---------- */
typedef enum gcomp_param_type {
    GCOMP_PARAM_INT,    /* stored as int64_t */
    GCOMP_PARAM_DOUBLE, /* stored as double */
    GCOMP_PARAM_ENUM    /* stored as int: index into choices */
} gcomp_param_type;

/* gcomp_codec_register checks every entry, since the parser writes each field at its offset
 * and reads choices by index: a name of 1-32 chars of [a-z0-9_], unique; a known type; the
 * field (8 bytes for INT and DOUBLE, sizeof(int) for ENUM) inside params_size (at most
 * 4096), aligned for its type, overlapping no other field; INT/DOUBLE: min <= max, neither
 * NaN, def finite within them (INT: an integer; the accepted values are the integers in
 * [ceil(min), floor(max)], compared exactly); ENUM: choices non-empty, NULL-terminated within
 * 64 entries (the library reads no further), each 1-32 characters without whitespace or
 * + : , =, no two alike, def the index of one. At most 64 parameters. */
typedef struct gcomp_param_def {
    const char *name;
    gcomp_param_type type;
    size_t offset;              /* offset of the field in the codec's params struct */
    double min, max;            /* inclusive bounds (INT, DOUBLE) */
    double def;                 /* default (ENUM: index) */
    const char *const *choices; /* ENUM: NULL-terminated names */
    const char *help;
} gcomp_param_def;

/* ---- what an encode call knows besides the data -------------------------------------- */
typedef struct gcomp_encode_ctx {
    uint64_t seed;      /* communicator / codec-object seed */
    uint64_t step;      /* per-key call counter: 0 at a key's first call */
    uint64_t offset;    /* index of element 0 of this buffer within the whole tensor */
    uint32_t rank;      /* caller's rank */
    uint32_t nonfinite; /* OUT: set to 1 if any input value was NaN/Inf */
    uint64_t overflow;  /* OUT: add the number of finite inputs that became +-inf */
    void *state;        /* the codec's state_create() result for this codec object, or NULL */
} gcomp_encode_ctx;

/* ---- CUDA implementation (optional): the same functions on device memory ----------------
 * Pointers are device pointers of the current CUDA device; the stream comes last; nothing
 * allocates (scratch comes from the library, sized by scratch_bytes). Every function only
 * enqueues work on `stream` and never synchronises the host, so a fixed-size codec's encode
 * and decode can be captured in a CUDA graph. What the host would learn from a CPU call (body
 * size, header flags, non-finite, overflow, a corrupt body) lands in a gcomp_cuda_status
 * block in device memory, which the library reads only when it must. Output must equal the
 * CPU vtable's bit for bit for the same seed, step, rank and input (build with --fmad=false;
 * share the per-element arithmetic through the GCOMP_HD helpers of codecs/common.h). */
typedef struct gcomp_cuda_status {
    uint64_t body_bytes; /* encode: bytes of the body written */
    uint64_t overflow;   /* encode: finite inputs that became +-inf */
    uint32_t flags;      /* encode: the header's flags word */
    uint32_t nonfinite;  /* encode: 1 when the result is not finite: the residual must be kept */
    uint32_t error;      /* decode: the first gcomp_result != 0 found (GCOMP_ERR_CORRUPT); a
                          * kernel that sees error != 0 on entry writes nothing */
    uint32_t reserved;
} gcomp_cuda_status;

/* One key's error-feedback state on the device, in device memory. Kernels take the current
 * residual, the step (which keys stochastic rounding) and where to write from here, so a
 * captured graph replays correctly: after an encode the library's commit kernel flips `cur`
 * (double-buffered codecs) and advances `step`, unless status->nonfinite -- without the host. */
typedef struct gcomp_cuda_residual {
    float *buf[2]; /* buf[cur] is the residual; buf[cur ^ 1] the output of double-buffered
                        * codecs (NULL for GCOMP_CAP_RESIDUAL_IN_PLACE ones) */
    uint64_t step;
    uint32_t cur;
    uint32_t reserved;
} gcomp_cuda_residual;

struct gcomp_codec_vtable;

/* One rank's (index, value) pairs of a sparse payload, for sparse_sum_pairs. */
typedef struct gcomp_pair_list {
    const uint64_t *idx; /* increasing, < count */
    const float *val;
    size_t k;
} gcomp_pair_list;

/* sparse_sum_pairs is called with at most this many lists; more ranks take decode_add. */
#define GCOMP_SPARSE_MAX_LISTS 1024

typedef struct gcomp_codec_cuda_ops {
    /* Device scratch an encode of count elements needs (0 if none). */
    size_t (*scratch_bytes)(const void *params, size_t count);
    /* x = g + residual (res NULL: x = g, and the step is ctx->step); body = encode(x) written
     * to body (capacity cap >= max_body_bytes); with res, the residual updated as the CPU
     * encode does (in place, or into buf[cur ^ 1]); status filled. ctx->offset and ctx->rank
     * as on the CPU; ctx->state is unused. */
    gcomp_result (*encode)(const void *params, const gcomp_encode_ctx *ctx, const float *g,
                           const gcomp_cuda_residual *res, size_t count, uint8_t *body, size_t cap, void *scratch,
                           gcomp_cuda_status *status, struct CUstream_st *stream);
    /* acc[i] += decode(body)[i]. payload points at the whole payload (32-byte header, then the
     * body) in device memory, cap its capacity: the kernels read flags and body_bytes from the
     * header, which the library has already checked on the device (magic, version, wire id,
     * count, body_bytes <= cap - 32; a failed check sets status->error first). A corrupt body
     * sets status->error and leaves acc untouched. */
    gcomp_result (*decode_add)(const void *params, const uint8_t *payload, size_t cap, float *acc, size_t count,
                               gcomp_cuda_status *status, struct CUstream_st *stream);

    /* ---- integer ring (GCOMP_CAP_INTEGER), optional: same meaning as the CPU entries ---- */
    /* scales[j] (device) = local scale of bucket j of x = g + residual */
    gcomp_result (*local_scales)(const void *params, const float *g, const gcomp_cuda_residual *res, size_t count,
                                 float *scales, void *scratch, struct CUstream_st *stream);
    /* codes t[0..n) in {-1, 0, +1} (int8) of elements ctx->offset .. ctx->offset + n of the
     * tensor (g and the residual point at the tensor's element 0), under the shared scales
     * (device, one per bucket of the tensor), residual updated in place unless a scale is
     * not finite (then status->nonfinite = 1 and the residual is not touched). */
    gcomp_result (*ternarise)(const void *params, const gcomp_encode_ctx *ctx, const float *g,
                              const gcomp_cuda_residual *res, size_t n, const float *scales, int8_t *t,
                              gcomp_cuda_status *status, struct CUstream_st *stream);
    /* out = (packed sums of m_in ranks in `in`) + t, packed for m_in + 1 ranks (format of the
     * codec's header); m_in = 0: no input. A corrupt `in` sets status->error. */
    gcomp_result (*sums_add_pack)(const uint8_t *in, uint32_t m_in, const int8_t *t, size_t n, uint8_t *out,
                                  gcomp_cuda_status *status, struct CUstream_st *stream);
    /* out[i] = value of the final sum i of m ranks: scale(i) * sum / divisor, with the scale
     * of element lo + i (scales as in ternarise; lo = the chunk's first element index). */
    gcomp_result (*sums_values)(const void *params, const uint8_t *in, size_t lo, size_t n, uint32_t m,
                                const float *scales, float divisor, float *out, gcomp_cuda_status *status,
                                struct CUstream_st *stream);

    /* ---- sparse gather (GCOMP_CAP_SPARSE), optional ---- */
    /* result[0..count) = (sum over j < n, in rank order from 0.0f, of decode(payloads[j])) /
     * divisor; payloads (a device array of n device pointers) as in decode_add, each of
     * capacity cap. scratch: scratch_bytes(params, count) * n is enough. */
    gcomp_result (*sum_payloads)(const void *params, const uint8_t *const *payloads, int n, size_t cap, float *result,
                                 size_t count, float divisor, void *scratch, gcomp_cuda_status *status,
                                 struct CUstream_st *stream);
} gcomp_codec_cuda_ops;

typedef struct gcomp_codec_vtable {
    uint32_t abi_version; /* GCOMP_CODEC_ABI_VERSION */
    const char *name;     /* [a-z0-9_]+, unique */
    uint16_t wire_id;     /* unique, stable forever once published */
    uint32_t caps;        /* GCOMP_CAP_* */
    const gcomp_param_def *params;
    size_t n_params;
    size_t params_size; /* size of the struct the library fills from the table */
    /* Optional cross-parameter check after parsing. Refuse as every other entry fails: return
     * gcomp_codec_fail(GCOMP_ERR_INVALID_SPEC, "reason"), or write the reason into msg
     * (msg_cap bytes; it wins when both are given). The library reports the reason with the
     * codec's name and the spec, as GCOMP_ERR_INVALID_SPEC. */
    gcomp_result (*check_params)(const void *params, char *msg, size_t msg_cap);

    /* ---- element codecs ---- */
    /* Upper bound on the body size for count elements. The library calls it only with
     * count <= GCOMP_MAX_COUNT (SIZE_MAX / 64), so up to 63 bytes per element cannot wrap;
     * a codec that needs more must saturate at SIZE_MAX (the library then reports that no
     * buffer can hold the payload). A byte stage's stage_bound likewise returns SIZE_MAX
     * when in_bytes is past what it can bound. For a SUMMABLE codec it also picks the
     * schedule of small calls at 4, 8, ... ranks (recursive doubling when the body is at
     * most 32 KiB), and through the whole payload's bound (gcomp_codec_max_encoded_bytes,
     * byte stages included) that of the largest at 2 (one message or two), so it must depend
     * on params and count only, the same on every rank. */
    size_t (*max_body_bytes)(const void *params, size_t count);
    /* x = g + r_in (r_in NULL: x = g); body = encode(x); if r_out != NULL:
     * r_out = x - decode(body). r_out may alias r_in. *flags: a codec-defined word stored in
     * the header. When an input is NaN/Inf or the decoded result would be (fp16 overflow),
     * set ctx->nonfinite and make the body decode to a non-finite value somewhere; the
     * library then discards r_out, so the codec may leave it in any state -- unless the codec
     * declares GCOMP_CAP_RESIDUAL_IN_PLACE, in which case it must not write r_out at all.
     * GCOMP_CAP_SUMMABLE: an encode without residual (r_in and r_out NULL: a partial sum)
     * must write the same bytes for the same g, params and ctx seed, step, offset and rank
     * whatever ctx->state holds -- recursive doubling has every rank of a group that holds the
     * same partial sum encode it, each with ctx->rank = the group's lowest rank, and the
     * ranks' results are equal only if their payloads are. *written <= cap (so too for
     * stage_encode and stage_decode): the library checks it, and that every entry returning a
     * gcomp_result (CUDA ops included) returns one of its values; a codec that breaks either
     * rule gets GCOMP_ERR_INTERNAL naming it and the entry. */
    gcomp_result (*encode)(const void *params, gcomp_encode_ctx *ctx, const float *g, const float *r_in, float *r_out,
                           size_t count, uint8_t *body, size_t cap, size_t *written, uint32_t *flags);
    /* acc[i] += decode(body)[i] for i < count. */
    gcomp_result (*decode_add)(const void *params, uint32_t flags, const uint8_t *body, size_t bytes, float *acc,
                               size_t count);

    /* ---- GCOMP_CAP_INTEGER codecs: the encode split the integer ring needs ---- */
    /* Number of scales for count elements (1 per tensor, or 1 per bucket). */
    size_t (*num_scales)(const void *params, size_t count);
    /* scales[j] = local scale of bucket j of x = g + r (max |x|, maybe clipped). */
    gcomp_result (*local_scales)(const void *params, gcomp_encode_ctx *ctx, const float *g, const float *r,
                                 size_t count, float *scales);
    /* The integer ring (src/sched_integer.c) runs on the entries below; registration refuses
     * a GCOMP_CAP_INTEGER codec without num_scales, local_scales and every int_* entry but
     * int_scratch_bytes, naming the first missing one. The ring: the ranks share the max of
     * their local scales; each rank turns its chunk of x = g + r into small integer codes
     * under those scales (int_ternarise, residual fused); partial sums of codes travel packed
     * (int_sums_add_pack adds this rank's codes to the sums of m_in ranks); the final sums of
     * all N ranks become floats (int_sums_values). A chunk is [lo, lo + n) of the tensor. */
    /* Chunks start at multiples of this many elements (e.g. whole buckets); >= 1. */
    size_t (*int_align)(const void *params, size_t count);
    /* Bytes of n packed sums of m ranks (m >= 1); the ring never sends more for a chunk. */
    size_t (*int_sum_bytes)(const void *params, size_t n, uint32_t m);
    /* Scratch bytes int_sums_values may use for n sums of m ranks (NULL: none). */
    size_t (*int_scratch_bytes)(const void *params, size_t n, uint32_t m);
    /* t[0..n) = codes of elements ctx->offset .. ctx->offset + n of the tensor (g, r_in and
     * r_out point at the tensor's element 0; r_in/r_out NULL: no residual; r_out may alias
     * r_in) under the shared scales (num_scales of them, the tensor's). r_out = x - the value
     * the codes stand for. Called only with finite scales when r_out != NULL. */
    gcomp_result (*int_ternarise)(const void *params, const gcomp_encode_ctx *ctx, const float *g, const float *r_in,
                                  float *r_out, size_t n, const float *scales, int8_t *t);
    /* out = (packed sums of m_in ranks in `in`, in_bytes bytes) + t, packed for m_in + 1
     * ranks (int_sum_bytes(n, m_in + 1) bytes); m_in = 0: no input. `in` came over the wire:
     * a wrong size or a value out of range is GCOMP_ERR_CORRUPT. */
    gcomp_result (*int_sums_add_pack)(const void *params, const uint8_t *in, size_t in_bytes, uint32_t m_in,
                                      const int8_t *t, size_t n, uint8_t *out);
    /* out[i] = value of final sum i of m ranks: scale(lo + i) * sum / divisor, computed alike
     * on every rank (same bits). Checks `in` as int_sums_add_pack does. */
    gcomp_result (*int_sums_values)(const void *params, const uint8_t *in, size_t bytes, size_t lo, size_t n,
                                    uint32_t m, const float *scales, float divisor, float *out, void *scratch);

    /* ---- any codec: per-codec-object state ---- */
    /* Created once per codec object (or communicator) and reused by every call, so encode
     * needs no allocation in steady state: an element codec finds it in ctx->state (e.g.
     * top-k's histograms and candidate list), a byte stage gets it as `state` (e.g. zstd's
     * contexts). A NULL-returning create means out of memory. Both may be NULL. */
    void *(*state_create)(const void *params);
    void (*state_destroy)(void *state);

    /* ---- GCOMP_CAP_BYTE_STAGE codecs ---- */
    size_t (*stage_bound)(const void *params, size_t in_bytes);
    gcomp_result (*stage_encode)(const void *params, void *state, const uint8_t *in, size_t n, uint8_t *out, size_t cap,
                                 size_t *written, uint32_t *flags);
    /* Decode into out (capacity cap = the largest inner payload the receiver accepts);
     * a body that would decode to more than cap bytes is GCOMP_ERR_CORRUPT. */
    gcomp_result (*stage_decode)(const void *params, void *state, uint32_t flags, const uint8_t *in, size_t n,
                                 uint8_t *out, size_t cap, size_t *written);

    /* ---- GCOMP_CAP_SPARSE codecs: the gather's fast path, optional (all three or none) ----
     * Without them the gather zeroes the result and adds decode_add of every rank's payload
     * in rank order; with them each payload becomes a pair list while the next one travels,
     * and the lists are summed in one pass. Both must give the same bits. */
    /* Pairs in every payload of count elements (a payload with another number is corrupt); at
     * most count: a call given more fails with GCOMP_ERR_INTERNAL naming the codec, on every
     * rank, before its buffers are sized. */
    size_t (*sparse_k)(const void *params, size_t count);
    /* The pairs of a body (as decode_add reads it) into idx/val, at most cap; *got of them. */
    gcomp_result (*sparse_pairs)(const void *params, uint32_t flags, const uint8_t *body, size_t bytes, size_t count,
                                 size_t cap, uint64_t *idx, float *val, size_t *got);
    /* result[0..count) = (sum of the n lists, each element from 0.0f in list order) /
     * divisor: what zeroing, decode_add of each list in order and dividing would give. */
    gcomp_result (*sparse_sum_pairs)(const void *params, const gcomp_pair_list *lists, int n, float *result,
                                     size_t count, float divisor);

    /* ---- optional CUDA implementation (ABI 2); NULL: host memory only ---- */
    const gcomp_codec_cuda_ops *cuda;
} gcomp_codec_vtable;

/* Register a codec. The vtable must outlive every use (normally a static const).
 * Thread-safe. Errors: GCOMP_ERR_INVALID_ARG (NULL, wrong ABI version, capability bits that
 * are no GCOMP_CAP_* or more than one of SUMMABLE, INTEGER and SPARSE, missing functions,
 * bad name, a built-in wire id, or a parameter table that breaks a rule of gcomp_param_def;
 * the message names the entry), GCOMP_ERR_EXISTS (name or wire id taken), GCOMP_ERR_NOMEM. */
GCOMP_API gcomp_result gcomp_codec_register(const gcomp_codec_vtable *vt);

/* Look up a registered codec by name or by wire id; NULL if none. Thread-safe. */
GCOMP_API const gcomp_codec_vtable *gcomp_codec_find(const char *name);
GCOMP_API const gcomp_codec_vtable *gcomp_codec_find_id(uint16_t wire_id);

/* ---- the payload header, written and checked by the library --------------------------
 * 32 bytes, little-endian:
 *   0  u32 magic        "GCMP" (0x504D4347)
 *   4  u8  version      GCOMP_FORMAT_VERSION
 *   5  u8  dtype        gcomp_dtype of the tensor that was encoded
 *   6  u16 wire_id      codec that wrote the body
 *   8  u32 flags        codec-defined
 *  12  u32 reserved     must be 0
 *  16  u64 count        number of elements of the tensor (or chunk)
 *  24  u64 body_bytes   bytes that follow the header
 */
#define GCOMP_HEADER_BYTES 32u
#define GCOMP_HEADER_MAGIC 0x504D4347u
#define GCOMP_FORMAT_VERSION 1u

typedef struct gcomp_header {
    uint32_t magic;
    uint8_t version;
    uint8_t dtype;
    uint16_t wire_id;
    uint32_t flags;
    uint32_t reserved;
    uint64_t count;
    uint64_t body_bytes;
} gcomp_header;

/* Serialise / parse the header. gcomp_header_read checks magic, version, reserved, dtype and
 * that body_bytes equals the payload size minus the header (GCOMP_ERR_CORRUPT otherwise). */
GCOMP_API void gcomp_header_write(uint8_t out[GCOMP_HEADER_BYTES], const gcomp_header *h);
GCOMP_API gcomp_result gcomp_header_read(const uint8_t *payload, size_t bytes, gcomp_header *h);

/* Record a failure detail for gcomp_last_error() (printf format) and return rc, so a codec
 * can write: return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "topk: index %llu >= count", i);
 * An entry that returns an error without recording one gets "codec 'name': entry returned
 * GCOMP_ERR_... (the codec gave no detail)". */
GCOMP_API gcomp_result gcomp_codec_fail(gcomp_result rc, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Put on a codec's hot loop functions: the compiler builds them for AVX-512 (x86-64-v4), for
 * AVX2 and for the baseline ISA, and the loader picks one per machine. Results are identical
 * either way: gcomp builds with -ffp-contract=off (no FMA), and the loops use only correctly
 * rounded IEEE operations. The golden-file test checks it: natively (AVX-512 where the CPU has
 * it) and under valgrind, whose virtual CPU has no AVX-512 (the AVX2 clone). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__) && !defined(GCOMP_NO_SIMD_CLONES)
#define GCOMP_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define GCOMP_SIMD_CLONES
#endif

/* Little-endian helpers for bodies (host and device). */
static inline void gcomp_store_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}
static inline uint32_t gcomp_load_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline void gcomp_store_u64(uint8_t *p, uint64_t v)
{
    gcomp_store_u32(p, (uint32_t)v);
    gcomp_store_u32(p + 4, (uint32_t)(v >> 32));
}
static inline uint64_t gcomp_load_u64(const uint8_t *p)
{
    return (uint64_t)gcomp_load_u32(p) | (uint64_t)gcomp_load_u32(p + 4) << 32;
}

#ifdef __cplusplus
}
#endif
#endif /* GCOMP_CODEC_H */
