/*
 * workspace.h — one scratch block per (communicator, device), carved into named regions
 * by each call's plan (workspace.c). Memory comes from the device ops, so the same code
 * carves host or device memory.
 *
 * A call lays out its regions twice with the same sequence of gcomp__ws_take calls: once
 * sizing (before the ranks agree to run, so a failed allocation becomes an error on every
 * rank), then gcomp__ws_fit grows the block when the call needs more than it holds (never
 * in steady state), once carving (the run, which allocates nothing). Like zstd's cwksp.
 */
#ifndef GCOMP_WORKSPACE_H
#define GCOMP_WORKSPACE_H

#include "device.h"

#define GCOMP_WS_ALIGN 64 /* every region starts on a cache line */

typedef struct gcomp__workspace {
    const gcomp__device_ops *dev; /* where the block lives (set once, at the first fit) */
    uint8_t *base;
    size_t cap;
    size_t used;         /* bytes taken by the layout in progress */
    int sizing;          /* 1: take only counts; 0: take carves base */
    int fail_next;       /* test hook (gcomp__comm_inject_fault): the next fit fails as out of memory */
    const char *overrun; /* the first region a carving layout could not fit (a bug: see check) */
    uint64_t allocs;     /* blocks allocated so far: steady state adds none (tests check it) */
} gcomp__workspace;

/* Start a layout: sizing (regions are NULL, only their sizes add up) or carving. */
void gcomp__ws_begin(gcomp__workspace *ws, int sizing);
/* The next region of `bytes` bytes (GCOMP_WS_ALIGN-aligned); NULL while sizing. name says
 * what it holds (in the message when a carve overruns the block, a bug). */
void *gcomp__ws_take(gcomp__workspace *ws, size_t bytes, const char *name);
/* After a sizing layout: grow the block to hold it (dropping the old contents). */
gcomp_result gcomp__ws_fit(gcomp__workspace *ws);
/* After a carving layout: GCOMP_ERR_INTERNAL when it took more than the sizing did. */
gcomp_result gcomp__ws_check(const gcomp__workspace *ws);
/* Give the block back to its device (NULL-safe). */
void gcomp__ws_free(gcomp__workspace *ws);

#endif
