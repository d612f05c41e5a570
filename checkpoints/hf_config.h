/* checkpoints/hf_config.h — a Hugging Face config.json against the model section of a fathom
 * config (DESIGN 5, 6).
 *
 * hf_config_check reads <hf_dir>/config.json (missing or malformed: exit 3) and compares it
 * with `model`: vocab_size, hidden_size (d_model), num_hidden_layers, num_attention_heads,
 * num_key_value_heads (default num_attention_heads), head_dim (default hidden_size /
 * num_attention_heads), intermediate_size (ffn_dim), rms_norm_eps (norm_eps),
 * tie_word_embeddings (default false), rope_theta and the RoPE scaling (rope_scaling with
 * rope_type or type, or transformers 5's rope_parameters with rope_theta inside; "default"
 * or absent: none; llama3: factor, low_freq_factor, high_freq_factor,
 * original_max_position_embeddings). model_type must be llama (qk_norm false) or qwen3
 * (qk_norm true). What fathom cannot represent (attention_bias, mlp_bias, an activation
 * other than silu, a sliding window, another RoPE type) is refused. Floats agree within
 * 1e-6 relative (exporters write float32 values such as 9.999999747378752e-06). The first
 * disagreement exits 2 naming the config.json key, its value and the fathom key's.
 */
#ifndef FATHOM_CHECKPOINTS_HF_CONFIG_H
#define FATHOM_CHECKPOINTS_HF_CONFIG_H

#include "runtime/config.h"

/* `config_name` names the fathom config in messages (its path). */
void hf_config_check(const char *hf_dir, const ModelConfig *model, const char *config_name);

#endif
