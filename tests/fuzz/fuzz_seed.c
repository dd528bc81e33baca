/*
 * fuzz_seed — writes the seed corpora of the fuzz targets from the golden payloads.
 *
 *     fuzz_seed GOLDEN_DIR CORPUS_ROOT
 *
 * fills CORPUS_ROOT/<target>/seed-* (directories created as needed; files rewritten, anything
 * else in them, such as inputs the fuzzer found, kept). It shares the spec table with the
 * targets (fuzz_common.h), so every selector byte it writes means the spec it was meant for:
 *   fuzz_decode         each golden <name>.bin behind the selector of its spec; specs without
 *                       a golden file get a fresh encode of golden_input(); every spec also
 *                       gets payloads of 0, 3 and 1030 elements (1030 > one terngrad tile)
 *   fuzz_roundtrip      per spec: the golden input as raw f32, as f16 and bf16 (the bodies of
 *                       fp16.bin and bf16.bin), and a dictionary-mode run over every special
 *   fuzz_spec           the specs of the table and of golden_cases.h, canonical forms, and a
 *                       few parameters at the ends of their ranges, and the specs of issue 13
 *                       item 9 ('+' in numbers, integer bounds, subnormals, under/overflow)
 *   fuzz_integer_sums   the codes of terngrad_clip_0.bin, and sums of 1..5, 127 and 128 ranks packed
 *                       from them by the library itself
 *   fuzz_register       a valid three-parameter table with values at their edges, and the
 *                       malformed tables of issue 13 item 8 (int64 past the struct, enum
 *                       default past its choices, 2^62 + 1 for a bound of 2^62)
 * The corpora are build outputs: never commit them.
 */
#include <errno.h>
#include <sys/stat.h>

#include "fuzz_common.h"

#include "codecs/terngrad.h"
#include "tests/golden/golden_cases.h"

static const char *g_golden, *g_root;

static _Noreturn void die(const char *what, const char *path)
{
    fprintf(stderr, "fuzz_seed: %s %s: %s\n", what, path, errno ? strerror(errno) : gcomp_last_error());
    exit(1);
}

static void make_dir(const char *path)
{
    if (mkdir(path, 0777) != 0 && errno != EEXIST) die("cannot create", path);
}

/* Read a golden file; NULL (and *len 0) when it does not exist. */
static uint8_t *read_golden(const char *name, size_t *len)
{
    char path[1024];
    FILE *f;
    uint8_t *buf;
    long n = 0;
    snprintf(path, sizeof path, "%s/%s", g_golden, name);
    *len = 0;
    f = fopen(path, "rb");
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) die("cannot size", path);
    buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) die("cannot read", path);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* CORPUS_ROOT/target/seed-label: the prefix bytes, then body. */
static void write_seed(const char *target, const char *label, const uint8_t *prefix, size_t plen, const void *body,
                       size_t blen)
{
    char path[1024];
    FILE *f;
    snprintf(path, sizeof path, "%s/%s", g_root, target);
    make_dir(path);
    snprintf(path, sizeof path, "%s/%s/seed-%s", g_root, target, label);
    f = fopen(path, "wb");
    if (!f) die("cannot create", path);
    if ((plen && fwrite(prefix, 1, plen, f) != plen) || (blen && fwrite(body, 1, blen, f) != blen) || fclose(f) != 0)
        die("cannot write", path);
}

static void seed_decode(void)
{
    static const size_t small_n[] = { 0, 3, 1030 };
    float x[GOLDEN_COUNT > 1030 ? GOLDEN_COUNT : 1030];
    golden_input(x, sizeof x / sizeof x[0]);
    for (size_t s = 0; s < FUZZ_N_SPECS; s++) {
        char name[GOLDEN_NAME_MAX], file[GOLDEN_NAME_MAX + 8], label[GOLDEN_NAME_MAX + 32];
        uint8_t sel = (uint8_t)s, *payload;
        size_t len;
        gcomp_codec *c = fuzz_codec(s);
        golden_name(fuzz_specs[s].spec, name);
        snprintf(file, sizeof file, "%s.bin", name);
        payload = read_golden(file, &len);
        if (payload) {
            snprintf(label, sizeof label, "golden-%s", name);
            write_seed("fuzz_decode", label, &sel, 1, payload, len);
            free(payload);
        }
        for (size_t j = 0; j < sizeof small_n / sizeof small_n[0] + 1; j++) {
            size_t n = j < sizeof small_n / sizeof small_n[0] ? small_n[j] : GOLDEN_COUNT;
            size_t cap = gcomp_codec_max_encoded_bytes(c, n), written = 0;
            if (n == GOLDEN_COUNT && len) continue; /* the golden file is that payload */
            payload = malloc(cap);
            if (!payload ||
                gcomp_codec_encode(c, GCOMP_KEY_NONE, x, n, GCOMP_F32, payload, cap, &written) != GCOMP_SUCCESS)
                die("cannot encode for", fuzz_specs[s].spec);
            snprintf(label, sizeof label, "%s-n%zu", name, n);
            write_seed("fuzz_decode", label, &sel, 1, payload, written);
            free(payload);
        }
    }
}

static void seed_roundtrip(void)
{
    size_t f32_len, f16_len, bf16_len;
    uint8_t *f32 = read_golden("none.out.bin", &f32_len); /* the golden input, -0 aside */
    uint8_t *f16 = read_golden("fp16.bin", &f16_len);
    uint8_t *bf16 = read_golden("bf16.bin", &bf16_len);
    uint8_t dict[2 * FUZZ_N_SPECIAL];
    if (!f32 || !f16 || !bf16 || f16_len < GCOMP_HEADER_BYTES || bf16_len < GCOMP_HEADER_BYTES) {
        errno = ENOENT;
        die("missing golden files in", g_golden);
    }
    for (size_t i = 0; i < sizeof dict; i++) dict[i] = (uint8_t)(i % FUZZ_N_SPECIAL);
    for (size_t s = 0; s < FUZZ_N_SPECS; s++) {
        char name[GOLDEN_NAME_MAX], label[GOLDEN_NAME_MAX + 16];
        uint8_t pre[2] = { (uint8_t)s, 0 };
        golden_name(fuzz_specs[s].spec, name);
        snprintf(label, sizeof label, "%s-f32", name);
        write_seed("fuzz_roundtrip", label, pre, 2, f32, f32_len);
        pre[1] = 2; /* f16 source */
        snprintf(label, sizeof label, "%s-f16", name);
        write_seed("fuzz_roundtrip", label, pre, 2, f16 + GCOMP_HEADER_BYTES, f16_len - GCOMP_HEADER_BYTES);
        pre[1] = 4; /* bf16 source */
        snprintf(label, sizeof label, "%s-bf16", name);
        write_seed("fuzz_roundtrip", label, pre, 2, bf16 + GCOMP_HEADER_BYTES, bf16_len - GCOMP_HEADER_BYTES);
        pre[1] = 1; /* dictionary mode, f32 */
        snprintf(label, sizeof label, "%s-special", name);
        write_seed("fuzz_roundtrip", label, pre, 2, dict, sizeof dict);
    }
    free(f32);
    free(f16);
    free(bf16);
}

static void seed_spec(void)
{
    static const char *const extra[] = {
        "topk:k=4611686018427387904",
        "topk:ratio=0.000001,values=fp32",
        "terngrad:bucket=1073741824,clip=1000",
        "terngrad:clip=0",
        "fp16+zstd:level=-7+zstd+zstd:level=19",
        "none+zstd",
        "topk:ratio=0.5,k=3,values=fp16+zstd",
        /* issue 13 item 9: each was accepted or refused for the wrong reason */
        "topk:,ratio=0.1",
        "topk:k=4611686018427387905",
        "topk:ratio=+0.5",
        "terngrad:clip=1e+3",
        "terngrad:clip=1e+2+zstd:level=+3",
        "terngrad:clip=4.9e-324",
        "terngrad:clip=1e-400",
        "terngrad:clip=1e400",
        "topk:k=9223372036854775808",
        "terngrad:clip=0x1p+3",
    };
    size_t i = 0;
    char label[32];
    for (size_t s = 0; s < FUZZ_N_SPECS; s++, i++) {
        const char *canon = gcomp_codec_spec(fuzz_codec(s));
        snprintf(label, sizeof label, "table-%zu", s);
        write_seed("fuzz_spec", label, NULL, 0, fuzz_specs[s].spec, strlen(fuzz_specs[s].spec));
        snprintf(label, sizeof label, "canonical-%zu", s);
        write_seed("fuzz_spec", label, NULL, 0, canon, strlen(canon));
    }
    for (size_t s = 0; s < GOLDEN_N_SPECS; s++) {
        snprintf(label, sizeof label, "golden-%zu", s);
        write_seed("fuzz_spec", label, NULL, 0, golden_specs[s], strlen(golden_specs[s]));
    }
    for (size_t s = 0; s < sizeof extra / sizeof extra[0]; s++) {
        snprintf(label, sizeof label, "edge-%zu", s);
        write_seed("fuzz_spec", label, NULL, 0, extra[s], strlen(extra[s]));
    }
}

static void seed_integer_sums(void)
{
    static const uint32_t ranks[] = { 1, 2, 3, 4, 5, 127, 128 };
    size_t len, n = GOLDEN_COUNT, cb = (GOLDEN_COUNT + 3) / 4;
    uint8_t *tg = read_golden("terngrad_clip_0.bin", &len);
    const uint8_t *codes;
    int8_t t[GOLDEN_COUNT], *tt;
    uint8_t *sums = NULL, *next, *body;
    uint32_t m = 0;
    if (!tg || len != GCOMP_HEADER_BYTES + 4 + cb) {
        errno = ENOENT;
        die("missing or unexpected", "terngrad_clip_0.bin");
    }
    codes = tg + GCOMP_HEADER_BYTES + 4; /* one scale, then the codes */
    {
        uint8_t pre[4] = { 0, 0, 0, (uint8_t)(4 * cb - n) }; /* codes_unpack with n = 1001 */
        write_seed("fuzz_integer_sums", "codes", pre, 4, codes, cb);
    }
    if (gcomp__tg_codes_unpack(codes, cb, n, t) != GCOMP_SUCCESS) die("cannot unpack", "terngrad_clip_0.bin");
    tt = malloc(n);
    for (size_t r = 0; r < sizeof ranks / sizeof ranks[0]; r++) {
        /* add ranks up to ranks[r], each rank's codes a rotation of the golden ones */
        for (; m < ranks[r]; m++) {
            size_t nb = (size_t)gcomp_tg_sum_bytes(n, m + 1);
            for (size_t i = 0; i < n; i++) tt[i] = t[(i + 37 * m) % n];
            next = malloc(nb);
            /* m = 0 reads no input; a non-NULL pointer keeps clear of the NULL + 0 that
             * fuzz_integer_sums reports (see regressions/README.md) */
            if (!next || gcomp__tg_sums_add_pack(m ? sums : codes, m ? (size_t)gcomp_tg_sum_bytes(n, m) : 0, m, tt, n,
                                                 next) != GCOMP_SUCCESS)
                die("cannot pack sums of", "terngrad_clip_0.bin");
            free(sums);
            sums = next;
        }
        {
            size_t sb = (size_t)gcomp_tg_sum_bytes(n, m), most = (size_t)gcomp_tg_sums_fit(sb, m);
            uint8_t pre[4] = { 1, (uint8_t)m, (uint8_t)(m >> 8), (uint8_t)(most - n) };
            char label[32];
            snprintf(label, sizeof label, "sums-m%u", m);
            write_seed("fuzz_integer_sums", label, pre, 4, sums, sb);
            /* add_pack: the codes of one more rank (t + 1 in 0..2), then these sums */
            body = malloc(n + sb);
            for (size_t i = 0; i < n; i++) body[i] = (uint8_t)(t[i] + 1);
            memcpy(body + n, sums, sb);
            pre[0] = 2;
            pre[3] = 0;
            snprintf(label, sizeof label, "add-m%u", m);
            write_seed("fuzz_integer_sums", label, pre, 4, body, n + sb);
            free(body);
        }
    }
    free(sums);
    free(tt);
    free(tg);
}

/* fuzz_register's input (see its header): count, size (u16), 8 bytes per parameter
 * {name, type, offset, min, max, default, choices, flags} as indices into its tables, then a
 * key=value list. Names: 0 "a", 1 "b", 2 "k"; values: 0 0.0, 1 1.0, 2 -1.0, 3 0.5, 6 100,
 * 8 2^62; choices: 2 {lo, hi}. */
static void seed_register(void)
{
    static const uint8_t valid[] = {
        3, 24, 0, 0, 0, 0, 2, 6, 0, 0, 0, 1, 1, 8, 0, 1, 3, 0, 0, 2, 2, 16, 0, 0, 1, 2, 0
    };
    static const uint8_t int_past_end[] = { 1, 12, 0, 0, 0, 8, 0, 6, 1, 0, 0 };
    static const uint8_t enum_default_past[] = { 1, 4, 0, 0, 2, 0, 0, 0, 5, 2, 1 };
    static const uint8_t int_2p62[] = { 1, 8, 0, 2, 0, 0, 0, 8, 0, 0, 0 };
    write_seed("fuzz_register", "valid", valid, sizeof valid, "a=+5,b=4.9e-324,k=lo", 20);
    write_seed("fuzz_register", "valid-defaults", valid, sizeof valid, NULL, 0);
    write_seed("fuzz_register", "int-past-end", int_past_end, sizeof int_past_end, "a=5", 3);
    write_seed("fuzz_register", "enum-default-past", enum_default_past, sizeof enum_default_past, NULL, 0);
    write_seed("fuzz_register", "int-2p62-plus-1", int_2p62, sizeof int_2p62, "k=4611686018427387905", 21);
    write_seed("fuzz_register", "int-2p62", int_2p62, sizeof int_2p62, "k=4611686018427387904", 21);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s GOLDEN_DIR CORPUS_ROOT\n", argv[0]);
        return 2;
    }
    g_golden = argv[1];
    g_root = argv[2];
    make_dir(g_root);
    seed_decode();
    seed_roundtrip();
    seed_spec();
    seed_integer_sums();
    seed_register();
    return 0;
}
