/* checkpoints/hf_import.h — a Hugging Face Llama-3 or Qwen3 model as step 0 of a fathom run
 * (DESIGN 5, `fathom convert`).
 *
 * Base weights keep their Hugging Face names (DESIGN 2.3), so the import is a rename-free
 * copy: every non-routing tensor of the parameter table that `config` builds (its residual
 * section included) must be in the safetensors of hf_dir with the same shape; the first one
 * missing or of another shape exits 3 naming it, before anything is written. The routing
 * weights are fresh, as model/init.h makes them (query 0, key_norm 1, alpha 0, null 0, ...),
 * so the delta form is the base model at step 0. Tensors of the import that fathom has no
 * place for: `*.rotary_emb.inv_freq` (RoPE tables, recomputed from the config) and
 * `lm_head.weight` under tied embeddings (transformers ties it to the embedding) are
 * skipped and counted; any other exits 3 naming it.
 *
 * hf_config_check (hf_config.h) runs first. The checkpoint is written under config->run_dir
 * with checkpoint_save_sharded as one process (no comm): /model only, step 0, the config
 * saved is `config` resolved, one tensor in host memory at a time. Progress goes to stdout.
 */
#ifndef FATHOM_CHECKPOINTS_HF_IMPORT_H
#define FATHOM_CHECKPOINTS_HF_IMPORT_H

#include <stdint.h>

#include "runtime/config.h"

typedef struct {
    int n_tensors;        /* written: imported + fresh */
    int n_imported;       /* read from the safetensors */
    int n_fresh;          /* routing weights made here */
    int n_skipped;        /* safetensors tensors skipped (see above) */
    uint64_t bytes_read;  /* safetensors bytes read */
    double seconds;       /* from opening the files to the commit */
} HfImportSummary;

/* `config_name` names the fathom config in messages. */
void hf_import(const char *hf_dir, const Config *config, const char *config_name,
               HfImportSummary *summary);

#endif
