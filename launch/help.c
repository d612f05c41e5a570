/* launch/help.c — see help.h. */
#include "launch/help.h"

#include <string.h>

#include "launch/cpu_threads.h"
#include "launch/version.h"
#include "runtime/cuda_module.h"

typedef struct {
    const char *name, *text;
} CommandHelp;

static const CommandHelp commands[] = {
    {"train",
     "usage: fathom train CONFIG.yaml [--set key=value ...]\n"
     "  Trains the model of CONFIG.yaml (launch/configs/demo.yaml lists every key with its\n"
     "  default). A run_dir that holds a committed checkpoint is resumed from its\n"
     "  newest step, bit for bit; otherwise the run starts from `seed`. Under mpirun, pp x dp\n"
     "  ranks train one job (parallel.*). SIGTERM, SIGUSR1 or a first Ctrl-C finish the\n"
     "  step, save and exit 0; a second Ctrl-C stops at once (exit 130).\n"
     "  --set key=value   overrides one config key (any number of times; dotted names)\n"
     "  FATHOM_SET='key=value ...' in the environment adds overrides before the --set ones.\n"
     "  Before it allocates, the run checks its memory plan against this machine (exit 2\n"
     "  naming the keys that shrink it).\n"
     "example: fathom train launch/configs/demo.yaml --set train.steps=400 "
     "--set run_dir=runs/mine\n"},
    {"eval",
     "usage: fathom eval --checkpoint DIR [--weights ema|raw] [--data SPEC] [--samples N] "
     "[--dump-logits OUT.h5]\n"
     "  The mean loss of a checkpoint over evaluation windows, read in file order, on one\n"
     "  process (not under mpirun), the model built for the forward only (fathom plan says\n"
     "  how much memory it takes).\n"
     "  --checkpoint DIR    a run_dir or one of its step directories (the newest committed)\n"
     "  --weights ema|raw   the EMA of the weights (default) or the trained weights\n"
     "  --data SPEC         token shards to evaluate on (default: the run's data.val)\n"
     "  --samples N         how many windows (default: the run's eval.samples)\n"
     "  --dump-logits OUT   write /tokens [N,T] and /logits [N,T,V] of the windows to HDF5\n"
     "example: fathom eval --checkpoint runs/demo --weights raw --samples 64\n"},
    {"probe",
     "usage: fathom probe --checkpoint DIR [--weights ema|raw] [--data SPEC] [--samples N] "
     "[--slices S] [--json OUT.json]\n"
     "  Per routing site and head: the mean depth weights over a batch, and the MHAR paper's\n"
     "  width-disagreement KL beside a random query's.\n"
     "  --checkpoint DIR    a run_dir or one of its step directories\n"
     "  --weights ema|raw   the EMA of the weights (default) or the trained weights\n"
     "  --data SPEC         token shards (default: the run's data.val)\n"
     "  --samples N         windows in the batch\n"
     "  --slices S          width slices of the KL probe\n"
     "  --json OUT.json     also write the numbers as JSON (launch/tools/plot.py --probe)\n"
     "example: fathom probe --checkpoint runs/demo_block_mhar --weights raw --json probe.json\n"},
    {"bench",
     "usage: fathom bench [--cases layers,attention,route,msar,step,step8b,graft] [--repeat N] "
     "[--device auto|cpu|cuda] [--small] [--json OUT.jsonl] [--matmul-algorithms FILE]\n"
     "  Times the kernels and training steps of docs/performance.md on this machine.\n"
     "  --cases LIST        which cases, comma separated (default: all); also route-1b,\n"
     "                      route-sites, route-1b-sites, step-MODE, step8b-MODE, graft-MODE\n"
     "  --repeat N          timed repetitions of each\n"
     "  --device D          the backend (default auto: the GPU when there is one)\n"
     "  --small             small shapes (the only ones the cpu takes)\n"
     "  --json OUT.jsonl    also write one JSON object a case\n"
     "  --matmul-algorithms FILE  the products on a table fathom tune wrote (cuda)\n"
     "  Under mpirun -np D: --cases comm alone, FSDP's all-gather and reduce-scatter of a 1B\n"
     "  layer, an 8B layer and the 8B embedding over the ranks, in bus GB/s.\n"
     "example: fathom bench --cases step --small\n"},
    {"plan",
     "usage: fathom plan CONFIG.yaml [--set key=value ...] [--gpu-memory GIB]\n"
     "  What each rank of CONFIG.yaml's job will hold, stage by stage (parameters,\n"
     "  gradients, compute copy, optimizer, activations, host), from the config alone: no\n"
     "  GPU and no mpirun needed, at any parallel.pp x parallel.dp. The plan fathom train\n"
     "  checks on each rank before it allocates; then the bytes each rank sends a step\n"
     "  (pipeline hops, FSDP gathers and reduce-scatters), as predicted; and what fathom\n"
     "  eval of a checkpoint of the config holds on one GPU.\n"
     "  --set key=value     overrides one config key, as for train (FATHOM_SET too)\n"
     "  --gpu-memory GIB    also say whether each stage fits a GPU of GIB GiB, naming the keys\n"
     "                      that shrink one that does not (exit 2 then)\n"
     "example: fathom plan launch/configs/marin8b_block_mhar.yaml --gpu-memory 80\n"},
    {"tune",
     "usage: fathom tune CONFIG.yaml [--set key=value ...] [--out FILE] [--candidates N] "
     "[--repeats N]\n"
     "  Chooses the cuda backend's matrix product algorithms for CONFIG.yaml once, and writes\n"
     "  them to FILE (default matmul_algorithms.txt) for runs to name with matmul_algorithms:\n"
     "  the same file, the same algorithms and bits in every run and resume. Runs one step\n"
     "  of the config's model on one GPU (one process, one microbatch, one block of layers:\n"
     "  a layer's products do not depend on the depth or the layout), then times cuBLASLt's\n"
     "  candidates for each product and keeps the fastest that repeats its bits, where it\n"
     "  leads the heuristic's choice by 1% or more. Exit 2 without a GPU.\n"
     "  --out FILE          where the table goes (written whole, or not at all)\n"
     "  --candidates N      the heuristic's first N answers a product (default 32, up to 64)\n"
     "  --repeats N         timed runs of each (default 20, up to 200); the median counts\n"
     "example: fathom tune launch/configs/marin8b_block_mhar.yaml --out marin8b.matmul\n"},
    {"inspect",
     "usage: fathom inspect DIR [--json] | fathom inspect --comm RUN_DIR\n"
     "  DIR (a run_dir, its checkpoints/ or one step directory): the step and counters, the\n"
     "  layout that saved it (pp, dp, virtual_stages, split), the config's network, every\n"
     "  tensor of every group (/model, /ema, /optim/*) with shape, dtype and norm, and the\n"
     "  integrity verdict: every shard dataset's CRC32C is checked; a corrupt one is named\n"
     "  (file and tensor) and the exit code is 3.\n"
     "  --json              the same as one JSON object\n"
     "  --comm RUN_DIR      per pipeline stage: the pp bytes of the run's last logged step\n"
     "                      beside the prediction, with and without the cross-stage cache,\n"
     "                      the FSDP bytes beside theirs, and each kind's time and exposed\n"
     "                      time\n"
     "example: fathom inspect runs/demo --json\n"},
    {"convert",
     "usage: fathom convert --from-hf DIR --config CONFIG.yaml --to RUN_DIR\n"
     "  Imports a Hugging Face Llama-3 or Qwen3 model (DIR: config.json and model.safetensors,\n"
     "  or model.safetensors.index.json and its files; bf16, fp16 or fp32) as step 0 of a new\n"
     "  run for the network of CONFIG.yaml, its residual section included: base weights are\n"
     "  copied by name, routing weights start fresh (delta form: the base model exactly).\n"
     "  config.json must agree with the config's model section (exit 2 names the key); a\n"
     "  missing or malformed file or tensor is exit 3. Then train with\n"
     "  fathom train CONFIG.yaml --set run_dir=RUN_DIR (moments from zero, EMA at the weights).\n"
     "  --from-hf DIR       the Hugging Face model directory\n"
     "  --config FILE       the fathom config of the network to train\n"
     "  --to RUN_DIR        a new run directory (one that holds a checkpoint is refused)\n"
     "example: fathom convert --from-hf Llama-3.2-1B --config graft.yaml --to runs/graft\n"},
};

void help_print_overview(FILE *out)
{
    fputs("usage: fathom <command> [arguments]   (fathom <command> --help for one command)\n",
          out);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        const char *text = commands[i].text;
        const char *end = strchr(text, '\n');
        fprintf(out, "  %.*s\n", (int)(end - text) - 7, text + 7); /* the usage line */
    }
    fputs("  --version\n", out);
}

bool help_print_command(FILE *out, const char *command)
{
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(commands[i].name, command)) {
            fputs(commands[i].text, out);
            return true;
        }
    return false;
}

void help_print_version(FILE *out)
{
    fprintf(out, "fathom %s (commit %s)\n", FATHOM_VERSION, FATHOM_COMMIT);
    const CudaModuleInfo *cuda = cuda_module_probe();
    fprintf(out, "backends: cpu (fp32)");
    if (cuda->loaded)
        fprintf(out, ", cuda (bf16; %s: %s)\n", cuda->path, cuda->description);
    else
        fprintf(out, "; cuda not available (%s)\n", cuda->description);
    char threads[256];
    cpu_threads_describe(threads, sizeof threads);
    fprintf(out, "cpu: %s\n", threads);
}

bool help_requested(int argc, char **argv)
{
    return argc >= 3 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"));
}
