/*
 * test_mpi_checkpoint.c — residual checkpoints under real Open MPI ranks (ctest runs it
 * with 2 and 3 ranks).
 *
 *  - Resume: a communicator runs STEPS calls on two keys and saves after STEPS - 1 of them;
 *    a fresh communicator loads that and runs the last step: its result is bitwise identical
 *    to the uninterrupted run's, for every lossy codec (the residual and the step that keys
 *    TernGrad's rounding both come back), through a buffer and through a file, also with a
 *    third call per step made without a key (its step comes back too: format version 2).
 *    Without the load the fresh communicator's step differs (the check can fail).
 *  - Refusals, each leaving the state as it was: another codec, another key count, another
 *    rank's file, a truncated blob (every length), a flipped byte, a newer version, unknown
 *    flags, a buffer too small, error feedback off, an unwritable path.
 *  - In flight: save and load refused while a gcomp_iallreduce is in flight, changing nothing.
 * Checks are per rank; rank 0 prints the totals and the exit code is nonzero if any failed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mpi.h>

#include "gcomp.h"
#include "gcomp_mpi.h"
#include "mpi_test_util.h"

#define N1 50000 /* 200000 bytes: compressed (min_bytes 65536) */
#define N2 30000
#define STEPS 4

static void fill(float *x, size_t n, int r, int step, int key)
{
    uint64_t s = 1000003ull * (uint64_t)r + 7919ull * (uint64_t)step + 104729ull * (uint64_t)key + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(s >> 11) * 0x1p-53 - 0.5) * 3.0f;
    }
}

static gcomp_comm *make_comm(const char *codec, int ef)
{
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *c = NULL;
    cfg.codec = codec;
    cfg.error_feedback = ef;
    cfg.min_bytes = 65536;
    if (gcomp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c) != GCOMP_SUCCESS) {
        fprintf(stderr, "rank %d: cannot create a '%s' communicator: %s\n", rank, codec, gcomp_last_error());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return c;
}

/* One training step: both keys, in place, input from (rank, step). */
static void step(gcomp_comm *c, int t, float *a, float *b)
{
    gcomp_result r1, r2;
    fill(a, N1, rank, t, 1);
    fill(b, N2, rank, t, 2);
    r1 = gcomp_allreduce(c, a, a, N1, GCOMP_F32, GCOMP_SUM, 1, NULL);
    r2 = gcomp_allreduce(c, b, b, N2, GCOMP_F32, GCOMP_SUM, 2, NULL);
    CHECK(r1 == GCOMP_SUCCESS && r2 == GCOMP_SUCCESS, "step %d: %s", t, gcomp_last_error());
}

/* A step with a third call, made without a key (GCOMP_KEY_NONE: no residual, but its own
 * step keys TernGrad's rounding), into k when k is not NULL. */
static void step_keyless(gcomp_comm *c, int t, float *a, float *b, float *k)
{
    step(c, t, a, b);
    if (!k) return;
    fill(k, N2, rank, t, 3);
    CHECK(gcomp_allreduce(c, k, k, N2, GCOMP_F32, GCOMP_SUM, GCOMP_KEY_NONE, NULL) == GCOMP_SUCCESS,
          "step %d, no key: %s", t, gcomp_last_error());
}

static void *save(gcomp_comm *c, size_t *bytes)
{
    void *blob;
    size_t need = 0;
    CHECK(gcomp_comm_residuals_save(c, NULL, 0, &need) == GCOMP_SUCCESS, "size query: %s", gcomp_last_error());
    blob = malloc(need);
    CHECK(gcomp_comm_residuals_save(c, blob, need, bytes) == GCOMP_SUCCESS && *bytes == need, "save: %s",
          gcomp_last_error());
    return blob;
}

static void test_resume(const char *codec, int via_file, int keyless)
{
    float *a = malloc(N1 * 4), *b = malloc(N2 * 4), *a2 = malloc(N1 * 4), *b2 = malloc(N2 * 4);
    float *k = keyless ? malloc(N2 * 4) : NULL, *k2 = keyless ? malloc(N2 * 4) : NULL;
    char path[256];
    size_t bytes = 0;
    void *blob = NULL;
    gcomp_comm *c = make_comm(codec, 1), *fresh;
    snprintf(path, sizeof path, "/tmp/gcomp_ckpt_%d_%d.bin", (int)getpid(), rank);
    for (int t = 0; t < STEPS - 1; t++) step_keyless(c, t, a, b, k);
    if (via_file)
        CHECK(gcomp_comm_residuals_save_file(c, path) == GCOMP_SUCCESS, "save_file: %s", gcomp_last_error());
    else
        blob = save(c, &bytes);
    step_keyless(c, STEPS - 1, a, b, k); /* the uninterrupted run's next step */

    fresh = make_comm(codec, 1);
    if (via_file) {
        CHECK(gcomp_comm_residuals_load_file(fresh, path) == GCOMP_SUCCESS, "load_file: %s", gcomp_last_error());
        unlink(path);
    } else {
        CHECK(gcomp_comm_residuals_load(fresh, blob, bytes) == GCOMP_SUCCESS, "load: %s", gcomp_last_error());
    }
    step_keyless(fresh, STEPS - 1, a2, b2, k2);
    CHECK(memcmp(a, a2, N1 * 4) == 0 && memcmp(b, b2, N2 * 4) == 0 && (!k || memcmp(k, k2, N2 * 4) == 0),
          "%s (%s%s): the resumed step differs from the uninterrupted one", codec, via_file ? "file" : "buffer",
          k ? ", with calls without a key" : "");
    gcomp_comm_destroy(fresh);

    /* the check can fail: without the load the same step differs */
    fresh = make_comm(codec, 1);
    step_keyless(fresh, STEPS - 1, a2, b2, k2);
    CHECK(memcmp(a, a2, N1 * 4) != 0, "%s: a fresh communicator without the residuals gave the same result", codec);
    /* TernGrad's keyless call too: it rounds by the step the checkpoint carried */
    CHECK(!k || strncmp(codec, "terngrad", 8) != 0 || memcmp(k, k2, N2 * 4) != 0,
          "%s: a fresh communicator without the keyless step gave the same keyless result", codec);
    gcomp_comm_destroy(fresh);
    gcomp_comm_destroy(c);
    free(blob), free(a), free(b), free(a2), free(b2), free(k), free(k2);
}

/* A refused load returns want and leaves the communicator's state byte for byte as it was. */
static void expect_refused(gcomp_comm *c, const void *blob, size_t bytes, gcomp_result want, const char *what)
{
    size_t n0 = 0, n1 = 0;
    void *before = save(c, &n0), *after;
    gcomp_result rc = gcomp_comm_residuals_load(c, blob, bytes);
    CHECK(rc == want, "%s: got %s (%s), want %s", what, gcomp_result_name(rc), gcomp_last_error(),
          gcomp_result_name(want));
    CHECK(strlen(gcomp_last_error()) > 10, "%s: no message", what);
    after = save(c, &n1);
    CHECK(n0 == n1 && memcmp(before, after, n0) == 0, "%s: a refused load changed the state", what);
    free(before), free(after);
}

static uint64_t fnv1a(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* Make the trailing checksum of a (modified) blob of `bytes` valid again. */
static void resum(uint8_t *blob, size_t bytes) { put_u64(blob + bytes - 8, fnv1a(blob, bytes - 8)); }

/* A blob whose record at step_at is at step 2^64 - 2 (a file another program wrote): loaded,
 * then two steps wrap that key's step to 0, and each save after a step loads again (one at
 * 2^64 - 1 was refused, so the library could write a file it then refused). */
static void expect_step_wraps(const uint8_t *blob, size_t bytes, size_t step_at)
{
    float *a = malloc(N1 * 4), *b = malloc(N2 * 4);
    gcomp_comm *c = make_comm("terngrad", 1), *again = make_comm("terngrad", 1);
    CHECK(gcomp_comm_residuals_load(c, blob, bytes) == GCOMP_SUCCESS, "a step of 2^64 - 2: %s", gcomp_last_error());
    for (int t = 0; t < 2; t++) {
        size_t n = 0;
        uint8_t *saved;
        step(c, t, a, b);
        saved = save(c, &n);
        CHECK(n == bytes && get_u64(saved + step_at) == (t == 0 ? UINT64_MAX : 0), "step %d: saved at step %llu", t,
              n == bytes ? (unsigned long long)get_u64(saved + step_at) : 0ull);
        CHECK(gcomp_comm_residuals_load(again, saved, n) == GCOMP_SUCCESS, "the save after step %d: %s", t,
              gcomp_last_error());
        free(saved);
    }
    gcomp_comm_destroy(c);
    gcomp_comm_destroy(again);
    free(a), free(b);
}

/* Format version 2: a blob holds the keyless step (calls with GCOMP_KEY_NONE) as a last record
 * of key GCOMP_KEY_NONE and 0 elements, and is version 1 without one; that record with
 * elements is refused. */
static void test_keyless_record(void)
{
    float *a = malloc(N1 * 4), *b = malloc(N2 * 4), *k = malloc(N2 * 4);
    gcomp_comm *keyed = make_comm("terngrad", 1), *keyless = make_comm("terngrad", 1);
    size_t n1 = 0, n2 = 0;
    uint8_t *v1, *v2;
    step_keyless(keyed, 0, a, b, NULL);
    step_keyless(keyless, 0, a, b, k);
    step_keyless(keyless, 1, a, b, k);
    v1 = save(keyed, &n1);
    v2 = save(keyless, &n2);
    CHECK(v1[8] == 1 && v2[8] == 2 && n2 == n1 + 24, "versions %d and %d, %zu and %zu bytes", v1[8], v2[8], n1, n2);
    CHECK(get_u64(v2 + n2 - 32) == UINT64_MAX && get_u64(v2 + n2 - 24) == 0 && get_u64(v2 + n2 - 16) == 2,
          "the last record: key %llu, count %llu, step %llu", (unsigned long long)get_u64(v2 + n2 - 32),
          (unsigned long long)get_u64(v2 + n2 - 24), (unsigned long long)get_u64(v2 + n2 - 16));
    CHECK(gcomp_comm_residuals_load(keyed, v2, n2) == GCOMP_SUCCESS, "a version 2 blob: %s", gcomp_last_error());
    put_u64(v2 + n2 - 24, 1); /* the keyless record with an element */
    resum(v2, n2);
    expect_refused(keyless, v2, n2, GCOMP_ERR_CORRUPT, "a GCOMP_KEY_NONE record with elements");
    CHECK(strstr(gcomp_last_error(), "declares 1 elements, not 0") != NULL, "%s", gcomp_last_error());
    gcomp_comm_destroy(keyed);
    gcomp_comm_destroy(keyless);
    free(v1), free(v2), free(a), free(b), free(k);
}

static void test_refusals(void)
{
    float *a = malloc(N1 * 4), *b = malloc(N2 * 4);
    gcomp_comm *c = make_comm("terngrad", 1), *other = make_comm("topk", 1), *small = make_comm("terngrad", 1),
               *noef = make_comm("terngrad", 0);
    size_t bytes = 0, tmp = 0;
    uint8_t *blob, *copy, *rank0;
    step(c, 0, a, b);
    step(other, 0, a, b);
    blob = save(c, &bytes);
    copy = malloc(bytes);

    CHECK(bytes > (size_t)(N1 + N2) * 4, "blob of %zu bytes holds both residuals", bytes);
    CHECK(gcomp_comm_residuals_save(c, copy, bytes - 1, &tmp) == GCOMP_ERR_BUFFER_TOO_SMALL, "short buffer accepted");

    expect_refused(other, blob, bytes, GCOMP_ERR_MISMATCH, "another codec");
    CHECK(strstr(gcomp_last_error(), "terngrad") != NULL, "the message names the file's codec: %s", gcomp_last_error());

    /* key 1 with another count in this communicator */
    fill(a, N1, rank, 0, 1);
    CHECK(gcomp_allreduce(small, a, a, N1 / 2, GCOMP_F32, GCOMP_SUM, 1, NULL) == GCOMP_SUCCESS, "%s",
          gcomp_last_error());
    expect_refused(small, blob, bytes, GCOMP_ERR_MISMATCH, "another count for key 1");

    for (size_t len = 0; len < bytes; len += len < 64 ? 1 : 4099)
        expect_refused(c, blob, len, GCOMP_ERR_CORRUPT, "truncated");
    expect_refused(c, blob, bytes - 1, GCOMP_ERR_CORRUPT, "one byte short");

    memcpy(copy, blob, bytes);
    copy[bytes / 2] ^= 0x10;
    expect_refused(c, copy, bytes, GCOMP_ERR_CORRUPT, "a flipped bit in the data");

    memcpy(copy, blob, bytes);
    copy[12] = 1; /* a flag version 1 does not define */
    resum(copy, bytes);
    expect_refused(c, copy, bytes, GCOMP_ERR_UNSUPPORTED, "unknown flags");
    CHECK(strstr(gcomp_last_error(), "flags 0x1 unknown") != NULL, "the message names the flags: %s",
          gcomp_last_error());

    memcpy(copy, blob, bytes);
    copy[8] = 3; /* version 3, checksum made valid again */
    resum(copy, bytes);
    expect_refused(c, copy, bytes, GCOMP_ERR_UNSUPPORTED, "a newer format version");
    /* a newer format may change everything after the version, its checksum too: still a
     * newer version, not a damaged file (the checksum was checked first) */
    memcpy(copy, blob, bytes);
    copy[8] = 3;
    expect_refused(c, copy, bytes, GCOMP_ERR_UNSUPPORTED, "a newer format version with another checksum");
    expect_refused(c, copy, 12, GCOMP_ERR_UNSUPPORTED, "a newer format version, 12 bytes");

    memcpy(copy, blob, bytes);
    copy[8] = 0; /* version 0: no library wrote one (it said UNSUPPORTED, as for a newer one) */
    resum(copy, bytes);
    expect_refused(c, copy, bytes, GCOMP_ERR_CORRUPT, "format version 0");

    /* a damaged structure under a valid checksum (a file another program wrote):
     * every field that says where the next one is gets checked against the file's size */
    {
        uint32_t spec_len = (uint32_t)copy[24] | (uint32_t)copy[25] << 8; /* < 64 KiB */
        size_t keys_at = 28 + spec_len, rec0 = keys_at + 8, rec1;
        uint8_t *longer = malloc(bytes + 4);
        memcpy(copy, blob, bytes);
        copy[24] = 0xff, copy[25] = 0xff, copy[26] = 0xff, copy[27] = 0x7f; /* spec_len 2^31 - 1 */
        resum(copy, bytes);
        expect_refused(c, copy, bytes, GCOMP_ERR_CORRUPT, "a spec length past the end");
        CHECK(strstr(gcomp_last_error(), "spec length") != NULL, "%s", gcomp_last_error());

        memcpy(copy, blob, bytes);
        memcpy(copy + 28, "x\n\x1b[", 4); /* the saved spec (file content: anything) is echoed escaped */
        resum(copy, bytes);
        expect_refused(c, copy, bytes, GCOMP_ERR_MISMATCH, "a spec with control bytes");
        CHECK(strstr(gcomp_last_error(), "codec 'x\\x0a\\x1b[") && !strchr(gcomp_last_error(), '\n'), "%s",
              gcomp_last_error());

        memcpy(copy, blob, bytes);
        put_u64(copy + keys_at, 3); /* three keys, two records */
        resum(copy, bytes);
        expect_refused(c, copy, bytes, GCOMP_ERR_CORRUPT, "more keys than records");
        CHECK(strstr(gcomp_last_error(), "runs past the end") != NULL, "%s", gcomp_last_error());

        memcpy(copy, blob, bytes);
        rec1 = rec0 + 24 + 4 * (size_t)get_u64(copy + rec0 + 8);
        memcpy(copy + rec1, copy + rec0, 8); /* the second record's key = the first's */
        resum(copy, bytes);
        expect_refused(c, copy, bytes, GCOMP_ERR_CORRUPT, "a repeated key");
        CHECK(strstr(gcomp_last_error(), "out of order or repeated") != NULL, "%s", gcomp_last_error());

        memcpy(copy, blob, bytes);
        put_u64(copy + rec1, UINT64_MAX); /* the second record's key: GCOMP_KEY_NONE (still ascending) */
        resum(copy, bytes);
        expect_refused(c, copy, bytes, GCOMP_ERR_CORRUPT, "a record for GCOMP_KEY_NONE in format version 1");
        CHECK(strstr(gcomp_last_error(), "GCOMP_KEY_NONE") != NULL, "%s", gcomp_last_error());

        memcpy(copy, blob, bytes);
        memcpy(copy + rec0 + 24 + 4 * 7, "\x00\x00\xc0\x7f", 4); /* element 7 of key 0: a NaN */
        resum(copy, bytes);
        expect_refused(c, copy, bytes, GCOMP_ERR_CORRUPT, "a NaN in a residual");
        CHECK(strstr(gcomp_last_error(), "element 7") && strstr(gcomp_last_error(), "not finite"), "%s",
              gcomp_last_error());

        memcpy(copy, blob, bytes);
        put_u64(copy + rec0 + 16, UINT64_MAX - 1); /* the first record's step: two calls from wrapping */
        resum(copy, bytes);
        expect_step_wraps(copy, bytes, rec0 + 16);

        memcpy(copy, blob, rec0); /* one record of 0 elements: no call makes one */
        put_u64(copy + keys_at, 1);
        put_u64(copy + rec0, 5), put_u64(copy + rec0 + 8, 0), put_u64(copy + rec0 + 16, 0);
        resum(copy, rec0 + 24 + 8);
        expect_refused(c, copy, rec0 + 24 + 8, GCOMP_ERR_CORRUPT, "a record of 0 elements");
        CHECK(strstr(gcomp_last_error(), "0 elements") != NULL, "%s", gcomp_last_error());

        memcpy(longer, blob, bytes - 8); /* 4 bytes between the last record and the checksum */
        memset(longer + bytes - 8, 0, 4);
        resum(longer, bytes + 4);
        expect_refused(c, longer, bytes + 4, GCOMP_ERR_CORRUPT, "bytes after the last record");
        CHECK(strstr(gcomp_last_error(), "after the last record") != NULL, "%s", gcomp_last_error());
        free(longer);
    }

    CHECK(gcomp_comm_residuals_load(noef, blob, bytes) == GCOMP_ERR_INVALID_ARG,
          "loaded into a communicator without EF");
    /* save refuses it too (it used to write a blob that no load would take) */
    tmp = 0;
    CHECK(gcomp_comm_residuals_save(noef, NULL, 0, &tmp) == GCOMP_ERR_INVALID_ARG &&
              strstr(gcomp_last_error(), "error feedback off"),
          "saved from a communicator without EF: %s", gcomp_last_error());
    CHECK(gcomp_comm_residuals_save_file(noef, "/tmp/gcomp_ckpt_noef.bin") == GCOMP_ERR_INVALID_ARG,
          "saved a file from a communicator without EF");
    /* a directory opens for reading under glibc and ftell said LONG_MAX (NOMEM, or ASan abort) */
    CHECK(gcomp_comm_residuals_load_file(c, "/tmp") == GCOMP_ERR_INVALID_ARG && strstr(gcomp_last_error(), "'/tmp'") &&
              strstr(gcomp_last_error(), "directory"),
          "a directory: %s", gcomp_last_error());
    /* a procfs file says it has 0 bytes: it is read to its end (not a checkpoint, and the
     * message says how many bytes it held) */
    CHECK(gcomp_comm_residuals_load_file(c, "/proc/self/status") == GCOMP_ERR_CORRUPT &&
              strstr(gcomp_last_error(), "bad magic") && !strstr(gcomp_last_error(), " 0 bytes"),
          "a procfs file: %s", gcomp_last_error());
    CHECK(gcomp_comm_residuals_save_file(c, "/nonexistent-dir/x.bin") == GCOMP_ERR_INVALID_ARG &&
              strstr(gcomp_last_error(), "cannot write '/nonexistent-dir/x.bin': No such file"),
          "unwritable path accepted, or the message names another (the temporary file): %s", gcomp_last_error());
    CHECK(gcomp_comm_residuals_load_file(c, "/nonexistent-dir/x.bin") == GCOMP_ERR_INVALID_ARG,
          "missing file accepted");
    {
        /* a path is user text: escaped and cut, so the reason after it stays (a 600-character
         * path filled the whole message, a newline or escape went into it raw, and a cut by
         * bytes, not by the escapes' length, still lost the reason) */
        char odd[700];
        memset(odd, 0xe9, sizeof odd - 1); /* non-ASCII: each byte's escape takes 4 characters */
        odd[sizeof odd - 1] = '\0';
        for (size_t k = 100; k < sizeof odd - 1; k += 100) odd[k] = '/'; /* no name over NAME_MAX */
        memcpy(odd, "/nonexistent-\n\x1b[31m/", 19);
        for (int save_it = 0; save_it <= 1; save_it++) {
            gcomp_result rc = save_it ? gcomp_comm_residuals_save_file(c, odd) : gcomp_comm_residuals_load_file(c, odd);
            const char *e = gcomp_last_error();
            CHECK(rc == GCOMP_ERR_INVALID_ARG && strstr(e, "No such file or directory") &&
                      strstr(e, "\\x0a\\x1b[31m") && !strchr(e, '\n') && !strchr(e, 0x1b),
                  "%s of an odd path: %s", save_it ? "save_file" : "load_file", e);
        }
    }
    {
        /* a FIFO: opening it for reading used to wait for a writer forever */
        char fifo[128], keep[160], got[8] = { 0 }, leftover[200];
        FILE *f;
        snprintf(fifo, sizeof fifo, "/tmp/gcomp_ckpt_fifo_%d_%d", (int)getpid(), rank);
        CHECK(mkfifo(fifo, 0600) == 0, "mkfifo %s", fifo);
        CHECK(gcomp_comm_residuals_load_file(c, fifo) == GCOMP_ERR_INVALID_ARG &&
                  strstr(gcomp_last_error(), "not a regular file"),
              "a FIFO: %s", gcomp_last_error());
        unlink(fifo);
        /* save writes a temporary file of its own beside the path: a user's path.tmp survives */
        snprintf(keep, sizeof keep, "%s.tmp", fifo);
        f = fopen(keep, "w");
        CHECK(f && fputs("keep", f) >= 0 && fclose(f) == 0, "cannot write %s", keep);
        CHECK(gcomp_comm_residuals_save_file(c, fifo) == GCOMP_SUCCESS, "save_file: %s", gcomp_last_error());
        f = fopen(keep, "r");
        CHECK(f && fread(got, 1, 4, f) == 4 && !strcmp(got, "keep"), "save_file overwrote %s", keep);
        if (f) fclose(f);
        snprintf(leftover, sizeof leftover, "%s.%d.0.tmp", fifo, (int)getpid());
        CHECK(access(leftover, F_OK) != 0, "save_file left %s behind", leftover);
        CHECK(gcomp_comm_residuals_load_file(c, fifo) == GCOMP_SUCCESS, "load_file: %s", gcomp_last_error());
        unlink(keep), unlink(fifo);
    }

    /* rank 0's blob on the other ranks (all blobs have the same size: same keys and counts) */
    rank0 = malloc(bytes);
    memcpy(rank0, blob, bytes);
    MPI_Bcast(rank0, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (rank != 0)
        expect_refused(c, rank0, bytes, GCOMP_ERR_MISMATCH, "another rank's residuals");
    else
        CHECK(gcomp_comm_residuals_load(c, rank0, bytes) == GCOMP_SUCCESS, "own blob refused: %s", gcomp_last_error());

    gcomp_comm_destroy(c), gcomp_comm_destroy(other), gcomp_comm_destroy(small), gcomp_comm_destroy(noef);
    free(blob), free(copy), free(rank0), free(a), free(b);
}

/* A checkpoint call while a gcomp_iallreduce is in flight is refused and changes nothing (here
 * below MPI_THREAD_MULTIPLE, without a progress thread, a load used to apply before the
 * queued call); the call then gives what the same call made blocking gives, and after its
 * wait a load works. */
static void test_in_flight(void)
{
    float *a = malloc(N1 * 4), *b = malloc(N1 * 4), *x = malloc(N1 * 4);
    gcomp_comm *c = make_comm("fp16", 1), *twin = make_comm("fp16", 1);
    gcomp_request *req = NULL;
    size_t bytes = 0, n1 = 0, n2 = 0, tmp = 0;
    void *early, *s1, *s2;
    step(c, 0, a, b);
    step(twin, 0, a, b);
    early = save(c, &bytes);
    step(c, 1, a, b);
    step(twin, 1, a, b);
    fill(x, N1, rank, 2, 1);
    CHECK(gcomp_iallreduce(c, x, a, N1, GCOMP_F32, GCOMP_SUM, 1, NULL, &req) == GCOMP_SUCCESS, "iallreduce: %s",
          gcomp_last_error());
    CHECK(gcomp_comm_residuals_load(c, early, bytes) == GCOMP_ERR_INVALID_ARG &&
              strstr(gcomp_last_error(), "in flight"),
          "a load in flight: %s", gcomp_last_error());
    CHECK(gcomp_comm_residuals_save(c, NULL, 0, &tmp) == GCOMP_ERR_INVALID_ARG, "a save in flight accepted");
    CHECK(gcomp_wait(&req) == GCOMP_SUCCESS, "wait: %s", gcomp_last_error());
    CHECK(gcomp_allreduce(twin, x, b, N1, GCOMP_F32, GCOMP_SUM, 1, NULL) == GCOMP_SUCCESS, "%s", gcomp_last_error());
    CHECK(memcmp(a, b, N1 * 4) == 0, "the request's result differs from the blocking call's");
    s1 = save(c, &n1);
    s2 = save(twin, &n2);
    CHECK(n1 == n2 && memcmp(s1, s2, n1) == 0, "the refused calls changed the state");
    CHECK(gcomp_comm_residuals_load(c, early, bytes) == GCOMP_SUCCESS, "a load after the wait: %s", gcomp_last_error());
    gcomp_comm_destroy(c), gcomp_comm_destroy(twin);
    free(a), free(b), free(x), free(early), free(s1), free(s2);
}

int main(int argc, char **argv)
{
    static const char *const codecs[] = { "terngrad", "topk:ratio=0.01", "fp16", "bf16+zstd" };
    int fails = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (size_t i = 0; i < sizeof codecs / sizeof codecs[0]; i++) test_resume(codecs[i], 0, 0);
    test_resume("terngrad", 1, 0);
    test_resume("terngrad", 0, 1);
    test_resume("terngrad", 1, 1);
    test_resume("topk:ratio=0.01", 0, 1);
    test_refusals();
    test_keyless_record();
    test_in_flight();
    fails = mpi_test_finish("test_mpi_checkpoint", "");
    MPI_Finalize();
    return fails ? 1 : 0;
}
