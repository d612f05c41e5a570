#!/usr/bin/env python3
"""tests/reference/make_convert_fixtures.py — Hugging Face model directories for `fathom
convert` (DESIGN 5) and the logits transformers computes from them.

Builds two small random models with Hugging Face transformers, saves each with
`save_pretrained` (safetensors) in two variants, and writes per variant one directory
tests/fixtures/hf/<name>/:

    config.json, model.safetensors                        (single file)
    or config.json, model-0000K-of-0000N.safetensors,
       model.safetensors.index.json                       (sharded, max_shard_size)
    fathom.yaml    the fathom config of the same network (model, train, eval, data, device);
                   no residual section, so a test may append one
    windows.h5     /tokens: N windows of T+1 tokens as one token shard (DESIGN 4: uint32,
                   attributes vocab_size, eot_id, tokenizer), read by `fathom eval --data`;
                   /logits [N, T, V] float32: transformers' logits of each window's first T
                   tokens, with the saved weights loaded back in float32 (bf16 files are
                   widened exactly), eager attention

    llama3_bf16_sharded  LlamaForCausalLM, llama3 RoPE scaling, untied lm_head, bf16, 2+ files
    llama3_f32           the same weights, float32, one file
    qwen3_f32_sharded    Qwen3ForCausalLM, q/k norms, head_dim != d/heads, tied, float32, 2+ files
    qwen3_bf16           the same weights, bfloat16, one file

The C tests (tests/test_convert.c) need neither torch nor transformers. Rerun (about 10 s):
    python3 tests/reference/make_convert_fixtures.py
The output is deterministic (fixed seeds, one torch thread, no HDF5 timestamps).
"""

import json
import os
import shutil

import h5py
import numpy as np
import torch
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "hf")
WINDOWS = 2
SEQ_LEN = 16
MATRIX_STD = 0.1   # larger than DESIGN 2's 0.02, so logits are far from uniform
NORM_JITTER = 0.1  # norm weights 1 + 0.1 N(0, 1)

LLAMA = dict(family="llama", seed=20241101, vocab_size=256, d_model=64, n_layers=2, n_heads=4,
             n_kv_heads=2, head_dim=16, ffn_dim=128, rope_theta=500000.0, norm_eps=1e-5,
             tie=False, scaling=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                     original_max_position=64))
QWEN3 = dict(family="qwen3", seed=20241102, vocab_size=256, d_model=64, n_layers=2, n_heads=4,
             n_kv_heads=2, head_dim=24, ffn_dim=128, rope_theta=1000000.0, norm_eps=1e-6,
             tie=True, scaling=None)
VARIANTS = (
    ("llama3_bf16_sharded", LLAMA, torch.bfloat16, "40KB"),
    ("llama3_f32", LLAMA, torch.float32, None),
    ("qwen3_f32_sharded", QWEN3, torch.float32, "100KB"),
    ("qwen3_bf16", QWEN3, torch.bfloat16, None),
)


def hf_model(spec):
    rope = {"rope_type": "default", "rope_theta": spec["rope_theta"]}
    if spec["scaling"]:
        s = spec["scaling"]
        rope.update(rope_type="llama3", factor=s["factor"], low_freq_factor=s["low_freq_factor"],
                    high_freq_factor=s["high_freq_factor"],
                    original_max_position_embeddings=s["original_max_position"])
    common = dict(vocab_size=spec["vocab_size"], hidden_size=spec["d_model"],
                  intermediate_size=spec["ffn_dim"], num_hidden_layers=spec["n_layers"],
                  num_attention_heads=spec["n_heads"], num_key_value_heads=spec["n_kv_heads"],
                  head_dim=spec["head_dim"], hidden_act="silu", max_position_embeddings=128,
                  rms_norm_eps=spec["norm_eps"], tie_word_embeddings=spec["tie"],
                  rope_parameters=rope, attention_bias=False, attention_dropout=0.0,
                  use_cache=False)
    if spec["family"] == "llama":
        model = LlamaForCausalLM(LlamaConfig(mlp_bias=False, **common))
    else:
        model = Qwen3ForCausalLM(Qwen3Config(use_sliding_window=False, **common))
    rng = np.random.default_rng(spec["seed"])
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = rng.standard_normal(tuple(parameter.shape), dtype=np.float32)
            values = (1 + NORM_JITTER * noise if name.endswith("norm.weight")
                      else MATRIX_STD * noise).astype(np.float32)
            parameter.copy_(torch.from_numpy(values))
    return model


def fathom_yaml(spec):
    if spec["scaling"]:
        s = spec["scaling"]
        rope = (f"{{type: llama3, factor: {s['factor']:g}, low_freq_factor: "
                f"{s['low_freq_factor']:g}, high_freq_factor: {s['high_freq_factor']:g}, "
                f"original_max_position: {s['original_max_position']}}}")
    else:
        rope = "{type: none}"
    flag = {True: "true", False: "false"}
    return (
        "# the network of config.json beside this file (tests/reference/make_convert_fixtures.py)\n"
        "model:\n"
        f"  vocab_size: {spec['vocab_size']}\n  d_model: {spec['d_model']}\n"
        f"  n_layers: {spec['n_layers']}\n  n_heads: {spec['n_heads']}\n"
        f"  n_kv_heads: {spec['n_kv_heads']}\n  head_dim: {spec['head_dim']}\n"
        f"  ffn_dim: {spec['ffn_dim']}\n  rope_theta: {spec['rope_theta']:.1f}\n"
        f"  rope_scaling: {rope}\n  norm_eps: {spec['norm_eps']:.1e}\n"
        f"  qk_norm: {flag[spec['family'] == 'qwen3']}\n  tie_embeddings: {flag[spec['tie']]}\n"
        f"train: {{steps: 2, seq_len: {SEQ_LEN}, microbatch_size: {WINDOWS}, "
        f"global_batch_size: {WINDOWS}}}\n"
        f"eval: {{every: 0, samples: {WINDOWS}}}\n"
        "log: {every: 1}\n"
        "device: cpu\n"
    )


def write_windows(path, tokens, logits, vocab_size):
    with h5py.File(path, "w", libver="earliest", track_order=False) as file:
        file.create_dataset("tokens", data=tokens.reshape(-1).astype(np.uint32),
                            track_times=False)
        file.create_dataset("logits", data=logits.astype(np.float32), track_times=False)
        file.attrs["vocab_size"] = np.int64(vocab_size)
        file.attrs["eot_id"] = np.int64(0)
        file.attrs["tokenizer"] = "random tokens"


def make(name, spec, dtype, shard_size):
    directory = os.path.join(OUT_DIR, name)
    shutil.rmtree(directory, ignore_errors=True)
    model = hf_model(spec).to(dtype)
    if shard_size:
        model.save_pretrained(directory, max_shard_size=shard_size)
    else:
        model.save_pretrained(directory)
    files = sorted(os.listdir(directory))
    sharded = "model.safetensors.index.json" in files
    assert sharded == bool(shard_size), files
    if sharded:
        with open(os.path.join(directory, "model.safetensors.index.json")) as f:
            assert len(set(json.load(f)["weight_map"].values())) >= 2, "expected 2+ shards"
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    assert config["model_type"] == ("llama" if spec["family"] == "llama" else "qwen3")
    assert "rope_parameters" in config, "transformers 5 writes rope_parameters"
    if os.path.exists(os.path.join(directory, "generation_config.json")):
        os.remove(os.path.join(directory, "generation_config.json"))

    # the oracle: the saved files loaded back by transformers itself, in float32
    loaded = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                                  attn_implementation="eager")
    loaded.eval()
    names = {n for n, _ in loaded.named_parameters()}
    assert ("lm_head.weight" in names) == (not spec["tie"])
    rng = np.random.default_rng(spec["seed"] + 1)
    tokens = rng.integers(1, spec["vocab_size"], size=(WINDOWS, SEQ_LEN + 1), dtype=np.int64)
    with torch.no_grad():
        logits = loaded(input_ids=torch.from_numpy(tokens[:, :SEQ_LEN])).logits.numpy()
    assert logits.shape == (WINDOWS, SEQ_LEN, spec["vocab_size"])
    assert logits.std() > 0.3, "logits too close to uniform to test anything"
    write_windows(os.path.join(directory, "windows.h5"), tokens, logits, spec["vocab_size"])
    with open(os.path.join(directory, "fathom.yaml"), "w") as f:
        f.write(fathom_yaml(spec))
    size = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory))
    print(f"{name}: {len(files)} files from save_pretrained, {size / 1e3:.0f} kB, "
          f"logits std {logits.std():.2f}")


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    for name, spec, dtype, shard_size in VARIANTS:
        make(name, spec, dtype, shard_size)


if __name__ == "__main__":
    main()
