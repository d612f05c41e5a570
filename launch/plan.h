/* launch/plan.h — `fathom plan CONFIG.yaml [--set key=value ...] [--gpu-memory GIB]`
 * (docs/reference.md).
 *
 * Prints, for every pipeline stage of the config's job, the memory plan each of its ranks
 * will hold (launch/memory_plan.h: parameters, gradients, compute copy, optimizer,
 * activations, host), from the config alone: no MPI, no GPU, nothing allocated, at any
 * parallel.pp x parallel.dp. With --gpu-memory, says whether each stage fits a GPU of that
 * many GiB as `fathom train` would check it, naming the keys that shrink it where it does
 * not; exit 2 then. Exit 0 otherwise.
 */
#ifndef FATHOM_LAUNCH_PLAN_H
#define FATHOM_LAUNCH_PLAN_H

int plan_main(int argc, char **argv);

#endif
