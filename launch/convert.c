/* launch/convert.c — `fathom convert` (see convert.h). */
#include "launch/convert.h"

#include "checkpoints/checkpoint.h"
#include "checkpoints/hf_import.h"
#include "runtime/config.h"
#include "runtime/error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char convert_usage[] =
    "usage: fathom convert --from-hf DIR --config CONFIG.yaml --to RUN_DIR";

/* RUN_DIR/config.yaml, as `fathom train` writes it (temporary name, then rename). */
static void write_run_config(const Config *config)
{
    char path[CONFIG_PATH_MAX + 32], temporary[CONFIG_PATH_MAX + 48];
    snprintf(path, sizeof path, "%s/config.yaml", config->run_dir);
    snprintf(temporary, sizeof temporary, "%s.tmp", path);
    char *text = config_to_yaml(config);
    FILE *file = fopen(temporary, "w");
    if (!file || fputs(text, file) < 0 || fclose(file) != 0 || rename(temporary, path) != 0)
        fatal(EXIT_DATA, "cannot write %s: %s", path, strerror(errno));
    free(text);
}

int convert_main(int argc, char **argv)
{
    const char *hf_dir = NULL, *config_path = NULL, *run_dir = NULL;
    for (int i = 2; i < argc; i++) {
        const char *option = argv[i];
        if (i + 1 >= argc)
            fatal(EXIT_CONFIG, "convert: %s needs a value\n%s", option, convert_usage);
        const char *value = argv[++i];
        if (!strcmp(option, "--from-hf"))
            hf_dir = value;
        else if (!strcmp(option, "--config"))
            config_path = value;
        else if (!strcmp(option, "--to"))
            run_dir = value;
        else
            fatal(EXIT_CONFIG, "convert: unknown option '%s'\n%s", option, convert_usage);
    }
    if (!hf_dir || !config_path || !run_dir)
        fatal(EXIT_CONFIG, "convert: --from-hf, --config and --to are all required\n%s",
              convert_usage);
    if (strlen(run_dir) >= CONFIG_PATH_MAX)
        fatal(EXIT_CONFIG, "convert: --to %s is longer than %d bytes", run_dir,
              CONFIG_PATH_MAX - 1);

    /* the config may describe a multi-rank job; the import itself is one process */
    Config config;
    config_load(&config, config_path, NULL, 0, CONFIG_ANY_WORLD);
    snprintf(config.run_dir, sizeof config.run_dir, "%s", run_dir);
    char existing[CONFIG_PATH_MAX];
    if (checkpoint_find_latest(run_dir, existing, sizeof existing))
        fatal(EXIT_CONFIG, "convert: %s already holds a checkpoint (%s); convert writes step 0 "
              "of a new run: choose another --to", run_dir, existing);

    HfImportSummary summary;
    hf_import(hf_dir, &config, config_path, &summary);
    write_run_config(&config);
    printf("convert: %d tensors written (%d imported, %d routing weights fresh, %d skipped) "
           "| %.2f GB read in %.2f s, %.2f GB/s | step 0 of %s\n", summary.n_tensors,
           summary.n_imported, summary.n_fresh, summary.n_skipped,
           (double)summary.bytes_read / 1e9, summary.seconds,
           summary.seconds > 0 ? (double)summary.bytes_read / 1e9 / summary.seconds : 0.0,
           run_dir);
    printf("convert: continue with fathom train %s --set run_dir=%s\n", config_path, run_dir);
    return EXIT_DONE;
}
