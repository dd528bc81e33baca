/*
 * fuzz_decode — untrusted payloads into every built-in decoder.
 *
 * Input: one selector byte, then the payload.
 *   selector bits 0-4: the spec (fuzz_specs[], modulo its size)
 *   selector bits 5-6: 0 gcomp_codec_decode_add, 1/2/3 gcomp_codec_decode to f32/f16/bf16
 *   selector bit 7:    count is the header's count plus one (the "other count" path)
 * The element count is taken from the payload header (bytes 16..23) when it is at most
 * FUZZ_MAX_COUNT, else reduced modulo FUZZ_MAX_COUNT + 1, so mutations of the body reach the
 * codec instead of stopping at the count check.
 *
 * Property: the call returns GCOMP_SUCCESS or GCOMP_ERR_CORRUPT (nothing else is possible
 * for valid arguments and a count this small) and never reads or writes out of bounds,
 * traps on undefined behaviour, leaks or hangs. Decoded values may be anything.
 */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const gcomp_dtype out_dtype[4] = { GCOMP_F32, GCOMP_F32, GCOMP_F16, GCOMP_BF16 };
    uint8_t sel, *payload;
    size_t bytes, count = 0, esize;
    unsigned mode;
    gcomp_codec *c;
    void *out;
    gcomp_result rc;

    if (size < 1) return 0;
    sel = data[0];
    bytes = size - 1;
    c = fuzz_codec(fuzz_spec_index(sel));
    mode = (sel >> 5) & 3u;

    if (bytes >= GCOMP_HEADER_BYTES) count = (size_t)(gcomp_load_u64(data + 1 + 16) % (FUZZ_MAX_COUNT + 1));
    if (sel & 0x80) count = (count + 1) % (FUZZ_MAX_COUNT + 1);

    /* exact-size copies, so AddressSanitizer sees one byte past either end */
    payload = malloc(bytes ? bytes : 1);
    esize = gcomp_dtype_size(out_dtype[mode]);
    out = malloc(count ? count * esize : 1);
    if (!payload || !out) abort();
    if (bytes) memcpy(payload, data + 1, bytes);
    memset(out, 0, count * esize);

    if (mode == 0)
        rc = gcomp_codec_decode_add(c, payload, bytes, out, count);
    else
        rc = gcomp_codec_decode(c, payload, bytes, out, count, out_dtype[mode]);
    FUZZ_CHECK(rc == GCOMP_SUCCESS || rc == GCOMP_ERR_CORRUPT);
    if (rc != GCOMP_SUCCESS) FUZZ_CHECK(gcomp_last_error()[0] != '\0');

    free(out);
    free(payload);
    return 0;
}
