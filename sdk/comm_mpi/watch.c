/* watch.c - a collective that does not finish names the ranks that are gone
 * (see watch.h).
 *
 * Why. A host that vanishes (its network down, the machine off) closes no
 * socket: the other ranks wait in their collective for as long as TCP keeps
 * a silent connection open (hours), and MPI has no timeout. So a wait polls
 * (MPI_Test) and, past VITHOST_COMM_TIMEOUT seconds, asks every other rank
 * for a sign of life on a communicator of its own: a rank that waits in a
 * collective answers (it polls too), a gone one does not. The ranks that do
 * not answer within the grace are named and the wait fails; the host then
 * ends the job (ops->abort). A rank busy outside MPI (writing a checkpoint)
 * for longer than timeout + grace would be named too: hence a default of
 * 600 s, as PyTorch's collective timeouts are minutes.
 */
#define _POSIX_C_SOURCE 200809L
#include "watch.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TAG_PING = 1, TAG_PONG = 2 };

void watch_open(mpi_watch *w, MPI_Comm world) {
    memset(w, 0, sizeof *w);
    w->comm = MPI_COMM_NULL;
    w->ping_in = MPI_REQUEST_NULL;
    w->timeout = 600.0;
    const char *env = getenv("VITHOST_COMM_TIMEOUT");
    if (env && *env) {
        char *end = NULL;
        double t = strtod(env, &end);
        if (end && *end == '\0' && t >= 0.0) w->timeout = t;
        else fprintf(stderr, "vithost: VITHOST_COMM_TIMEOUT='%s' is not a number of seconds "
                             ">= 0 (0: never); using %g\n", env, w->timeout);
    }
    /* without its own communicator the watch is off: waits are plain */
    if (w->timeout <= 0.0 || MPI_Comm_dup(world, &w->comm) != MPI_SUCCESS) {
        w->comm = MPI_COMM_NULL;
        return;
    }
    MPI_Comm_set_errhandler(w->comm, MPI_ERRORS_RETURN);
    MPI_Comm_size(w->comm, &w->world); /* from here close frees comm */
    MPI_Irecv(&w->ping_buf, 1, MPI_INT, MPI_ANY_SOURCE, TAG_PING, w->comm, &w->ping_in);
}

void watch_close(mpi_watch *w) {
    if (w->world == 0) return; /* never opened (zeroed), or off */
    if (w->ping_in != MPI_REQUEST_NULL) {
        MPI_Cancel(&w->ping_in);
        MPI_Wait(&w->ping_in, MPI_STATUS_IGNORE);
    }
    MPI_Comm_free(&w->comm);
}

/* Answers a ping that came in (any number of calls: one at a time). */
static void answer(mpi_watch *w) {
    int flag = 0;
    MPI_Status s;
    while (w->ping_in != MPI_REQUEST_NULL && MPI_Test(&w->ping_in, &flag, &s) == MPI_SUCCESS &&
           flag) {
        MPI_Request r;
        if (MPI_Isend(&w->ping_buf, 1, MPI_INT, s.MPI_SOURCE, TAG_PONG, w->comm, &r) ==
            MPI_SUCCESS)
            MPI_Request_free(&r);
        MPI_Irecv(&w->ping_buf, 1, MPI_INT, MPI_ANY_SOURCE, TAG_PING, w->comm, &w->ping_in);
    }
}

/* Pings every other rank and waits up to `grace` s for the answers (or for
 * *req to finish); the ranks that did not answer, in lost[] (-1 ended), and
 * whether *req finished meanwhile. */
static int probe(mpi_watch *w, int rank, MPI_Request *req, double grace, int *lost) {
    MPI_Request *pong = malloc((size_t)w->world * sizeof *pong);
    int *got = calloc((size_t)w->world, sizeof *got), one = 1, done = 0;
    if (!pong || !got) {
        free(pong);
        free(got);
        lost[0] = -1;
        return 0;
    }
    for (int r = 0; r < w->world; r++) {
        pong[r] = MPI_REQUEST_NULL;
        if (r == rank) continue;
        MPI_Request s;
        if (MPI_Isend(&one, 1, MPI_INT, r, TAG_PING, w->comm, &s) == MPI_SUCCESS)
            MPI_Request_free(&s);
        MPI_Irecv(&got[r], 1, MPI_INT, r, TAG_PONG, w->comm, &pong[r]);
    }
    for (double t0 = MPI_Wtime(); !done && MPI_Wtime() - t0 < grace; sched_yield()) {
        answer(w);
        int all = 1, flag = 0;
        for (int r = 0; r < w->world; r++) {
            if (pong[r] != MPI_REQUEST_NULL) MPI_Test(&pong[r], &flag, MPI_STATUS_IGNORE);
            all &= pong[r] == MPI_REQUEST_NULL;
        }
        if (all) break;
        if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) done = 0;
    }
    int n = 0;
    for (int r = 0; r < w->world; r++)
        if (pong[r] != MPI_REQUEST_NULL) {
            lost[n++] = r;
            MPI_Cancel(&pong[r]); /* a receive: completes here, got[] is not written later */
            MPI_Wait(&pong[r], MPI_STATUS_IGNORE);
        }
    lost[n] = -1;
    free(pong);
    free(got);
    return done;
}

/* "rank 2 of 4: ...; ranks 3, 4 do not answer" on stderr. */
static void report(const mpi_watch *w, int rank, double waited, const int *lost) {
    char names[512] = "";
    size_t at = 0;
    int n = 0;
    for (; lost[n] >= 0; n++)
        if (at < sizeof names)
            at += (size_t)snprintf(names + at, sizeof names - at, "%s%d", n ? ", " : "", lost[n]);
    fprintf(stderr,
            "vithost: MPI (rank %d of %d): a collective has waited %.0f s and rank%s %s %s not "
            "answered since: lost (a host, or its network, gone?); ending the job "
            "(VITHOST_COMM_TIMEOUT=%g s)\n",
            rank, w->world, waited, n == 1 ? "" : "s", names, n == 1 ? "has" : "have",
            w->timeout);
}

int watch_wait(mpi_watch *w, int rank, MPI_Request *req) {
    if (w->comm == MPI_COMM_NULL) return MPI_Wait(req, MPI_STATUS_IGNORE);
    double t0 = MPI_Wtime();
    for (;;) {
        int done = 0, rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS || done) return rc;
        answer(w);
        if (MPI_Wtime() - t0 < w->timeout) {
            sched_yield(); /* ranks may outnumber cores, as MPI_Wait yields */
            continue;
        }
        /* as long again, at most 30 s: the others may start waiting later */
        double grace = w->timeout < 30.0 ? w->timeout : 30.0;
        int *lost = malloc(((size_t)w->world + 1) * sizeof *lost);
        if (!lost) return MPI_Wait(req, MPI_STATUS_IGNORE);
        done = probe(w, rank, req, grace, lost);
        int none = lost[0] < 0;
        if (!done && !none) report(w, rank, MPI_Wtime() - t0, lost);
        free(lost);
        if (done) return MPI_SUCCESS;
        if (!none) return MPI_ERR_OTHER;
        t0 = MPI_Wtime(); /* every rank is alive: a slow collective, wait on */
    }
}
