/*
 * fuzz_common.h — what the libFuzzer targets of tests/fuzz share: the table of codec specs a
 * selector byte picks from, the codec objects made from it, and the check macro.
 *
 * The table is also what fuzz_seed.c writes the seed corpora from, so a selector byte in a
 * seed always means the spec it was written for. Append to the table; do not reorder it, or
 * saved corpora and the reproducers in regressions/ select other specs.
 */
#ifndef GCOMP_FUZZ_COMMON_H
#define GCOMP_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gcomp.h"
#include "gcomp_codec.h"

/* A violated property is a crash: libFuzzer saves the input and the ctest run fails. */
#define FUZZ_CHECK(cond)                                                                                  \
    do {                                                                                                  \
        if (!(cond)) {                                                                                    \
            fprintf(stderr, "%s:%d: property violated: %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
                    gcomp_last_error());                                                                  \
            __builtin_trap();                                                                             \
        }                                                                                                 \
    } while (0)

/* On the targets' own checking code: its comparisons tell the fuzzer nothing about the
 * library, and tracing them costs more time than the library calls under test. */
#define FUZZ_NO_COVERAGE __attribute__((no_sanitize("coverage")))

/* Largest element count a target decodes or encodes: bounds memory and time per input. */
#define FUZZ_MAX_COUNT ((size_t)1 << 16)

typedef enum fuzz_kind {
    FK_NONE,
    FK_FP16,
    FK_BF16,
    FK_TERNGRAD,
    FK_TOPK
} fuzz_kind;

typedef struct fuzz_spec {
    const char *spec;
    fuzz_kind kind;
    /* parameters of the element codec, as spelled in spec (the roundtrip checks use them) */
    int64_t bucket; /* terngrad */
    double clip;    /* terngrad */
    double ratio;   /* topk */
    int64_t k;      /* topk */
    int fp16;       /* topk values=fp16 */
} fuzz_spec;

static const fuzz_spec fuzz_specs[] = {
    /*  0 */ { "none", FK_NONE, 0, 0, 0, 0, 0 },
    /*  1 */ { "fp16", FK_FP16, 0, 0, 0, 0, 0 },
    /*  2 */ { "bf16", FK_BF16, 0, 0, 0, 0, 0 },
    /*  3 */ { "terngrad:clip=0", FK_TERNGRAD, 0, 0, 0, 0, 0 },
    /*  4 */ { "terngrad:bucket=8,clip=0", FK_TERNGRAD, 8, 0, 0, 0, 0 },
    /*  5 */ { "terngrad:clip=2.5", FK_TERNGRAD, 0, 2.5, 0, 0, 0 },
    /*  6 */ { "topk:ratio=0.1", FK_TOPK, 0, 0, 0.1, 0, 0 },
    /*  7 */ { "topk:ratio=0.1,values=fp16", FK_TOPK, 0, 0, 0.1, 0, 1 },
    /*  8 */ { "fp16+zstd", FK_FP16, 0, 0, 0, 0, 0 },
    /*  9 */ { "topk:ratio=0.1+zstd", FK_TOPK, 0, 0, 0.1, 0, 0 },
    /* 10 */ { "terngrad:clip=0+zstd", FK_TERNGRAD, 0, 0, 0, 0, 0 },
    /* 11 */ { "none+zstd", FK_NONE, 0, 0, 0, 0, 0 },
    /* 12 */ { "bf16+zstd:level=-7", FK_BF16, 0, 0, 0, 0, 0 },
    /* 13 */ { "terngrad:bucket=8,clip=0+zstd", FK_TERNGRAD, 8, 0, 0, 0, 0 },
    /* 14 */ { "topk:ratio=0.1,values=fp16+zstd", FK_TOPK, 0, 0, 0.1, 0, 1 },
    /* 15 */ { "topk:k=1", FK_TOPK, 0, 0, 0.01, 1, 0 },
    /* 16 */ { "topk:ratio=1", FK_TOPK, 0, 0, 1.0, 0, 0 },
    /* 17 */ { "topk:ratio=0.5,values=fp16", FK_TOPK, 0, 0, 0.5, 0, 1 },
    /* 18 */ { "terngrad:bucket=4,clip=1", FK_TERNGRAD, 4, 1.0, 0, 0, 0 },
    /* 19 */ { "terngrad:bucket=1024,clip=0.5", FK_TERNGRAD, 1024, 0.5, 0, 0, 0 },
    /* 20 */ { "fp16+zstd+zstd:level=19", FK_FP16, 0, 0, 0, 0, 0 },
    /* 21 */ { "topk:ratio=0.01+zstd+zstd", FK_TOPK, 0, 0, 0.01, 0, 0 },
};
#define FUZZ_N_SPECS (sizeof fuzz_specs / sizeof fuzz_specs[0])
_Static_assert(FUZZ_N_SPECS <= 32, "the selector byte keeps 5 bits for the spec");

/* The spec a selector byte picks (its low 5 bits, modulo the table size). */
static inline size_t fuzz_spec_index(uint8_t selector) { return (selector & 31u) % FUZZ_N_SPECS; }

/* One codec object per spec, created on first use and kept for the whole run (reachable, so
 * LeakSanitizer does not report it). Decoding keeps no state between calls but scratch, so
 * reusing the object only makes each input cheaper; the roundtrip target resets its keys. */
static inline gcomp_codec *fuzz_codec(size_t idx)
{
    static gcomp_codec *codecs[FUZZ_N_SPECS];
    if (!codecs[idx]) {
        gcomp_codec_options o = gcomp_codec_options_default();
        o.seed = 0x5eed;
        o.rank = 3;
        if (gcomp_codec_create(fuzz_specs[idx].spec, &o, &codecs[idx]) != GCOMP_SUCCESS) {
            fprintf(stderr, "fuzz: cannot create '%s': %s\n", fuzz_specs[idx].spec, gcomp_last_error());
            abort();
        }
    }
    return codecs[idx];
}

/* Bit patterns the roundtrip target's dictionary mode maps input bytes to: the values where
 * casts round, overflow or flush, ties, and every kind of non-finite. */
static const uint32_t fuzz_special_bits[] = {
    0x00000000u, 0x80000000u, /* +-0 */
    0x3f800000u, 0xbf800000u, /* +-1 */
    0x3f800800u,              /* 1 + 2^-12: below an fp16 tie */
    0x3f801000u,              /* 1 + 2^-11: fp16 tie, rounds to even */
    0x3f808000u, 0xbf808000u, /* 1 + 2^-8: bf16 tie */
    0x477fe000u,              /* 65504: largest fp16 */
    0x477ff000u,              /* 65520: rounds to fp16 inf */
    0x477fefffu,              /* just below 65520: stays finite */
    0x47800000u,              /* 65536 */
    0x7f7fffffu, 0xff7fffffu, /* +-FLT_MAX: bf16 inf */
    0x7f7f7fffu,              /* rounds down in bf16 */
    0x00800000u,              /* FLT_MIN */
    0x00000001u, 0x80000001u, /* smallest f32 subnormals */
    0x007fffffu,              /* largest f32 subnormal */
    0x33800000u,              /* 2^-24: smallest fp16 subnormal */
    0x33000000u,              /* 2^-25: fp16 tie to 0 */
    0x33000001u,              /* just above: rounds to 2^-24 */
    0x38800000u,              /* 2^-14: smallest fp16 normal */
    0x387fc000u,              /* largest fp16 subnormal */
    0x7f800000u, 0xff800000u, /* +-inf */
    0x7fc00000u, 0xffc00000u, /* quiet NaNs */
    0x7f800001u, 0x7fa00000u, /* signalling NaNs */
    0x7fffffffu,              /* NaN with every payload bit */
    0x3f000000u, 0xbf000000u, /* +-0.5 */
    0x40200000u,              /* 2.5 */
};
#define FUZZ_N_SPECIAL (sizeof fuzz_special_bits / sizeof fuzz_special_bits[0])

FUZZ_NO_COVERAGE static inline float fuzz_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

FUZZ_NO_COVERAGE static inline uint32_t fuzz_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

FUZZ_NO_COVERAGE static inline int fuzz_isfinite(float f) { return (fuzz_f32_bits(f) & 0x7f800000u) != 0x7f800000u; }
FUZZ_NO_COVERAGE static inline int fuzz_isnan(float f) { return (fuzz_f32_bits(f) & 0x7fffffffu) > 0x7f800000u; }

/* Equal as values (+0 == -0), or both NaN whatever their payloads. */
FUZZ_NO_COVERAGE static inline int fuzz_same(float a, float b) { return fuzz_isnan(a) ? fuzz_isnan(b) : a == b; }

#endif
