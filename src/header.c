/* header.c — the 32-byte payload header every payload starts with (see gcomp_codec.h). */
#include "codec_internal.h"

_Static_assert(GCOMP_HEADER_BYTES == 32, "the header is frozen at 32 bytes");
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gcomp bodies store floats in host order; only little-endian hosts are supported"
#endif

void gcomp_header_write(uint8_t out[GCOMP_HEADER_BYTES], const gcomp_header *h)
{
    gcomp_store_u32(out + 0, GCOMP_HEADER_MAGIC);
    out[4] = GCOMP_FORMAT_VERSION;
    out[5] = h->dtype;
    out[6] = (uint8_t)h->wire_id;
    out[7] = (uint8_t)(h->wire_id >> 8);
    gcomp_store_u32(out + 8, h->flags);
    gcomp_store_u32(out + 12, 0);
    gcomp_store_u64(out + 16, h->count);
    gcomp_store_u64(out + 24, h->body_bytes);
}

gcomp_result gcomp_header_read(const uint8_t *payload, size_t bytes, gcomp_header *h)
{
    if (!payload || !h) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "header: NULL argument");
    if (bytes < GCOMP_HEADER_BYTES)
        return gcomp__fail(GCOMP_ERR_CORRUPT, "payload of %zu bytes is shorter than the %u-byte header", bytes,
                           GCOMP_HEADER_BYTES);
    h->magic = gcomp_load_u32(payload);
    h->version = payload[4];
    h->dtype = payload[5];
    h->wire_id = (uint16_t)(payload[6] | payload[7] << 8);
    h->flags = gcomp_load_u32(payload + 8);
    h->reserved = gcomp_load_u32(payload + 12);
    h->count = gcomp_load_u64(payload + 16);
    h->body_bytes = gcomp_load_u64(payload + 24);
    if (h->magic != GCOMP_HEADER_MAGIC)
        return gcomp__fail(GCOMP_ERR_CORRUPT, "bad magic 0x%08x (not a gcomp payload)", h->magic);
    if (h->version != GCOMP_FORMAT_VERSION)
        return gcomp__fail(GCOMP_ERR_CORRUPT, "payload format version %u, this library reads %u", h->version,
                           GCOMP_FORMAT_VERSION);
    if (h->reserved != 0) return gcomp__fail(GCOMP_ERR_CORRUPT, "reserved header field is not 0");
    if (h->dtype >= GCOMP_DTYPE_COUNT)
        return gcomp__fail(GCOMP_ERR_CORRUPT, "payload dtype %u is not a gcomp dtype", h->dtype);
    if (h->body_bytes != bytes - GCOMP_HEADER_BYTES)
        return gcomp__fail(GCOMP_ERR_CORRUPT, "header declares %llu body bytes, payload has %zu",
                           (unsigned long long)h->body_bytes, bytes - GCOMP_HEADER_BYTES);
    return GCOMP_SUCCESS;
}
