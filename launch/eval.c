/* launch/eval.c — `fathom eval` (see eval.h). */
#include "launch/eval.h"

#include "launch/inference.h"
#include "model/model.h"
#include "pipeline/evaluate.h"
#include "runtime/config.h"
#include "runtime/data.h"
#include "runtime/error.h"

#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *checkpoint, *weights, *data, *dump_path;
    long long samples; /* -1: eval.samples */
} EvalArguments;

static const char eval_usage[] =
    "usage: fathom eval --checkpoint DIR [--weights ema|raw] [--data SPEC] [--samples N] "
    "[--dump-logits OUT.h5]";

static EvalArguments parse_arguments(int argc, char **argv)
{
    EvalArguments arguments = {.samples = -1};
    for (int i = 2; i < argc; i++) {
        const char *option = argv[i];
        if (i + 1 >= argc)
            fatal(EXIT_CONFIG, "eval: %s needs a value\n%s", option, eval_usage);
        const char *value = argv[++i];
        if (!strcmp(option, "--checkpoint")) {
            arguments.checkpoint = value;
        } else if (!strcmp(option, "--weights")) {
            if (strcmp(value, "ema") && strcmp(value, "raw"))
                fatal(EXIT_CONFIG, "eval: --weights must be ema or raw, not '%s'", value);
            arguments.weights = value;
        } else if (!strcmp(option, "--data")) {
            arguments.data = value;
        } else if (!strcmp(option, "--samples")) {
            char *end;
            arguments.samples = strtoll(value, &end, 10);
            if (*end || arguments.samples < 1)
                fatal(EXIT_CONFIG, "eval: --samples must be a whole number >= 1, not '%s'",
                      value);
        } else if (!strcmp(option, "--dump-logits")) {
            arguments.dump_path = value;
        } else {
            fatal(EXIT_CONFIG, "eval: unknown option '%s'\n%s", option, eval_usage);
        }
    }
    if (!arguments.checkpoint)
        fatal(EXIT_CONFIG, "eval: --checkpoint is required\n%s", eval_usage);
    return arguments;
}

/* ---- --dump-logits: /tokens [N, T] uint32, /logits [N, T, V] float32 ---- */

typedef struct {
    hid_t file, tokens, logits;
    int seq_len, vocab;
    float *host_logits;
} LogitDump;

static hid_t create_dataset(hid_t file, const char *name, hid_t type, int rank,
                            const hsize_t *dims)
{
    hid_t space = (hid_t)H5_CHECK(H5Screate_simple(rank, dims, NULL));
    hid_t dataset = (hid_t)H5_CHECK(
        H5Dcreate2(file, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    H5_CHECK(H5Sclose(space));
    return dataset;
}

static void write_rows(hid_t dataset, hid_t type, int rank, const hsize_t *start,
                       const hsize_t *count, const void *rows)
{
    hid_t file_space = (hid_t)H5_CHECK(H5Dget_space(dataset));
    H5_CHECK(H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start, NULL, count, NULL));
    hid_t memory_space = (hid_t)H5_CHECK(H5Screate_simple(rank, count, NULL));
    H5_CHECK(H5Dwrite(dataset, type, memory_space, file_space, H5P_DEFAULT, rows));
    H5_CHECK(H5Sclose(memory_space));
    H5_CHECK(H5Sclose(file_space));
}

static void dump_batch(void *context, int64_t first_window, int batch,
                       const uint32_t *inputs, const Model *model)
{
    LogitDump *dump = context;
    model_read_logits(model, dump->host_logits);
    hsize_t token_start[2] = {(hsize_t)first_window, 0};
    hsize_t token_count[2] = {(hsize_t)batch, (hsize_t)dump->seq_len};
    write_rows(dump->tokens, H5T_NATIVE_UINT32, 2, token_start, token_count, inputs);
    hsize_t logit_start[3] = {(hsize_t)first_window, 0, 0};
    hsize_t logit_count[3] = {(hsize_t)batch, (hsize_t)dump->seq_len, (hsize_t)dump->vocab};
    write_rows(dump->logits, H5T_NATIVE_FLOAT, 3, logit_start, logit_count,
               dump->host_logits);
}

static void dump_open(LogitDump *dump, const char *path, int64_t windows, int batch,
                      const Config *config)
{
    h5_quiet();
    dump->file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (dump->file < 0)
        fatal(EXIT_DATA, "cannot create %s for --dump-logits", path);
    dump->seq_len = config->train.seq_len;
    dump->vocab = config->model.vocab_size;
    dump->host_logits = xmalloc((size_t)batch * dump->seq_len * dump->vocab * sizeof(float));
    hsize_t token_dims[2] = {(hsize_t)windows, (hsize_t)dump->seq_len};
    hsize_t logit_dims[3] = {(hsize_t)windows, (hsize_t)dump->seq_len, (hsize_t)dump->vocab};
    dump->tokens = create_dataset(dump->file, "tokens", H5T_STD_U32LE, 2, token_dims);
    dump->logits = create_dataset(dump->file, "logits", H5T_IEEE_F32LE, 3, logit_dims);
}

static void dump_close(LogitDump *dump)
{
    H5_CHECK(H5Dclose(dump->tokens));
    H5_CHECK(H5Dclose(dump->logits));
    H5_CHECK(H5Fclose(dump->file));
    free(dump->host_logits);
}

int eval_main(int argc, char **argv)
{
    EvalArguments arguments = parse_arguments(argc, argv);

    Inference inference;
    inference_open(&inference, arguments.checkpoint, arguments.weights);
    const Config *config = &inference.config;
    Model *model = inference.model;

    DataSet *data = data_open_eval(config, arguments.data);
    int64_t windows = arguments.samples > 0 ? arguments.samples : config->eval.samples;
    if ((uint64_t)windows > data_window_count(data))
        windows = (int64_t)data_window_count(data);

    LogitDump dump = {0};
    if (arguments.dump_path) {
        dump_open(&dump, arguments.dump_path, windows, config->train.microbatch_size, config);
        model_keep_all_logits(model);
    }
    EvalResult result = evaluate_loss(model, data, windows, config->train.microbatch_size,
                                      config->train.seq_len, (float)config->train.z_loss,
                                      arguments.dump_path ? dump_batch : NULL, &dump);
    if (arguments.dump_path)
        dump_close(&dump);

    printf("eval %s step %lld (%s weights) | val_loss %.6f | ce %.6f | ppl %.4f | %lld windows "
           "x %d tokens\n", inference.step_dir, (long long)inference.step, inference.weights,
           result.loss, result.ce, exp(result.ce), (long long)result.windows,
           config->train.seq_len);
    if (arguments.dump_path)
        printf("logits of %lld windows written to %s\n", (long long)result.windows,
               arguments.dump_path);

    data_close(data);
    inference_close(&inference);
    return EXIT_DONE;
}
