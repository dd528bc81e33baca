/*
 * make_golden — writes the golden files that freeze every built-in codec's wire format.
 *
 *     ./build/tests/make_golden tests/golden
 *
 * Running it is a wire-format decision, not a chore: if test_golden fails, either the change
 * that broke it is a bug, or the format changed on purpose and GCOMP_FORMAT_VERSION (or the
 * codec's wire id) must be bumped before the files are regenerated. See tests/golden/README.md.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gcomp.h"
#include "golden/golden_cases.h"

static int write_file(const char *dir, const char *name, const char *suffix, const void *data, size_t bytes)
{
    char path[1024];
    FILE *f;
    snprintf(path, sizeof path, "%s/%s%s", dir, name, suffix);
    f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "make_golden: cannot open %s\n", path);
        return 1;
    }
    if (bytes && fwrite(data, 1, bytes, f) != bytes) {
        fprintf(stderr, "make_golden: cannot write %s\n", path);
        fclose(f);
        return 1;
    }
    if (fclose(f) != 0) return 1;
    printf("%-40s %6zu bytes\n", path, bytes);
    return 0;
}

static int make_case(const char *dir, const char *spec, const float *x)
{
    gcomp_codec_options opts = golden_options();
    gcomp_codec *c = NULL;
    char name[GOLDEN_NAME_MAX];
    uint8_t *payload = NULL;
    float *out = NULL;
    size_t cap, written = 0;
    int bad = 1;

    golden_name(spec, name);
    if (gcomp_codec_create(spec, &opts, &c) != GCOMP_SUCCESS) {
        fprintf(stderr, "make_golden: %s: %s\n", spec, gcomp_last_error());
        return 1;
    }
    cap = gcomp_codec_max_encoded_bytes(c, GOLDEN_COUNT);
    payload = malloc(cap);
    out = malloc(GOLDEN_COUNT * sizeof *out);
    if (!payload || !out) goto done;
    if (gcomp_codec_encode(c, GCOMP_KEY_NONE, x, GOLDEN_COUNT, GCOMP_F32, payload, cap, &written) != GCOMP_SUCCESS ||
        gcomp_codec_decode(c, payload, written, out, GOLDEN_COUNT, GCOMP_F32) != GCOMP_SUCCESS) {
        fprintf(stderr, "make_golden: %s: %s\n", spec, gcomp_last_error());
        goto done;
    }
    bad = write_file(dir, name, ".bin", payload, written) ||
          write_file(dir, name, ".out.bin", out, GOLDEN_COUNT * sizeof *out);
done:
    free(payload);
    free(out);
    gcomp_codec_destroy(c);
    return bad;
}

int main(int argc, char **argv)
{
    float x[GOLDEN_COUNT];
    int bad = 0;
    if (argc != 2) {
        fprintf(stderr, "usage: %s <output directory, normally tests/golden>\n", argv[0]);
        return 2;
    }
    golden_input(x, GOLDEN_COUNT);
    for (size_t i = 0; i < GOLDEN_N_SPECS; i++) bad |= make_case(argv[1], golden_specs[i], x);
    return bad;
}
