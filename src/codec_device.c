/*
 * codec_device.c — the codec object on device buffers: the same calls as codec.c, made of
 * device-layer steps and the element codec's CUDA ops, all enqueued on the caller's stream.
 *
 * Encode:  [status := 0] [widen f16/bf16 -> f32 into scratch] codec encode (residual fused)
 *          -> header kernel (flags, body size from the status block; folds the call, and an
 *          error its kernels set, into the tally) -> commit kernel (flip the residual buffers
 *          unless non-finite or failed, step + 1). A sparse codec's status is read back
 *          before the header kernel: its error, or a body past dst, fails the call at once
 *          with dst as it was.
 * Decode:  [status := 0] header check kernel -> codec decode_add (writes nothing once the
 *          status holds an error) -> fold the status into the tally. Into f16/bf16, the
 *          blocking call narrows only a payload the device accepted (it reads the status
 *          back first); an async one narrows what the decode left (zeros after a refusal).
 * Sync:    wait for the stream, read the tally back, fold it into the stats (kernels count the
 *          calls, so a replayed graph's count too), report the first error found on the
 *          device since the last sync.
 *
 * The host never needs a value computed on the device, except top-k's body size (a codec
 * with GCOMP_CAP_SPARSE: its encode reads the status block back, one stream sync, which
 * brings its error too), so the fixed-size codecs' calls can be captured in a CUDA graph and
 * replayed: the residual's buffer index and step live in device memory and the commit
 * kernel advances them.
 *
 * Memory: the status and tally blocks, the scratch and each key's residual come from the
 * device layer at first use and are kept (scratch only grows; a residual is reallocated when
 * its key's count changes), so steady-state calls allocate nothing.
 */
#include <stdlib.h>
#include <string.h>

#include "codec_device.h"
#include "device.h"

#define ALIGN_UP(x) (((x) + (size_t)255) & ~(size_t)255)

/* One key's residual: a single allocation holding the gcomp_cuda_residual block that the
 * kernels read (buffer pointers, current index, step), then buf[0], then buf[1]. */
typedef struct dev_residual {
    uint64_t key;
    size_t count;
    void *mem;
    gcomp_cuda_residual *state; /* == mem, device memory */
    /* The host's copy of state's cur and step, valid when `known`: the engine's calls keep it
     * (they commit from the host), so they need no read-back; the public encode's commit
     * kernel decides on the device, after which the host knows nothing until it reads. */
    int known;
    uint32_t cur;
    uint64_t step;
} dev_residual;

struct gcomp__codec_device {
    const gcomp__device_ops *ops;
    int device; /* the CUDA device of the object's first device call */
    void *blocks;
    gcomp_cuda_status *status;  /* the call in flight */
    gcomp__device_tally *tally; /* calls since the last sync */
    void *scratch;
    size_t scratch_cap;
    dev_residual *res;
    size_t n_res, cap_res;
    uint64_t allocs; /* device allocations so far (tests show that steady state adds none) */
};

/* ---- where buffers live ------------------------------------------------------------------ */

static int on_device(const void *p)
{
    const gcomp__device_ops *ops;
    if (!p) return 0;
    if (gcomp__device_for(p, &ops, NULL) != GCOMP_SUCCESS) return 1; /* the device path says why */
    return ops->kind != GCOMP__DEVICE_HOST;
}

int gcomp__codec_device_wanted(const void *a, const void *b) { return on_device(a) || on_device(b); }

/* The device ops of a call whose buffers a (named an) and b (bn, may be NULL when the call
 * has no elements) must both be memory of the current CUDA device. */
static gcomp_result device_of(const char *fn, const char *an, const void *a, const char *bn, const void *b,
                              const gcomp__device_ops **ops)
{
    const gcomp__device_ops *oa = &gcomp__device_host, *ob = &gcomp__device_host;
    if (a) GCOMP_CHECK(gcomp__device_for(a, &oa, NULL));
    if (b) GCOMP_CHECK(gcomp__device_for(b, &ob, NULL));
    if (oa->kind == GCOMP__DEVICE_HOST && ob->kind == GCOMP__DEVICE_HOST)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "%s: no buffer is device memory", fn);
    if (a && oa->kind == GCOMP__DEVICE_HOST)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                           "%s: %s is device memory but %s is host memory: pass both on the "
                           "same device, or both on the host",
                           fn, bn, an);
    if (b && ob->kind == GCOMP__DEVICE_HOST)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                           "%s: %s is device memory but %s is host memory: pass both on the "
                           "same device, or both on the host",
                           fn, an, bn);
    *ops = a ? oa : ob;
    return GCOMP_SUCCESS;
}

/* Only an element codec with CUDA ops and no byte stage runs on the device. */
static gcomp_result check_chain(const char *fn, const gcomp__chain *ch)
{
    const gcomp_codec_vtable *vt = ch->stages[0].vt;
    if (ch->n_stages > 1)
        return gcomp__fail(GCOMP_ERR_UNSUPPORTED,
                           "%s: '%s' has a byte stage (%s), which runs on host buffers only; "
                           "device buffers take the element codec alone",
                           fn, ch->canonical, ch->stages[1].vt->name);
    if (!vt->cuda || !vt->cuda->encode || !vt->cuda->decode_add)
        return gcomp__fail(GCOMP_ERR_UNSUPPORTED, "%s: codec '%s' has no CUDA implementation (host buffers only)", fn,
                           vt->name);
    return GCOMP_SUCCESS;
}

/* ---- the object's device state ----------------------------------------------------------- */

static gcomp_result ensure_dev(const gcomp__codec_parts *c, const gcomp__device_ops *ops, gcomp__codec_device **out)
{
    gcomp__codec_device *d = *c->dev;
    int cur = gcomp__device_current();
    size_t head = ALIGN_UP(sizeof(gcomp_cuda_status));
    gcomp_result rc;
    if (d) {
        if (d->device != cur)
            return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                               "codec object works on CUDA device %d (where its first device "
                               "call ran), but the current device is %d",
                               d->device, cur);
        *out = d;
        return GCOMP_SUCCESS;
    }
    d = calloc(1, sizeof *d);
    if (!d) return gcomp__fail(GCOMP_ERR_NOMEM, "codec object: cannot allocate its device state");
    d->ops = ops;
    d->device = cur;
    GCOMP_CHECK_GOTO(ops->alloc(head + sizeof(gcomp__device_tally), &d->blocks), rc, fail);
    d->allocs++;
    d->status = (gcomp_cuda_status *)d->blocks;
    d->tally = (gcomp__device_tally *)((uint8_t *)d->blocks + head);
    /* zeroed before any stream of the caller's can use it: wait here, once */
    GCOMP_CHECK_GOTO(ops->memset_async(d->blocks, 0, head + sizeof(gcomp__device_tally), NULL), rc, fail);
    GCOMP_CHECK_GOTO(ops->wait(NULL, -1), rc, fail);
    *c->dev = *out = d;
    return GCOMP_SUCCESS;
fail:
    ops->free(d->blocks);
    free(d);
    return rc;
}

/* Scratch only grows; freeing the old one waits for the work that may still use it. */
static gcomp_result reserve_scratch(gcomp__codec_device *d, size_t bytes, uint8_t **out)
{
    if (bytes > d->scratch_cap || !d->scratch) {
        d->ops->free(d->scratch);
        d->scratch = NULL;
        d->scratch_cap = 0;
        GCOMP_CHECK(d->ops->alloc(bytes, &d->scratch));
        d->allocs++;
        d->scratch_cap = bytes;
    }
    *out = (uint8_t *)d->scratch;
    return GCOMP_SUCCESS;
}

/* ---- residuals in device memory ---------------------------------------------------------- */

static dev_residual *find_res(const gcomp__codec_device *d, uint64_t key)
{
    if (!d) return NULL;
    for (size_t i = 0; i < d->n_res; i++)
        if (d->res[i].key == key) return &d->res[i];
    return NULL;
}

static void remove_res(gcomp__codec_device *d, dev_residual *r)
{
    d->ops->free(r->mem);
    *r = d->res[--d->n_res];
}

/* Allocate r's memory for count elements: zeroed, or buf[0] = init (host or device memory)
 * with the given step; the state block written behind the zeroing on the same stream. */
static gcomp_result res_alloc(gcomp__codec_device *d, dev_residual *r, size_t count, int double_buffer,
                              const float *init, uint64_t step, struct CUstream_st *stream)
{
    size_t head = ALIGN_UP(sizeof(gcomp_cuda_residual)), one = ALIGN_UP(count * sizeof(float));
    size_t bufs = one * (double_buffer ? 2 : 1);
    gcomp_cuda_residual h;
    uint8_t *m;
    memset(&h, 0, sizeof h);
    GCOMP_CHECK(d->ops->alloc(head + bufs, &r->mem));
    d->allocs++;
    m = (uint8_t *)r->mem;
    r->count = count;
    r->known = 1;
    r->cur = 0;
    r->step = step;
    r->state = (gcomp_cuda_residual *)m;
    h.buf[0] = (float *)(m + head);
    h.buf[1] = double_buffer ? (float *)(m + head + one) : NULL;
    h.step = step;
    h.cur = 0;
    GCOMP_CHECK(d->ops->memset_async(m + head, 0, bufs, stream));
    if (init) GCOMP_CHECK(d->ops->copy_async(h.buf[0], init, count * sizeof(float), stream));
    /* from pageable host memory: staged before the call returns, so h may go out of scope */
    GCOMP_CHECK(d->ops->copy_async(r->state, &h, sizeof h, stream));
    return GCOMP_SUCCESS;
}

/* The key's device residual for count elements: created zero at its first use, reset when
 * the count changed; a residual the host store holds for the key (restored with
 * gcomp_codec_residual_set before any device call, or from host calls) moves here with its
 * step. A host residual of another count is dropped, or with keep_other kept (the engine's
 * calls: it goes when the call succeeds, gcomp__codec_device_ef_end). */
static gcomp_result acquire_res(const gcomp__codec_parts *c, gcomp__codec_device *d, uint64_t key, size_t count,
                                struct CUstream_st *stream, int keep_other, dev_residual **out)
{
    /* Always two buffers on the device, in-place codecs included: an in-place encode may change
     * no residual before it knows every scale is finite, which costs TernGrad a second read of
     * g and r (0.48 of a device copy at 256 MiB, bucket=4096, against 0.90 double-buffered on
     * an H100); with two, the kernel writes buf[cur ^ 1] in its one pass and the commit kernel
     * flips cur only after a finite result. The price is a second residual in device memory. */
    const int double_buffer = 1;
    dev_residual *r = find_res(d, key);
    gcomp__residual *host;
    const float *init = NULL;
    uint64_t step = 0;
    gcomp_result rc;
    if (r && r->count == count) {
        *out = r;
        return GCOMP_SUCCESS;
    }
    if (r) {
        gcomp__debug("device residual key %llu: count %zu -> %zu, reset", (unsigned long long)key, r->count, count);
        d->ops->free(r->mem);
        r->mem = NULL;
    } else {
        if (d->n_res == d->cap_res) {
            size_t cap = d->cap_res ? d->cap_res * 2 : 16;
            dev_residual *grown = realloc(d->res, cap * sizeof *grown);
            if (!grown) return gcomp__fail(GCOMP_ERR_NOMEM, "cannot grow the device residual table to %zu keys", cap);
            d->res = grown;
            d->cap_res = cap;
        }
        r = &d->res[d->n_res++];
        memset(r, 0, sizeof *r);
        r->key = key;
    }
    host = gcomp__residual_find(c->host_residuals, key);
    if (host && host->count == count) {
        init = host->buf[host->cur];
        step = host->step;
    }
    rc = res_alloc(d, r, count, double_buffer, init, step, stream);
    if (rc != GCOMP_SUCCESS) {
        remove_res(d, r);
        return rc;
    }
    /* host -> device copies are staged before they return: the host buffers may go now */
    if (host && (init || !keep_other)) gcomp__residual_drop(c->host_residuals, key);
    *out = r;
    return GCOMP_SUCCESS;
}

static gcomp_result acquire(const gcomp__codec_parts *c, gcomp__codec_device *d, uint64_t key, size_t count,
                            struct CUstream_st *stream, gcomp_cuda_residual **out)
{
    dev_residual *r;
    GCOMP_CHECK(acquire_res(c, d, key, count, stream, 0, &r));
    *out = r->state;
    return GCOMP_SUCCESS;
}

/* The state block of a residual, read back (blocking). */
static gcomp_result read_state(const gcomp__codec_device *d, const dev_residual *r, gcomp_cuda_residual *out)
{
    GCOMP_CHECK(d->ops->wait(NULL, -1));
    GCOMP_CHECK(d->ops->copy_async(out, r->state, sizeof *out, NULL));
    return d->ops->wait(NULL, -1);
}

int gcomp__codec_device_has_key(const gcomp__codec_device *d, uint64_t key) { return find_res(d, key) != NULL; }

gcomp_result gcomp__codec_device_residual_get(const gcomp__codec_device *d, const gcomp__residual_store *host,
                                              uint64_t key, float *dst, size_t count)
{
    const dev_residual *r = find_res(d, key);
    const gcomp__device_ops *ops;
    gcomp_cuda_residual st;
    if (dst) GCOMP_CHECK(gcomp__device_for(dst, &ops, NULL));
    if (!r) { /* a key of the host store into device memory */
        const gcomp__residual *h = gcomp__residual_find(host, key);
        if (!h) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "no residual for key %llu", (unsigned long long)key);
        if (h->count != count)
            return gcomp__fail(GCOMP_ERR_INVALID_ARG, "key %llu has %zu elements, not %zu", (unsigned long long)key,
                               h->count, count);
        if (!count) return GCOMP_SUCCESS;
        GCOMP_CHECK(ops->copy_async(dst, h->buf[h->cur], count * sizeof(float), NULL));
        return ops->wait(NULL, -1);
    }
    if (r->count != count)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "key %llu has %zu elements, not %zu", (unsigned long long)key,
                           r->count, count);
    if (d->device != gcomp__device_current())
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "residual of key %llu is on CUDA device %d, the current device is %d",
                           (unsigned long long)key, d->device, gcomp__device_current());
    if (!count) return GCOMP_SUCCESS;
    GCOMP_CHECK(read_state(d, r, &st));
    GCOMP_CHECK(d->ops->copy_async(dst, st.buf[st.cur], count * sizeof(float), NULL));
    return d->ops->wait(NULL, -1);
}

/* Refuse a residual in device memory (src, count floats, ops its device's) that holds a NaN
 * or an Inf, before anything changes: it would make every later result of the key non-finite
 * for good (a non-finite step keeps the residual). One device pass and a 4-byte copy back;
 * where in src is not looked for. */
static gcomp_result device_src_finite(const gcomp__device_ops *ops, uint64_t key, const float *src, size_t count)
{
    uint32_t *flag = NULL, seen = 0;
    gcomp_result rc;
    if (!count) return GCOMP_SUCCESS;
    GCOMP_CHECK(ops->alloc(sizeof *flag, (void **)&flag));
    rc = ops->memset_async(flag, 0, sizeof *flag, NULL);
    if (rc == GCOMP_SUCCESS) rc = ops->flag_nonfinite(src, count, GCOMP_F32, flag, NULL);
    if (rc == GCOMP_SUCCESS) rc = ops->copy_async(&seen, flag, sizeof seen, NULL);
    if (rc == GCOMP_SUCCESS) rc = ops->wait(NULL, -1);
    ops->free(flag);
    GCOMP_CHECK(rc);
    if (seen)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                           "gcomp_codec_residual_set: key %llu's residual (in %s memory) holds a NaN or an Inf",
                           (unsigned long long)key, ops->name);
    return GCOMP_SUCCESS;
}

gcomp_result gcomp__codec_device_residual_set(const gcomp__codec_parts *c, uint64_t key, const float *src, size_t count)
{
    const gcomp__device_ops *ops = &gcomp__device_host;
    gcomp__codec_device *d;
    gcomp_cuda_residual *state;
    gcomp_cuda_residual st;
    dev_residual *r;
    if (count > GCOMP_MAX_COUNT)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_codec_residual_set: count %zu is too large", count);
    if (src) GCOMP_CHECK(gcomp__device_for(src, &ops, NULL));
    /* a host src was checked by the caller (codec.c), element by element */
    if (src && ops->kind != GCOMP__DEVICE_HOST) GCOMP_CHECK(device_src_finite(ops, key, src, count));
    if (*c->dev) ops = (*c->dev)->ops;
    if (ops->kind == GCOMP__DEVICE_HOST)
        return gcomp__fail(GCOMP_ERR_INTERNAL, "gcomp_codec_residual_set: device path without a device");
    GCOMP_CHECK(ensure_dev(c, ops, &d));
    GCOMP_CHECK(acquire(c, d, key, count, NULL, &state));
    r = find_res(d, key);
    if (!count) return GCOMP_SUCCESS;
    GCOMP_CHECK(read_state(d, r, &st));
    GCOMP_CHECK(d->ops->copy_async(st.buf[st.cur], src, count * sizeof(float), NULL));
    return d->ops->wait(NULL, -1);
}

void gcomp__codec_device_residual_drop(gcomp__codec_device *d, uint64_t key)
{
    dev_residual *r = find_res(d, key);
    if (r) remove_res(d, r);
}

void gcomp__codec_device_free(gcomp__codec_device *d)
{
    if (!d) return;
    for (size_t i = 0; i < d->n_res; i++) d->ops->free(d->res[i].mem);
    free(d->res);
    d->ops->free(d->scratch);
    d->ops->free(d->blocks);
    free(d);
}

/* ---- encode, decode, sync ---------------------------------------------------------------- */

/* An error an encode's kernels set in the status block (read back, or found in the tally
 * under GCOMP__WHERE_NONE, which only the header kernel's fold of an encode leaves), as a
 * gcomp_result with its message; `since` ends the message. */
static gcomp_result encode_error(const char *codec, uint32_t error, const char *since)
{
    gcomp_result rc = error <= GCOMP_ERR_INTERNAL ? (gcomp_result)error : GCOMP_ERR_INTERNAL;
    return gcomp__fail(rc, "device encode: '%s' failed on the device with %s%s", codec, gcomp_result_name(rc), since);
}

gcomp_result gcomp__codec_device_sync(const gcomp__codec_parts *c, struct CUstream_st *stream)
{
    gcomp__codec_device *d = *c->dev;
    const gcomp_codec_vtable *vt = c->chain->stages[0].vt;
    gcomp__device_tally t;
    if (!d) return GCOMP_SUCCESS; /* no device call yet: nothing to wait for */
    if (d->device != gcomp__device_current())
        return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                           "gcomp_codec_sync: codec object works on CUDA device %d, the current "
                           "device is %d",
                           d->device, gcomp__device_current());
    GCOMP_CHECK(d->ops->wait(stream, -1));
    GCOMP_CHECK(d->ops->copy_async(&t, d->tally, sizeof t, stream));
    GCOMP_CHECK(d->ops->memset_async(d->tally, 0, sizeof t, stream));
    GCOMP_CHECK(d->ops->wait(stream, -1));
    c->stats->encode_calls += t.encode_calls;
    c->stats->raw_bytes += t.raw_bytes;
    c->stats->wire_bytes += t.wire_bytes;
    c->stats->overflow_count += t.overflow;
    c->stats->nonfinite_calls += t.nonfinite_calls;
    c->stats->decode_calls += t.decode_calls;
    if (t.error == GCOMP_SUCCESS) return GCOMP_SUCCESS;
    if (t.where == GCOMP__WHERE_NONE) return encode_error(vt->name, t.error, " (first error since the last sync)");
    if (t.where == GCOMP__WHERE_HEADER)
        return gcomp__fail(GCOMP_ERR_CORRUPT,
                           "device decode: a payload's header is not one of '%s' with the caller's "
                           "count and payload size (first error since the last sync)",
                           vt->name);
    if (t.where == GCOMP__WHERE_SIZE)
        return gcomp__fail(GCOMP_ERR_INTERNAL,
                           "device encode: '%s' wrote another body size than max_body_bytes, which "
                           "the caller was told (a codec whose size depends on the data must declare "
                           "GCOMP_CAP_SPARSE)",
                           vt->name);
    if (t.error == GCOMP_ERR_CORRUPT)
        return gcomp__fail(GCOMP_ERR_CORRUPT,
                           "device decode: '%s' found a payload body malformed (first error since "
                           "the last sync)",
                           vt->name);
    return gcomp__fail(t.error <= GCOMP_ERR_INTERNAL ? (gcomp_result)t.error : GCOMP_ERR_INTERNAL,
                       "device call of '%s' failed with %s (first error since the last sync)", vt->name,
                       gcomp_result_name((gcomp_result)t.error));
}

/* A sparse codec's body size, known on the device only: its status read back (one wait on
 * the stream) before anything is written after the body, so a refused body leaves the rest
 * of the payload as it was. The codec's error is the call's -- GCOMP_ERR_BUFFER_TOO_SMALL
 * for a body past cap, the CPU's rule (codecs/topk.c: any cap the body fits in) -- and so is
 * a body reported past cap (a faulty user codec: as codec.c on the host). */
static gcomp_result sparse_body_bytes(const gcomp__device_ops *ops, const gcomp__chain *chain, const char *fn,
                                      const gcomp_cuda_status *st, size_t cap, size_t *body, struct CUstream_st *stream)
{
    const char *name = chain->stages[0].vt->name;
    gcomp_cuda_status hs;
    GCOMP_CHECK(ops->copy_async(&hs, st, sizeof hs, stream));
    GCOMP_CHECK(ops->wait(stream, -1));
    if (hs.error == GCOMP_ERR_BUFFER_TOO_SMALL)
        return gcomp__fail(GCOMP_ERR_BUFFER_TOO_SMALL,
                           "%s: the %s body needs %llu bytes, the output holds %zu after the header "
                           "(gcomp_codec_max_encoded_bytes() always fits)",
                           fn, chain->canonical, (unsigned long long)hs.body_bytes, cap);
    if (hs.error) return encode_error(name, hs.error, "");
    if (hs.body_bytes > cap)
        return gcomp__fail(GCOMP_ERR_INTERNAL, "%s: codec '%s' reports a body of %llu bytes, more than %zu", fn, name,
                           (unsigned long long)hs.body_bytes, cap);
    *body = (size_t)hs.body_bytes;
    return GCOMP_SUCCESS;
}

/* A public encode that failed after it took the key's residual, as codec.c abandons one: a
 * key the call created goes again (a failed first call leaves no key), any other keeps its
 * residual and its step (no commit kernel: the state block is as the call found it). */
static void abandon_res(gcomp__codec_device *d, uint64_t key, int created)
{
    dev_residual *r = find_res(d, key);
    if (r && created) remove_res(d, r); /* free waits for the kernels that may still use it */
}

/* The public encode's checks before anything is enqueued; *ops: the buffers' device ops. */
static gcomp_result encode_args(const char *fn, const gcomp__codec_parts *c, const void *src, size_t count,
                                gcomp_dtype dtype, const void *dst, size_t dst_cap, const gcomp__device_ops **ops)
{
    const gcomp__stage *el = &c->chain->stages[0];
    size_t body_max;
    if (!gcomp_dtype_size(dtype)) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "%s: invalid dtype %d", fn, (int)dtype);
    if (count > GCOMP_MAX_COUNT) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "%s: count %zu is too large", fn, count);
    if (!dst || (count && !src)) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "%s: NULL buffer with count %zu", fn, count);
    GCOMP_CHECK(device_of(fn, "dst", dst, "src", count ? src : NULL, ops));
    GCOMP_CHECK(check_chain(fn, c->chain));
    body_max = el->vt->max_body_bytes(el->params, count);
    if (dst_cap < GCOMP_HEADER_BYTES)
        return gcomp__fail(GCOMP_ERR_BUFFER_TOO_SMALL, "%s: output of %zu bytes cannot hold the header", fn, dst_cap);
    /* every body of a fixed-size codec is body_max bytes; a sparse one's is judged on the device */
    if (!(el->vt->caps & GCOMP_CAP_SPARSE) && dst_cap - GCOMP_HEADER_BYTES < body_max)
        return gcomp__fail(GCOMP_ERR_BUFFER_TOO_SMALL,
                           "%s: a %s payload of %zu elements is %zu bytes, the output holds %zu", fn, el->vt->name,
                           count, GCOMP_HEADER_BYTES + body_max, dst_cap);
    return GCOMP_SUCCESS;
}

gcomp_result gcomp__codec_device_encode(const gcomp__codec_parts *c, uint64_t key, const void *src, size_t count,
                                        gcomp_dtype dtype, void *dst, size_t dst_cap, size_t *written,
                                        struct CUstream_st *stream, int blocking)
{
    static const char fn[] = "gcomp_codec_encode";
    const gcomp__stage *el = &c->chain->stages[0];
    const gcomp__device_ops *ops;
    gcomp__codec_device *d;
    gcomp_encode_ctx ctx;
    gcomp_cuda_residual *res = NULL;
    gcomp_header h;
    size_t body_max, body = 0, widen_bytes, codec_scratch;
    int fixed = !(el->vt->caps & GCOMP_CAP_SPARSE), created = 0;
    const float *x = (const float *)src;
    uint8_t *scratch;
    gcomp_result rc;

    if (!written) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "%s: written is NULL", fn);
    *written = 0;
    GCOMP_CHECK(encode_args(fn, c, src, count, dtype, dst, dst_cap, &ops));
    GCOMP_CHECK(ensure_dev(c, ops, &d));
    body_max = el->vt->max_body_bytes(el->params, count);

    widen_bytes = dtype == GCOMP_F32 ? 0 : ALIGN_UP(count * sizeof(float));
    codec_scratch = el->vt->cuda->scratch_bytes ? el->vt->cuda->scratch_bytes(el->params, count) : 0;
    GCOMP_CHECK(reserve_scratch(d, widen_bytes + codec_scratch, &scratch));

    memset(&ctx, 0, sizeof ctx);
    ctx.seed = c->opts->seed;
    ctx.rank = c->opts->rank;
    if (c->opts->error_feedback && key != GCOMP_KEY_NONE) {
        created = !find_res(d, key) && !gcomp__residual_find(c->host_residuals, key);
        GCOMP_CHECK(acquire(c, d, key, count, stream, &res));
    } else {
        ctx.step = (*c->nokey_step)++; /* with a residual, the kernels read its step */
    }

    GCOMP_CHECK_GOTO(ops->memset_async(d->status, 0, sizeof *d->status, stream), rc, fail);
    if (dtype != GCOMP_F32) {
        GCOMP_CHECK_GOTO(ops->widen(src, dtype, count, (float *)scratch, stream), rc, fail);
        x = (const float *)scratch;
    }
    GCOMP_CHECK_GOTO(GCOMP_CODEC_CALL(el->vt, cuda->encode,
                                      (el->params, &ctx, x, res, count, (uint8_t *)dst + GCOMP_HEADER_BYTES,
                                       dst_cap - GCOMP_HEADER_BYTES, codec_scratch ? scratch + widen_bytes : NULL,
                                       d->status, stream)),
                     rc, fail);
    /* the size depends on the data: the one read-back of this path, before the header */
    if (!fixed)
        GCOMP_CHECK_GOTO(sparse_body_bytes(ops, c->chain, fn, d->status, dst_cap - GCOMP_HEADER_BYTES, &body, stream),
                         rc, fail);
    memset(&h, 0, sizeof h);
    h.dtype = (uint8_t)dtype;
    h.wire_id = el->vt->wire_id;
    h.count = count;
    GCOMP_CHECK_GOTO(ops->header_write(dst, &h, d->status, fixed ? (uint64_t)body_max : UINT64_MAX, d->tally, stream),
                     rc, fail);
    if (res) {
        GCOMP_CHECK_GOTO(ops->residual_commit(res, d->status, stream), rc, fail);
        find_res(d, key)->known = 0; /* the kernel decides the flip: read back when needed */
    }
    *written = GCOMP_HEADER_BYTES + (fixed ? body_max : body);
    if (blocking) GCOMP_CHECK(gcomp__codec_device_sync(c, stream));
    return GCOMP_SUCCESS;
fail:
    if (res)
        abandon_res(d, key, created);
    else
        *c->nokey_step = ctx.step;
    return rc;
}

static gcomp_result decode_add_steps(const gcomp__codec_parts *c, gcomp__codec_device *d, const void *payload,
                                     size_t bytes, float *acc, size_t count, struct CUstream_st *stream)
{
    const gcomp__stage *el = &c->chain->stages[0];
    GCOMP_CHECK(d->ops->memset_async(d->status, 0, sizeof *d->status, stream));
    GCOMP_CHECK(d->ops->header_check(payload, bytes, el->vt->wire_id, count, d->status, stream));
    GCOMP_CHECK(
        GCOMP_CODEC_CALL(el->vt, cuda->decode_add, (el->params, payload, bytes, acc, count, d->status, stream)));
    return d->ops->status_fold(d->status, d->tally, stream);
}

gcomp_result gcomp__codec_device_decode_add(const gcomp__codec_parts *c, const void *payload, size_t bytes, float *acc,
                                            size_t count, struct CUstream_st *stream, int blocking)
{
    static const char fn[] = "gcomp_codec_decode_add";
    const gcomp__device_ops *ops;
    gcomp__codec_device *d;
    if (!payload || (count && !acc)) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "%s: NULL payload or acc", fn);
    if (count > GCOMP_MAX_COUNT) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "%s: count %zu is too large", fn, count);
    GCOMP_CHECK(device_of(fn, "payload", payload, "acc", count ? acc : NULL, &ops));
    GCOMP_CHECK(check_chain(fn, c->chain));
    GCOMP_CHECK(ensure_dev(c, ops, &d));
    GCOMP_CHECK(decode_add_steps(c, d, payload, bytes, acc, count, stream));
    if (blocking) GCOMP_CHECK(gcomp__codec_device_sync(c, stream));
    return GCOMP_SUCCESS;
}

/* dst = the decoded floats in acc rounded to dtype. The CPU leaves dst as it was when it
 * refuses the payload, but narrow has no status to look at: a blocking call reads this call's
 * status back first (one more wait, in a call that waits anyway) and narrows only a payload
 * the device accepted; the sync after it returns the error. An async call must not wait, so
 * it narrows what the decode left, zeros after a refusal, and the next sync reports it
 * (docs/GPU.md). */
static gcomp_result narrow_decoded(gcomp__codec_device *d, const float *acc, size_t count, gcomp_dtype dtype, void *dst,
                                   int blocking, struct CUstream_st *stream)
{
    gcomp_cuda_status st;
    if (blocking) {
        GCOMP_CHECK(d->ops->copy_async(&st, d->status, sizeof st, stream));
        GCOMP_CHECK(d->ops->wait(stream, -1));
        if (st.error) return GCOMP_SUCCESS;
    }
    return d->ops->narrow(acc, count, dtype, dst, stream);
}

gcomp_result gcomp__codec_device_decode(const gcomp__codec_parts *c, const void *payload, size_t bytes, void *dst,
                                        size_t count, gcomp_dtype dtype, struct CUstream_st *stream, int blocking)
{
    static const char fn[] = "gcomp_codec_decode";
    const gcomp__device_ops *ops;
    gcomp__codec_device *d;
    float *acc = (float *)dst;
    if (!gcomp_dtype_size(dtype)) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "%s: invalid dtype %d", fn, (int)dtype);
    if (!payload || (count && !dst)) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "%s: NULL payload or dst", fn);
    if (count > GCOMP_MAX_COUNT) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "%s: count %zu is too large", fn, count);
    GCOMP_CHECK(device_of(fn, "payload", payload, "dst", count ? dst : NULL, &ops));
    GCOMP_CHECK(check_chain(fn, c->chain));
    GCOMP_CHECK(ensure_dev(c, ops, &d));
    if (dtype != GCOMP_F32) {
        uint8_t *scratch;
        GCOMP_CHECK(reserve_scratch(d, ALIGN_UP(count * sizeof(float)), &scratch));
        acc = (float *)scratch;
    }
    GCOMP_CHECK(ops->memset_async(acc, 0, count * sizeof(float), stream));
    GCOMP_CHECK(decode_add_steps(c, d, payload, bytes, acc, count, stream));
    if (dtype != GCOMP_F32) GCOMP_CHECK(narrow_decoded(d, acc, count, dtype, dst, blocking, stream));
    if (blocking) GCOMP_CHECK(gcomp__codec_device_sync(c, stream));
    return GCOMP_SUCCESS;
}

/* ---- the engine's device path (codec.c hands these on to the schedules) ------------------ */

static int known_state(const gcomp__codec_device *d, dev_residual *r, struct CUstream_st *stream, gcomp_result *rc)
{
    gcomp_cuda_residual st;
    *rc = GCOMP_SUCCESS;
    if (r->known) return 1;
    /* written by the public path's commit kernel: read it once, ordered after that work */
    *rc = d->ops->wait(stream, -1);
    if (*rc == GCOMP_SUCCESS) *rc = read_state(d, r, &st);
    if (*rc != GCOMP_SUCCESS) return 0;
    r->known = 1;
    r->cur = st.cur;
    r->step = st.step;
    return 1;
}

/* A new zeroed residual of count elements for key, outside the table (ef_begin). */
static gcomp_result fresh_res(gcomp__codec_device *d, uint64_t key, size_t count, struct CUstream_st *stream,
                              dev_residual **out)
{
    dev_residual *r = calloc(1, sizeof *r);
    gcomp_result rc;
    *out = NULL;
    if (!r) return gcomp__fail(GCOMP_ERR_NOMEM, "cannot allocate a device residual entry");
    r->key = key;
    rc = res_alloc(d, r, count, 1, NULL, 0, stream);
    if (rc != GCOMP_SUCCESS) {
        d->ops->free(r->mem);
        free(r);
        return rc;
    }
    *out = r;
    return GCOMP_SUCCESS;
}

gcomp_result gcomp__codec_device_ef_begin(const gcomp__codec_parts *c, const gcomp__device_ops *ops, uint64_t key,
                                          size_t count, struct CUstream_st *stream, gcomp__dev_ef *ef)
{
    gcomp__codec_device *d;
    dev_residual *r;
    gcomp_cuda_residual h;
    gcomp_result rc;
    memset(ef, 0, sizeof *ef);
    GCOMP_CHECK(ensure_dev(c, ops, &d));
    r = find_res(d, key);
    if (r && r->count != count) { /* the old one stays until the call ends */
        GCOMP_CHECK(fresh_res(d, key, count, stream, &r));
        ef->fresh = r;
    } else {
        if (!r) {
            const gcomp__residual *host = gcomp__residual_find(c->host_residuals, key);
            ef->created = !host || host->count != count; /* else the host's residual moves here */
            GCOMP_CHECK(acquire_res(c, d, key, count, stream, 1, &r));
        }
        if (!known_state(d, r, stream, &rc)) return rc;
    }
    /* the buffer pointers of the state block, as res_alloc wrote them */
    h.buf[0] = (float *)((uint8_t *)r->mem + ALIGN_UP(sizeof(gcomp_cuda_residual)));
    h.buf[1] = (float *)((uint8_t *)h.buf[0] + ALIGN_UP(count * sizeof(float)));
    ef->key = key;
    ef->active = 1;
    ef->r_in = h.buf[r->cur];
    ef->r_out = h.buf[r->cur ^ 1u];
    ef->step = r->step;
    return GCOMP_SUCCESS;
}

/* The call's new residual takes the old one's place in the table (ef_end). */
static dev_residual *install_fresh(gcomp__codec_device *d, gcomp__dev_ef *ef)
{
    dev_residual *fresh = ef->fresh, *old = find_res(d, ef->key);
    ef->fresh = NULL;
    /* the old entry is there: ef_begin found it, and nothing drops a key while a call on it runs */
    gcomp__debug("device residual key %llu: count %zu -> %zu, reset", (unsigned long long)ef->key, old->count,
                 fresh->count);
    d->ops->free(old->mem);
    *old = *fresh;
    free(fresh);
    return old;
}

gcomp_result gcomp__codec_device_ef_end(const gcomp__codec_parts *c, gcomp__dev_ef *ef, int keep,
                                        struct CUstream_st *stream)
{
    gcomp__codec_device *d = *c->dev;
    dev_residual *r = !ef->active ? NULL : ef->fresh ? install_fresh(d, ef) : find_res(d, ef->key);
    gcomp_cuda_status *st = d ? d->status : NULL; /* the object's own block: free between its calls */
    ef->active = 0;
    if (!r) return GCOMP_SUCCESS;
    if (ef->created) gcomp__residual_drop(c->host_residuals, ef->key); /* of another count: replaced */
    ef->created = 0;
    /* the commit kernel flips the buffers unless st->nonfinite, and advances the step: the
     * same kernel as the public path's, fed the decision every rank agreed on */
    GCOMP_CHECK(d->ops->memset_async(st, 0, sizeof *st, stream));
    if (keep) GCOMP_CHECK(d->ops->memset_async(&st->nonfinite, 1, 1, stream));
    GCOMP_CHECK(d->ops->residual_commit(r->state, st, stream));
    if (!keep) r->cur ^= 1u;
    r->step++;
    return GCOMP_SUCCESS;
}

void gcomp__codec_device_ef_abandon(const gcomp__codec_parts *c, gcomp__dev_ef *ef, int keep_step,
                                    struct CUstream_st *stream)
{
    gcomp__codec_device *d = *c->dev;
    dev_residual *fresh = ef->fresh;
    if (!ef->active) return;
    if (ef->created) { /* the key was new here: it goes, once the call's kernels are done with it */
        ef->active = 0;
        ef->created = 0;
        if (d->ops->wait(stream, 1000) == GCOMP_SUCCESS) gcomp__codec_device_residual_drop(d, ef->key);
        return;
    }
    if (!fresh && keep_step) {
        if (gcomp__codec_device_ef_end(c, ef, 1, stream) == GCOMP_SUCCESS) (void)d->ops->wait(stream, 1000);
        return;
    }
    if (!fresh) { /* the residual and its step as they were: nothing to commit */
        ef->active = 0;
        return;
    }
    ef->active = 0;
    ef->fresh = NULL;
    /* kernels of the call may still use it: freed once the stream is done (else left: a
     * stream that does not finish has broken the communicator already) */
    if (d->ops->wait(stream, 1000) != GCOMP_SUCCESS) return;
    d->ops->free(fresh->mem);
    free(fresh);
}

gcomp_result gcomp__codec_device_check(const char *api, const gcomp__chain *chain)
{
    const gcomp_codec_vtable *vt = chain->stages[0].vt;
    const gcomp_codec_cuda_ops *cu = vt->cuda;
    GCOMP_CHECK(check_chain(api, chain));
    /* the integer ring runs the codec's own steps: all four must be on the device */
    if ((vt->caps & GCOMP_CAP_INTEGER) && (!cu->local_scales || !cu->ternarise || !cu->sums_add_pack || !cu->sums_values))
        return gcomp__fail(GCOMP_ERR_UNSUPPORTED,
                           "%s: codec '%s' has no CUDA integer-ring entries (local_scales, ternarise, "
                           "sums_add_pack, sums_values): host buffers only",
                           api, vt->name);
    return GCOMP_SUCCESS;
}

gcomp_result gcomp__codec_device_encode_block(const gcomp__chain *chain, const gcomp__device_ops *ops,
                                              const gcomp_encode_ctx *ctx, const float *x,
                                              const gcomp_cuda_residual *res, size_t count, uint8_t *dst, size_t cap,
                                              void *scratch, gcomp_cuda_status *st, gcomp__device_tally *tally,
                                              size_t *written, struct CUstream_st *stream)
{
    const gcomp__stage *el = &chain->stages[0];
    size_t body_max = el->vt->max_body_bytes(el->params, count), body = body_max;
    int fixed = !(el->vt->caps & GCOMP_CAP_SPARSE);
    gcomp_header h;
    if (cap < GCOMP_HEADER_BYTES)
        return gcomp__fail(GCOMP_ERR_BUFFER_TOO_SMALL, "device encode: output of %zu bytes cannot hold the header", cap);
    GCOMP_CHECK(ops->memset_async(st, 0, sizeof *st, stream));
    GCOMP_CHECK(GCOMP_CODEC_CALL(
        el->vt, cuda->encode,
        (el->params, ctx, x, res, count, dst + GCOMP_HEADER_BYTES, cap - GCOMP_HEADER_BYTES, scratch, st, stream)));
    /* the size depends on the data: read back (one wait on the stream) with the codec's error,
     * so a failed encode is this call's error before its payload is sent; a fixed-size one's
     * error reaches the tally through the header kernel */
    if (!fixed)
        GCOMP_CHECK(sparse_body_bytes(ops, chain, "device encode", st, cap - GCOMP_HEADER_BYTES, &body, stream));
    memset(&h, 0, sizeof h);
    h.dtype = GCOMP_F32;
    h.wire_id = el->vt->wire_id;
    h.count = count;
    GCOMP_CHECK(ops->header_write(dst, &h, st, fixed ? (uint64_t)body_max : UINT64_MAX, tally, stream));
    *written = GCOMP_HEADER_BYTES + body;
    return GCOMP_SUCCESS;
}

gcomp_result gcomp__codec_device_decode_block(const gcomp__chain *chain, const gcomp__device_ops *ops,
                                              const uint8_t *payload, size_t bytes, float *acc, size_t count,
                                              gcomp_cuda_status *st, gcomp__device_tally *tally,
                                              struct CUstream_st *stream)
{
    const gcomp__stage *el = &chain->stages[0];
    GCOMP_CHECK(ops->memset_async(st, 0, sizeof *st, stream));
    GCOMP_CHECK(ops->header_check(payload, bytes, el->vt->wire_id, count, st, stream));
    GCOMP_CHECK(GCOMP_CODEC_CALL(el->vt, cuda->decode_add, (el->params, payload, bytes, acc, count, st, stream)));
    return ops->status_fold(st, tally, stream);
}

gcomp_result gcomp__codec_device_tally_error(const gcomp__chain *chain, const gcomp__device_tally *t)
{
    const char *name = chain->stages[0].vt->name;
    if (t->error == GCOMP_SUCCESS) return GCOMP_SUCCESS;
    if (t->where == GCOMP__WHERE_NONE) return encode_error(name, t->error, "");
    if (t->where == GCOMP__WHERE_HEADER)
        return gcomp__fail(GCOMP_ERR_CORRUPT,
                           "device decode: a payload's header is not one of '%s' with the expected count and size",
                           name);
    if (t->where == GCOMP__WHERE_SIZE)
        return gcomp__fail(GCOMP_ERR_INTERNAL,
                           "device encode: '%s' wrote another body size than max_body_bytes (a codec whose "
                           "size depends on the data must declare GCOMP_CAP_SPARSE)",
                           name);
    if (t->error == GCOMP_ERR_CORRUPT)
        return gcomp__fail(GCOMP_ERR_CORRUPT, "device decode: '%s' found a payload malformed", name);
    return gcomp__fail(t->error <= GCOMP_ERR_INTERNAL ? (gcomp_result)t->error : GCOMP_ERR_INTERNAL,
                       "device work of '%s' failed with %s", name, gcomp_result_name((gcomp_result)t->error));
}

uint64_t gcomp__codec_device_allocs(const gcomp__codec_device *d) { return d ? d->allocs : 0; }

size_t gcomp__codec_device_keys(const gcomp__codec_device *d, uint64_t *keys, size_t cap)
{
    size_t n = d ? d->n_res : 0;
    for (size_t i = 0; i < n && i < cap; i++) keys[i] = d->res[i].key;
    return n;
}

gcomp_result gcomp__codec_device_residual_export(gcomp__codec_device *d, uint64_t key, float *dst, size_t *count,
                                                 uint64_t *step)
{
    dev_residual *r = find_res(d, key);
    gcomp_result rc;
    if (!r) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "no device residual for key %llu", (unsigned long long)key);
    if (!known_state(d, r, NULL, &rc)) return rc;
    *count = r->count;
    *step = r->step;
    if (!dst || !r->count) return GCOMP_SUCCESS;
    GCOMP_CHECK(d->ops->wait(NULL, -1));
    GCOMP_CHECK(d->ops->copy_async(dst,
                                   (uint8_t *)r->mem + ALIGN_UP(sizeof(gcomp_cuda_residual)) +
                                       (r->cur ? ALIGN_UP(r->count * sizeof(float)) : 0),
                                   r->count * sizeof(float), NULL));
    return d->ops->wait(NULL, -1);
}

void gcomp__codec_device_residual_drop_all(gcomp__codec_device *d)
{
    while (d && d->n_res) remove_res(d, &d->res[d->n_res - 1]);
}
