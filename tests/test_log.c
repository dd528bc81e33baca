/*
 * test_log.c — gcomp's stderr lines (src/errors.c): each is "gcomp: " + message + newline,
 * whole, also when threads log at once (loopback ranks, the progress thread). The prefix,
 * message and newline used to be written by three stdio calls, which interleaved into
 * "gcomp: gcomp: <line><line>".
 *
 *  - test_concurrent_lines: 8 threads each log 2000 lines through gcomp__log and 200
 *    failures through gcomp__fail (GCOMP_DEBUG=1) into a file standing in for stderr:
 *    every line is exactly one of the messages, each once.
 *  - test_long_line: a message longer than the line buffer is cut with "..." and still
 *    ends in one newline.
 *  - test_queued_failure_logged_once: a call that fails on the thread that ran it (the
 *    progress thread, or a caller running the queue) is logged once, not again when its
 *    gcomp_wait or queued gcomp_allreduce hands the error to the caller (2 loopback ranks).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"
#include "internal.h"
#include "comm.h"
#include "loop_world.h"

#define THREADS 8
#define LINES 2000
#define FAILS 200

static void *logger(void *arg)
{
    int t = (int)(size_t)arg;
    for (int i = 0; i < LINES; i++) {
        gcomp__log("thread %d line %d", t, i);
        if (i % (LINES / FAILS) == 0) gcomp__fail(GCOMP_ERR_INVALID_ARG, "thread %d fail %d", t, i);
    }
    return NULL;
}

/* Run fn with stderr going to a fresh temporary file; returns that file, rewound. */
static FILE *capture_stderr(void (*fn)(void))
{
    FILE *f = tmpfile();
    int saved;
    assert_non_null(f);
    fflush(stderr);
    saved = dup(2);
    assert_true(saved >= 0);
    assert_true(dup2(fileno(f), 2) >= 0);
    fn();
    fflush(stderr);
    assert_true(dup2(saved, 2) >= 0);
    close(saved);
    rewind(f);
    return f;
}

static void run_loggers(void)
{
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++) assert_int_equal(pthread_create(&th[t], NULL, logger, (void *)(size_t)t), 0);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
}

static void test_concurrent_lines(void **state)
{
    static unsigned char seen_log[THREADS][LINES], seen_fail[THREADS][LINES];
    char line[4096];
    size_t lines = 0;
    FILE *f;
    (void)state;
    setenv("GCOMP_DEBUG", "1", 1); /* read once, at the first gcomp__debug_enabled */
    assert_int_equal(gcomp__debug_enabled(), 1);
    f = capture_stderr(run_loggers);
    while (fgets(line, sizeof line, f)) {
        int t = -1, i = -1, end = 0;
        size_t len = strlen(line);
        lines++;
        if (len == 0 || line[len - 1] != '\n') fail_msg("line without its newline: '%s'", line);
        if (sscanf(line, "gcomp: thread %d line %d\n%n", &t, &i, &end) == 2 && (size_t)end == len && t >= 0 &&
            t < THREADS && i >= 0 && i < LINES) {
            assert_int_equal(seen_log[t][i]++, 0);
        } else if (sscanf(line, "gcomp: GCOMP_ERR_INVALID_ARG: thread %d fail %d\n%n", &t, &i, &end) == 2 &&
                   (size_t)end == len && t >= 0 && t < THREADS && i >= 0 && i < LINES) {
            assert_int_equal(seen_fail[t][i]++, 0);
        } else {
            fail_msg("a line that is no one message: '%s'", line);
        }
    }
    fclose(f);
    assert_int_equal(lines, (size_t)THREADS * (LINES + FAILS));
    for (int t = 0; t < THREADS; t++)
        for (int i = 0; i < LINES; i++) {
            assert_int_equal(seen_log[t][i], 1);
            assert_int_equal(seen_fail[t][i], i % (LINES / FAILS) == 0);
        }
}

static char long_msg[3000];

static void log_long(void) { gcomp__log("%s", long_msg); }

static void test_long_line(void **state)
{
    char line[4096];
    size_t len;
    FILE *f;
    (void)state;
    memset(long_msg, 'x', sizeof long_msg - 1);
    f = capture_stderr(log_long);
    assert_non_null(fgets(line, sizeof line, f));
    len = strlen(line);
    assert_true(len > 900 && len < 1024);
    assert_memory_equal(line, "gcomp: xxx", 10);
    assert_memory_equal(line + len - 4, "...\n", 4);
    assert_null(fgets(line, sizeof line, f)); /* one line */
    fclose(f);
}

typedef struct bad_op_job {
    loop_rank at; /* first: loop_run_world fills it */
    gcomp_result rc[2];
} bad_op_job;

#define BAD_OP_RANKS 2

/* Each rank: an iallreduce with an invalid op, completed by gcomp_wait; then a blocking
 * gcomp_allreduce with an invalid op issued while another request is in flight (queued
 * behind it unless that one is already done). */
static void *bad_op_rank(void *arg)
{
    bad_op_job *j = arg;
    gcomp_config cfg = gcomp_config_default();
    gcomp_comm *comm = NULL;
    gcomp_request *req = NULL;
    float x[64] = { 0 }, y[64];
    cfg.codec = "fp16";
    cfg.min_bytes = 0;
    cfg.timeout_ms = 20000;
    j->rc[0] = j->rc[1] = GCOMP_ERR_INTERNAL;
    if (gcomp__comm_create_loop(j->at.w, j->at.rank, &cfg, &comm) != GCOMP_SUCCESS) return NULL;
    if (gcomp_iallreduce(comm, x, y, 64, GCOMP_F32, GCOMP_OP_COUNT, 1, NULL, &req) == GCOMP_SUCCESS)
        j->rc[0] = gcomp_wait(&req);
    if (gcomp_iallreduce(comm, x, y, 64, GCOMP_F32, GCOMP_SUM, 2, NULL, &req) == GCOMP_SUCCESS) {
        j->rc[1] = gcomp_allreduce(comm, x, x, 64, GCOMP_F32, GCOMP_OP_COUNT, 3, NULL);
        if (gcomp_wait(&req) != GCOMP_SUCCESS) j->rc[1] = GCOMP_ERR_INTERNAL;
    }
    gcomp_comm_destroy(comm);
    return NULL;
}

static bad_op_job bad_op_jobs[BAD_OP_RANKS];

static void run_bad_op_world(void) { loop_run_world(BAD_OP_RANKS, bad_op_rank, bad_op_jobs, sizeof bad_op_jobs[0]); }

static void test_queued_failure_logged_once(void **state)
{
    char line[4096];
    size_t failures = 0;
    FILE *f;
    (void)state;
    setenv("GCOMP_DEBUG", "1", 1);
    assert_int_equal(gcomp__debug_enabled(), 1);
    f = capture_stderr(run_bad_op_world);
    while (fgets(line, sizeof line, f))
        if (strstr(line, "GCOMP_ERR_INVALID_ARG") && strstr(line, "invalid op")) failures++;
    fclose(f);
    for (int r = 0; r < BAD_OP_RANKS; r++)
        for (int i = 0; i < 2; i++)
            if (bad_op_jobs[r].rc[i] != GCOMP_ERR_INVALID_ARG)
                fail_msg("rank %d call %d: %s", r, i, gcomp_result_name(bad_op_jobs[r].rc[i]));
    /* one line per rank and failed call (each rank's own refusal); the wait used to log it again */
    assert_int_equal(failures, (size_t)BAD_OP_RANKS * 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent_lines),
        cmocka_unit_test(test_long_line),
        cmocka_unit_test(test_queued_failure_logged_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
