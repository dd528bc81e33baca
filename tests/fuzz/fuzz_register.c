/*
 * fuzz_register — gcomp_codec_register with random parameter tables, then the spec parser on
 * the tables it accepted.
 *
 * Input: byte 0 the number of parameters (mod 70); bytes 1-2 the params struct size (below
 * 0xff00: that mod 600; above: one of SIZES); then 8 bytes per parameter:
 *   name (NAMES), type (0-2 valid, 3 and 4 invalid), offset (OFFSETS above 249), min, max,
 *   default (VALUES; default with flag 1: the byte's value as a small integer), choices
 *   (CHOICES), flags;
 * the rest is the key=value list of a spec "none+fuzzreg:<rest>".
 * The table, the choice lists and the params struct are heap blocks of exactly their size,
 * so any read or write past them is an ASan report.
 *
 * Properties:
 *  - register returns SUCCESS or GCOMP_ERR_INVALID_ARG (with a message naming the codec, and
 *    the codec not findable);
 *  - an accepted table is one the parser can trust: every field inside params_size and
 *    aligned, no two fields overlapping, bounds ordered and not NaN, defaults inside them
 *    (enum: an index of a choice), names unique;
 *  - "none+fuzzreg" then parses (or its canonical spec is too long: INVALID_SPEC), and the
 *    spec with the input's key=value list parses or fails with INVALID_SPEC; the parsed
 *    values (seen by state_create) lie within their bounds, and an accepted canonical spec
 *    parses back to itself; messages hold no control characters.
 */
#include <math.h>

#include "fuzz_common.h"
#include "codec_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_INPUT_PARAMS 70
#define FUZZ_WIRE_ID 60000

static const char *const NAMES[] = { "a",
                                     "b",
                                     "k",
                                     "x_1",
                                     "ratio",
                                     "level",
                                     "Bad",
                                     "",
                                     NULL,
                                     "a=b",
                                     "a,b",
                                     "abcdefghijklmnopqrstuvwxyz0123456",
                                     "abcdefghijklmnopqrstuvwxyz012345" };
static const double VALUES[] = { 0.0,
                                 1.0,
                                 -1.0,
                                 0.5,
                                 2.5,
                                 1e-6,
                                 100.0,
                                 9007199254740992.0 /* 2^53 */,
                                 4611686018427387904.0 /* 2^62 */,
                                 9223372036854775808.0 /* 2^63 */,
                                 -9223372036854775808.0,
                                 1e300,
                                 INFINITY,
                                 -INFINITY,
                                 NAN,
                                 4.9e-324,
                                 -0.0,
                                 3.0 };
static const size_t SIZES[] = { 0, 8, 12, 4096, 4097, (size_t)1 << 20, SIZE_MAX, SIZE_MAX - 7 };
#define N_CHOICE_LISTS 7 /* NULL; {}; {lo, hi}; {one}; {"a,b"}; {x, x}; 64 names without NULL */

static const gcomp_param_def *current; /* the table under test, for state_create */
static size_t current_n;

static size_t type_size(gcomp_param_type t)
{
    return t == GCOMP_PARAM_INT ? sizeof(int64_t) : t == GCOMP_PARAM_DOUBLE ? sizeof(double) : sizeof(int);
}

static size_t n_choices(const char *const *c)
{
    size_t n = 0;
    while (c[n]) n++;
    return n;
}

/* The parser hands every parsed params struct to state_create: check each value there. */
static void *check_values(const void *params)
{
    for (size_t i = 0; i < current_n; i++) {
        const gcomp_param_def *p = &current[i];
        const char *f = (const char *)params + p->offset;
        if (p->type == GCOMP_PARAM_INT) {
            int64_t v;
            memcpy(&v, f, sizeof v);
            /* exactly: v in [ceil(min), floor(max)] as integers (a double compare could round) */
            FUZZ_CHECK(p->min <= -9223372036854775808.0 ||
                       (p->min <= 0 ? v >= (int64_t)p->min : v > (int64_t)p->min || (double)v == p->min));
            FUZZ_CHECK(p->max >= 9223372036854775808.0 ||
                       (p->max >= 0 ? v <= (int64_t)p->max : v < (int64_t)p->max || (double)v == p->max));
        } else if (p->type == GCOMP_PARAM_DOUBLE) {
            double v;
            memcpy(&v, f, sizeof v);
            FUZZ_CHECK(v >= p->min && v <= p->max && isfinite(v));
        } else {
            int v;
            memcpy(&v, f, sizeof v);
            FUZZ_CHECK(v >= 0 && (size_t)v < n_choices(p->choices));
        }
    }
    return malloc(1);
}

static void free_state(void *s) { free(s); }

static size_t pass_bound(const void *params, size_t n)
{
    (void)params;
    return n;
}

static gcomp_result pass_encode(const void *params, void *state, const uint8_t *in, size_t n, uint8_t *out, size_t cap,
                                size_t *written, uint32_t *flags)
{
    (void)params;
    (void)state;
    if (cap < n) return gcomp_codec_fail(GCOMP_ERR_BUFFER_TOO_SMALL, "fuzzreg: need %zu bytes", n);
    memcpy(out, in, n);
    *written = n;
    *flags = 0;
    return GCOMP_SUCCESS;
}

static gcomp_result pass_decode(const void *params, void *state, uint32_t flags, const uint8_t *in, size_t n,
                                uint8_t *out, size_t cap, size_t *written)
{
    (void)params;
    (void)state;
    if (flags || n > cap) return gcomp_codec_fail(GCOMP_ERR_CORRUPT, "fuzzreg: bad body");
    memcpy(out, in, n);
    *written = n;
    return GCOMP_SUCCESS;
}

static const char **make_choices(unsigned sel)
{
    static const char *const lists[N_CHOICE_LISTS][3] = { { NULL },        { NULL },        { "lo", "hi", NULL },
                                                          { "one", NULL }, { "a,b", NULL }, { "x", "x", NULL },
                                                          { NULL } };
    const char **c;
    sel %= N_CHOICE_LISTS;
    if (sel == 0) return NULL;
    if (sel == 6) { /* 64 entries, no NULL: the registry reads at most 64 and must refuse it */
        static char names[64][8];
        c = malloc(64 * sizeof *c);
        FUZZ_CHECK(c != NULL);
        for (int i = 0; i < 64; i++) {
            snprintf(names[i], sizeof names[i], "c%d", i);
            c[i] = names[i];
        }
        return c;
    }
    {
        size_t n = 0;
        while (lists[sel][n]) n++;
        c = malloc((n + 1) * sizeof *c);
        FUZZ_CHECK(c != NULL);
        memcpy(c, lists[sel], (n + 1) * sizeof *c);
    }
    return c;
}

/* What registration promised about an accepted table. */
static void check_accepted(const gcomp_codec_vtable *vt)
{
    FUZZ_CHECK(vt->n_params <= 64);
    for (size_t i = 0; i < vt->n_params; i++) {
        const gcomp_param_def *p = &vt->params[i];
        size_t sz = type_size(p->type);
        FUZZ_CHECK(p->type == GCOMP_PARAM_INT || p->type == GCOMP_PARAM_DOUBLE || p->type == GCOMP_PARAM_ENUM);
        FUZZ_CHECK(p->name != NULL && p->offset <= vt->params_size && sz <= vt->params_size - p->offset);
        FUZZ_CHECK(p->offset % sz == 0);
        for (size_t j = 0; j < i; j++) {
            const gcomp_param_def *q = &vt->params[j];
            FUZZ_CHECK(strcmp(q->name, p->name) != 0);
            FUZZ_CHECK(p->offset >= q->offset + type_size(q->type) || q->offset >= p->offset + sz);
        }
        if (p->type == GCOMP_PARAM_ENUM) {
            FUZZ_CHECK(p->choices != NULL && p->def >= 0 && p->def < (double)n_choices(p->choices));
        } else {
            FUZZ_CHECK(p->min <= p->max && p->def >= p->min && p->def <= p->max);
        }
    }
}

static void check_message(void)
{
    for (const char *m = gcomp_last_error(); *m; m++) FUZZ_CHECK((unsigned char)*m >= 0x20 && *m != 0x7f);
}

static void parse_with(const char *rest, size_t rest_len)
{
    char *spec = malloc(rest_len + 32);
    gcomp_codec *c = NULL, *c2 = NULL;
    gcomp_result rc;
    FUZZ_CHECK(spec != NULL);
    strcpy(spec, "none+fuzzreg");
    if (rest_len) {
        strcat(spec, ":");
        memcpy(spec + strlen(spec), rest, rest_len);
        spec[13 + rest_len] = '\0';
    }
    rc = gcomp_codec_create(spec, NULL, &c);
    if (rc == GCOMP_SUCCESS) {
        FUZZ_CHECK(gcomp_codec_create(gcomp_codec_spec(c), NULL, &c2) == GCOMP_SUCCESS);
        FUZZ_CHECK(strcmp(gcomp_codec_spec(c2), gcomp_codec_spec(c)) == 0);
        gcomp_codec_destroy(c2);
        gcomp_codec_destroy(c);
    } else {
        FUZZ_CHECK(rc == GCOMP_ERR_INVALID_SPEC && c == NULL);
        check_message();
    }
    free(spec);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gcomp_codec_vtable vt = { 0 };
    gcomp_param_def *params = NULL;
    const char **choices[MAX_INPUT_PARAMS] = { 0 };
    size_t n, psize, used;
    gcomp_result rc;

    if (size < 3) return 0;
    n = data[0] % MAX_INPUT_PARAMS;
    {
        unsigned v = data[1] | (unsigned)data[2] << 8;
        psize = v < 0xff00 ? v % 600 : SIZES[v & 7];
    }
    if (size < 3 + 8 * n) return 0;
    used = 3 + 8 * n;
    if (n) {
        params = malloc(n * sizeof *params);
        FUZZ_CHECK(params != NULL);
    }
    for (size_t i = 0; i < n; i++) {
        const uint8_t *b = data + 3 + 8 * i;
        static const size_t far[] = { SIZE_MAX,          SIZE_MAX - 3,      0 /* psize */,
                                      4 /* psize - 4 */, 8 /* psize - 8 */, (size_t)1 << 20 };
        gcomp_param_def *p = &params[i];
        memset(p, 0, sizeof *p);
        p->name = NAMES[b[0] % (sizeof NAMES / sizeof NAMES[0])];
        p->type = b[1] % 5 < 3 ? (gcomp_param_type)(b[1] % 5) : (gcomp_param_type)(b[1] % 5 == 3 ? 7 : -1);
        if (b[2] < 250)
            p->offset = b[2];
        else if (b[2] - 250 < 2)
            p->offset = far[b[2] - 250];
        else if (b[2] - 250 < 5)
            p->offset = psize - far[b[2] - 250]; /* may wrap: that is a case too */
        else
            p->offset = far[5];
        p->min = VALUES[b[3] % (sizeof VALUES / sizeof VALUES[0])];
        p->max = VALUES[b[4] % (sizeof VALUES / sizeof VALUES[0])];
        p->def = (b[7] & 1) ? (double)(int8_t)b[5] : VALUES[b[5] % (sizeof VALUES / sizeof VALUES[0])];
        choices[i] = make_choices(b[6]);
        p->choices = choices[i];
        p->help = "fuzz";
    }
    vt.abi_version = GCOMP_CODEC_ABI_VERSION;
    vt.name = "fuzzreg";
    vt.wire_id = FUZZ_WIRE_ID;
    vt.caps = GCOMP_CAP_BYTE_STAGE;
    vt.params = params;
    vt.n_params = n;
    vt.params_size = psize;
    vt.state_create = check_values;
    vt.state_destroy = free_state;
    vt.stage_bound = pass_bound;
    vt.stage_encode = pass_encode;
    vt.stage_decode = pass_decode;

    current = params;
    current_n = n;
    rc = gcomp_codec_register(&vt);
    if (rc == GCOMP_SUCCESS) {
        check_accepted(&vt);
        parse_with("", 0);
        parse_with((const char *)data + used, strnlen((const char *)data + used, size - used));
        FUZZ_CHECK(gcomp__codec_unregister(&vt) == GCOMP_SUCCESS);
    } else {
        FUZZ_CHECK(rc == GCOMP_ERR_INVALID_ARG);
        FUZZ_CHECK(strstr(gcomp_last_error(), "fuzzreg") != NULL);
        check_message();
    }
    FUZZ_CHECK(gcomp_codec_find("fuzzreg") == NULL);
    for (size_t i = 0; i < n; i++) free((void *)choices[i]);
    free(params);
    return 0;
}
