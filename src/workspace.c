/*
 * workspace.c — the per-(communicator, device) scratch block (workspace.h).
 */
#include "workspace.h"

void gcomp__ws_begin(gcomp__workspace *ws, int sizing)
{
    ws->used = 0;
    ws->sizing = sizing;
    ws->overrun = NULL;
}

void *gcomp__ws_take(gcomp__workspace *ws, size_t bytes, const char *name)
{
    size_t at = ws->used;
    size_t rounded = (bytes + GCOMP_WS_ALIGN - 1) & ~(size_t)(GCOMP_WS_ALIGN - 1);
    /* a size past SIZE_MAX saturates, so the fit fails instead of wrapping */
    ws->used = rounded < bytes || at > SIZE_MAX - rounded ? SIZE_MAX : at + rounded;
    if (ws->sizing) return NULL;
    if (ws->used > ws->cap) {
        if (!ws->overrun) ws->overrun = name;
        return NULL;
    }
    return ws->base + at;
}

/* A new block of at least `need` bytes (half again the old one when that is more, so a
 * slowly growing tensor does not reallocate per call); the old block is kept on failure. */
static gcomp_result grow(gcomp__workspace *ws, size_t need)
{
    size_t want = ws->cap + ws->cap / 2 > need ? ws->cap + ws->cap / 2 : need;
    void *p = NULL;
    if (ws->dev->alloc(want, &p) != GCOMP_SUCCESS) {
        want = need;
        GCOMP_CHECK(ws->dev->alloc(want, &p));
    }
    gcomp__debug("workspace (%s): %zu -> %zu bytes", ws->dev->name, ws->cap, want);
    ws->dev->free(ws->base);
    ws->base = p;
    ws->cap = want;
    ws->allocs++;
    return GCOMP_SUCCESS;
}

gcomp_result gcomp__ws_fit(gcomp__workspace *ws)
{
    if (ws->fail_next) {
        ws->fail_next = 0;
        return gcomp__fail(GCOMP_ERR_NOMEM, "workspace: out of memory (injected allocation failure, a test hook)");
    }
    if (ws->used == SIZE_MAX) return gcomp__fail(GCOMP_ERR_NOMEM, "workspace: the call needs more than SIZE_MAX bytes");
    if (ws->used <= ws->cap) return GCOMP_SUCCESS;
    if (!ws->dev) ws->dev = &gcomp__device_host;
    return grow(ws, ws->used);
}

gcomp_result gcomp__ws_check(const gcomp__workspace *ws)
{
    if (ws->used > ws->cap)
        return gcomp__fail(GCOMP_ERR_INTERNAL,
                           "workspace: the run's layout takes %zu bytes, the plan reserved %zu "
                           "(first region past the end: %s)",
                           ws->used, ws->cap, ws->overrun ? ws->overrun : "?");
    return GCOMP_SUCCESS;
}

void gcomp__ws_free(gcomp__workspace *ws)
{
    if (!ws || !ws->base) return;
    ws->dev->free(ws->base);
    ws->base = NULL;
    ws->cap = 0;
}
