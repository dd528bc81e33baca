/*
 * test_staging.c — the engine's device path and the staging decorator, without a GPU.
 *
 *  - test_staging_golden: every schedule case of schedule_cases.h at 1-5 loopback ranks with
 *    the communicator's host transport wrapped in the staging decorator (host device ops:
 *    every message and the bypass's sum go through its bounce buffers) gives the checked-in
 *    result hashes of tests/golden/schedules_expected.h, as without it.
 *  - test_emulated_device: codecs whose `cuda` ops table is the CPU reference run on host
 *    memory (registered here as emu_*), on communicators whose host buffers take the engine's
 *    device path (gcomp__comm_emulate_device: device workspace and residual store, residual
 *    blocks, status and tally read back at the end, commit of the agreed decision, staging):
 *    results and residual checkpoints bit-identical to the host path of the same codec, at 1
 *    to 4 ranks, for the dense ring, the integer ring, the sparse gather and sparse-as-dense,
 *    f32/f16/bf16, SUM and AVG, and a step with a NaN input. This is the device path's logic;
 *    the kernels' equality with the CPU reference is test_cuda_*'s.
 *  - test_one_rank_forced: GCOMP_TEST_COMPRESS_ONE_RANK=1 makes one rank run the compressed
 *    schedules, and their result is then what a codec object's encode and decode give.
 *  - test_bounce_growth_waits, test_copy_in_deadline: the decorator over device ops whose
 *    stream is asynchronous (lazy_ops below: copies run at the next wait, as a GPU's would
 *    some time later): growing a bounce buffer never frees one a queued copy still reads, and
 *    the wait before the host exchange has the call's deadline (GCOMP_ERR_TIMEOUT on a stream
 *    that never finishes), never an unbounded one.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codecs/common.h"
#include "codecs/terngrad.h"
#include "comm.h"
#include "ring.h"
#include "loop_world.h"
#include "schedule_cases.h"
#include "test_util.h"
#include "golden/schedules_expected.h"

#define ONE_RANK_SWITCH "GCOMP_TEST_COMPRESS_ONE_RANK"
#define MAX_RANKS 5
#define STEPS 4

/* ---- codecs whose CUDA ops run on host memory ----------------------------------------------
 * Each emu_* codec is a built-in's CPU vtable under another name and wire id, with a `cuda`
 * table whose functions keep the CUDA ops' contract (residual as a gcomp_cuda_residual block
 * read at run time, status block out, nothing written after an error) by calling the CPU
 * reference on host memory. */

enum { EMU_NONE, EMU_FP16, EMU_BF16, EMU_TERNGRAD, EMU_TOPK, N_EMU };
static const char *const emu_base[N_EMU] = { "none", "fp16", "bf16", "terngrad", "topk" };
static gcomp_codec_vtable emu_vt[N_EMU];
static const gcomp_codec_vtable *base_vt[N_EMU];

static const float *res_in(const gcomp_cuda_residual *res) { return res ? res->buf[res->cur] : NULL; }
static float *res_out(const gcomp_cuda_residual *res)
{
    if (!res) return NULL;
    return res->buf[res->cur ^ 1u] ? res->buf[res->cur ^ 1u] : res->buf[res->cur];
}

static size_t emu_scratch(const void *params, size_t count)
{
    (void)params;
    (void)count;
    return 0;
}

static gcomp_result emu_encode(int which, const void *params, const gcomp_encode_ctx *ctx, const float *g,
                               const gcomp_cuda_residual *res, size_t count, uint8_t *body, size_t cap,
                               gcomp_cuda_status *st)
{
    const gcomp_codec_vtable *vt = base_vt[which];
    gcomp_encode_ctx c = *ctx;
    size_t w = 0;
    uint32_t flags = 0;
    gcomp_result rc;
    c.step = res ? res->step : ctx->step; /* as the kernels: the residual's step */
    c.nonfinite = 0;
    c.overflow = 0;
    c.state = vt->state_create ? vt->state_create(params) : NULL;
    rc = vt->encode(params, &c, g, res_in(res), res_out(res), count, body, cap, &w, &flags);
    if (vt->state_destroy) vt->state_destroy(c.state);
    st->body_bytes = w;
    st->flags = flags;
    st->nonfinite = c.nonfinite;
    st->overflow = c.overflow;
    return rc;
}

static gcomp_result emu_decode_add(int which, const void *params, const uint8_t *payload, size_t cap, float *acc,
                                   size_t count, gcomp_cuda_status *st)
{
    uint64_t body;
    if (st->error) return GCOMP_SUCCESS;
    body = gcomp_le_load_u64(payload + 24);
    if (cap < GCOMP_HEADER_BYTES || body > cap - GCOMP_HEADER_BYTES ||
        base_vt[which]->decode_add(params, gcomp_le_load_u32(payload + 8), payload + GCOMP_HEADER_BYTES, body, acc,
                                   count) != GCOMP_SUCCESS)
        st->error = GCOMP_ERR_CORRUPT;
    return GCOMP_SUCCESS;
}

#define EMU_CAST(W)                                                                                                 \
    static gcomp_result emu_encode_##W(const void *p, const gcomp_encode_ctx *ctx, const float *g,                 \
                                       const gcomp_cuda_residual *res, size_t n, uint8_t *body, size_t cap,       \
                                       void *scratch, gcomp_cuda_status *st, struct CUstream_st *s)               \
    {                                                                                                               \
        (void)scratch;                                                                                              \
        (void)s;                                                                                                    \
        return emu_encode(W, p, ctx, g, res, n, body, cap, st);                                                     \
    }                                                                                                               \
    static gcomp_result emu_decode_add_##W(const void *p, const uint8_t *payload, size_t cap, float *acc, size_t n, \
                                           gcomp_cuda_status *st, struct CUstream_st *s)                            \
    {                                                                                                               \
        (void)s;                                                                                                    \
        return emu_decode_add(W, p, payload, cap, acc, n, st);                                                      \
    }
EMU_CAST(0)
EMU_CAST(1)
EMU_CAST(2)
EMU_CAST(3)
EMU_CAST(4)

/* ---- TernGrad's integer ring ---- */
static gcomp_result emu_local_scales(const void *params, const float *g, const gcomp_cuda_residual *res, size_t count,
                                     float *scales, void *scratch, struct CUstream_st *s)
{
    gcomp_encode_ctx ctx;
    (void)scratch;
    (void)s;
    memset(&ctx, 0, sizeof ctx);
    return base_vt[EMU_TERNGRAD]->local_scales(params, &ctx, g, res_in(res), count, scales);
}

static gcomp_result emu_ternarise(const void *params, const gcomp_encode_ctx *ctx, const float *g,
                                  const gcomp_cuda_residual *res, size_t n, const float *scales, int8_t *t,
                                  gcomp_cuda_status *st, struct CUstream_st *s)
{
    const gcomp_terngrad_params *p = params;
    uint64_t B = p->bucket > 0 ? (uint64_t)p->bucket : 0, lo = ctx->offset;
    gcomp_encode_ctx c = *ctx;
    int bad = 0;
    (void)s;
    if (!n) return GCOMP_SUCCESS;
    for (uint64_t j = B ? lo / B : 0; j <= (B ? (lo + n - 1) / B : 0); j++) bad |= !isfinite(scales[j]);
    st->nonfinite = (uint32_t)bad; /* as k_check_scales: the residual is left alone then */
    c.step = res ? res->step : ctx->step;
    return base_vt[EMU_TERNGRAD]->int_ternarise(params, &c, g, res_in(res), bad ? NULL : res_out(res), n, scales, t);
}

static gcomp_result emu_sums_add_pack(const uint8_t *in, uint32_t m_in, const int8_t *t, size_t n, uint8_t *out,
                                      gcomp_cuda_status *st, struct CUstream_st *s)
{
    (void)s;
    if (gcomp__tg_sums_add_pack(in, m_in ? gcomp_tg_sum_bytes(n, m_in) : 0, m_in, t, n, out) != GCOMP_SUCCESS)
        st->error = GCOMP_ERR_CORRUPT;
    return GCOMP_SUCCESS;
}

static gcomp_result emu_sums_values(const void *params, const uint8_t *in, size_t lo, size_t n, uint32_t m,
                                    const float *scales, float divisor, float *out, gcomp_cuda_status *st,
                                    struct CUstream_st *s)
{
    const gcomp_codec_vtable *vt = base_vt[EMU_TERNGRAD];
    size_t sb = vt->int_scratch_bytes ? vt->int_scratch_bytes(params, n, m) : 0;
    void *scratch = malloc(sb ? sb : 1);
    (void)s;
    if (vt->int_sums_values(params, in, gcomp_tg_sum_bytes(n, m), lo, n, m, scales, divisor, out, scratch) !=
        GCOMP_SUCCESS)
        st->error = GCOMP_ERR_CORRUPT;
    free(scratch);
    return GCOMP_SUCCESS;
}

/* ---- top-k's gather: zero, decode-add in rank order, divide (what the kernel computes) ---- */
static gcomp_result emu_sum_payloads(const void *params, const uint8_t *const *payloads, int n, size_t cap,
                                     float *result, size_t count, float divisor, void *scratch, gcomp_cuda_status *st,
                                     struct CUstream_st *s)
{
    (void)scratch;
    (void)s;
    if (st->error) return GCOMP_SUCCESS;
    memset(result, 0, count * sizeof(float));
    for (int j = 0; j < n; j++) emu_decode_add(EMU_TOPK, params, payloads[j], cap, result, count, st);
    if (divisor != 1.0f) gcomp_divide_f32(result, count, divisor);
    return GCOMP_SUCCESS;
}

static gcomp_codec_cuda_ops emu_ops[N_EMU];

static void register_emulated(void)
{
    static int done;
    if (done) return;
    done = 1;
    for (int w = 0; w < N_EMU; w++) {
        static char names[N_EMU][16];
        base_vt[w] = gcomp_codec_find(emu_base[w]);
        assert_non_null(base_vt[w]);
        emu_vt[w] = *base_vt[w];
        snprintf(names[w], sizeof names[w], "emu_%s", emu_base[w]);
        emu_vt[w].name = names[w];
        emu_vt[w].wire_id = (uint16_t)(200 + w);
        emu_ops[w].scratch_bytes = emu_scratch;
        emu_vt[w].cuda = &emu_ops[w];
    }
    emu_ops[0].encode = emu_encode_0, emu_ops[0].decode_add = emu_decode_add_0;
    emu_ops[1].encode = emu_encode_1, emu_ops[1].decode_add = emu_decode_add_1;
    emu_ops[2].encode = emu_encode_2, emu_ops[2].decode_add = emu_decode_add_2;
    emu_ops[3].encode = emu_encode_3, emu_ops[3].decode_add = emu_decode_add_3;
    emu_ops[4].encode = emu_encode_4, emu_ops[4].decode_add = emu_decode_add_4;
    emu_ops[EMU_TERNGRAD].local_scales = emu_local_scales;
    emu_ops[EMU_TERNGRAD].ternarise = emu_ternarise;
    emu_ops[EMU_TERNGRAD].sums_add_pack = emu_sums_add_pack;
    emu_ops[EMU_TERNGRAD].sums_values = emu_sums_values;
    emu_ops[EMU_TOPK].sum_payloads = emu_sum_payloads;
    for (int w = 0; w < N_EMU; w++) {
        gcomp_result rc = gcomp_codec_register(&emu_vt[w]);
        if (rc != GCOMP_SUCCESS) fail_msg("register %s: %s", emu_vt[w].name, gcomp_last_error());
    }
}

/* ---- a run of one case on N loopback ranks ---------------------------------------------- */

enum { MODE_PLAIN, MODE_STAGED, MODE_EMULATED };

typedef struct run_case {
    const char *spec;
    size_t count;
    gcomp_dtype dtype;
    gcomp_op op;
    int nan_step; /* the step whose input holds a NaN on rank 0 (-1: none) */
} run_case;

typedef struct rank_job {
    loop_rank at; /* first: loop_run_world fills it */
    const run_case *c;
    int mode;
    gcomp_result rc;
    uint64_t hash[STEPS]; /* each step's result */
    uint64_t blob;        /* the residual checkpoint after the last step */
    size_t blob_grew;     /* its bytes minus the fresh communicator's */
    gcomp_comm_stats st;
} rank_job;

static void fill(const run_case *c, void *x, int rank, int step)
{
    uint64_t s = 1000003ull * (uint64_t)rank + 7919ull * (uint64_t)step + 17;
    for (size_t i = 0; i < c->count; i++) {
        float v = tu_gauss(&s) * 1.7f;
        if (c->dtype == GCOMP_F32)
            ((float *)x)[i] = v;
        else
            ((uint16_t *)x)[i] = c->dtype == GCOMP_F16 ? gcomp_f32_to_f16(v) : gcomp_f32_to_bf16(v);
    }
    if (step == c->nan_step && rank == 0) {
        if (c->dtype == GCOMP_F32)
            ((float *)x)[c->count / 3] = NAN;
        else
            ((uint16_t *)x)[c->count / 3] = c->dtype == GCOMP_F16 ? 0x7e00u : 0x7fc0u; /* quiet NaN of each */
    }
}

static void *run_rank(void *arg)
{
    rank_job *j = arg;
    const run_case *c = j->c;
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *comm = NULL;
    size_t bytes = c->count * gcomp_dtype_size(c->dtype), n = 0, n0 = 0;
    void *x = malloc(bytes + 8), *y = malloc(bytes + 8);
    cfg.codec = c->spec;
    cfg.min_bytes = 0;
    cfg.seed = 7;
    cfg.timeout_ms = 20000;
    j->rc = gcomp__comm_create_loop(j->at.w, j->at.rank, &cfg, &comm);
    if (j->rc == GCOMP_SUCCESS && j->mode == MODE_STAGED) j->rc = gcomp__comm_stage_host(comm);
    if (j->rc == GCOMP_SUCCESS && j->mode == MODE_EMULATED) j->rc = gcomp__comm_emulate_device(comm, "emu_none", 1);
    if (j->rc == GCOMP_SUCCESS) j->rc = gcomp_comm_residuals_save(comm, NULL, 0, &n0);
    for (int t = 0; t < STEPS && j->rc == GCOMP_SUCCESS; t++) {
        fill(c, x, j->at.rank, t);
        /* in place at the last step: the schedules must read send before writing recv */
        j->rc = gcomp_allreduce(comm, x, t == STEPS - 1 ? x : y, c->count, c->dtype, c->op, 42, NULL);
        j->hash[t] = sc_hash(SC_HASH_INIT, t == STEPS - 1 ? x : y, bytes);
    }
    if (j->rc == GCOMP_SUCCESS) j->rc = gcomp_comm_stats_get(comm, &j->st);
    if (j->rc == GCOMP_SUCCESS) j->rc = gcomp_comm_residuals_save(comm, NULL, 0, &n);
    if (j->rc == GCOMP_SUCCESS) {
        uint8_t *b = malloc(n);
        j->rc = gcomp_comm_residuals_save(comm, b, n, &n);
        j->blob = sc_hash(SC_HASH_INIT, b, n);
        j->blob_grew = n - n0;
        free(b);
    }
    if (j->rc != GCOMP_SUCCESS) fprintf(stderr, "rank %d (%s): %s\n", j->at.rank, c->spec, gcomp_last_error());
    gcomp_comm_destroy(comm);
    free(x);
    free(y);
    return NULL;
}

static void run(const run_case *c, int n, int mode, rank_job *jobs)
{
    memset(jobs, 0, sizeof(rank_job) * MAX_RANKS);
    for (int r = 0; r < n; r++) {
        jobs[r].c = c;
        jobs[r].mode = mode;
    }
    loop_run_world(n, run_rank, jobs, sizeof jobs[0]);
    for (int r = 0; r < n; r++)
        if (jobs[r].rc != GCOMP_SUCCESS)
            fail_msg("%s at %d ranks, mode %d: rank %d returned %s", c->spec, n, mode, r,
                     gcomp_result_name(jobs[r].rc));
}

/* ---- the staging decorator under the golden schedule cases ---- */

typedef struct golden_job {
    loop_rank at;
    const schedule_case *c;
    gcomp_result rc;
    uint64_t hash;
} golden_job;

static void *run_golden(void *arg)
{
    golden_job *j = arg;
    gcomp_config cfg = sc_config(j->c);
    gcomp_comm *comm = NULL;
    cfg.timeout_ms = 20000;
    j->hash = SC_HASH_INIT;
    j->rc = gcomp__comm_create_loop(j->at.w, j->at.rank, &cfg, &comm);
    if (j->rc == GCOMP_SUCCESS) j->rc = gcomp__comm_stage_host(comm);
    if (j->rc == GCOMP_SUCCESS) j->rc = sc_run_steps(comm, j->c, j->at.rank, &j->hash);
    gcomp_comm_destroy(comm);
    return NULL;
}

static void test_staging_golden(void **state)
{
    (void)state;
    for (size_t ci = 0; ci < SCHEDULE_N_CASES; ci++) {
        for (int n = 1; n <= MAX_RANKS; n++) {
            golden_job jobs[MAX_RANKS];
            uint64_t want = sc_expected_hash(schedule_cases[ci].name, n);
            memset(jobs, 0, sizeof jobs);
            for (int r = 0; r < n; r++) jobs[r].c = &schedule_cases[ci];
            loop_run_world(n, run_golden, jobs, sizeof jobs[0]);
            for (int r = 0; r < n; r++) {
                assert_int_equal(jobs[r].rc, GCOMP_SUCCESS);
                if (jobs[r].hash != want)
                    fail_msg("%s at %d ranks through the staging decorator: rank %d hash 0x%016llx, expected 0x%016llx",
                             schedule_cases[ci].name, n, r, (unsigned long long)jobs[r].hash, (unsigned long long)want);
            }
        }
    }
}

/* ---- the device path on host memory against the host path ---- */

static const run_case EMU_CASES[] = {
    { "emu_none", 10007, GCOMP_F32, GCOMP_AVG, -1 }, /* a dense ring at 4 ranks (40 KB encoded) */
    { "emu_none", 5003, GCOMP_F32, GCOMP_AVG, 1 },   /* recursive doubling at 4 ranks */
    { "emu_fp16", 10007, GCOMP_F32, GCOMP_SUM, 2 },
    { "emu_fp16", 5003, GCOMP_F16, GCOMP_AVG, -1 },
    { "emu_fp16", 40009, GCOMP_F32, GCOMP_AVG, 1 }, /* a dense ring at 4 ranks (above doubling's limit) */
    { "emu_bf16", 5003, GCOMP_BF16, GCOMP_SUM, 1 },
    { "emu_terngrad", 10007, GCOMP_F32, GCOMP_AVG, 2 },
    { "emu_terngrad:bucket=512", 5003, GCOMP_F32, GCOMP_SUM, -1 },
    { "emu_terngrad", 5003, GCOMP_BF16, GCOMP_SUM, -1 },
    { "emu_topk:ratio=0.01", 10007, GCOMP_F32, GCOMP_SUM, 2 },
    { "emu_topk:ratio=0.05,values=fp16", 5003, GCOMP_F16, GCOMP_AVG, -1 },
    { "emu_topk:ratio=1", 3001, GCOMP_F32, GCOMP_SUM, -1 }, /* sparse-as-dense from 2 ranks */
    /* a byte stage runs on host copies of device buffers */
    { "emu_fp16+zstd", 5003, GCOMP_F32, GCOMP_SUM, 2 },
    { "emu_none+zstd", 5003, GCOMP_F32, GCOMP_AVG, -1 }, /* exact: no residual on either path */
    { "emu_terngrad+zstd", 5003, GCOMP_F16, GCOMP_AVG, -1 },
};

static void test_emulated_device(void **state)
{
    (void)state;
    register_emulated();
    setenv(ONE_RANK_SWITCH, "1", 1); /* one rank runs the compressed schedules too */
    for (size_t ci = 0; ci < sizeof EMU_CASES / sizeof EMU_CASES[0]; ci++) {
        const run_case *c = &EMU_CASES[ci];
        gcomp_schedule last = GCOMP_SCHED_NONE;
        for (int n = 1; n <= 4; n++) {
            rank_job host[MAX_RANKS], dev[MAX_RANKS];
            run(c, n, MODE_PLAIN, host);
            run(c, n, MODE_EMULATED, dev);
            for (int r = 0; r < n; r++) {
                for (int t = 0; t < STEPS; t++)
                    if (dev[r].hash[t] != host[r].hash[t] || host[r].hash[t] != host[0].hash[t])
                        fail_msg("%s (dtype %d op %d) at %d ranks: rank %d step %d result differs (device path "
                                 "0x%016llx, host path 0x%016llx, host rank 0 0x%016llx)",
                                 c->spec, (int)c->dtype, (int)c->op, n, r, t, (unsigned long long)dev[r].hash[t],
                                 (unsigned long long)host[r].hash[t], (unsigned long long)host[0].hash[t]);
                if (dev[r].blob != host[r].blob)
                    fail_msg("%s at %d ranks: rank %d residual checkpoint differs between the paths", c->spec, n, r);
                /* an exact codec keeps no residual on either path (GCOMP_CAP_EXACT), the others one */
                if ((dev[r].blob_grew == 0) != (strncmp(c->spec, "emu_none", 8) == 0))
                    fail_msg("%s at %d ranks: the checkpoint grew by %zu bytes", c->spec, n, dev[r].blob_grew);
                assert_int_equal(dev[r].st.last_schedule, host[r].st.last_schedule);
                assert_int_equal(dev[r].st.compressed_calls, STEPS);
                /* host buffers add the ring's outcome trailers (ring.h); a byte stage runs
                 * on host copies, trailers included, on both paths. Besides TernGrad (whose
                 * agreement is a collective) the ranks agree in the ring's first messages on
                 * the host path, in a pass of their own on the emulated device path: its
                 * transports, host copies (+zstd) included, are staging decorators, which
                 * have no any-size receive (engine.c, agree_in_band) */
                {
                    int in_band = strstr(c->spec, "terngrad") == NULL;
                    /* dense codecs at 4 ranks agree on the butterfly: in recursive doubling's
                     * messages, or in a pass of their own before a dense ring */
                    int bfly = in_band && strstr(c->spec, "topk") == NULL;
                    int host_pass = bfly && gcomp__ring_butterfly_steps(n) > 0 &&
                                    host[r].st.last_schedule != GCOMP_SCHED_DOUBLING;
                    uint64_t host_agree = in_band ? STEPS * gcomp__ring_agree_bytes(n, bfly, host_pass) : 0;
                    uint64_t dev_agree = in_band ? STEPS * gcomp__ring_agree_bytes(n, bfly, 1) : 0;
                    uint64_t trailers =
                        strstr(c->spec, "+zstd") ? 0 : STEPS * gcomp__ring_trailer_bytes(host[r].st.last_schedule, n);
                    assert_int_equal(dev[r].st.wire_bytes - dev_agree + trailers, host[r].st.wire_bytes - host_agree);
                }
                assert_int_equal(dev[r].st.nonfinite_calls, host[r].st.nonfinite_calls);
                assert_int_equal(dev[r].st.overflow_count, host[r].st.overflow_count);
            }
            if (c->nan_step >= 0) assert_int_equal(host[0].st.nonfinite_calls, 1);
            last = host[0].st.last_schedule;
        }
        printf("  %-34s dtype %d op %d: 1-4 ranks (%s at 4): device path = host path\n", c->spec, (int)c->dtype,
               (int)c->op, gcomp_schedule_name(last));
    }
    unsetenv(ONE_RANK_SWITCH);
}

/* ---- a call the ranks disagree on changes no key's state ---- */

static const char *where_of(int mode) { return mode == MODE_EMULATED ? "device path" : "host path"; }

typedef struct keep_job {
    loop_rank at;
    const char *spec;
    int mode;
    gcomp_result first, failed, after;
    uint64_t before, since; /* hashes of the residual checkpoint before and after the failed call */
    uint64_t result;        /* of the call after it */
    /* a refused first call of another key: its result, the checkpoint's hash before and after
     * it, and that key's stats afterwards (it must hold nothing) */
    gcomp_result new_refused, new_stats;
    uint64_t empty, new_since;
} keep_job;

static uint64_t checkpoint_hash(gcomp_comm *comm)
{
    size_t n = 0;
    uint64_t h = 0;
    uint8_t *b;
    if (gcomp_comm_residuals_save(comm, NULL, 0, &n) != GCOMP_SUCCESS || !(b = malloc(n))) return 0;
    if (gcomp_comm_residuals_save(comm, b, n, &n) == GCOMP_SUCCESS) h = sc_hash(SC_HASH_INIT, b, n);
    free(b);
    return h;
}

/* Rank 1 calls key 42 with half the count the others use: every rank gets
 * GCOMP_ERR_MISMATCH, and rank 1's key must keep its residual, step and count (a count
 * change resets them only once the ranks have agreed on the call). First, the same refusal on
 * key 41's first call must leave no key 41 behind on any rank: no residual in the checkpoint
 * (before, each rank kept a zero one of its own count, so loading a checkpoint of key 41 was
 * refused on rank 1 alone), no stats. */
static void *run_keep(void *arg)
{
    keep_job *j = arg;
    run_case c = { j->spec, 6007, GCOMP_F32, GCOMP_SUM, -1 };
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *comm = NULL;
    float *x = malloc(c.count * sizeof(float)), *y = malloc(c.count * sizeof(float));
    cfg.codec = j->spec;
    cfg.min_bytes = 0;
    cfg.timeout_ms = 20000;
    j->first = gcomp__comm_create_loop(j->at.w, j->at.rank, &cfg, &comm);
    if (j->first == GCOMP_SUCCESS && j->mode == MODE_EMULATED) j->first = gcomp__comm_emulate_device(comm, "emu_none", 1);
    fill(&c, x, j->at.rank, 0);
    if (j->first == GCOMP_SUCCESS) {
        gcomp_comm_stats st;
        j->empty = checkpoint_hash(comm);
        j->new_refused =
            gcomp_allreduce(comm, x, y, j->at.rank == 1 ? c.count / 2 : c.count, GCOMP_F32, GCOMP_SUM, 41, NULL);
        j->new_since = checkpoint_hash(comm);
        j->new_stats = gcomp_comm_key_stats_get(comm, 41, &st);
    }
    if (j->first == GCOMP_SUCCESS) j->first = gcomp_allreduce(comm, x, y, c.count, GCOMP_F32, GCOMP_SUM, 42, NULL);
    j->before = checkpoint_hash(comm);
    fill(&c, x, j->at.rank, 1);
    j->failed = gcomp_allreduce(comm, x, y, j->at.rank == 1 ? c.count / 2 : c.count, GCOMP_F32, GCOMP_SUM, 42, NULL);
    j->since = checkpoint_hash(comm);
    j->after = gcomp_allreduce(comm, x, y, c.count, GCOMP_F32, GCOMP_SUM, 42, NULL);
    j->result = sc_hash(SC_HASH_INIT, y, c.count * sizeof(float));
    gcomp_comm_destroy(comm);
    free(x);
    free(y);
    return NULL;
}

static void test_mismatch_keeps_key_state(void **state)
{
    static const char *const specs[] = { "emu_fp16", "emu_terngrad", "emu_topk:ratio=0.01", "emu_topk:ratio=1" };
    (void)state;
    register_emulated();
    for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++) {
        for (int mode = MODE_PLAIN; mode <= MODE_EMULATED; mode += MODE_EMULATED - MODE_PLAIN) {
            for (int n = 2; n <= 4; n++) {
                keep_job jobs[MAX_RANKS];
                memset(jobs, 0, sizeof jobs);
                for (int r = 0; r < n; r++) jobs[r].spec = specs[k], jobs[r].mode = mode;
                loop_run_world(n, run_keep, jobs, sizeof jobs[0]);
                for (int r = 0; r < n; r++) {
                    const char *where = where_of(mode);
                    if (jobs[r].first != GCOMP_SUCCESS || jobs[r].failed != GCOMP_ERR_MISMATCH ||
                        jobs[r].after != GCOMP_SUCCESS)
                        fail_msg("%s, %s, %d ranks: rank %d returned %s, %s, %s (expected SUCCESS, MISMATCH, SUCCESS)",
                                 specs[k], where, n, r, gcomp_result_name(jobs[r].first),
                                 gcomp_result_name(jobs[r].failed), gcomp_result_name(jobs[r].after));
                    if (jobs[r].new_refused != GCOMP_ERR_MISMATCH || !jobs[r].empty ||
                        jobs[r].new_since != jobs[r].empty || jobs[r].new_stats != GCOMP_ERR_INVALID_ARG)
                        fail_msg("%s, %s, %d ranks: rank %d: a refused first call of a key returned %s and left %s "
                                 "(checkpoint %s, stats %s)",
                                 specs[k], where, n, r, gcomp_result_name(jobs[r].new_refused),
                                 jobs[r].new_since != jobs[r].empty ? "a residual" : "no residual",
                                 jobs[r].empty ? "saved" : "not saved", gcomp_result_name(jobs[r].new_stats));
                    if (jobs[r].result != jobs[0].result)
                        fail_msg("%s, %s, %d ranks: the call after the mismatch differs on rank %d", specs[k], where,
                                 n, r);
                }
                if (!jobs[1].before || jobs[1].since != jobs[1].before)
                    fail_msg("%s, %s, %d ranks: rank 1's residual checkpoint changed with a call every rank refused",
                             specs[k], where_of(mode), n);
            }
        }
        printf("  %-22s 2-4 ranks, host and device paths: a refused count change keeps the key's state, a refused "
               "first call leaves no key\n",
               specs[k]);
    }
}

/* ---- one rank, the compressed schedules forced on: the result is a codec round trip ---- */

static void test_one_rank_forced(void **state)
{
    static const char *const specs[] = { "none", "fp16", "bf16", "terngrad", "terngrad:bucket=512",
                                         "topk:ratio=0.01" };
    const size_t count = 20011;
    (void)state;
    for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++) {
        gcomp__loop_world *w = NULL;
        gcomp_comm *comm = NULL;
        gcomp_codec *codec = NULL;
        gcomp_codec_options o = gcomp_codec_options_default();
        gcomp_config cfg = gcomp_config_default();
        gcomp_comm_stats st;
        size_t cap, bytes;
        uint8_t *payload;
        float *y = malloc(count * sizeof(float)), *ref = malloc(count * sizeof(float));
        cfg.codec = specs[k];
        cfg.min_bytes = 0;
        cfg.seed = 9;
        o.seed = 9;
        setenv(ONE_RANK_SWITCH, "1", 1);
        assert_int_equal(gcomp__loop_world_create(1, &w), GCOMP_SUCCESS);
        assert_int_equal(gcomp__comm_create_loop(w, 0, &cfg, &comm), GCOMP_SUCCESS);
        unsetenv(ONE_RANK_SWITCH);
        assert_int_equal(gcomp_codec_create(specs[k], &o, &codec), GCOMP_SUCCESS);
        cap = gcomp_codec_max_encoded_bytes(codec, count);
        payload = malloc(cap);
        for (int t = 0; t < 3; t++) {
            float *x = tu_gauss_array(count, 50 + (uint64_t)t);
            assert_int_equal(gcomp_allreduce(comm, x, y, count, GCOMP_F32, GCOMP_SUM, 5, NULL), GCOMP_SUCCESS);
            assert_int_equal(gcomp_codec_encode(codec, 5, x, count, GCOMP_F32, payload, cap, &bytes), GCOMP_SUCCESS);
            assert_int_equal(gcomp_codec_decode(codec, payload, bytes, ref, count, GCOMP_F32), GCOMP_SUCCESS);
            if (memcmp(y, ref, count * sizeof(float)) != 0) {
                size_t i = 0;
                while (memcmp(&y[i], &ref[i], 4) == 0) i++;
                fail_msg("%s, one rank, step %d: element %zu is %g, a codec round trip gives %g", specs[k], t, i,
                         (double)y[i], (double)ref[i]);
            }
            free(x);
        }
        assert_int_equal(gcomp_comm_stats_get(comm, &st), GCOMP_SUCCESS);
        assert_int_equal(st.compressed_calls, 3);
        assert_int_not_equal(st.last_schedule, GCOMP_SCHED_BYPASS);
        printf("  %-22s one rank, %s: 3 steps equal a codec round trip\n", specs[k],
               gcomp_schedule_name(st.last_schedule));
        gcomp_comm_destroy(comm);
        gcomp__loop_world_destroy(w);
        gcomp_codec_destroy(codec);
        free(payload);
        free(y);
        free(ref);
    }
}

#include "transport_staging.h" /* the decorator itself, for the two tests below */

/* ---- device ops with an asynchronous stream: the host's, except that copies wait in a queue
 * until wait() runs them (a stuck stream never runs them) and free_pinned checks that no
 * queued copy touches the buffer it frees ---- */

#define LAZY_MAX 16
static struct {
    struct {
        void *dst;
        const void *src;
        size_t bytes;
    } q[LAZY_MAX];
    int n, stuck, unbounded_waits;
    struct {
        void *p;
        size_t bytes;
    } pinned[LAZY_MAX];
} lazy;
static gcomp__device_ops lazy_ops;

static gcomp_result lazy_copy(void *dst, const void *src, size_t bytes, struct CUstream_st *stream)
{
    (void)stream;
    assert_true(lazy.n < LAZY_MAX);
    lazy.q[lazy.n].dst = dst;
    lazy.q[lazy.n].src = src;
    lazy.q[lazy.n].bytes = bytes;
    lazy.n++;
    return GCOMP_SUCCESS;
}

static gcomp_result lazy_wait(struct CUstream_st *stream, int64_t timeout_ms)
{
    (void)stream;
    if (lazy.stuck) {
        if (timeout_ms < 0) { /* would hang forever on a GPU */
            lazy.unbounded_waits++;
            return gcomp__fail(GCOMP_ERR_INTERNAL, "lazy stream: a wait without a deadline on a stuck stream");
        }
        return gcomp__fail(GCOMP_ERR_TIMEOUT, "lazy stream: still running after %lld ms", (long long)timeout_ms);
    }
    for (int i = 0; i < lazy.n; i++) memmove(lazy.q[i].dst, lazy.q[i].src, lazy.q[i].bytes);
    lazy.n = 0;
    return GCOMP_SUCCESS;
}

static gcomp_result lazy_alloc_pinned(size_t bytes, void **out)
{
    GCOMP_CHECK(gcomp__device_host.alloc_pinned(bytes, out));
    for (int i = 0; i < LAZY_MAX; i++)
        if (!lazy.pinned[i].p) {
            lazy.pinned[i].p = *out;
            lazy.pinned[i].bytes = bytes;
            return GCOMP_SUCCESS;
        }
    fail_msg("lazy stream: too many pinned buffers");
    return GCOMP_ERR_INTERNAL;
}

static int inside(const void *x, const void *p, size_t bytes)
{
    return (const char *)x >= (const char *)p && (const char *)x < (const char *)p + bytes;
}

static void lazy_free_pinned(void *p)
{
    if (!p) return;
    for (int i = 0; i < LAZY_MAX; i++) {
        if (lazy.pinned[i].p != p) continue;
        for (int c = 0; c < lazy.n; c++)
            if (inside(lazy.q[c].src, p, lazy.pinned[i].bytes) || inside(lazy.q[c].dst, p, lazy.pinned[i].bytes))
                fail_msg("a bounce buffer was freed while a queued copy still uses it");
        lazy.pinned[i].p = NULL;
    }
    gcomp__device_host.free_pinned(p);
}

/* The decorator over a one-rank loopback transport (messages to itself) with lazy_ops. */
static void lazy_staging(gcomp__loop_world **w, gcomp__transport **inner, gcomp__transport **t)
{
    memset(&lazy, 0, sizeof lazy);
    lazy_ops = gcomp__device_host;
    lazy_ops.copy_async = lazy_copy;
    lazy_ops.wait = lazy_wait;
    lazy_ops.alloc_pinned = lazy_alloc_pinned;
    lazy_ops.free_pinned = lazy_free_pinned;
    assert_int_equal(gcomp__loop_world_create(1, w), GCOMP_SUCCESS);
    assert_int_equal(gcomp__transport_loop_create(*w, 0, inner), GCOMP_SUCCESS);
    assert_int_equal(gcomp__transport_staging_wrap(*inner, &lazy_ops, t), GCOMP_SUCCESS);
    (*t)->stream = NULL;
}

static void lazy_staging_free(gcomp__loop_world *w, gcomp__transport *inner, gcomp__transport *t)
{
    t->destroy(t);
    inner->destroy(inner);
    gcomp__loop_world_destroy(w);
}

/* An exchange of 64 bytes, then one of 256: the first finish leaves its copy out of the
 * receive bounce buffer queued, and the second start grows that buffer. */
static void test_bounce_growth_waits(void **state)
{
    gcomp__loop_world *w;
    gcomp__transport *inner, *t;
    uint8_t src[256], dst[256];
    uint64_t v = 1;
    size_t got = 0;
    double deadline = gcomp__now() + 20.0;
    (void)state;
    lazy_staging(&w, &inner, &t);
    for (int i = 0; i < 256; i++) src[i] = (uint8_t)(i * 7 + 1);
    memset(dst, 0, sizeof dst);
    assert_int_equal(t->allreduce_max_u64(t, &v, 1, deadline), GCOMP_SUCCESS); /* a call's agreement */
    assert_int_equal(t->start_sendrecv(t, 0, src, 64, 0, dst, 64), GCOMP_SUCCESS);
    assert_int_equal(t->finish_sendrecv(t, &got, deadline), GCOMP_SUCCESS);
    assert_int_equal(got, 64);
    assert_int_equal(lazy.n, 1); /* the copy into dst is still queued */
    assert_int_equal(t->start_sendrecv(t, 0, src, 256, 0, dst, 256), GCOMP_SUCCESS);
    assert_int_equal(t->finish_sendrecv(t, &got, deadline), GCOMP_SUCCESS);
    assert_int_equal(lazy_ops.wait(NULL, -1), GCOMP_SUCCESS);
    assert_memory_equal(dst, src, 256);
    lazy_staging_free(w, inner, t);
}

/* A stream that never finishes: the start of an exchange and the uncompressed sum return
 * GCOMP_ERR_TIMEOUT at the call's deadline instead of waiting forever. */
static void test_copy_in_deadline(void **state)
{
    gcomp__loop_world *w;
    gcomp__transport *inner, *t;
    uint8_t src[64] = { 1 }, dst[64];
    float f[16] = { 0 };
    uint64_t v = 1;
    double t0;
    (void)state;
    lazy_staging(&w, &inner, &t);
    assert_int_equal(t->allreduce_max_u64(t, &v, 1, gcomp__now() + 0.05), GCOMP_SUCCESS);
    lazy.stuck = 1;
    t0 = gcomp__now();
    assert_int_equal(t->start_sendrecv(t, 0, src, sizeof src, 0, dst, sizeof dst), GCOMP_ERR_TIMEOUT);
    assert_int_equal(t->allreduce_sum_f32(t, f, 16, gcomp__now() + 0.05), GCOMP_ERR_TIMEOUT);
    assert_int_equal(lazy.unbounded_waits, 0);
    assert_true(gcomp__now() - t0 < 5.0);
    lazy.stuck = 0;
    lazy.n = 0; /* the stuck copies never ran */
    lazy_staging_free(w, inner, t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_staging_golden),
        cmocka_unit_test(test_one_rank_forced),
        cmocka_unit_test(test_emulated_device),
        cmocka_unit_test(test_mismatch_keeps_key_state),
        cmocka_unit_test(test_bounce_growth_waits),
        cmocka_unit_test(test_copy_in_deadline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
