/*
 * fuzz_integer_sums — the integer-ring helpers of codecs/terngrad.h on arbitrary bytes:
 * gcomp__tg_codes_unpack, gcomp__tg_sums_unpack, gcomp__tg_sums_values and gcomp__tg_sums_add_pack.
 *
 * Input: mode byte, m (u16 little-endian), an adjust byte, then the data.
 *   mode % 3 == 0: codes_unpack(data, len, n) with n = 4 len - (adjust & 3), or with bit 7 of
 *                  adjust set, an n that usually does not match len. On success every t is in
 *                  {-1, 0, +1} and packing t again by the planar layout the header documents
 *                  gives back the input bytes exactly; t packed as sums of one rank
 *                  (add_pack with m_in = 0) unpacks to t.
 *   mode % 3 == 1: sums_unpack(data, len, n, m) with n the most sums len holds (minus
 *                  adjust & 7), or a mismatched n with bit 7 set. On success every sum is in
 *                  [-m, m], and add_pack of zero codes re-packs them for m + 1 ranks unchanged.
 *                  sums_values gives the same result code and value[sum + m] for each sum.
 *   mode % 3 == 2: sums_add_pack(in, in_bytes, m_in = m % 32767, t, n, out): t from the first
 *                  n data bytes (% 3 - 1), `in` the rest, sized exactly for n sums of m_in
 *                  ranks unless bit 7 of adjust is set. out is exactly gcomp_tg_sum_bytes(n,
 *                  m_in + 1) bytes. On success out unpacks to the input sums plus t.
 * Results other than SUCCESS, CORRUPT (and UNSUPPORTED for m > 32767 in mode 1) are
 * violations, as are out-of-bounds accesses and undefined behaviour.
 */
#include "fuzz_common.h"

#include "codecs/terngrad.h"

#define MAX_LEN ((size_t)1 << 15)

/* The `in` of add_pack when m_in = 0: NULL, as src/sched_integer.c passes it. Masked: a
 * non-NULL pointer (open issue 1 in regressions/README.md). */
static const uint8_t *no_input(void) { return NULL; } /* what the engine passes on the first hop */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    FUZZ_CHECK(p != NULL);
    return p;
}

/* The planar layout of codecs/terngrad.h, written from the header: tiles of GCOMP_TG_TILE
 * elements; a tile of len elements takes q = ceil(len / 4) bytes and its element k sits in
 * byte k % q at bits 2 (k / q); codes 0 -> 0, +1 -> 1, -1 -> 2. */
static void pack_codes_reference(const int8_t *t, size_t n, uint8_t *out)
{
    memset(out, 0, (n + 3) / 4);
    for (size_t a = 0; a < n; a += GCOMP_TG_TILE) {
        size_t len = n - a < GCOMP_TG_TILE ? n - a : GCOMP_TG_TILE, q = (len + 3) / 4;
        for (size_t k = 0; k < len; k++) {
            unsigned code = t[a + k] == 1 ? 1u : t[a + k] == -1 ? 2u : 0u;
            out[a / 4 + k % q] |= (uint8_t)(code << (2 * (k / q)));
        }
    }
}

static void mode_codes(const uint8_t *in, size_t len, uint8_t adjust)
{
    size_t n = adjust & 0x80 ? ((size_t)adjust * 131u + len * 3u) % (4 * len + 9) : 4 * len - (adjust & 3u);
    int8_t *t;
    int16_t *back;
    uint8_t *packed, *sums;
    gcomp_result rc;
    if (len == 0 && !(adjust & 0x80)) n = 0;
    t = xmalloc(n);
    rc = gcomp__tg_codes_unpack(in, len, n, t);
    FUZZ_CHECK(rc == GCOMP_SUCCESS || rc == GCOMP_ERR_CORRUPT);
    if (rc == GCOMP_SUCCESS) {
        FUZZ_CHECK(len == (n + 3) / 4);
        for (size_t i = 0; i < n; i++) FUZZ_CHECK(t[i] >= -1 && t[i] <= 1);
        packed = xmalloc(len);
        pack_codes_reference(t, n, packed);
        FUZZ_CHECK(memcmp(packed, in, len) == 0);
        free(packed);

        sums = xmalloc((size_t)gcomp_tg_sum_bytes(n, 1));
        back = xmalloc(n * sizeof *back);
        FUZZ_CHECK(gcomp__tg_sums_add_pack(no_input(), 0, 0, t, n, sums) == GCOMP_SUCCESS);
        FUZZ_CHECK(gcomp__tg_sums_unpack(sums, (size_t)gcomp_tg_sum_bytes(n, 1), n, 1, back) == GCOMP_SUCCESS);
        for (size_t i = 0; i < n; i++) FUZZ_CHECK(back[i] == t[i]);
        free(back);
        free(sums);
    }
    free(t);
}

static void mode_unpack(const uint8_t *in, size_t len, uint32_t m, uint8_t adjust)
{
    size_t most = m ? (size_t)gcomp_tg_sums_fit(len, m) : (size_t)adjust, n;
    int16_t *out, *again;
    int8_t *zeros;
    uint8_t *repacked;
    gcomp_result rc;
    n = adjust & 0x80 ? ((size_t)adjust * 977u + len) % (most + 17)
                      : most - (most < (adjust & 7u) ? most : (adjust & 7u));
    out = xmalloc(n * sizeof *out);
    rc = gcomp__tg_sums_unpack(in, len, n, m, out);
    if (m >= 1 && m <= 32767) { /* straight to values: the same verdict, and value[sum + m] */
        float *value = xmalloc((2 * (size_t)m + 1) * sizeof *value), *vals = xmalloc(n * sizeof *vals);
        for (size_t k = 0; k < 2 * (size_t)m + 1; k++) value[k] = (float)k;
        FUZZ_CHECK(gcomp__tg_sums_values(in, len, n, m, value, vals) == rc);
        for (size_t i = 0; rc == GCOMP_SUCCESS && i < n; i++) FUZZ_CHECK(vals[i] == (float)(out[i] + (int32_t)m));
        free(vals);
        free(value);
    }
    if (m == 0) { /* sums of no rank: a caller error, refused before reading anything */
        FUZZ_CHECK(rc == GCOMP_ERR_INVALID_ARG);
    } else if (m > 32767) {
        FUZZ_CHECK(rc == GCOMP_ERR_UNSUPPORTED);
    } else {
        FUZZ_CHECK(rc == GCOMP_SUCCESS || rc == GCOMP_ERR_CORRUPT);
    }
    if (rc == GCOMP_SUCCESS) {
        FUZZ_CHECK(len == gcomp_tg_sum_bytes(n, m));
        for (size_t i = 0; i < n; i++) FUZZ_CHECK(out[i] >= -(int32_t)m && out[i] <= (int32_t)m);
        if (m >= 1 && m < 32767) {
            size_t rb = (size_t)gcomp_tg_sum_bytes(n, m + 1);
            zeros = calloc(n ? n : 1, 1);
            repacked = xmalloc(rb);
            again = xmalloc(n * sizeof *again);
            FUZZ_CHECK(zeros != NULL);
            FUZZ_CHECK(gcomp__tg_sums_add_pack(in, len, m, zeros, n, repacked) == GCOMP_SUCCESS);
            FUZZ_CHECK(gcomp__tg_sums_unpack(repacked, rb, n, m + 1, again) == GCOMP_SUCCESS);
            FUZZ_CHECK(n == 0 || memcmp(again, out, n * sizeof *out) == 0);
            free(again);
            free(repacked);
            free(zeros);
        }
    }
    free(out);
}

static void mode_add_pack(const uint8_t *data, size_t len, uint32_t m_in, uint8_t adjust)
{
    unsigned wi = m_in ? gcomp_tg_sum_bits(m_in) : 0;
    size_t n, in_bytes, ob;
    int8_t *t;
    uint8_t *in, *out;
    int16_t *a = NULL, *b;
    gcomp_result rc;

    /* the most sums whose codes and packed input both fit in len bytes */
    n = len * 8 / (8 + wi);
    while (n > 0 && n + gcomp_tg_sum_bytes(n, m_in) > len) n--;
    n -= n < (adjust & 7u) ? n : (adjust & 7u);
    in_bytes = adjust & 0x80 ? len - n : (size_t)gcomp_tg_sum_bytes(n, m_in);
    t = xmalloc(n);
    for (size_t i = 0; i < n; i++) t[i] = (int8_t)(data[i] % 3) - 1;
    in = xmalloc(in_bytes);
    if (in_bytes) memcpy(in, data + n, in_bytes);
    ob = (size_t)gcomp_tg_sum_bytes(n, m_in + 1);
    out = xmalloc(ob);

    rc = gcomp__tg_sums_add_pack(m_in ? in : no_input(), m_in ? in_bytes : 0, m_in, t, n, out);
    FUZZ_CHECK(rc == GCOMP_SUCCESS || rc == GCOMP_ERR_CORRUPT);
    if (m_in == 0) FUZZ_CHECK(rc == GCOMP_SUCCESS);
    if (rc == GCOMP_SUCCESS) {
        b = xmalloc(n * sizeof *b);
        FUZZ_CHECK(gcomp__tg_sums_unpack(out, ob, n, m_in + 1, b) == GCOMP_SUCCESS);
        if (m_in) {
            a = xmalloc(n * sizeof *a);
            FUZZ_CHECK(gcomp__tg_sums_unpack(in, in_bytes, n, m_in, a) == GCOMP_SUCCESS);
        }
        for (size_t i = 0; i < n; i++) FUZZ_CHECK(b[i] == (a ? a[i] : 0) + t[i]);
        free(a);
        free(b);
    }
    free(out);
    free(in);
    free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t mode, adjust;
    uint32_t m;
    size_t len;
    uint8_t *in;

    if (size < 4) return 0;
    mode = data[0] % 3;
    m = (uint32_t)data[1] | (uint32_t)data[2] << 8;
    adjust = data[3];
    len = size - 4 < MAX_LEN ? size - 4 : MAX_LEN;
    in = xmalloc(len); /* exact size: AddressSanitizer sees a read past the end */
    if (len) memcpy(in, data + 4, len);
    if (mode == 0)
        mode_codes(in, len, adjust);
    else if (mode == 1)
        mode_unpack(in, len, m, adjust);
    else
        mode_add_pack(in, len, m % 32767, adjust);
    free(in);
    return 0;
}
