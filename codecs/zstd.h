/*
 * zstd — lossless byte stage chained after any element codec (spec "...+zstd:level=1").
 *
 * Body (after the 32-byte gcomp header, whose count is the tensor's element count):
 *   flags bit 0 (RAW) clear: one zstd frame whose content is the inner payload (the
 *                            element codec's header and body), with its size declared
 *   flags bit 0 (RAW) set:   the inner payload as is — used when the frame would not be
 *                            smaller than its input, so zstd never costs wire bytes
 * A decoder accepts a frame only if it declares its content size and that size fits in
 * what the receiver expects (the inner codec's bound for the count), and only if the frame
 * spans the body exactly. One compression and one decompression context live in the codec
 * object and are reused for every call.
 */
#ifndef GCOMP_CODECS_ZSTD_H
#define GCOMP_CODECS_ZSTD_H

#include "gcomp_codec.h"

#define GCOMP_WIRE_ID_ZSTD 6
#define GCOMP_ZSTD_FLAG_RAW 1u

typedef struct gcomp_zstd_params {
    int64_t level; /* zstd compression level, -7..19, default 1 */
} gcomp_zstd_params;

extern const gcomp_codec_vtable gcomp__codec_zstd;

#endif
