/*
 * registry.c — the codec registry: a plain array of vtables, the only global mutable state
 * of the library. Built-ins are registered on first use; users add theirs with
 * gcomp_codec_register(). Wire ids below GCOMP_WIRE_ID_USER_MIN belong to built-ins.
 */
#include <pthread.h>
#include <string.h>

#include "internal.h"
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

static gcomp_result check_vtable(const gcomp_codec_vtable *vt)
{
    if (vt->abi_version != GCOMP_CODEC_ABI_VERSION)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "codec ABI version %u, library has %u",
                           vt->abi_version, GCOMP_CODEC_ABI_VERSION);
    if (!valid_name(vt->name))
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "codec name must be 1-32 chars of [a-z0-9_]");
    if (vt->wire_id == 0) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "codec '%s': wire id 0 is invalid", vt->name);
    if (vt->n_params && !vt->params)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "codec '%s': n_params > 0 but no table", vt->name);
    if (vt->caps & GCOMP_CAP_BYTE_STAGE) {
        if (!vt->stage_bound || !vt->stage_encode || !vt->stage_decode)
            return gcomp__fail(GCOMP_ERR_INVALID_ARG, "byte stage '%s' lacks stage functions", vt->name);
    } else if (!vt->max_body_bytes || !vt->encode || !vt->decode_add) {
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "codec '%s' lacks max_body_bytes/encode/decode_add",
                           vt->name);
    }
    if ((vt->caps & GCOMP_CAP_INTEGER) && (!vt->num_scales || !vt->local_scales || !vt->encode_scaled))
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "INTEGER codec '%s' lacks its scale functions", vt->name);
    for (size_t i = 0; i < vt->n_params; i++) {
        const gcomp_param_def *p = &vt->params[i];
        if (!p->name || p->offset >= vt->params_size || (p->type == GCOMP_PARAM_ENUM && !p->choices))
            return gcomp__fail(GCOMP_ERR_INVALID_ARG, "codec '%s': parameter %zu is malformed", vt->name, i);
    }
    return GCOMP_SUCCESS;
}

static gcomp_result add_locked(const gcomp_codec_vtable *vt)
{
    for (size_t i = 0; i < n_codecs; i++) {
        if (strcmp(codecs[i]->name, vt->name) == 0)
            return gcomp__fail(GCOMP_ERR_EXISTS, "a codec named '%s' is already registered", vt->name);
        if (codecs[i]->wire_id == vt->wire_id)
            return gcomp__fail(GCOMP_ERR_EXISTS, "wire id %u is taken by codec '%s'", vt->wire_id,
                               codecs[i]->name);
    }
    if (n_codecs == MAX_CODECS)
        return gcomp__fail(GCOMP_ERR_NOMEM, "codec registry is full (%d codecs)", MAX_CODECS);
    codecs[n_codecs++] = vt;
    return GCOMP_SUCCESS;
}

static void register_builtins(void)
{
    static const gcomp_codec_vtable *const builtins[] = {
        &gcomp__codec_none, &gcomp__codec_fp16, &gcomp__codec_bf16,
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
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "codec '%s': wire ids below %d are reserved for built-ins",
                           vt->name, GCOMP_WIRE_ID_USER_MIN);
    pthread_mutex_lock(&lock);
    rc = add_locked(vt);
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
