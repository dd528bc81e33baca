/*
 * spec.c — the one spec parser for every codec:
 *     spec   := stage ('+' stage)*
 *     stage  := name (':' key '=' value (',' key '=' value)*)?
 * A '+' separates stages, except inside a number: a value's first character ("ratio=+0.5")
 * or right after the exponent letter of a number ("1e+3", "0x1p+4") belongs to the value.
 * Each stage's keys are looked up in its codec's parameter table; the value is parsed by
 * the table's type (integers as integers, compared with integer bounds) and checked against
 * its bounds. A message gives the reason first, then a shortened, escaped quote of the spec.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"

#define QUOTE_SPEC 64 /* characters of the spec a message quotes */
#define QUOTE_TEXT 32 /* characters of a name, key or value a message quotes */

/* Fail with "<reason> (spec '<spec, shortened and escaped>')": the reason comes first so a
 * long spec cannot push it out of gcomp_last_error()'s buffer. */
static gcomp_result spec_fail(gcomp_result rc, const char *spec, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static gcomp_result spec_fail(gcomp_result rc, const char *spec, const char *fmt, ...)
{
    char reason[384], q[4 * QUOTE_SPEC + 8];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    return gcomp__fail(rc, "%s (spec '%s')", reason, gcomp__quote(q, sizeof q, spec, QUOTE_SPEC));
}

/* Shortest "%.*g" that reads back as the same double, so canonical specs stay readable.
 * The exponent's '+' is dropped ("1e+20" -> "1e20"): shorter, and reads the same. */
static void format_double(char *out, size_t cap, double v)
{
    char *plus;
    /* -0 is written 0: the same value, so one canonical spelling (ranks compare specs), for a
     * value parsed from the spec and a registered default alike */
    v += 0.0;
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, cap, "%.*g", prec, v);
        if (strtod(out, NULL) == v) break;
    }
    plus = strstr(out, "e+");
    if (plus) memmove(plus + 1, plus + 2, strlen(plus + 2) + 1);
}

/* The integers within an INT parameter's double bounds, exactly: [ceil(min), floor(max)]
 * clamped to int64_t. (Doubles of magnitude >= 2^53 are integers, so the casts are exact
 * where it matters; the registry has checked min <= max and that neither is NaN.) */
static void int_bounds(const gcomp_param_def *p, int64_t *lo, int64_t *hi)
{
    const double two63 = 9223372036854775808.0;
    if (p->min < -two63)
        *lo = INT64_MIN;
    else if (p->min >= two63)
        *lo = INT64_MAX;
    else {
        *lo = (int64_t)p->min;
        if ((double)*lo < p->min) (*lo)++;
    }
    if (p->max >= two63)
        *hi = INT64_MAX;
    else if (p->max < -two63)
        *hi = INT64_MIN;
    else {
        *hi = (int64_t)p->max;
        if ((double)*hi > p->max) (*hi)--;
    }
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
    case GCOMP_PARAM_INT:
        *(int64_t *)field = (int64_t)p->def;
        break;
    case GCOMP_PARAM_DOUBLE:
        *(double *)field = p->def;
        break;
    case GCOMP_PARAM_ENUM:
        *(int *)field = (int)p->def;
        break;
    }
}

static gcomp_result parse_int(const char *spec, const char *codec, const gcomp_param_def *p, const char *val,
                              int64_t *out)
{
    char qv[4 * QUOTE_TEXT + 8];
    char *end = NULL;
    long long v;
    int64_t lo, hi;
    const char *digits = val + (*val == '+' || *val == '-');
    gcomp__quote(qv, sizeof qv, val, QUOTE_TEXT);
    int_bounds(p, &lo, &hi);
    errno = 0;
    v = strtoll(val, &end, 10);
    if (*digits < '0' || *digits > '9' || *end)
        return spec_fail(GCOMP_ERR_INVALID_SPEC, spec, "%s: %s='%s' is not an integer", codec, p->name, qv);
    if (errno == ERANGE || v < lo || v > hi)
        return spec_fail(GCOMP_ERR_INVALID_SPEC, spec, "%s: %s=%s is out of range [%lld, %lld]", codec, p->name, qv,
                         (long long)lo, (long long)hi);
    *out = v;
    return GCOMP_SUCCESS;
}

static gcomp_result parse_double(const char *spec, const char *codec, const gcomp_param_def *p, const char *val,
                                 double *out)
{
    char qv[4 * QUOTE_TEXT + 8], lo[32], hi[32];
    char *end = NULL;
    double v;
    int range_err;
    gcomp__quote(qv, sizeof qv, val, QUOTE_TEXT);
    format_double(lo, sizeof lo, p->min);
    format_double(hi, sizeof hi, p->max);
    errno = 0;
    v = strtod(val, &end);
    range_err = errno == ERANGE;
    if (end == val || *end)
        return spec_fail(GCOMP_ERR_INVALID_SPEC, spec, "%s: %s='%s' is not a number", codec, p->name, qv);
    /* ERANGE with a finite non-zero result is a subnormal: a valid double, kept. Overflow
     * (+-HUGE_VAL) and underflow to zero are values a double cannot hold: out of range. */
    if (range_err && (isinf(v) || v == 0.0))
        return spec_fail(GCOMP_ERR_INVALID_SPEC, spec, "%s: %s=%s is out of range [%s, %s] (%s)", codec, p->name, qv,
                         lo, hi, v == 0.0 ? "too small for a double: it underflows to 0" : "too large for a double");
    if (!isfinite(v))
        return spec_fail(GCOMP_ERR_INVALID_SPEC, spec, "%s: %s='%s' is not a finite number", codec, p->name, qv);
    if (v < p->min || v > p->max)
        return spec_fail(GCOMP_ERR_INVALID_SPEC, spec, "%s: %s=%s is out of range [%s, %s]", codec, p->name, qv, lo,
                         hi);
    *out = v;
    return GCOMP_SUCCESS;
}

static gcomp_result parse_enum(const char *spec, const char *codec, const gcomp_param_def *p, const char *val, int *out)
{
    char qv[4 * QUOTE_TEXT + 8], list[160] = "";
    size_t len = 0;
    for (int i = 0; p->choices[i]; i++) {
        if (strcmp(p->choices[i], val) == 0) {
            *out = i;
            return GCOMP_SUCCESS;
        }
        if (len < sizeof list)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "", p->choices[i]);
    }
    return spec_fail(GCOMP_ERR_INVALID_SPEC, spec, "%s: %s='%s' is not one of the allowed values (%s)", codec, p->name,
                     gcomp__quote(qv, sizeof qv, val, QUOTE_TEXT), list);
}

static gcomp_result parse_value(const char *spec, const char *codec, const gcomp_param_def *p, const char *val,
                                void *params)
{
    char *field = (char *)params + p->offset;
    if (!*val) return spec_fail(GCOMP_ERR_INVALID_SPEC, spec, "%s: '%s' has an empty value", codec, p->name);
    switch (p->type) {
    case GCOMP_PARAM_INT: {
        int64_t v = 0;
        GCOMP_CHECK(parse_int(spec, codec, p, val, &v));
        memcpy(field, &v, sizeof v);
        break;
    }
    case GCOMP_PARAM_DOUBLE: {
        double v = 0;
        GCOMP_CHECK(parse_double(spec, codec, p, val, &v));
        memcpy(field, &v, sizeof v);
        break;
    }
    case GCOMP_PARAM_ENUM: {
        int v = 0;
        GCOMP_CHECK(parse_enum(spec, codec, p, val, &v));
        memcpy(field, &v, sizeof v);
        break;
    }
    }
    return GCOMP_SUCCESS;
}

/* Parse "key=value,key=value" (modified in place) into params. base is the start of the
 * parser's copy of the spec, so positions in messages count from the spec's start. */
static gcomp_result parse_params(const char *spec, const char *base, const gcomp_codec_vtable *vt, char *list,
                                 void *params)
{
    uint64_t seen = 0; /* the registry allows at most 64 parameters */
    char *kv = list;
    if (!*list) return spec_fail(GCOMP_ERR_INVALID_SPEC, spec, "%s: ':' must be followed by key=value", vt->name);
    while (kv) {
        char *comma = strchr(kv, ',');
        char *eq;
        const gcomp_param_def *p;
        char qk[4 * QUOTE_TEXT + 8];
        if (comma) *comma = '\0';
        if (!*kv) /* "a=1,,b=2" or a trailing ',' ("topk:" alone was refused above) */
            return spec_fail(GCOMP_ERR_INVALID_SPEC, spec, "empty element at character %zu", (size_t)(kv - base) + 1);
        eq = strchr(kv, '=');
        if (!eq)
            return spec_fail(GCOMP_ERR_INVALID_SPEC, spec, "%s: '%s' is not key=value", vt->name,
                             gcomp__quote(qk, sizeof qk, kv, QUOTE_TEXT));
        *eq = '\0';
        if (!*kv)
            return spec_fail(GCOMP_ERR_INVALID_SPEC, spec, "%s: no key before '=' at character %zu", vt->name,
                             (size_t)(eq - base) + 1);
        gcomp__quote(qk, sizeof qk, kv, QUOTE_TEXT);
        p = find_param(vt, kv);
        if (!p) return spec_fail(GCOMP_ERR_INVALID_SPEC, spec, "codec '%s' has no parameter '%s'", vt->name, qk);
        if (seen & (1ull << (p - vt->params)))
            return spec_fail(GCOMP_ERR_INVALID_SPEC, spec, "%s: '%s' is given twice", vt->name, qk);
        seen |= 1ull << (p - vt->params);
        GCOMP_CHECK(parse_value(spec, vt->name, p, eq + 1, params));
        kv = comma ? comma + 1 : NULL;
    }
    return GCOMP_SUCCESS;
}

/* Append "name:key=value,..." (or "+name..." after the first stage) to the canonical spec;
 * a canonical spec that would not fit is refused rather than cut (it would not parse back). */
static gcomp_result append_canonical(const char *spec, gcomp__chain *c, const gcomp_codec_vtable *vt,
                                     const void *params)
{
    size_t len = strlen(c->canonical);
    char *out = c->canonical + len;
    size_t cap = sizeof c->canonical - len;
    int n = snprintf(out, cap, "%s%s", len ? "+" : "", vt->name);
    for (size_t i = 0; i < vt->n_params && n >= 0 && (size_t)n < cap; i++) {
        const gcomp_param_def *p = &vt->params[i];
        const char *field = (const char *)params + p->offset;
        char val[64];
        if (p->type == GCOMP_PARAM_INT) {
            int64_t v;
            memcpy(&v, field, sizeof v);
            snprintf(val, sizeof val, "%lld", (long long)v);
        } else if (p->type == GCOMP_PARAM_DOUBLE) {
            double v;
            memcpy(&v, field, sizeof v);
            format_double(val, sizeof val, v);
        } else {
            int v;
            memcpy(&v, field, sizeof v);
            snprintf(val, sizeof val, "%s", p->choices[v]);
        }
        n += snprintf(out + n, cap - (size_t)n, "%s%s=%s", i ? "," : ":", p->name, val);
    }
    if (n < 0 || (size_t)n >= cap) {
        c->canonical[len] = '\0';
        return spec_fail(GCOMP_ERR_INVALID_SPEC, spec, "the canonical spec would be longer than %d characters",
                         GCOMP_SPEC_MAX - 1);
    }
    return GCOMP_SUCCESS;
}

/* A codec's cross-parameter check. It reports a refusal as every codec failure is reported,
 * with gcomp_codec_fail (or, as codecs may still do, by writing the reason into msg); either
 * way the reason is reported once more through spec_fail, so the message names the codec
 * and the spec like every other spec error. */
static gcomp_result check_params(const char *spec, const gcomp_codec_vtable *vt, const void *params)
{
    char msg[256] = "", qm[4 * 200 + 8], saved[512];
    gcomp_result rc;
    /* the check may report through gcomp_codec_fail: clear the detail to see whether it did,
     * and put back the caller's on success (a successful call leaves the last error alone) */
    snprintf(saved, sizeof saved, "%s", gcomp_last_error());
    gcomp__error_clear();
    rc = vt->check_params(params, msg, sizeof msg);
    if (rc == GCOMP_SUCCESS) {
        gcomp__error_restore(saved);
        return GCOMP_SUCCESS;
    }
    if (!gcomp__result_known(rc)) return gcomp__codec_not_a_result(vt->name, "check_params", rc); /* as every entry */
    /* a reason given through gcomp_codec_fail is escaped already (errors.c); one written into
     * msg is escaped here. Either is cut at 200 characters, an escape whole or not at all */
    if (msg[0]) {
        gcomp__quote(qm, sizeof qm, msg, 200);
    } else if (gcomp_last_error()[0]) {
        const char *e = gcomp_last_error();
        size_t n = strlen(e), cut = n > 200 ? 200 : n;
        for (size_t k = 1; cut < n && k <= 3 && k <= cut; k++) /* "\xNN": every backslash starts one */
            if (e[cut - k] == '\\') {
                cut -= k;
                break;
            }
        snprintf(qm, sizeof qm, "%.*s%s", (int)cut, e, cut < n ? "..." : "");
    } else {
        snprintf(qm, sizeof qm, "its parameters were refused (no reason given)");
    }
    return spec_fail(GCOMP_ERR_INVALID_SPEC, spec, "%s: %s", vt->name, qm);
}

static gcomp_result parse_stage(const char *spec, const char *base, char *text, size_t idx, gcomp__chain *c)
{
    char *colon = strchr(text, ':');
    const gcomp_codec_vtable *vt;
    gcomp__stage *st = &c->stages[idx];
    char qn[4 * QUOTE_TEXT + 8];
    if (colon) *colon = '\0';
    if (!*text) return spec_fail(GCOMP_ERR_INVALID_SPEC, spec, "stage %zu has no codec name", idx + 1);
    gcomp__quote(qn, sizeof qn, text, QUOTE_TEXT);
    vt = gcomp_codec_find(text);
    if (!vt) return spec_fail(GCOMP_ERR_INVALID_SPEC, spec, "unknown codec '%s'", qn);
    if (idx == 0 && (vt->caps & GCOMP_CAP_BYTE_STAGE))
        return spec_fail(GCOMP_ERR_INVALID_SPEC, spec,
                         "'%s' is a byte stage; it must follow an element codec (e.g. fp16+%s)", vt->name, vt->name);
    if (idx > 0 && !(vt->caps & GCOMP_CAP_BYTE_STAGE))
        return spec_fail(GCOMP_ERR_INVALID_SPEC, spec,
                         "'%s' is an element codec; only byte stages (zstd) may follow '+'", vt->name);
    st->vt = vt;
    st->params = calloc(1, vt->params_size ? vt->params_size : 1);
    if (!st->params) return spec_fail(GCOMP_ERR_NOMEM, spec, "out of memory");
    c->n_stages = idx + 1;
    for (size_t i = 0; i < vt->n_params; i++) set_default(&vt->params[i], st->params);
    if (colon) GCOMP_CHECK(parse_params(spec, base, vt, colon + 1, st->params));
    if (vt->check_params) GCOMP_CHECK(check_params(spec, vt, st->params));
    if (vt->state_create) {
        st->state = vt->state_create(st->params);
        if (!st->state) return spec_fail(GCOMP_ERR_NOMEM, spec, "%s: cannot create its state", vt->name);
    }
    return append_canonical(spec, c, vt, st->params);
}

/* Whether the '+' at p belongs to the number whose text starts at v (just after '='): it is
 * the number's sign (p == v), or the sign of its exponent -- the text before p is an
 * optional sign, digits and '.', then 'e'/'E' (or a hex float "0x..." then 'p'/'P'). */
static int plus_in_number(const char *v, const char *p)
{
    const char *s = v;
    int hex = 0, digits = 0;
    if (p == v) return 1;
    if (*s == '+' || *s == '-') s++;
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        hex = 1;
        s += 2;
    }
    for (; s < p - 1; s++) {
        int dec = *s >= '0' && *s <= '9';
        int hexd = dec || (*s >= 'a' && *s <= 'f') || (*s >= 'A' && *s <= 'F');
        if (*s == '.') continue;
        if (!(hex ? hexd : dec)) return 0;
        digits++;
    }
    if (!digits || s != p - 1) return 0;
    return hex ? (p[-1] == 'p' || p[-1] == 'P') : (p[-1] == 'e' || p[-1] == 'E');
}

/* Cut buf (a copy of spec) into stages at the separating '+'s; refuse empty stages and more
 * than GCOMP_MAX_STAGES before anything is parsed. */
static gcomp_result split_stages(const char *spec, char *buf, char *stages[GCOMP_MAX_STAGES], size_t *n)
{
    const char *value = NULL; /* start of the value being scanned, NULL outside a value */
    char *start = buf;
    size_t count = 0;
    for (char *p = buf;; p++) {
        if (*p == '=' && !value)
            value = p + 1;
        else if (*p == ',')
            value = NULL;
        else if (*p == '+' && value && plus_in_number(value, p))
            continue;
        if (*p != '+' && *p != '\0') continue;
        if (p == start)
            return spec_fail(GCOMP_ERR_INVALID_SPEC, spec, "empty element at character %zu", (size_t)(p - buf) + 1);
        if (count == GCOMP_MAX_STAGES)
            return spec_fail(GCOMP_ERR_INVALID_SPEC, spec, "more than %d stages", GCOMP_MAX_STAGES);
        stages[count++] = start;
        value = NULL;
        if (*p == '\0') break;
        *p = '\0';
        start = p + 1;
    }
    *n = count;
    return GCOMP_SUCCESS;
}

static gcomp_result check_characters(const char *spec)
{
    size_t len = strlen(spec);
    if (len == 0) return gcomp__fail(GCOMP_ERR_INVALID_SPEC, "empty codec spec");
    if (len >= GCOMP_SPEC_MAX)
        return spec_fail(GCOMP_ERR_INVALID_SPEC, spec, "spec is longer than %d characters", GCOMP_SPEC_MAX - 1);
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)spec[i];
        if (ch <= ' ' || ch == 0x7f)
            return spec_fail(GCOMP_ERR_INVALID_SPEC, spec, "whitespace or control character 0x%02x at character %zu",
                             ch, i + 1);
    }
    return GCOMP_SUCCESS;
}

gcomp_result gcomp__chain_parse(const char *spec, gcomp__chain *out)
{
    char buf[GCOMP_SPEC_MAX];
    char *stages[GCOMP_MAX_STAGES];
    size_t n = 0;
    gcomp_result rc = GCOMP_SUCCESS;

    memset(out, 0, sizeof *out);
    if (!spec) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "codec spec is NULL");
    GCOMP_CHECK(check_characters(spec));
    strcpy(buf, spec);
    GCOMP_CHECK(split_stages(spec, buf, stages, &n));
    for (size_t i = 0; i < n && rc == GCOMP_SUCCESS; i++) rc = parse_stage(spec, buf, stages[i], i, out);
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
