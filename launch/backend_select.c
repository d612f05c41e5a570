/* launch/backend_select.c — see backend_select.h. */
#include "launch/backend_select.h"

#include "runtime/cuda_module.h"
#include "runtime/error.h"
#include "runtime/matmul_table.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* The cuda kernels' limits (backend_select.h names the headers they come from). */
enum {
    CUDA_ATTENTION_COMPUTE_CAPABILITY = 90,
    CUDA_MAX_WIDTH = 8192,
    CUDA_MAX_ROUTE_HEADS = 32,
    CUDA_MAX_STREAM_KERNEL = 8,
};

bool backend_cuda_takes(const Config *config, int compute_capability, char *why,
                        size_t capacity)
{
    if (compute_capability / 10 != CUDA_ATTENTION_COMPUTE_CAPABILITY / 10) {
        snprintf(why, capacity, "the cuda attention needs a Hopper GPU (compute capability "
                 "9.x; this one is %d.%d)", compute_capability / 10, compute_capability % 10);
        return false;
    }
    if (!config)
        return true;
    const ModelConfig *model = &config->model;
    const ResidualConfig *residual = &config->residual;
    if (model->head_dim != 64 && model->head_dim != 80 && model->head_dim != 128) {
        snprintf(why, capacity, "the cuda attention takes model.head_dim 64, 80 or 128, not "
                 "%d", model->head_dim);
        return false;
    }
    if (model->d_model > CUDA_MAX_WIDTH) {
        snprintf(why, capacity, "the cuda kernels take model.d_model up to %d, not %d",
                 CUDA_MAX_WIDTH, model->d_model);
        return false;
    }
    if (residual->mode != RESIDUAL_STANDARD && residual->heads > CUDA_MAX_ROUTE_HEADS) {
        snprintf(why, capacity, "the cuda routing takes residual.heads up to %d, not %d",
                 CUDA_MAX_ROUTE_HEADS, residual->heads);
        return false;
    }
    for (int i = 0; residual->mode == RESIDUAL_MSAR && i < residual->n_stream_kernels; i++)
        if (residual->stream_kernels[i] > CUDA_MAX_STREAM_KERNEL) {
            snprintf(why, capacity, "the cuda stream route takes residual.stream_kernels up "
                     "to %d, not %d", CUDA_MAX_STREAM_KERNEL, residual->stream_kernels[i]);
            return false;
        }
    return true;
}

void backend_use_matmul_algorithms(const Backend *backend, const char *path)
{
    if (strcmp(backend->name, "cuda"))
        fatal(EXIT_CONFIG, "matmul_algorithms names %s, a table of the cuda backend's "
              "algorithms, but this run is on the %s backend: remove the key, or run on a GPU",
              path, backend->name);
    MatmulTable table;
    matmul_table_init(&table);
    matmul_table_read(&table, path);
    char why[512];
    if (!cuda_module_matmul_table_use(&table, why, sizeof why))
        fatal(EXIT_CONFIG, "matmul_algorithms: %s cannot be used here: %s; run fathom tune "
              "again", path, why);
    const char *description = cuda_module_probe()->description;
    char multiprocessors[32];
    snprintf(multiprocessors, sizeof multiprocessors, " %d SMs", table.multiprocessors);
    if (strncmp(description, table.device, strlen(table.device)) ||
        !strstr(description, multiprocessors))
        warn("matmul_algorithms: %s was tuned on %s with %d multiprocessors and this run is on "
             "%s: its algorithms run, but may not be the fastest here", path, table.device,
             table.multiprocessors, description);
    printf("fathom: matmul algorithms from %s (%d products, tuned on %s)\n", path, table.count,
           table.device);
    matmul_table_free(&table);
}

static const Backend *backend_choose(DeviceKind device, const Config *config)
{
    if (device == DEVICE_CPU)
        return backend_cpu();
    if (device != DEVICE_AUTO && device != DEVICE_CUDA)
        fatal(EXIT_CONFIG, "device: unknown value %d", (int)device);

    const Backend *cuda = cuda_module_backend();
    const CudaModuleInfo *info = cuda_module_probe();
    char why[256];
    if (!cuda) {
        if (device == DEVICE_CUDA)
            fatal(EXIT_CONFIG, "device: cuda, but %s; use device: cpu or auto",
                  info->description);
        return backend_cpu();
    }
    if (!backend_cuda_takes(config, info->compute_capability, why, sizeof why)) {
        if (device == DEVICE_CUDA)
            fatal(EXIT_CONFIG, "device: cuda on %s, but %s; use device: cpu or auto",
                  info->description, why);
        printf("fathom: found %s, but %s: training on the cpu\n", info->description, why);
        return backend_cpu();
    }
    printf("fathom: device cuda (%s)\n", info->description);
    return cuda;
}

const Backend *backend_select(DeviceKind device, const Config *config)
{
    const Backend *backend = backend_choose(device, config);
    if (config && config->matmul_algorithms[0])
        backend_use_matmul_algorithms(backend, config->matmul_algorithms);
    return backend;
}
