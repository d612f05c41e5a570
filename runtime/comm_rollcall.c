/* runtime/comm_rollcall.c — who is still there, asked when a wait passes its deadline.
 *
 * A rank whose wait runs out cannot tell from the wait alone which rank is to blame: in a
 * collective every peer may be missing only because each waits for the one that died or
 * stopped. So before it ends the job, the rank asks every rank of the world to answer, on
 * a communicator of its own. Every rank answers from inside its own waits (comm_poll and
 * the collectives' exchanges poll the question too), so a live rank, blocked or not, says
 * so within milliseconds; a dead, stopped or hung rank says nothing. The ranks that stay
 * silent for ROLLCALL_GRACE seconds are named in the message (DESIGN 3: "naming the rank").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/comm_internal.h"
#include "runtime/error.h"

enum { ROLLCALL_ASK = 1, ROLLCALL_ANSWER = 2 };
/* How long a live rank has to answer: its waits poll every 50 us at most. */
#define ROLLCALL_GRACE 2.0

static MPI_Comm rollcall = MPI_COMM_NULL;

void comm_rollcall_init(void)
{
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &rollcall));
}

void comm_rollcall_free(void)
{
    if (rollcall != MPI_COMM_NULL)
        MPI_CHECK(MPI_Comm_free(&rollcall));
}

void comm_rollcall_answer(void)
{
    if (rollcall == MPI_COMM_NULL)
        return;
    for (;;) {
        int pending = 0;
        MPI_Status status;
        MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, ROLLCALL_ASK, rollcall, &pending, &status));
        if (!pending)
            return;
        int question = 0;
        MPI_CHECK(MPI_Recv(&question, 1, MPI_INT, status.MPI_SOURCE, ROLLCALL_ASK, rollcall,
                           MPI_STATUS_IGNORE));
        static int answer = 1;
        MPI_Request request;
        MPI_CHECK(MPI_Isend(&answer, 1, MPI_INT, status.MPI_SOURCE, ROLLCALL_ANSWER, rollcall,
                            &request));
        MPI_CHECK(MPI_Request_free(&request));
    }
}

void comm_rollcall_silent(char *text, size_t capacity)
{
    snprintf(text, capacity, "(no roll call: one process)");
    if (rollcall == MPI_COMM_NULL)
        return;
    int me, n;
    MPI_CHECK(MPI_Comm_rank(rollcall, &me));
    MPI_CHECK(MPI_Comm_size(rollcall, &n));
    MPI_Request *asks = xcalloc((size_t)n, sizeof *asks);
    MPI_Request *answers = xcalloc((size_t)n, sizeof *answers);
    int *replies = xcalloc((size_t)n, sizeof *replies);
    /* per rank: 0 waiting, 1 answered, -1 failed (MPI reports the peer gone) */
    int *state = xcalloc((size_t)n, sizeof *state);
    static int question = 1;
    for (int r = 0; r < n; r++) {
        asks[r] = answers[r] = MPI_REQUEST_NULL;
        if (r == me)
            continue;
        MPI_CHECK(MPI_Irecv(&replies[r], 1, MPI_INT, r, ROLLCALL_ANSWER, rollcall, &answers[r]));
        MPI_CHECK(MPI_Isend(&question, 1, MPI_INT, r, ROLLCALL_ASK, rollcall, &asks[r]));
    }
    state[me] = 1;
    const double deadline = comm_now_seconds() + ROLLCALL_GRACE;
    for (int waiting = n - 1; waiting > 0 && comm_now_seconds() < deadline;) {
        comm_rollcall_answer(); /* others may be asking at the same moment */
        for (int r = 0; r < n; r++) {
            if (state[r] != 0)
                continue;
            int flag = 0;
            /* not MPI_CHECK: an error here means the peer is gone, which is the answer */
            if (MPI_Test(&answers[r], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS)
                state[r] = -1, waiting--;
            else if (flag)
                state[r] = 1, waiting--;
        }
        const struct timespec pause = {.tv_sec = 0, .tv_nsec = 100000};
        nanosleep(&pause, NULL);
    }
    char ranks[256] = "";
    size_t used = 0;
    int silent = 0;
    for (int r = 0; r < n && used < sizeof ranks; r++) {
        if (state[r] == 1)
            continue;
        used += (size_t)snprintf(ranks + used, sizeof ranks - used, "%s%d",
                                 silent++ ? ", " : "", r);
    }
    if (silent == 0)
        snprintf(text, capacity, "every rank answers a roll call (one is computing for longer "
                 "than the deadline, or the ranks disagree on the order of operations)");
    else
        snprintf(text, capacity, "rank%s %s %s not answer a roll call within %g s (dead, "
                 "stopped or hung)", silent == 1 ? "" : "s", ranks,
                 silent == 1 ? "does" : "do", ROLLCALL_GRACE);
    /* the job ends next: the requests still open die with it */
    free(asks);
    free(answers);
    free(replies);
    free(state);
}
