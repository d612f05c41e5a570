/* launch/inspect_checkpoint.c — `fathom inspect DIR` (see inspect_checkpoint.h). */
#include "launch/inspect_checkpoint.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoints/checkpoint.h"
#include "model/params.h"
#include "runtime/config.h"
#include "runtime/error.h"

typedef struct {
    CheckpointMeta meta;
    char *config_yaml;
    char step_dir[CONFIG_PATH_MAX];
    Config config;
    size_t parameters;
    CheckpointTensorInfo *infos[CKPT_GROUPS];
    int n_infos[CKPT_GROUPS];
    CheckpointCorruption *bad;
    int n_checked, n_bad;
} Inspection;

static const char *const residual_modes[] = {"standard", "attnres", "msar"};

static void inspection_read(Inspection *inspection, const char *dir)
{
    memset(inspection, 0, sizeof *inspection);
    checkpoint_read_meta(dir, &inspection->meta, &inspection->config_yaml,
                         inspection->step_dir, sizeof inspection->step_dir);
    config_load_text(&inspection->config, inspection->config_yaml, inspection->step_dir, NULL,
                     0, CONFIG_ANY_WORLD);
    ParamTable table;
    param_table_build_with_residual(&table, &inspection->config.model,
                                    &inspection->config.residual);
    for (int p = 0; p < table.n_params; p++)
        inspection->parameters += table.params[p].count;
    param_table_free(&table);
    /* the digests first: a tensor with a corrupt shard dataset is not read for its norm */
    inspection->n_checked = checkpoint_verify_all(inspection->step_dir, &inspection->bad,
                                                  &inspection->n_bad);
    for (int g = 0; g < CKPT_GROUPS; g++)
        inspection->n_infos[g] = checkpoint_tensor_infos(inspection->step_dir, g,
                                                         &inspection->infos[g],
                                                         inspection->bad, inspection->n_bad);
}

static void inspection_free(Inspection *inspection)
{
    for (int g = 0; g < CKPT_GROUPS; g++)
        checkpoint_tensor_infos_free(inspection->infos[g], inspection->n_infos[g]);
    checkpoint_corruptions_free(inspection->bad, inspection->n_bad);
    free(inspection->config_yaml);
}

static void shape_print(FILE *out, int ndim, const int64_t *shape)
{
    for (int axis = 0; axis < ndim; axis++)
        fprintf(out, "%s%lld", axis ? ", " : "[", (long long)shape[axis]);
    fprintf(out, "]");
}

/* "[256, 64]" into text, for a padded column */
static const char *shape_text(int ndim, const int64_t *shape, char *text, size_t capacity)
{
    FILE *out = fmemopen(text, capacity, "w");
    shape_print(out, ndim, shape);
    fclose(out);
    return text;
}

static void split_print(FILE *out, const CheckpointMeta *meta, const char *separator)
{
    fprintf(out, "[");
    for (int i = 0; i < meta->n_layer_split; i++)
        fprintf(out, "%s%d", i ? separator : "", meta->layer_split[i]);
    fprintf(out, "]");
}

static void text_print(const Inspection *inspection)
{
    const CheckpointMeta *meta = &inspection->meta;
    const ModelConfig *model = &inspection->config.model;
    const ResidualConfig *residual = &inspection->config.residual;
    printf("checkpoint %s\n", inspection->step_dir);
    printf("step %lld | %lld samples consumed | %lld tokens seen | %lld optimizer steps | "
           "%lld skipped\n", (long long)meta->step, (long long)meta->consumed_samples,
           (long long)meta->tokens_seen, (long long)meta->optimizer_steps,
           (long long)meta->skipped_steps);
    printf("layout: pp %d, dp %d, virtual_stages %d, layer split ", meta->pp, meta->dp,
           meta->virtual_stages);
    if (meta->n_layer_split)
        split_print(stdout, meta, ", ");
    else
        printf("even");
    printf("\nconfig: %.2fM parameters, seed %llu\n", (double)inspection->parameters / 1e6,
           (unsigned long long)meta->rng_seed);
    printf("  model: vocab_size %d, d_model %d, n_layers %d, n_heads %d, n_kv_heads %d, "
           "head_dim %d, ffn_dim %d, rope_theta %g, rope_scaling %s, norm_eps %g, qk_norm %s, "
           "tie_embeddings %s\n", model->vocab_size, model->d_model, model->n_layers,
           model->n_heads, model->n_kv_heads, model->head_dim, model->ffn_dim,
           model->rope_theta, model->rope_scaling.llama3 ? "llama3" : "none", model->norm_eps,
           model->qk_norm ? "true" : "false", model->tie_embeddings ? "true" : "false");
    printf("  residual: mode %s, heads %d, granularity %s, layers_per_block %d, form %s, "
           "streams %d\n", residual_modes[residual->mode], residual->heads,
           residual->granularity == GRANULARITY_BLOCK ? "block" : "full",
           residual->layers_per_block, residual->form == FORM_DELTA ? "delta" : "replace",
           residual->streams);
    for (int g = 0; g < CKPT_GROUPS; g++) {
        if (!inspection->n_infos[g])
            continue;
        printf("%s: %d tensors\n", checkpoint_group_path(g), inspection->n_infos[g]);
        for (int i = 0; i < inspection->n_infos[g]; i++) {
            const CheckpointTensorInfo *info = &inspection->infos[g][i];
            char shape[96];
            printf("  %-48s %-18s %-8s ", info->name,
                   shape_text(info->ndim, info->shape, shape, sizeof shape), info->dtype);
            if (isnan(info->norm))
                printf("norm not read (corrupt)\n");
            else
                printf("norm %.6e\n", info->norm);
        }
    }
    if (!inspection->n_bad) {
        printf("integrity: OK (%d shard datasets, CRC32C checked)\n", inspection->n_checked);
        return;
    }
    printf("integrity: CORRUPT (%d of %d shard datasets)\n", inspection->n_bad,
           inspection->n_checked);
    for (int i = 0; i < inspection->n_bad; i++)
        printf("  %s/%s %s: %s\n", inspection->step_dir, inspection->bad[i].shard,
               inspection->bad[i].dataset, inspection->bad[i].problem);
}

static void json_string(FILE *out, const char *text)
{
    fputc('"', out);
    for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
        if (*c == '"' || *c == '\\')
            fprintf(out, "\\%c", *c);
        else if (*c == '\n')
            fputs("\\n", out);
        else if (*c < 0x20)
            fprintf(out, "\\u%04x", *c);
        else
            fputc(*c, out);
    }
    fputc('"', out);
}

/* A finite number in full precision; JSON has no NaN or infinity, so those are null. */
static void json_number(FILE *out, double value)
{
    if (isfinite(value))
        fprintf(out, "%.17g", value);
    else
        fputs("null", out);
}

static void json_print(const Inspection *inspection)
{
    const CheckpointMeta *meta = &inspection->meta;
    const ModelConfig *model = &inspection->config.model;
    const ResidualConfig *residual = &inspection->config.residual;
    FILE *out = stdout;
    fputs("{\"step_dir\": ", out);
    json_string(out, inspection->step_dir);
    fprintf(out, ", \"step\": %lld, \"consumed_samples\": %lld, \"tokens_seen\": %lld, "
            "\"optimizer_steps\": %lld, \"skipped_steps\": %lld", (long long)meta->step,
            (long long)meta->consumed_samples, (long long)meta->tokens_seen,
            (long long)meta->optimizer_steps, (long long)meta->skipped_steps);
    fprintf(out, ", \"layout\": {\"pp\": %d, \"dp\": %d, \"virtual_stages\": %d, "
            "\"layer_split\": ", meta->pp, meta->dp, meta->virtual_stages);
    split_print(out, meta, ", ");
    fprintf(out, "}, \"config\": {\"parameters\": %zu, \"seed\": %llu, \"model\": {"
            "\"vocab_size\": %d, \"d_model\": %d, \"n_layers\": %d, \"n_heads\": %d, "
            "\"n_kv_heads\": %d, \"head_dim\": %d, \"ffn_dim\": %d, \"rope_theta\": ",
            inspection->parameters, (unsigned long long)meta->rng_seed, model->vocab_size,
            model->d_model, model->n_layers, model->n_heads, model->n_kv_heads,
            model->head_dim, model->ffn_dim);
    json_number(out, model->rope_theta);
    fprintf(out, ", \"rope_scaling\": \"%s\", \"norm_eps\": ",
            model->rope_scaling.llama3 ? "llama3" : "none");
    json_number(out, model->norm_eps);
    fprintf(out, ", \"qk_norm\": %s, \"tie_embeddings\": %s}, \"residual\": {\"mode\": \"%s\", "
            "\"heads\": %d, \"granularity\": \"%s\", \"layers_per_block\": %d, \"form\": "
            "\"%s\", \"streams\": %d}, \"yaml\": ", model->qk_norm ? "true" : "false",
            model->tie_embeddings ? "true" : "false", residual_modes[residual->mode],
            residual->heads, residual->granularity == GRANULARITY_BLOCK ? "block" : "full",
            residual->layers_per_block, residual->form == FORM_DELTA ? "delta" : "replace",
            residual->streams);
    json_string(out, inspection->config_yaml);
    fputs("}, \"groups\": {", out);
    int groups_written = 0;
    for (int g = 0; g < CKPT_GROUPS; g++) {
        if (!inspection->n_infos[g])
            continue;
        fprintf(out, "%s\"%s\": [", groups_written++ ? ", " : "", checkpoint_group_path(g));
        for (int i = 0; i < inspection->n_infos[g]; i++) {
            const CheckpointTensorInfo *info = &inspection->infos[g][i];
            fputs(i ? ", {\"name\": " : "{\"name\": ", out);
            json_string(out, info->name);
            fputs(", \"shape\": ", out);
            shape_print(out, info->ndim, info->shape);
            fprintf(out, ", \"dtype\": \"%s\", \"norm\": ", info->dtype);
            json_number(out, info->norm);
            fputs("}", out);
        }
        fputs("]", out);
    }
    fprintf(out, "}, \"integrity\": {\"ok\": %s, \"checked\": %d, \"corrupt\": [",
            inspection->n_bad ? "false" : "true", inspection->n_checked);
    for (int i = 0; i < inspection->n_bad; i++) {
        fputs(i ? ", {\"shard\": " : "{\"shard\": ", out);
        json_string(out, inspection->bad[i].shard);
        fputs(", \"dataset\": ", out);
        json_string(out, inspection->bad[i].dataset);
        fputs(", \"problem\": ", out);
        json_string(out, inspection->bad[i].problem);
        fputs("}", out);
    }
    fputs("]}}\n", out);
}

int inspect_checkpoint_main(const char *dir, bool json)
{
    Inspection inspection;
    inspection_read(&inspection, dir);
    if (json)
        json_print(&inspection);
    else
        text_print(&inspection);
    fflush(stdout);
    if (inspection.n_bad) {
        char first[CONFIG_PATH_MAX + 512];
        snprintf(first, sizeof first, "%s/%s holds a corrupt %s (%s)", inspection.step_dir,
                 inspection.bad[0].shard, inspection.bad[0].dataset, inspection.bad[0].problem);
        int n_bad = inspection.n_bad, n_checked = inspection.n_checked;
        inspection_free(&inspection);
        fatal(EXIT_DATA, "checkpoint integrity: %d of %d shard datasets fail; %s", n_bad,
              n_checked, first);
    }
    inspection_free(&inspection);
    return EXIT_DONE;
}
