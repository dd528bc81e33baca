/*
 * checkpoint.c — save and load a communicator's error-feedback state (every key's residual
 * and step, and the step of the calls without a key), so a trainer that resumes from a
 * checkpoint continues bit for bit.
 *
 * Format, versions 1 and 2, all integers little-endian:
 *
 *   offset  size  field
 *   0       8     magic "GCOMPRES"
 *   8       4     version (1)
 *   12      4     flags (0; a reader refuses bits it does not know)
 *   16      4     rank of the communicator that saved it
 *   20      4     size (ranks) of that communicator
 *   24      4     spec_len, then spec_len bytes: the canonical codec spec (no NUL)
 *   ..      8     n_keys, then n_keys records in ascending key order:
 *                   u64 key, u64 count, u64 step, count x f32 residual (IEEE bits)
 *   end-8   8     FNV-1a 64 of every byte before it
 *
 * Version 2 adds one record: key GCOMP_KEY_NONE (last, as the largest key), count 0, the step
 * of the calls made without a key (they keep no residual, but TernGrad's rounding is keyed by
 * that step). A save writes it, and version 2, only when such calls were made (the step is not
 * 0), so a blob without them stays version 1, readable by the libraries that read only that;
 * a load of a blob without it sets that step to 0, like every key the blob does not name.
 *
 * A residual is specific to its rank (it holds what this rank's codec dropped), to the codec
 * and to the tensor it belongs to, so a load refuses a file from another rank, another
 * communicator size or another codec, and a key whose element count differs from the one the
 * communicator already knows. The checksum turns a truncated or damaged file into
 * GCOMP_ERR_CORRUPT instead of a silently wrong residual. A load is all or nothing: the new
 * state is checked and built whole beside the old one, which it replaces only then, so a bad
 * record or a failed allocation halfway changes nothing.
 *
 * The calls of a communicator run on its progress thread too (request.c): save and load
 * refuse to run while a gcomp_iallreduce of the communicator is in flight, and hold the
 * request queue while they read or replace the state.
 *
 * Residuals of device buffers live in device memory: a save copies them to the host (the
 * file does not say where a residual lived), a load puts every key in the host store, and a
 * key's next call with device buffers moves its residual back to the device.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codecs/common.h"
#include "comm.h"

#define CKPT_MAGIC "GCOMPRES"
#define CKPT_VERSION 2u /* the newest this library reads; it writes 1 where that suffices */
#define CKPT_FIXED 28u  /* magic .. spec_len */
#define CKPT_RECORD 24u /* key, count, step */
#define TMP_PATH_MAX 4096 /* the temporary file's path, beside the one saved to */
/* User text in messages (a path, a file's spec bytes) is escaped and cut to at most this many
 * characters of message, an escape counting the four it takes, so the reason after it always
 * fits in gcomp_last_error() */
#define QUOTE_CHARS 160

static uint64_t fnv1a(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* One key's state to save: a host residual's buffer, or a device residual copied to host
 * memory (owned). */
typedef struct record {
    uint64_t key;
    size_t count;
    uint64_t step;
    const float *data;
    float *owned;
} record;

static int cmp_record(const void *a, const void *b)
{
    uint64_t x = ((const record *)a)->key, y = ((const record *)b)->key;
    return x < y ? -1 : x > y;
}

static void free_records(record *v, size_t n)
{
    for (size_t i = 0; v && i < n; i++) free(v[i].owned);
    free(v);
}

/* Every key's residual in ascending key order (a stable file for the same state): the host
 * store's, and those living in device memory (copied to the host when with_data; a key lives
 * in one place only). The caller frees with free_records. */
static gcomp_result gather_records(gcomp_comm *comm, int with_data, record **out, size_t *n)
{
    const gcomp__residual_store *s = gcomp__codec_residuals(comm->codec);
    size_t n_dev = gcomp__codec_dev_keys(comm->codec, NULL, 0), k = 0;
    uint64_t *dev_keys = malloc((n_dev ? n_dev : 1) * sizeof *dev_keys);
    record *v = calloc(s->used + n_dev + 1, sizeof *v); /* + 1: the keyless step's (add_keyless_step) */
    gcomp_result rc = GCOMP_SUCCESS;
    if (!v || !dev_keys) {
        free(v);
        free(dev_keys);
        return gcomp__fail(GCOMP_ERR_NOMEM, "residual checkpoint: out of memory");
    }
    for (size_t i = 0; i < s->cap; i++)
        if (s->slots[i]) {
            const gcomp__residual *r = s->slots[i];
            v[k++] = (record){ r->key, r->count, r->step, r->buf[r->cur], NULL };
        }
    gcomp__codec_dev_keys(comm->codec, dev_keys, n_dev);
    for (size_t i = 0; i < n_dev && rc == GCOMP_SUCCESS; i++) {
        record *r = &v[k++];
        r->key = dev_keys[i];
        rc = gcomp__codec_dev_export(comm->codec, r->key, NULL, &r->count, &r->step);
        if (rc != GCOMP_SUCCESS || !with_data) continue;
        if (!(r->owned = malloc(r->count ? r->count * sizeof(float) : 1))) {
            rc = gcomp__fail(GCOMP_ERR_NOMEM, "residual checkpoint: out of memory");
            break;
        }
        rc = gcomp__codec_dev_export(comm->codec, r->key, r->owned, &r->count, &r->step);
        r->data = r->owned;
    }
    free(dev_keys);
    if (rc != GCOMP_SUCCESS) {
        free_records(v, k);
        return rc;
    }
    qsort(v, k, sizeof *v, cmp_record);
    *out = v;
    *n = k;
    return GCOMP_SUCCESS;
}

/* The keyless step as a record of its own (format version 2), when there is one to save. */
static size_t add_keyless_step(gcomp_comm *comm, record *v, size_t n)
{
    if (comm->nokey_step == 0) return n;
    v[n] = (record){ GCOMP_KEY_NONE, 0, comm->nokey_step, NULL, NULL };
    return n + 1;
}

static size_t blob_bytes(const char *spec, const record *v, size_t n)
{
    size_t bytes = CKPT_FIXED + strlen(spec) + 8 + 8;
    for (size_t i = 0; i < n; i++) bytes += CKPT_RECORD + v[i].count * sizeof(float);
    return bytes;
}

static void put_floats(uint8_t *p, const float *src, size_t count)
{
    for (size_t i = 0; i < count; i++) gcomp_le_store_u32(p + 4 * i, gcomp_f32_bits(src[i]));
}

/* What every entry point checks before it touches the state: no state to save, and a load of
 * the blob would be refused, with error feedback off; and no call may run meanwhile (the
 * progress thread encodes with the residuals a load frees). On success the communicator is
 * held: the caller releases it (gcomp__comm_release). */
static gcomp_result begin_state_access(gcomp_comm *comm, const char *api)
{
    if (!comm->cfg.error_feedback)
        return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                           "%s: the communicator has error feedback off (gcomp_config.error_feedback or GCOMP_EF = 0)",
                           api);
    return gcomp__comm_hold(comm, api);
}

/* gcomp_comm_residuals_save on a held communicator. */
static gcomp_result save_blob(gcomp_comm *comm, void *buf, size_t cap, size_t *written)
{
    const char *spec;
    record *v = NULL;
    size_t n = 0, need;
    uint8_t *p = buf;
    spec = gcomp_codec_spec(comm->codec);
    GCOMP_CHECK(gather_records(comm, buf != NULL, &v, &n));
    n = add_keyless_step(comm, v, n); /* gather_records leaves room for it, after the largest key */
    need = blob_bytes(spec, v, n);
    *written = need;
    if (!buf) {
        free_records(v, n);
        return GCOMP_SUCCESS;
    }
    if (cap < need) {
        free_records(v, n);
        return gcomp__fail(GCOMP_ERR_BUFFER_TOO_SMALL, "gcomp_comm_residuals_save: needs %zu bytes, buffer has %zu",
                           need, cap);
    }
    memcpy(p, CKPT_MAGIC, 8);
    gcomp_le_store_u32(p + 8, n && v[n - 1].key == GCOMP_KEY_NONE ? 2u : 1u);
    gcomp_le_store_u32(p + 12, 0);
    gcomp_le_store_u32(p + 16, (uint32_t)gcomp_comm_rank(comm));
    gcomp_le_store_u32(p + 20, (uint32_t)gcomp_comm_size(comm));
    gcomp_le_store_u32(p + 24, (uint32_t)strlen(spec));
    memcpy(p + CKPT_FIXED, spec, strlen(spec));
    p += CKPT_FIXED + strlen(spec);
    gcomp_le_store_u64(p, n);
    p += 8;
    for (size_t i = 0; i < n; i++) {
        const record *r = &v[i];
        gcomp_le_store_u64(p, r->key);
        gcomp_le_store_u64(p + 8, r->count);
        gcomp_le_store_u64(p + 16, r->step);
        put_floats(p + CKPT_RECORD, r->data, r->count);
        p += CKPT_RECORD + r->count * sizeof(float);
    }
    gcomp_le_store_u64(p, fnv1a(buf, need - 8));
    free_records(v, n);
    return GCOMP_SUCCESS;
}

gcomp_result gcomp_comm_residuals_save(gcomp_comm *comm, void *buf, size_t cap, size_t *written)
{
    gcomp_result rc;
    if (!comm || !written) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_comm_residuals_save: NULL comm or written");
    GCOMP_CHECK(begin_state_access(comm, "gcomp_comm_residuals_save"));
    rc = save_blob(comm, buf, cap, written);
    gcomp__comm_release(comm);
    return rc;
}

/* The count the communicator already associates with key (0 when it knows none). */
static size_t known_count(gcomp_comm *comm, uint64_t key)
{
    const gcomp__residual *r = gcomp__residual_find(gcomp__codec_residuals(comm->codec), key);
    size_t count = 0;
    uint64_t step;
    if (r) return r->count;
    if (gcomp__codec_dev_has_key(comm->codec, key) &&
        gcomp__codec_dev_export(comm->codec, key, NULL, &count, &step) == GCOMP_SUCCESS)
        return count;
    for (const gcomp__key *k = comm->keys; k; k = k->next)
        if (k->key == key) return k->count;
    return 0;
}

/* Header checks: everything that makes the file another communicator's. */
static gcomp_result check_header(gcomp_comm *comm, const uint8_t *p, size_t bytes, size_t *pos, uint32_t *version_out)
{
    const char *spec = gcomp_codec_spec(comm->codec);
    uint32_t version, flags, rank, size, spec_len;
    /* magic and version first: a newer format may differ in everything after them, its
     * checksum included, and is UNSUPPORTED (gcomp.h), not corrupt */
    if (bytes < 12 || memcmp(p, CKPT_MAGIC, 8) != 0)
        return gcomp__fail(GCOMP_ERR_CORRUPT,
                           "residual checkpoint: not a gcomp residual checkpoint (bad magic or %zu bytes)", bytes);
    version = gcomp_le_load_u32(p + 8);
    if (version == 0) /* no library wrote one: version 1 is the first */
        return gcomp__fail(GCOMP_ERR_CORRUPT,
                           "residual checkpoint: format version %u, which does not exist (the first is 1)", version);
    if (version > CKPT_VERSION)
        return gcomp__fail(GCOMP_ERR_UNSUPPORTED,
                           "residual checkpoint: format version %u, this library reads versions 1 to %u", version,
                           CKPT_VERSION);
    if (bytes < CKPT_FIXED + 16)
        return gcomp__fail(GCOMP_ERR_CORRUPT, "residual checkpoint: truncated (%zu bytes)", bytes);
    if (fnv1a(p, bytes - 8) != gcomp_le_load_u64(p + bytes - 8))
        return gcomp__fail(GCOMP_ERR_CORRUPT,
                           "residual checkpoint: checksum mismatch (truncated or damaged, %zu bytes)", bytes);
    flags = gcomp_le_load_u32(p + 12);
    rank = gcomp_le_load_u32(p + 16);
    size = gcomp_le_load_u32(p + 20);
    spec_len = gcomp_le_load_u32(p + 24);
    if (flags != 0)
        return gcomp__fail(GCOMP_ERR_UNSUPPORTED,
                           "residual checkpoint: flags %#x unknown to this library (format version %u defines none)",
                           flags, version);
    if (spec_len > bytes - CKPT_FIXED - 16)
        return gcomp__fail(GCOMP_ERR_CORRUPT, "residual checkpoint: spec length %u runs past the end", spec_len);
    if (spec_len != strlen(spec) || memcmp(p + CKPT_FIXED, spec, spec_len) != 0) {
        char q[QUOTE_CHARS + 1]; /* the file's bytes, escaped: it may hold anything */
        return gcomp__fail(GCOMP_ERR_MISMATCH,
                           "residual checkpoint: saved with codec '%s', this communicator uses '%s'",
                           gcomp__quote_bytes(q, sizeof q, (const char *)p + CKPT_FIXED, spec_len, QUOTE_CHARS), spec);
    }
    if ((int)rank != gcomp_comm_rank(comm) || (int)size != gcomp_comm_size(comm))
        return gcomp__fail(GCOMP_ERR_MISMATCH, "residual checkpoint: saved by rank %u of %u, this is rank %d of %d",
                           rank, size, gcomp_comm_rank(comm), gcomp_comm_size(comm));
    *pos = CKPT_FIXED + spec_len;
    *version_out = version;
    return GCOMP_SUCCESS;
}

/* One record's residual (count floats at data), checked, then installed into `into` unless
 * the codec keeps none (keep 0). */
static gcomp_result take_record(gcomp__residual_store *into, int keep, int in_place, uint64_t key, size_t count,
                                uint64_t step, const uint8_t *data)
{
    gcomp__residual *r;
    for (size_t j = 0; j < count; j++)
        if (!isfinite(gcomp_bits_f32(gcomp_le_load_u32(data + 4 * j))))
            return gcomp__fail(GCOMP_ERR_CORRUPT, "residual checkpoint: element %zu of key %llu is not finite", j,
                               (unsigned long long)key);
    if (!keep) return GCOMP_SUCCESS;
    GCOMP_CHECK(gcomp__residual_acquire(into, key, count, !in_place, &r));
    for (size_t j = 0; j < count; j++) r->buf[r->cur][j] = gcomp_bits_f32(gcomp_le_load_u32(data + 4 * j));
    r->step = step;
    return GCOMP_SUCCESS;
}

/* Version 2's record of the keyless step (GCOMP_KEY_NONE, 0 elements): into *keyless_step. */
static gcomp_result take_keyless_step(uint32_t version, uint64_t count, uint64_t step, uint64_t *keyless_step)
{
    if (version < 2)
        return gcomp__fail(GCOMP_ERR_CORRUPT,
                           "residual checkpoint: a record for key GCOMP_KEY_NONE, which holds no residual (format "
                           "version 1 has none)");
    if (count != 0)
        return gcomp__fail(GCOMP_ERR_CORRUPT,
                           "residual checkpoint: the record for key GCOMP_KEY_NONE (the step of calls without a key) "
                           "declares %llu elements, not 0",
                           (unsigned long long)count);
    *keyless_step = step;
    return GCOMP_SUCCESS;
}

/* Check every record against the communicator and install each into `into`, a store of its
 * own, and the keyless step into *keyless_step (0 if the file has none): the communicator's
 * state is not touched, so a failure (a bad record, or memory) leaves it as it was. */
static gcomp_result walk_records(gcomp_comm *comm, const uint8_t *p, size_t bytes, size_t pos, uint32_t version,
                                 gcomp__residual_store *into, uint64_t *keyless_step)
{
    uint32_t caps = gcomp__codec_chain(comm->codec)->stages[0].vt->caps;
    int in_place = (caps & GCOMP_CAP_RESIDUAL_IN_PLACE) != 0;
    /* an exact codec's calls use no residual (engine.c): its records -- zeros, saved before
     * it kept none -- are checked like any and then dropped, not kept as dead memory */
    int keep = !(caps & GCOMP_CAP_EXACT);
    size_t end = bytes - 8;
    uint64_t n = gcomp_le_load_u64(p + pos), prev = 0;
    pos += 8;
    *keyless_step = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t key, count, step;
        size_t known;
        if (end - pos < CKPT_RECORD)
            return gcomp__fail(GCOMP_ERR_CORRUPT, "residual checkpoint: record %llu runs past the end",
                               (unsigned long long)i);
        key = gcomp_le_load_u64(p + pos);
        count = gcomp_le_load_u64(p + pos + 8);
        step = gcomp_le_load_u64(p + pos + 16);
        pos += CKPT_RECORD;
        if (i > 0 && key <= prev)
            return gcomp__fail(GCOMP_ERR_CORRUPT, "residual checkpoint: keys out of order or repeated at key %llu",
                               (unsigned long long)key);
        prev = key;
        if (key == GCOMP_KEY_NONE) { /* the largest key: the last record */
            GCOMP_CHECK(take_keyless_step(version, count, step, keyless_step));
            continue;
        }
        /* no call makes a residual of 0 elements (a count-0 call returns before its key is
         * looked at). Every step is taken: the step only salts the codec's randomness, so a
         * step near 2^64 (a file another program wrote) wraps to 0 harmlessly, and whatever
         * a save writes after it loads again */
        if (count == 0)
            return gcomp__fail(GCOMP_ERR_CORRUPT, "residual checkpoint: key %llu has 0 elements, which no call saves",
                               (unsigned long long)key);
        if (count > (end - pos) / sizeof(float))
            return gcomp__fail(GCOMP_ERR_CORRUPT,
                               "residual checkpoint: key %llu declares %llu elements, more than the file holds",
                               (unsigned long long)key, (unsigned long long)count);
        known = known_count(comm, key);
        if (known && known != count)
            return gcomp__fail(GCOMP_ERR_MISMATCH,
                               "residual checkpoint: key %llu has %llu elements in the file, %zu in this communicator",
                               (unsigned long long)key, (unsigned long long)count, known);
        GCOMP_CHECK(take_record(into, keep, in_place, key, (size_t)count, step, p + pos));
        pos += (size_t)count * sizeof(float);
    }
    if (pos != end)
        return gcomp__fail(GCOMP_ERR_CORRUPT, "residual checkpoint: %zu bytes after the last record", end - pos);
    return GCOMP_SUCCESS;
}

/* gcomp_comm_residuals_load on a held communicator. The new state is built whole beside the
 * old one and swapped in only then: all or nothing, out of memory included. */
static gcomp_result load_blob(gcomp_comm *comm, const void *buf, size_t bytes)
{
    gcomp__residual_store fresh = { 0 };
    size_t pos = 0;
    uint32_t version = 0;
    uint64_t keyless_step = 0;
    gcomp_result rc;
    GCOMP_CHECK(check_header(comm, buf, bytes, &pos, &version));
    rc = walk_records(comm, buf, bytes, pos, version, &fresh, &keyless_step);
    if (rc != GCOMP_SUCCESS) {
        gcomp__residual_store_free(&fresh);
        return rc;
    }
    /* The state becomes exactly the file's: keys it does not name start from zero again. The
     * residuals land in the host store; a key's next call on device buffers moves its
     * residual (and step) to the device. */
    gcomp__residual_store_replace(gcomp__codec_residuals(comm->codec), &fresh);
    gcomp__codec_dev_drop_all(comm->codec);
    comm->nokey_step = keyless_step;
    return GCOMP_SUCCESS;
}

gcomp_result gcomp_comm_residuals_load(gcomp_comm *comm, const void *buf, size_t bytes)
{
    gcomp_result rc;
    if (!comm || (!buf && bytes))
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_comm_residuals_load: NULL comm or buffer");
    GCOMP_CHECK(begin_state_access(comm, "gcomp_comm_residuals_load"));
    rc = load_blob(comm, buf, bytes);
    gcomp__comm_release(comm);
    return rc;
}

/* A new file beside path, named path.PID.N.tmp into tmp: created exclusively, so it never
 * truncates a file of the user's, and processes saving to the same path (ranks sharing a
 * directory) never write into each other's. NULL with errno set on failure. */
static FILE *create_beside(const char *path, char *tmp, size_t cap)
{
    for (unsigned n = 0; n < 100; n++) {
        int fd;
        FILE *f;
        snprintf(tmp, cap, "%s.%ld.%u.tmp", path, (long)getpid(), n);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno == EEXIST) continue;
        if (fd < 0) return NULL;
        if ((f = fdopen(fd, "wb"))) return f;
        close(fd);
        remove(tmp);
        return NULL;
    }
    return NULL; /* errno is EEXIST */
}

/* The blob of a held communicator in memory of its own (the caller frees *out). */
static gcomp_result save_to_memory(gcomp_comm *comm, void **out, size_t *bytes)
{
    gcomp_result rc;
    *out = NULL;
    GCOMP_CHECK(save_blob(comm, NULL, 0, bytes));
    if (!(*out = malloc(*bytes)))
        return gcomp__fail(GCOMP_ERR_NOMEM, "residual checkpoint: cannot allocate %zu bytes", *bytes);
    rc = save_blob(comm, *out, *bytes, bytes);
    if (rc != GCOMP_SUCCESS) {
        free(*out);
        *out = NULL;
    }
    return rc;
}

/* A file's failure: "what 'path': reason", the path quoted as user text (QUOTE_CHARS). */
static gcomp_result file_fail(gcomp_result rc, const char *what, const char *path, const char *reason)
{
    char q[QUOTE_CHARS + 1];
    return gcomp__fail(rc, "%s '%s': %s", what, gcomp__quote(q, sizeof q, path, QUOTE_CHARS), reason);
}

/* Write beside, then rename: a crash mid-write never leaves a half file at path. */
static gcomp_result write_file(const char *path, const void *buf, size_t bytes)
{
    char tmp[TMP_PATH_MAX];
    gcomp_result rc = GCOMP_SUCCESS;
    FILE *f = create_beside(path, tmp, sizeof tmp);
    int bad;
    if (!f) /* named by the caller's path: the temporary file's name is ours */
        return file_fail(GCOMP_ERR_INVALID_ARG, "cannot write", path, strerror(errno));
    bad = fwrite(buf, 1, bytes, f) != bytes;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        rc = file_fail(GCOMP_ERR_INVALID_ARG, "cannot write", path, strerror(errno));
        remove(tmp);
    }
    return rc;
}

gcomp_result gcomp_comm_residuals_save_file(gcomp_comm *comm, const char *path)
{
    size_t bytes = 0;
    void *buf = NULL;
    gcomp_result rc;
    if (!comm || !path) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_comm_residuals_save_file: NULL comm or path");
    if (strlen(path) > TMP_PATH_MAX - 48) /* room for create_beside's ".PID.N.tmp" */
        return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_comm_residuals_save_file: path is too long");
    GCOMP_CHECK(begin_state_access(comm, "gcomp_comm_residuals_save_file"));
    rc = save_to_memory(comm, &buf, &bytes);
    gcomp__comm_release(comm); /* the state is copied: the file is written while calls may run */
    if (rc == GCOMP_SUCCESS) rc = write_file(path, buf, bytes);
    free(buf);
    return rc;
}

/* Everything f holds, read until end of file: a file's size may say less than it holds (a
 * procfs file says 0), so st_size (hint) only sizes the first buffer. */
static gcomp_result read_all(FILE *f, const char *path, size_t hint, void **out, size_t *len)
{
    size_t cap = hint < 4096 ? 4096 : hint + 1, n = 0; /* + 1: the end is seen without a second buffer */
    uint8_t *buf = malloc(cap), *grown;
    if (!buf) return gcomp__fail(GCOMP_ERR_NOMEM, "residual checkpoint: cannot allocate %zu bytes", cap);
    for (;;) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break; /* the end, or an error */
        if (cap > SIZE_MAX / 2 || !(grown = realloc(buf, cap * 2))) {
            free(buf);
            return file_fail(GCOMP_ERR_NOMEM, "residual checkpoint: cannot hold", path, "out of memory");
        }
        buf = grown;
        cap *= 2;
    }
    if (ferror(f)) {
        free(buf);
        return file_fail(GCOMP_ERR_INVALID_ARG, "cannot read", path, strerror(errno));
    }
    *out = buf;
    *len = n;
    return GCOMP_SUCCESS;
}

/* A regular file's bytes (the caller frees *out); anything else is refused by name. */
static gcomp_result read_file(const char *path, void **out, size_t *len)
{
    int fd;
    FILE *f;
    struct stat st;
    gcomp_result rc;
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever;
     * the regular-file check below refuses it (a regular file's reads ignore the flag) */
    fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0 || !(f = fdopen(fd, "rb"))) {
        rc = file_fail(GCOMP_ERR_INVALID_ARG, "cannot open", path, strerror(errno));
        if (fd >= 0) close(fd);
        return rc;
    }
    /* fstat, not fseek/ftell: glibc opens a directory and its ftell says LONG_MAX */
    if (fstat(fileno(f), &st) != 0)
        rc = file_fail(GCOMP_ERR_INVALID_ARG, "cannot read", path, strerror(errno));
    else if (!S_ISREG(st.st_mode) || st.st_size < 0 || (uint64_t)st.st_size >= SIZE_MAX)
        rc = file_fail(GCOMP_ERR_INVALID_ARG, "cannot read", path,
                       S_ISDIR(st.st_mode) ? "it is a directory" : "not a regular file");
    else
        rc = read_all(f, path, (size_t)st.st_size, out, len);
    fclose(f);
    return rc;
}

gcomp_result gcomp_comm_residuals_load_file(gcomp_comm *comm, const char *path)
{
    void *buf = NULL;
    size_t len = 0;
    gcomp_result rc;
    if (!comm || !path) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_comm_residuals_load_file: NULL comm or path");
    GCOMP_CHECK(begin_state_access(comm, "gcomp_comm_residuals_load_file"));
    rc = read_file(path, &buf, &len);
    if (rc == GCOMP_SUCCESS) rc = load_blob(comm, buf, len);
    gcomp__comm_release(comm);
    free(buf);
    return rc;
}

/* The resolved configuration (every field set). Lives here rather than in engine.c because
 * only the interposer and bindings need it. */
gcomp_result gcomp_comm_config_get(const gcomp_comm *comm, gcomp_config *out)
{
    if (!comm || !out) return gcomp__fail(GCOMP_ERR_INVALID_ARG, "gcomp_comm_config_get: NULL argument");
    out->codec = gcomp_codec_spec(comm->codec);
    out->min_bytes = comm->cfg.min_bytes;
    out->error_feedback = comm->cfg.error_feedback;
    out->seed = (int64_t)comm->cfg.seed;
    out->timeout_ms = comm->cfg.timeout_ms;
    out->debug = comm->cfg.debug;
    return GCOMP_SUCCESS;
}
