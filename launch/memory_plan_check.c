/* launch/memory_plan_check.c — the memory plan against the machine (see memory_plan.h):
 * the printed plan, the verdict and the keys it names. */
#include "launch/memory_plan.h"

#include "runtime/error.h"

#include <stdarg.h>
#include <string.h>

/* "1.23 GiB", "45.6 MiB", "789 KiB", "0 B" */
static const char *format_bytes(char *buffer, size_t capacity, double bytes)
{
    if (bytes >= 1024.0 * 1024 * 1024 * 1024)
        snprintf(buffer, capacity, "%.2f TiB", bytes / (1024.0 * 1024 * 1024 * 1024));
    else if (bytes >= 1024.0 * 1024 * 1024)
        snprintf(buffer, capacity, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
    else if (bytes >= 1024.0 * 1024)
        snprintf(buffer, capacity, "%.1f MiB", bytes / (1024.0 * 1024));
    else if (bytes >= 1024.0)
        snprintf(buffer, capacity, "%.0f KiB", bytes / 1024.0);
    else
        snprintf(buffer, capacity, "%.0f B", bytes);
    return buffer;
}

/* The cpu backend's memory is the host's (runtime/backend.h). */
static bool is_cpu(const Backend *backend)
{
    return !strcmp(backend->name, "cpu");
}

void memory_plan_print(FILE *out, const MemoryPlan *plan, const Config *config,
                       const Backend *backend, RankLayout layout)
{
    char b[32];
    const bool checkpointed = config->train.activation_checkpointing == CHECKPOINTING_FULL;
    fprintf(out, "fathom: memory plan of one rank (stage %d, dp rank %d of parallel.pp %d x "
            "parallel.dp %d) on the %s backend:\n", layout.stage, layout.dp_rank, layout.pp,
            layout.dp, backend->name);
    fprintf(out, "fathom:   parameters   %12s  fp32 master weights, %.0f elements\n",
            format_bytes(b, sizeof b, plan->parameters), plan->elements);
    fprintf(out, "fathom:   gradients    %12s  fp32\n", format_bytes(b, sizeof b, plan->gradients));
    fprintf(out, "fathom:   compute copy %12s  %s\n", format_bytes(b, sizeof b, plan->compute_copy),
            is_cpu(backend) ? "none: the ops read the fp32 master" : "bf16 weights the ops read");
    fprintf(out, "fathom:   optimizer    %12s  AdamW exp_avg, exp_avg_sq%s\n",
            format_bytes(b, sizeof b, plan->optimizer),
            config->optim.ema_decay > 0 ? " and the EMA (optim.ema_decay > 0)" : "");
    /* each part with its bytes: where a routed mode's activations go (its summary store
     * holds every partial of the replace form) is plain from the plan */
    char stash[32], store[32], scratch[32], held[32], stores[80] = "", hops[64] = "";
    if (config->residual.mode != RESIDUAL_STANDARD)
        snprintf(stores, sizeof stores, ", %d summary store%s %s", plan->stores,
                 plan->stores == 1 ? "" : "s",
                 format_bytes(store, sizeof store, plan->store_bytes));
    if (plan->held_bytes > 0)
        snprintf(hops, sizeof hops, ", hops in flight %s",
                 format_bytes(held, sizeof held, plan->held_bytes));
    if (plan->activations_sized)
        fprintf(out, "fathom:   activations  %12s  %s%d stash%s %s%s, scratch %s, RoPE tables%s "
                "(train.activation_checkpointing %s)\n",
                format_bytes(b, sizeof b, plan->activations),
                plan->activations_exact ? "" : "about, ", plan->stashes,
                plan->stashes == 1 ? "" : "es",
                format_bytes(stash, sizeof stash, plan->stash_bytes), stores,
                format_bytes(scratch, sizeof scratch, plan->scratch_bytes), hops,
                checkpointed ? "full" : "none");
    else
        fprintf(out, "fathom:   activations  %12s  not sized: the weights alone are past any "
                "machine\n", "?");
    fprintf(out, "fathom:   host         %12s  token corpus, batch buffers, staging, "
            "bookkeeping\n", format_bytes(b, sizeof b, plan->host));
}

/* Appends to a message buffer (truncating). */
static void append(char *message, size_t capacity, const char *format, ...)
    __attribute__((format(printf, 3, 4)));

static void append(char *message, size_t capacity, const char *format, ...)
{
    const size_t used = strlen(message);
    if (used + 1 >= capacity)
        return;
    va_list args;
    va_start(args, format);
    vsnprintf(message + used, capacity - used, format, args);
    va_end(args);
}

/* The keys that shrink each part, with their values. */
static void name_weight_keys(char *message, size_t capacity, const Config *config)
{
    const ModelConfig *model = &config->model;
    append(message, capacity, "model.n_layers = %d, model.d_model = %d, model.ffn_dim = %d "
           "or model.vocab_size = %d", model->n_layers, model->d_model, model->ffn_dim,
           model->vocab_size);
    if (config->optim.ema_decay > 0)
        append(message, capacity, ", or optim.ema_decay: 0 (no EMA)");
    /* FSDP divides a rank's shards by the dp ranks, pipeline stages its units by stages */
    append(message, capacity, ", or more ranks: parallel.dp = %d (shards 1/dp of a stage's "
           "weights and optimizer state) or parallel.pp = %d", config->parallel.dp,
           config->parallel.pp);
}

static void name_activation_keys(char *message, size_t capacity, const Config *config,
                                 const MemoryPlan *plan)
{
    append(message, capacity, "train.microbatch_size = %d or train.seq_len = %d",
           config->train.microbatch_size, config->train.seq_len);
    if (config->train.activation_checkpointing == CHECKPOINTING_NONE)
        append(message, capacity, ", or train.activation_checkpointing: full");
    if (config->parallel.schedule == SCHEDULE_GPIPE && plan->stashes > config->parallel.pp)
        append(message, capacity, ", or parallel.schedule: 1f1b (gpipe keeps all %d "
               "microbatches of train.global_batch_size = %d in flight)", plan->stashes,
               config->train.global_batch_size);
}

static void name_host_keys(char *message, size_t capacity, const Config *config)
{
    append(message, capacity, "train.seq_len = %d", config->train.seq_len);
    if (config->data.source == DATA_SYNTHETIC)
        append(message, capacity, " (the synthetic corpus holds at least 256 windows of "
               "train.seq_len + 1 tokens)");
}

bool memory_plan_fits(const MemoryPlan *plan, const Config *config, const Backend *backend,
                      MachineMemory device, MachineMemory host, char *message,
                      size_t capacity)
{
    const bool cpu = is_cpu(backend);
    const double weights = plan->parameters + plan->gradients + plan->compute_copy +
                           plan->optimizer;
    const double backend_bytes = memory_plan_backend_bytes(plan);
    /* on cpu one memory holds everything; on cuda the device and the host each hold theirs */
    const double device_need = cpu ? backend_bytes + plan->host : backend_bytes;
    const MachineMemory device_has = cpu ? host : device;
    const bool device_short = device_has.bytes >= 0 && device_need > device_has.bytes;
    const bool host_short = !cpu && host.bytes >= 0 && plan->host > host.bytes;
    if (!device_short && !host_short)
        return true;

    char need[32], have[32];
    message[0] = '\0';
    const bool on_host = !device_short;
    const double total = on_host ? plan->host : device_need;
    format_bytes(need, sizeof need, total);
    format_bytes(have, sizeof have, on_host ? host.bytes : device_has.bytes);
    append(message, capacity, "the run needs %s%s of %s memory per rank, and %s is available "
           "(%s); ", plan->activations_sized && plan->activations_exact ? "" : "at least ",
           need, on_host || cpu ? "host" : "device", have,
           on_host ? host.source : device_has.source);
    /* the keys of every part that holds a quarter of it, the largest part first */
    typedef struct {
        double bytes;
        int part;
    } Part;
    Part parts[3] = {{on_host ? 0 : weights, 0},
                  {on_host ? 0 : plan->activations, 1},
                  {cpu || on_host ? plan->host : 0, 2}};
    for (int i = 0; i < 3; i++)
        for (int j = i + 1; j < 3; j++)
            if (parts[j].bytes > parts[i].bytes) {
                const Part swap = parts[i];
                parts[i] = parts[j];
                parts[j] = swap;
            }
    static const char *const names[] = {"the weights (parameters, gradients, optimizer)",
                                        "the activations", "host buffers"};
    for (int i = 0; i < 3; i++) {
        if (i > 0 && parts[i].bytes < total / 4)
            break;
        append(message, capacity, "%s%s take %.0f%%: lower ", i ? "; " : "",
               names[parts[i].part], 100.0 * parts[i].bytes / total);
        if (parts[i].part == 0)
            name_weight_keys(message, capacity, config);
        else if (parts[i].part == 1)
            name_activation_keys(message, capacity, config, plan);
        else
            name_host_keys(message, capacity, config);
    }
    return false;
}

void memory_plan_check(const Config *config, const Backend *backend, const RankGrid *grid)
{
    const RankLayout layout = {grid->pp, grid->dp, grid->stage, grid->dp_rank};
    MemoryPlan plan;
    memory_plan_build(&plan, config, backend, layout);
    const MachineMemory host = machine_host_memory();
    const MachineMemory device = is_cpu(backend) ? host : machine_device_memory();
    char message[1024];
    if (memory_plan_fits(&plan, config, backend, device, host, message, sizeof message))
        return;
    fflush(stdout);
    memory_plan_print(stderr, &plan, config, backend, layout);
    fatal(EXIT_CONFIG, "%s", message);
}
