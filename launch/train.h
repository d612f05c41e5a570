/* launch/train.h — `fathom train CONFIG.yaml [--set key=value ...]` (DESIGN 1, 6).
 *
 * Reads and prints the config, restores the newest committed checkpoint of run_dir or
 * initialises the model from the seed, then runs the steps: microbatches through the
 * pipeline executor, AdamW + clipping + EMA, metrics and the console line every log.every
 * steps, evaluation every eval.every steps, a checkpoint every checkpoint.every steps and at
 * the end. SIGTERM and SIGUSR1 finish the step in flight, save, and exit 0.
 * Returns the process exit code.
 */
#ifndef FATHOM_LAUNCH_TRAIN_H
#define FATHOM_LAUNCH_TRAIN_H

int train_main(int argc, char **argv);

#endif
