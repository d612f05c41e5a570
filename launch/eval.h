/* launch/eval.h — `fathom eval --checkpoint DIR [--weights ema|raw] [--data SPEC]
 *                 [--samples N] [--dump-logits OUT.h5]` (DESIGN 6).
 *
 * Loads the network and its config from a checkpoint (a step directory, or a run directory
 * whose latest committed step is used), evaluates the mean loss and perplexity over the
 * first N evaluation windows in file order (N: --samples, else eval.samples; at most the
 * windows there are), prints one line and, with --dump-logits, writes /tokens [N, T] uint32
 * and /logits [N, T, V] float32 to OUT.h5. Weights: ema (the default when the checkpoint
 * holds an EMA) or raw. Returns the exit code.
 */
#ifndef FATHOM_LAUNCH_EVAL_H
#define FATHOM_LAUNCH_EVAL_H

int eval_main(int argc, char **argv);

#endif
