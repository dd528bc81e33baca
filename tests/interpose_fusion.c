/*
 * interpose_fusion.c — an unmodified MPI program that reduces like Horovod's fusion buffer,
 * for the interposer's error-feedback key (docs/INTERPOSE.md, "Horovod"). Run by
 * tests/interpose.sh under libgcomp_mpi.so; knows nothing of gcomp but the expectations it
 * prints for interpose.sh and the environment it reads to choose them.
 *
 * Each step is one coordination round, as a Horovod cycle: a few idle control rounds (an
 * MPI_BAND of a zero bit vector, MPI_LONG_LONG, in place), then the round's own MPI_BAND of
 * the bits saying which layout the fusion buffer gets, sometimes an MPI_Bcast of a small
 * message (Horovod's response list when something is not cached), and then:
 *   - the fusion buffer, reduced in place with MPI_FLOAT/MPI_SUM: tensors A and B packed as
 *     [A|B] or [B|A] (the same count either way: an address-and-count key cannot tell them
 *     apart), then unpacked;
 *   - tensor C in its own buffer, second in the round;
 *   - tensors D and E, each reduced out of place from its own send buffer into one scratch
 *     receive buffer (same count): the interposer must tell them apart by the send buffer.
 * A's and D's inputs are positive on every rank, B's and E's negative. Top-k (GCOMP_CODEC=topk:...) sends
 * each kept element as input + residual and keeps the rest as the residual, so a residual
 * has the sign of the inputs it came from, and as long as every residual is fed back into
 * its own tensor each element of the sum keeps its sign. An element of A that comes out
 * negative (or of B or C positive) carries another tensor's error: the program counts those.
 * (TernGrad's residual can take either sign, so this check is for top-k only.)
 *
 *   interpose_fusion [--steps N]
 *
 * With GCOMP_INTERPOSE_EF_KEY=sequence (the interposer keys residuals by the control calls
 * before each reduction) no element may change sign, every call keeps error feedback, and
 * the accumulated result of A must carry at least half of A's accumulated input (without
 * error feedback, GCOMP_EF=0, top-k at ratio 0.1 gives about a quarter). With the default
 * (buffer) key the same-count fusion buffer is not detected (no_ef stays 0) and signs DO
 * flip: the program fails if none does, since then the test could not tell the two apart.
 * D and E keep their signs under either key, and D carries at least half its input.
 * Without GCOMP_CODEC, or with a GCOMP_INTERPOSE_EF_KEY the interposer refuses, every call
 * passes through and the results are exact.
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_test_util.h" /* rank, size, CHECK and n_fail */

#define N_TENSOR 32768 /* floats per tensor: 128 KiB, each call above the 64 KiB threshold */



/* Deterministic inputs in [lo, hi), different per rank, step and tensor. */
static void fill(float *x, int n, float lo, float hi, unsigned seed)
{
    unsigned s = seed * 2654435761u + 12345u;
    for (int i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = lo + (hi - lo) * (float)(s >> 8) / 16777216.0f;
    }
}

static int control_and(MPI_Comm comm, long long bits)
{
    MPI_Allreduce(MPI_IN_PLACE, &bits, 1, MPI_LONG_LONG, MPI_BAND, comm);
    return (int)bits;
}

int main(int argc, char **argv)
{
    int steps = 120, passed = 0, flips = 0, scratch_flips = 0;
    const char *codec = getenv("GCOMP_CODEC"), *key = getenv("GCOMP_INTERPOSE_EF_KEY");
    int sequence = key && strcmp(key, "sequence") == 0;
    int bad_key = key && *key && !sequence && strcmp(key, "buffer") != 0;
    int lossy = codec && *codec && !bad_key;
    double in_a = 0, out_a = 0; /* accumulated: this rank's input of A x size, the result */
    double in_d = 0, out_d = 0; /* the same for D */
    float *a, *b, *c, *d, *e, *scratch, *fused, *ref;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = atoi(argv[++i]);
    a = malloc(N_TENSOR * sizeof *a);
    b = malloc(N_TENSOR * sizeof *b);
    c = malloc(N_TENSOR * sizeof *c);
    d = malloc(N_TENSOR * sizeof *d);
    e = malloc(N_TENSOR * sizeof *e);
    scratch = malloc(N_TENSOR * sizeof *scratch);
    fused = malloc(2 * N_TENSOR * sizeof *fused);
    ref = malloc(2 * N_TENSOR * sizeof *ref);
    if (!a || !b || !c || !d || !e || !scratch || !fused || !ref) MPI_Abort(MPI_COMM_WORLD, 2);

    for (int t = 0; t < steps; t++) {
        /* an irregular layout sequence, the same on every rank */
        int layout = (t * 7 + t / 5) % 3 == 0, idle = t % 3;
        float *first = layout ? b : a, *second = layout ? a : b;
        for (int i = 0; i < idle; i++, passed++) CHECK(control_and(MPI_COMM_WORLD, 0) == 0, "idle round");
        CHECK(control_and(MPI_COMM_WORLD, 1 + layout) == 1 + layout, "control round");
        passed += 1;
        if (t % 4 == 0) {
            char msg[16] = { 0 };
            if (rank == 0) snprintf(msg, sizeof msg, "layout %d", layout);
            MPI_Bcast(msg, (int)sizeof msg, MPI_BYTE, 0, MPI_COMM_WORLD);
        }
        fill(a, N_TENSOR, 1.0f, 2.0f, 3u * (unsigned)(t * size + rank));
        fill(b, N_TENSOR, -0.2f, -0.1f, 3u * (unsigned)(t * size + rank) + 1u);
        fill(c, N_TENSOR, 0.5f, 1.0f, 3u * (unsigned)(t * size + rank) + 2u);
        memcpy(fused, first, N_TENSOR * sizeof *fused);
        memcpy(fused + N_TENSOR, second, N_TENSOR * sizeof *fused);
        /* the exact sum, for the pass-through check (PMPI: never compressed) */
        PMPI_Allreduce(fused, ref, 2 * N_TENSOR, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        for (int i = 0; i < N_TENSOR; i++) in_a += (layout ? ref[N_TENSOR + i] : ref[i]);
        MPI_Allreduce(MPI_IN_PLACE, fused, 2 * N_TENSOR, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, c, N_TENSOR, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if (!lossy) CHECK(memcmp(fused, ref, 2 * N_TENSOR * sizeof *fused) == 0, "step %d: not exact", t);
        memcpy(first, fused, N_TENSOR * sizeof *fused);
        memcpy(second, fused + N_TENSOR, N_TENSOR * sizeof *fused);
        for (int i = 0; i < N_TENSOR; i++) {
            flips += (a[i] < 0) + (b[i] > 0) + (c[i] < 0);
            out_a += a[i];
        }
        /* D and E through one scratch receive buffer, out of place */
        fill(d, N_TENSOR, 1.0f, 2.0f, 5u * (unsigned)(t * size + rank) + 3u);
        fill(e, N_TENSOR, -0.2f, -0.1f, 5u * (unsigned)(t * size + rank) + 4u);
        PMPI_Allreduce(d, ref, N_TENSOR, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        for (int i = 0; i < N_TENSOR; i++) in_d += ref[i];
        MPI_Allreduce(d, scratch, N_TENSOR, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if (!lossy) CHECK(memcmp(scratch, ref, N_TENSOR * sizeof *ref) == 0, "step %d: D not exact", t);
        for (int i = 0; i < N_TENSOR; i++) {
            scratch_flips += scratch[i] < 0;
            out_d += scratch[i];
        }
        MPI_Allreduce(e, scratch, N_TENSOR, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        for (int i = 0; i < N_TENSOR; i++) scratch_flips += scratch[i] > 0;
    }

    if (lossy && strncmp(codec, "topk", 4) != 0) {
        if (rank == 0) fprintf(stderr, "interpose_fusion: GCOMP_CODEC must be top-k, got '%s'\n", codec);
        n_fail++;
    } else if (lossy && sequence) {
        CHECK(flips == 0, "%d elements carried another tensor's error (sign flipped)", flips);
        CHECK(out_a >= 0.5 * in_a, "A's result carries %.3f of its input: error feedback not working", out_a / in_a);
    } else if (lossy) {
        CHECK(flips > 0, "no element changed sign under the buffer key: the test cannot tell the keys apart");
    } else {
        CHECK(flips == 0, "%d elements changed sign without compression", flips);
    }
    CHECK(scratch_flips == 0, "%d elements of D and E (one scratch receive buffer) carried the other's error",
          scratch_flips);
    if (lossy)
        CHECK(out_d >= 0.5 * in_d, "D's result carries %.3f of its input: error feedback not working", out_d / in_d);
    printf("rank %d: %d steps, %d sign flips, A's result / input %.3f, D and E: %d sign flips, D's %.3f (%s key)\n",
           rank, steps, flips, in_a ? out_a / in_a : 0.0, scratch_flips, in_d ? out_d / in_d : 0.0,
           sequence ? "sequence" : "buffer");
    /* compressed: the fused buffer, C, D and E each step; passed: the control allreduces */
    printf("rank %d expects compressed=%d passed=%d no_ef=0\n", rank, lossy ? 4 * steps : 0,
           lossy ? passed : passed + 4 * steps);
    free(a), free(b), free(c), free(d), free(e), free(scratch), free(fused), free(ref);
    MPI_Finalize();
    return n_fail ? 1 : 0;
}
