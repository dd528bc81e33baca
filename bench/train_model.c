/*
 * train_model.c — forward and backward passes of a small sequential network.
 *
 * Activations are stored per layer as [n][c][h][w] (row-major). Dense weights are [out][in];
 * convolution weights are [cout][cin*k*k], applied per sample to an im2col matrix
 * [cin*k*k][oh*ow], so both directions of both layer types are plain sgemm calls.
 */
#include "train_model.h"

#include <cblas.h>
#include <float.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum {
    L_DENSE,
    L_CONV,
    L_RELU,
    L_POOL
};

typedef struct layer {
    int kind;
    int ic, ih, iw; /* input shape (dense: ic features, ih = iw = 1) */
    int oc, oh, ow; /* output shape */
    int k, pad;     /* convolution */
    int wt, bt;     /* tensor indices of weights and bias (dense, conv) */
    int *argmax;    /* pool: input index of each output, batch_cap * out elements */
} layer;

#define MAX_LAYERS 12
#define NCLASSES 10

struct train_model {
    int nlayers;
    layer l[MAX_LAYERS];
    int ntensors;
    train_tensor t[2 * MAX_LAYERS];
    size_t nparams;
    float *params, *grads;
    int batch_cap;
    float *act[MAX_LAYERS + 1]; /* act[0] points at the caller's input */
    float *delta[2];            /* ping-pong gradients of activations */
    float *col, *dcol;          /* im2col scratch of one sample */
    float *probs;
};

static size_t out_size(const layer *L) { return (size_t)L->oc * L->oh * L->ow; }
static size_t in_size(const layer *L) { return (size_t)L->ic * L->ih * L->iw; }

/* ---- building ------------------------------------------------------------------------- */

static int add_tensor(train_model *m, const char *name, size_t count)
{
    train_tensor *t = &m->t[m->ntensors];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->off = m->nparams;
    t->count = count;
    m->nparams += count;
    return m->ntensors++;
}

static layer *push(train_model *m, int kind, int ic, int ih, int iw)
{
    layer *L = &m->l[m->nlayers++];
    memset(L, 0, sizeof *L);
    L->kind = kind;
    L->ic = ic;
    L->ih = ih;
    L->iw = iw;
    L->oc = ic;
    L->oh = ih;
    L->ow = iw;
    return L;
}

static const layer *last(const train_model *m) { return &m->l[m->nlayers - 1]; }

static void dense(train_model *m, const char *name, int out)
{
    int in = m->nlayers ? (int)out_size(last(m)) : 784;
    char buf[24];
    layer *L = push(m, L_DENSE, in, 1, 1);
    L->oc = out;
    snprintf(buf, sizeof buf, "%s.weight", name);
    L->wt = add_tensor(m, buf, (size_t)out * in);
    snprintf(buf, sizeof buf, "%s.bias", name);
    L->bt = add_tensor(m, buf, (size_t)out);
}

static void conv(train_model *m, const char *name, int ic, int ih, int iw, int oc, int k, int pad)
{
    char buf[24];
    layer *L = push(m, L_CONV, ic, ih, iw);
    L->oc = oc;
    L->k = k;
    L->pad = pad;
    L->oh = ih + 2 * pad - k + 1;
    L->ow = iw + 2 * pad - k + 1;
    snprintf(buf, sizeof buf, "%s.weight", name);
    L->wt = add_tensor(m, buf, (size_t)oc * ic * k * k);
    snprintf(buf, sizeof buf, "%s.bias", name);
    L->bt = add_tensor(m, buf, (size_t)oc);
}

static void relu(train_model *m)
{
    const layer *p = last(m);
    push(m, L_RELU, p->oc, p->oh, p->ow);
}

static void pool(train_model *m)
{
    const layer *p = last(m);
    layer *L = push(m, L_POOL, p->oc, p->oh, p->ow);
    L->oh = p->oh / 2;
    L->ow = p->ow / 2;
}

static double normal(uint64_t *s)
{
    double u1 = ((double)(train_splitmix64(s) >> 11) + 1.0) * 0x1p-53; /* (0, 1] */
    double u2 = (double)(train_splitmix64(s) >> 11) * 0x1p-53;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

train_model *train_model_create(const char *kind, int batch_cap, uint64_t seed)
{
    train_model *m = calloc(1, sizeof *m);
    size_t max_act = 784, col = 1;
    if (!m || batch_cap < 1) goto fail;
    m->batch_cap = batch_cap;
    if (strcmp(kind, "mlp") == 0) {
        dense(m, "fc1", 256);
        relu(m);
        dense(m, "fc2", 128);
        relu(m);
        dense(m, "fc3", NCLASSES);
    } else if (strcmp(kind, "cnn") == 0) {
        conv(m, "conv1", 1, 28, 28, 16, 5, 2);
        relu(m);
        pool(m);
        conv(m, "conv2", 16, 14, 14, 32, 3, 1);
        relu(m);
        pool(m);
        dense(m, "fc1", 128);
        relu(m);
        dense(m, "fc2", NCLASSES);
    } else {
        goto fail;
    }
    m->params = calloc(m->nparams, sizeof(float));
    m->grads = calloc(m->nparams, sizeof(float));
    if (!m->params || !m->grads) goto fail;
    for (int i = 0; i < m->nlayers; i++) {
        layer *L = &m->l[i];
        size_t o = out_size(L);
        if (o > max_act) max_act = o;
        m->act[i + 1] = malloc((size_t)batch_cap * o * sizeof(float));
        if (!m->act[i + 1]) goto fail;
        if (L->kind == L_POOL && !(L->argmax = malloc((size_t)batch_cap * o * sizeof(int)))) goto fail;
        if (L->kind == L_CONV) {
            size_t c = (size_t)L->ic * L->k * L->k * L->oh * L->ow;
            if (c > col) col = c;
        }
        if (L->kind == L_DENSE || L->kind == L_CONV) {
            /* He-normal weights, one stream per tensor so adding a layer changes no other */
            uint64_t s = seed * 0x9E3779B97F4A7C15ull + (uint64_t)L->wt * 0xD1B54A32D192ED03ull + 1;
            const train_tensor *t = &m->t[L->wt];
            double sd = sqrt(2.0 / (double)(t->count / (size_t)L->oc));
            for (size_t j = 0; j < t->count; j++) m->params[t->off + j] = (float)(sd * normal(&s));
        }
    }
    m->delta[0] = malloc((size_t)batch_cap * max_act * sizeof(float));
    m->delta[1] = malloc((size_t)batch_cap * max_act * sizeof(float));
    m->col = malloc(col * sizeof(float));
    m->dcol = malloc(col * sizeof(float));
    m->probs = malloc((size_t)batch_cap * NCLASSES * sizeof(float));
    if (!m->delta[0] || !m->delta[1] || !m->col || !m->dcol || !m->probs) goto fail;
    return m;
fail:
    train_model_destroy(m);
    return NULL;
}

void train_model_destroy(train_model *m)
{
    if (!m) return;
    for (int i = 0; i < m->nlayers; i++) {
        free(m->act[i + 1]);
        free(m->l[i].argmax);
    }
    free(m->params);
    free(m->grads);
    free(m->delta[0]);
    free(m->delta[1]);
    free(m->col);
    free(m->dcol);
    free(m->probs);
    free(m);
}

size_t train_model_nparams(const train_model *m) { return m->nparams; }
int train_model_ntensors(const train_model *m) { return m->ntensors; }
const train_tensor *train_model_tensor(const train_model *m, int i) { return &m->t[i]; }
float *train_model_params(train_model *m) { return m->params; }
float *train_model_grads(train_model *m) { return m->grads; }

/* ---- convolution helpers (stride 1, zero padding) ------------------------------------- */

static void im2col(const layer *L, const float *x, float *col)
{
    int ohw = L->oh * L->ow;
    for (int c = 0; c < L->ic; c++)
        for (int ky = 0; ky < L->k; ky++)
            for (int kx = 0; kx < L->k; kx++) {
                float *row = col + (size_t)((c * L->k + ky) * L->k + kx) * ohw;
                for (int oy = 0; oy < L->oh; oy++) {
                    int iy = oy + ky - L->pad;
                    for (int ox = 0; ox < L->ow; ox++) {
                        int ix = ox + kx - L->pad;
                        row[oy * L->ow + ox] = (iy >= 0 && iy < L->ih && ix >= 0 && ix < L->iw)
                                                   ? x[((size_t)c * L->ih + iy) * L->iw + ix]
                                                   : 0.0f;
                    }
                }
            }
}

static void col2im_add(const layer *L, const float *col, float *dx)
{
    int ohw = L->oh * L->ow;
    for (int c = 0; c < L->ic; c++)
        for (int ky = 0; ky < L->k; ky++)
            for (int kx = 0; kx < L->k; kx++) {
                const float *row = col + (size_t)((c * L->k + ky) * L->k + kx) * ohw;
                for (int oy = 0; oy < L->oh; oy++) {
                    int iy = oy + ky - L->pad;
                    if (iy < 0 || iy >= L->ih) continue;
                    for (int ox = 0; ox < L->ow; ox++) {
                        int ix = ox + kx - L->pad;
                        if (ix >= 0 && ix < L->iw) dx[((size_t)c * L->ih + iy) * L->iw + ix] += row[oy * L->ow + ox];
                    }
                }
            }
}

/* ---- forward -------------------------------------------------------------------------- */

static void forward_layer(train_model *m, int i, int n)
{
    layer *L = &m->l[i];
    const float *x = m->act[i];
    float *y = m->act[i + 1];
    size_t isz = in_size(L), osz = out_size(L);
    switch (L->kind) {
    case L_DENSE: {
        const float *w = m->params + m->t[L->wt].off, *b = m->params + m->t[L->bt].off;
        for (int s = 0; s < n; s++) memcpy(y + (size_t)s * L->oc, b, (size_t)L->oc * sizeof(float));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, L->oc, L->ic, 1.0f, x, L->ic, w, L->ic, 1.0f, y, L->oc);
        break;
    }
    case L_CONV: {
        const float *w = m->params + m->t[L->wt].off, *b = m->params + m->t[L->bt].off;
        int ohw = L->oh * L->ow, ckk = L->ic * L->k * L->k;
        for (int s = 0; s < n; s++) {
            float *ys = y + (size_t)s * osz;
            im2col(L, x + (size_t)s * isz, m->col);
            for (int c = 0; c < L->oc; c++)
                for (int j = 0; j < ohw; j++) ys[(size_t)c * ohw + j] = b[c];
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, L->oc, ohw, ckk, 1.0f, w, ckk, m->col, ohw, 1.0f, ys,
                        ohw);
        }
        break;
    }
    case L_RELU:
        for (size_t j = 0; j < (size_t)n * osz; j++) y[j] = x[j] > 0.0f ? x[j] : 0.0f;
        break;
    case L_POOL:
        for (int s = 0; s < n; s++)
            for (int c = 0; c < L->oc; c++)
                for (int oy = 0; oy < L->oh; oy++)
                    for (int ox = 0; ox < L->ow; ox++) {
                        size_t base = (size_t)s * isz + ((size_t)c * L->ih + 2 * oy) * L->iw + 2 * ox;
                        size_t best = base, o = (size_t)s * osz + ((size_t)c * L->oh + oy) * L->ow + ox;
                        size_t cand[3] = { base + 1, base + (size_t)L->iw, base + (size_t)L->iw + 1 };
                        for (int q = 0; q < 3; q++)
                            if (x[cand[q]] > x[best]) best = cand[q];
                        y[o] = x[best];
                        L->argmax[o] = (int)(best - (size_t)s * isz);
                    }
        break;
    }
}

/* Softmax of the logits into m->probs; returns the loss sum and counts correct argmaxes. */
static double softmax_xent(train_model *m, const uint8_t *y, int n, int *correct)
{
    const float *z = m->act[m->nlayers];
    double loss = 0.0;
    int ok = 0;
    for (int s = 0; s < n; s++) {
        const float *zs = z + (size_t)s * NCLASSES;
        float *p = m->probs + (size_t)s * NCLASSES;
        float mx = -FLT_MAX, sum = 0.0f;
        int arg = 0;
        for (int c = 0; c < NCLASSES; c++)
            if (zs[c] > mx) {
                mx = zs[c];
                arg = c;
            }
        for (int c = 0; c < NCLASSES; c++) sum += p[c] = expf(zs[c] - mx);
        for (int c = 0; c < NCLASSES; c++) p[c] /= sum;
        loss += -(double)(zs[y[s]] - mx) + log((double)sum);
        ok += arg == y[s];
    }
    *correct = ok;
    return loss;
}

static double forward(train_model *m, const float *x, const uint8_t *y, int n, int *correct)
{
    m->act[0] = (float *)x;
    for (int i = 0; i < m->nlayers; i++) forward_layer(m, i, n);
    return softmax_xent(m, y, n, correct);
}

/* ---- backward ------------------------------------------------------------------------- */

/* dy: gradient of layer i's output; writes layer i's parameter gradients and, if dx is not
 * NULL, the gradient of its input. */
static void backward_layer(train_model *m, int i, int n, const float *dy, float *dx)
{
    layer *L = &m->l[i];
    const float *x = m->act[i], *y = m->act[i + 1];
    size_t isz = in_size(L), osz = out_size(L);
    switch (L->kind) {
    case L_DENSE: {
        const float *w = m->params + m->t[L->wt].off;
        float *dw = m->grads + m->t[L->wt].off, *db = m->grads + m->t[L->bt].off;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, L->oc, L->ic, n, 1.0f, dy, L->oc, x, L->ic, 0.0f, dw,
                    L->ic);
        memset(db, 0, (size_t)L->oc * sizeof(float));
        for (int s = 0; s < n; s++)
            for (int c = 0; c < L->oc; c++) db[c] += dy[(size_t)s * L->oc + c];
        if (dx)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, L->ic, L->oc, 1.0f, dy, L->oc, w, L->ic, 0.0f, dx,
                        L->ic);
        break;
    }
    case L_CONV: {
        const float *w = m->params + m->t[L->wt].off;
        float *dw = m->grads + m->t[L->wt].off, *db = m->grads + m->t[L->bt].off;
        int ohw = L->oh * L->ow, ckk = L->ic * L->k * L->k;
        memset(dw, 0, m->t[L->wt].count * sizeof(float));
        memset(db, 0, (size_t)L->oc * sizeof(float));
        if (dx) memset(dx, 0, (size_t)n * isz * sizeof(float));
        for (int s = 0; s < n; s++) {
            const float *dys = dy + (size_t)s * osz;
            im2col(L, x + (size_t)s * isz, m->col);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, L->oc, ckk, ohw, 1.0f, dys, ohw, m->col, ohw, 1.0f, dw,
                        ckk);
            for (int c = 0; c < L->oc; c++)
                for (int j = 0; j < ohw; j++) db[c] += dys[(size_t)c * ohw + j];
            if (dx) {
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ckk, ohw, L->oc, 1.0f, w, ckk, dys, ohw, 0.0f,
                            m->dcol, ohw);
                col2im_add(L, m->dcol, dx + (size_t)s * isz);
            }
        }
        break;
    }
    case L_RELU:
        if (dx)
            for (size_t j = 0; j < (size_t)n * osz; j++) dx[j] = y[j] > 0.0f ? dy[j] : 0.0f;
        break;
    case L_POOL:
        if (dx) {
            memset(dx, 0, (size_t)n * isz * sizeof(float));
            for (int s = 0; s < n; s++)
                for (size_t o = 0; o < osz; o++)
                    dx[(size_t)s * isz + (size_t)L->argmax[(size_t)s * osz + o]] += dy[(size_t)s * osz + o];
        }
        break;
    }
}

double train_model_step(train_model *m, const float *x, const uint8_t *y, int n, float grad_scale, int *correct,
                        train_grad_ready_fn ready, void *ctx)
{
    double loss = forward(m, x, y, n, correct);
    float *d = m->delta[0];
    int cur = 0;
    for (int s = 0; s < n; s++)
        for (int c = 0; c < NCLASSES; c++) {
            size_t j = (size_t)s * NCLASSES + c;
            d[j] = (m->probs[j] - (c == y[s] ? 1.0f : 0.0f)) * grad_scale;
        }
    for (int i = m->nlayers - 1; i >= 0; i--) {
        float *dx = i > 0 ? m->delta[cur ^ 1] : NULL;
        backward_layer(m, i, n, m->delta[cur], dx);
        const layer *L = &m->l[i];
        if (ready && (L->kind == L_DENSE || L->kind == L_CONV)) {
            ready(ctx, L->bt);
            ready(ctx, L->wt);
        }
        cur ^= 1;
    }
    return loss;
}

void train_model_eval(train_model *m, const float *x, const uint8_t *y, int n, double *loss_sum, int *correct)
{
    *loss_sum = 0.0;
    *correct = 0;
    for (int s = 0; s < n; s += m->batch_cap) {
        int b = n - s < m->batch_cap ? n - s : m->batch_cap, ok;
        *loss_sum += forward(m, x + (size_t)s * 784, y + s, b, &ok);
        *correct += ok;
    }
}
