/*
 * train.c — data-parallel training of Fashion-MNIST through gcomp_allreduce: what a codec
 * costs in accuracy for the bytes it saves. Run under mpirun; see docs/SWEEP.md.
 *
 * Every rank starts from the same weights (same --seed), walks the same shuffled order of
 * the training set, and takes its slice of each global batch. Gradients are scaled so that
 * GCOMP_AVG over ranks gives exactly the mean gradient of the global batch, then reduced one
 * gcomp key per tensor (or per fused bucket, --bucket-bytes). As DDP does, each key's
 * allreduce starts (gcomp_iallreduce) as soon as the backward pass has computed its gradients,
 * while the layers below are still being differentiated, and the update waits for all of them;
 * --blocking runs the same calls in the same order with gcomp_allreduce after the backward
 * pass instead. gcomp returns the same bits on every rank, so the weights stay identical on
 * every rank without any broadcast; the trainer checks this at the end.
 */
#include <cblas.h>
#include <errno.h>
#include <float.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <gcomp.h>
#include <gcomp_mpi.h>

#include "train_data.h"
#include "train_model.h"

/* OpenBLAS extensions (cblas.h may not declare them) */
void openblas_set_num_threads(int num_threads);
char *openblas_get_corename(void);

typedef struct options {
    const char *model, *codec, *json, *data, *schedule;
    int ef, batch, evals_per_epoch, quiet, blocking, momentum_correction;
    long long min_bytes, bucket_bytes;
    double epochs, lr, momentum, wd;
    unsigned long long seed;
} options;

/* One gcomp key: a contiguous range of the flat gradient. */
typedef struct bucket {
    size_t off, count;
    int first, last; /* tensor indices it covers */
} bucket;

#define MAX_BUCKETS 64

/* The most steps a run may take: far beyond any real run (two thousand epochs of 60,000
 * images at batch 1 are 1.2e8), and every count derived from it (history points) fits an int. */
#define MAX_STEPS 1000000000L

/* The allreduces of one step, started as the backward pass hands over each tensor's gradient
 * (grad_ready). A bucket is ready once all its tensors are; its key is the bucket index. */
typedef struct step_comm {
    gcomp_comm *comm;
    float *g;
    /* momentum correction: vel = mu vel + g + wd w per key, reduced in place of g */
    float *w, *vel, mu, wd;
    int correct;
    const bucket *b;
    int nb, overlap;
    int left[MAX_BUCKETS];  /* tensors of the bucket still to come this step */
    int order[MAX_BUCKETS]; /* buckets in the order they became ready */
    int nready;
    gcomp_request *req[MAX_BUCKETS];
} step_comm;

typedef struct history {
    double epoch, train_time_s, wall_s, loss, train_acc, test_acc, test_loss, wire_bytes_per_step;
    long step;
} history;

static int g_rank, g_size;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    if (g_rank == 0) {
        va_list ap;
        va_start(ap, fmt);
        fprintf(stderr, "train: ");
        vfprintf(stderr, fmt, ap);
        fprintf(stderr, "\n");
        va_end(ap);
    }
    MPI_Finalize();
    exit(2);
}

static void usage(int rc)
{
    if (g_rank == 0)
        fprintf(rc ? stderr : stdout,
                "usage: mpirun -np N train [options]\n"
                "  --model mlp|cnn        network (mlp: 784-256-128-10; cnn: conv-pool-conv-pool-fc-fc) [mlp]\n"
                "  --codec SPEC           gcomp codec spec, e.g. none, fp16, terngrad, topk:ratio=0.01 [none]\n"
                "  --ef 0|1               error feedback [1]\n"
                "  --min-bytes N          tensors (buckets) under N bytes bypass compression [0]\n"
                "  --bucket-bytes N       fuse consecutive tensors into buckets of >= N bytes, one key each;\n"
                "                         0: one key per tensor, -1: one bucket for the whole model [0]\n"
                "  --blocking             reduce every key after the backward pass (gcomp_allreduce) instead of\n"
                "                         starting each key's gcomp_iallreduce as soon as its gradient is ready\n"
                "  --epochs E             epochs, fractional allowed (0.25) [3]\n"
                "  --batch B              global batch, split across ranks [128]\n"
                "  --lr LR                peak learning rate [0.05]\n"
                "  --lr-schedule cosine|const  cosine decays to 0 over the run [cosine]\n"
                "  --momentum M           SGD momentum [0.9]\n"
                "  --momentum-correction  apply the momentum (and weight decay) to each key's gradient before\n"
                "                         its allreduce, and reduce that velocity (Deep Gradient Compression's\n"
                "                         momentum correction: the residual then keeps what a sparsifier drops\n"
                "                         of the velocity); the update is then w -= lr * (the reduced velocity)\n"
                "  --wd W                 weight decay [0]\n"
                "  --seed S               init, shuffle and stochastic rounding [1]\n"
                "  --evals-per-epoch K    test-set evaluations (history points) per epoch [1]\n"
                "  --data DIR             Fashion-MNIST IDX files [" TRAIN_DATA_DEFAULT_DIR "]\n"
                "  --json FILE            write the final figures and history (rank 0)\n"
                "  --quiet                no per-epoch lines\n");
    MPI_Finalize();
    exit(rc);
}

static double parse_num(const char *opt, const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (*s == '\0' || *end != '\0' || !isfinite(v)) die("%s: '%s' is not a number", opt, s);
    return v;
}

/* An integer flag, written as one (strtod would take 100.9 or 1e30 and a cast would then
 * truncate or wrap it without a word), within [lo, hi], the flag's own range (an overflow of
 * long long says that range too). want, if not NULL, says what the range means instead. */
static long long parse_int(const char *opt, const char *s, long long lo, long long hi, const char *want)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*s == '\0' || *end != '\0') die("%s: '%s' is not an integer", opt, s);
    if (errno == ERANGE || v < lo || v > hi) {
        if (want) die("%s must be %s, not %s", opt, want, s);
        die("%s: %s is out of range [%lld, %lld]", opt, s, lo, hi);
    }
    return v;
}

/* OpenBLAS picks its kernels from the CPU model when it loads. A model newer than the library
 * falls back to an SSE3 "Prescott" kernel: on the project VM (family 6 model 207, OpenBLAS
 * 0.3.21) that makes the forward/backward/update 2.5x slower than the AVX-512 "SkylakeX"
 * kernels (docs/SWEEP.md, BLAS kernels). The core type can only be chosen before the library
 * loads, so when OpenBLAS settled for a pre-AVX2 kernel on a CPU with AVX2 (or AVX-512) and
 * the user did not set OPENBLAS_CORETYPE, this process re-runs itself with it set (before
 * MPI_Init, so the MPI launch is untouched). Sets *note to what was done, for the log. */
static void choose_blas_core(char **argv, const char **note)
{
    static const char *pre_avx2[] = { "prescott", "core2",  "penryn",     "dunnington", "nehalem", "sandybridge",
                                      "atom",     "katmai", "coppermine", "northwood",  "banias",  "unknown" };
    const char *core = openblas_get_corename(), *want = NULL;
    int old = 0;
    *note = getenv("GCOMP_TRAIN_BLAS_NOTE");
    if (getenv("OPENBLAS_CORETYPE") || !core) return;
    for (size_t i = 0; i < sizeof pre_avx2 / sizeof *pre_avx2; i++) old |= strcasecmp(core, pre_avx2[i]) == 0;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
        want = "SkylakeX";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        want = "Haswell";
#endif
    if (!old || !want) return;
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) return;
    self[len] = '\0'; /* the real path, so the process keeps its name in ps and perf */
    setenv("OPENBLAS_CORETYPE", want, 1);
    setenv("GCOMP_TRAIN_BLAS_NOTE", "OpenBLAS took this CPU for an older one; OPENBLAS_CORETYPE set by train", 1);
    execv(self, argv);
    *note = "OpenBLAS took this CPU for an older one and re-running with OPENBLAS_CORETYPE failed";
}

static void parse_options(int argc, char **argv, options *o)
{
    enum {
        O_MODEL = 256,
        O_CODEC,
        O_EF,
        O_MINB,
        O_BUCKET,
        O_EPOCHS,
        O_BATCH,
        O_LR,
        O_SCHED,
        O_MOM,
        O_WD,
        O_SEED,
        O_EVALS,
        O_DATA,
        O_JSON,
        O_QUIET,
        O_BLOCKING,
        O_MC,
        O_HELP
    };
    static const struct option longopts[] = { { "model", 1, 0, O_MODEL },
                                              { "codec", 1, 0, O_CODEC },
                                              { "ef", 1, 0, O_EF },
                                              { "min-bytes", 1, 0, O_MINB },
                                              { "bucket-bytes", 1, 0, O_BUCKET },
                                              { "epochs", 1, 0, O_EPOCHS },
                                              { "batch", 1, 0, O_BATCH },
                                              { "lr", 1, 0, O_LR },
                                              { "lr-schedule", 1, 0, O_SCHED },
                                              { "momentum", 1, 0, O_MOM },
                                              { "wd", 1, 0, O_WD },
                                              { "seed", 1, 0, O_SEED },
                                              { "evals-per-epoch", 1, 0, O_EVALS },
                                              { "data", 1, 0, O_DATA },
                                              { "json", 1, 0, O_JSON },
                                              { "quiet", 0, 0, O_QUIET },
                                              { "blocking", 0, 0, O_BLOCKING },
                                              { "momentum-correction", 0, 0, O_MC },
                                              { "help", 0, 0, O_HELP },
                                              { 0, 0, 0, 0 } };
    int c, li;
    char seen[sizeof longopts / sizeof *longopts] = { 0 };
    *o = (options){ .model = "mlp",
                    .codec = "none",
                    .data = TRAIN_DATA_DEFAULT_DIR,
                    .schedule = "cosine",
                    .ef = 1,
                    .batch = 128,
                    .evals_per_epoch = 1,
                    .epochs = 3,
                    .lr = 0.05,
                    .momentum = 0.9,
                    .seed = 1 };
    opterr = 0;
    while ((li = -1, c = getopt_long(argc, argv, "h", longopts, &li)) != -1) {
        const char *name = optind > 1 ? argv[optind - 1] : "";
        /* a flag's value given twice: getopt keeps the last, and a sweep's own setting or a
         * script's default would be overridden without a word */
        if (li >= 0 && longopts[li].has_arg && seen[li]++) die("--%s is given twice", longopts[li].name);
        switch (c) {
        case O_MODEL:
            o->model = optarg;
            break;
        case O_CODEC:
            o->codec = optarg;
            break;
        case O_EF:
            o->ef = (int)parse_int("--ef", optarg, 0, 1, "0 or 1");
            break;
        case O_MINB:
            o->min_bytes = parse_int("--min-bytes", optarg, 0, LLONG_MAX, NULL);
            break;
        case O_BUCKET:
            o->bucket_bytes = parse_int("--bucket-bytes", optarg, -1, LLONG_MAX,
                                        "-1 (the whole model), 0 (one key per tensor) or a byte count <= 2^63-1");
            break;
        case O_EPOCHS:
            o->epochs = parse_num("--epochs", optarg);
            break;
        case O_BATCH:
            o->batch = (int)parse_int("--batch", optarg, 1, INT_MAX, NULL);
            break;
        case O_LR:
            o->lr = parse_num("--lr", optarg);
            break;
        case O_SCHED:
            o->schedule = optarg;
            break;
        case O_MOM:
            o->momentum = parse_num("--momentum", optarg);
            break;
        case O_WD:
            o->wd = parse_num("--wd", optarg);
            break;
        case O_SEED:
            /* gcomp takes seeds in [0, INT64_MAX] (GCOMP_SEED) */
            o->seed = (unsigned long long)parse_int("--seed", optarg, 0, INT64_MAX, NULL);
            break;
        case O_EVALS:
            o->evals_per_epoch = (int)parse_int("--evals-per-epoch", optarg, 1, INT_MAX, NULL);
            break;
        case O_DATA:
            o->data = optarg;
            break;
        case O_JSON:
            o->json = optarg;
            break;
        case O_QUIET:
            o->quiet = 1;
            break;
        case O_BLOCKING:
            o->blocking = 1;
            break;
        case O_MC:
            o->momentum_correction = 1;
            break;
        case 'h':
        case O_HELP:
            usage(0);
            break;
        default:
            if (g_rank == 0) fprintf(stderr, "train: unknown option or missing value: %s\n", name);
            usage(2);
        }
    }
    if (optind < argc) die("unexpected argument '%s'", argv[optind]);
    if (strcmp(o->model, "mlp") && strcmp(o->model, "cnn")) die("--model must be mlp or cnn, not '%s'", o->model);
    if (!(o->epochs > 0)) die("--epochs must be > 0");
    if (o->batch < g_size) die("--batch must be at least the number of ranks");
    if (strcmp(o->schedule, "cosine") && strcmp(o->schedule, "const"))
        die("--lr-schedule must be cosine or const, not '%s'", o->schedule);
    /* parse_num has refused inf and nan already */
    if (!(o->lr > 0)) die("--lr must be > 0, not %g", o->lr);
    if (!(o->momentum >= 0 && o->momentum < 1)) die("--momentum must be in [0, 1), not %g", o->momentum);
    if (!(o->wd >= 0)) die("--wd must be >= 0, not %g", o->wd);
}

/* Steps per epoch (the last partial batch is dropped), steps of the run and steps between
 * evaluations, for a training set of n images; a batch the set cannot fill, or more epochs
 * than MAX_STEPS allows, is a usage error. */
static void plan_steps(const options *o, int n, long *spe, long *total, long *eval_every)
{
    if (o->batch > n)
        die("--batch %d is larger than the training set (%d images in %s): every step takes one global batch "
            "of %d images from it, split across the %d ranks",
            o->batch, n, o->data, o->batch, g_size);
    *spe = n / o->batch;
    double steps = o->epochs * (double)*spe;
    if (steps > (double)MAX_STEPS)
        die("--epochs %g is %.3g steps of %ld per epoch: more than the %ld a run may take", o->epochs, steps, *spe,
            MAX_STEPS);
    *total = (long)llround(steps);
    if (*total < 1) /* (a run of no step would still report a trained model) */
        die("--epochs %g is %.3g steps of %ld per epoch, which rounds to none: one step is %g epochs", o->epochs, steps,
            *spe, 1.0 / (double)*spe);
    *eval_every = *spe / o->evals_per_epoch;
    if (*eval_every < 1) *eval_every = 1;
}

/* Consecutive tensors fused until a bucket holds at least `bytes` (0: one per tensor). */
static int make_buckets(const train_model *m, long long bytes, bucket *b)
{
    int nb = 0, nt = train_model_ntensors(m);
    for (int i = 0; i < nt; i++) {
        const train_tensor *t = train_model_tensor(m, i);
        if (nb == 0 || bytes == 0 || (bytes > 0 && (long long)(b[nb - 1].count * sizeof(float)) >= bytes))
            b[nb++] = (bucket){ .off = t->off, .count = 0, .first = i };
        b[nb - 1].count += t->count;
        b[nb - 1].last = i;
    }
    return nb;
}

/* The permutation of epoch e: the same on every rank. */
static void shuffle(int *perm, int n, unsigned long long seed, long e)
{
    uint64_t s = seed ^ (0xA0761D6478BD642Full * (uint64_t)(e + 1));
    for (int i = 0; i < n; i++) perm[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(train_splitmix64(&s) % (uint64_t)(i + 1));
        int t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

static void check_gcomp(gcomp_result rc, const char *what)
{
    if (rc == GCOMP_SUCCESS) return;
    fprintf(stderr, "train: rank %d: %s: %s: %s\n", g_rank, what, gcomp_result_name(rc), gcomp_last_error());
    MPI_Abort(MPI_COMM_WORLD, 3);
}

static void step_comm_begin(step_comm *sc)
{
    for (int b = 0; b < sc->nb; b++) sc->left[b] = sc->b[b].last - sc->b[b].first + 1;
    sc->nready = 0;
}

/* A velocity below FLT_MIN is flushed to zero (see sgd_momentum_step). */
static float momentum_step(float vel, float g, float w, float mu, float wd)
{
    float v = mu * vel + g + wd * w;
    return fabsf(v) < FLT_MIN ? 0.0f : v;
}

/* --momentum-correction: key k's gradient becomes its local velocity, which is what the
 * allreduce then reduces. */
static void momentum_into_grad(step_comm *sc, const bucket *k)
{
    if (!sc->correct) return;
    for (size_t j = k->off; j < k->off + k->count; j++)
        sc->g[j] = sc->vel[j] = momentum_step(sc->vel[j], sc->g[j], sc->w[j], sc->mu, sc->wd);
}

/* train_grad_ready_fn: tensor t's gradient is final. When that completes its bucket, the
 * bucket's allreduce starts now (overlap) or is queued for after the backward pass. */
static void grad_ready(void *ctx, int t)
{
    step_comm *sc = ctx;
    int b = 0;
    while (b < sc->nb - 1 && t > sc->b[b].last) b++;
    if (--sc->left[b] > 0) return;
    sc->order[sc->nready++] = b;
    if (!sc->overlap) return;
    const bucket *k = &sc->b[b];
    momentum_into_grad(sc, k);
    check_gcomp(gcomp_iallreduce(sc->comm, sc->g + k->off, sc->g + k->off, k->count, GCOMP_F32, GCOMP_AVG,
                                 (uint64_t)b, NULL, &sc->req[b]),
                "gcomp_iallreduce");
}

/* After the backward pass: every bucket reduced, in the order they became ready (the same
 * calls, keys and order in both modes, so the same bits). */
static void step_comm_finish(step_comm *sc)
{
    if (sc->nready != sc->nb) {
        fprintf(stderr, "train: rank %d: %d of %d buckets got their gradients\n", g_rank, sc->nready, sc->nb);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    for (int i = 0; i < sc->nb; i++) {
        int b = sc->order[i];
        const bucket *k = &sc->b[b];
        if (sc->overlap) {
            check_gcomp(gcomp_wait(&sc->req[b]), "gcomp_wait");
            continue;
        }
        momentum_into_grad(sc, k);
        check_gcomp(gcomp_allreduce(sc->comm, sc->g + k->off, sc->g + k->off, k->count, GCOMP_F32, GCOMP_AVG,
                                        (uint64_t)b, NULL),
                        "gcomp_allreduce");
    }
}

/* FNV-1a over the parameter bits: equal on every rank iff the weights are identical. */
static uint64_t param_hash(const float *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n * sizeof(float); i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static void json_num(FILE *f, const char *key, double v, const char *sep)
{
    if (isfinite(v))
        fprintf(f, "\"%s\": %.10g%s", key, v, sep);
    else
        fprintf(f, "\"%s\": null%s", key, sep);
}

static void json_str(FILE *f, const char *key, const char *v, const char *sep)
{
    fprintf(f, "\"%s\": \"", key);
    for (; *v; v++) {
        if (*v == '"' || *v == '\\') fputc('\\', f);
        fputc(*v, f);
    }
    fprintf(f, "\"%s", sep);
}

/* --json: rank 0 opens the file before the training, so that a path it cannot write stops the
 * run at once (exit 2) instead of after it. NULL without --json and on the other ranks. */
static FILE *json_open(const char *path)
{
    FILE *f = NULL;
    int err = 0;
    if (!path) return NULL;
    if (g_rank == 0 && !(f = fopen(path, "w"))) err = errno;
    MPI_Bcast(&err, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (err) die("--json %s: cannot write: %s", path, strerror(err));
    return f;
}

/* 0, or 1 with a message when the file did not take all of it (a full disk, /dev/full): a
 * result that was not written must not look like a success. */
static int json_close(FILE *f, const char *path)
{
    int bad = fflush(f) != 0 || ferror(f), err = errno;
    if (fclose(f) != 0 && !bad) {
        bad = 1;
        err = errno;
    }
    if (bad) fprintf(stderr, "train: cannot write %s: %s\n", path, strerror(err));
    return bad;
}

/* SGD with momentum: vel = mu vel + g + wd w; w -= lr vel. A velocity below FLT_MIN is
 * flushed to zero: where gradients stop arriving (top-k leaves most elements at zero for many
 * steps, dead ReLU units always) vel decays by mu each step into subnormals, and x86 takes a
 * microcode assist for every subnormal operand: on the project VM, top-k runs spent 45 % of
 * their CPU time in this loop before the flush. A subnormal velocity moves no weight anyway
 * (lr vel is far below half an ulp of any weight that is not itself tiny). */
static void sgd_momentum_step(float *restrict w, float *restrict vel, const float *restrict g, size_t n, float lr,
                              float mu, float wd)
{
    for (size_t j = 0; j < n; j++) {
        float v = momentum_step(vel[j], g[j], w[j], mu, wd);
        vel[j] = v;
        w[j] -= lr * v;
    }
}

int main(int argc, char **argv)
{
    options o;
    train_set train, test;
    char err[1024];
    const char *blas_note;
    choose_blas_core(argv, &blas_note);
    /* gcomp's progress thread (the overlap) needs MPI_THREAD_MULTIPLE; with less the calls run
     * inside gcomp_wait, which the log says */
    int provided = MPI_THREAD_SINGLE;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    openblas_set_num_threads(1); /* one core per rank: ranks are the parallelism */
    parse_options(argc, argv, &o);

    int load_rc = train_set_load(o.data, "train", &train, err, sizeof err);
    if (load_rc == 0) load_rc = train_set_load(o.data, "t10k", &test, err, sizeof err);
    if (load_rc == 0 && (train.rows != 28 || train.cols != 28 || test.rows != 28 || test.cols != 28)) {
        snprintf(err, sizeof err, "%s: images are not 28x28", o.data);
        load_rc = -1;
    }
    if (load_rc) die("%s", err);
    long spe, total, eval_every;
    plan_steps(&o, train.n, &spe, &total, &eval_every);

    gcomp_config cfg = gcomp_config_default();
    cfg.codec = o.codec;
    cfg.min_bytes = o.min_bytes;
    cfg.error_feedback = o.ef;
    cfg.seed = (int64_t)o.seed;
    gcomp_comm *comm = NULL;
    gcomp_result rc = gcomp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &comm);
    /* name --codec only when the spec is what was refused (not a GCOMP_* variable's value) */
    if (rc == GCOMP_ERR_INVALID_SPEC) die("--codec '%s': %s", o.codec, gcomp_last_error());
    if (rc != GCOMP_SUCCESS) die("gcomp_comm_create_mpi: %s", gcomp_last_error());

    int local_lo = (int)((long long)o.batch * g_rank / g_size);
    int local_hi = (int)((long long)o.batch * (g_rank + 1) / g_size);
    int nloc = local_hi - local_lo;
    int eval_cap = 256;
    train_model *m = train_model_create(o.model, nloc > eval_cap ? nloc : eval_cap, o.seed);
    if (!m) die("out of memory creating the %s model", o.model);
    size_t np = train_model_nparams(m);
    float *w = train_model_params(m), *g = train_model_grads(m);
    float *vel = calloc(np, sizeof(float));
    float *xb = malloc((size_t)nloc * 784 * sizeof(float));
    uint8_t *yb = malloc((size_t)nloc);
    int *perm = malloc((size_t)train.n * sizeof(int));
    bucket buckets[MAX_BUCKETS];
    int nb = make_buckets(m, o.bucket_bytes, buckets);
    step_comm sc = { .comm = comm,
                     .g = g,
                     .w = w,
                     .vel = vel,
                     .mu = (float)o.momentum,
                     .wd = (float)o.wd,
                     .correct = o.momentum_correction,
                     .b = buckets,
                     .nb = nb,
                     .overlap = !o.blocking };
    const char *progress = provided >= MPI_THREAD_MULTIPLE ? "thread" : "caller";
    int nhist_cap = (int)(total / eval_every) + 2, nhist = 0;
    history *hist = calloc((size_t)nhist_cap, sizeof *hist);
    if (!vel || !xb || !yb || !perm || !hist) die("out of memory");
    FILE *jf = json_open(o.json); /* the last usage error: nothing after this leaves the file empty */

    if (g_rank == 0) {
        printf("# train: model %s (%zu parameters, %d tensors, %d gcomp keys), codec %s, ef %d, min_bytes %lld, "
               "%d ranks\n",
               o.model, np, train_model_ntensors(m), nb, gcomp_comm_codec(comm), o.ef, o.min_bytes, g_size);
        printf(
            "# batch %d (%d..%d per rank), lr %g (%s), momentum %g%s, wd %g, seed %llu, %.4g epochs = %ld steps of %ld "
            "per epoch\n",
            o.batch, o.batch / g_size, (o.batch + g_size - 1) / g_size, o.lr, o.schedule, o.momentum,
            o.momentum_correction ? " (momentum correction: velocities reduced)" : "", o.wd, o.seed,
            o.epochs, total, spe);
        printf("# BLAS: OpenBLAS, %s kernels%s%s%s\n", openblas_get_corename(), blas_note ? " (" : "",
               blas_note ? blas_note : "", blas_note ? ")" : "");
        printf("# allreduce: %s; gcomp progress: %s\n",
               o.blocking ? "blocking (gcomp_allreduce of every key after the backward pass)"
                          : "overlapped (each key's gcomp_iallreduce starts as its gradient is ready, waited before "
                            "the update)",
               provided >= MPI_THREAD_MULTIPLE
                   ? "progress thread (MPI_THREAD_MULTIPLE)"
                   : "inside gcomp_wait on the caller's thread (MPI gave less than MPI_THREAD_MULTIPLE: no overlap)");
        printf("# %6s %7s %8s %9s %9s %14s %14s %9s %9s\n", "epoch", "loss", "train%", "test%", "elapsed",
               "wire B/step", "raw B/step", "compute", "comm");
        fflush(stdout);
    }

    /* gradient of the local loss sum, times N/B: AVG over ranks is the global-batch mean */
    float grad_scale = (float)g_size / (float)o.batch;
    double t_compute = 0, t_comm = 0, t_train = 0, win_loss = 0, last_loss = NAN;
    long win_correct = 0, win_n = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    double t_start = now();
    for (long step = 0; step < total; step++) {
        long e = step / spe, s_in = step % spe;
        if (s_in == 0) shuffle(perm, train.n, o.seed, e);
        double t0 = now();
        for (int i = 0; i < nloc; i++) {
            int idx = perm[s_in * o.batch + local_lo + i];
            memcpy(xb + (size_t)i * 784, train.x + (size_t)idx * 784, 784 * sizeof(float));
            yb[i] = train.y[idx];
        }
        int ok;
        step_comm_begin(&sc);
        win_loss += train_model_step(m, xb, yb, nloc, grad_scale, &ok, grad_ready, &sc);
        win_correct += ok;
        win_n += nloc;
        double t1 = now(); /* comm from here is what the backward pass did not hide */
        step_comm_finish(&sc);
        double t2 = now();
        float lr = (float)o.lr;
        if (strcmp(o.schedule, "cosine") == 0)
            lr = (float)(o.lr * 0.5 * (1.0 + cos(M_PI * (double)step / (double)total)));
        float mu = (float)o.momentum, wd = (float)o.wd;
        if (o.momentum_correction)
            for (size_t j = 0; j < np; j++) w[j] -= lr * g[j]; /* g: the reduced velocity */
        else
            sgd_momentum_step(w, vel, g, np, lr, mu, wd);
        double t3 = now();
        t_compute += (t1 - t0) + (t3 - t2);
        t_comm += t2 - t1;
        t_train += t3 - t0;

        if ((step + 1) % eval_every != 0 && step + 1 != total) continue;
        /* evaluation: not counted in train time */
        double sums[5] = { win_loss, (double)win_correct, (double)win_n, 0, 0 }, tsum[2];
        int tlo = (int)((long long)test.n * g_rank / g_size), thi = (int)((long long)test.n * (g_rank + 1) / g_size);
        int tok;
        train_model_eval(m, test.x + (size_t)tlo * 784, test.y + tlo, thi - tlo, &sums[3], &tok);
        sums[4] = tok;
        MPI_Allreduce(MPI_IN_PLACE, sums, 5, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        gcomp_comm_stats st;
        check_gcomp(gcomp_comm_stats_get(comm, &st), "gcomp_comm_stats_get");
        tsum[0] = (double)st.wire_bytes;
        tsum[1] = t_train;
        MPI_Allreduce(MPI_IN_PLACE, tsum, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        history *h = &hist[nhist++];
        h->step = step + 1;
        h->epoch = (double)(step + 1) / (double)spe;
        h->train_time_s = tsum[1] / g_size;
        h->wall_s = now() - t_start;
        h->loss = sums[0] / sums[2];
        h->train_acc = 100.0 * sums[1] / sums[2];
        h->test_loss = sums[3] / test.n;
        h->test_acc = 100.0 * sums[4] / test.n;
        h->wire_bytes_per_step = tsum[0] / g_size / (double)(step + 1);
        last_loss = h->loss;
        if (g_rank == 0 && !o.quiet) {
            printf("  %6.3f %7.4f %8.2f %9.2f %8.1fs %14.0f %14.0f %8.1fs %8.1fs\n", h->epoch, h->loss, h->train_acc,
                   h->test_acc, h->wall_s, h->wire_bytes_per_step, (double)st.raw_bytes / (double)(step + 1), t_compute,
                   t_comm);
            fflush(stdout);
        }
        win_loss = 0;
        win_correct = win_n = 0;
        if (!isfinite(h->loss) && g_rank == 0)
            fprintf(stderr, "train: warning: loss is not finite at step %ld\n", step + 1);
    }

    /* final figures, averaged over ranks */
    gcomp_comm_stats st;
    check_gcomp(gcomp_comm_stats_get(comm, &st), "gcomp_comm_stats_get");
    double f[9] = { (double)st.wire_bytes,
                    (double)st.baseline_bytes,
                    t_train,
                    t_comm / (t_comm + t_compute),
                    st.encode_s,
                    st.comm_s,
                    st.decode_s,
                    (double)st.overflow_count,
                    st.agree_s };
    MPI_Allreduce(MPI_IN_PLACE, f, 9, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    f[8] /= g_size;
    for (int i = 0; i < 7; i++) f[i] /= g_size;
    uint64_t hsh = param_hash(w, np), hmin = hsh, hmax = hsh;
    MPI_Allreduce(MPI_IN_PLACE, &hmin, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &hmax, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    const history *fin = &hist[nhist - 1];
    double wire = f[0] / (double)total, raw = (double)st.raw_bytes / (double)total;
    double cr = f[0] > 0 ? f[1] / f[0] : NAN, step_time = f[2] / (double)total;
    int json_failed = 0;
    if (g_rank == 0) {
        printf(
            "# final: test %.2f%%, loss %.4f, wire %.0f B/step/rank, raw %.0f B/step, cr %.2f (vs uncompressed ring), "
            "%.2f ms/step, comm share %.1f%%, weights %s on all ranks\n",
            fin->test_acc, last_loss, wire, raw, cr, 1e3 * step_time, 100.0 * f[3],
            hmin == hmax ? "identical" : "DIFFERENT");
        if (hmin != hmax) fprintf(stderr, "train: warning: the weights differ between ranks\n");
        if (jf) {
            fprintf(jf, "{");
            json_str(jf, "spec", o.codec, ", ");
            json_str(jf, "codec", gcomp_comm_codec(comm), ", ");
            fprintf(jf, "\"ef\": %d, \"ranks\": %d, ", o.ef, g_size);
            json_str(jf, "allreduce", o.blocking ? "blocking" : "overlap", ", ");
            json_str(jf, "progress", progress, ", ");
            json_num(jf, "epochs", o.epochs, ", ");
            json_str(jf, "model", o.model, ", ");
            fprintf(jf, "\"batch\": %d, \"steps\": %ld, \"min_bytes\": %lld, \"bucket_bytes\": %lld, \"keys\": %d, ",
                    o.batch, total, o.min_bytes, o.bucket_bytes, nb);
            json_num(jf, "lr", o.lr, ", ");
            json_str(jf, "lr_schedule", o.schedule, ", ");
            json_str(jf, "blas_core", openblas_get_corename(), ", ");
            json_num(jf, "momentum", o.momentum, ", ");
            fprintf(jf, "\"momentum_correction\": %d, ", o.momentum_correction);
            json_num(jf, "wd", o.wd, ", ");
            fprintf(jf, "\"seed\": %llu, \"params\": %zu, ", o.seed, np);
            json_num(jf, "test_acc", fin->test_acc, ", ");
            json_num(jf, "test_loss", fin->test_loss, ", ");
            json_num(jf, "loss", last_loss, ", ");
            json_num(jf, "train_acc", fin->train_acc, ", ");
            json_num(jf, "wire_bytes_per_step", wire, ", ");
            json_num(jf, "raw_bytes_per_step", raw, ", ");
            json_num(jf, "baseline_bytes_per_step", f[1] / (double)total, ", ");
            json_num(jf, "cr", cr, ", ");
            json_num(jf, "step_time_s", step_time, ", ");
            json_num(jf, "comm_share", f[3], ", ");
            json_num(jf, "gcomp_encode_s_per_step", f[4] / (double)total, ", ");
            json_num(jf, "gcomp_comm_s_per_step", f[5] / (double)total, ", ");
            json_num(jf, "gcomp_decode_s_per_step", f[6] / (double)total, ", ");
            json_num(jf, "gcomp_agree_s_per_step", f[8] / (double)total, ", ");
            fprintf(jf, "\"overflow_count\": %.0f, \"weights_identical\": %s, ", f[7], hmin == hmax ? "true" : "false");
            fprintf(jf, "\"schedules\": [");
            for (int b = 0; b < nb; b++) {
                gcomp_comm_stats ks;
                check_gcomp(gcomp_comm_key_stats_get(comm, (uint64_t)b, &ks), "gcomp_comm_key_stats_get");
                fprintf(jf, "%s{\"key\": %d, \"tensors\": \"%s..%s\", \"elements\": %zu, \"schedule\": \"%s\"}",
                        b ? ", " : "", b, train_model_tensor(m, buckets[b].first)->name,
                        train_model_tensor(m, buckets[b].last)->name, buckets[b].count,
                        gcomp_schedule_name(ks.last_schedule));
            }
            fprintf(jf, "],\n \"history\": [");
            for (int i = 0; i < nhist; i++) {
                const history *h = &hist[i];
                fprintf(jf, "%s\n  {\"step\": %ld, ", i ? "," : "", h->step);
                json_num(jf, "epoch", h->epoch, ", ");
                json_num(jf, "train_time_s", h->train_time_s, ", ");
                json_num(jf, "wall_s", h->wall_s, ", ");
                json_num(jf, "loss", h->loss, ", ");
                json_num(jf, "train_acc", h->train_acc, ", ");
                json_num(jf, "test_acc", h->test_acc, ", ");
                json_num(jf, "test_loss", h->test_loss, ", ");
                json_num(jf, "wire_bytes_per_step", h->wire_bytes_per_step, "}");
            }
            fprintf(jf, "]}\n");
            json_failed = json_close(jf, o.json);
        }
    }

    gcomp_comm_destroy(comm);
    train_model_destroy(m);
    train_set_free(&train);
    train_set_free(&test);
    free(vel);
    free(xb);
    free(yb);
    free(perm);
    int exit_rc = isfinite(fin->test_acc) && hmin == hmax && !json_failed ? 0 : 1;
    free(hist);
    MPI_Finalize();
    return exit_rc;
}
