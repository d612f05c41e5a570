#!/usr/bin/env python3
"""tests/reference/make_fixtures.py — Hugging Face oracle fixtures for the model tests (DESIGN 7).

Builds small random models with Hugging Face transformers (the implementation nobody here
wrote), runs them in float64 on one fixed batch and writes, per model, one HDF5 file:

    tests/fixtures/llama_tiny.h5   LlamaForCausalLM, llama3 RoPE scaling, untied head
    tests/fixtures/qwen3_tiny.h5   Qwen3ForCausalLM, q/k norms, head_dim != d/heads, tied head
    tests/fixtures/llama_gpu.h5    as llama_tiny at head_dim 64 (a head_dim the cuda
                                   attention runs: 64, 80 or 128)
    tests/fixtures/qwen3_gpu.h5    as qwen3_tiny at head_dim 128

File format (the C tests read exactly this):
    attrs  config  fathom YAML (DESIGN 6 keys) describing the same network and optimizer
           family  "llama" | "qwen3"
    /tokens           [B, T+1] uint32   inputs tokens[:, :T], targets tokens[:, 1:]
    /weights/<name>   float32           every parameter, DESIGN 2.3 / Hugging Face names
    /logits           [B, T, V] float64
    /loss /ce /zloss  scalars float64   loss = ce + zloss, means over the B*T tokens of
                                        ce_t and z_loss * lse_t^2, lse_t = logsumexp(logits_t)
    /grads/<name>     float64           d loss / d weight (tied: under model.embed_tokens.weight)
    /adamw/losses     [4] float64       loss at the initial weights and after each of 3
                                        torch.optim.AdamW steps on the same batch

Precision: Hugging Face's RMSNorm, attention softmax and RoPE tables cast to float32 even when
the model is float64. For a float64 oracle (and a finite-difference check that means
something) those casts are redirected to float64 while the model is built and run (see
float64_everywhere); the script checks that this changes the logits by float32 rounding only.

Run from anywhere:  python3 tests/reference/make_fixtures.py [STEM ...]
(deterministic: same bytes). With stems (llama_tiny, qwen3_tiny, llama_gpu, qwen3_gpu) it
makes only those files; without, all of them.
"""

import contextlib
import hashlib
import math
import os
import shutil
import subprocess
import sys
import types

import h5py
import numpy as np
import torch
import transformers
import yaml
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers import modeling_rope_utils
from transformers.models.llama import modeling_llama
from transformers.models.qwen3 import modeling_qwen3

FIXTURE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")

BATCH = 2
SEQ_LEN = 16
Z_LOSS = 1e-4
ADAMW_STEPS = 3
LR = 1e-2  # the tiny fixtures'; a spec's "lr" key overrides it
BETAS = (0.9, 0.95)
ADAM_EPS = 1e-8
WEIGHT_DECAY = 0.1
GRAD_CLIP = 1.0

# The relative tolerance of the C tests on /adamw/losses (tests/test_model_reference.c).
FLOAT32_ADAMW_BOUND = 1e-5

# Larger than the 0.02 of DESIGN 2 so that attention is far from uniform and every gradient
# is well above float32 rounding of the logits (the C tests compare fp32 against these).
MATRIX_STD = 0.1
NORM_JITTER = 0.1  # norm weights are 1 + 0.1 * N(0, 1): their gradients then matter

LLAMA = dict(
    stem="llama_tiny", family="llama", seed=20240601,
    vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
    ffn_dim=160, rope_theta=500000.0, norm_eps=1e-5, qk_norm=False, tie_embeddings=False,
    rope_scaling=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position=64),
    max_position=64,
)
QWEN3 = dict(
    stem="qwen3_tiny", family="qwen3", seed=20240602,
    vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=24,
    ffn_dim=160, rope_theta=1000000.0, norm_eps=1e-6, qk_norm=True, tie_embeddings=True,
    rope_scaling=None,
    max_position=64,
)
# The same families at head dims the cuda attention supports (64, 80, 128), so that one
# fixture runs on every backend. Sizes keep each file under 4 MB (float64 gradients are two
# thirds of it); qwen3_gpu's ffn_dim 96 (< d) is what keeps it there at head_dim 128.
# Smaller lr than the tiny fixtures: with 3-5x their parameters, lr 1e-2 takes the loss from
# 5.1 to 0.7 in three steps, and on that path a float32 run drifts from the float64 losses by
# up to 2e-5 (check_adamw_float32_drift). llama_gpu 1e-3 and qwen3_gpu 2e-3 keep the drift
# below 1e-6 (over six seeds) while every mistake of check_adamw_sensitivity still shows.
LLAMA_GPU = dict(
    LLAMA, stem="llama_gpu", seed=20240603,
    d_model=128, n_heads=2, n_kv_heads=1, head_dim=64, ffn_dim=256, lr=1e-3,
)
QWEN3_GPU = dict(
    QWEN3, stem="qwen3_gpu", seed=20240604,
    d_model=128, n_heads=2, n_kv_heads=1, head_dim=128, ffn_dim=96, lr=2e-3,
)
SPECS = (LLAMA, QWEN3, LLAMA_GPU, QWEN3_GPU)


def hf_config(spec):
    """The Hugging Face config of `spec`. transformers 5.x spells RoPE as `rope_parameters`
    (rope_theta and the scaling keys together); the 4.x `rope_scaling` key is gone."""
    rope = {"rope_type": "default", "rope_theta": spec["rope_theta"]}
    if spec["rope_scaling"] is not None:
        scaling = spec["rope_scaling"]
        rope.update(rope_type="llama3", factor=scaling["factor"],
                    low_freq_factor=scaling["low_freq_factor"],
                    high_freq_factor=scaling["high_freq_factor"],
                    original_max_position_embeddings=scaling["original_max_position"])
    common = dict(
        vocab_size=spec["vocab_size"], hidden_size=spec["d_model"],
        intermediate_size=spec["ffn_dim"], num_hidden_layers=spec["n_layers"],
        num_attention_heads=spec["n_heads"], num_key_value_heads=spec["n_kv_heads"],
        head_dim=spec["head_dim"], hidden_act="silu",
        max_position_embeddings=spec["max_position"], rms_norm_eps=spec["norm_eps"],
        tie_word_embeddings=spec["tie_embeddings"], rope_parameters=rope,
        attention_bias=False, attention_dropout=0.0, use_cache=False,
    )
    if spec["family"] == "llama":
        config = LlamaConfig(mlp_bias=False, pretraining_tp=1, **common)
    else:
        config = Qwen3Config(use_sliding_window=False, **common)
    config._attn_implementation = "eager"
    return config


def yaml_exponent(value):
    """1e-05 -> 1.0e-5: the spelling of DESIGN's examples."""
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def model_yaml(spec):
    """The `model` section of a fathom config (DESIGN 6) for a spec with the keys of LLAMA."""
    if spec["rope_scaling"] is None:
        rope = "{type: none}"
    else:
        s = spec["rope_scaling"]
        rope = (f"{{type: llama3, factor: {s['factor']:g}, low_freq_factor: "
                f"{s['low_freq_factor']:g}, high_freq_factor: {s['high_freq_factor']:g}, "
                f"original_max_position: {s['original_max_position']}}}")
    yes_no = {True: "true", False: "false"}
    return (
        "model:\n"
        f"  vocab_size: {spec['vocab_size']}\n"
        f"  d_model: {spec['d_model']}\n"
        f"  n_layers: {spec['n_layers']}\n"
        f"  n_heads: {spec['n_heads']}\n"
        f"  n_kv_heads: {spec['n_kv_heads']}\n"
        f"  head_dim: {spec['head_dim']}\n"
        f"  ffn_dim: {spec['ffn_dim']}\n"
        f"  rope_theta: {spec['rope_theta']:.0f}\n"
        f"  rope_scaling: {rope}\n"
        f"  norm_eps: {yaml_exponent(spec['norm_eps'])}\n"
        f"  qk_norm: {yes_no[spec['qk_norm']]}\n"
        f"  tie_embeddings: {yes_no[spec['tie_embeddings']]}\n"
    )


def train_yaml(seq_len, batch, z_loss):
    """The `train` section: one microbatch of `batch` sequences makes the global batch."""
    return (f"train: {{seq_len: {seq_len}, microbatch_size: {batch}, global_batch_size: {batch}, "
            f"z_loss: {yaml_exponent(z_loss)}}}\n")


def spec_lr(spec):
    """The AdamW learning rate of a spec: its own "lr", else LR."""
    return spec.get("lr", LR)


def fathom_yaml(spec):
    """The same network and optimizer as a fathom config (DESIGN 6)."""
    optim = (
        f"optim: {{lr: {yaml_exponent(spec_lr(spec))}, schedule: constant, warmup_steps: 0, "
        f"beta1: {BETAS[0]}, beta2: {BETAS[1]}, eps: {yaml_exponent(ADAM_EPS)},\n"
        f"        weight_decay: {WEIGHT_DECAY}, no_decay: [embeddings, norms, biases, routing], "
        f"grad_clip: {GRAD_CLIP}}}\n"
    )
    return model_yaml(spec) + train_yaml(SEQ_LEN, BATCH, Z_LOSS) + optim


def check_config_text(text, config, lr):
    """The fathom YAML names the network Hugging Face built and the optimizer run here."""
    parsed = yaml.safe_load(text)
    model, train, optim = parsed["model"], parsed["train"], parsed["optim"]
    assert set(parsed) == {"model", "train", "optim"}
    assert model["vocab_size"] == config.vocab_size and model["d_model"] == config.hidden_size
    assert model["n_layers"] == config.num_hidden_layers
    assert model["n_heads"] == config.num_attention_heads
    assert model["n_kv_heads"] == config.num_key_value_heads
    assert model["head_dim"] == config.head_dim and model["ffn_dim"] == config.intermediate_size
    assert model["norm_eps"] == config.rms_norm_eps
    assert model["tie_embeddings"] == config.tie_word_embeddings
    assert model["qk_norm"] == (config.model_type == "qwen3")  # Qwen3 always has q/k norms
    rope = config.rope_parameters
    assert model["rope_theta"] == rope["rope_theta"]
    scaling = model["rope_scaling"]
    if scaling["type"] == "none":
        assert rope["rope_type"] == "default"
    else:
        assert scaling["type"] == rope["rope_type"] == "llama3"
        for key in ("factor", "low_freq_factor", "high_freq_factor"):
            assert scaling[key] == rope[key], key
        assert scaling["original_max_position"] == rope["original_max_position_embeddings"]
    assert train == dict(seq_len=SEQ_LEN, microbatch_size=BATCH, global_batch_size=BATCH,
                         z_loss=Z_LOSS)
    assert (optim["lr"], optim["beta1"], optim["beta2"], optim["eps"]) == (lr, *BETAS, ADAM_EPS)
    assert (optim["weight_decay"], optim["grad_clip"]) == (WEIGHT_DECAY, GRAD_CLIP)
    assert optim["schedule"] == "constant" and optim["warmup_steps"] == 0


@contextlib.contextmanager
def float64_everywhere():
    """Makes Hugging Face's explicit float32 upcasts (RMSNorm statistics, attention softmax,
    RoPE frequencies and tables) float64 instead: the modules see a `torch` whose float32 is
    float64. Only the precision changes; every operation stays Hugging Face's own."""
    proxy = types.ModuleType("torch_float64")
    proxy.__getattr__ = lambda name: getattr(torch, name)
    proxy.float32 = torch.float64
    proxy.float = torch.float64
    modules = (modeling_llama, modeling_qwen3, modeling_rope_utils)
    saved = [module.torch for module in modules]
    for module in modules:
        module.torch = proxy
    try:
        yield
    finally:
        for module, original in zip(modules, saved):
            module.torch = original


def build_model(spec):
    config = hf_config(spec)
    cls = LlamaForCausalLM if spec["family"] == "llama" else Qwen3ForCausalLM
    model = cls(config).double()
    model.train()  # no dropout anywhere (attention_dropout = 0), so train == eval
    return model


def draw_weights(model, spec):
    """Float32 values for every parameter, seeded. Names are Hugging Face's = DESIGN 2.3."""
    rng = np.random.default_rng(spec["seed"])
    weights = {}
    for name, parameter in model.named_parameters():
        shape = tuple(parameter.shape)
        noise = rng.standard_normal(shape, dtype=np.float32)
        if name.endswith("norm.weight"):  # input/post-attention/final/q/k norms
            values = np.float32(1) + np.float32(NORM_JITTER) * noise
        else:
            values = np.float32(MATRIX_STD) * noise
        weights[name] = values
    return weights


def load_weights(model, weights):
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(torch.from_numpy(weights[name]).double())


def check_structure(model, spec, weights):
    """The model is the one the spec and the fixture format describe."""
    d, hd = spec["d_model"], spec["head_dim"]
    layer = model.model.layers[0].self_attn
    assert tuple(layer.q_proj.weight.shape) == (spec["n_heads"] * hd, d)
    assert tuple(layer.k_proj.weight.shape) == (spec["n_kv_heads"] * hd, d)
    assert hasattr(layer, "q_norm") == spec["qk_norm"]
    assert all(not n.endswith(".bias") for n in weights), "no parameter may be a bias"
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    assert tied == spec["tie_embeddings"]
    assert ("lm_head.weight" in weights) == (not spec["tie_embeddings"])
    assert model.config._attn_implementation == "eager"
    if spec["family"] == "qwen3":
        assert model.config.sliding_window is None
        assert all(t == "full_attention" for t in model.config.layer_types)
    # RoPE: llama3 scaling must really change frequencies, none must leave them alone.
    rotary = model.model.rotary_emb
    plain = 1.0 / spec["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    scaled = rotary.inv_freq.to(torch.float64)
    changed = int((~torch.isclose(scaled, plain, rtol=1e-12, atol=0)).sum())
    if spec["rope_scaling"] is None:
        assert changed == 0, "unscaled RoPE must use the plain inverse frequencies"
    else:
        assert changed > 0, "llama3 scaling left every inverse frequency unchanged"
        print(f"  llama3 scaling changes {changed} of {hd // 2} inverse frequencies")


def loss_terms(logits, tokens):
    """loss, ce, zloss as scalars: means over B*T tokens of ce_t and Z_LOSS * lse_t^2."""
    targets = tokens[:, 1:]
    lse = torch.logsumexp(logits, dim=-1)
    target_logit = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)
    ce = (lse - target_logit).mean()
    zloss = (Z_LOSS * lse * lse).mean()
    return ce + zloss, ce, zloss


def forward_loss(model, tokens):
    logits = model(input_ids=tokens[:, :SEQ_LEN], use_cache=False).logits
    loss, ce, zloss = loss_terms(logits, tokens)
    return logits, loss, ce, zloss


def check_finite_difference(model, tokens, grads, probes):
    """Central differences in float64 for a few single weights: catches a loss or a gradient
    that is not d loss / d weight."""
    params = dict(model.named_parameters())
    step = 1e-6
    for name, index in probes:
        parameter = params[name]
        with torch.no_grad():
            original = parameter[index].item()
            parameter[index] = original + step
            plus = forward_loss(model, tokens)[1].item()
            parameter[index] = original - step
            minus = forward_loss(model, tokens)[1].item()
            parameter[index] = original
        numeric = (plus - minus) / (2 * step)
        analytic = float(grads[name][index])
        error = abs(numeric - analytic) / max(abs(analytic), 1e-12)
        print(f"  finite difference {name}{list(index)}: analytic {analytic:+.9e} "
              f"numeric {numeric:+.9e} rel {error:.1e}")
        assert error < 1e-6, f"gradient of {name}{index} disagrees with finite difference"


def param_groups(model, decay_everything=False, weight_decay=WEIGHT_DECAY):
    """Decay only matrices other than the embedding and the head (DESIGN 6 no_decay:
    embeddings, norms, biases). `decay_everything` is the mistake the fixture must expose."""
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        embedding = name in ("model.embed_tokens.weight", "lm_head.weight")
        matrix = parameter.dim() == 2 and not embedding
        (decay if matrix or decay_everything else no_decay).append(parameter)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def run_adamw(model, tokens, lr, grad_clip=GRAD_CLIP, decay_everything=False,
              weight_decay=WEIGHT_DECAY, verbose=False):
    """Losses at the initial weights and after each AdamW step, and the pre-clip norms."""
    groups = param_groups(model, decay_everything, weight_decay)
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=BETAS, eps=ADAM_EPS, foreach=False)
    losses, norms = [], []
    for step in range(ADAMW_STEPS):
        optimizer.zero_grad(set_to_none=True)
        loss = forward_loss(model, tokens)[1]
        losses.append(loss.item())
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(list(model.parameters()), grad_clip).item()
        norms.append(norm)
        if verbose:
            print(f"  adamw step {step}: loss {losses[-1]:.12f} grad_norm {norm:.6f} "
                  f"({'clipped' if norm > grad_clip else 'not clipped'})")
        optimizer.step()
    with torch.no_grad():
        losses.append(forward_loss(model, tokens)[1].item())
    if verbose:
        print(f"  adamw after {ADAMW_STEPS} steps: loss {losses[-1]:.12f}")
    return np.array(losses, dtype=np.float64), norms


def check_adamw_sensitivity(spec, weights, tokens, losses, norms):
    """The AdamW losses must be able to fail: clipping has to engage, and forgetting it,
    decaying the embeddings and norms too, or not decaying at all has to move the final loss
    well beyond float32 rounding. (Clipping by the same factor every step would be invisible
    to Adam: the pre-clip norms differ from step to step here.)"""
    assert any(n > GRAD_CLIP for n in norms), "grad_clip never engaged"
    assert losses[-1] < losses[0], "AdamW did not lower the loss on its own batch"
    mistakes = (("without clipping", dict(grad_clip=math.inf), 1e-3),
                ("decaying every parameter", dict(decay_everything=True), 1e-3),
                ("without weight decay", dict(weight_decay=0.0), 5e-5))
    for label, options, least_change in mistakes:
        with float64_everywhere():
            model = build_model(spec)
            load_weights(model, weights)
            other = run_adamw(model, tokens, spec_lr(spec), **options)[0]
        change = abs(other[-1] - losses[-1]) / losses[-1]
        print(f"  {label}, the final loss moves by {change:.1e} (relative)")
        assert change > least_change, f"the AdamW losses cannot tell {label} apart"


def check_adamw_float32_drift(spec, weights, tokens, losses):
    """The C tests run AdamW in float32 and compare each loss of /adamw/losses to relative
    FLOAT32_ADAMW_BOUND: the stock Hugging Face model in float32 (torch's own float32
    kernels) must stay within that bound over the same steps, or the fixture asks for more
    than float32 can give (Adam's first steps turn a gradient's float32 rounding into a
    full-size step where the gradient is near zero, and a steep loss amplifies it)."""
    model = build_model(spec).float()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(torch.from_numpy(weights[name]))
    float32_losses = run_adamw(model, tokens, spec_lr(spec))[0]
    drift = float(np.max(np.abs(float32_losses - losses) / np.abs(losses)))
    print(f"  float32 AdamW losses drift by {drift:.1e} (relative, worst step)")
    assert drift < FLOAT32_ADAMW_BOUND, "the AdamW losses are beyond float32's reach"


def write_fixture(path, family, content):
    """One file in the fixture format; /adamw only when content has "adamw_losses". Plain
    contiguous datasets (random values do not compress), the oldest file format (the C side
    links HDF5 1.10), no timestamps (reruns give the same bytes)."""
    with h5py.File(path, "w", libver="earliest") as f:
        f.attrs["config"] = content["config"]
        f.attrs["family"] = family
        options = dict(track_times=False)
        f.create_dataset("tokens", data=content["tokens"], **options)
        for group in ("weights", "grads"):
            g = f.create_group(group)
            for name in sorted(content[group]):
                g.create_dataset(name, data=content[group][name], **options)
        f.create_dataset("logits", data=content["logits"], **options)
        for scalar in ("loss", "ce", "zloss"):
            f.create_dataset(scalar, data=np.float64(content[scalar]), **options)
        if "adamw_losses" in content:
            f.create_group("adamw").create_dataset("losses", data=content["adamw_losses"],
                                                   **options)


def check_readable_by_system_hdf5(path):
    """The C tests link the system HDF5, older than h5py's own: h5dump (when installed) must
    read every object."""
    h5dump = shutil.which("h5dump")
    if h5dump is None:
        print("  h5dump not found: the system HDF5 read-back is skipped")
        return
    result = subprocess.run([h5dump, "-H", "-A", path], capture_output=True, text=True)
    assert result.returncode == 0, f"h5dump cannot read {path}: {result.stderr}"


def check_round_trip(path, family, content, logits_shape, z_loss):
    """Reads the file back and compares everything bit for bit (and that it holds nothing
    else); recomputes the loss from the stored logits in numpy. logits_shape is [B, T, V]."""
    batch, seq_len, _ = logits_shape
    with h5py.File(path, "r") as f:
        assert f.attrs["config"] == content["config"] and f.attrs["family"] == family
        keys = ["ce", "grads", "logits", "loss", "tokens", "weights", "zloss"]
        assert sorted(f.keys()) == sorted(keys + (["adamw"] if "adamw_losses" in content else []))
        tokens = f["tokens"][...]
        assert tokens.dtype == np.uint32 and tokens.shape == (batch, seq_len + 1)
        assert np.array_equal(tokens, content["tokens"])
        for group, dtype in (("weights", np.float32), ("grads", np.float64)):
            assert sorted(f[group].keys()) == sorted(content[group])
            for name, values in content[group].items():
                stored = f[group][name][...]
                assert stored.dtype == dtype and np.array_equal(stored, values), name
        logits = f["logits"][...]
        assert logits.dtype == np.float64 and logits.shape == tuple(logits_shape)
        assert np.array_equal(logits, content["logits"])
        for scalar in ("loss", "ce", "zloss"):
            assert f[scalar].shape == () and f[scalar][()] == content[scalar]
        if "adamw_losses" in content:
            assert np.array_equal(f["adamw/losses"][...], content["adamw_losses"])
        loss, ce, zloss = f["loss"][()], f["ce"][()], f["zloss"][()]

    peak = logits.max(axis=-1, keepdims=True)
    lse = (peak + np.log(np.exp(logits - peak).sum(axis=-1, keepdims=True)))[..., 0]
    target = np.take_along_axis(logits, tokens[:, 1:, None].astype(np.int64), -1)[..., 0]
    ce_numpy = (lse - target).mean()
    zloss_numpy = (z_loss * lse * lse).mean()
    assert math.isclose(ce_numpy, ce, rel_tol=1e-13)
    assert math.isclose(zloss_numpy, zloss, rel_tol=1e-13)
    assert math.isclose(ce_numpy + zloss_numpy, loss, rel_tol=1e-13)


def write_checked_fixture(path, family, content, logits_shape, z_loss):
    """write_fixture, then reads the file back (check_round_trip, the system h5dump) and
    prints its size and digest."""
    write_fixture(path, family, content)
    check_round_trip(path, family, content, logits_shape, z_loss)
    check_readable_by_system_hdf5(path)
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    print(f"  wrote {path} ({os.path.getsize(path)} bytes, sha256 {digest[:16]})")


def make_torch_deterministic():
    """One torch thread (one reduction order) and deterministic kernels, so reruns give the
    same bits; prints the versions that made the files."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"h5py {h5py.__version__}, numpy {np.__version__}")


def make_fixture(spec):
    print(f"{spec['stem']}:")
    torch.manual_seed(spec["seed"])  # Hugging Face's own init; every value is replaced below
    stock = build_model(spec)
    with float64_everywhere():
        model = build_model(spec)
    weights = draw_weights(model, spec)
    load_weights(model, weights)
    load_weights(stock, weights)
    check_structure(model, spec, weights)

    rng = np.random.default_rng(spec["seed"] + 1)
    tokens_np = rng.integers(0, spec["vocab_size"], size=(BATCH, SEQ_LEN + 1)).astype(np.uint32)
    tokens = torch.from_numpy(tokens_np.astype(np.int64))

    with float64_everywhere():
        logits, loss, ce, zloss = forward_loss(model, tokens)
        loss.backward()
    with torch.no_grad():
        stock_logits = forward_loss(stock, tokens)[0]
    upcast_effect = (stock_logits - logits).abs().max().item()
    print(f"  loss {loss.item():.12f} ce {ce.item():.12f} zloss {zloss.item():.3e}; "
          f"|logits| max {logits.abs().max().item():.3f}; "
          f"stock float32 upcasts change logits by {upcast_effect:.1e}")
    assert 0 < upcast_effect < 1e-5, "float64_everywhere changed more than rounding"

    grads = {name: p.grad.detach().numpy().copy() for name, p in model.named_parameters()}
    for name, g in sorted(grads.items()):
        assert np.linalg.norm(g) > 1e-4, f"gradient of {name} is negligible"
    probes = [("model.layers.0.self_attn.q_proj.weight", (5, 7)),
              ("model.layers.1.input_layernorm.weight", (3,)),
              ("model.embed_tokens.weight", (int(tokens_np[0, 4]), 11))]
    if spec["qk_norm"]:
        probes.append(("model.layers.0.self_attn.k_norm.weight", (2,)))
    with float64_everywhere():
        check_finite_difference(model, tokens, grads, probes)
        model.zero_grad(set_to_none=True)
        adamw_losses, norms = run_adamw(model, tokens, spec_lr(spec), verbose=True)
    assert adamw_losses[0] == loss.item()
    check_adamw_sensitivity(spec, weights, tokens, adamw_losses, norms)
    check_adamw_float32_drift(spec, weights, tokens, adamw_losses)

    check_config_text(fathom_yaml(spec), model.config, spec_lr(spec))
    content = dict(config=fathom_yaml(spec), tokens=tokens_np, weights=weights,
                   logits=logits.detach().numpy().copy(), loss=loss.item(), ce=ce.item(),
                   zloss=zloss.item(), grads=grads, adamw_losses=adamw_losses)
    path = os.path.normpath(os.path.join(FIXTURE_DIR, f"{spec['stem']}.h5"))
    write_checked_fixture(path, spec["family"], content, (BATCH, SEQ_LEN, spec["vocab_size"]),
                          Z_LOSS)


def main(stems):
    """Makes the fixtures named by `stems`, or all of them when none is named."""
    known = {spec["stem"]: spec for spec in SPECS}
    unknown = [stem for stem in stems if stem not in known]
    if unknown:
        print(f"unknown fixture {', '.join(unknown)}; known: {', '.join(known)}",
              file=sys.stderr)
        return 2
    make_torch_deterministic()
    os.makedirs(FIXTURE_DIR, exist_ok=True)
    for spec in SPECS:
        if not stems or spec["stem"] in stems:
            make_fixture(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
