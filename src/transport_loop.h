/*
 * transport_loop.h — the loopback transport (transport_loop.c): N ranks as threads of one
 * process, for fast tests of every schedule without mpirun. Internal; not installed.
 *
 * Usage: one thread creates a world of N ranks; each of N threads creates its communicator
 * with its rank (a collective call, like gcomp_comm_create_mpi), calls gcomp_allreduce and
 * destroys it; after joining every thread, the world is destroyed.
 */
#ifndef GCOMP_TRANSPORT_LOOP_H
#define GCOMP_TRANSPORT_LOOP_H

#include "gcomp.h"

typedef struct gcomp__loop_world gcomp__loop_world;
struct gcomp__transport;

gcomp_result gcomp__loop_world_create(int size, gcomp__loop_world **out);
/* Frees the world and any message never received. Call after every rank is done. */
void gcomp__loop_world_destroy(gcomp__loop_world *w);
/* The transport of one rank of the world (thread-safe; one per thread). */
gcomp_result gcomp__transport_loop_create(gcomp__loop_world *w, int rank, struct gcomp__transport **out);
/* Collectives the world's ranks have completed so far (allreduce_max_u64 and
 * allreduce_sum_f32, each counted once for all ranks), for tests that count a call's
 * collectives: read by a rank between two of its calls, it is exact (no later collective can
 * complete without that rank). */
uint64_t gcomp__loop_world_collectives(gcomp__loop_world *w);
/* A communicator over the world for this rank: collective over the world's ranks (a NULL out
 * on one rank fails on every rank, as gcomp_comm_create_mpi does). The ranks may create
 * communicators one after another over one world, each rank holding one at a time, in the
 * same order on every rank (the world counts each rank's collectives across them). */
gcomp_result gcomp__comm_create_loop(gcomp__loop_world *w, int rank, const gcomp_config *cfg, gcomp_comm **out);

#endif
