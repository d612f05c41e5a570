/* launch/plan.c — `fathom plan CONFIG.yaml [--set key=value ...] [--gpu-memory GIB]`: what
 * each rank of a job will hold, before the job has a machine (see plan.h).
 *
 * The plan is launch/memory_plan.h's, the one `fathom train` checks on every rank before it
 * allocates: a pure function of the config and the rank's place in the grid. Every dp rank
 * of a stage holds the same (its shards differ by at most a padding row a tensor), so a
 * stage is planned at its dp rank 0. Sized as the config's device runs: bf16 activations
 * and a bf16 compute copy for cuda (and auto, which means a GPU wherever one is), fp32 for
 * the cpu.
 */
#include "launch/plan.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch/config_arguments.h"
#include "launch/machine.h"
#include "launch/memory_plan.h"
#include "pipeline/traffic.h"
#include "runtime/backend.h"
#include "runtime/config.h"
#include "runtime/data.h"
#include "runtime/error.h"

static const char usage[] =
    "usage: fathom plan CONFIG.yaml [--set key=value ...] [--gpu-memory GIB]";


typedef struct {
    double gpu_gib; /* < 0: not given */
} PlanOptions;

static int plan_option(void *context, int argc, char **argv, int i)
{
    PlanOptions *options = context;
    if (strcmp(argv[i], "--gpu-memory"))
        return 0;
    if (i + 1 >= argc)
        fatal(EXIT_CONFIG, "plan: --gpu-memory needs a size in GiB (%s)", usage);
    char *end;
    options->gpu_gib = strtod(argv[i + 1], &end);
    if (end == argv[i + 1] || *end || !(options->gpu_gib > 0))
        fatal(EXIT_CONFIG, "plan: --gpu-memory %s is not a positive number of GiB",
              argv[i + 1]);
    return 2;
}

/* bytes in B, kB, MB or GB (powers of 1000, as the console line counts pp bytes) */
static void print_size(uint64_t bytes)
{
    static const char *const units[] = {"B", "kB", "MB", "GB"};
    double value = (double)bytes;
    int unit = 0;
    while (value >= 1000 && unit < 3) {
        value /= 1000;
        unit++;
    }
    printf(" %13.2f %-2s", value, units[unit]);
}

/* What each rank will send a step, by stage (pipeline/traffic.h). */
static void print_traffic(const Config *config, size_t activation_bytes)
{
    printf("fathom plan: bytes a rank sends a step, predicted (fathom inspect --comm sets a "
           "run's measured bytes beside them)\n");
    printf("fathom: %5s %16s %16s %16s %16s %16s\n", "stage", "pp sent", "summaries",
           "uncached", "all-gather", "reduce-scat.");
    for (int stage = 0; stage < config->parallel.pp; stage++) {
        const RankTraffic traffic = traffic_predict_rank(config, stage, activation_bytes);
        printf("fathom: %5d", stage);
        print_size(traffic.pp_send);
        print_size(traffic.pp_summary);
        print_size(traffic.pp_summary_uncached);
        print_size(traffic.fsdp_allgather);
        print_size(traffic.fsdp_reducescatter);
        printf("\n");
    }
}

int plan_main(int argc, char **argv)
{
    static ConfigArguments arguments;
    PlanOptions options = {.gpu_gib = -1};
    config_arguments_parse(&arguments, argc, argv, usage, plan_option, &options);
    Config config;
    config_load(&config, arguments.path, arguments.overrides, arguments.n_overrides,
                CONFIG_ANY_WORLD);
    data_resolve_vocab_size(&config); /* model.vocab_size: auto, from the data as train does */
    const bool cpu = config.device == DEVICE_CPU;
    /* the cuda backend as a plan sees it: its name and its activation size are all that
     * memory_plan_build and memory_plan_fits read of a backend (they size, never allocate;
     * the rest is the cpu's table, so nothing here needs the CUDA module) */
    Backend cuda_sizing = *backend_cpu();
    cuda_sizing.name = "cuda";
    cuda_sizing.activation_bytes = 2;
    const Backend *backend = cpu ? backend_cpu() : &cuda_sizing;
    if (cpu && options.gpu_gib > 0)
        fatal(EXIT_CONFIG, "plan: --gpu-memory with device: cpu (the cpu holds everything "
              "in host memory)");
    const int P = config.parallel.pp, D = config.parallel.dp;
    printf("fathom plan: %s, parallel.pp %d x parallel.dp %d = %d rank%s, %s, "
           "train.activation_checkpointing %s, fsdp.reshard_after_forward %s\n",
           arguments.path, P, D, P * D, P * D == 1 ? "" : "s",
           cpu ? "cpu (fp32)"
               : config.device == DEVICE_AUTO ? "device auto, sized for cuda (bf16)"
                                              : "cuda (bf16)",
           config.train.activation_checkpointing == CHECKPOINTING_FULL ? "full" : "none",
           config.fsdp.reshard_after_forward ? "true" : "false");

    MachineMemory device = {.bytes = -1}, host = {.bytes = -1};
    if (options.gpu_gib > 0) {
        device.bytes = options.gpu_gib * (1 << 30);
        snprintf(device.source, sizeof device.source, "--gpu-memory %g", options.gpu_gib);
    }
    int too_large = 0;
    double largest = 0;
    for (int stage = 0; stage < P; stage++) {
        const RankLayout layout = {P, D, stage, 0};
        MemoryPlan plan;
        memory_plan_build(&plan, &config, backend, layout);
        memory_plan_print(stdout, &plan, &config, backend, layout);
        const double bytes = memory_plan_backend_bytes(&plan) + (cpu ? plan.host : 0);
        largest = bytes > largest ? bytes : largest;
        char message[1024];
        if (device.bytes > 0 &&
            !memory_plan_fits(&plan, &config, backend, device, host, message, sizeof message)) {
            printf("fathom plan: stage %d does not fit: %s\n", stage, message);
            too_large++;
        }
    }
    print_traffic(&config, cpu ? sizeof(float) : 2);
    printf("fathom plan: fathom eval of a checkpoint of this config holds %.2f GiB "
           "%s (the model for the forward only, microbatches of %d)\n",
           memory_plan_evaluation_bytes(&config, backend) / (1 << 30),
           cpu ? "of host memory" : "on one GPU", config.train.microbatch_size);
    printf("fathom plan: the largest stage holds %.2f GiB a rank%s", largest / (1 << 30),
           cpu ? " (host memory)" : " on its GPU");
    if (device.bytes > 0)
        printf("; %s: %s\n", device.source,
               too_large ? "does not fit (fathom train would stop with exit 2)" : "fits");
    else
        printf("\n");
    return too_large ? EXIT_CONFIG : EXIT_DONE;
}
