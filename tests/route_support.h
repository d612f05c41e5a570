/* tests/route_support.h — tiny routed models for the attention-over-depth tests.
 *
 * One small network (V 32, d 16, 2 layers, 2 query heads of 8, 1 KV head, ffn 24) with any
 * residual, parameters set by name from the host, and random routing weights drawn the way
 * tests/reference/make_routing_fixtures.py draws them (so every routing gradient matters).
 * Everything runs on the cpu backend.
 */
#ifndef FATHOM_TESTS_ROUTE_SUPPORT_H
#define FATHOM_TESTS_ROUTE_SUPPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"
#include "runtime/config.h"

enum { ROUTE_TEST_B = 2, ROUTE_TEST_T = 6, ROUTE_TEST_ROWS = ROUTE_TEST_B * ROUTE_TEST_T };

ModelConfig route_test_model_config(void);
/* attnres with `heads`; granularity block when layers_per_block > 0, full when 0 */
ResidualConfig route_test_attnres(int heads, int layers_per_block, ResidualForm form);
/* msar with `streams` kernels from `kernels` (block granularity, layers_per_block 1) */
ResidualConfig route_test_msar(int heads, int streams, const int *kernels, ResidualForm form);

/* A model for ROUTE_TEST_B sequences of ROUTE_TEST_T tokens, initialised (DESIGN 2) with
 * `seed` and init_std 0.1. */
Model *route_test_model(const ResidualConfig *residual, uint64_t seed);
/* The same on `backend` (a cpu table with some ops wrapped, to count them) with n_layers
 * layers (0: route_test_model_config's), its routing weights drawn at random
 * (route_test_randomize_routing, the same seed) and activation checkpointing as given. */
Model *route_test_model_on(const Backend *backend, int n_layers,
                           const ResidualConfig *residual, uint64_t seed, bool checkpointing);
/* Draws every routing weight at random (queries 0.5 N, key norms 1 + 0.1 N, alpha 0.5 N,
 * null 0.1 N, mix_bias 0.5 N, mix_proj 0.3 N, conv tap 0 = 1 + 0.1 N and taps below k_r
 * 0.3 N, taps beyond k_r 0). */
void route_test_randomize_routing(Model *model, uint64_t seed);

/* Host copies in and out of a tensor named by DESIGN 2.3; `values` holds its count. */
void route_test_set(Model *model, const char *name, const float *values);
void route_test_fill(Model *model, const char *name, float value);
void route_test_get(Model *model, const char *name, bool gradient, float *values);
size_t route_test_count(const Model *model, const char *name);

/* Fixed token batch [ROUTE_TEST_ROWS] for inputs and targets. */
void route_test_tokens(uint32_t *inputs, uint32_t *targets);
/* Forward on the fixed batch (z_loss 1e-4); returns the loss. */
double route_test_forward(Model *model);
/* Logits of the last forward on the host, malloc'd [ROWS, V]. */
float *route_test_logits(const Model *model);

#endif
