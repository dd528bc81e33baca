/*
 * codec.c — the public codec object: a parsed spec chain, per-key residuals, stats and
 * reusable scratch. Writes and checks the payload headers so codecs only see bodies.
 *
 * Encode: [f16/bf16 -> f32 widen] -> element codec (residual fused) -> byte stages.
 * Decode: byte stages peeled from the outside in -> element decode_add (the cast codecs'
 * one-pass decode and pair sum for the engine: cast.h).
 */
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codec_device.h"
#include "codec_internal.h"
#include "device.h"
#include "codecs/cast.h"
#include "codecs/topk.h"

struct gcomp_codec {
    gcomp__chain chain;
    gcomp_codec_options opts;
    gcomp__residual_store residuals;
    gcomp_stats stats;
    uint64_t nokey_step; /* step counter of calls without error feedback */
    /* scratch from the host device ops, grown on demand and reused */
    void *widen;
    size_t widen_cap;
    void *stage_buf[2];
    size_t stage_cap[2];
    gcomp__codec_device *dev; /* device buffers' state (codec_device.c); NULL until a device call */
};

/* Grow a scratch buffer of the codec object to at least bytes, from the host device ops
 * (never shrinks). Its contents are not kept: every caller fills the buffer it grows. */
static gcomp_result scratch_reserve(void **buf, size_t *cap, size_t bytes)
{
    void *p = NULL;
    if (bytes <= *cap) return GCOMP_SUCCESS;
    if (gcomp__device_host.alloc(bytes, &p) != GCOMP_SUCCESS)
        return gcomp__fail(GCOMP_ERR_NOMEM, "cannot allocate %zu bytes of scratch", bytes);
    gcomp__device_host.free(*buf);
    *buf = p;
    *cap = bytes;
    return GCOMP_SUCCESS;
}

/* What the device path (codec_device.c) works on: device buffers take it at each entry. */
#define DEVICE_PARTS(c) \
    (&(gcomp__codec_parts){ &(c)->chain, &(c)->opts, &(c)->stats, &(c)->residuals, &(c)->nokey_step, &(c)->dev })

gcomp_codec_options gcomp_codec_options_default(void)
{
    gcomp_codec_options o;
    memset(&o, 0, sizeof o);
    o.error_feedback = 1;
    return o;
}

gcomp_result gcomp_codec_create(const char *spec, const gcomp_codec_options *opts, gcomp_codec **out)
{
    gcomp_codec *c;
    gcomp_result rc;
    if (!out) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_codec_create: out is NULL");
    *out = NULL;
    if (!spec) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_codec_create: spec is NULL");
    if (opts && opts->error_feedback != 0 && opts->error_feedback != 1) /* as gcomp_config's */
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_codec_create: error_feedback must be 0 or 1, not %d",
                           opts->error_feedback);
    c = calloc(1, sizeof *c);
    if (!c) return gcomp__fail(GCOMP_ERR_NOMEM, "gcomp_codec_create: out of memory");
    c->opts = opts ? *opts : gcomp_codec_options_default();
    rc = gcomp__chain_parse(spec, &c->chain);
    if (rc != GCOMP_SUCCESS) {
        free(c);
        return rc;
    }
    *out = c;
    return GCOMP_SUCCESS;
}

void gcomp_codec_destroy(gcomp_codec *c)
{
    if (!c) return;
    gcomp__chain_free(&c->chain);
    gcomp__residual_store_free(&c->residuals);
    gcomp__codec_device_free(c->dev);
    gcomp__device_host.free(c->widen);
    gcomp__device_host.free(c->stage_buf[0]);
    gcomp__device_host.free(c->stage_buf[1]);
    free(c);
}

const char *gcomp_codec_spec(const gcomp_codec *c) { return c ? c->chain.canonical : ""; }

/* fn's refusal of a count no codec sees (GCOMP_MAX_COUNT). */
static gcomp_result past_max_count(const char *fn, size_t count)
{
    return gcomp__fail(GCOMP_ERR_INVALID_ARG, "%s: count %zu is more than GCOMP_MAX_COUNT (%zu)", fn, count,
                       (size_t)GCOMP_MAX_COUNT);
}

size_t gcomp_codec_kept(const gcomp_codec *c, size_t count)
{
    const gcomp__stage *el;
    if (!c) {
        gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_codec_kept: codec is NULL");
        return 0;
    }
    if (count > GCOMP_MAX_COUNT) { /* as gcomp_codec_max_encoded_bytes: no codec sees such counts */
        past_max_count("gcomp_codec_kept", count);
        return 0;
    }
    el = &c->chain.stages[0];
    if (el->vt == &gcomp__codec_topk) return (size_t)gcomp_topk_k(el->params, count);
    if (el->vt->caps & GCOMP_CAP_SPARSE) { /* a user codec: its k is its own business */
        gcomp__fail(GCOMP_ERR_UNSUPPORTED, "gcomp_codec_kept: '%s' is a user sparse codec", el->vt->name);
        return 0;
    }
    return count;
}

/* Largest payload the first `stages` stages of the chain can produce for count elements,
 * or 0 when it would not fit in a size_t. Codecs see only counts up to GCOMP_MAX_COUNT, for
 * which their own products cannot wrap (gcomp_codec.h); the header additions are checked
 * here, and a stage bound of SIZE_MAX (zstd past its largest input) means "none". */
static size_t bound_of_prefix(const gcomp__chain *ch, size_t stages, size_t count)
{
    const gcomp__stage *el = &ch->stages[0];
    size_t bytes;
    if (count > GCOMP_MAX_COUNT) return 0;
    bytes = el->vt->max_body_bytes(el->params, count);
    for (size_t i = 0; i < stages; i++) {
        if (i > 0) bytes = ch->stages[i].vt->stage_bound(ch->stages[i].params, bytes);
        if (bytes > SIZE_MAX - GCOMP_HEADER_BYTES) return 0;
        bytes += GCOMP_HEADER_BYTES;
    }
    return bytes;
}

size_t gcomp_codec_max_encoded_bytes(const gcomp_codec *c, size_t count)
{
    size_t bound;
    if (!c) {
        gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_codec_max_encoded_bytes: codec is NULL");
        return 0;
    }
    bound = bound_of_prefix(&c->chain, c->chain.n_stages, count);
    if (!bound)
        gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_codec_max_encoded_bytes: %s cannot bound %zu elements in a size_t%s",
                    c->chain.canonical, count, count > GCOMP_MAX_COUNT ? " (more than GCOMP_MAX_COUNT)" : "");
    return bound;
}

static gcomp_result check_buffers(const char *fn, const void *a, const void *b, size_t count)
{
    if (count > 0 && (!a || !b)) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "%s: NULL buffer with count %zu", fn, count);
    return GCOMP_SUCCESS; /* the count's limit: check_layout, which every caller runs first */
}

/* 1 when [a, a + an) and [b, b + bn) share a byte (no sum that could wrap). */
static int ranges_overlap(const void *a, size_t an, const void *b, size_t bn)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    if (!an || !bn) return 0;
    return x >= y ? x - y < bn : y - x < an;
}

/* The buffer rules of gcomp.h (codec objects, "Buffers"), checked before any path -- host or
 * device -- touches them: an element buffer (src, dst, acc) is read and written through typed
 * pointers (float, uint16_t; float4 in the kernels), so it must be aligned to its element
 * size; a payload is bytes (any alignment). The output must not overlap the input: decode
 * zeroes dst before it reads the payload, encode writes the header before it reads src.
 * A bad dtype (align 0) is left to the checks after this. */
static gcomp_result check_layout(const char *fn, const char *in_name, const void *in, size_t in_elems, size_t in_align,
                                 const char *out_name, const void *out, size_t out_elems, size_t out_align)
{
    size_t in_bytes, out_bytes;
    if (!in_align || !out_align) return GCOMP_SUCCESS;
    /* a count too large for any buffer is refused later; here it only must not wrap */
    in_bytes = in_elems > SIZE_MAX / in_align ? SIZE_MAX : in_elems * in_align;
    out_bytes = out_elems > SIZE_MAX / out_align ? SIZE_MAX : out_elems * out_align;
    if (in_elems && ((uintptr_t)in & (in_align - 1)))
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "%s: %s (%p) is not aligned to its %zu-byte elements", fn, in_name,
                           in, in_align);
    if (out_elems && ((uintptr_t)out & (out_align - 1)))
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "%s: %s (%p) is not aligned to its %zu-byte elements", fn, out_name,
                           out, out_align);
    /* element buffers (align > 1; payloads are bytes): a count past the limit is that,
     * not an overlap of a buffer said to reach past the end of memory */
    if ((in_align > 1 && in_elems > GCOMP_MAX_COUNT) || (out_align > 1 && out_elems > GCOMP_MAX_COUNT))
        return past_max_count(fn, in_align > 1 ? in_elems : out_elems);
    if (in && out && ranges_overlap(in, in_bytes, out, out_bytes))
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "%s: %s (%p, %zu bytes) overlaps %s (%p, %zu bytes)", fn, out_name,
                           out, out_bytes, in_name, in, in_bytes);
    return GCOMP_SUCCESS;
}

/* What one of a codec's entries reported (entry: its name in the vtable), checked before
 * anything reads or sends the bytes: a user codec may return a value that is no gcomp_result,
 * or report more bytes written than the capacity it was given, and either would otherwise
 * reach the caller, or the ring, as if it were true (a payload past its buffer's end). */
static gcomp_result codec_reported(const gcomp_codec_vtable *vt, const char *entry, gcomp_result rc, size_t wrote,
                                   size_t cap)
{
    GCOMP_CHECK(gcomp__codec_entry_rc(vt->name, entry, rc));
    if (wrote > cap)
        return gcomp__fail(GCOMP_ERR_INTERNAL, "codec '%s': %s reported %zu bytes written into a buffer of %zu",
                           vt->name, entry, wrote, cap);
    return GCOMP_SUCCESS;
}

/* Element stage: header + body straight into out. */
static gcomp_result encode_element(gcomp_codec *c, gcomp_encode_ctx *ctx, const float *x, const float *r_in,
                                   float *r_out, size_t count, gcomp_dtype dtype, uint8_t *out, size_t cap,
                                   size_t *written)
{
    const gcomp__stage *el = &c->chain.stages[0];
    gcomp_header h = { 0 };
    size_t body = 0;
    gcomp_result rc;
    if (cap < GCOMP_HEADER_BYTES)
        return gcomp__fail(GCOMP_ERR_BUFFER_TOO_SMALL, "output of %zu bytes cannot hold the header", cap);
    ctx->state = el->state;
    gcomp__codec_entry_begin();
    rc = el->vt->encode(el->params, ctx, x, r_in, r_out, count, out + GCOMP_HEADER_BYTES, cap - GCOMP_HEADER_BYTES,
                        &body, &h.flags);
    GCOMP_CHECK(codec_reported(el->vt, "encode", rc, body, cap - GCOMP_HEADER_BYTES));
    h.dtype = (uint8_t)dtype;
    h.wire_id = el->vt->wire_id;
    h.count = count;
    h.body_bytes = body;
    gcomp_header_write(out, &h);
    *written = GCOMP_HEADER_BYTES + body;
    return GCOMP_SUCCESS;
}

static gcomp_result encode_stage(gcomp__stage *st, const uint8_t *in, size_t in_bytes, size_t count, gcomp_dtype dtype,
                                 uint8_t *out, size_t cap, size_t *written)
{
    gcomp_header h = { 0 };
    size_t body = 0;
    gcomp_result rc;
    if (cap < GCOMP_HEADER_BYTES)
        return gcomp__fail(GCOMP_ERR_BUFFER_TOO_SMALL, "output of %zu bytes cannot hold the header", cap);
    gcomp__codec_entry_begin();
    rc = st->vt->stage_encode(st->params, st->state, in, in_bytes, out + GCOMP_HEADER_BYTES, cap - GCOMP_HEADER_BYTES,
                              &body, &h.flags);
    GCOMP_CHECK(codec_reported(st->vt, "stage_encode", rc, body, cap - GCOMP_HEADER_BYTES));
    h.dtype = (uint8_t)dtype;
    h.wire_id = st->vt->wire_id;
    h.count = count;
    h.body_bytes = body;
    gcomp_header_write(out, &h);
    *written = GCOMP_HEADER_BYTES + body;
    return GCOMP_SUCCESS;
}

/* Stages 1.. of the chain (the byte stages) over `in`, into dst. Intermediate payloads
 * alternate between the two scratch buffers, which the caller has sized. */
static gcomp_result encode_byte_stages(gcomp_codec *c, const uint8_t *in, size_t bytes, size_t count, gcomp_dtype dtype,
                                       uint8_t *dst, size_t cap, size_t *written)
{
    size_t n = c->chain.n_stages;
    const uint8_t *prev = in;
    for (size_t i = 1; i < n; i++) {
        int last = i + 1 == n;
        uint8_t *out = last ? dst : c->stage_buf[i & 1];
        size_t out_cap = last ? cap : c->stage_cap[i & 1];
        GCOMP_CHECK(encode_stage(&c->chain.stages[i], prev, bytes, count, dtype, out, out_cap, &bytes));
        prev = out;
    }
    *written = bytes;
    return GCOMP_SUCCESS;
}

/* Run the element codec and every byte stage; intermediate payloads live in scratch.
 * A failed encode writes nothing to dst: with dst_cap >= the bound (the usual case) every
 * stage succeeds, so the last one writes straight into dst; a smaller dst gets the payload
 * copied from scratch only once it is known to fit. */
static gcomp_result encode_chain(gcomp_codec *c, gcomp_encode_ctx *ctx, const float *x, const float *r_in, float *r_out,
                                 size_t count, gcomp_dtype dtype, uint8_t *dst, size_t cap, size_t *written)
{
    size_t n = c->chain.n_stages, bytes = 0, bound = bound_of_prefix(&c->chain, n, count);
    int direct = cap >= bound;
    uint8_t *out;
    if (!bound)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "encode: %s cannot bound %zu elements in a size_t",
                           c->chain.canonical, count);
    if (direct && n == 1) return encode_element(c, ctx, x, r_in, r_out, count, dtype, dst, cap, written);
    for (int b = 0; b < 2; b++) GCOMP_CHECK(scratch_reserve(&c->stage_buf[b], &c->stage_cap[b], bound));
    GCOMP_CHECK(encode_element(c, ctx, x, r_in, r_out, count, dtype, c->stage_buf[0], c->stage_cap[0], &bytes));
    if (n > 1) {
        /* the last stage writes into dst, or into the scratch buffer its input is not in */
        out = direct ? dst : c->stage_buf[(n - 1) & 1];
        GCOMP_CHECK(encode_byte_stages(c, c->stage_buf[0], bytes, count, dtype, out, direct ? cap : bound, &bytes));
    } else {
        out = c->stage_buf[0];
    }
    if (!direct) {
        if (bytes > cap)
            return gcomp__fail(GCOMP_ERR_BUFFER_TOO_SMALL,
                               "encode: the %s payload is %zu bytes, the output holds %zu "
                               "(gcomp_codec_max_encoded_bytes() = %zu always fits)",
                               c->chain.canonical, bytes, cap, bound);
        memcpy(dst, out, bytes);
    }
    *written = bytes;
    return GCOMP_SUCCESS;
}

gcomp_result gcomp_codec_encode(gcomp_codec *c, uint64_t key, const void *src, size_t count, gcomp_dtype dtype,
                                void *dst, size_t dst_cap, size_t *written)
{
    gcomp_encode_ctx ctx = { 0 };
    gcomp__ef ef = { 0 };
    gcomp_result rc;
    const float *x = (const float *)src;
    size_t esize = gcomp_dtype_size(dtype);

    if (!c || !written) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_codec_encode: NULL codec or written");
    *written = 0;
    GCOMP_CHECK(check_layout("gcomp_codec_encode", "src", src, count, esize, "dst", dst, dst_cap, 1));
    if (gcomp__codec_device_wanted(src, dst))
        return gcomp__codec_device_encode(DEVICE_PARTS(c), key, src, count, dtype, dst, dst_cap, written, NULL, 1);
    if (!esize) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_codec_encode: invalid dtype %d", (int)dtype);
    GCOMP_CHECK(check_buffers("gcomp_codec_encode", src, dst, count));
    if (!dst) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_codec_encode: dst is NULL");
    if (dtype != GCOMP_F32) {
        GCOMP_CHECK(scratch_reserve(&c->widen, &c->widen_cap, count * sizeof(float)));
        GCOMP_CHECK(gcomp__device_host.widen(src, dtype, count, c->widen, NULL));
        x = c->widen;
    }
    ctx.seed = c->opts.seed;
    ctx.rank = c->opts.rank;
    if (c->opts.error_feedback && key != GCOMP_KEY_NONE) {
        int in_place = (c->chain.stages[0].vt->caps & GCOMP_CAP_RESIDUAL_IN_PLACE) != 0;
        /* an in-place residual is updated by the element codec: nothing may fail after
         * that (a byte stage, the copy out of scratch), so the output must hold the bound
         * before anything is touched */
        if (in_place && dst_cap < gcomp_codec_max_encoded_bytes(c, count))
            return gcomp__fail(GCOMP_ERR_BUFFER_TOO_SMALL,
                               "gcomp_codec_encode: %s needs an output of "
                               "gcomp_codec_max_encoded_bytes() = %zu bytes, got %zu",
                               c->chain.canonical, gcomp_codec_max_encoded_bytes(c, count), dst_cap);
        GCOMP_CHECK(gcomp__ef_begin(&c->residuals, key, count, in_place, &ef));
        ctx.step = ef.step;
    } else {
        ctx.step = c->nokey_step++;
    }
    rc = encode_chain(c, &ctx, x, ef.r_in, ef.r_out, count, dtype, dst, dst_cap, written);
    if (rc != GCOMP_SUCCESS) { /* as if it had not run: the residual and the step as they were */
        if (!ef.res) c->nokey_step = ctx.step;
        gcomp__ef_abandon(&ef, 0);
        return rc;
    }
    /* A non-finite result must not poison the residual: keep the old one. */
    if (ctx.nonfinite) c->stats.nonfinite_calls++;
    gcomp__ef_end(&ef, (int)ctx.nonfinite);
    c->stats.encode_calls++;
    c->stats.raw_bytes += count * esize;
    c->stats.wire_bytes += *written;
    c->stats.overflow_count += ctx.overflow;
    return GCOMP_SUCCESS;
}

static gcomp_result expect_header(const gcomp_codec_vtable *vt, const gcomp_header *h, size_t count)
{
    if (h->wire_id != vt->wire_id) {
        const gcomp_codec_vtable *other = gcomp_codec_find_id(h->wire_id);
        return gcomp__fail(GCOMP_ERR_CORRUPT, "payload was written by codec %u (%s), expected '%s'", h->wire_id,
                           other ? other->name : "unknown", vt->name);
    }
    if (h->count != count)
        return gcomp__fail(GCOMP_ERR_CORRUPT, "payload holds %llu elements, caller expects %zu",
                           (unsigned long long)h->count, count);
    return GCOMP_SUCCESS;
}

gcomp_result gcomp__codec_element_body(gcomp_codec *c, const void *payload, size_t bytes, size_t count,
                                       const uint8_t **body, size_t *body_bytes, uint32_t *flags)
{
    const uint8_t *p = (const uint8_t *)payload;
    gcomp_header h;
    for (size_t i = c->chain.n_stages; i-- > 1;) { /* undo the byte stages, outermost first */
        gcomp__stage *st = &c->chain.stages[i];
        size_t inner_cap = bound_of_prefix(&c->chain, i, count), inner = 0;
        GCOMP_CHECK(gcomp_header_read(p, bytes, &h));
        GCOMP_CHECK(expect_header(st->vt, &h, count));
        GCOMP_CHECK(scratch_reserve(&c->stage_buf[i & 1], &c->stage_cap[i & 1], inner_cap));
        gcomp__codec_entry_begin();
        gcomp_result rc = st->vt->stage_decode(st->params, st->state, h.flags, p + GCOMP_HEADER_BYTES, h.body_bytes,
                                               c->stage_buf[i & 1], inner_cap, &inner);
        GCOMP_CHECK(codec_reported(st->vt, "stage_decode", rc, inner, inner_cap));
        p = c->stage_buf[i & 1];
        bytes = inner;
    }
    GCOMP_CHECK(gcomp_header_read(p, bytes, &h));
    GCOMP_CHECK(expect_header(c->chain.stages[0].vt, &h, count));
    *body = p + GCOMP_HEADER_BYTES;
    *body_bytes = h.body_bytes;
    *flags = h.flags;
    return GCOMP_SUCCESS;
}

gcomp_result gcomp_codec_decode_add(gcomp_codec *c, const void *payload, size_t bytes, float *acc, size_t count)
{
    const gcomp__stage *el;
    const uint8_t *body;
    size_t body_bytes;
    uint32_t flags;
    gcomp_result rc;
    if (!c || !payload) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_codec_decode_add: NULL codec or payload");
    GCOMP_CHECK(check_layout("gcomp_codec_decode_add", "payload", payload, bytes, 1, "acc", acc, count, sizeof(float)));
    if (gcomp__codec_device_wanted(payload, acc))
        return gcomp__codec_device_decode_add(DEVICE_PARTS(c), payload, bytes, acc, count, NULL, 1);
    GCOMP_CHECK(check_buffers("gcomp_codec_decode_add", payload, acc, count));
    GCOMP_CHECK(gcomp__codec_element_body(c, payload, bytes, count, &body, &body_bytes, &flags));
    el = &c->chain.stages[0];
    gcomp__codec_entry_begin();
    rc = el->vt->decode_add(el->params, flags, body, body_bytes, acc, count);
    GCOMP_CHECK(codec_reported(el->vt, "decode_add", rc, 0, 0));
    c->stats.decode_calls++;
    return GCOMP_SUCCESS;
}

/* acc = decode(payload) on the host: the cast codecs write it in one pass (cast.h), the others
 * add into zeros; the same bits either way, and zeros after a failure either way. */
static gcomp_result decode_f32(gcomp_codec *c, const void *payload, size_t bytes, float *acc, size_t count)
{
    const gcomp__stage *el = &c->chain.stages[0];
    const uint8_t *body;
    size_t body_bytes;
    uint32_t flags;
    gcomp_result rc;
    if (!gcomp__is_cast_codec(el->vt)) {
        if (count) memset(acc, 0, count * sizeof(float));
        return gcomp_codec_decode_add(c, payload, bytes, acc, count);
    }
    rc = gcomp__codec_element_body(c, payload, bytes, count, &body, &body_bytes, &flags);
    if (rc == GCOMP_SUCCESS) rc = gcomp__cast_decode_set(el->vt, flags, body, body_bytes, acc, count);
    if (rc != GCOMP_SUCCESS) {
        if (count) memset(acc, 0, count * sizeof(float));
        return rc;
    }
    c->stats.decode_calls++;
    return GCOMP_SUCCESS;
}

gcomp_result gcomp__codec_decode_sum2(gcomp_codec *c, const void *first, size_t fbytes, const void *second,
                                      size_t sbytes, float *dst, size_t count)
{
    const gcomp__stage *el = &c->chain.stages[0];
    gcomp__cast_body a, b;
    gcomp_result rc;
    /* byte stages undo each payload into the codec's one scratch: the two-pass way then */
    if (c->chain.n_stages > 1 || !gcomp__is_cast_codec(el->vt)) {
        rc = decode_f32(c, first, fbytes, dst, count);
        if (rc == GCOMP_SUCCESS) rc = gcomp_codec_decode_add(c, second, sbytes, dst, count);
        if (rc != GCOMP_SUCCESS && count) memset(dst, 0, count * sizeof(float));
        return rc;
    }
    rc = gcomp__codec_element_body(c, first, fbytes, count, &a.body, &a.bytes, &a.flags);
    if (rc == GCOMP_SUCCESS) rc = gcomp__codec_element_body(c, second, sbytes, count, &b.body, &b.bytes, &b.flags);
    if (rc == GCOMP_SUCCESS) rc = gcomp__cast_decode_sum2(el->vt, &a, &b, dst, count);
    if (rc != GCOMP_SUCCESS) {
        if (count) memset(dst, 0, count * sizeof(float));
        return rc;
    }
    c->stats.decode_calls += 2;
    return GCOMP_SUCCESS;
}

gcomp_result gcomp_codec_decode(gcomp_codec *c, const void *payload, size_t bytes, void *dst, size_t count,
                                gcomp_dtype dtype)
{
    float *acc = (float *)dst;
    if (!c || !payload) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_codec_decode: NULL codec or payload");
    GCOMP_CHECK(
        check_layout("gcomp_codec_decode", "payload", payload, bytes, 1, "dst", dst, count, gcomp_dtype_size(dtype)));
    if (gcomp__codec_device_wanted(payload, dst))
        return gcomp__codec_device_decode(DEVICE_PARTS(c), payload, bytes, dst, count, dtype, NULL, 1);
    if (!gcomp_dtype_size(dtype))
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_codec_decode: invalid dtype %d", (int)dtype);
    GCOMP_CHECK(check_buffers("gcomp_codec_decode", payload, dst, count));
    if (dtype != GCOMP_F32) {
        GCOMP_CHECK(scratch_reserve(&c->widen, &c->widen_cap, count * sizeof(float)));
        acc = c->widen;
    }
    GCOMP_CHECK(decode_f32(c, payload, bytes, acc, count));
    if (dtype != GCOMP_F32) GCOMP_CHECK(gcomp__device_host.narrow(acc, count, dtype, dst, NULL));
    return GCOMP_SUCCESS;
}

/* An object with error feedback off ignores keys (encode neither reads nor writes a residual):
 * a residual set there would be kept, read back, and never used, so set and get refuse, as a
 * communicator's checkpoints do. */
static gcomp_result check_ef_on(const gcomp_codec *c, const char *fn)
{
    if (!c->opts.error_feedback)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                           "%s: the codec object has error feedback off (gcomp_codec_options.error_feedback = 0): "
                           "it keeps no residuals",
                           fn);
    return GCOMP_SUCCESS;
}

gcomp_result gcomp_codec_residual_get(const gcomp_codec *c, uint64_t key, float *dst, size_t count)
{
    const gcomp__residual *r;
    if (!c || (count && !dst)) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_codec_residual_get: NULL argument");
    GCOMP_CHECK(check_ef_on(c, "gcomp_codec_residual_get"));
    if (gcomp__codec_device_has_key(c->dev, key) || gcomp__codec_device_wanted(dst, NULL))
        return gcomp__codec_device_residual_get(c->dev, &c->residuals, key, dst, count);
    r = gcomp__residual_find(&c->residuals, key);
    if (!r) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "no residual for key %llu", (unsigned long long)key);
    if (r->count != count)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "key %llu has %zu elements, not %zu", (unsigned long long)key,
                           r->count, count);
    if (count) memcpy(dst, r->buf[r->cur], count * sizeof(float));
    return GCOMP_SUCCESS;
}

gcomp_result gcomp_codec_residual_set(gcomp_codec *c, uint64_t key, const float *src, size_t count)
{
    gcomp__residual *r;
    int src_on_device;
    if (!c || (count && !src)) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_codec_residual_set: NULL argument");
    if (count > GCOMP_MAX_COUNT) /* no encode makes such a key; src would be read before the refusal */
        return past_max_count("gcomp_codec_residual_set", count);
    GCOMP_CHECK(check_ef_on(c, "gcomp_codec_residual_set"));
    if (key == GCOMP_KEY_NONE)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                           "gcomp_codec_residual_set: key GCOMP_KEY_NONE means no error feedback and holds no residual");
    /* a non-finite residual would make every later result of the key non-finite, and the
     * key could never recover (a non-finite step keeps the residual as it is); a src in
     * device memory is checked on its device (codec_device.c) */
    src_on_device = gcomp__codec_device_wanted(src, NULL);
    if (!src_on_device)
        for (size_t i = 0; i < count; i++)
            if (!isfinite(src[i]))
                return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                                   "gcomp_codec_residual_set: element %zu of key %llu's residual is not finite (%g)",
                                   i, (unsigned long long)key, (double)src[i]);
    if (src_on_device || gcomp__codec_device_has_key(c->dev, key))
        return gcomp__codec_device_residual_set(DEVICE_PARTS(c), key, src, count);
    GCOMP_CHECK(gcomp__residual_acquire(&c->residuals, key, count, 0, &r));
    if (count) memcpy(r->buf[r->cur], src, count * sizeof(float));
    return GCOMP_SUCCESS;
}

gcomp_result gcomp_codec_residual_reset(gcomp_codec *c, uint64_t key)
{
    if (!c) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_codec_residual_reset: codec is NULL");
    gcomp__residual_drop(&c->residuals, key);
    gcomp__codec_device_residual_drop(c->dev, key);
    return GCOMP_SUCCESS;
}

/* Device buffers take the device path on the caller's stream; host buffers run at once. */
gcomp_result gcomp_codec_encode_async(gcomp_codec *c, uint64_t key, const void *src, size_t count, gcomp_dtype dtype,
                                      void *dst, size_t dst_cap, size_t *written, struct CUstream_st *stream)
{
    if (!c) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_codec_encode_async: codec is NULL");
    GCOMP_CHECK(
        check_layout("gcomp_codec_encode_async", "src", src, count, gcomp_dtype_size(dtype), "dst", dst, dst_cap, 1));
    if (written && gcomp__codec_device_wanted(src, dst))
        return gcomp__codec_device_encode(DEVICE_PARTS(c), key, src, count, dtype, dst, dst_cap, written, stream, 0);
    return gcomp_codec_encode(c, key, src, count, dtype, dst, dst_cap, written);
}

gcomp_result gcomp_codec_decode_add_async(gcomp_codec *c, const void *payload, size_t bytes, float *acc, size_t count,
                                          struct CUstream_st *stream)
{
    if (!c || !payload)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_codec_decode_add_async: NULL codec or payload");
    GCOMP_CHECK(
        check_layout("gcomp_codec_decode_add_async", "payload", payload, bytes, 1, "acc", acc, count, sizeof(float)));
    if (gcomp__codec_device_wanted(payload, acc))
        return gcomp__codec_device_decode_add(DEVICE_PARTS(c), payload, bytes, acc, count, stream, 0);
    return gcomp_codec_decode_add(c, payload, bytes, acc, count);
}

gcomp_result gcomp_codec_decode_async(gcomp_codec *c, const void *payload, size_t bytes, void *dst, size_t count,
                                      gcomp_dtype dtype, struct CUstream_st *stream)
{
    if (!c || !payload) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_codec_decode_async: NULL codec or payload");
    GCOMP_CHECK(check_layout("gcomp_codec_decode_async", "payload", payload, bytes, 1, "dst", dst, count,
                             gcomp_dtype_size(dtype)));
    if (gcomp__codec_device_wanted(payload, dst))
        return gcomp__codec_device_decode(DEVICE_PARTS(c), payload, bytes, dst, count, dtype, stream, 0);
    return gcomp_codec_decode(c, payload, bytes, dst, count, dtype);
}

gcomp_result gcomp_codec_sync(gcomp_codec *c, struct CUstream_st *stream)
{
    if (!c) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_codec_sync: codec is NULL");
    return gcomp__codec_device_sync(DEVICE_PARTS(c), stream);
}

gcomp_result gcomp_codec_stats_get(const gcomp_codec *c, gcomp_stats *out)
{
    if (!c || !out) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_codec_stats_get: NULL argument");
    *out = c->stats;
    return GCOMP_SUCCESS;
}

gcomp_result gcomp_codec_stats_reset(gcomp_codec *c)
{
    if (!c) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_codec_stats_reset: codec is NULL");
    memset(&c->stats, 0, sizeof c->stats);
    return GCOMP_SUCCESS;
}

/* ---- internals for the schedules (codec_internal.h) -------------------------------------- */

const gcomp__chain *gcomp__codec_chain(const gcomp_codec *c) { return &c->chain; }

gcomp__residual_store *gcomp__codec_residuals(gcomp_codec *c) { return &c->residuals; }

gcomp_result gcomp__codec_encode_ctx(gcomp_codec *c, gcomp_encode_ctx *ctx, const float *x, const float *r_in,
                                     float *r_out, size_t count, void *dst, size_t cap, size_t *written)
{
    gcomp_result rc = encode_chain(c, ctx, x, r_in, r_out, count, GCOMP_F32, dst, cap, written);
    if (rc == GCOMP_SUCCESS) c->stats.overflow_count += ctx->overflow;
    return rc;
}

size_t gcomp__codec_stages_bound(const gcomp_codec *c, size_t bytes)
{
    for (size_t i = 1; i < c->chain.n_stages; i++)
        bytes = GCOMP_HEADER_BYTES + c->chain.stages[i].vt->stage_bound(c->chain.stages[i].params, bytes);
    return bytes;
}

/* Raw bytes through the byte stages only (the integer ring's packed sums). The scratch
 * buffers of the codec object hold the intermediate stages. */
gcomp_result gcomp__codec_stages_encode(gcomp_codec *c, const void *in, size_t n, size_t count, void *out, size_t cap,
                                        size_t *written)
{
    if (c->chain.n_stages == 1) {
        if (cap < n) return gcomp__fail(GCOMP_ERR_BUFFER_TOO_SMALL, "need %zu bytes, have %zu", n, cap);
        memmove(out, in, n);
        *written = n;
        return GCOMP_SUCCESS;
    }
    for (int b = 0; b < 2; b++)
        GCOMP_CHECK(scratch_reserve(&c->stage_buf[b], &c->stage_cap[b], gcomp__codec_stages_bound(c, n)));
    return encode_byte_stages(c, in, n, count, GCOMP_F32, out, cap, written);
}

gcomp_result gcomp__codec_stages_decode(gcomp_codec *c, const void *in, size_t n, size_t count, void *out, size_t cap,
                                        size_t *written)
{
    const uint8_t *p = in;
    size_t bytes = n;
    gcomp_header h;
    if (c->chain.n_stages == 1) {
        if (n > cap) return gcomp__fail(GCOMP_ERR_CORRUPT, "message of %zu bytes, at most %zu expected", n, cap);
        memmove(out, in, n);
        *written = n;
        return GCOMP_SUCCESS;
    }
    for (size_t i = c->chain.n_stages; i-- > 1;) {
        gcomp__stage *st = &c->chain.stages[i];
        int last = i == 1;
        uint8_t *o = last ? out : c->stage_buf[i & 1];
        size_t o_cap = last ? cap : c->stage_cap[i & 1], inner = 0;
        if (!last)
            GCOMP_CHECK(scratch_reserve(&c->stage_buf[i & 1], &c->stage_cap[i & 1], gcomp__codec_stages_bound(c, cap)));
        o = last ? out : c->stage_buf[i & 1];
        o_cap = last ? cap : c->stage_cap[i & 1];
        GCOMP_CHECK(gcomp_header_read(p, bytes, &h));
        GCOMP_CHECK(expect_header(st->vt, &h, count));
        gcomp__codec_entry_begin();
        gcomp_result rc = st->vt->stage_decode(st->params, st->state, h.flags, p + GCOMP_HEADER_BYTES, h.body_bytes, o,
                                               o_cap, &inner);
        GCOMP_CHECK(codec_reported(st->vt, "stage_decode", rc, inner, o_cap));
        p = o;
        bytes = inner;
    }
    *written = bytes;
    return GCOMP_SUCCESS;
}

/* ---- the codec object on device buffers, for the engine (codec_internal.h) ---------------- */

gcomp_result gcomp__codec_device_usable(const gcomp_codec *c, const char *api)
{
    return gcomp__codec_device_check(api, &c->chain);
}

gcomp_result gcomp__codec_dev_ef_begin(gcomp_codec *c, const gcomp__device_ops *ops, uint64_t key, size_t count,
                                       struct CUstream_st *stream, gcomp__dev_ef *ef)
{
    return gcomp__codec_device_ef_begin(DEVICE_PARTS(c), ops, key, count, stream, ef);
}

gcomp_result gcomp__codec_dev_ef_end(gcomp_codec *c, gcomp__dev_ef *ef, int keep, struct CUstream_st *stream)
{
    return gcomp__codec_device_ef_end(DEVICE_PARTS(c), ef, keep, stream);
}

void gcomp__codec_dev_ef_abandon(gcomp_codec *c, gcomp__dev_ef *ef, int keep_step, struct CUstream_st *stream)
{
    gcomp__codec_device_ef_abandon(DEVICE_PARTS(c), ef, keep_step, stream);
}

gcomp_result gcomp__codec_dev_encode(gcomp_codec *c, const gcomp__device_ops *ops, const gcomp_encode_ctx *ctx,
                                     const float *x, const gcomp_cuda_residual *res, size_t count, void *dst,
                                     size_t cap, void *scratch, gcomp_cuda_status *st, gcomp__device_tally *tally,
                                     size_t *written, struct CUstream_st *stream)
{
    return gcomp__codec_device_encode_block(&c->chain, ops, ctx, x, res, count, (uint8_t *)dst, cap, scratch, st, tally,
                                            written, stream);
}

gcomp_result gcomp__codec_dev_decode_add(gcomp_codec *c, const gcomp__device_ops *ops, const void *payload,
                                         size_t bytes, float *acc, size_t count, gcomp_cuda_status *st,
                                         gcomp__device_tally *tally, struct CUstream_st *stream)
{
    return gcomp__codec_device_decode_block(&c->chain, ops, (const uint8_t *)payload, bytes, acc, count, st, tally,
                                            stream);
}

gcomp_result gcomp__codec_dev_tally_error(const gcomp_codec *c, const gcomp__device_tally *t)
{
    return gcomp__codec_device_tally_error(&c->chain, t);
}

uint64_t gcomp__codec_dev_allocs(const gcomp_codec *c) { return c ? gcomp__codec_device_allocs(c->dev) : 0; }

int gcomp__codec_dev_has_key(const gcomp_codec *c, uint64_t key) { return gcomp__codec_device_has_key(c->dev, key); }

gcomp_result gcomp__codec_dev_move_to_host(gcomp_codec *c, uint64_t key)
{
    size_t count = 0;
    uint64_t step = 0;
    gcomp__residual *r;
    if (!gcomp__codec_device_has_key(c->dev, key)) return GCOMP_SUCCESS;
    GCOMP_CHECK(gcomp__codec_device_residual_export(c->dev, key, NULL, &count, &step));
    GCOMP_CHECK(gcomp__residual_acquire(&c->residuals, key, count, 0, &r));
    GCOMP_CHECK(gcomp__codec_device_residual_export(c->dev, key, r->buf[r->cur], &count, &step));
    r->step = step;
    gcomp__codec_device_residual_drop(c->dev, key);
    return GCOMP_SUCCESS;
}

size_t gcomp__codec_dev_keys(const gcomp_codec *c, uint64_t *keys, size_t cap)
{
    return gcomp__codec_device_keys(c->dev, keys, cap);
}

gcomp_result gcomp__codec_dev_export(gcomp_codec *c, uint64_t key, float *dst, size_t *count, uint64_t *step)
{
    return gcomp__codec_device_residual_export(c->dev, key, dst, count, step);
}

void gcomp__codec_dev_drop_all(gcomp_codec *c) { gcomp__codec_device_residual_drop_all(c->dev); }
