/*
 * bitstream.h — LSB-first bit streams for codec bodies: a writer of fields up to 32 bits and a
 * reader that never reads past its end (so it is safe on untrusted payloads). Bits fill each
 * byte from its least-significant bit; the last byte is padded with zero bits. Used by top-k
 * (Rice-coded gaps and packed values) and by TernGrad's packed sums outside its fast blocks.
 * Host and device (GCOMP_HD): the CUDA top-k kernels write and read bodies with these same
 * functions, so both produce and accept the same bytes.
 */
#ifndef GCOMP_CODECS_BITSTREAM_H
#define GCOMP_CODECS_BITSTREAM_H

#include <stddef.h>
#include <stdint.h>

#include "codecs/common.h"

typedef struct gcomp_bitwriter {
    uint8_t *out;
    size_t pos;    /* bytes written */
    uint64_t acc;  /* bits not yet written */
    unsigned fill; /* how many, < 32 between calls */
} gcomp_bitwriter;

/* Appends the low w bits of v (w <= 32; higher bits of v must be zero). */
static inline GCOMP_HD void gcomp_bits_put(gcomp_bitwriter *bw, uint64_t v, unsigned w)
{
    bw->acc |= v << bw->fill;
    bw->fill += w;
    if (bw->fill >= 32) {
        gcomp_le_store_u32(bw->out + bw->pos, (uint32_t)bw->acc);
        bw->pos += 4;
        bw->acc >>= 32;
        bw->fill -= 32;
    }
}

/* Writes the last partial bytes (zero-padded). Returns the bytes written in all. */
static inline GCOMP_HD size_t gcomp_bits_flush(gcomp_bitwriter *bw)
{
    for (; bw->fill > 0; bw->fill = bw->fill > 8 ? bw->fill - 8 : 0) {
        bw->out[bw->pos++] = (uint8_t)bw->acc;
        bw->acc >>= 8;
    }
    bw->acc = 0;
    return bw->pos;
}

typedef struct gcomp_bitreader {
    const uint8_t *in;
    size_t pos, end; /* next byte to load, and the end of what may be read */
    uint64_t acc;    /* bits loaded but not consumed; above them, zeros or the stream's next bits */
    unsigned avail;  /* how many */
} gcomp_bitreader;

/* Loads whole bytes so that at least 56 bits are available, or all that is left. Away from the
 * end this is one unaligned 8-byte load and no branch on the data: bytes already in acc are
 * loaded again at the same place, which changes nothing. */
static inline GCOMP_HD void gcomp_bits_refill(gcomp_bitreader *br)
{
    if (br->end - br->pos >= 8) {
        br->acc |= gcomp_le_load_u64(br->in + br->pos) << br->avail;
        br->pos += (63 - br->avail) >> 3;
        br->avail |= 56; /* = avail + 8 x the bytes taken */
        return;
    }
    while (br->avail <= 56 && br->pos < br->end) {
        br->acc |= (uint64_t)br->in[br->pos++] << br->avail;
        br->avail += 8;
    }
}

/* Takes w bits (w <= 32). Returns 0 when the input ended first. */
static inline GCOMP_HD int gcomp_bits_get(gcomp_bitreader *br, unsigned w, uint64_t *v)
{
    if (br->avail < w) gcomp_bits_refill(br);
    if (br->avail < w) return 0;
    *v = br->acc & (((uint64_t)1 << w) - 1);
    br->acc >>= w;
    br->avail -= w;
    return 1;
}

#endif
