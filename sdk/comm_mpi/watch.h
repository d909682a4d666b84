/* watch.h - waits of the MPI backend that do not hang on a gone rank: past
 * VITHOST_COMM_TIMEOUT seconds (default 600, 0: never) a wait asks the other
 * ranks for a sign of life and fails naming those that give none (watch.c). */
#ifndef VH_COMM_MPI_WATCH_H
#define VH_COMM_MPI_WATCH_H

#include <mpi.h>

typedef struct mpi_watch {
    MPI_Comm comm;       /* pings and pongs; MPI_COMM_NULL: the watch is off */
    int world;
    double timeout;      /* seconds a wait runs before it asks */
    MPI_Request ping_in; /* the ping this rank answers next */
    int ping_buf;
} mpi_watch;

/* Reads VITHOST_COMM_TIMEOUT, duplicates `world` (a collective call). */
void watch_open(mpi_watch *w, MPI_Comm world);
void watch_close(mpi_watch *w);
/* MPI_Wait(req) that, past the timeout, names on stderr the ranks that do
 * not answer and returns MPI_ERR_OTHER. */
int watch_wait(mpi_watch *w, int rank, MPI_Request *req);

#endif
