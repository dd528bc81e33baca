/*
 * engine.c — one allreduce: check -> plan -> agree -> run -> finish (gcomp_allreduce and
 * gcomp_iallreduce queue it as a request, request.c, which runs it here).
 *
 *   check   the arguments, locally (shared with the other ranks before anyone acts on them)
 *   plan    the schedule from the codec's capabilities and the byte counts (bypass, dense
 *           ring or -- at N = 2, and for small calls at N = 4, 8, ... -- recursive doubling,
 *           integer ring, sparse gather, or sparse-as-dense: encode, decode, then the dense ring on the
 *           decoded input), the device of the buffers, the key's residual,
 *           and every workspace region the run will carve (sized now, so a failed
 *           allocation is an error on every rank instead of a hang)
 *   agree   the ranks agree on the call: on host transports (gcomp__comm_in_band) in the
 *           first N-1 messages of the call's ring (ring.h) -- the first log2 N on a butterfly
 *           communicator (recursive doubling's, gcomp__comm_butterfly) -- or of a pass of its
 *           own when the call has no such messages there (agree_in_band), with no collective; for the
 *           integer ring and on NCCL in one allreduce (comm.c), in which TernGrad's shared
 *           scales ride on host fp32 buffers (up to GCOMP__AGREE_SCALES of them: the default
 *           spec has one), else they take one allreduce of their own in the integer ring
 *   run     the schedule from the table below, which sees a gcomp__call, never the comm
 *   finish  result (/ N for AVG) into recv; the outcome every rank learnt from the ring's
 *           trailers (host buffers, ring.h) or from one more agreement (device buffers); the
 *           residual is committed unless some rank saw a non-finite value; stats
 *
 * Device buffers run the same steps on the device: the schedules through sched_codec.c (the
 * codec's CUDA ops), the engine's own element work through the device layer (widen, pre-scale,
 * divide, narrow, the non-finite check), all on the caller's stream; the workspace and the
 * key's residual live in device memory, and the transport is the communicator's one for
 * device memory (NCCL, or MPI through the staging decorator). What kernels find (a corrupt
 * payload, a non-finite encode or result) is read back once, at the end of the call, for the
 * outcome agreement (device buffers keep it: their flags live in device memory, and their
 * ring messages carry no trailer); then the residual is committed on the device and the stream waited for,
 * so the call returns with all its device work done.
 */
#include <stdio.h>
#include <stdlib.h>
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
    [GCOMP_SCHED_DOUBLING] = &gcomp__sched_doubling,
};
#define N_SCHEDULES (sizeof schedules / sizeof schedules[0])

const char *gcomp_schedule_name(gcomp_schedule s)
{
    if (s == GCOMP_SCHED_NONE) return "none";
    if ((unsigned)s < N_SCHEDULES && schedules[s]) return schedules[s]->name;
    return "unknown";
}

/* The buffer rules of gcomp.h: element-aligned (the schedules read them through float and
 * uint16_t pointers), and send and recv either the same (in place) or apart (the schedules
 * read send after writing recv). */
static gcomp_result check_buffers(const char *api, const void *send, const void *recv, size_t count, size_t esize)
{
    uintptr_t s = (uintptr_t)send, r = (uintptr_t)recv;
    size_t bytes = count * esize;
    if (count == 0) return GCOMP_SUCCESS;
    if ((s | r) & (esize - 1))
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "%s: send %p or recv %p is not aligned to its %zu-byte elements", api,
                           send, recv, esize);
    if (send != recv && (s < r ? r - s < bytes : s - r < bytes))
        return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                           "%s: send and recv partly overlap (%zu bytes each); pass the same pointer for in place", api,
                           bytes);
    return GCOMP_SUCCESS;
}

/* Local checks; the result is shared with the other ranks before anyone acts on it. */
static gcomp_result check_args(const gcomp__args *a)
{
    const char *api = a->api;
    size_t count = a->count;
    if (count > 0 && (!a->send || !a->recv))
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "%s: NULL buffer with count %zu", api, count);
    if (!gcomp_dtype_size(a->dtype))
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "%s: invalid dtype %d", api, (int)a->dtype);
    if ((unsigned)a->op >= GCOMP_OP_COUNT)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "%s: invalid op %d", api, (int)a->op);
    /* the stream is checked with the buffers' memory (place_call) */
    if (count > (size_t)1 << 40) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "%s: count %zu is too large", api, count);
    return check_buffers(api, a->send, a->recv, count, gcomp_dtype_size(a->dtype));
}

/* Everything the run needs, decided (and allocated) before the ranks agree to run it. */
typedef struct plan {
    gcomp_schedule sched;
    gcomp__key *key;
    gcomp__ef ef;      /* the key's residual, host buffers */
    gcomp__dev_ef def; /* the key's residual, device buffers */
    uint64_t *stepped; /* the step counter a call without a residual advanced (rolled back on failure) */
    int agreed;        /* every rank learnt that the call succeeded: a later local failure keeps the step */
    gcomp_dtype dtype;
    float prescale; /* AVG on the dense schedules (sums_prescaled): the wire never carries sums
                     * larger than the result */
    /* workspace regions of the engine itself (the schedule's follow them) */
    float *x;      /* fp32 input, when send is not one (f16/bf16, or pre-scaled) */
    float *result; /* fp32 result, when recv is not one */
    uint8_t *own;  /* sparse-as-dense: this rank's sparse payload */
    size_t own_cap;
    float *spx; /* sparse-as-dense: that payload decoded, the dense ring's input */
    /* device buffers: sparse-as-dense's encode scratch and residual block */
    void *own_scratch;
    gcomp_cuda_residual *own_res, *own_res_tmp;
    /* 1 when the result holds a NaN or Inf: device memory for device buffers, else hflag */
    uint32_t *flag;
    uint32_t hflag;
    /* device buffers whose codec runs on the host only (a byte stage, no CUDA ops), over a
     * host transport: the call runs on host copies of them (host workspace regions) */
    int via_host;
    const gcomp__device_ops *ddev; /* the buffers' own ops, for the copies */
    void *hsend, *hrecv;
} plan;

static int needs_copy(gcomp_dtype dtype, float prescale) { return dtype != GCOMP_F32 || prescale != 1.0f; }

/* AVG on the dense schedules scales each input by 1/N before its encode (so a partial sum
 * in f16 or bf16 overflows no sooner than the average would); the others divide the sum. */
static int sums_prescaled(gcomp_schedule s) { return s == GCOMP_SCHED_DENSE || s == GCOMP_SCHED_DOUBLING; }

static gcomp_schedule pick_schedule(const gcomp_comm *c, size_t count, size_t raw_bytes)
{
    const gcomp__stage *el = &gcomp__codec_chain(c->codec)->stages[0];
    uint32_t caps = el->vt->caps;
    int n = c->tp->size;
    if ((n == 1 && !c->cfg.compress_one_rank) || raw_bytes < (uint64_t)c->cfg.min_bytes) return GCOMP_SCHED_BYPASS;
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
    /* Two ranks: one exchange of the whole payload sends what the ring's two steps of half
     * of it send, with one encode of the input instead of the ring's one and a half (its sum
     * is not re-encoded) and no hop between (sched_doubling.c), at every size that one
     * message can carry (GCOMP__PAIR_MAX_BYTES; a function of (count, spec) only). */
    if (n == 2) {
        size_t whole = gcomp_codec_max_encoded_bytes(c->codec, count); /* 0: no bound (a user codec) */
        if (whole > 0 && whole <= GCOMP__PAIR_MAX_BYTES) return GCOMP_SCHED_DOUBLING;
    }
    /* small calls: fewer hops (log2 N) of the whole payload, where hops cost more than bytes
     * (sched_doubling.c); the limit is on the encoded elements (what each hop carries), again a
     * function of (count, N, spec) only. The count cap comes first: check_args bounds count
     * far below GCOMP_MAX_COUNT, which max_body_bytes may assume (gcomp_codec.h). */
    if (gcomp__ring_butterfly_steps(n) && count <= GCOMP__DOUBLING_MAX_COUNT &&
        el->vt->max_body_bytes(el->params, count) <= GCOMP__DOUBLING_MAX_BYTES)
        return GCOMP_SCHED_DOUBLING;
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

/* Device buffers: the call's status and tally blocks and the result's non-finite flag. */
static void layout_device_blocks(gcomp__call *call, plan *p)
{
    gcomp__workspace *ws = call->ws;
    p->flag = &p->hflag;
    if (!call->on_device) return;
    call->status = gcomp__ws_take(ws, sizeof(gcomp_cuda_status), "engine: device status");
    call->tally = gcomp__ws_take(ws, sizeof(gcomp__device_tally), "engine: device tally");
    p->flag = gcomp__ws_take(ws, sizeof(uint32_t), "engine: non-finite flag");
}

/* The engine's regions, then the schedule's: the same sequence sizing and carving (in the
 * buffers' workspace and, for device buffers, the host one for bookkeeping). */
static gcomp_result layout(gcomp_comm *c, gcomp__call *call, plan *p, int sizing)
{
    gcomp__workspace *ws = call->ws;
    size_t fbytes = call->count * sizeof(float);
    gcomp__ws_begin(ws, sizing);
    if (call->meta != ws) gcomp__ws_begin(call->meta, sizing);
    if (p->via_host) {
        size_t bytes = call->count * gcomp_dtype_size(p->dtype);
        p->hsend = gcomp__ws_take(ws, bytes, "engine: host copy of send");
        p->hrecv = gcomp__ws_take(ws, bytes, "engine: host copy of recv");
    }
    layout_device_blocks(call, p);
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
        if (call->on_device) {
            p->own_scratch =
                gcomp__ws_take(ws, gcomp__call_scratch_bytes(call, call->count, 1), "sparse-as-dense: encode scratch");
            p->own_res = gcomp__ws_take(ws, sizeof(gcomp_cuda_residual), "sparse-as-dense: residual block");
            p->own_res_tmp =
                gcomp__ws_take(call->meta, sizeof(gcomp_cuda_residual), "sparse-as-dense: residual block (host)");
        }
        d = dense_half(c, call, p);
        return sizing ? gcomp__sched_dense.prepare(&d) : GCOMP_SUCCESS;
    }
    return sizing ? schedules[p->sched]->prepare(call) : GCOMP_SUCCESS;
}

/* After a sizing layout: both workspaces hold it (allocating only when they must grow). */
static gcomp_result fit(gcomp__call *call)
{
    GCOMP_CHECK(gcomp__ws_fit(call->ws));
    return call->meta != call->ws ? gcomp__ws_fit(call->meta) : GCOMP_SUCCESS;
}

static gcomp_result check_carved(const gcomp__call *call)
{
    GCOMP_CHECK(gcomp__ws_check(call->ws));
    return call->meta != call->ws ? gcomp__ws_check(call->meta) : GCOMP_SUCCESS;
}

/* Where the buffers live: both on the host, or both on the current CUDA device; a stream
 * only with device buffers. Sets the call's device ops, workspaces and transport. */
static gcomp_result place_call(gcomp_comm *c, gcomp__call *call, const gcomp__args *a)
{
    const void *send = a->send, *recv = a->recv;
    struct CUstream_st *stream = a->stream;
    const gcomp__device_ops *rdev;
    int device = -1, capturing = 0;
    GCOMP_CHECK(gcomp__device_for(send, &call->dev, &device));
    GCOMP_CHECK(gcomp__device_for(recv, &rdev, NULL));
    if (rdev->kind != call->dev->kind)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                           "%s: send is %s memory but recv is %s memory: pass both on the same device", a->api,
                           call->dev->name, rdev->name);
    call->on_device = call->dev->kind != GCOMP__DEVICE_HOST;
    if (!call->on_device && stream)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                           "%s: a CUDA stream was given with host buffers: pass NULL (a stream goes with device "
                           "buffers)",
                           a->api);
    call->stream = stream;
    call->ws = &c->ws[call->dev->kind];
    if (c->emulate_device && !call->on_device) { /* test hook: the device path on host memory */
        call->on_device = 1;
        call->ws = &c->ws[GCOMP__DEVICE_CUDA];
    }
    call->meta = &c->ws[GCOMP__DEVICE_HOST];
    if (!call->ws->dev) call->ws->dev = call->dev;
    if (!call->meta->dev) call->meta->dev = &gcomp__device_host;
    GCOMP_CHECK(gcomp__comm_transport_for(c, a->api, call->dev, &call->ring.tp));
    /* one device per communicator: its transport (NCCL's communicator, the staging
     * decorator made at the first device call) and its device workspace belong to it */
    if (call->ring.tp->mem == GCOMP__MEM_CUDA && device >= 0 && device != call->ring.tp->device)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                           "%s: the buffers are memory of CUDA device %d, but this communicator works on device "
                           "%d: one device per communicator",
                           a->api, device, call->ring.tp->device);
    /* a call waits on the host between its steps, which a CUDA graph capture cannot hold:
     * refused here, before the agreement, so every rank returns the error */
    GCOMP_CHECK(call->dev->capturing(stream, &capturing));
    if (capturing)
        return gcomp__fail(GCOMP_ERR_UNSUPPORTED,
                           "%s: the stream is being captured into a CUDA graph; a gcomp call waits on the host "
                           "between its steps and cannot be captured",
                           a->api);
    call->ring.tp->stream = stream;
    return GCOMP_SUCCESS;
}

/* Device buffers with a host-only codec: the call becomes a host call on copies of them
 * (made once the call is agreed or, in the ring, is being agreed: run_call), its residual in
 * the host store. Keeps the reason
 * gcomp__codec_device_usable gave when the communicator has no host transport. */
static gcomp_result run_on_host_copies(gcomp_comm *c, const char *api, gcomp__call *call, plan *p)
{
    gcomp_result why = GCOMP_ERR_UNSUPPORTED;
    char msg[400];
    snprintf(msg, sizeof msg, "%s", gcomp_last_error());
    if (c->tp->mem != GCOMP__MEM_HOST)
        return gcomp__fail(why, "%s (and this communicator has no host transport to run it on host copies)", msg);
    gcomp__debug("rank %d: %s: the call runs on host copies of the device buffers", c->tp->rank, msg);
    p->via_host = 1;
    p->ddev = call->dev;
    call->dev = &gcomp__device_host;
    call->on_device = 0;
    call->ws = call->meta = &c->ws[GCOMP__DEVICE_HOST];
    return gcomp__comm_transport_for(c, api, call->dev, &call->ring.tp);
}

/* The key's residual for this call, on the buffers' device (a key met on the other one moves). */
static gcomp_result begin_residual(gcomp_comm *c, gcomp__call *call, plan *p, int in_place)
{
    if (call->on_device) {
        GCOMP_CHECK(gcomp__codec_dev_ef_begin(c->codec, call->dev, p->key->key, call->count, call->stream, &p->def));
        call->r_in = p->def.r_in;
        call->r_out = p->def.r_out;
        call->step = p->def.step;
        return GCOMP_SUCCESS;
    }
    GCOMP_CHECK(gcomp__codec_dev_move_to_host(c->codec, p->key->key));
    GCOMP_CHECK(gcomp__ef_begin(gcomp__codec_residuals(c->codec), p->key->key, call->count, in_place, &p->ef));
    call->r_in = p->ef.r_in;
    call->r_out = p->ef.r_out;
    call->step = p->ef.step;
    return GCOMP_SUCCESS;
}

static gcomp_result prepare_call(gcomp_comm *c, gcomp__call *call, plan *p, const gcomp__args *a)
{
    size_t count = call->count;
    gcomp_op op = a->op;
    uint64_t key = a->key;
    int in_place;
    GCOMP_CHECK(place_call(c, call, a));
    GCOMP_CHECK(gcomp__comm_key(c, key, &p->key));
    p->sched = pick_schedule(c, count, count * gcomp_dtype_size(p->dtype));
    /* device buffers take the codec's CUDA ops; a codec without them (or with a byte stage:
     * zstd) runs on host copies of the buffers when the communicator has a host transport,
     * and is refused otherwise (NCCL), before the call, on every rank */
    if (call->on_device && p->sched != GCOMP_SCHED_BYPASS &&
        gcomp__codec_device_usable(c->codec, a->api) != GCOMP_SUCCESS)
        GCOMP_CHECK(run_on_host_copies(c, a->api, call, p));
    p->prescale = (op == GCOMP_AVG && sums_prescaled(p->sched)) ? 1.0f / (float)c->tp->size : 1.0f;
    GCOMP_CHECK(layout(c, call, p, 1));
    GCOMP_CHECK(fit(call));
    if (p->sched == GCOMP_SCHED_BYPASS) return GCOMP_SUCCESS;
    if (!c->cfg.error_feedback || key == GCOMP_KEY_NONE || (call->vt->caps & GCOMP_CAP_EXACT)) {
        /* GCOMP_KEY_NONE means no error feedback, as for a codec object (gcomp.h); an exact
         * codec ("none") drops nothing, so its residual would stay zero while costing a
         * buffer the size of the gradient and a read and a write of it on every call. The
         * stochastic rounding must still move on every call, or the same input rounds the same
         * way forever and the average over steps never converges */
        p->stepped = key == GCOMP_KEY_NONE ? &c->nokey_step : &p->key->step;
        call->step = (*p->stepped)++;
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
    return begin_residual(c, call, p, in_place); /* device residuals: always double-buffered */
}

/* x = the fp32 view of send: widened by the device layer, pre-scaled for AVG on the dense schedules. */
static gcomp_result prepare_input(const gcomp__call *call, const plan *p, const void *send, const float **x)
{
    size_t count = call->count;
    if (!needs_copy(p->dtype, p->prescale)) {
        *x = send;
        return GCOMP_SUCCESS;
    }
    GCOMP_CHECK(call->dev->widen(send, p->dtype, count, p->x, call->stream));
    if (p->prescale != 1.0f) GCOMP_CHECK(call->dev->scale(p->x, count, p->prescale, call->stream));
    *x = p->x;
    return GCOMP_SUCCESS;
}

/* The uncompressed path: exact fp32 sum through the transport's own allreduce. AVG scales
 * each input by 1/N first, as the dense schedules do (and ncclAvg): the sum that travels is
 * never larger than the result, so finite inputs whose average is finite never give +-inf
 * where a sum of N of them would overflow. */
static gcomp_result run_bypass(gcomp_comm *c, gcomp__call *call, const plan *p, const void *send, void *recv,
                               gcomp_op op)
{
    size_t count = call->count;
    float *buf = p->dtype == GCOMP_F32 ? recv : p->x;
    gcomp__transport *tp = call->ring.tp;
    if (p->dtype == GCOMP_F32) {
        if (send != recv) GCOMP_CHECK(call->dev->copy_async(recv, send, count * sizeof(float), call->stream));
    } else {
        GCOMP_CHECK(call->dev->widen(send, p->dtype, count, buf, call->stream));
    }
    if (op == GCOMP_AVG) GCOMP_CHECK(call->dev->scale(buf, count, 1.0f / (float)tp->size, call->stream));
    GCOMP_CHECK(gcomp__comm_transport_failed(c, tp->allreduce_sum_f32(tp, buf, count, call->ring.deadline)));
    if (p->dtype != GCOMP_F32) GCOMP_CHECK(call->dev->narrow(buf, count, p->dtype, recv, call->stream));
    return call->dev->flag_nonfinite(recv, count, p->dtype, p->flag, call->stream);
}

/* The end of a call's device work: wait for the stream (within the deadline), then read back
 * what the kernels found -- the tally (first error, non-finite encodes, overflows) and the
 * result's non-finite flag -- in one more wait. Host buffers: the flag is already on the host. */
static gcomp_result collect(gcomp_comm *c, gcomp__call *call, const plan *p, gcomp__device_tally *t, uint32_t *flag)
{
    memset(t, 0, sizeof *t);
    *flag = p->hflag;
    if (!call->on_device) return GCOMP_SUCCESS;
    GCOMP_CHECK(gcomp__comm_transport_failed(c, gcomp__call_wait(call)));
    GCOMP_CHECK(call->dev->copy_async(t, call->tally, sizeof *t, call->stream));
    GCOMP_CHECK(call->dev->copy_async(flag, p->flag, sizeof *flag, call->stream));
    return gcomp__comm_transport_failed(c, gcomp__call_wait(call));
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
    size_t zero = 0;
    GCOMP_CHECK(gcomp__call_zero(call, p->spx, call->count * sizeof(float)));
    GCOMP_STEP(&call->ring, gcomp__call_res_blocks(call, 1, &zero, p->own_res_tmp, p->own_res));
    GCOMP_STEP(&call->ring, gcomp__call_encode(call, &ctx, call->x, 0, call->count, 1, p->own_res, p->own_scratch,
                                               p->own, p->own_cap, &bytes));
    call->ring.nonfinite = (int)ctx.nonfinite; /* known before the ring's first message */
    call->ring.st->overflow_count += ctx.overflow;
    call->ring.st->encode_s += gcomp__now() - t0;
    GCOMP_STEP(&call->ring, gcomp__call_decode_add(call, p->own, bytes, p->spx, call->count));
    d = dense_half(c, call, p); /* its ring is this call's (failure, news, trailer) */
    rc = gcomp__sched_dense.run(&d);
    call->ring = d.ring;
    call->divided = d.divided;
    return rc;
}

/* The residual follows the result, the same decision on every rank: a non-finite step (a
 * loss scaler skips it) or a failed call leaves it exactly as it was. Device buffers: the
 * commit is enqueued on the stream, which is then waited for. */
static gcomp_result end_residual(gcomp_comm *c, gcomp__call *call, plan *p, int keep)
{
    gcomp__ef_end(&p->ef, keep);
    if (!p->def.active) return GCOMP_SUCCESS;
    GCOMP_CHECK(gcomp__codec_dev_ef_end(c->codec, &p->def, keep, call->stream));
    return gcomp__comm_transport_failed(c, gcomp__call_wait(call));
}

/* The same for a call that failed: the residual kept (a key whose count changed keeps its old
 * residual and step: the ranks may not have agreed on the new count; a key the call created
 * is dropped again), and the step given back, also by a call without a residual, as on every
 * other rank: the ranks agreed on the failure. Not where another rank may have completed the
 * call (a failure after the outcome agreement, or one that broke the communicator): the step
 * stays advanced, as theirs. Calls of a communicator run one at a time, so no other call took
 * a step since. */
static void abandon_residual(gcomp_comm *c, gcomp__call *call, plan *p)
{
    int keep_step = p->agreed || c->broken;
    gcomp__ef_abandon(&p->ef, keep_step);
    gcomp__codec_dev_ef_abandon(c->codec, &p->def, keep_step, call->stream);
    if (p->stepped && !keep_step) *p->stepped = call->step;
}

/* Host buffers: the outcome the ring's trailers carried (ring.h) -- a failure anywhere, a
 * non-finite encode anywhere -- with no collective of its own; the result's non-finite flag
 * is the same on every rank (every rank decoded the same bytes). A failure found too late for
 * the trailers to reach every rank (a payload corrupted in transit in the last hops; MPI
 * guarantees integrity) leaves the ranks disagreeing on this call: this rank returns its
 * error and the communicator is broken, as after a timeout, so the disagreement cannot go on
 * silently (its next call is GCOMP_ERR_COMM_INVALID here, a timeout on the others). */
static gcomp_result outcome_from_ring(gcomp_comm *c, const gcomp__call *call, int result_nonfinite, int *nonfinite)
{
    const gcomp__ring *ring = &call->ring;
    gcomp__ring_outcome o = gcomp__ring_outcome_get(ring);
    gcomp_result rc = (gcomp_result)(o.fail >> 32);
    *nonfinite = o.nonfinite || result_nonfinite;
    if (o.late) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s", ring->error ? gcomp_last_error() : "a non-finite encode");
        c->broken = 1;
        return gcomp__fail(ring->error ? ring->error : GCOMP_ERR_INTERNAL,
                           "%s; found too late in the ring for the other ranks to hear of it, so they may have "
                           "succeeded: this communicator is now unusable",
                           msg);
    }
    if (!o.fail) return GCOMP_SUCCESS;
    if (ring->error && !ring->heard) return ring->error; /* this rank's own failure, its message kept */
    return gcomp__fail(rc, "rank %u failed during the allreduce: %s (%s); see that rank's gcomp_last_error()",
                       (unsigned)(uint32_t)o.fail, gcomp_result_name(rc), gcomp_strerror(rc));
}

static gcomp_result run_compressed(gcomp_comm *c, gcomp__call *call, plan *p, const void *send, void *recv, gcomp_op op)
{
    size_t count = call->count;
    int local_nonfinite = 0, nonfinite = 0;
    uint32_t flag = 0;
    gcomp__device_tally tally;
    double t0;
    gcomp_result rc;
    GCOMP_CHECK(layout(c, call, p, 0));
    GCOMP_CHECK(check_carved(call));
    if (call->on_device) {
        GCOMP_CHECK(call->dev->memset_async(call->tally, 0, sizeof *call->tally, call->stream));
        GCOMP_CHECK(call->dev->memset_async(p->flag, 0, sizeof *p->flag, call->stream));
    }
    GCOMP_CHECK(prepare_input(call, p, send, &call->x));
    call->result = p->dtype == GCOMP_F32 ? (float *)recv : p->result;
    call->divisor = op == GCOMP_AVG && !sums_prescaled(p->sched) ? (float)c->tp->size : 1.0f;
    if (p->sched == GCOMP_SCHED_SPARSE_AS_DENSE)
        rc = run_sparse_as_dense(c, call, p);
    else
        rc = schedules[p->sched]->run(call);
    GCOMP_CHECK(gcomp__comm_transport_failed(c, rc));
    if (!call->ring.error) {
        if (call->divisor != 1.0f && !call->divided)
            GCOMP_STEP(&call->ring, call->dev->divide(call->result, count, call->divisor, call->stream));
        if (p->dtype != GCOMP_F32)
            GCOMP_STEP(&call->ring, call->dev->narrow(call->result, count, p->dtype, recv, call->stream));
        if (!(call->finite && p->dtype == GCOMP_F32)) /* a narrowed result may overflow */
            GCOMP_STEP(&call->ring, call->dev->flag_nonfinite(recv, count, p->dtype, p->flag, call->stream));
    }
    GCOMP_CHECK(collect(c, call, p, &tally, &flag));
    if (!call->ring.error && tally.error) call->ring.error = gcomp__codec_dev_tally_error(call->codec, &tally);
    call->ring.st->overflow_count += tally.overflow;
    if (call->ring.trailer) {
        GCOMP_CHECK(outcome_from_ring(c, call, !call->ring.error && flag, &nonfinite));
    } else { /* device buffers: what the kernels found is read back above; one agreement */
        if (!call->ring.error) local_nonfinite = call->ring.nonfinite || tally.nonfinite_calls > 0 || flag;
        t0 = gcomp__now();
        GCOMP_CHECK(gcomp__comm_agree_outcome(c, call->ring.error, local_nonfinite, &nonfinite, call->ring.deadline));
        call->ring.st->agree_s += gcomp__now() - t0;
    }
    p->agreed = 1;
    if (nonfinite) call->ring.st->nonfinite_calls++;
    GCOMP_CHECK(end_residual(c, call, p, nonfinite));
    call->ring.st->compressed_calls++;
    return GCOMP_SUCCESS;
}

/* TernGrad on host fp32 buffers: its local scales of x = send + residual as |float bits|
 * (bits: GCOMP__AGREE_SCALES slots, zeroed), to ride in the call's agreement (comm.h)
 * instead of an allreduce of their own after it; *carried = 0 when the call has none to
 * carry (another schedule, device buffers or host copies of them, f16/bf16, too many
 * scales). A rank that carries none makes every rank share its scales in the ring. */
static gcomp_result scales_for_agreement(gcomp__call *call, const plan *p, const void *send, uint64_t *bits,
                                         int *carried)
{
    float s[GCOMP__AGREE_SCALES];
    gcomp_encode_ctx ctx = { 0 };
    size_t nb;
    double t0 = gcomp__now();
    *carried = 0;
    if (p->sched != GCOMP_SCHED_INTEGER || call->on_device || p->via_host || p->dtype != GCOMP_F32)
        return GCOMP_SUCCESS;
    nb = call->vt->num_scales(call->params, call->count);
    if (nb == 0 || nb > GCOMP__AGREE_SCALES) return GCOMP_SUCCESS;
    GCOMP_CHECK(GCOMP_CODEC_CALL(call->vt, local_scales,
                                 (call->params, &ctx, (const float *)send, call->r_in, call->count, s)));
    gcomp__scale_bits(s, nb, bits);
    call->ring.st->encode_s += gcomp__now() - t0;
    *carried = 1;
    return GCOMP_SUCCESS;
}

/* Host transports (gcomp__comm_in_band): the ranks agree on the call in its ring's first
 * N-1 messages (ring.h) instead of a collective before it -- on a butterfly communicator
 * (gcomp__comm_butterfly) in the first log2 N messages, with the butterfly's partners, which
 * only recursive doubling sends. A call whose schedule sends no such messages on the
 * communicator's transport -- bypassed, empty, on device buffers (or host copies of them),
 * failed before it could plan one, or a dense ring on a butterfly communicator -- runs
 * those messages on their own first, so every rank, whatever it planned, sends and receives
 * the same messages to the same peers before the verdict. *carried: the schedule's messages
 * carry the agreement (call->ring is begun); else it is done when this returns. */
static gcomp_result agree_in_band(gcomp_comm *c, gcomp__call *call, const plan *p, gcomp_result local,
                                  const gcomp__args *a, gcomp__agreement *ag, int *carried)
{
    uint64_t block[GCOMP__RING_AGREE_MAX];
    gcomp__transport *tp = call->ring.tp;
    gcomp_result rc;
    double comm_s;
    size_t n;
    /* host buffers, or host copies of device ones, on a transport with any-size receives;
     * whether it is so is in the fingerprint: ranks that differ in it stop at the verdict */
    int butterfly = gcomp__comm_butterfly(c);
    *carried = local == GCOMP_SUCCESS && a->count > 0 && p->sched != GCOMP_SCHED_BYPASS && !call->on_device &&
               tp->start_sendrecv_any && (!butterfly || p->sched == GCOMP_SCHED_DOUBLING);
    n = gcomp__comm_in_band_block(c, ag, local, a->count, a->dtype, a->op, call->on_device, *carried, block);
    gcomp__ring_begin(&call->ring, 1, c->call_seq++);
    if (butterfly) gcomp__ring_use_butterfly(&call->ring);
    gcomp__ring_agree(&call->ring, block, n, gcomp__comm_in_band_verdict, ag);
    if (*carried) return GCOMP_SUCCESS;
    if (c->tp->size == 1) return local;
    if (!c->agree_buf && !(c->agree_buf = malloc(2 * GCOMP__RING_TRAILER)))
        return gcomp__fail(GCOMP_ERR_NOMEM, "%s: out of memory", a->api); /* before any message: a hang */
    call->ring.tp = c->tp;
    comm_s = call->ring.st->comm_s;
    rc = gcomp__ring_agree_pass(&call->ring, c->agree_buf);
    call->ring.st->comm_s = comm_s; /* the pass is the call's agreement (agree_s), not its communication */
    call->ring.tp = tp;
    return gcomp__comm_transport_failed(c, rc);
}

/* An empty call on a host transport sent its agreement's pass and nothing else, so a failure
 * a rank found in the pass (a message without a valid trailer) would reach no rank after it:
 * reach more trailer-only hops carry it to every rank, and every rank returns it. A failure
 * found in those hops goes out too late and breaks this rank's communicator
 * (outcome_from_ring). Empty calls are rare; the hops cost reach 16-byte messages. */
static gcomp_result empty_call_outcome(gcomp_comm *c, gcomp__call *call)
{
    int nonfinite;
    for (int h = 0; h < call->ring.reach; h++) /* every rank, failed or not: the others expect them */
        GCOMP_CHECK(gcomp__comm_transport_failed(c, gcomp__ring_outcome_hop(&call->ring, c->agree_buf)));
    return outcome_from_ring(c, call, 0, &nonfinite);
}

/* A call of no elements moves nothing, but its agreement's messages went out: it counts in
 * the communicator's stats (calls, wire bytes, agree_s; its key holds nothing, so no key's)
 * and in the debug log. No schedule ran: last_schedule stays as it was. */
static gcomp_result count_empty_call(gcomp_comm *c, gcomp_comm_stats *st, uint64_t key, double t0)
{
    st->calls = 1;
    st->last_schedule = c->stats.last_schedule;
    gcomp__comm_add_stats(c, NULL, st);
    if (c->cfg.debug)
        gcomp__log("rank %d key %llu: empty call (0 elements), %llu wire bytes, %.3f ms", c->tp->rank,
                   (unsigned long long)key, (unsigned long long)st->wire_bytes, 1e3 * (gcomp__now() - t0));
    return GCOMP_SUCCESS;
}

/* One call, from start to end, on the thread that runs it (the caller's, or the
 * communicator's progress thread: request.c). Its deadline starts now, when it starts to
 * run, not when it was issued, so calls queued behind a slow one keep their whole timeout. */
static gcomp_result run_call(gcomp_comm *c, const gcomp__args *a, gcomp__call *callp, plan *pp)
{
    const void *send = a->send;
    void *recv = a->recv;
    size_t count = a->count;
    gcomp_dtype dtype = a->dtype;
    gcomp_op op = a->op;
    uint64_t key = a->key;
    gcomp_comm_stats st;
    gcomp__call *call = callp;
    plan *p = pp;
    gcomp_result local;
    int any_device = 0, carried = 0, scales_shared = 0, in_ring = 0, own_ring;
    gcomp_result found;
    gcomp__agreement ag;
    uint64_t scales[GCOMP__AGREE_SCALES] = { 0 };
    double t0 = gcomp__now(), t_agree;
    if (c->broken)
        return gcomp__fail(GCOMP_ERR_COMM_INVALID,
                           "communicator is unusable after an earlier timeout or transport error");
    memset(&st, 0, sizeof st);
    call->ring.tp = c->tp;
    call->ring.rank = c->tp->rank;
    call->ring.size = c->tp->size;
    call->ring.deadline = t0 + 1e-3 * (double)c->cfg.timeout_ms;
    call->ring.st = &st;
    call->seed = c->cfg.seed;
    call->count = count;
    call_codec(call, c->codec);
    p->dtype = dtype;
    local = check_args(a);
    if (local == GCOMP_SUCCESS && count > 0) local = prepare_call(c, call, p, a);
    if (local == GCOMP_SUCCESS && count > 0) local = scales_for_agreement(call, p, send, scales, &carried);
    t_agree = gcomp__now();
    if (gcomp__comm_in_band(c)) {
        GCOMP_CHECK(agree_in_band(c, call, p, local, a, &ag, &in_ring));
        any_device = call->on_device; /* the ranks agree on it, or the call stopped */
    } else {
        GCOMP_CHECK(gcomp__comm_agree_call(c, local, count, dtype, op, call->on_device, carried ? scales : NULL,
                                           &scales_shared, &any_device, call->ring.deadline));
    }
    st.agree_s = gcomp__now() - t_agree;
    call->agreed_scales = scales_shared ? scales : NULL;
    if (count == 0) {
        if (gcomp__comm_in_band(c)) GCOMP_CHECK(empty_call_outcome(c, call));
        return count_empty_call(c, &st, key, t0);
    }
    /* a failure this rank found in the agreement's own pass (a message without a valid
     * trailer) reached only some ranks there: it goes on as this rank's failure in the
     * schedule's messages (or its end-of-call agreement), so every rank hears of it -- set
     * after the host copies' regions are carved below, which a failure would skip */
    found = call->ring.heard ? GCOMP_SUCCESS : call->ring.error;
    own_ring = p->sched != GCOMP_SCHED_BYPASS && !in_ring; /* the schedule's ring begins here */
    /* the outcome rides in the ring's messages when every rank's buffers are host memory
     * (ring.h); a rank with device buffers makes every rank use the end-of-call agreement */
    if (own_ring)
        gcomp__ring_begin(&call->ring, !any_device && !call->on_device, c->call_seq++);
    if (p->via_host) { /* the device buffers' bytes to host memory, ordered after the stream's work */
        size_t bytes = count * gcomp_dtype_size(dtype);
        /* a local failure here is this rank's error in the run's outcome agreement (GCOMP_STEP),
         * not a return that leaves the other ranks waiting */
        GCOMP_STEP(&call->ring, layout(c, call, p, 0)); /* carve the copies' regions (the run carves the same again) */
        GCOMP_STEP(&call->ring, check_carved(call));
        GCOMP_STEP(&call->ring, p->ddev->copy_async(p->hsend, send, bytes, a->stream));
        /* the wait too: a stream that does not finish in time breaks the communicator (its
         * copy may still land), but the ring still runs, empty, so the others hear of it */
        if (!call->ring.error)
            GCOMP_STEP(&call->ring, gcomp__comm_transport_failed(c, gcomp__call_wait_on(call, p->ddev, a->stream)));
        send = p->hsend;
        recv = p->hrecv;
    }
    if (own_ring && !call->ring.error) call->ring.error = found;
    st.calls = 1;
    st.raw_bytes = count * gcomp_dtype_size(dtype);
    st.baseline_bytes = (uint64_t)(2.0 * (c->tp->size - 1) / c->tp->size * (double)st.raw_bytes);
    if (p->sched == GCOMP_SCHED_BYPASS) {
        gcomp__device_tally tally;
        uint32_t flag = 0;
        if (call->ring.error) {
            /* the device buffer's copy to host failed: a bypass has no message of its own to
             * tell the others, and summing a stale copy would hand them a wrong result as a
             * success. Leave them to time out, as the copy's wait does, and break this side */
            c->broken = 1;
            return call->ring.error;
        }
        GCOMP_CHECK(layout(c, call, p, 0));
        if (call->on_device) GCOMP_CHECK(call->dev->memset_async(p->flag, 0, sizeof *p->flag, call->stream));
        GCOMP_CHECK(run_bypass(c, call, p, send, recv, op));
        GCOMP_CHECK(collect(c, call, p, &tally, &flag));
        st.nonfinite_calls = flag != 0; /* the same result on every rank */
        st.wire_bytes += st.baseline_bytes;
        st.comm_s = gcomp__now() - t0;
    } else {
        GCOMP_CHECK(run_compressed(c, call, p, send, recv, op));
    }
    if (p->via_host) { /* the result back to the device buffer, waited for */
        GCOMP_CHECK(p->ddev->copy_async(a->recv, p->hrecv, count * gcomp_dtype_size(dtype), a->stream));
        GCOMP_CHECK(gcomp__comm_transport_failed(c, gcomp__call_wait_on(call, p->ddev, a->stream)));
    }
    st.last_schedule = p->sched;
    p->key->count = count; /* only a call every rank agreed on changes what the key holds */
    gcomp__comm_add_stats(c, p->key, &st);
    if (c->cfg.debug) /* the communicator's own switch: gcomp_config.debug, else GCOMP_DEBUG */
        gcomp__log("rank %d key %llu: %s on %s, %zu elements, %llu wire bytes, %.3f ms", c->tp->rank,
                   (unsigned long long)key, gcomp_schedule_name(st.last_schedule), call->dev ? call->dev->name : "host",
                   count, (unsigned long long)st.wire_bytes, 1e3 * (gcomp__now() - t0));
    return GCOMP_SUCCESS;
}

gcomp_result gcomp__engine_run(gcomp_comm *c, const gcomp__args *a)
{
    gcomp__call call;
    plan p;
    gcomp_result rc;
    int prev = gcomp__device_current(); /* the thread's own, restored at the end */
    memset(&call, 0, sizeof call);
    memset(&p, 0, sizeof p);
    /* a call issued on another thread (gcomp_iallreduce) runs on the device that was current there */
    if (a->device >= 0) GCOMP_CHECK(gcomp__device_use(a->device));
    rc = run_call(c, a, &call, &p);
    /* a call that ends early leaves the residual and the step as they were (after one that
     * ended its residual there is nothing left to abandon) */
    if (rc != GCOMP_SUCCESS) abandon_residual(c, &call, &p);
    /* a user's thread runs calls too (gcomp_allreduce, gcomp_wait, destroy's drain): it
     * comes back on its own device */
    if (prev >= 0) (void)gcomp__device_use(prev);
    return rc;
}
