"""launch/bench/make_hf_8b.py — a random-weight model of Llama-3.1-8B's shapes, written as a
Hugging Face directory (config.json, model-0000k-of-0000n.safetensors, the index), so that
`fathom convert --from-hf` runs at full size (launch/bench/convert_8b.sh).

    python3 launch/bench/make_hf_8b.py OUT_DIR

bf16 values N(0, 0.02), norms 1, drawn on the GPU from a fixed seed; shards of about 5 GB.
Needs torch and safetensors (the GPU machine has both).
"""
import json
import os
import sys
import time

import torch
from safetensors.torch import save_file

D, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 4096, 32, 32, 8, 128, 14336, 128256
SHARD_BYTES = 5 * 10**9


def tensors():
    """(name, shape, is_norm) in Hugging Face's order."""
    yield "model.embed_tokens.weight", (VOCAB, D), False
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        yield f"{p}.input_layernorm.weight", (D,), True
        yield f"{p}.self_attn.q_proj.weight", (HEADS * HEAD_DIM, D), False
        yield f"{p}.self_attn.k_proj.weight", (KV_HEADS * HEAD_DIM, D), False
        yield f"{p}.self_attn.v_proj.weight", (KV_HEADS * HEAD_DIM, D), False
        yield f"{p}.self_attn.o_proj.weight", (D, HEADS * HEAD_DIM), False
        yield f"{p}.post_attention_layernorm.weight", (D,), True
        yield f"{p}.mlp.gate_proj.weight", (FFN, D), False
        yield f"{p}.mlp.up_proj.weight", (FFN, D), False
        yield f"{p}.mlp.down_proj.weight", (D, FFN), False
    yield "model.norm.weight", (D,), True
    yield "lm_head.weight", (VOCAB, D), False


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": D, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "intermediate_size": FFN,
        "vocab_size": VOCAB, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False,
        "mlp_bias": False, "torch_dtype": "bfloat16", "max_position_embeddings": 131072,
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    generator = torch.Generator(device="cuda").manual_seed(8)
    started = time.time()
    shards, current, size, total = [], {}, 0, 0
    for name, shape, is_norm in tensors():
        if is_norm:
            value = torch.ones(shape, dtype=torch.bfloat16)
        else:
            value = (torch.randn(shape, generator=generator, device="cuda",
                                 dtype=torch.float32) * 0.02).to(torch.bfloat16).cpu()
        current[name] = value
        size += value.numel() * 2
        if size >= SHARD_BYTES:
            shards.append(current)
            total += size
            current, size = {}, 0
    if current:
        shards.append(current)
        total += size
    weight_map = {}
    for k, shard in enumerate(shards):
        file = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(out, file), metadata={"format": "pt"})
        weight_map.update({name: file for name in shard})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    print(f"make_hf_8b: {sum(v.numel() for s in shards for v in s.values()) / 1e9:.2f}B "
          f"parameters, {total / 1e9:.2f} GB in {len(shards)} shards, "
          f"{time.time() - started:.1f} s")


if __name__ == "__main__":
    main()
