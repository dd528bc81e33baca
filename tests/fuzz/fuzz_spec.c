/*
 * fuzz_spec — the spec parser: gcomp_codec_create on the input as a NUL-terminated string.
 *
 * Properties:
 *  - create returns GCOMP_SUCCESS with an object, or GCOMP_ERR_INVALID_SPEC with *out NULL
 *    and a message without control characters;
 *  - the canonical spec of an accepted spec parses again, to the same canonical spec;
 *  - every accepted spec makes a working codec: a small tensor encodes into
 *    gcomp_codec_max_encoded_bytes and decodes back (parameter values at the edges of their
 *    ranges reach the codecs this way).
 */
#include "fuzz_common.h"

#define SPEC_INPUT_MAX 1024 /* longer than GCOMP_SPEC_MAX, so the length check is reached */
#define SMALL_N 37

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void encode_small(gcomp_codec *c)
{
    float g[SMALL_N], dec[SMALL_N];
    size_t cap = gcomp_codec_max_encoded_bytes(c, SMALL_N), written = 0;
    uint8_t *buf = malloc(cap);
    FUZZ_CHECK(buf != NULL);
    for (int i = 0; i < SMALL_N; i++) g[i] = (float)((i * 7) % 11 - 5) * 0.25f;
    for (int call = 0; call < 2; call++) { /* the second call runs with a residual */
        FUZZ_CHECK(gcomp_codec_encode(c, 7, g, SMALL_N, GCOMP_F32, buf, cap, &written) == GCOMP_SUCCESS);
        FUZZ_CHECK(written >= GCOMP_HEADER_BYTES && written <= cap);
        FUZZ_CHECK(gcomp_codec_decode(c, buf, written, dec, SMALL_N, GCOMP_F32) == GCOMP_SUCCESS);
        for (int i = 0; i < SMALL_N; i++) FUZZ_CHECK(fuzz_isfinite(dec[i]));
    }
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *spec;
    gcomp_codec *c = (gcomp_codec *)&spec, *c2 = NULL; /* not NULL: create must clear it */
    gcomp_result rc;

    if (size > SPEC_INPUT_MAX) return 0;
    spec = malloc(size + 1);
    FUZZ_CHECK(spec != NULL);
    memcpy(spec, data, size);
    spec[size] = '\0';

    rc = gcomp_codec_create(spec, NULL, &c);
    if (rc != GCOMP_SUCCESS) {
        FUZZ_CHECK(rc == GCOMP_ERR_INVALID_SPEC);
        FUZZ_CHECK(c == NULL);
        FUZZ_CHECK(gcomp_last_error()[0] != '\0');
        /* user text in messages is escaped: one printable line, whatever the input */
        for (const char *m = gcomp_last_error(); *m; m++) FUZZ_CHECK((unsigned char)*m >= 0x20 && *m != 0x7f);
    } else {
        const char *canon = gcomp_codec_spec(c);
        FUZZ_CHECK(c != NULL && canon != NULL && canon[0] != '\0');
        /* the canonical spec parses again to itself */
        FUZZ_CHECK(gcomp_codec_create(canon, NULL, &c2) == GCOMP_SUCCESS);
        FUZZ_CHECK(strcmp(gcomp_codec_spec(c2), canon) == 0);
        gcomp_codec_destroy(c2);
        encode_small(c);
    }
    gcomp_codec_destroy(c);
    free(spec);
    return 0;
}
