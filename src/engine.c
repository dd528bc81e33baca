/*
 * engine.c — one allreduce: check -> plan -> agree -> run -> finish (gcomp_allreduce and
 * gcomp_iallreduce queue it as a request, request.c, which runs it here).
 *
 *   check   the arguments, locally (shared with the other ranks before anyone acts on them)
 *   plan    the schedule from the codec's capabilities and the byte counts (bypass, dense
 *           ring, integer ring, sparse gather, or sparse-as-dense: encode, decode, then the
 *           dense ring on the decoded input), the device of the buffers, the key's residual,
 *           and every workspace region the run will carve (sized now, so a failed
 *           allocation is an error on every rank instead of a hang)
 *   agree   the ranks agree on the call (comm.c)
 *   run     the schedule from the table below, which sees a gcomp__call, never the comm
 *   finish  result (/ N for AVG) into recv; the ranks agree on the outcome; the residual is
 *           committed unless some rank saw a non-finite value; stats
 */
#include <string.h>

#include "comm.h"
#include "schedule.h"

/* The schedules, indexed by gcomp_schedule. Bypass and sparse-as-dense are run here: the
 * first is the transport's own allreduce, the second a composition of two steps. */
static const gcomp__sched sched_bypass = { GCOMP_SCHED_BYPASS, "bypass", NULL, NULL };
static const gcomp__sched sched_sparse_as_dense = { GCOMP_SCHED_SPARSE_AS_DENSE, "sparse-as-dense-ring", NULL, NULL };
static const gcomp__sched *const schedules[] = {
    [GCOMP_SCHED_BYPASS] = &sched_bypass,
    [GCOMP_SCHED_DENSE] = &gcomp__sched_dense,
    [GCOMP_SCHED_INTEGER] = &gcomp__sched_integer,
    [GCOMP_SCHED_SPARSE] = &gcomp__sched_sparse,
    [GCOMP_SCHED_SPARSE_AS_DENSE] = &sched_sparse_as_dense,
};
#define N_SCHEDULES (sizeof schedules / sizeof schedules[0])

const char *gcomp_schedule_name(gcomp_schedule s)
{
    if (s == GCOMP_SCHED_NONE) return "none";
    if ((unsigned)s < N_SCHEDULES && schedules[s]) return schedules[s]->name;
    return "unknown";
}

/* Local checks; the result is shared with the other ranks before anyone acts on it. */
static gcomp_result check_args(const void *send, void *recv, size_t count, gcomp_dtype dtype, gcomp_op op,
                               struct CUstream_st *stream)
{
    if (count > 0 && (!send || !recv))
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_allreduce: NULL buffer with count %zu", count);
    if (!gcomp_dtype_size(dtype))
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_allreduce: invalid dtype %d", (int)dtype);
    if ((unsigned)op >= GCOMP_OP_COUNT)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_allreduce: invalid op %d", (int)op);
    if (stream)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_allreduce: a CUDA stream needs a GPU (NCCL) communicator");
    if (count > (size_t)1 << 40)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_allreduce: count %zu is too large", count);
    return GCOMP_SUCCESS;
}

/* Everything the run needs, decided (and allocated) before the ranks agree to run it. */
typedef struct plan {
    gcomp_schedule sched;
    gcomp__key *key;
    gcomp__ef ef;
    gcomp_dtype dtype;
    float prescale; /* AVG on the dense ring: the wire never carries sums larger than the result */
    /* workspace regions of the engine itself (the schedule's follow them) */
    float *x;      /* fp32 input, when send is not one (f16/bf16, or pre-scaled) */
    float *result; /* fp32 result, when recv is not one */
    uint8_t *own;  /* sparse-as-dense: this rank's sparse payload */
    size_t own_cap;
    float *spx; /* sparse-as-dense: that payload decoded, the dense ring's input */
} plan;

static int needs_copy(gcomp_dtype dtype, float prescale) { return dtype != GCOMP_F32 || prescale != 1.0f; }

static gcomp_schedule pick_schedule(const gcomp_comm *c, size_t count, size_t raw_bytes)
{
    uint32_t caps = gcomp__codec_chain(c->codec)->stages[0].vt->caps;
    int n = c->tp->size;
    if (n == 1 || raw_bytes < (uint64_t)c->cfg.min_bytes) return GCOMP_SCHED_BYPASS;
    if (caps & GCOMP_CAP_INTEGER) return GCOMP_SCHED_INTEGER;
    if (caps & GCOMP_CAP_SPARSE) {
        /* A gather forwards N-1 whole payloads (they do not shrink when summed); when that
         * is more than a dense fp32 ring sends, decode and run the dense ring instead. The
         * choice depends only on (count, N, spec), so every rank makes the same one. */
        size_t bound = (gcomp_codec_max_encoded_bytes(c->codec, count) + 7) & ~(size_t)7;
        if ((double)(n - 1) * (double)bound > 2.0 * (n - 1) / n * 4.0 * (double)count)
            return GCOMP_SCHED_SPARSE_AS_DENSE;
        return GCOMP_SCHED_SPARSE;
    }
    return GCOMP_SCHED_DENSE;
}

/* A call on codec's element codec (the whole call, or the dense half of sparse-as-dense). */
static void call_codec(gcomp__call *call, gcomp_codec *codec)
{
    const gcomp__stage *el = &gcomp__codec_chain(codec)->stages[0];
    call->codec = codec;
    call->vt = el->vt;
    call->params = el->params;
}

/* The dense half of sparse-as-dense: the fp32 ring over the decoded payload, no residual. */
static gcomp__call dense_half(gcomp_comm *c, const gcomp__call *call, const plan *p)
{
    gcomp__call d = *call;
    call_codec(&d, c->dense_codec);
    d.x = p->spx;
    d.r_in = d.r_out = NULL;
    d.reencoded = 1;
    return d;
}

/* The engine's regions, then the schedule's: the same sequence sizing and carving. */
static gcomp_result layout(gcomp_comm *c, gcomp__call *call, plan *p, int sizing)
{
    gcomp__workspace *ws = call->ws;
    size_t fbytes = call->count * sizeof(float);
    gcomp__ws_begin(ws, sizing);
    p->x = NULL;
    if (p->sched == GCOMP_SCHED_BYPASS ? p->dtype != GCOMP_F32 : needs_copy(p->dtype, p->prescale))
        p->x = gcomp__ws_take(ws, fbytes, "engine: fp32 input");
    if (p->sched == GCOMP_SCHED_BYPASS) return GCOMP_SUCCESS;
    p->result = p->dtype != GCOMP_F32 ? gcomp__ws_take(ws, fbytes, "engine: fp32 result") : NULL;
    if (p->sched == GCOMP_SCHED_SPARSE_AS_DENSE) {
        gcomp__call d;
        if (!c->dense_codec) GCOMP_CHECK(gcomp_codec_create("none", NULL, &c->dense_codec));
        p->own_cap = (gcomp_codec_max_encoded_bytes(c->codec, call->count) + 7) & ~(size_t)7;
        p->own = gcomp__ws_take(ws, p->own_cap, "sparse-as-dense: own payload");
        p->spx = gcomp__ws_take(ws, fbytes, "sparse-as-dense: decoded input");
        d = dense_half(c, call, p);
        return sizing ? gcomp__sched_dense.prepare(&d) : GCOMP_SUCCESS;
    }
    return sizing ? schedules[p->sched]->prepare(call) : GCOMP_SUCCESS;
}

static gcomp_result prepare_call(gcomp_comm *c, gcomp__call *call, plan *p, const void *send, uint64_t key, gcomp_op op)
{
    size_t count = call->count;
    int in_place;
    GCOMP_CHECK(gcomp__device_for(send, &call->dev, NULL));
    if (call->dev->kind != GCOMP__DEVICE_HOST)
        return gcomp__fail(GCOMP_ERR_UNSUPPORTED, "gcomp_allreduce: buffers in GPU memory need a GPU communicator");
    call->ws = &c->ws[call->dev->kind];
    if (!call->ws->dev) call->ws->dev = call->dev;
    GCOMP_CHECK(gcomp__comm_key(c, key, count, &p->key));
    p->sched = pick_schedule(c, count, count * gcomp_dtype_size(p->dtype));
    p->prescale = (op == GCOMP_AVG && p->sched == GCOMP_SCHED_DENSE) ? 1.0f / (float)c->tp->size : 1.0f;
    GCOMP_CHECK(layout(c, call, p, 1));
    GCOMP_CHECK(gcomp__ws_fit(call->ws));
    if (p->sched == GCOMP_SCHED_BYPASS) return GCOMP_SUCCESS;
    if (!c->cfg.error_feedback || key == GCOMP_KEY_NONE) {
        /* GCOMP_KEY_NONE means no error feedback, as for a codec object (gcomp.h). The
         * stochastic rounding must still move on every call, or the same input rounds the same
         * way forever and the average over steps never converges */
        call->step = key == GCOMP_KEY_NONE ? c->nokey_step++ : p->key->step++;
        return GCOMP_SUCCESS;
    }
    /* The residual is committed only when no rank saw a non-finite value and the result is
     * finite (run_compressed), so it is double-buffered, except for a
     * GCOMP_CAP_RESIDUAL_IN_PLACE codec on the integer ring (TernGrad): that ring writes the
     * residual only when every shared scale is finite, the same decision on every rank, and
     * with finite scales the fp32 result is finite (the ring refuses scales whose N-fold sum
     * would overflow). An f16/bf16 output can still overflow where fp32 did not, so those
     * double-buffer too; so do the other schedules, where a partial sum can overflow after
     * this rank's encode wrote its residual. */
    in_place =
        (call->vt->caps & GCOMP_CAP_RESIDUAL_IN_PLACE) != 0 && p->sched == GCOMP_SCHED_INTEGER && p->dtype == GCOMP_F32;
    GCOMP_CHECK(gcomp__ef_begin(gcomp__codec_residuals(c->codec), p->key->key, count, in_place, &p->ef));
    call->r_in = p->ef.r_in;
    call->r_out = p->ef.r_out;
    call->step = p->ef.step;
    return GCOMP_SUCCESS;
}

/* x = the fp32 view of send: widened by the device layer, pre-scaled for AVG on the dense ring. */
static gcomp_result prepare_input(const gcomp__call *call, const plan *p, const void *send, const float **x)
{
    size_t count = call->count;
    if (!needs_copy(p->dtype, p->prescale)) {
        *x = send;
        return GCOMP_SUCCESS;
    }
    GCOMP_CHECK(call->dev->widen(send, p->dtype, count, p->x, NULL));
    if (p->prescale != 1.0f)
        for (size_t i = 0; i < count; i++) p->x[i] *= p->prescale;
    *x = p->x;
    return GCOMP_SUCCESS;
}

/* The uncompressed path: exact fp32 sum through the transport's own allreduce. */
static gcomp_result run_bypass(gcomp_comm *c, const gcomp__call *call, const plan *p, const void *send, void *recv,
                               gcomp_op op)
{
    size_t count = call->count;
    float *buf = p->dtype == GCOMP_F32 ? recv : p->x;
    if (p->dtype == GCOMP_F32) {
        if (send != recv) GCOMP_CHECK(call->dev->copy_async(recv, send, count * sizeof(float), NULL));
    } else {
        GCOMP_CHECK(call->dev->widen(send, p->dtype, count, buf, NULL));
    }
    GCOMP_CHECK(gcomp__comm_transport_failed(c, c->tp->allreduce_sum_f32(c->tp, buf, count, call->ring.deadline)));
    if (op == GCOMP_AVG) GCOMP_CHECK(call->dev->divide(buf, count, (float)c->tp->size, NULL));
    if (p->dtype != GCOMP_F32) GCOMP_CHECK(call->dev->narrow(buf, count, p->dtype, recv, NULL));
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

/* Sparse-as-dense: this rank's sparse payload (residual fused) is decoded into a dense
 * fp32 input, and the dense ring with the "none" codec sums those. */
static gcomp_result run_sparse_as_dense(gcomp_comm *c, gcomp__call *call, const plan *p)
{
    gcomp__call d;
    gcomp_encode_ctx ctx = gcomp__call_ctx(call, 0);
    gcomp_result rc;
    size_t bytes = 0;
    double t0 = gcomp__now();
    GCOMP_CHECK(call->dev->memset_async(p->spx, 0, call->count * sizeof(float), NULL));
    GCOMP_STEP(&call->ring, gcomp__codec_encode_ctx(call->codec, &ctx, call->x, call->r_in, call->r_out, call->count,
                                                    p->own, p->own_cap, &bytes));
    call->nonfinite = (int)ctx.nonfinite;
    call->ring.st->overflow_count += ctx.overflow;
    call->ring.st->encode_s += gcomp__now() - t0;
    GCOMP_STEP(&call->ring, gcomp_codec_decode_add(call->codec, p->own, bytes, p->spx, call->count));
    d = dense_half(c, call, p);
    rc = gcomp__sched_dense.run(&d);
    call->ring.error = d.ring.error;
    call->nonfinite |= d.nonfinite;
    call->divided = d.divided;
    return rc;
}

static gcomp_result run_compressed(gcomp_comm *c, gcomp__call *call, plan *p, const void *send, void *recv, gcomp_op op)
{
    size_t count = call->count;
    int local_nonfinite = 0, nonfinite = 0;
    double t0;
    gcomp_result rc;
    GCOMP_CHECK(layout(c, call, p, 0));
    GCOMP_CHECK(gcomp__ws_check(call->ws));
    GCOMP_CHECK(prepare_input(call, p, send, &call->x));
    call->result = p->dtype == GCOMP_F32 ? (float *)recv : p->result;
    call->divisor = op == GCOMP_AVG && p->sched != GCOMP_SCHED_DENSE ? (float)c->tp->size : 1.0f;
    if (p->sched == GCOMP_SCHED_SPARSE_AS_DENSE)
        rc = run_sparse_as_dense(c, call, p);
    else
        rc = schedules[p->sched]->run(call);
    GCOMP_CHECK(gcomp__comm_transport_failed(c, rc));
    if (!call->ring.error) {
        if (call->divisor != 1.0f && !call->divided)
            GCOMP_CHECK(call->dev->divide(call->result, count, call->divisor, NULL));
        if (p->dtype != GCOMP_F32) GCOMP_CHECK(call->dev->narrow(call->result, count, p->dtype, recv, NULL));
        local_nonfinite = call->nonfinite || !output_finite(recv, count, p->dtype);
    }
    t0 = gcomp__now();
    GCOMP_CHECK(gcomp__comm_agree_outcome(c, call->ring.error, local_nonfinite, &nonfinite, call->ring.deadline));
    call->ring.st->agree_s += gcomp__now() - t0;
    /* the residual follows the result, the same decision on every rank: a non-finite step
     * (a loss scaler skips it) leaves it exactly as it was */
    if (nonfinite) call->ring.st->nonfinite_calls++;
    gcomp__ef_end(&p->ef, nonfinite);
    call->ring.st->compressed_calls++;
    return GCOMP_SUCCESS;
}

/* One call, from start to end, on the thread that runs it (the caller's, or the
 * communicator's progress thread: request.c). Its deadline starts now, when it starts to
 * run, not when it was issued, so calls queued behind a slow one keep their whole timeout. */
gcomp_result gcomp__engine_run(gcomp_comm *c, const gcomp__args *a)
{
    const void *send = a->send;
    void *recv = a->recv;
    size_t count = a->count;
    gcomp_dtype dtype = a->dtype;
    gcomp_op op = a->op;
    uint64_t key = a->key;
    gcomp_comm_stats st;
    gcomp__call call;
    plan p;
    gcomp_result local;
    double t0 = gcomp__now(), t_agree;
    if (c->broken)
        return gcomp__fail(GCOMP_ERR_COMM_INVALID,
                           "communicator is unusable after an earlier timeout or transport error");
    memset(&st, 0, sizeof st);
    memset(&call, 0, sizeof call);
    memset(&p, 0, sizeof p);
    call.ring.tp = c->tp;
    call.ring.rank = c->tp->rank;
    call.ring.size = c->tp->size;
    call.ring.deadline = t0 + 1e-3 * (double)c->cfg.timeout_ms;
    call.ring.st = &st;
    call.seed = c->cfg.seed;
    call.count = count;
    call_codec(&call, c->codec);
    p.dtype = dtype;
    local = check_args(send, recv, count, dtype, op, a->stream);
    if (local == GCOMP_SUCCESS && count > 0) local = prepare_call(c, &call, &p, send, key, op);
    t_agree = gcomp__now();
    GCOMP_CHECK(gcomp__comm_agree_call(c, local, count, dtype, op, call.ring.deadline));
    st.agree_s = gcomp__now() - t_agree;
    if (count == 0) return GCOMP_SUCCESS;
    st.calls = 1;
    st.raw_bytes = count * gcomp_dtype_size(dtype);
    st.baseline_bytes = (uint64_t)(2.0 * (c->tp->size - 1) / c->tp->size * (double)st.raw_bytes);
    if (p.sched == GCOMP_SCHED_BYPASS) {
        GCOMP_CHECK(layout(c, &call, &p, 0));
        GCOMP_CHECK(run_bypass(c, &call, &p, send, recv, op));
        st.nonfinite_calls = !output_finite(recv, count, dtype); /* the same result on every rank */
        st.wire_bytes = st.baseline_bytes;
        st.comm_s = gcomp__now() - t0;
    } else {
        GCOMP_CHECK(run_compressed(c, &call, &p, send, recv, op));
    }
    st.last_schedule = p.sched;
    gcomp__comm_add_stats(c, p.key, &st);
    if (c->cfg.debug) /* the communicator's own switch: gcomp_config.debug, else GCOMP_DEBUG */
        gcomp__log("rank %d key %llu: %s, %zu elements, %llu wire bytes, %.3f ms", c->tp->rank, (unsigned long long)key,
                   gcomp_schedule_name(st.last_schedule), count, (unsigned long long)st.wire_bytes,
                   1e3 * (gcomp__now() - t0));
    return GCOMP_SUCCESS;
}
