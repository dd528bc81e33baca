/*
 * train_data.h — Fashion-MNIST (IDX format, gzip or plain) for bench/train.
 */
#ifndef GCOMP_BENCH_TRAIN_DATA_H
#define GCOMP_BENCH_TRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

/* n images of rows x cols pixels as standardised floats (row-major, one image after the
 * other) and their labels 0..9. */
typedef struct train_set {
    int n, rows, cols;
    float *x;
    uint8_t *y;
} train_set;

/* Directory searched when --data is not given (Debian package dataset-fashion-mnist). */
#define TRAIN_DATA_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"

/* Load DIR/<prefix>-images-idx3-ubyte[.gz] and DIR/<prefix>-labels-idx1-ubyte[.gz]
 * (prefix "train" or "t10k"). Pixels are scaled to [0,1] and standardised with the mean and
 * standard deviation of the Fashion-MNIST training set. Returns 0, or -1 with a message in
 * err (which names the missing file and the Debian package that provides it). */
int train_set_load(const char *dir, const char *prefix, train_set *out, char *err, size_t errlen);

void train_set_free(train_set *s);

#endif
