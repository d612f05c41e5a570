/* launch/backend_select.h — the backend for `device: auto | cpu | cuda` (DESIGN 6).
 *
 * cuda needs three things: a build with the CUDA module, a GPU that answers, and a network
 * the cuda kernels take (config may be NULL when there is no network to check, as in
 * `fathom bench`). The kernels' limits checked up front, from their headers:
 *   attention    head_dim 64, 80 or 128, on a Hopper GPU (compute capability 9.x)
 *                (kernels/cuda/attention_cuda.h)
 *   RMSNorm      d_model <= 8192 (kernels/cuda/kernels_cuda.h)
 *   routing      d_model <= 8192, residual.heads <= 32, MSAR kernel sizes <= 8
 *                (kernels/cuda/route_cuda.h)
 * auto: cuda when all three hold, else the cpu, saying why when a GPU was there.
 * cuda: exit 2 naming what is missing.
 * A config naming `matmul_algorithms` (runtime/matmul_table.h) gets that table on the cuda
 * backend: exit 2 when the run lands on the cpu (whose products have no algorithms to
 * choose), when the file cannot be read, or when the table was tuned with another cuBLASLt;
 * a table tuned on another device is used with a warning.
 */
#ifndef FATHOM_LAUNCH_BACKEND_SELECT_H
#define FATHOM_LAUNCH_BACKEND_SELECT_H

#include <stdbool.h>
#include <stddef.h>

#include "runtime/backend.h"
#include "runtime/config.h"

const Backend *backend_select(DeviceKind device, const Config *config);

/* The matmul_algorithms table at `path` for `backend`'s products from now on (the checks
 * and exits above); backend_select calls it for a config that names one, `fathom bench
 * --matmul-algorithms` for its own shapes. */
void backend_use_matmul_algorithms(const Backend *backend, const char *path);

/* Whether the cuda kernels take `config` (NULL: no network) on a GPU of compute capability
 * 10 * major + minor; false with the reason in `why` when not. */
bool backend_cuda_takes(const Config *config, int compute_capability, char *why,
                        size_t capacity);

#endif
