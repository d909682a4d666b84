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
    vh_comm inner;       /* the backend's communicator */
    double bytes;        /* sent by this rank since the last reset */
    double wait_seconds; /* blocked in wait since the last reset */
    int64_t collectives;
} vh_comm_stats;

/* Replaces *comm by a counting layer over it; stats must outlive it. */
void comm_stats_install(vh_comm *comm, vh_comm_stats *stats);
/* Whether *comm is such a layer. */
int comm_stats_installed(const vh_comm *comm);
void comm_stats_reset(vh_comm_stats *stats);

#endif
