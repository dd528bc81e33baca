/*
 * loop_world.h — run a test function on N thread-ranks of a fresh loopback world
 * (src/transport_loop.h), for the tests that drive the engine without mpirun (test_loop.c,
 * test_nonblocking.c). Each rank's job struct starts with a loop_rank.
 */
#ifndef GCOMP_TEST_LOOP_WORLD_H
#define GCOMP_TEST_LOOP_WORLD_H

#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <setjmp.h>
#include <stdarg.h>
#include <cmocka.h>

#include "transport_loop.h"

#define LOOP_MAX_RANKS 128

typedef struct loop_rank {
    gcomp__loop_world *w;
    int rank, size;
} loop_rank;

/* fn(job of rank r) on n threads, jobs an array of n structs of `stride` bytes that each start
 * with a loop_rank (filled in here); returns when every rank is done and the world is freed. */
static inline void loop_run_world(int n, void *(*fn)(void *), void *jobs, size_t stride)
{
    pthread_t *th = calloc((size_t)n, sizeof *th);
    gcomp__loop_world *w = NULL;
    assert_true(n >= 1 && n <= LOOP_MAX_RANKS);
    assert_non_null(th);
    assert_int_equal(gcomp__loop_world_create(n, &w), GCOMP_SUCCESS);
    for (int r = 0; r < n; r++) {
        loop_rank *at = (loop_rank *)((char *)jobs + (size_t)r * stride);
        at->w = w;
        at->rank = r;
        at->size = n;
        assert_int_equal(pthread_create(&th[r], NULL, fn, at), 0);
    }
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
    free(th);
    gcomp__loop_world_destroy(w);
}

#endif
