/* launch/inspect.h — `fathom inspect --comm RUN_DIR` and `fathom inspect DIR` (DESIGN 6).
 *
 * Per pipeline stage, the bytes the stage's hops moved in the run's last logged step
 * (RUN_DIR/metrics.jsonl's `comm`, summed over the stage's dp ranks): all it sent, its
 * block summaries with the cross-stage cache and what they would be without it, each beside
 * the prediction of pipeline/payload.h from the run's config (RUN_DIR/config.yaml, which
 * `fathom train` writes). Exit 0 when every value equals its prediction, 3 otherwise or when
 * the files are missing. `fathom inspect DIR [--json]` (a checkpoint's tensors, layout and
 * integrity) is launch/inspect_checkpoint.h.
 */
#ifndef FATHOM_LAUNCH_INSPECT_H
#define FATHOM_LAUNCH_INSPECT_H

int inspect_main(int argc, char **argv);

#endif
