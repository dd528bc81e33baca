/*
 * train_data.c — read IDX files (http://yann.lecun.com/exdb/mnist/ format) through zlib,
 * which reads gzip and plain files alike.
 */
#include "train_data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

/* Fashion-MNIST training set, pixels in [0,1]. */
#define FMNIST_MEAN 0.2860f
#define FMNIST_STD 0.3530f

static uint32_t be32(const unsigned char *b)
{
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | (uint32_t)b[3];
}

/* DIR/name.gz, else DIR/name; 0 if neither exists. */
static int find_file(const char *dir, const char *name, char *path, size_t len)
{
    snprintf(path, len, "%s/%s.gz", dir, name);
    if (access(path, R_OK) == 0) return 1;
    snprintf(path, len, "%s/%s", dir, name);
    return access(path, R_OK) == 0;
}

/* Why a gzread came up short: zlib knows whether the stream was corrupt (bytes changed: bad
 * deflate data or a CRC mismatch), whether reading the file failed, or whether it just ended;
 * only the last is a truncated file. */
static void read_failure(gzFile f, const char *path, size_t want, const char *what, char *err, size_t errlen)
{
    int zerr = Z_OK;
    const char *msg = gzerror(f, &zerr);
    size_t plen = strlen(path);
    if (strncmp(msg, path, plen) == 0 && strncmp(msg + plen, ": ", 2) == 0) msg += plen + 2; /* zlib names the file */
    if (zerr == Z_ERRNO)
        snprintf(err, errlen, "%s: read error: %s", path, strerror(errno));
    else if (zerr != Z_OK && zerr != Z_BUF_ERROR)
        snprintf(err, errlen, "%s: corrupt gzip data (%s)", path, msg);
    else
        snprintf(err, errlen, "%s: truncated (expected %zu %s bytes)", path, want, what);
}

/* 0 when the stream holds n more bytes and no error up to its end. zlib checks the gzip CRC
 * only when it reaches the end of the stream, which reading exactly n bytes does not: the
 * read of one more byte does, and a stream cut inside its trailer leaves Z_BUF_ERROR. Bytes
 * after the n (which the IDX format does not have) are not looked at. */
static int read_to_end(gzFile f, unsigned char *buf, size_t n)
{
    unsigned char extra;
    int zerr = Z_OK;
    if (gzread(f, buf, (unsigned)n) != (int)n || gzread(f, &extra, 1) < 0) return -1;
    gzerror(f, &zerr);
    return zerr == Z_OK ? 0 : -1;
}

/* Reads the whole IDX file: magic 0x0000 08 ndims, ndims big-endian sizes, then bytes. */
static int read_idx(const char *path, int want_dims, uint32_t dims[3], unsigned char **data, char *err, size_t errlen)
{
    unsigned char hdr[16];
    size_t total = 1;
    gzFile f = gzopen(path, "rb");
    *data = NULL;
    if (!f) {
        snprintf(err, errlen, "cannot open %s", path);
        return -1;
    }
    int hlen = 4 + 4 * want_dims;
    if (gzread(f, hdr, (unsigned)hlen) != hlen) {
        read_failure(f, path, (size_t)hlen, "header", err, errlen);
        gzclose(f);
        return -1;
    }
    if (be32(hdr) != (0x0800u | (uint32_t)want_dims)) {
        snprintf(err, errlen, "%s: not an IDX file of unsigned bytes with %d dimensions", path, want_dims);
        gzclose(f);
        return -1;
    }
    for (int i = 0; i < want_dims; i++) {
        dims[i] = be32(hdr + 4 + 4 * i);
        if (dims[i] == 0 || dims[i] > 10000000u) {
            snprintf(err, errlen, "%s: implausible dimension %u", path, dims[i]);
            gzclose(f);
            return -1;
        }
        total *= dims[i];
    }
    *data = malloc(total);
    if (!*data) {
        snprintf(err, errlen, "%s: out of memory for %zu data bytes", path, total);
        gzclose(f);
        return -1;
    }
    if (read_to_end(f, *data, total)) {
        read_failure(f, path, total, "data", err, errlen);
        free(*data);
        *data = NULL;
        gzclose(f);
        return -1;
    }
    gzclose(f);
    return 0;
}

int train_set_load(const char *dir, const char *prefix, train_set *out, char *err, size_t errlen)
{
    char ipath[4096], lpath[4096], iname[64], lname[64];
    uint32_t idims[3], ldims[3];
    unsigned char *img = NULL, *lab = NULL;
    memset(out, 0, sizeof *out);
    snprintf(iname, sizeof iname, "%s-images-idx3-ubyte", prefix);
    snprintf(lname, sizeof lname, "%s-labels-idx1-ubyte", prefix);
    if (!find_file(dir, iname, ipath, sizeof ipath) || !find_file(dir, lname, lpath, sizeof lpath)) {
        snprintf(err, errlen,
                 "Fashion-MNIST not found: no %s/%s[.gz] or %s[.gz]. Install the Debian package "
                 "dataset-fashion-mnist (apt-get install dataset-fashion-mnist, or bash scripts/deps.sh), "
                 "or point --data at a directory holding the four IDX files",
                 dir, iname, lname);
        return -1;
    }
    if (read_idx(ipath, 3, idims, &img, err, errlen) || read_idx(lpath, 1, ldims, &lab, err, errlen)) {
        free(img);
        return -1;
    }
    if (idims[0] != ldims[0]) {
        snprintf(err, errlen, "%s has %u images but %s has %u labels", ipath, idims[0], lpath, ldims[0]);
        free(img);
        free(lab);
        return -1;
    }
    size_t px = (size_t)idims[0] * idims[1] * idims[2];
    out->x = malloc(px * sizeof(float));
    if (!out->x) {
        snprintf(err, errlen, "out of memory loading %s", ipath);
        free(img);
        free(lab);
        return -1;
    }
    for (size_t i = 0; i < px; i++) out->x[i] = ((float)img[i] / 255.0f - FMNIST_MEAN) / FMNIST_STD;
    for (uint32_t i = 0; i < ldims[0]; i++)
        if (lab[i] > 9) {
            snprintf(err, errlen, "%s: label %u at %u is not a class 0..9", lpath, lab[i], i);
            free(img);
            free(lab);
            train_set_free(out);
            return -1;
        }
    free(img);
    out->y = lab;
    out->n = (int)idims[0];
    out->rows = (int)idims[1];
    out->cols = (int)idims[2];
    return 0;
}

void train_set_free(train_set *s)
{
    if (!s) return;
    free(s->x);
    free(s->y);
    memset(s, 0, sizeof *s);
}
