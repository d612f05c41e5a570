/* tests/test_cuda_reference.c — the Hugging Face fixtures on the GPU (DESIGN 7): the whole
 * model on the cuda backend (bf16 activations and compute weights, fp32 statistics and
 * gradients) against transformers' float64 numbers, at bf16 tolerance. The fixtures are the
 * foundation's two families at the head_dims the cuda attention takes (llama_gpu: 64,
 * qwen3_gpu: 128; tests/reference/README.md). SKIP without a GPU.
 *
 * Tolerances are relative norms ||fathom - oracle|| / ||oracle||: a bf16 rounding is 2^-9
 * relative, a handful of them compound through two layers; docs/performance.md records what
 * the H200 measured.
 */
#include <criterion/criterion.h>

#include "kernels/cuda/backend_cuda.h"
#include "tests/fixture_support.h"
#include "tests/gpu_support.h"

#define CUDA_LOGITS_TOLERANCE 2e-2
#define CUDA_LOSS_TOLERANCE 1e-2
#define CUDA_GRADIENT_TOLERANCE 5e-2

#define CUDA_FIXTURE_TESTS(family)                                                          \
    Test(cuda_reference, family##_logits_match_hugging_face_in_bf16)                       \
    {                                                                                       \
        gpu_require();                                                                      \
        fixture_use_backend(backend_cuda());                                                \
        fixture_check_logits(#family "_gpu", "transformers", CUDA_LOGITS_TOLERANCE);        \
    }                                                                                       \
    Test(cuda_reference, family##_losses_match_hugging_face_in_bf16)                       \
    {                                                                                       \
        gpu_require();                                                                      \
        fixture_use_backend(backend_cuda());                                                \
        fixture_check_losses(#family "_gpu", "transformers", CUDA_LOSS_TOLERANCE);          \
    }                                                                                       \
    Test(cuda_reference, family##_gradients_match_hugging_face_in_bf16)                    \
    {                                                                                       \
        gpu_require();                                                                      \
        fixture_use_backend(backend_cuda());                                                \
        fixture_check_gradients(#family "_gpu", CUDA_GRADIENT_TOLERANCE);                   \
    }

CUDA_FIXTURE_TESTS(llama)
CUDA_FIXTURE_TESTS(qwen3)
