/*
 * schedule.h — the schedules: a table of {id, name, prepare, run} that the engine indexes by
 * gcomp_schedule (engine.c), and the call struct every schedule sees. A schedule sees the
 * ring, the codec object and its element codec's table, the workspace, the device and the
 * buffers -- never the communicator -- and calls neither the engine nor another schedule
 * (the engine's planner composes sparse-as-dense from an encode and the dense schedule).
 *
 *   sched_dense.c    the dense ring (summable codecs: none, fp16, bf16; top-k as dense)
 *   sched_integer.c  the integer ring (GCOMP_CAP_INTEGER: the codec's int_* entries)
 *   sched_sparse.c   the sparse gather (GCOMP_CAP_SPARSE: sparse_* entries, or decode-add)
 */
#ifndef GCOMP_SCHEDULE_H
#define GCOMP_SCHEDULE_H

#include "codec_internal.h"
#include "ring.h"
#include "workspace.h"

typedef struct gcomp__call {
    gcomp__ring ring;
    gcomp_codec *codec;           /* the codec object: chain, byte stages, payload headers */
    const gcomp_codec_vtable *vt; /* its element codec, on the call's device */
    const void *params;           /* the element codec's parameters */
    gcomp__workspace *ws;
    const gcomp__device_ops *dev;
    uint64_t seed;
    const float *x; /* fp32 input (pre-scaled for AVG on the dense ring) */
    float *result;  /* fp32 output, count elements */
    size_t count;
    float *r_in, *r_out; /* residual of the key, NULL without error feedback */
    uint64_t step;
    float divisor; /* AVG on the integer and sparse schedules: result = sum / divisor (else 1) */
    int divided;   /* the schedule applied divisor in its last pass over the result */
    int nonfinite; /* this rank's encode saw a non-finite value (or a shared scale is one) */
    int reencoded; /* x is already a decoded payload (sparse-as-dense): the dense ring's
                         * first encode neither keeps a residual nor reports non-finite */
} gcomp__call;

/* prepare lays out the call's workspace regions while the workspace is sizing (before the
 * ranks agree, so a failed allocation becomes an error on every rank); run lays them out
 * again, carving, and allocates nothing. Transport failures return at once; local failures
 * go to call->ring.error (GCOMP_STEP). run == NULL: the engine runs it itself. */
typedef struct gcomp__sched {
    gcomp_schedule id;
    const char *name;
    gcomp_result (*prepare)(gcomp__call *call);
    gcomp_result (*run)(gcomp__call *call);
} gcomp__sched;

extern const gcomp__sched gcomp__sched_dense;
extern const gcomp__sched gcomp__sched_integer;
extern const gcomp__sched gcomp__sched_sparse;

/* The encode context of a call for elements from `offset` on. */
static inline gcomp_encode_ctx gcomp__call_ctx(const gcomp__call *call, size_t offset)
{
    gcomp_encode_ctx ctx = { 0 };
    ctx.seed = call->seed;
    ctx.step = call->step;
    ctx.rank = (uint32_t)call->ring.rank;
    ctx.offset = offset;
    return ctx;
}

#endif
