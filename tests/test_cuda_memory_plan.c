/* tests/test_cuda_memory_plan.c — the memory plan on the GPU (launch/memory_plan.h): the
 * CUDA module reports the device's free memory, and `fathom train` refuses, before it
 * allocates, a model whose device part exceeds it. SKIP without a GPU. */
#include <criterion/criterion.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda_module.h"
#include "tests/gpu_support.h"
#include "tests/support.h"
#include "tests/train_support.h"

Test(cuda_memory_plan, the_module_reports_the_free_memory_of_the_gpu)
{
    gpu_require();
    /* the module beside the fathom binary, found by its path as fathom finds it */
    char binary[1024], module[1100];
    snprintf(binary, sizeof binary, "%s", test_fathom_binary());
    snprintf(module, sizeof module, "%s/kernels/libfathom_cuda.so", dirname(binary));
    setenv("FATHOM_CUDA_MODULE", module, 1);
    size_t free_bytes = 0, total_bytes = 0;
    cr_assert(cuda_module_memory(&free_bytes, &total_bytes), "%s: %s", module,
              cuda_module_probe()->description);
    cr_assert(free_bytes > 0 && free_bytes <= total_bytes, "free %zu of %zu", free_bytes,
              total_bytes);
}

/* 64 Llama-3-8B layers: 14 G parameters, about 300 GB of weights, gradients, compute copy
 * and optimizer state on one GPU. */
Test(cuda_memory_plan, a_model_larger_than_the_gpu_is_refused_naming_its_keys, .timeout = 120)
{
    gpu_require();
    char dir[256], output[1 << 14];
    test_make_temp_dir(dir, "cuda-memory-plan");
    tiny_config_write(dir, "");
    const int code = tiny_train(dir, "--set device=cuda --set model.d_model=4096 "
                                "--set model.n_heads=32 --set model.n_kv_heads=8 "
                                "--set model.head_dim=128 --set model.ffn_dim=14336 "
                                "--set model.n_layers=64", output, sizeof output);
    cr_assert_eq(code, 2, "exit %d: %s", code, output);
    cr_assert(strstr(output, "memory plan of one rank"), "%s", output);
    cr_assert(strstr(output, "of device memory per rank"), "%s", output);
    cr_assert(strstr(output, "free memory of the GPU"), "%s", output);
    cr_assert(strstr(output, "model.n_layers = 64"), "%s", output);
    test_remove_tree(dir);
}
