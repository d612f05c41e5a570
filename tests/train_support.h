/* tests/train_support.h — helpers for the tests that run `fathom train` end to end. */
#ifndef FATHOM_TESTS_TRAIN_SUPPORT_H
#define FATHOM_TESTS_TRAIN_SUPPORT_H

#include <stddef.h>

/* Writes a tiny-model config (d 64, 2 layers, seq 32, 8 sequences a step, synthetic data)
 * with run_dir = <directory>/run and `extra` YAML appended, to <directory>/config.yaml. */
void tiny_config_write(const char *directory, const char *extra);

/* Runs `fathom train <directory>/config.yaml <arguments>`; returns the exit code and
 * captures the output. */
int tiny_train(const char *directory, const char *arguments, char *output, size_t capacity);

/* Reads up to `capacity` "loss" values of metrics.jsonl step lines (eval lines skipped);
 * returns how many. */
int metrics_read_losses(const char *run_dir, double *losses, int *steps, int capacity);

/* Reads up to `capacity` "val_loss" values of metrics.jsonl evaluation lines, with their
 * steps; returns how many. */
int metrics_read_val_losses(const char *run_dir, double *losses, int *steps, int capacity);

/* 1 when every tensor of every group of two committed step directories is bitwise equal. */
int checkpoints_bitwise_equal(const char *step_dir_a, const char *step_dir_b);

/* The runs under <a>/run and <b>/run logged 6 equal losses and wrote bitwise equal step-6
 * checkpoints. */
void train_expect_six_equal_steps(const char *a, const char *b);

/* Trains `straight` 6 steps, and `resumed` from a copy of straight's step-3 checkpoint (as
 * if it died after step 3), both with `arguments`; asserts equal losses and bitwise equal
 * step-6 checkpoints. The caller makes and removes both directories. */
void train_expect_resume_equals_straight(const char *straight, const char *resumed,
                                         const char *arguments);

#endif
