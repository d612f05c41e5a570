/* tests/layout_support.h — one network trained on one rank and on other layouts (pipeline
 * stages, FSDP), held to each other (DESIGN 7: every layout gives the losses and weights of
 * the one-rank run, fp32, relative 1e-5).
 *
 * The runs use the 4-layer demo configs at d 32 for LAYOUT_STEPS steps of 8 sequences of
 * 32 tokens (4 microbatches of 2 on one rank), so a layout takes about a second on 2 cores.
 */
#ifndef FATHOM_TESTS_LAYOUT_SUPPORT_H
#define FATHOM_TESTS_LAYOUT_SUPPORT_H

#include <stddef.h>

#define LAYOUT_OUTPUT_CAPACITY (1 << 16)
#define LAYOUT_STEPS 5
#define LAYOUT_LR 3e-3 /* optim.lr of launch/configs/demo*.yaml */

/* the demo configs at a smaller width (see above), saving the last step */
extern const char *const LAYOUT_COMMON;

/* `fathom train launch/configs/<config>.yaml` + LAYOUT_COMMON + extra on `ranks` ranks;
 * the exit code, with the output in `output` (LAYOUT_OUTPUT_CAPACITY). */
int layout_train(int ranks, const char *config, const char *extra, const char *run_dir,
                 char *output);

/* A temporary root with two run directories, `single` and `layout`, and an output buffer. */
typedef struct {
    char root[256];
    char single[300], layout[300];
    char a[400], b[400];
    char *output;
} Runs;

void runs_begin(Runs *runs, const char *tag);
void runs_end(Runs *runs);

/* 0 when every /model tensor of the two runs' last checkpoints agrees to relative 1e-5:
 * the largest difference against the tensor's largest value, or against the learning rate
 * for a tensor smaller than it (tensors that start at zero and move by about lr a step).
 * Output of the comparison in `output`. */
int layout_weights_agree(const char *run_a, const char *run_b, char *output);

typedef struct {
    int ranks;
    const char *overrides;
} Layout;

/* Expects the LAYOUT_STEPS step losses of `run_dir` to be `single`'s, to relative 1e-5
 * (Criterion expectations naming `label`). */
void expect_step_losses_equal(const char *run_dir, const double *single, const char *label);

/* Trains `config` + `network` on one rank, then on each layout, and expects every layout's
 * losses (each step) and last weights to equal the one-rank run's (Criterion expectations). */
void expect_layouts_equal_single(const char *config, const char *network,
                                 const Layout *layouts, int n, const char *tag);
void expect_network_layout_equals_single(const char *config, const char *network, int ranks,
                                         const char *layout, const char *tag);
void expect_layout_equals_single(const char *config, int ranks, const char *extra,
                                 const char *tag);

#endif
