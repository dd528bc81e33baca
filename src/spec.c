/*
 * spec.c — the one spec parser for every codec:
 *     spec   := stage ('+' stage)*
 *     stage  := name (':' key '=' value (',' key '=' value)*)?
 * Each stage's keys are looked up in its codec's parameter table; the value is parsed by
 * the table's type and checked against its bounds. Any error names the stage, key or value.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Shortest "%.*g" that reads back as the same double, so canonical specs stay readable.
 * The exponent's '+' is dropped ("1e+20" -> "1e20"): '+' separates stages in a spec. */
static void format_double(char *out, size_t cap, double v)
{
    char *plus;
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, cap, "%.*g", prec, v);
        if (strtod(out, NULL) == v) break;
    }
    plus = strstr(out, "e+");
    if (plus) memmove(plus + 1, plus + 2, strlen(plus + 2) + 1);
}

static const gcomp_param_def *find_param(const gcomp_codec_vtable *vt, const char *key)
{
    for (size_t i = 0; i < vt->n_params; i++)
        if (strcmp(vt->params[i].name, key) == 0) return &vt->params[i];
    return NULL;
}

static void set_default(const gcomp_param_def *p, void *params)
{
    char *field = (char *)params + p->offset;
    switch (p->type) {
    case GCOMP_PARAM_INT: *(int64_t *)field = (int64_t)p->def; break;
    case GCOMP_PARAM_DOUBLE: *(double *)field = p->def; break;
    case GCOMP_PARAM_ENUM: *(int *)field = (int)p->def; break;
    }
}

static gcomp_result parse_value(const char *spec, const char *codec, const gcomp_param_def *p,
                                const char *val, void *params)
{
    char *field = (char *)params + p->offset;
    char *end = NULL;
    if (!*val) return gcomp__fail(GCOMP_ERR_INVALID_SPEC, "spec '%s': %s: '%s' has an empty value", spec, codec, p->name);
    errno = 0;
    if (p->type == GCOMP_PARAM_INT) {
        long long v = strtoll(val, &end, 10);
        if (*end || errno)
            return gcomp__fail(GCOMP_ERR_INVALID_SPEC, "spec '%s': %s: %s='%s' is not an integer", spec, codec, p->name, val);
        if ((double)v < p->min || (double)v > p->max)
            return gcomp__fail(GCOMP_ERR_INVALID_SPEC, "spec '%s': %s: %s=%lld is out of range [%.15g, %.15g]",
                               spec, codec, p->name, v, p->min, p->max);
        *(int64_t *)field = v;
    } else if (p->type == GCOMP_PARAM_DOUBLE) {
        double v = strtod(val, &end);
        if (*end || errno || !isfinite(v))
            return gcomp__fail(GCOMP_ERR_INVALID_SPEC, "spec '%s': %s: %s='%s' is not a finite number", spec, codec, p->name, val);
        if (v < p->min || v > p->max)
            return gcomp__fail(GCOMP_ERR_INVALID_SPEC, "spec '%s': %s: %s=%s is out of range [%.15g, %.15g]",
                               spec, codec, p->name, val, p->min, p->max);
        *(double *)field = v;
    } else {
        for (int i = 0; p->choices[i]; i++) {
            if (strcmp(p->choices[i], val) == 0) {
                *(int *)field = i;
                return GCOMP_SUCCESS;
            }
        }
        return gcomp__fail(GCOMP_ERR_INVALID_SPEC, "spec '%s': %s: %s='%s' is not one of the allowed values", spec, codec,
                           p->name, val);
    }
    return GCOMP_SUCCESS;
}

/* Parse "key=value,key=value" (modified in place) into params. */
static gcomp_result parse_params(const char *spec, const gcomp_codec_vtable *vt, char *list, void *params)
{
    uint64_t seen = 0;
    char *save = NULL;
    if (!*list) return gcomp__fail(GCOMP_ERR_INVALID_SPEC, "spec '%s': %s: ':' must be followed by key=value", spec, vt->name);
    for (char *kv = strtok_r(list, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        const gcomp_param_def *p;
        if (!eq) return gcomp__fail(GCOMP_ERR_INVALID_SPEC, "spec '%s': %s: '%s' is not key=value", spec, vt->name, kv);
        *eq = '\0';
        p = find_param(vt, kv);
        if (!p) return gcomp__fail(GCOMP_ERR_INVALID_SPEC, "spec '%s': codec '%s' has no parameter '%s'", spec, vt->name, kv);
        if (seen & (1ull << (p - vt->params)))
            return gcomp__fail(GCOMP_ERR_INVALID_SPEC, "spec '%s': %s: '%s' is given twice", spec, vt->name, kv);
        seen |= 1ull << (p - vt->params);
        GCOMP_CHECK(parse_value(spec, vt->name, p, eq + 1, params));
    }
    /* strtok_r skips empty tokens: catch "a=1,,b=2" and a trailing comma here. */
    return GCOMP_SUCCESS;
}

static void append_canonical(gcomp__chain *c, const gcomp_codec_vtable *vt, const void *params)
{
    size_t len = strlen(c->canonical);
    char *out = c->canonical + len;
    size_t cap = sizeof c->canonical - len;
    int n = snprintf(out, cap, "%s%s", len ? "+" : "", vt->name);
    for (size_t i = 0; i < vt->n_params && n > 0 && (size_t)n < cap; i++) {
        const gcomp_param_def *p = &vt->params[i];
        const char *field = (const char *)params + p->offset;
        char val[64];
        if (p->type == GCOMP_PARAM_INT) snprintf(val, sizeof val, "%lld", (long long)*(const int64_t *)field);
        else if (p->type == GCOMP_PARAM_DOUBLE) format_double(val, sizeof val, *(const double *)field);
        else snprintf(val, sizeof val, "%s", p->choices[*(const int *)field]);
        n += snprintf(out + n, cap - (size_t)n, "%s%s=%s", i ? "," : ":", p->name, val);
    }
}

static gcomp_result parse_stage(const char *spec, char *text, size_t idx, gcomp__chain *c)
{
    char *colon = strchr(text, ':');
    const gcomp_codec_vtable *vt;
    gcomp__stage *st = &c->stages[idx];
    if (colon) *colon = '\0';
    if (!*text) return gcomp__fail(GCOMP_ERR_INVALID_SPEC, "spec '%s': stage %zu has no codec name", spec, idx + 1);
    vt = gcomp_codec_find(text);
    if (!vt) return gcomp__fail(GCOMP_ERR_INVALID_SPEC, "spec '%s': unknown codec '%s'", spec, text);
    if (idx == 0 && (vt->caps & GCOMP_CAP_BYTE_STAGE))
        return gcomp__fail(GCOMP_ERR_INVALID_SPEC, "spec '%s': '%s' is a byte stage; it must follow an element codec (e.g. fp16+%s)",
                           spec, vt->name, vt->name);
    if (idx > 0 && !(vt->caps & GCOMP_CAP_BYTE_STAGE))
        return gcomp__fail(GCOMP_ERR_INVALID_SPEC, "spec '%s': '%s' is an element codec; only byte stages (zstd) may follow '+'",
                           spec, vt->name);
    st->vt = vt;
    st->params = calloc(1, vt->params_size ? vt->params_size : 1);
    if (!st->params) return gcomp__fail(GCOMP_ERR_NOMEM, "spec '%s': out of memory", spec);
    c->n_stages = idx + 1;
    for (size_t i = 0; i < vt->n_params; i++) set_default(&vt->params[i], st->params);
    if (colon) GCOMP_CHECK(parse_params(spec, vt, colon + 1, st->params));
    if (vt->check_params) {
        char msg[256] = "";
        if (vt->check_params(st->params, msg, sizeof msg) != GCOMP_SUCCESS)
            return gcomp__fail(GCOMP_ERR_INVALID_SPEC, "spec '%s': %s: %s", spec, vt->name, msg);
    }
    if (vt->state_create) {
        st->state = vt->state_create(st->params);
        if (!st->state) return gcomp__fail(GCOMP_ERR_NOMEM, "spec '%s': %s: cannot create its state", spec, vt->name);
    }
    append_canonical(c, vt, st->params);
    return GCOMP_SUCCESS;
}

/* Catch empty pieces that strtok would silently skip: "a++b", "a:x=1,,y=2", trailing ',' '+'. */
static gcomp_result check_punctuation(const char *spec)
{
    size_t len = strlen(spec);
    if (len == 0) return gcomp__fail(GCOMP_ERR_INVALID_SPEC, "empty codec spec");
    if (len >= GCOMP_SPEC_MAX) return gcomp__fail(GCOMP_ERR_INVALID_SPEC, "spec is longer than %d characters", GCOMP_SPEC_MAX - 1);
    for (size_t i = 0; i < len; i++) {
        char ch = spec[i], next = spec[i + 1];
        if ((ch == '+' || ch == ',') && (next == '+' || next == ',' || next == '\0' || i == 0))
            return gcomp__fail(GCOMP_ERR_INVALID_SPEC, "spec '%s': empty element at character %zu", spec, i + 1);
        if (ch == ' ' || ch == '\t')
            return gcomp__fail(GCOMP_ERR_INVALID_SPEC, "spec '%s': whitespace is not allowed", spec);
    }
    return GCOMP_SUCCESS;
}

gcomp_result gcomp__chain_parse(const char *spec, gcomp__chain *out)
{
    char buf[GCOMP_SPEC_MAX];
    char *save = NULL;
    size_t idx = 0;
    gcomp_result rc = GCOMP_SUCCESS;

    memset(out, 0, sizeof *out);
    if (!spec) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "codec spec is NULL");
    GCOMP_CHECK(check_punctuation(spec));
    strcpy(buf, spec);
    for (char *st = strtok_r(buf, "+", &save); st; st = strtok_r(NULL, "+", &save), idx++) {
        if (idx == GCOMP_MAX_STAGES) {
            rc = gcomp__fail(GCOMP_ERR_INVALID_SPEC, "spec '%s': more than %d stages", spec, GCOMP_MAX_STAGES);
            break;
        }
        rc = parse_stage(spec, st, idx, out);
        if (rc != GCOMP_SUCCESS) break;
    }
    if (rc != GCOMP_SUCCESS) gcomp__chain_free(out);
    return rc;
}

void gcomp__chain_free(gcomp__chain *chain)
{
    if (!chain) return;
    for (size_t i = 0; i < chain->n_stages; i++) {
        gcomp__stage *st = &chain->stages[i];
        if (st->state && st->vt->state_destroy) st->vt->state_destroy(st->state);
        free(st->params);
    }
    memset(chain, 0, sizeof *chain);
}
