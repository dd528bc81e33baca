/*
 * residual.c — error-feedback residuals of host buffers, one per caller-given 64-bit key, in
 * an open-addressing hash table. Buffers come from the host device ops (device.h), created
 * zeroed at a key's first call and recreated when its element count changes. (Residuals of
 * device buffers live in codec_device.c.)
 */
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "device.h"

static size_t slot_of(uint64_t key, size_t cap)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return (size_t)key & (cap - 1);
}

static size_t find_slot(const gcomp__residual_store *s, uint64_t key)
{
    size_t i = slot_of(key, s->cap);
    while (s->slots[i] && s->slots[i]->key != key) i = (i + 1) & (s->cap - 1);
    return i;
}

static gcomp_result grow(gcomp__residual_store *s)
{
    size_t new_cap = s->cap ? s->cap * 2 : 16;
    gcomp__residual **old = s->slots;
    size_t old_cap = s->cap;
    s->slots = calloc(new_cap, sizeof *s->slots);
    if (!s->slots) {
        s->slots = old;
        return gcomp__fail(GCOMP_ERR_NOMEM, "residual store: cannot grow to %zu keys", new_cap);
    }
    s->cap = new_cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i]) s->slots[find_slot(s, old[i]->key)] = old[i];
    free(old);
    return GCOMP_SUCCESS;
}

static void free_buffers(gcomp__residual *r)
{
    gcomp__device_host.free(r->buf[0]);
    gcomp__device_host.free(r->buf[1]);
    r->buf[0] = r->buf[1] = NULL;
    r->count = 0;
}

/* An entry and its buffers (NULL is a no-op). */
static void free_entry(gcomp__residual *r)
{
    if (!r) return;
    free_buffers(r);
    free(r);
}

/* Zeroed by the host's alloc_zeroed (calloc): the kernel hands out zero pages lazily, so a
 * large new residual costs nothing until the first encode touches it. */
static gcomp_result alloc_zeroed(size_t count, float **out)
{
    void *p = NULL;
    *out = NULL;
    if (count > SIZE_MAX / sizeof(float) || gcomp__device_host.alloc_zeroed(count * sizeof(float), &p) != GCOMP_SUCCESS)
        return gcomp__fail(GCOMP_ERR_NOMEM, "cannot allocate a residual of %zu elements", count);
    *out = p;
    return GCOMP_SUCCESS;
}

static gcomp_result alloc_buffers(gcomp__residual *r, size_t count)
{
    GCOMP_CHECK(alloc_zeroed(count, &r->buf[0]));
    r->count = count;
    r->cur = 0;
    r->step = 0;
    return GCOMP_SUCCESS;
}

static gcomp_result ensure_second(gcomp__residual *r)
{
    if (r->buf[r->cur ^ 1]) return GCOMP_SUCCESS;
    return alloc_zeroed(r->count, &r->buf[r->cur ^ 1]);
}

gcomp__residual *gcomp__residual_find(const gcomp__residual_store *s, uint64_t key)
{
    if (!s->cap) return NULL;
    return s->slots[find_slot(s, key)];
}

/* A new zeroed residual for key, outside the store (its count differs from the stored one). */
static gcomp_result fresh_residual(uint64_t key, size_t count, int double_buffer, gcomp__residual **out)
{
    gcomp__residual *r = calloc(1, sizeof *r);
    *out = NULL;
    if (!r) return gcomp__fail(GCOMP_ERR_NOMEM, "cannot allocate a residual entry");
    r->key = key;
    if (alloc_buffers(r, count) != GCOMP_SUCCESS || (double_buffer && ensure_second(r) != GCOMP_SUCCESS)) {
        free_entry(r);
        return GCOMP_ERR_NOMEM;
    }
    *out = r;
    return GCOMP_SUCCESS;
}

gcomp_result gcomp__residual_acquire(gcomp__residual_store *s, uint64_t key, size_t count, int double_buffer,
                                     gcomp__residual **out)
{
    gcomp__residual *r = gcomp__residual_find(s, key);
    if (r) {
        if (r->count != count) {
            gcomp__debug("residual key %llu: count %zu -> %zu, reset", (unsigned long long)key, r->count, count);
            free_buffers(r);
            GCOMP_CHECK(alloc_buffers(r, count));
        }
        if (double_buffer) GCOMP_CHECK(ensure_second(r));
        *out = r;
        return GCOMP_SUCCESS;
    }
    if ((s->used + 1) * 2 > s->cap) GCOMP_CHECK(grow(s));
    GCOMP_CHECK(fresh_residual(key, count, double_buffer, &r));
    s->slots[find_slot(s, key)] = r;
    s->used++;
    *out = r;
    return GCOMP_SUCCESS;
}

void gcomp__residual_commit(gcomp__residual *r) { r->cur ^= 1; }

/* The step advances with every call that takes the residual, committed or not (a non-finite
 * step is not replayed: the checkpointed step says so), and is given back by a call that fails
 * (gcomp__ef_abandon). A key whose count changed starts from a zero residual and step 0 in a
 * new entry; the old one stays in the store until the call ends, so a call that fails
 * changes nothing. */
gcomp_result gcomp__ef_begin(gcomp__residual_store *s, uint64_t key, size_t count, int in_place, gcomp__ef *ef)
{
    gcomp__residual *r = gcomp__residual_find(s, key);
    memset(ef, 0, sizeof *ef);
    ef->store = s;
    if (!r) {
        GCOMP_CHECK(gcomp__residual_acquire(s, key, count, !in_place, &r));
        ef->created = 1;
    } else if (r->count != count) {
        GCOMP_CHECK(fresh_residual(key, count, !in_place, &r));
        ef->fresh = 1;
    } else if (!in_place) {
        GCOMP_CHECK(ensure_second(r)); /* one lookup per call: the store's entry is r */
    }
    ef->res = r;
    ef->r_in = r->buf[r->cur];
    ef->r_out = in_place ? ef->r_in : r->buf[r->cur ^ 1];
    ef->step = r->step++;
    return GCOMP_SUCCESS;
}

/* The new entry of a key whose count changed takes the old one's place in the store (the
 * old one is there: nothing drops a key while a call on it runs). */
static void install_fresh(gcomp__ef *ef)
{
    gcomp__residual *old = gcomp__residual_find(ef->store, ef->res->key);
    gcomp__debug("residual key %llu: count %zu -> %zu, reset", (unsigned long long)ef->res->key, old->count,
                 ef->res->count);
    free_buffers(old);
    *old = *ef->res;
    free(ef->res);
    ef->res = old;
    ef->fresh = 0;
}

/* A double-buffered residual is committed by flipping buffers; an in-place one was already
 * written (or, by the GCOMP_CAP_RESIDUAL_IN_PLACE promise, left alone when not finite). */
void gcomp__ef_end(gcomp__ef *ef, int nonfinite)
{
    if (!ef->res) return;
    if (ef->fresh) install_fresh(ef); /* not finite: the new residual stays zero, as the reset made it */
    if (!nonfinite && ef->r_out != ef->r_in) gcomp__residual_commit(ef->res);
    ef->res = NULL;
    ef->created = 0;
}

/* A call that failed: a new entry is dropped (the key keeps its old residual, count and
 * step), and so is a key the call brought (it held nothing before: a refused first call
 * leaves no key for a checkpoint to list or a load to compare counts with); a key's own entry
 * keeps its residual (an in-place one, TernGrad's on the integer ring, may already be
 * written) and gets its step back unless keep_step. */
void gcomp__ef_abandon(gcomp__ef *ef, int keep_step)
{
    if (ef->fresh)
        free_entry(ef->res);
    else if (ef->res && ef->created)
        gcomp__residual_drop(ef->store, ef->res->key);
    else if (ef->res && !keep_step)
        ef->res->step = ef->step;
    ef->res = NULL;
    ef->fresh = 0;
    ef->created = 0;
}

/* Remove with backward-shift so later probes still find their keys. */
void gcomp__residual_drop(gcomp__residual_store *s, uint64_t key)
{
    size_t i, j;
    if (!s->cap) return;
    i = find_slot(s, key);
    if (!s->slots[i]) return;
    free_entry(s->slots[i]);
    s->slots[i] = NULL;
    s->used--;
    for (j = (i + 1) & (s->cap - 1); s->slots[j]; j = (j + 1) & (s->cap - 1)) {
        gcomp__residual *moved = s->slots[j];
        s->slots[j] = NULL;
        s->slots[find_slot(s, moved->key)] = moved;
    }
}

void gcomp__residual_store_free(gcomp__residual_store *s)
{
    for (size_t i = 0; i < s->cap; i++) free_entry(s->slots[i]);
    free(s->slots);
    memset(s, 0, sizeof *s);
}

void gcomp__residual_store_replace(gcomp__residual_store *s, gcomp__residual_store *with)
{
    gcomp__residual_store_free(s);
    *s = *with;
    memset(with, 0, sizeof *with);
}
