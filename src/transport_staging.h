/*
 * transport_staging.h — the staging decorator (transport_staging.c): buffers of a device's
 * memory over a transport of host memory, through bounce buffers of page-locked host memory.
 * Internal; not installed.
 */
#ifndef GCOMP_TRANSPORT_STAGING_H
#define GCOMP_TRANSPORT_STAGING_H

#include "device.h"
#include "transport.h"

/* A transport of dev's memory (GCOMP__MEM_CUDA for the CUDA ops; the host's ops give a
 * GCOMP__MEM_HOST one that still copies through its bounce buffers, for tests) over inner,
 * a host-memory transport that it uses but does not own: the communicator owns both and
 * destroys the decorator first. Bounce buffers grow to the largest message and are kept. */
gcomp_result gcomp__transport_staging_wrap(gcomp__transport *inner, const gcomp__device_ops *dev,
                                           gcomp__transport **out);
/* Point the decorator at another inner transport (the communicator's fault hook wraps it). */
void gcomp__transport_staging_rebind(gcomp__transport *t, gcomp__transport *inner);
/* Bounce-buffer allocations so far (steady state adds none). */
uint64_t gcomp__transport_staging_allocs(const gcomp__transport *t);

#endif
