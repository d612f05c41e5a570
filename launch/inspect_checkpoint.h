/* launch/inspect_checkpoint.h — `fathom inspect DIR [--json]` (DESIGN 6).
 *
 * DIR is a run directory (its newest committed step), its checkpoints/ directory or a step
 * directory. Prints the step and counters, the layout that wrote it (pp, dp,
 * virtual_stages, layer split), a summary of the saved config (parameters, model and
 * residual keys), every tensor of every group present (/model, /ema, /optim/exp_avg,
 * /optim/exp_avg_sq) with its shape, dtype and L2 norm, and the integrity verdict: every
 * shard dataset of /integrity is read and its CRC32C compared. --json prints the same as one
 * JSON object instead. A corrupt, missing or unreadable shard dataset is named (file and
 * tensor), its tensor's norm is not read (null in JSON), and the exit code is 3; otherwise 0.
 */
#ifndef FATHOM_LAUNCH_INSPECT_CHECKPOINT_H
#define FATHOM_LAUNCH_INSPECT_CHECKPOINT_H

#include <stdbool.h>

int inspect_checkpoint_main(const char *dir, bool json);

#endif
