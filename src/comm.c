/*
 * comm.c — the communicator: creation (a collective that agrees on the codec), per-key
 * state, stats, and the agreements of a call.
 *
 * Every agreement (creation, start and end of a call) is one small allreduce (a max of
 * AGREE_N uint64) in which the ranks agree on the call (codec spec, count, dtype, op,
 * min_bytes, library version) and on whether every rank's arguments were valid, or, at the
 * end, on the outcome (a local failure, a non-finite input or result). A disagreement
 * returns the same error on every rank instead of a hang or garbage. The call's agreement
 * also carries TernGrad's shared scales when every rank has them ready (engine.c). On host
 * transports the call's agreement travels in its ring instead (gcomp__comm_in_band: the
 * same fields in a block, ring.h); this file builds the block and takes the verdict.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "ring.h"
#include "transport_staging.h"

static uint64_t fnv1a(uint64_t h, const void *data, size_t n)
{
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t spec_hash(const gcomp_codec *codec)
{
    return codec ? fnv1a(0xcbf29ce484222325ull, gcomp_codec_spec(codec), strlen(gcomp_codec_spec(codec))) : 0;
}

/* ---- agreement ----
 * Every agreement (creation, start and end of a call) is one max-allreduce of AGREE_N
 * uint64 with the same layout, so ranks that are out of step never meet in collectives of
 * different sizes (Open MPI 4.1 truncates such a message and reports it through
 * MPI_COMM_WORLD's error handler, which aborts the job).
 *   V_FAIL      0, or (error code << 32 | rank) of a failed rank: the max names the worst
 *               error and the highest rank that had it
 *   V_NONFINITE 1 if this rank's encode saw NaN/Inf or its result holds one
 *   V_DEVICE    1 if this rank's call runs on device buffers (start of a call): then every
 *               rank decides the call's outcome by the end-of-call agreement, not by the
 *               ring's trailers (engine.c), so ranks never run different protocols
 *   V_NO_SCALES 1 if this rank's call did not fill the V_SCALES slots (then no rank uses them)
 *   V_SCALES    GCOMP__AGREE_SCALES slots for a call's shared scales (|float bits|, max over
 *               ranks: TernGrad's on host fp32 buffers, engine.c), 0 when unused; they save
 *               the codec's own scale allreduce
 *   fields      (v, ~v) pairs: after the max, a rank whose v or ~v changed knows that some
 *               rank had another value, and which field it was
 * The call's fields are everything that changes what a rank sends or how: the codec spec,
 * count, dtype, op and min_bytes (which decides bypass or compression, so ranks that
 * disagree on it would run different protocols), the memory of the buffers (host buffers
 * over MPI and device buffers through the staging decorator exchange differently), and the
 * library version. error_feedback
 * changes only this rank's residual and seed only the values of the codes, never sizes or
 * the protocol, so ranks may differ in them (timeout_ms and debug are local too). */
enum {
    V_FAIL,
    V_NONFINITE,
    V_DEVICE,
    V_NO_SCALES, /* 1 if this rank's call did not fill the V_SCALES slots */
    V_SCALES,    /* GCOMP__AGREE_SCALES slots: a call's shared scales, max over ranks (comm.h) */
    V_FIELDS = V_SCALES + GCOMP__AGREE_SCALES
};
enum {
    F_SPEC,
    F_COUNT,
    F_DTYPE,
    F_OP,
    F_MIN_BYTES,
    F_VERSION,
    F_MEM,
    F_PATH, /* in-band agreement: 1 if the call's ring carries it, 0 if it runs a pass (engine.c) */
    N_FIELDS
};
#define AGREE_N (V_FIELDS + 2 * N_FIELDS)
static const char *const field_names[N_FIELDS] = {
    "codec spec", "count",           "dtype",
    "op",         "min_bytes",       "library version",
    "memory (host or device buffers)", "path of its agreement (in its ring, or a pass of its own: staged buffers)"
};

typedef struct vote {
    uint64_t v[AGREE_N];
    char detail[256]; /* this rank's own failure message */
} vote;

/* A failure as the agreements carry it: 0, or (code << 32 | rank), so the max names the worst. */
static uint64_t fail_code(gcomp_result local, int rank)
{
    return local != GCOMP_SUCCESS ? (uint64_t)local << 32 | (uint32_t)rank : 0;
}

/* The fields as (v, ~v) pairs (zeros for NULL): after a max over ranks, a rank whose v or ~v
 * changed knows that some rank had another value. */
static void put_pairs(uint64_t *pairs, const uint64_t *fields)
{
    for (int f = 0; f < N_FIELDS; f++) {
        pairs[2 * f] = fields ? fields[f] : 0;
        pairs[2 * f + 1] = ~pairs[2 * f];
    }
}

static void vote_init(vote *b, int rank, gcomp_result local, int nonfinite, const uint64_t *fields)
{
    memset(b, 0, sizeof *b);
    b->v[V_FAIL] = fail_code(local, rank);
    b->v[V_NONFINITE] = nonfinite != 0;
    put_pairs(&b->v[V_FIELDS], fields);
    snprintf(b->detail, sizeof b->detail, "%s", local != GCOMP_SUCCESS ? gcomp_last_error() : "");
}

/* Share the vote; got receives the max over all ranks. */
static gcomp_result vote_share(gcomp__transport *tp, const vote *mine, uint64_t *got, double deadline)
{
    memcpy(got, mine->v, sizeof mine->v);
    return tp->allreduce_max_u64(tp, got, AGREE_N, deadline);
}

/* A failure anywhere: this rank's own message, or which rank failed and how. */
static gcomp_result vote_failure(const vote *mine, const uint64_t *got, const char *what)
{
    gcomp_result rc = (gcomp_result)(got[V_FAIL] >> 32);
    if (mine->v[V_FAIL]) return gcomp__fail_again((gcomp_result)(mine->v[V_FAIL] >> 32), mine->detail);
    return gcomp__fail(rc, "rank %u failed %s: %s (%s); see that rank's gcomp_last_error()",
                       (unsigned)(uint32_t)got[V_FAIL], what, gcomp_result_name(rc), gcomp_strerror(rc));
}

static const char *dtype_name(gcomp_dtype d)
{
    return d == GCOMP_F32 ? "f32" : d == GCOMP_F16 ? "f16" : d == GCOMP_BF16 ? "bf16" : "invalid";
}

static const char *op_name(gcomp_op op) { return op == GCOMP_SUM ? "sum" : op == GCOMP_AVG ? "avg" : "invalid"; }

/* What the ranks hold of a field that differs, from its lowest and highest value (the max
 * over ranks of v and of ~v): " (lowest 10, highest 12)", " (at least f32 and bf16)";
 * "" for the fields whose values say nothing to a reader (a hash, a version). */
static int field_range(int f, uint64_t lo, uint64_t hi, char *out, size_t cap)
{
    switch (f) {
    case F_COUNT:
    case F_MIN_BYTES:
        return snprintf(out, cap, " (lowest %llu, highest %llu)", (unsigned long long)lo, (unsigned long long)hi);
    case F_DTYPE: /* the lowest and highest of three or more: others may lie between */
        return snprintf(out, cap, " (at least %s and %s)", dtype_name((gcomp_dtype)lo), dtype_name((gcomp_dtype)hi));
    case F_OP:
        return snprintf(out, cap, " (at least %s and %s)", op_name((gcomp_op)lo), op_name((gcomp_op)hi));
    default:
        if (cap) out[0] = 0;
        return 0;
    }
}

/* The names of the fields on which ranks differ ("" if none), comma-separated, each with what
 * the ranks hold of it: mine and got point at the (v, ~v) pairs of this rank and of the max
 * over ranks. The path follows from the others (a bypass, an empty call, device buffers run a
 * pass): named only alone. */
static void field_differences(const uint64_t *mine, const uint64_t *got, char *out, size_t cap)
{
    size_t n = 0;
    int differs[N_FIELDS], others = 0;
    out[0] = 0;
    for (int f = 0; f < N_FIELDS; f++) {
        differs[f] = got[2 * f] != mine[2 * f] || got[2 * f + 1] != mine[2 * f + 1];
        others |= f != F_PATH && differs[f];
    }
    for (int f = 0; f < N_FIELDS; f++) {
        if (!differs[f] || (f == F_PATH && others)) continue;
        n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, "%s%s", n ? ", " : "", field_names[f]);
        n += (size_t)field_range(f, ~got[2 * f + 1], got[2 * f], n < cap ? out + n : NULL, n < cap ? cap - n : 0);
    }
}

/* What ranks exchange, numbered: 2 the vote of AGREE_N = 28 uint64 (TernGrad's scales in
 * the call's agreement), 3 the call's agreement in the ring on host transports (ring.h), 4
 * recursive doubling for the dense calls at 2 ranks (one whole payload, not two chunks).
 * Creation compares it (with the library version), so ranks whose libraries would run
 * different protocols get GCOMP_ERR_MISMATCH there instead of timing out in their first
 * call. (A library older than protocol 3 does not compare it: its ranks pass creation and
 * time out in the first call while the newer ones return the error.) */
#define PROTOCOL 4
_Thread_local int gcomp__protocol_skew; /* test hook (comm.h) */

static uint64_t version_field(void) { return (uint64_t)GCOMP_VERSION << 16 | (uint64_t)(PROTOCOL + gcomp__protocol_skew); }

/* A call's fields: everything that changes what a rank sends or how (see the enum). */
static void call_fields(const gcomp_comm *c, size_t count, gcomp_dtype dtype, gcomp_op op, int on_device,
                        int in_ring, uint64_t *fields)
{
    fields[F_SPEC] = spec_hash(c->codec);
    fields[F_COUNT] = count;
    fields[F_DTYPE] = (uint64_t)dtype;
    fields[F_OP] = (uint64_t)op;
    fields[F_MIN_BYTES] = (uint64_t)c->cfg.min_bytes;
    fields[F_VERSION] = version_field();
    fields[F_MEM] = on_device != 0; /* host and device ranks would run different exchanges */
    fields[F_PATH] = in_ring != 0;
}

static gcomp_result call_mismatch(const gcomp_comm *c, const char *diff, size_t count, gcomp_dtype dtype, gcomp_op op)
{
    return gcomp__fail(GCOMP_ERR_MISMATCH,
                       "ranks disagree on the call's %s (this rank: count %zu dtype %s op %s min_bytes %lld codec "
                       "'%s')",
                       diff, count, dtype_name(dtype), op_name(op), (long long)c->cfg.min_bytes,
                       gcomp_codec_spec(c->codec));
}

#define CREATE_TIMEOUT_MS 300000 /* the agreement's deadline when the configuration is unknown */

gcomp_result gcomp__comm_join_failed(gcomp__transport *tp, gcomp_result local)
{
    vote mine;
    uint64_t got[AGREE_N];
    vote_init(&mine, tp->rank, local, 0, NULL);
    (void)vote_share(tp, &mine, got, gcomp__now() + 1e-3 * CREATE_TIMEOUT_MS);
    tp->destroy(tp);
    return gcomp__fail_again(local, mine.detail);
}

/* The lock and condition of the request queue (request.c runs it). */
static gcomp_result queue_init(gcomp_comm *c)
{
    if (pthread_mutex_init(&c->q.lock, NULL) != 0)
        return gcomp__fail(GCOMP_ERR_NOMEM, "cannot create the request queue's lock");
    if (pthread_cond_init(&c->q.cond, NULL) != 0) {
        pthread_mutex_destroy(&c->q.lock);
        return gcomp__fail(GCOMP_ERR_NOMEM, "cannot create the request queue's condition");
    }
    c->q.inited = 1;
    return GCOMP_SUCCESS;
}

gcomp_result gcomp__comm_create(gcomp__transport *tp, const gcomp_config *cfg, gcomp_comm **out)
{
    gcomp_comm *c = calloc(1, sizeof *c);
    gcomp_codec_options opts = gcomp_codec_options_default();
    uint64_t fields[N_FIELDS] = { 0 }, got[AGREE_N];
    vote mine;
    gcomp_result rc, local = GCOMP_SUCCESS;
    if (out) *out = NULL;
    if (!c) return gcomp__comm_join_failed(tp, gcomp__fail(GCOMP_ERR_NOMEM, "gcomp_comm_create: out of memory"));
    c->tp = tp;
    /* whether nonblocking calls may progress on a thread of their own (request.c) */
    c->threads_ok = !tp->threads_ok || tp->threads_ok(NULL, 0);
    /* A local failure (NULL out, bad spec, bad GCOMP_* variable) still joins the agreement
     * below, so the other ranks get an error too instead of waiting for this one. */
    if (!out) local = gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_comm_create: out is NULL");
    if (local == GCOMP_SUCCESS) local = queue_init(c);
    if (local == GCOMP_SUCCESS) local = gcomp__config_resolve(cfg, &c->cfg);
    if (local == GCOMP_SUCCESS) {
        opts.seed = c->cfg.seed;
        opts.rank = (uint32_t)tp->rank;
        opts.error_feedback = c->cfg.error_feedback;
        local = gcomp_codec_create(c->cfg.codec, &opts, &c->codec);
    }
    /* a transport that cannot carry byte stages (NCCL: zstd runs on host memory) says why */
    if (local == GCOMP_SUCCESS && tp->no_byte_stages && gcomp__codec_chain(c->codec)->n_stages > 1)
        local = gcomp__fail(GCOMP_ERR_UNSUPPORTED, "codec '%s': %s", gcomp_codec_spec(c->codec), tp->no_byte_stages);
    if (c->cfg.timeout_ms <= 0) c->cfg.timeout_ms = CREATE_TIMEOUT_MS; /* config not resolved */
    /* ranks must agree on the codec: compare a hash of the canonical spec */
    fields[F_SPEC] = local == GCOMP_SUCCESS ? spec_hash(c->codec) : 0;
    fields[F_VERSION] = version_field();
    vote_init(&mine, tp->rank, local, 0, fields);
    GCOMP_CHECK_GOTO(vote_share(tp, &mine, got, gcomp__now() + 1e-3 * (double)c->cfg.timeout_ms), rc, fail);
    if (got[V_FAIL]) {
        rc = vote_failure(&mine, got, "to create its communicator");
        goto fail;
    }
    if (got[V_FIELDS + 2 * F_VERSION] != fields[F_VERSION] || ~got[V_FIELDS + 2 * F_VERSION + 1] != fields[F_VERSION]) {
        rc = gcomp__fail(GCOMP_ERR_MISMATCH,
                         "ranks run gcomp libraries of different versions or wire protocols (this rank: version "
                         "%d.%d.%d, protocol %d): use the same build on every rank",
                         GCOMP_VERSION_MAJOR, GCOMP_VERSION_MINOR, GCOMP_VERSION_PATCH, PROTOCOL + gcomp__protocol_skew);
        goto fail;
    }
    if (got[V_FIELDS + 2 * F_SPEC] != fields[F_SPEC] || ~got[V_FIELDS + 2 * F_SPEC + 1] != fields[F_SPEC]) {
        rc = gcomp__fail(GCOMP_ERR_MISMATCH, "ranks were configured with different codecs (this rank: '%s')",
                         gcomp_codec_spec(c->codec));
        goto fail;
    }
    if (c->cfg.debug)
        gcomp__log("rank %d/%d: codec %s, min_bytes %lld, ef %d, timeout %lld ms, progress thread %s", tp->rank,
                   tp->size, gcomp_codec_spec(c->codec), (long long)c->cfg.min_bytes, c->cfg.error_feedback,
                   (long long)c->cfg.timeout_ms,
                   c->threads_ok ? "allowed" : "not allowed (nonblocking calls progress in gcomp_test/gcomp_wait)");
    *out = c;
    return GCOMP_SUCCESS;
fail:
    gcomp__comm_free(c);
    return rc;
}

void gcomp__comm_free(gcomp_comm *c)
{
    if (!c) return;
    if (c->q.inited) {
        pthread_cond_destroy(&c->q.cond);
        pthread_mutex_destroy(&c->q.lock);
        c->q.inited = 0;
    }
    while (c->keys) {
        gcomp__key *k = c->keys;
        c->keys = k->next;
        free(k);
    }
    gcomp_codec_destroy(c->codec);
    gcomp_codec_destroy(c->dense_codec);
    /* after a timeout an MPI ring exchange may still be sending from the workspace (MPI
     * cannot cancel sends): then it is leaked on purpose rather than freed under it. The
     * workspace of each memory kind goes with the transport that moved its buffers. */
    for (int d = 0; d < 2; d++) {
        const gcomp__transport *t = c->staged[d] ? c->staged[d] : c->tp;
        if (!c->broken || (t && t->releases_buffers_on_timeout)) gcomp__ws_free(&c->ws[d]);
    }
    if (!c->broken || (c->tp && c->tp->releases_buffers_on_timeout)) free(c->agree_buf);
    for (int d = 0; d < 2; d++) /* decorators first: they use tp */
        if (c->staged[d]) c->staged[d]->destroy(c->staged[d]);
    if (c->tp) c->tp->destroy(c->tp);
    free(c);
}

gcomp_result gcomp__comm_transport_for(gcomp_comm *c, const char *api, const gcomp__device_ops *dev,
                                       gcomp__transport **out)
{
    gcomp__mem_kind want = dev->kind == GCOMP__DEVICE_CUDA ? GCOMP__MEM_CUDA : GCOMP__MEM_HOST;
    if (c->staged[want]) {
        *out = c->staged[want];
        return GCOMP_SUCCESS;
    }
    if (c->tp->mem == want) {
        *out = c->tp;
        return GCOMP_SUCCESS;
    }
    if (want == GCOMP__MEM_HOST)
        return gcomp__fail(GCOMP_ERR_UNSUPPORTED,
                           "%s: this communicator's transport moves device memory only (NCCL): pass device "
                           "buffers, or use an MPI communicator for host buffers",
                           api);
    /* device buffers over a host transport (MPI without CUDA support): stage through host */
    GCOMP_CHECK(gcomp__transport_staging_wrap(c->tp, dev, &c->staged[want]));
    gcomp__debug("rank %d: device buffers go through the staging transport", c->tp->rank);
    *out = c->staged[want];
    return GCOMP_SUCCESS;
}

uint64_t gcomp__comm_device_allocs(const gcomp_comm *c)
{
    return c->ws[GCOMP__DEVICE_CUDA].allocs + gcomp__codec_dev_allocs(c->codec) +
           gcomp__codec_dev_allocs(c->dense_codec) + gcomp__transport_staging_allocs(c->staged[GCOMP__MEM_CUDA]);
}

gcomp_result gcomp__comm_stage_host(gcomp_comm *c)
{
    if (c->staged[GCOMP__MEM_HOST]) return GCOMP_SUCCESS;
    return gcomp__transport_staging_wrap(c->tp, &gcomp__device_host, &c->staged[GCOMP__MEM_HOST]);
}

gcomp_result gcomp__comm_emulate_device(gcomp_comm *c, const char *dense_spec, int staged)
{
    if (staged) GCOMP_CHECK(gcomp__comm_stage_host(c));
    if (!c->dense_codec) GCOMP_CHECK(gcomp_codec_create(dense_spec, NULL, &c->dense_codec));
    c->emulate_device = 1;
    return GCOMP_SUCCESS;
}

int gcomp_comm_rank(const gcomp_comm *c) { return c ? c->tp->rank : -1; }
int gcomp_comm_size(const gcomp_comm *c) { return c ? c->tp->size : -1; }
const char *gcomp_comm_codec(const gcomp_comm *c) { return c ? gcomp_codec_spec(c->codec) : ""; }

const gcomp__key *gcomp__comm_find_key(const gcomp_comm *c, uint64_t key)
{
    for (const gcomp__key *k = c->keys; k; k = k->next)
        if (k->key == key) return k;
    return NULL;
}

gcomp_result gcomp__comm_key(gcomp_comm *c, uint64_t key, gcomp__key **out)
{
    gcomp__key *k = c->keys;
    while (k && k->key != key) k = k->next;
    if (!k) {
        k = calloc(1, sizeof *k);
        if (!k) return gcomp__fail(GCOMP_ERR_NOMEM, "cannot allocate state for key %llu", (unsigned long long)key);
        k->key = key;
        k->next = c->keys;
        c->keys = k;
    }
    *out = k;
    return GCOMP_SUCCESS;
}

gcomp_result gcomp__comm_transport_failed(gcomp_comm *c, gcomp_result rc)
{
    if (rc == GCOMP_ERR_TIMEOUT || rc == GCOMP_ERR_TRANSPORT) c->broken = 1;
    return rc;
}

gcomp_result gcomp__comm_agree_call(gcomp_comm *c, gcomp_result local, size_t count, gcomp_dtype dtype, gcomp_op op,
                                    int on_device, uint64_t *scales, int *scales_shared, int *any_device,
                                    double deadline)
{
    uint64_t fields[N_FIELDS], got[AGREE_N];
    char diff[320];
    vote mine;
    call_fields(c, count, dtype, op, on_device, 0, fields);
    vote_init(&mine, c->tp->rank, local, 0, fields);
    mine.v[V_DEVICE] = on_device != 0;
    mine.v[V_NO_SCALES] = scales == NULL;
    if (scales) memcpy(&mine.v[V_SCALES], scales, GCOMP__AGREE_SCALES * sizeof *scales);
    *scales_shared = 0;
    GCOMP_CHECK(gcomp__comm_transport_failed(c, vote_share(c->tp, &mine, got, deadline)));
    *any_device = got[V_DEVICE] != 0;
    if (got[V_FAIL]) return vote_failure(&mine, got, "before the call started (its arguments or buffers)");
    field_differences(mine.v + V_FIELDS, got + V_FIELDS, diff, sizeof diff);
    if (diff[0]) return call_mismatch(c, diff, count, dtype, op);
    /* the ranks agree on the call, so all of them chose to carry scales, or some did not */
    if (scales && !got[V_NO_SCALES]) {
        memcpy(scales, &got[V_SCALES], GCOMP__AGREE_SCALES * sizeof *scales);
        *scales_shared = 1;
    }
    return GCOMP_SUCCESS;
}

/* The in-band agreement's block: the first failure, then the fields' (v, ~v) pairs. */
enum {
    B_FAIL,
    B_FIELDS,
    B_N = B_FIELDS + 2 * N_FIELDS
};

int gcomp__comm_in_band(const gcomp_comm *c)
{
    return c->tp->mem == GCOMP__MEM_HOST && c->tp->start_sendrecv_any &&
           !(gcomp__codec_chain(c->codec)->stages[0].vt->caps & GCOMP_CAP_INTEGER);
}

int gcomp__comm_butterfly(const gcomp_comm *c)
{
    return gcomp__comm_in_band(c) && !(gcomp__codec_chain(c->codec)->stages[0].vt->caps & GCOMP_CAP_SPARSE) &&
           gcomp__ring_butterfly_steps(c->tp->size) > 0;
}

size_t gcomp__comm_in_band_block(gcomp_comm *c, gcomp__agreement *a, gcomp_result local, size_t count,
                                 gcomp_dtype dtype, gcomp_op op, int on_device, int in_ring, uint64_t *block)
{
    uint64_t fields[N_FIELDS];
    a->c = c;
    a->count = count;
    a->dtype = dtype;
    a->op = op;
    snprintf(a->detail, sizeof a->detail, "%s", local != GCOMP_SUCCESS ? gcomp_last_error() : "");
    call_fields(c, count, dtype, op, on_device, in_ring, fields);
    block[B_FAIL] = fail_code(local, c->tp->rank);
    put_pairs(&block[B_FIELDS], fields);
    return B_N;
}

gcomp_result gcomp__comm_in_band_verdict(void *ctx, const uint64_t *mine, const uint64_t *all, size_t n)
{
    const gcomp__agreement *a = ctx;
    char diff[320];
    (void)n;
    if (all[B_FAIL]) {
        gcomp_result rc = (gcomp_result)(all[B_FAIL] >> 32);
        if (mine[B_FAIL]) return gcomp__fail_again((gcomp_result)(mine[B_FAIL] >> 32), a->detail);
        return gcomp__fail(rc, "rank %u failed before the call started (its arguments or buffers): %s (%s); see that "
                               "rank's gcomp_last_error()",
                           (unsigned)(uint32_t)all[B_FAIL], gcomp_result_name(rc), gcomp_strerror(rc));
    }
    field_differences(mine + B_FIELDS, all + B_FIELDS, diff, sizeof diff);
    return diff[0] ? call_mismatch(a->c, diff, a->count, a->dtype, a->op) : GCOMP_SUCCESS;
}

gcomp_result gcomp__comm_agree_outcome(gcomp_comm *c, gcomp_result local, int local_nonfinite, int *nonfinite,
                                       double deadline)
{
    uint64_t got[AGREE_N];
    vote mine;
    vote_init(&mine, c->tp->rank, local, local_nonfinite, NULL);
    GCOMP_CHECK(gcomp__comm_transport_failed(c, vote_share(c->tp, &mine, got, deadline)));
    *nonfinite = got[V_NONFINITE] != 0;
    if (got[V_FAIL]) return vote_failure(&mine, got, "during the allreduce");
    return GCOMP_SUCCESS;
}

static void add_stats(gcomp_comm_stats *to, const gcomp_comm_stats *from)
{
    to->calls += from->calls;
    to->compressed_calls += from->compressed_calls;
    to->raw_bytes += from->raw_bytes;
    to->wire_bytes += from->wire_bytes;
    to->baseline_bytes += from->baseline_bytes;
    to->overflow_count += from->overflow_count;
    to->nonfinite_calls += from->nonfinite_calls;
    to->encode_s += from->encode_s;
    to->comm_s += from->comm_s;
    to->decode_s += from->decode_s;
    to->agree_s += from->agree_s;
    to->last_schedule = from->last_schedule;
}

void gcomp__comm_add_stats(gcomp_comm *c, gcomp__key *k, const gcomp_comm_stats *st)
{
    if (k) add_stats(&k->stats, st);
    add_stats(&c->stats, st);
}

void gcomp__comm_clear_stats(gcomp_comm *c)
{
    memset(&c->stats, 0, sizeof c->stats);
    for (gcomp__key *k = c->keys; k; k = k->next) memset(&k->stats, 0, sizeof k->stats);
}

void gcomp__comm_inject_fault(gcomp_comm *c, int fault)
{
    if (!c) return;
    if (fault == GCOMP__FAULT_ALLOC) {
        gcomp__ws_free(&c->ws[GCOMP__DEVICE_HOST]);
        c->ws[GCOMP__DEVICE_HOST].fail_next = 1;
    } else if (fault == GCOMP__FAULT_TRUNCATE_WIRE || fault == GCOMP__FAULT_GARBLE_TRAILER) {
        gcomp__transport *wrapped;
        if (gcomp__transport_fault_wrap(c->tp, &wrapped) != GCOMP_SUCCESS) return;
        c->tp = wrapped;
        for (int d = 0; d < 2; d++) gcomp__transport_staging_rebind(c->staged[d], wrapped);
        if (fault == GCOMP__FAULT_TRUNCATE_WIRE)
            gcomp__transport_fault_truncate_next(wrapped);
        else
            gcomp__transport_fault_garble_next(wrapped);
    }
}
