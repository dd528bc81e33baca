/*
 * engine.c — gcomp_allreduce: argument agreement, bypass, per-key residuals and stats, and
 * the choice of schedule by the codec's capabilities.
 *
 * Every call starts with one small allreduce (a max of AGREE_N uint64) in which the ranks
 * agree on the call (codec spec, count, dtype, op, min_bytes, library version) and on whether
 * every rank's arguments were valid, and ends with another in which they agree on the
 * outcome (a local failure, a non-finite input or result). A disagreement returns the same
 * error on every rank instead of a hang or garbage.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "codecs/divide.h"

double gcomp__now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *gcomp_schedule_name(gcomp_schedule s)
{
    switch (s) {
    case GCOMP_SCHED_NONE: return "none";
    case GCOMP_SCHED_BYPASS: return "bypass";
    case GCOMP_SCHED_DENSE: return "dense-ring";
    case GCOMP_SCHED_INTEGER: return "integer-ring";
    case GCOMP_SCHED_SPARSE: return "sparse-gather";
    case GCOMP_SCHED_SPARSE_AS_DENSE: return "sparse-as-dense-ring";
    }
    return "unknown";
}

void gcomp__chunk(size_t count, int n_chunks, int c, size_t align, size_t *lo, size_t *hi)
{
    size_t per = count / (size_t)n_chunks;
    size_t l = (per * (size_t)c) / align * align, h = (per * (size_t)(c + 1)) / align * align;
    if (c + 1 == n_chunks) h = count;
    *lo = l < count ? l : count;
    *hi = h < count ? h : count;
}

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
 *   fields      (v, ~v) pairs: after the max, a rank whose v or ~v changed knows that some
 *               rank had another value, and which field it was
 * The call's fields are everything that changes what a rank sends or how: the codec spec,
 * count, dtype, op and min_bytes (which decides bypass or compression, so ranks that
 * disagree on it would run different protocols), and the library version. error_feedback
 * changes only this rank's residual and seed only the values of the codes, never sizes or
 * the protocol, so ranks may differ in them (timeout_ms and debug are local too). */
enum { V_FAIL, V_NONFINITE, V_FIELDS };
enum { F_SPEC, F_COUNT, F_DTYPE, F_OP, F_MIN_BYTES, F_VERSION, N_FIELDS };
#define AGREE_N (V_FIELDS + 2 * N_FIELDS)
static const char *const field_names[N_FIELDS] = {"codec spec", "count", "dtype", "op", "min_bytes", "library version"};

typedef struct vote {
    uint64_t v[AGREE_N];
    char detail[256]; /* this rank's own failure message */
} vote;

static void vote_init(vote *b, int rank, gcomp_result local, int nonfinite, const uint64_t *fields)
{
    memset(b, 0, sizeof *b);
    b->v[V_FAIL] = local != GCOMP_SUCCESS ? (uint64_t)local << 32 | (uint32_t)rank : 0;
    b->v[V_NONFINITE] = nonfinite != 0;
    for (int f = 0; f < N_FIELDS; f++) {
        b->v[V_FIELDS + 2 * f] = fields ? fields[f] : 0;
        b->v[V_FIELDS + 2 * f + 1] = ~(fields ? fields[f] : 0);
    }
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
    if (mine->v[V_FAIL]) return gcomp__fail((gcomp_result)(mine->v[V_FAIL] >> 32), "%s", mine->detail);
    return gcomp__fail(rc, "rank %u failed %s: %s (%s); see that rank's gcomp_last_error()",
                       (unsigned)(uint32_t)got[V_FAIL], what, gcomp_result_name(rc), gcomp_strerror(rc));
}

/* The names of the fields on which ranks differ ("" if none), comma-separated. */
static void vote_differences(const vote *mine, const uint64_t *got, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = 0;
    for (int f = 0; f < N_FIELDS; f++)
        if (got[V_FIELDS + 2 * f] != mine->v[V_FIELDS + 2 * f] || got[V_FIELDS + 2 * f + 1] != mine->v[V_FIELDS + 2 * f + 1])
            n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, "%s%s", n ? ", " : "", field_names[f]);
}

#define CREATE_TIMEOUT_MS 300000 /* the agreement's deadline when the configuration is unknown */

gcomp_result gcomp__comm_join_failed(gcomp__transport *tp, gcomp_result local)
{
    vote mine;
    uint64_t got[AGREE_N];
    vote_init(&mine, tp->rank, local, 0, NULL);
    (void)vote_share(tp, &mine, got, gcomp__now() + 1e-3 * CREATE_TIMEOUT_MS);
    tp->destroy(tp);
    return gcomp__fail(local, "%s", mine.detail);
}

gcomp_result gcomp__comm_create(gcomp__transport *tp, const gcomp_config *cfg, gcomp_comm **out)
{
    gcomp_comm *c = calloc(1, sizeof *c);
    gcomp_codec_options opts = gcomp_codec_options_default();
    uint64_t fields[N_FIELDS] = {0}, got[AGREE_N];
    vote mine;
    gcomp_result rc, local = GCOMP_SUCCESS;
    if (out) *out = NULL;
    if (!c) return gcomp__comm_join_failed(tp, gcomp__fail(GCOMP_ERR_NOMEM, "gcomp_comm_create: out of memory"));
    c->tp = tp;
    /* A local failure (NULL out, bad spec, bad GCOMP_* variable) still joins the agreement
     * below, so the other ranks get an error too instead of waiting for this one. */
    if (!out) local = gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_comm_create: out is NULL");
    if (local == GCOMP_SUCCESS) local = gcomp__config_resolve(cfg, &c->cfg);
    if (local == GCOMP_SUCCESS) {
        opts.seed = c->cfg.seed;
        opts.rank = (uint32_t)tp->rank;
        opts.error_feedback = c->cfg.error_feedback;
        local = gcomp_codec_create(c->cfg.codec, &opts, &c->codec);
    }
    if (c->cfg.timeout_ms <= 0) c->cfg.timeout_ms = CREATE_TIMEOUT_MS; /* config not resolved */
    /* ranks must agree on the codec: compare a hash of the canonical spec */
    fields[F_SPEC] = local == GCOMP_SUCCESS ? spec_hash(c->codec) : 0;
    vote_init(&mine, tp->rank, local, 0, fields);
    GCOMP_CHECK_GOTO(vote_share(tp, &mine, got, gcomp__now() + 1e-3 * (double)c->cfg.timeout_ms), rc, fail);
    if (got[V_FAIL]) {
        rc = vote_failure(&mine, got, "to create its communicator");
        goto fail;
    }
    if (got[V_FIELDS + 2 * F_SPEC] != fields[F_SPEC] || ~got[V_FIELDS + 2 * F_SPEC + 1] != fields[F_SPEC]) {
        rc = gcomp__fail(GCOMP_ERR_MISMATCH, "ranks were configured with different codecs (this rank: '%s')",
                         gcomp_codec_spec(c->codec));
        goto fail;
    }
    gcomp__debug("rank %d/%d: codec %s, min_bytes %lld, ef %d", tp->rank, tp->size, gcomp_codec_spec(c->codec),
                 (long long)c->cfg.min_bytes, c->cfg.error_feedback);
    *out = c;
    return GCOMP_SUCCESS;
fail:
    gcomp_comm_destroy(c);
    return rc;
}

void gcomp_comm_destroy(gcomp_comm *c)
{
    if (!c) return;
    while (c->keys) {
        gcomp__key *k = c->keys;
        c->keys = k->next;
        free(k);
    }
    gcomp_codec_destroy(c->codec);
    if (c->tp) c->tp->destroy(c->tp);
    if (c->broken) {
        /* a timed-out ring exchange may still be sending from these buffers: MPI cannot
         * cancel sends, so they are leaked on purpose rather than freed under it */
        free(c);
        return;
    }
    free(c->x);
    free(c->acc);
    free(c->sbuf);
    free(c->rbuf);
    free(c->pay);
    free(c->tmp);
    free(c->res);
    free(c->spx);
    gcomp_codec_destroy(c->dense_codec);
    free(c);
}

int gcomp_comm_rank(const gcomp_comm *c) { return c ? c->tp->rank : -1; }
int gcomp_comm_size(const gcomp_comm *c) { return c ? c->tp->size : -1; }
const char *gcomp_comm_codec(const gcomp_comm *c) { return c ? gcomp_codec_spec(c->codec) : ""; }

static gcomp__key *find_key(const gcomp_comm *c, uint64_t key)
{
    for (gcomp__key *k = c->keys; k; k = k->next)
        if (k->key == key) return k;
    return NULL;
}

static gcomp_result get_key(gcomp_comm *c, uint64_t key, size_t count, gcomp__key **out)
{
    gcomp__key *k = find_key(c, key);
    if (!k) {
        k = calloc(1, sizeof *k);
        if (!k) return gcomp__fail(GCOMP_ERR_NOMEM, "cannot allocate state for key %llu", (unsigned long long)key);
        k->key = key;
        k->next = c->keys;
        c->keys = k;
    }
    k->count = count;
    *out = k;
    return GCOMP_SUCCESS;
}

/* Local checks; the result is shared with the other ranks before anyone acts on it. */
static gcomp_result check_args(const void *send, void *recv, size_t count, gcomp_dtype dtype, gcomp_op op,
                               struct CUstream_st *stream)
{
    if (count > 0 && (!send || !recv)) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_allreduce: NULL buffer with count %zu", count);
    if (!gcomp_dtype_size(dtype)) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_allreduce: invalid dtype %d", (int)dtype);
    if ((unsigned)op >= GCOMP_OP_COUNT) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_allreduce: invalid op %d", (int)op);
    if (stream) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_allreduce: a CUDA stream needs a GPU (NCCL) communicator");
    if (count > (size_t)1 << 40) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_allreduce: count %zu is too large", count);
    return GCOMP_SUCCESS;
}

static gcomp_result transport_failed(gcomp_comm *c, gcomp_result rc)
{
    if (rc == GCOMP_ERR_TIMEOUT || rc == GCOMP_ERR_TRANSPORT) c->broken = 1;
    return rc;
}

static gcomp_result agree(gcomp_comm *c, gcomp_result local, size_t count, gcomp_dtype dtype, gcomp_op op, double deadline)
{
    uint64_t fields[N_FIELDS], got[AGREE_N];
    char diff[128];
    vote mine;
    fields[F_SPEC] = spec_hash(c->codec);
    fields[F_COUNT] = count;
    fields[F_DTYPE] = (uint64_t)dtype;
    fields[F_OP] = (uint64_t)op;
    fields[F_MIN_BYTES] = (uint64_t)c->cfg.min_bytes;
    fields[F_VERSION] = GCOMP_VERSION;
    vote_init(&mine, c->tp->rank, local, 0, fields);
    GCOMP_CHECK(transport_failed(c, vote_share(c->tp, &mine, got, deadline)));
    if (got[V_FAIL]) return vote_failure(&mine, got, "before the call started (its arguments or buffers)");
    vote_differences(&mine, got, diff, sizeof diff);
    if (diff[0])
        return gcomp__fail(GCOMP_ERR_MISMATCH, "ranks disagree on the call's %s (this rank: count %zu dtype %d op %d "
                                               "min_bytes %lld codec '%s')",
                           diff, count, (int)dtype, (int)op, (long long)c->cfg.min_bytes, gcomp_codec_spec(c->codec));
    return GCOMP_SUCCESS;
}

/* fp32 view of the input; f16/bf16 are widened and AVG on the dense ring is pre-scaled so
 * the wire never carries sums larger than the result. */
static int needs_copy(gcomp_dtype dtype, float prescale) { return dtype != GCOMP_F32 || prescale != 1.0f; }

static void prepare_input(gcomp_comm *c, const void *send, size_t count, gcomp_dtype dtype, float prescale,
                          const float **x)
{
    float *dst = c->x;
    if (!needs_copy(dtype, prescale)) {
        *x = send;
        return;
    }
    if (dtype == GCOMP_F32)
        for (size_t i = 0; i < count; i++) dst[i] = ((const float *)send)[i] * prescale;
    else if (dtype == GCOMP_F16)
        for (size_t i = 0; i < count; i++) dst[i] = gcomp_f16_to_f32(((const uint16_t *)send)[i]) * prescale;
    else
        for (size_t i = 0; i < count; i++) dst[i] = gcomp_bf16_to_f32(((const uint16_t *)send)[i]) * prescale;
    *x = dst;
}

static void store_output(const float *res, void *recv, size_t count, gcomp_dtype dtype)
{
    if (dtype == GCOMP_F16)
        for (size_t i = 0; i < count; i++) ((uint16_t *)recv)[i] = gcomp_f32_to_f16(res[i]);
    else if (dtype == GCOMP_BF16)
        for (size_t i = 0; i < count; i++) ((uint16_t *)recv)[i] = gcomp_f32_to_bf16(res[i]);
}

static gcomp_schedule pick_schedule(const gcomp_comm *c, size_t raw_bytes)
{
    uint32_t caps = gcomp__codec_chain(c->codec)->stages[0].vt->caps;
    if (c->tp->size == 1 || raw_bytes < (uint64_t)c->cfg.min_bytes) return GCOMP_SCHED_BYPASS;
    if (caps & GCOMP_CAP_INTEGER) return GCOMP_SCHED_INTEGER;
    if (caps & GCOMP_CAP_SPARSE) return GCOMP_SCHED_SPARSE;
    return GCOMP_SCHED_DENSE;
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

/* Residual slices of the key, and the call's step. The residual is committed only when no
 * rank saw a non-finite value and the result is finite (run_compressed), so it is
 * double-buffered, except for a GCOMP_CAP_RESIDUAL_IN_PLACE codec on the integer ring
 * (TernGrad): that ring writes the residual only when every shared scale is finite, the
 * same decision on every rank, and with finite scales the fp32 result is finite (the ring
 * refuses scales whose N-fold sum would overflow). An f16/bf16 output can still overflow
 * where fp32 did not, so those double-buffer too; so do the other schedules, where a
 * partial sum can overflow after this rank's encode wrote its residual. */
static gcomp_result acquire_residual(gcomp_comm *c, gcomp__key *k, gcomp_schedule sched, gcomp_dtype dtype,
                                     gcomp__call *call, gcomp__residual **res)
{
    int in_place = (gcomp__codec_chain(c->codec)->stages[0].vt->caps & GCOMP_CAP_RESIDUAL_IN_PLACE) != 0 &&
                   sched == GCOMP_SCHED_INTEGER && dtype == GCOMP_F32;
    size_t count = call->count;
    uint64_t key = k->key;
    *res = NULL;
    if (!c->cfg.error_feedback) {
        /* the stochastic rounding must move on every call, or the same input rounds the same
         * way forever and the average over steps never converges */
        call->step = key == GCOMP_KEY_NONE ? c->nokey_step++ : k->step++;
        return GCOMP_SUCCESS;
    }
    GCOMP_CHECK(gcomp__residual_acquire(gcomp__codec_residuals(c->codec), key, count, !in_place, res));
    call->r_in = (*res)->buf[(*res)->cur];
    call->r_out = in_place ? call->r_in : (*res)->buf[(*res)->cur ^ 1];
    call->step = (*res)->step++;
    return GCOMP_SUCCESS;
}

/* Everything a call may allocate, done before the ranks agree to run it. */
typedef struct call_plan {
    gcomp_schedule sched;
    float prescale;
    gcomp__residual *res;
    gcomp__key *key;
} call_plan;

static gcomp_result prepare_call(gcomp_comm *c, gcomp__call *call, call_plan *plan, uint64_t key, gcomp_dtype dtype,
                                 gcomp_op op)
{
    size_t count = call->count;
    if (c->fault == GCOMP__FAULT_ALLOC) {
        c->fault = GCOMP__FAULT_NONE;
        return gcomp__fail(GCOMP_ERR_NOMEM, "injected allocation failure (test hook)");
    }
    GCOMP_CHECK(get_key(c, key, count, &plan->key));
    plan->sched = pick_schedule(c, count * gcomp_dtype_size(dtype));
    plan->prescale = (op == GCOMP_AVG && plan->sched == GCOMP_SCHED_DENSE) ? 1.0f / (float)c->tp->size : 1.0f;
    if (plan->sched == GCOMP_SCHED_BYPASS || needs_copy(dtype, plan->prescale))
        GCOMP_CHECK(gcomp__reserve(&c->x, &c->x_cap, count * sizeof(float)));
    if (plan->sched == GCOMP_SCHED_BYPASS) return GCOMP_SUCCESS;
    if (dtype != GCOMP_F32) GCOMP_CHECK(gcomp__reserve(&c->res, &c->res_cap, count * sizeof(float)));
    GCOMP_CHECK(acquire_residual(c, plan->key, plan->sched, dtype, call, &plan->res));
    if (plan->sched == GCOMP_SCHED_INTEGER) return gcomp__sched_integer_prepare(call);
    if (plan->sched == GCOMP_SCHED_SPARSE) return gcomp__sched_sparse_prepare(call);
    return gcomp__sched_dense_prepare(call, c->codec);
}

/* The uncompressed path: exact fp32 sum through the transport's own allreduce. */
static gcomp_result run_bypass(gcomp_comm *c, const void *send, void *recv, size_t count, gcomp_dtype dtype, gcomp_op op,
                               double deadline)
{
    float *buf = c->x;
    if (dtype == GCOMP_F32) {
        buf = recv;
        if (send != recv) memcpy(recv, send, count * sizeof(float));
    } else {
        const float *x;
        prepare_input(c, send, count, dtype, 1.0f, &x);
    }
    GCOMP_CHECK(transport_failed(c, c->tp->allreduce_sum_f32(c->tp, buf, count, deadline)));
    if (op == GCOMP_AVG) gcomp_divide_f32(buf, count, (float)c->tp->size);
    store_output(buf, recv, count, dtype);
    return GCOMP_SUCCESS;
}

/* 1 if recv (count elements of dtype) holds no NaN/Inf. Branch-free so it vectorises. */
static int output_finite(const void *recv, size_t count, gcomp_dtype dtype)
{
    uint32_t bad = 0;
    if (dtype == GCOMP_F32) {
        const uint32_t *b = recv;
        for (size_t i = 0; i < count; i++) bad |= (b[i] & 0x7f800000u) == 0x7f800000u;
    } else {
        const uint16_t *h = recv;
        uint16_t e = dtype == GCOMP_F16 ? 0x7c00u : 0x7f80u;
        for (size_t i = 0; i < count; i++) bad |= (h[i] & e) == e;
    }
    return !bad;
}

/* After a compressed schedule the ranks agree on whether any of them failed locally and
 * whether any saw a non-finite value (its encode's input, or the result: an fp16 sum can
 * overflow although every input was finite). *nonfinite is then the same on every rank. */
static gcomp_result agree_outcome(gcomp_comm *c, gcomp__call *call, int local_nonfinite, int *nonfinite)
{
    uint64_t got[AGREE_N];
    vote mine;
    double t0 = gcomp__now();
    vote_init(&mine, c->tp->rank, call->error, local_nonfinite, NULL);
    GCOMP_CHECK(transport_failed(c, vote_share(c->tp, &mine, got, call->deadline)));
    call->st->agree_s += gcomp__now() - t0;
    *nonfinite = got[V_NONFINITE] != 0;
    if (got[V_FAIL]) return vote_failure(&mine, got, "during the allreduce");
    return GCOMP_SUCCESS;
}

static gcomp_result run_compressed(gcomp_comm *c, gcomp__call *call, const call_plan *plan, const void *send, void *recv,
                                   gcomp_dtype dtype, gcomp_op op)
{
    size_t count = call->count;
    int local_nonfinite = 0, nonfinite = 0;
    gcomp_result rc;
    prepare_input(c, send, count, dtype, plan->prescale, &call->x);
    call->result = dtype == GCOMP_F32 ? (float *)recv : (float *)c->res;
    call->divisor = op == GCOMP_AVG && plan->sched != GCOMP_SCHED_DENSE ? (float)c->tp->size : 1.0f;
    if (plan->sched == GCOMP_SCHED_INTEGER) rc = gcomp__sched_integer(call);
    else if (plan->sched == GCOMP_SCHED_SPARSE) rc = gcomp__sched_sparse(call);
    else rc = gcomp__sched_dense(call, c->codec, 1);
    GCOMP_CHECK(transport_failed(c, rc));
    if (!call->error) {
        if (call->divisor != 1.0f && !call->divided) gcomp_divide_f32(call->result, count, call->divisor);
        store_output(call->result, recv, count, dtype);
        local_nonfinite = call->nonfinite || !output_finite(recv, count, dtype);
    }
    GCOMP_CHECK(agree_outcome(c, call, local_nonfinite, &nonfinite));
    /* the residual follows the result, the same decision on every rank: a non-finite step
     * (a loss scaler skips it) leaves it exactly as it was */
    if (nonfinite) call->st->nonfinite_calls++;
    else if (plan->res && call->r_out != call->r_in) gcomp__residual_commit(plan->res);
    call->st->compressed_calls++;
    return GCOMP_SUCCESS;
}

gcomp_result gcomp_allreduce(gcomp_comm *c, const void *send, void *recv, size_t count, gcomp_dtype dtype, gcomp_op op,
                             uint64_t key, struct CUstream_st *stream)
{
    gcomp_comm_stats st;
    gcomp__call call;
    call_plan plan;
    gcomp_result local;
    double t0 = gcomp__now(), t_agree;
    if (!c) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_allreduce: comm is NULL");
    if (c->broken) return gcomp__fail(GCOMP_ERR_COMM_INVALID, "communicator is unusable after an earlier timeout or transport error");
    memset(&st, 0, sizeof st);
    memset(&call, 0, sizeof call);
    memset(&plan, 0, sizeof plan);
    call.comm = c;
    call.count = count;
    call.deadline = t0 + 1e-3 * (double)c->cfg.timeout_ms;
    call.st = &st;
    local = check_args(send, recv, count, dtype, op, stream);
    if (local == GCOMP_SUCCESS && count > 0) local = prepare_call(c, &call, &plan, key, dtype, op);
    t_agree = gcomp__now();
    GCOMP_CHECK(agree(c, local, count, dtype, op, call.deadline));
    st.agree_s = gcomp__now() - t_agree;
    if (count == 0) return GCOMP_SUCCESS;
    st.calls = 1;
    st.raw_bytes = count * gcomp_dtype_size(dtype);
    st.baseline_bytes = (uint64_t)(2.0 * (c->tp->size - 1) / c->tp->size * (double)st.raw_bytes);
    if (plan.sched == GCOMP_SCHED_BYPASS) {
        GCOMP_CHECK(run_bypass(c, send, recv, count, dtype, op, call.deadline));
        st.nonfinite_calls = !output_finite(recv, count, dtype); /* the same result on every rank */
        st.wire_bytes = st.baseline_bytes;
        st.comm_s = gcomp__now() - t0;
        st.last_schedule = GCOMP_SCHED_BYPASS;
    } else {
        GCOMP_CHECK(run_compressed(c, &call, &plan, send, recv, dtype, op));
    }
    add_stats(&plan.key->stats, &st);
    add_stats(&c->stats, &st);
    if (gcomp__debug_enabled())
        gcomp__debug("rank %d key %llu: %s, %zu elements, %llu wire bytes, %.3f ms", c->tp->rank, (unsigned long long)key,
                     gcomp_schedule_name(st.last_schedule), count, (unsigned long long)st.wire_bytes,
                     1e3 * (gcomp__now() - t0));
    return GCOMP_SUCCESS;
}

gcomp_result gcomp__ring_start(gcomp__call *call, const void *sbuf, size_t sbytes, void *rbuf, size_t rcap)
{
    gcomp_comm *c = call->comm;
    gcomp__transport *tp = c->tp;
    if (call->error) sbytes = 0;
    if (c->fault == GCOMP__FAULT_TRUNCATE_WIRE && sbytes > 0) {
        c->fault = GCOMP__FAULT_NONE;
        sbytes--;
    }
    call->st->wire_bytes += sbytes;
    return tp->start_sendrecv(tp, (tp->rank + 1) % tp->size, sbuf, sbytes, (tp->rank + tp->size - 1) % tp->size, rbuf,
                              rcap);
}

gcomp_result gcomp__ring_finish(gcomp__call *call, size_t *rbytes)
{
    double t0 = gcomp__now();
    GCOMP_CHECK(call->comm->tp->finish_sendrecv(call->comm->tp, rbytes, call->deadline));
    call->st->comm_s += gcomp__now() - t0;
    return GCOMP_SUCCESS;
}

gcomp_result gcomp__ring_exchange(gcomp__call *call, const void *sbuf, size_t sbytes, void *rbuf, size_t rcap,
                                  size_t *rbytes)
{
    GCOMP_CHECK(gcomp__ring_start(call, sbuf, sbytes, rbuf, rcap));
    return gcomp__ring_finish(call, rbytes);
}

void gcomp__comm_inject_fault(gcomp_comm *c, int fault)
{
    if (c) c->fault = fault;
}

gcomp_result gcomp_comm_stats_get(const gcomp_comm *c, gcomp_comm_stats *out)
{
    if (!c || !out) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_comm_stats_get: NULL argument");
    *out = c->stats;
    return GCOMP_SUCCESS;
}

gcomp_result gcomp_comm_key_stats(const gcomp_comm *c, uint64_t key, gcomp_comm_stats *out)
{
    const gcomp__key *k;
    if (!c || !out) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_comm_key_stats: NULL argument");
    k = find_key(c, key);
    if (!k) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "key %llu was never used on this communicator", (unsigned long long)key);
    *out = k->stats;
    return GCOMP_SUCCESS;
}

gcomp_result gcomp_comm_stats_reset(gcomp_comm *c)
{
    if (!c) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_comm_stats_reset: NULL comm");
    memset(&c->stats, 0, sizeof c->stats);
    for (gcomp__key *k = c->keys; k; k = k->next) memset(&k->stats, 0, sizeof k->stats);
    return GCOMP_SUCCESS;
}
