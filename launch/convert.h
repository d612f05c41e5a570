/* launch/convert.h — `fathom convert --from-hf DIR --config CONFIG.yaml --to RUN_DIR`
 * (DESIGN 5, 6).
 *
 * Imports a Hugging Face Llama-3 or Qwen3 model (DIR: config.json and model.safetensors, or
 * model.safetensors.index.json and its files) as the step-0 checkpoint of a new run in
 * RUN_DIR for the network of CONFIG.yaml (checkpoints/hf_import.h): /model only, fresh
 * routing weights, the config resolved (run_dir = RUN_DIR) saved in it and in
 * RUN_DIR/config.yaml. `fathom train CONFIG.yaml --set run_dir=RUN_DIR` then continues from
 * step 0 with zero AdamW moments and the EMA at the weights. A RUN_DIR that already holds a
 * checkpoint is refused (exit 2). Exit codes: 2 usage or a config.json that disagrees with
 * CONFIG.yaml, 3 a missing or malformed file or tensor.
 */
#ifndef FATHOM_LAUNCH_CONVERT_H
#define FATHOM_LAUNCH_CONVERT_H

int convert_main(int argc, char **argv);

#endif
