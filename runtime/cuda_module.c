/* runtime/cuda_module.c — see cuda_module.h. */
#include "runtime/cuda_module.h"

#include "runtime/error.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int (*CudaProbeFunction)(char *description, size_t capacity);

static CudaModuleInfo module_info;
static bool probed;
static void *module_handle; /* kept open for the life of the process */

/* The module compiles its own runtime/error.c: give it this process's rank prefix and abort
 * hook, so that a fatal() inside it ends a job of several ranks as one here does. */
static void share_error_handling(void *handle)
{
    typedef void (*SetAbort)(void (*)(int));
    typedef void (*SetRank)(int);
    SetAbort set_abort = (SetAbort)(uintptr_t)dlsym(handle, "error_set_abort");
    SetRank set_rank = (SetRank)(uintptr_t)dlsym(handle, "error_set_rank");
    if (set_abort)
        set_abort(error_abort_hook());
    if (set_rank)
        set_rank(error_rank_prefix());
}

static void *open_candidate(const char *path)
{
    if (access(path, R_OK) != 0)
        return NULL;
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!handle)
        snprintf(module_info.description, sizeof module_info.description,
                 "cannot load %.100s: %.140s", path, dlerror());
    return handle;
}

static void *open_module(void)
{
    const char *override = getenv("FATHOM_CUDA_MODULE");
    if (override && *override) {
        snprintf(module_info.path, sizeof module_info.path, "%s", override);
        return open_candidate(override);
    }
    char executable[PATH_MAX];
    ssize_t length = readlink("/proc/self/exe", executable, sizeof executable - 1);
    if (length <= 0)
        return NULL;
    executable[length] = '\0';
    char *slash = strrchr(executable, '/');
    if (slash)
        *slash = '\0';
    static const char *const places[] = {"%s/libfathom_cuda.so", "%s/kernels/libfathom_cuda.so"};
    for (size_t i = 0; i < sizeof places / sizeof places[0]; i++) {
        snprintf(module_info.path, sizeof module_info.path, places[i], executable);
        void *handle = open_candidate(module_info.path);
        if (handle)
            return handle;
    }
    return NULL;
}

const CudaModuleInfo *cuda_module_probe(void)
{
    if (probed)
        return &module_info;
    probed = true;
    snprintf(module_info.description, sizeof module_info.description,
             "this build has no CUDA module (nvcc was not found when it was built)");
    void *handle = open_module();
    if (!handle)
        return &module_info;
    CudaProbeFunction probe = (CudaProbeFunction)(uintptr_t)dlsym(handle, "cuda_probe");
    if (!probe) {
        snprintf(module_info.description, sizeof module_info.description,
                 "%.200s does not export cuda_probe", module_info.path);
        return &module_info;
    }
    module_handle = handle;
    module_info.loaded = true;
    module_info.devices = probe(module_info.description, sizeof module_info.description);
    typedef int (*CapabilityFunction)(void);
    CapabilityFunction capability =
        (CapabilityFunction)(uintptr_t)dlsym(handle, "cuda_compute_capability");
    if (module_info.devices > 0 && capability)
        module_info.compute_capability = capability();
    return &module_info;
}

typedef size_t (*TableBytesFunction)(void);

const Backend *cuda_module_backend(void)
{
    const CudaModuleInfo *info = cuda_module_probe();
    if (!info->loaded || info->devices == 0)
        return NULL;
    share_error_handling(module_handle);
    BackendGetter getter = (BackendGetter)(uintptr_t)dlsym(module_handle, "backend_cuda");
    if (!getter)
        fatal(EXIT_CONFIG, "%s does not export backend_cuda; rebuild the CUDA module or use "
              "device: cpu", info->path);
    /* a module of another build fills its entries at other offsets: refuse it */
    TableBytesFunction table_bytes =
        (TableBytesFunction)(uintptr_t)dlsym(module_handle, "backend_cuda_table_bytes");
    if (!table_bytes || table_bytes() != sizeof(Backend))
        fatal(EXIT_CONFIG, "%s was built against another op table (%zu bytes, this binary's "
              "%zu): rebuild the CUDA module with this fathom, or use device: cpu", info->path,
              table_bytes ? table_bytes() : (size_t)0, sizeof(Backend));
    return getter();
}

/* A loaded module with a device, its error handling shared; else NULL. */
static void *module_with_device(void)
{
    const CudaModuleInfo *info = cuda_module_probe();
    if (!info->loaded || info->devices == 0)
        return NULL;
    share_error_handling(module_handle);
    return module_handle;
}

/* A symbol the module must export once it is loaded. */
static void *required_symbol(void *handle, const char *name)
{
    void *symbol = dlsym(handle, name);
    if (!symbol)
        fatal(EXIT_CONFIG, "%s does not export %s; rebuild the CUDA module or use device: cpu",
              cuda_module_probe()->path, name);
    return symbol;
}

const NcclTable *cuda_module_nccl(char *why, size_t capacity)
{
    void *handle = module_with_device();
    if (!handle) {
        if (why)
            snprintf(why, capacity, "%s", cuda_module_probe()->description);
        return NULL;
    }
    NcclTableGetter getter = (NcclTableGetter)(uintptr_t)dlsym(handle, "nccl_cuda");
    if (!getter) {
        if (why)
            snprintf(why, capacity, "the CUDA module was built without NCCL");
        return NULL;
    }
    const NcclTable *table = getter();
    if (table->table_bytes != sizeof(NcclTable))
        fatal(EXIT_CONFIG, "%s was built against another NCCL table (%zu bytes, this binary's "
              "%zu): rebuild the CUDA module with this fathom, or use device: cpu",
              cuda_module_probe()->path, table->table_bytes, sizeof(NcclTable));
    return table;
}

bool cuda_module_device_bus_id(int ordinal, char *bus_id, size_t capacity)
{
    void *handle = module_with_device();
    if (!handle) {
        snprintf(bus_id, capacity, "%s", cuda_module_probe()->description);
        return false;
    }
    typedef int (*BusIdFunction)(int, char *, size_t);
    BusIdFunction bus_id_of =
        (BusIdFunction)(uintptr_t)required_symbol(handle, "cuda_device_bus_id");
    return bus_id_of(ordinal, bus_id, capacity) == 0;
}

void cuda_module_device_use(int ordinal)
{
    void *handle = module_with_device();
    if (!handle)
        fatal(EXIT_CONFIG, "CUDA device %d chosen, but %s", ordinal,
              cuda_module_probe()->description);
    typedef void (*UseFunction)(int);
    UseFunction use = (UseFunction)(uintptr_t)required_symbol(handle, "cuda_device_use");
    use(ordinal);
}

bool cuda_module_memory(size_t *free_bytes, size_t *total_bytes)
{
    const CudaModuleInfo *info = cuda_module_probe();
    if (!info->loaded || info->devices == 0)
        return false;
    typedef int (*MemoryFunction)(size_t *, size_t *);
    MemoryFunction memory = (MemoryFunction)(uintptr_t)dlsym(module_handle, "cuda_memory_info");
    return memory && memory(free_bytes, total_bytes);
}

/* The module with a device, for an op of the matrix products' algorithms: fatal without. */
static void *matmul_module(const char *what)
{
    void *handle = module_with_device();
    if (!handle)
        fatal(EXIT_CONFIG, "%s needs the cuda backend, but %s", what,
              cuda_module_probe()->description);
    return handle;
}

bool cuda_module_matmul_table_use(const MatmulTable *table, char *why, size_t capacity)
{
    typedef int (*UseFunction)(const MatmulTable *, char *, size_t);
    UseFunction use = (UseFunction)(uintptr_t)required_symbol(matmul_module("matmul_algorithms"),
                                                              "cuda_matmul_table_use");
    return use(table, why, capacity) == 0;
}

void cuda_module_matmul_table_counts(int *from_table, int *from_heuristic)
{
    typedef void (*CountsFunction)(int *, int *);
    CountsFunction counts = (CountsFunction)(uintptr_t)required_symbol(
        matmul_module("matmul_algorithms"), "cuda_matmul_table_counts");
    counts(from_table, from_heuristic);
}

void cuda_module_matmul_tune(MatmulTable *table, int candidates, int repeats)
{
    typedef void (*TuneFunction)(MatmulTable *, int, int);
    TuneFunction tune = (TuneFunction)(uintptr_t)required_symbol(matmul_module("fathom tune"),
                                                                 "cuda_matmul_tune");
    tune(table, candidates, repeats);
}
