/*
 * test_transport_fault.c — the fault-injection decorator (src/transport_fault.c) over a
 * transport with the optional sized exchange: loopback ranks, each transport wrapped in the
 * staging decorator (host device ops: the emulated device path's transport, which has
 * start_sendrecv_sized), that wrapped in the fault decorator, as gcomp__comm_inject_fault
 * does to a communicator's transport (an NCCL one has the sized entry too).
 *
 *  - test_sized_forwarded: the decorator offers start_sendrecv_sized and forwards it to the
 *    inner transport as the inner one (it used to copy the inner's entry, which then ran with
 *    the decorator as its transport: a crash); 2 and 3 ranks exchange exact sizes around a
 *    ring, the stream the engine sets on the decorator reaches the inner transport, and the
 *    decorator shows the inner's data fields (rank, size, memory, device, ...).
 *  - test_sized_truncated: the armed fault cuts the next sized message by one byte; its
 *    receiver, which was promised the exact size, fails the exchange (GCOMP_ERR_TRANSPORT),
 *    the other ranks' exchanges are whole, and the fault fires once.
 *  - test_no_sized_entry: over a transport without the entry (the plain loopback transport)
 *    the decorator offers none either, and the unsized exchange still loses its byte.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "device.h"
#include "loop_world.h"
#include "test_util.h"
#include "transport.h"
#include "transport_staging.h"

#define MSG 64

typedef struct job {
    loop_rank at;        /* first: loop_run_world fills it */
    int truncating_rank; /* -1: no fault armed */
    gcomp_result rc[2];  /* finish of the first and the second exchange */
    size_t got[2];
    int data_ok[2];
    int stream_seen;
    int stacked; /* 1: staging under the fault decorator; 0: the loopback transport alone */
    int setup_ok, sized_entry, fields_ok;
} job;

static uint8_t pattern(int from, int round, size_t i) { return (uint8_t)(from * 31 + round * 7 + (int)i); }

/* One ring exchange of MSG bytes: send to the right, receive from the left. */
static void exchange(gcomp__transport *t, job *j, int round)
{
    int r = j->at.rank, n = j->at.size, right = (r + 1) % n, left = (r + n - 1) % n;
    uint8_t sb[MSG], rb[MSG + 8];
    size_t got = 0;
    gcomp_result rc;
    for (size_t i = 0; i < MSG; i++) sb[i] = pattern(r, round, i);
    memset(rb, 0, sizeof rb);
    if (t->start_sendrecv_sized)
        rc = t->start_sendrecv_sized(t, right, sb, MSG, left, rb, MSG);
    else
        rc = t->start_sendrecv(t, right, sb, MSG, left, rb, sizeof rb);
    if (rc == GCOMP_SUCCESS) rc = t->finish_sendrecv(t, &got, gcomp__now() + 30.0);
    j->rc[round] = rc;
    j->got[round] = got;
    j->data_ok[round] = 1;
    for (size_t i = 0; i < got && i < MSG; i++)
        if (rb[i] != pattern(left, round, i)) j->data_ok[round] = 0;
}

static void *run_rank(void *arg)
{
    job *j = arg;
    gcomp__transport *loop = NULL, *staged = NULL, *t = NULL;
    struct CUstream_st *const sentinel = (struct CUstream_st *)(uintptr_t)0x5eed0;
    /* no cmocka assert off the main thread: what the main thread checks is recorded */
    if (gcomp__transport_loop_create(j->at.w, j->at.rank, &loop) != GCOMP_SUCCESS) return NULL;
    if (j->stacked) {
        if (gcomp__transport_staging_wrap(loop, &gcomp__device_host, &staged) != GCOMP_SUCCESS) return NULL;
        staged->device = 3; /* data fields the decorator must show as the inner's */
        staged->no_byte_stages = "test: no byte stages";
        if (gcomp__transport_fault_wrap(staged, &t) != GCOMP_SUCCESS) return NULL; /* t owns staged */
        j->sized_entry = t->start_sendrecv_sized != NULL;
        j->fields_ok = t->rank == staged->rank && t->size == staged->size && t->mem == staged->mem && t->device == 3 &&
                       t->releases_buffers_on_timeout == staged->releases_buffers_on_timeout &&
                       t->threads_ok == staged->threads_ok && t->no_byte_stages == staged->no_byte_stages;
        /* the engine sets the call's stream on the transport it holds (host ops ignore it) */
        t->stream = sentinel;
    } else {
        if (gcomp__transport_fault_wrap(loop, &t) != GCOMP_SUCCESS) return NULL; /* t owns loop */
        j->sized_entry = t->start_sendrecv_sized != NULL;
        j->fields_ok = t->rank == j->at.rank && t->size == j->at.size && t->mem == GCOMP__MEM_HOST;
    }
    j->setup_ok = 1;
    if (j->at.rank == j->truncating_rank) gcomp__transport_fault_truncate_next(t);
    exchange(t, j, 0);
    if (staged) j->stream_seen = staged->stream == sentinel;
    exchange(t, j, 1);
    t->destroy(t);
    if (staged) loop->destroy(loop); /* the staging decorator does not own its inner transport */
    return NULL;
}

static void run(int n, int stacked, int truncating_rank, job *jobs)
{
    memset(jobs, 0, (size_t)n * sizeof *jobs);
    for (int r = 0; r < n; r++) {
        jobs[r].stacked = stacked;
        jobs[r].truncating_rank = truncating_rank;
    }
    loop_run_world(n, run_rank, jobs, sizeof *jobs);
    for (int r = 0; r < n; r++) {
        assert_true(jobs[r].setup_ok);
        assert_int_equal(jobs[r].sized_entry, stacked); /* offered exactly when the inner has it */
        assert_true(jobs[r].fields_ok);
    }
}

static void test_sized_forwarded(void **state)
{
    job jobs[3];
    (void)state;
    for (int n = 2; n <= 3; n++) {
        run(n, 1, -1, jobs);
        for (int r = 0; r < n; r++)
            for (int k = 0; k < 2; k++) {
                assert_int_equal(jobs[r].rc[k], GCOMP_SUCCESS);
                assert_int_equal(jobs[r].got[k], MSG);
                assert_true(jobs[r].data_ok[k]);
                assert_true(jobs[r].stream_seen);
            }
    }
}

static void test_sized_truncated(void **state)
{
    job jobs[3];
    (void)state;
    for (int n = 2; n <= 3; n++) {
        run(n, 1, 0, jobs); /* rank 0's first message to rank 1 loses its last byte */
        for (int r = 0; r < n; r++) {
            if (r == 1) {
                assert_int_equal(jobs[r].rc[0], GCOMP_ERR_TRANSPORT);
                assert_int_equal(jobs[r].got[0], MSG - 1);
            } else {
                assert_int_equal(jobs[r].rc[0], GCOMP_SUCCESS);
                assert_int_equal(jobs[r].got[0], MSG);
                assert_true(jobs[r].data_ok[0]);
            }
            /* the fault fired once: the next exchange is whole everywhere */
            assert_int_equal(jobs[r].rc[1], GCOMP_SUCCESS);
            assert_int_equal(jobs[r].got[1], MSG);
            assert_true(jobs[r].data_ok[1]);
        }
    }
}

static void test_no_sized_entry(void **state)
{
    job jobs[2];
    (void)state;
    run(2, 0, 0, jobs);
    assert_int_equal(jobs[1].rc[0], GCOMP_SUCCESS); /* unsized: the short message arrives as such */
    assert_int_equal(jobs[1].got[0], MSG - 1);
    assert_true(jobs[1].data_ok[0]);
    assert_int_equal(jobs[0].got[0], MSG);
    for (int r = 0; r < 2; r++) assert_int_equal(jobs[r].got[1], MSG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sized_forwarded),
        cmocka_unit_test(test_sized_truncated),
        cmocka_unit_test(test_no_sized_entry),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
