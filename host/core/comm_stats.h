/* comm_stats.h - what the run's collectives cost: bytes and waiting.
 *
 * The host puts a counting layer between the plugins and the communicator
 * backend (run->comm). Every collective adds the bytes one rank sends with
 * the usual bandwidth-optimal (ring) algorithms, the figure the DDP and
 * FSDP papers use, whatever the backend really does:
 *
 *     all_reduce      2 (w-1)/w x n bytes   (reduce-scatter + all-gather)
 *     reduce_scatter  (w-1)/w x n bytes      n = the full input, w x count
 *     all_gather      (w-1)/w x n bytes      n = the full output, w x count
 *     broadcast       n bytes                (counted on every rank)
 *
 * and every wait adds the seconds it blocked. The train loop reads and
 * resets the totals per step. With one rank nothing is sent: zero. */
#ifndef VITHOST_HOST_COMM_STATS_H
#define VITHOST_HOST_COMM_STATS_H

#include <stdint.h>

#include "vithost/vh_comm.h"

typedef struct vh_comm_stats {
    vh_comm inner;       /* the backend's communicator, read at this host's size */
    vh_comm_ops inner_ops; /* its calls, read at this host's size (comm_upgrade) */
    vh_comm_ops ops;     /* the counting layer's: NULL where inner's optional call is */
    double bytes;        /* sent by this rank since the last reset */
    double wait_seconds; /* blocked in wait since the last reset */
    int64_t collectives;
} vh_comm_stats;

/* Which vh_comm_ops calls a backend must have (vh_comm.h says the same in
 * its @required / @optional marks; tests/test_abi_marks.c holds the two
 * together). */
typedef struct comm_op_mark {
    const char *name;
    size_t offset;
    int required;
} comm_op_mark;
extern const comm_op_mark comm_op_marks[];
extern const int comm_op_mark_count;

/* Reads a backend's communicator `src` (of any 2.x minor: its struct_size)
 * into *dst, and its ops table into *ops (also at any size), pointing
 * dst->ops at *ops; members a smaller (older) writer lacks are zero, so an
 * optional call it never had is NULL. VH_STATUS_ERR_COMM with the reason in
 * `why` when src is malformed or lacks a required call. */
vh_status comm_upgrade(vh_comm *dst, vh_comm_ops *ops, const vh_comm *src, char *why,
                       size_t why_len);

/* Replaces *comm by a counting layer over it; stats must outlive it. An
 * optional call *comm lacks stays NULL in the layer. */
void comm_stats_install(vh_comm *comm, vh_comm_stats *stats);
/* Whether *comm is such a layer. */
int comm_stats_installed(const vh_comm *comm);
void comm_stats_reset(vh_comm_stats *stats);

#endif
