/*
 * train_model.h — the two small networks bench/train trains: a sequential stack of dense,
 * convolution (im2col + sgemm), ReLU and 2x2 max-pool layers with a softmax cross-entropy
 * head. All matrix work goes through cblas_sgemm.
 */
#ifndef GCOMP_BENCH_TRAIN_MODEL_H
#define GCOMP_BENCH_TRAIN_MODEL_H

#include <stddef.h>
#include <stdint.h>

/* One parameter tensor: a contiguous range of the model's flat parameter (and gradient)
 * array. Each is one gcomp key, unless the trainer fuses them into buckets. */
typedef struct train_tensor {
    char name[24];
    size_t off, count;
} train_tensor;

typedef struct train_model train_model;

/* kind "mlp" (784-256-128-10, ReLU) or "cnn" (conv5x5x16-pool-conv3x3x32-pool-fc128-fc10).
 * batch_cap: the most samples one forward/backward call takes. Weights are He-normal from
 * seed (biases zero), so every rank that passes the same seed starts from the same bits.
 * Returns NULL for an unknown kind or out of memory. */
train_model *train_model_create(const char *kind, int batch_cap, uint64_t seed);
void train_model_destroy(train_model *m);

size_t train_model_nparams(const train_model *m);
int train_model_ntensors(const train_model *m);
const train_tensor *train_model_tensor(const train_model *m, int i);
/* The flat parameter and gradient arrays (nparams floats each, same layout). */
float *train_model_params(train_model *m);
float *train_model_grads(train_model *m);

/* Called by train_model_step as soon as tensor t's gradient is final, while the backward pass
 * goes on with the layers below (the trainer starts that tensor's allreduce there). Tensors
 * come last layer first; a layer's bias before its weights. */
typedef void (*train_grad_ready_fn)(void *ctx, int t);

/* Forward and backward over n <= batch_cap samples (x: n images of 784 floats). Overwrites
 * the gradients with grad_scale * d(sum of per-sample losses)/d(params), calling ready (if
 * not NULL) once per tensor as its gradient is done. Returns the sum of the per-sample losses;
 * *correct receives how many argmax predictions match y. */
double train_model_step(train_model *m, const float *x, const uint8_t *y, int n, float grad_scale, int *correct,
                        train_grad_ready_fn ready, void *ctx);

/* Forward only over n samples (any n; processed batch_cap at a time): loss sum and count of
 * correct predictions. */
void train_model_eval(train_model *m, const float *x, const uint8_t *y, int n, double *loss_sum, int *correct);

/* SplitMix64: the trainer's only random source (init, shuffles). */
static inline uint64_t train_splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

#endif
