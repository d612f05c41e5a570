/* tests/fixture_support.h — the model against an oracle's HDF5 fixture (DESIGN 7).
 *
 * A fixture tests/fixtures/<stem>.h5 (made by tests/reference/make_fixtures.py or
 * make_routing_fixtures.py; tests/reference/README.md gives the format) holds the fathom YAML
 * config of a network (root attribute `config`), one batch (/tokens [B, T+1] uint32), every
 * weight under its DESIGN 2.3 name (/weights, float32) and what the oracle computed in float64:
 * /logits [B, T, V], /loss, /ce, /zloss and /grads/<name>.
 *
 * fixture_open builds the network the config names (its residual section included) for B
 * sequences of T tokens on the backend of fixture_use_backend (cpu unless told otherwise) and
 * loads every weight into it; weights, gradients and logits cross the host boundary only
 * through that model's backend, so the same claims run on every backend. The fixture_check_*
 * functions each open a fixture, assert one claim with the caller's tolerance (relative error
 * ||fathom - oracle|| / ||oracle||) and close it again. `oracle` names who made the numbers
 * in failure messages. Everything a Fixture holds is its own; fixture_close frees it.
 */
#ifndef FATHOM_TESTS_FIXTURE_SUPPORT_H
#define FATHOM_TESTS_FIXTURE_SUPPORT_H

#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "runtime/backend.h"
#include "runtime/config.h"

typedef struct {
    hid_t file;
    Config config;
    int B, T;
    uint32_t *inputs, *targets; /* [B, T] */
    Model *model;
} Fixture;

/* The backend every later fixture_open of this process builds its model on (default
 * backend_cpu()). Criterion runs each test in its own process, so a test that sets it
 * changes no other test. */
void fixture_use_backend(const Backend *backend);

void fixture_open(Fixture *fixture, const char *stem);
void fixture_close(Fixture *fixture);
/* model_forward on the fixture's batch with its train.z_loss. */
ModelLoss fixture_forward(Fixture *fixture);

/* Dataset `path` converted to `memory_type`, malloc'd (element_size bytes each); its rank and
 * dims (up to 3, trailing dims 1) go to ndim/shape and its element count to count, each when
 * not NULL. */
void *fixture_read_dataset(const Fixture *fixture, const char *path, hid_t memory_type,
                           size_t element_size, int *ndim, hsize_t shape[3], size_t *count);
double fixture_read_scalar(const Fixture *fixture, const char *path);

/* Asserts |value - expected| / |expected| <= tolerance; `what` names the value. */
void fixture_expect_relative(double value, double expected, double tolerance, const char *what,
                             const char *oracle);

/* The claims. */
/* Every /weights dataset names a param-table entry of the same shape, and there are as many
 * datasets as entries. */
void fixture_check_weight_names_and_shapes(const char *stem);
void fixture_check_logits(const char *stem, const char *oracle, double tolerance);
/* loss, ce and zloss, each to `tolerance`. */
void fixture_check_losses(const char *stem, const char *oracle, double tolerance);
/* Every gradient to `tolerance`; a gradient the oracle gives as exactly zero must be exactly
 * zero here. Returns how many of the tensors compared are routing weights (PARAM_ROUTING). */
int fixture_check_gradients(const char *stem, double tolerance);

#endif
