/* runtime/fault.h — a fault-injection switch for the tests of the failure paths (DESIGN 3:
 * a dead or hung rank ends the job with exit 5; a non-finite step is skipped everywhere).
 *
 * Off unless the environment sets FATHOM_FAULT, a comma-separated list of key=value:
 *   rank=R      the world rank that misbehaves (required)
 *   step=S      the training step, counted from 1 (required)
 *   kind=K      nan   its gradients become NaN after the step's backward;
 *               exit  the process kills itself (SIGKILL) after the step's backward;
 *               stop  the process stops itself (SIGSTOP) there: a rank that no longer
 *                     answers, as a hung node would
 *   during=save exit and stop happen instead halfway through the rank's writing of the
 *               checkpoint of step S (the save's fault, not the step's)
 *   during=hop  exit and stop happen instead at the rank's first pipeline hop send of step
 *               S, so that its neighbour waits for a hop, mid-step
 * e.g. FATHOM_FAULT=rank=1,step=3,kind=stop. A malformed value is a usage error (exit 2)
 * naming the variable. Documented for users in docs/reference.md.
 */
#ifndef FATHOM_RUNTIME_FAULT_H
#define FATHOM_RUNTIME_FAULT_H

#include <stdbool.h>

typedef enum { FAULT_NONE, FAULT_NAN, FAULT_EXIT, FAULT_STOP } FaultKind;

/* Reads FATHOM_FAULT for this world rank; call once before the first step. */
void fault_init(int world_rank);
/* The fault due on this rank at `step` (FAULT_NONE almost always). exit and stop happen
 * inside this call; nan is returned for the caller to apply. */
FaultKind fault_at(int step);
/* Called by a save as it writes: done of total tensors of the step's checkpoint written. */
void fault_save_progress(int step, int done, int total);
/* The step that starts now (for during=hop), and the pipeline executor's hook before each
 * hop send. */
void fault_step_begin(int step);
void fault_hop_send(void);

#endif
