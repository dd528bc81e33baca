/*
 * registry.c — the codec registry: a plain array of vtables, the only global mutable state
 * of the library. Built-ins are registered on first use; users add theirs with
 * gcomp_codec_register(). Wire ids below GCOMP_WIRE_ID_USER_MIN belong to built-ins.
 */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "codec_internal.h"
#include "codecs/cast.h"
#include "codecs/terngrad.h"
#include "codecs/topk.h"
#include "codecs/zstd.h"

#define MAX_CODECS 64

static const gcomp_codec_vtable *codecs[MAX_CODECS];
static size_t n_codecs;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t builtins_once = PTHREAD_ONCE_INIT;

static int valid_name(const char *s)
{
    if (!s || !*s || strlen(s) > 32) return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_')) return 0;
    return 1;
}

/* A parameter table is trusted by the parser, which writes each field at its offset and
 * reads enum names by index: everything that could send it out of bounds is refused here. */
#define MAX_PARAMS 64        /* the parser keeps a 64-bit "seen" mask */
#define MAX_PARAMS_SIZE 4096 /* bytes of a params struct */
#define MAX_CHOICES 64       /* an enum's choices must end with NULL within this many */

/* Choices and keys are spelled in specs: no separator, '=' or whitespace may appear. */
static int spellable(const char *s)
{
    if (!s || !*s || strlen(s) > 32) return 0;
    for (; *s; s++)
        if ((unsigned char)*s <= ' ' || (unsigned char)*s >= 0x7f || strchr("+:,=", *s)) return 0;
    return 1;
}

static size_t param_size(gcomp_param_type t)
{
    switch (t) {
    case GCOMP_PARAM_INT:
        return sizeof(int64_t);
    case GCOMP_PARAM_DOUBLE:
        return sizeof(double);
    case GCOMP_PARAM_ENUM:
        return sizeof(int);
    }
    return 0;
}

static size_t param_align(gcomp_param_type t)
{
    return t == GCOMP_PARAM_INT ? _Alignof(int64_t) : t == GCOMP_PARAM_DOUBLE ? _Alignof(double) : _Alignof(int);
}

static gcomp_result check_enum(const gcomp_codec_vtable *vt, const gcomp_param_def *p)
{
    size_t n = 0;
    if (!p->choices)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "codec '%s': enum parameter '%s' has no choices", vt->name, p->name);
    while (n < MAX_CHOICES && p->choices[n]) {
        if (!spellable(p->choices[n]))
            return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                               "codec '%s': parameter '%s': choice %zu is empty, longer than 32 "
                               "characters or holds whitespace or one of + : , =",
                               vt->name, p->name, n);
        for (size_t j = 0; j < n; j++)
            if (strcmp(p->choices[j], p->choices[n]) == 0)
                return gcomp__fail(GCOMP_ERR_INVALID_ARG, "codec '%s': parameter '%s': choice '%s' appears twice",
                                   vt->name, p->name, p->choices[n]);
        n++;
    }
    if (n == MAX_CHOICES)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                           "codec '%s': parameter '%s': choices must end with NULL within %d "
                           "entries",
                           vt->name, p->name, MAX_CHOICES - 1);
    if (n == 0)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "codec '%s': enum parameter '%s' has no choices", vt->name, p->name);
    if (!(p->def >= 0 && p->def < (double)n && p->def == (double)(int)p->def))
        return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                           "codec '%s': parameter '%s': default %g is not the index of one of its "
                           "%zu choices",
                           vt->name, p->name, p->def, n);
    return GCOMP_SUCCESS;
}

static gcomp_result check_bounds(const gcomp_codec_vtable *vt, const gcomp_param_def *p)
{
    const double two63 = 9223372036854775808.0;
    if (isnan(p->min) || isnan(p->max) || !(p->min <= p->max))
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "codec '%s': parameter '%s': bounds [%g, %g] are not min <= max",
                           vt->name, p->name, p->min, p->max);
    if (!isfinite(p->def) || p->def < p->min || p->def > p->max)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "codec '%s': parameter '%s': default %g is outside [%g, %g]",
                           vt->name, p->name, p->def, p->min, p->max);
    /* an integer default must be an int64_t; [min, max] then holds at least that integer */
    if (p->type == GCOMP_PARAM_INT && (p->def != floor(p->def) || p->def < -two63 || p->def >= two63))
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "codec '%s': integer parameter '%s': default %g is not an int64_t",
                           vt->name, p->name, p->def);
    return GCOMP_SUCCESS;
}

/* Longest text the canonical spec (spec.c) can give a value of p: an int64_t is at most 20
 * characters ("-9223372036854775808"), a double at most 24 (sign, 17 digits, '.', "e-308"),
 * an enum its longest choice. */
static size_t longest_value(const gcomp_param_def *p)
{
    size_t n = 0;
    if (p->type == GCOMP_PARAM_INT) return 20;
    if (p->type == GCOMP_PARAM_DOUBLE) return 24;
    for (size_t i = 0; p->choices[i]; i++)
        if (strlen(p->choices[i]) > n) n = strlen(p->choices[i]);
    return n;
}

/* Every create spells all parameters out in the canonical spec, which must fit in
 * GCOMP_SPEC_MAX: a codec whose spec can outgrow it would register and then fail every
 * create, so refuse it here (with a bound that is safe, not exact). */
static gcomp_result check_spec_length(const gcomp_codec_vtable *vt)
{
    size_t len = strlen(vt->name);
    for (size_t i = 0; i < vt->n_params; i++)
        len += 2 + strlen(vt->params[i].name) + longest_value(&vt->params[i]); /* ":name=" or ",name=" */
    if (len > GCOMP_SPEC_MAX - 1)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                           "codec '%s': its canonical spec (every parameter spelled out) can "
                           "reach %zu characters, more than the %d a spec may have (counting 20 for an integer value, "
                           "24 for a double, an enum's longest choice): use fewer or shorter parameters",
                           vt->name, len, GCOMP_SPEC_MAX - 1);
    return GCOMP_SUCCESS;
}

static gcomp_result check_params(const gcomp_codec_vtable *vt)
{
    if (vt->n_params > MAX_PARAMS)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "codec '%s': %zu parameters, at most %d", vt->name, vt->n_params,
                           MAX_PARAMS);
    if (vt->params_size > MAX_PARAMS_SIZE)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "codec '%s': params_size %zu is over %d bytes", vt->name,
                           vt->params_size, MAX_PARAMS_SIZE);
    for (size_t i = 0; i < vt->n_params; i++) {
        const gcomp_param_def *p = &vt->params[i];
        size_t size = param_size(p->type);
        if (!valid_name(p->name))
            return gcomp__fail(GCOMP_ERR_INVALID_ARG, "codec '%s': parameter %zu: name must be 1-32 chars of [a-z0-9_]",
                               vt->name, i);
        if (!size)
            return gcomp__fail(GCOMP_ERR_INVALID_ARG, "codec '%s': parameter '%s' has unknown type %d", vt->name,
                               p->name, (int)p->type);
        /* written as "size <= params_size - offset" so that a huge offset cannot wrap */
        if (p->offset > vt->params_size || size > vt->params_size - p->offset)
            return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                               "codec '%s': parameter '%s': %zu bytes at offset %zu do not fit "
                               "in params_size %zu",
                               vt->name, p->name, size, p->offset, vt->params_size);
        if (p->offset % param_align(p->type))
            return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                               "codec '%s': parameter '%s': offset %zu is not aligned for its "
                               "type",
                               vt->name, p->name, p->offset);
        /* earlier entries are valid: compare names, and fields for overlap (one would
         * overwrite the other's checked value) */
        for (size_t j = 0; j < i; j++) {
            const gcomp_param_def *q = &vt->params[j];
            if (strcmp(q->name, p->name) == 0)
                return gcomp__fail(GCOMP_ERR_INVALID_ARG, "codec '%s': parameter '%s' appears twice", vt->name,
                                   p->name);
            if (p->offset < q->offset + param_size(q->type) && q->offset < p->offset + size)
                return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                                   "codec '%s': parameters '%s' and '%s' overlap in the params "
                                   "struct",
                                   vt->name, q->name, p->name);
        }
        GCOMP_CHECK(p->type == GCOMP_PARAM_ENUM ? check_enum(vt, p) : check_bounds(vt, p));
    }
    return check_spec_length(vt);
}

/* The integer ring runs on the codec's own entries (src/sched_integer.c): refuse a codec that
 * claims GCOMP_CAP_INTEGER without one of them, naming it. */
static gcomp_result check_integer_entries(const gcomp_codec_vtable *vt)
{
    const struct {
        const char *name;
        int present;
    } need[] = {
        { "num_scales", vt->num_scales != NULL },
        { "local_scales", vt->local_scales != NULL },
        { "int_align", vt->int_align != NULL },
        { "int_sum_bytes", vt->int_sum_bytes != NULL },
        { "int_ternarise", vt->int_ternarise != NULL },
        { "int_sums_add_pack", vt->int_sums_add_pack != NULL },
        { "int_sums_values", vt->int_sums_values != NULL },
    };
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (!need[i].present)
            return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                               "codec '%s' claims GCOMP_CAP_INTEGER but has no %s "
                               "(the integer ring needs num_scales, local_scales, int_align, int_sum_bytes, "
                               "int_ternarise, int_sums_add_pack and int_sums_values)",
                               vt->name, need[i].name);
    return GCOMP_SUCCESS;
}

/* Bits the library knows, and one schedule at most: pick_schedule reads SPARSE before
 * SUMMABLE, so a codec claiming both would silently get the gather; a bit of a later ABI
 * (or 1u << 3, ABI 1's CAP_CUDA) would be ignored. */
static gcomp_result check_caps(const gcomp_codec_vtable *vt)
{
    const uint32_t known = GCOMP_CAP_SUMMABLE | GCOMP_CAP_INTEGER | GCOMP_CAP_SPARSE | GCOMP_CAP_BYTE_STAGE |
                           GCOMP_CAP_RESIDUAL_IN_PLACE | GCOMP_CAP_EXACT;
    const uint32_t schedules = vt->caps & (GCOMP_CAP_SUMMABLE | GCOMP_CAP_INTEGER | GCOMP_CAP_SPARSE);
    if (vt->caps & ~known)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "codec '%s': capability bits 0x%x are not GCOMP_CAP_* of ABI %u",
                           vt->name, (unsigned)(vt->caps & ~known), GCOMP_CODEC_ABI_VERSION);
    if (schedules & (schedules - 1))
        return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                           "codec '%s' claims more than one of GCOMP_CAP_SUMMABLE, GCOMP_CAP_INTEGER and "
                           "GCOMP_CAP_SPARSE (each picks its own schedule)",
                           vt->name);
    return GCOMP_SUCCESS;
}

static gcomp_result check_vtable(const gcomp_codec_vtable *vt)
{
    if (vt->abi_version != GCOMP_CODEC_ABI_VERSION)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "codec ABI version %u, library has %u", vt->abi_version,
                           GCOMP_CODEC_ABI_VERSION);
    if (!valid_name(vt->name)) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "codec name must be 1-32 chars of [a-z0-9_]");
    if (vt->wire_id == 0) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "codec '%s': wire id 0 is invalid", vt->name);
    GCOMP_CHECK(check_caps(vt));
    if (vt->n_params && !vt->params)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "codec '%s': n_params > 0 but no table", vt->name);
    if (vt->caps & GCOMP_CAP_BYTE_STAGE) {
        if (!vt->stage_bound || !vt->stage_encode || !vt->stage_decode)
            return gcomp__fail(GCOMP_ERR_INVALID_ARG, "byte stage '%s' lacks stage functions", vt->name);
    } else if (!vt->max_body_bytes || !vt->encode || !vt->decode_add) {
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "codec '%s' lacks max_body_bytes/encode/decode_add", vt->name);
    }
    if (vt->caps & GCOMP_CAP_INTEGER) GCOMP_CHECK(check_integer_entries(vt));
    if ((vt->caps & GCOMP_CAP_SPARSE) && (vt->sparse_k || vt->sparse_pairs || vt->sparse_sum_pairs) &&
        !(vt->sparse_k && vt->sparse_pairs && vt->sparse_sum_pairs))
        return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                           "SPARSE codec '%s' sets some of sparse_k, sparse_pairs and "
                           "sparse_sum_pairs: the gather's pair path needs all three (or none, for decode_add)",
                           vt->name);
    return check_params(vt);
}

static gcomp_result add_locked(const gcomp_codec_vtable *vt)
{
    for (size_t i = 0; i < n_codecs; i++) {
        if (strcmp(codecs[i]->name, vt->name) == 0)
            return gcomp__fail(GCOMP_ERR_EXISTS, "a codec named '%s' is already registered", vt->name);
        if (codecs[i]->wire_id == vt->wire_id)
            return gcomp__fail(GCOMP_ERR_EXISTS, "wire id %u is taken by codec '%s'", vt->wire_id, codecs[i]->name);
    }
    if (n_codecs == MAX_CODECS) return gcomp__fail(GCOMP_ERR_NOMEM, "codec registry is full (%d codecs)", MAX_CODECS);
    codecs[n_codecs++] = vt;
    return GCOMP_SUCCESS;
}

static void register_builtins(void)
{
    static const gcomp_codec_vtable *const builtins[] = {
        &gcomp__codec_none,     &gcomp__codec_fp16, &gcomp__codec_bf16,
        &gcomp__codec_terngrad, &gcomp__codec_topk, &gcomp__codec_zstd,
    };
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++) add_locked(builtins[i]);
    pthread_mutex_unlock(&lock);
}

void gcomp__registry_init(void) { pthread_once(&builtins_once, register_builtins); }

gcomp_result gcomp_codec_register(const gcomp_codec_vtable *vt)
{
    gcomp_result rc;
    gcomp__registry_init();
    if (!vt) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_codec_register: NULL vtable");
    GCOMP_CHECK(check_vtable(vt));
    if (vt->wire_id < GCOMP_WIRE_ID_USER_MIN)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "codec '%s': wire ids below %d are reserved for built-ins", vt->name,
                           GCOMP_WIRE_ID_USER_MIN);
    pthread_mutex_lock(&lock);
    rc = add_locked(vt);
    pthread_mutex_unlock(&lock);
    return rc;
}

gcomp_result gcomp__codec_unregister(const gcomp_codec_vtable *vt)
{
    gcomp_result rc = GCOMP_ERR_INVALID_ARG;
    gcomp__registry_init();
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < n_codecs; i++) {
        if (codecs[i] != vt || vt->wire_id < GCOMP_WIRE_ID_USER_MIN) continue;
        memmove(&codecs[i], &codecs[i + 1], (n_codecs - i - 1) * sizeof codecs[0]);
        n_codecs--;
        rc = GCOMP_SUCCESS;
        break;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

const gcomp_codec_vtable *gcomp_codec_find(const char *name)
{
    const gcomp_codec_vtable *found = NULL;
    gcomp__registry_init();
    if (!name) return NULL;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < n_codecs && !found; i++)
        if (strcmp(codecs[i]->name, name) == 0) found = codecs[i];
    pthread_mutex_unlock(&lock);
    return found;
}

const gcomp_codec_vtable *gcomp_codec_find_id(uint16_t wire_id)
{
    const gcomp_codec_vtable *found = NULL;
    gcomp__registry_init();
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < n_codecs && !found; i++)
        if (codecs[i]->wire_id == wire_id) found = codecs[i];
    pthread_mutex_unlock(&lock);
    return found;
}

const char *gcomp_codec_name_at(size_t idx)
{
    const char *name = NULL;
    gcomp__registry_init();
    pthread_mutex_lock(&lock);
    if (idx < n_codecs) name = codecs[idx]->name;
    pthread_mutex_unlock(&lock);
    return name;
}
