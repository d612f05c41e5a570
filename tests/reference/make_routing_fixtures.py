#!/usr/bin/env python3
"""tests/reference/make_routing_fixtures.py — fixtures for the attention-over-depth model
tests (DESIGN 2.1, 2.2, 7), from the PyTorch reference in routing_reference.py.

Before it writes anything, the script checks the reference against what nobody here wrote and
against identities the math guarantees (it stops on the first failure):
  1. mode standard equals Hugging Face LlamaForCausalLM (and Qwen3ForCausalLM for qk_norm),
     float64, eager, same weights, on logits to 1e-12;
  2. the delta form with every alpha = 0 gives logits identical to standard (same base);
  3. full granularity equals the block forward with S = 1 sublayer per block (AttnRes and
     MSAR, both forms), and S = 2 differs from it;
  4. MSAR at init (conv identity, queries 0, key norms 1, mix_proj 0, mix_bias -ln(m-1))
     equals Block AttnRes at init (queries 0) on logits to 1e-12, and differs from it once
     the routing weights are random;
  5. one gradient element of every routing tensor kind (query, key_norm, alpha, null, conv
     tap, mix_bias, mix_proj) and one base weight match a float64 central difference.

Then, per residual configuration, one HDF5 file in the format of make_fixtures.py (see
README.md) without /adamw:
    attrs  config (fathom YAML with a residual section), family "routing"
    /tokens [B, T+1] uint32, /weights/<name> float32, /logits [B, T, V] float64,
    /loss /ce /zloss float64 scalars, /grads/<name> float64

Run from anywhere:  python3 tests/reference/make_routing_fixtures.py   (deterministic)
"""

import dataclasses
import os
import sys

import numpy as np
import torch
import yaml
from transformers import LlamaForCausalLM, Qwen3ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import (float64_everywhere, hf_config, make_torch_deterministic,  # noqa: E402
                           model_yaml, train_yaml, write_checked_fixture)
from routing_reference import ModelSpec, ResidualSpec, RoutingModel, loss_terms  # noqa: E402

FIXTURE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")

BATCH = 2
SEQ_LEN = 12
Z_LOSS = 1e-4
TINY = ModelSpec(vocab_size=64, d_model=48, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=12,
                 ffn_dim=96, rope_theta=10000.0, norm_eps=1e-5, qk_norm=False)

# Base weights as in make_fixtures.py; routing weights random (not at init) so that every
# routing gradient is meaningful.
MATRIX_STD = 0.1
NORM_JITTER = 0.1
ROUTE_STD = dict(query=0.5, key_norm=0.1, alpha=0.5, route_null=0.1, mix_bias=0.5,
                 mix_proj=0.3)
TAP0_JITTER = 0.1   # conv tap 0 = 1 + 0.1 N
TAP_STD = 0.3       # taps 1 .. k_r - 1; taps >= k_r stay exactly 0

FIXTURES = (
    ("route_attnres_full_replace", 20240701,
     ResidualSpec("attnres", heads=1, granularity="full", form="replace")),
    ("route_mhar_block_replace", 20240702,
     ResidualSpec("attnres", heads=4, granularity="block", layers_per_block=2,
                  form="replace")),
    ("route_mhar_block_delta", 20240703,
     ResidualSpec("attnres", heads=2, granularity="block", layers_per_block=2, form="delta")),
    ("route_attnres_full_delta", 20240704,
     ResidualSpec("attnres", heads=1, granularity="full", form="delta")),
    ("route_msar_block_replace", 20240705,
     ResidualSpec("msar", heads=2, granularity="block", layers_per_block=1, form="replace",
                  streams=2, stream_kernels=(1, 3))),
    # Seed 20240706 drew alpha = -3e-4 at one site, which left that site's query, key norm
    # and mix gradients near 4e-5; the next seed draws every |alpha| > 0.1.
    ("route_msar_block_delta", 20240707,
     ResidualSpec("msar", heads=4, granularity="block", layers_per_block=2, form="delta",
                  streams=4, stream_kernels=(1, 2, 4, 8))),
)


# ---- weights ------------------------------------------------------------------------------

def kind_of(name):
    """The routing tensor kind of a parameter name, or None for a base weight."""
    last = name.rsplit(".", 1)[-1]
    return last if last in ROUTE_STD or last == "conv" else None


def draw_weights(model, seed):
    """Float32 values for every parameter, seeded, in named_parameters order."""
    rng = np.random.default_rng(seed)
    kernels = model.residual.stream_kernels
    weights = {}
    for name, parameter in model.named_parameters():
        shape = tuple(parameter.shape)
        noise = rng.standard_normal(shape, dtype=np.float32)
        kind = kind_of(name)
        if kind == "conv":                              # [m, k_max, d]
            values = np.float32(TAP_STD) * noise
            values[:, 0, :] = np.float32(1) + np.float32(TAP0_JITTER) * noise[:, 0, :]
            for r, kernel_size in enumerate(kernels):
                values[r, kernel_size:, :] = 0
        elif kind == "key_norm":
            values = np.float32(1) + np.float32(ROUTE_STD[kind]) * noise
        elif kind is not None:
            values = np.float32(ROUTE_STD[kind]) * noise
        elif name.endswith("norm.weight"):
            values = np.float32(1) + np.float32(NORM_JITTER) * noise
        else:
            values = np.float32(MATRIX_STD) * noise
        weights[name] = values
    return weights


def load_weights(model, weights, strict=True):
    """Copies `weights` into the model's parameters of the same name (all of them when
    strict, otherwise those present)."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name in weights:
                parameter.copy_(torch.as_tensor(weights[name], dtype=parameter.dtype))
            else:
                assert not strict, f"no weight for {name}"


def draw_tokens(seed):
    rng = np.random.default_rng(seed + 1)
    return rng.integers(0, TINY.vocab_size, size=(BATCH, SEQ_LEN + 1)).astype(np.uint32)


def inputs_of(tokens_np):
    tokens = torch.from_numpy(tokens_np.astype(np.int64))
    return tokens, tokens[:, :SEQ_LEN]


def max_difference(a, b):
    return (a - b).abs().max().item()


# ---- check 1: standard is the Hugging Face model -------------------------------------------

def check_standard_against_hugging_face(spec, family, seed):
    hf_spec = dict(family=family, vocab_size=spec.vocab_size, d_model=spec.d_model,
                   n_layers=spec.n_layers, n_heads=spec.n_heads, n_kv_heads=spec.n_kv_heads,
                   head_dim=spec.head_dim, ffn_dim=spec.ffn_dim, rope_theta=spec.rope_theta,
                   norm_eps=spec.norm_eps, tie_embeddings=False, rope_scaling=None,
                   max_position=64)
    reference = RoutingModel(spec)
    weights = draw_weights(reference, seed)
    load_weights(reference, weights)
    cls = LlamaForCausalLM if family == "llama" else Qwen3ForCausalLM
    with float64_everywhere():
        hf = cls(hf_config(hf_spec)).double()
    hf_names = sorted(name for name, _ in hf.named_parameters())
    assert hf_names == sorted(weights), "parameter names differ from Hugging Face's"
    load_weights(hf, weights)
    _, ids = inputs_of(draw_tokens(seed))
    with torch.no_grad(), float64_everywhere():
        expected = hf(input_ids=ids, use_cache=False).logits
    got = reference(ids).detach()
    difference = max_difference(got, expected)
    print(f"  1. standard == {cls.__name__}: max |logits difference| {difference:.1e}")
    assert difference <= 1e-12, f"mode standard disagrees with {cls.__name__}"


# ---- check 2: delta with alpha = 0 is the base model ---------------------------------------

def check_delta_with_zero_gates_is_standard(residual, weights, ids):
    graft = RoutingModel(TINY, residual)
    load_weights(graft, weights)
    with torch.no_grad():
        for name, parameter in graft.named_parameters():
            if name.endswith(".alpha"):
                parameter.zero_()
    base = RoutingModel(TINY)
    load_weights(base, weights, strict=False)
    identical = torch.equal(graft(ids), base(ids))
    print(f"  2. delta with every alpha = 0 gives the standard logits: {identical}")
    assert identical, "the delta form with alpha = 0 is not the base model"


# ---- check 3: full granularity == blocks of one sublayer -----------------------------------

def check_full_is_block_of_one_sublayer(residual, seed):
    assert residual.granularity == "full"
    model = RoutingModel(TINY, residual)
    load_weights(model, draw_weights(model, seed))
    _, ids = inputs_of(draw_tokens(seed))
    with torch.no_grad():
        full = model(ids)
        difference = max_difference(full, model.forward_blocks(ids, 1))
        other = max_difference(full, model.forward_blocks(ids, 2))
    print(f"  3. {residual.mode} {residual.form}: full == block with S = 1: "
          f"{difference:.1e}; S = 2 differs by {other:.1e}")
    assert difference <= 1e-12, "full granularity is not blocks of one sublayer"
    assert other > 1e-3, "the block size does not change the model"


# ---- check 4: MSAR at init is Block AttnRes at init ----------------------------------------

def check_msar_at_init_is_block_attnres(residual, weights, ids):
    """Same base weights; both routings at init (queries 0). In the delta form alpha and
    null keep their random values in both models, so the routed mix is really read."""
    msar = RoutingModel(TINY, residual)
    load_weights(msar, weights)
    attnres = RoutingModel(TINY, ResidualSpec("attnres", heads=residual.heads,
                                              granularity=residual.granularity,
                                              layers_per_block=residual.layers_per_block,
                                              form=residual.form))
    load_weights(attnres, {n: w for n, w in weights.items() if kind_of(n) is None},
                 strict=False)
    with torch.no_grad():
        random_logits = msar(ids)
        msar.reset_routing()
        attnres.reset_routing()
        if residual.form == "delta":
            kept = {n: w for n, w in weights.items() if kind_of(n) in ("alpha", "route_null")}
            load_weights(msar, kept, strict=False)
            load_weights(attnres, kept, strict=False)
        msar_logits, attnres_logits = msar(ids), attnres(ids)
    difference = max_difference(msar_logits, attnres_logits)
    moved = max_difference(random_logits, attnres_logits)
    print(f"  4. MSAR at init == Block AttnRes at init: {difference:.1e}; random routing "
          f"moves the logits by {moved:.1e}")
    assert difference <= 1e-12, "MSAR at init is not Block AttnRes"
    assert moved > 1e-3, "the MSAR routing weights do not matter"


# ---- check 5: gradients against finite differences ----------------------------------------

def probes_for(model):
    """One element per routing tensor kind present (conv: a tap below k_r, not tap 0, of the
    longest stream) and one base weight, spread over the sites."""
    residual = model.residual
    m = residual.streams
    vector = (lambda c: (m - 1, c)) if residual.mode == "msar" else (lambda c: (c,))
    probes = [("model.layers.1.self_attn.q_proj.weight", (5, 7)),
              ("model.layers.1.attn_route.query", vector(5)),
              ("model.layers.2.mlp_route.key_norm", vector(11)),
              ("model.final_route.query", vector(30))]
    if residual.form == "delta":
        probes += [("model.layers.1.mlp_route.alpha", (0,)), ("model.route_null", (7,))]
    if residual.mode == "msar":
        longest = int(np.argmax(residual.stream_kernels))
        probes += [("model.route_streams.1.conv", (longest, 1, 9)),
                   ("model.layers.2.attn_route.mix_bias", (m - 1,)),
                   ("model.layers.0.mlp_route.mix_proj", (m - 1, 20))]
    names = dict(model.named_parameters())
    assert all(name in names for name, _ in probes), "a probe names no parameter"
    return probes


def check_finite_differences(model, tokens, ids, grads):
    """Five-point central differences in float64 (step 1e-3: truncation ~ h^4, rounding
    ~ 1e-16 / h, both far below the 1e-6 relative tolerance even for gradients ~ 1e-4)."""
    params = dict(model.named_parameters())
    step = 1e-3
    for name, index in probes_for(model):
        parameter = params[name]
        losses = {}
        with torch.no_grad():
            original = parameter[index].item()
            for k in (-2, -1, 1, 2):
                parameter[index] = original + k * step
                losses[k] = loss_terms(model(ids), tokens, Z_LOSS)[0].item()
            parameter[index] = original
        numeric = (8 * (losses[1] - losses[-1]) - (losses[2] - losses[-2])) / (12 * step)
        analytic = float(grads[name][index])
        error = abs(numeric - analytic) / max(abs(analytic), 1e-12)
        print(f"  5. finite difference {name}{list(index)}: analytic {analytic:+.9e} "
              f"numeric {numeric:+.9e} rel {error:.1e}")
        assert abs(analytic) > 1e-5, f"probe {name}{index} has a negligible gradient"
        assert error < 1e-6, f"gradient of {name}{index} disagrees with finite difference"


def check_gradients_present(model, grads):
    """Every gradient stands out, except where the math makes it exactly 0: conv taps at or
    beyond k_r, and in the replace form the query and key_norm of the first site, which
    routes over one source (b_0 = e: a softmax over one source is 1 whatever its score).
    The bound is 1e-4, as in make_fixtures.py."""
    single_source = ("model.layers.0.attn_route.query", "model.layers.0.attn_route.key_norm")
    norms = {}
    for name, g in grads.items():
        if model.residual.form == "replace" and name in single_source:
            assert not g.any(), f"{name}: the one-source site has a score gradient"
        elif kind_of(name) == "conv":
            for r, kernel_size in enumerate(model.residual.stream_kernels):
                assert not g[r, kernel_size:].any(), f"{name}: a tap beyond k_r has a gradient"
                norms[f"{name}[{r}]"] = np.linalg.norm(g[r, :kernel_size])
        else:
            norms[name] = np.linalg.norm(g)
    smallest = min(norms, key=norms.get)
    print(f"  smallest gradient norm: {smallest} {norms[smallest]:.1e}")
    assert norms[smallest] > 1e-4, f"gradient of {smallest} is negligible"


# ---- the file -----------------------------------------------------------------------------

def fathom_yaml(residual):
    """The network as a fathom config (DESIGN 6): model as in make_fixtures.py, residual,
    train. AttnRes writes streams 1 and stream_kernels [1]."""
    kernels = residual.stream_kernels if residual.mode == "msar" else (1,)
    streams = residual.streams if residual.mode == "msar" else 1
    model = dict(dataclasses.asdict(TINY), rope_scaling=None, tie_embeddings=False)
    return (
        model_yaml(model)
        + "residual:\n"
        f"  mode: {residual.mode}\n"
        f"  heads: {residual.heads}\n"
        f"  granularity: {residual.granularity}\n"
        f"  layers_per_block: {residual.layers_per_block}\n"
        f"  form: {residual.form}\n"
        f"  streams: {streams}\n"
        f"  stream_kernels: [{', '.join(str(k) for k in kernels)}]\n"
        + train_yaml(SEQ_LEN, BATCH, Z_LOSS)
    )


def check_config_text(text, residual):
    parsed = yaml.safe_load(text)
    assert set(parsed) == {"model", "residual", "train"}
    model, routing, train = parsed["model"], parsed["residual"], parsed["train"]
    for key in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                "ffn_dim", "rope_theta", "norm_eps", "qk_norm"):
        assert model[key] == getattr(TINY, key), key
    assert model["rope_scaling"] == {"type": "none"} and model["tie_embeddings"] is False
    for key in ("mode", "heads", "granularity", "layers_per_block", "form"):
        assert routing[key] == getattr(residual, key), key
    if residual.mode == "msar":
        assert routing["streams"] == residual.streams
        assert tuple(routing["stream_kernels"]) == residual.stream_kernels
    else:
        assert routing["streams"] == 1 and routing["stream_kernels"] == [1]
    assert train == dict(seq_len=SEQ_LEN, microbatch_size=BATCH, global_batch_size=BATCH,
                         z_loss=Z_LOSS)


def make_fixture(stem, seed, residual):
    print(f"{stem}: {residual}")
    model = RoutingModel(TINY, residual)
    weights = draw_weights(model, seed)
    load_weights(model, weights)
    tokens_np = draw_tokens(seed)
    tokens, ids = inputs_of(tokens_np)

    logits = model(ids)
    loss, ce, zloss = loss_terms(logits, tokens, Z_LOSS)
    loss.backward()
    grads = {name: p.grad.detach().numpy().copy() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    print(f"  loss {loss.item():.12f} ce {ce.item():.12f} zloss {zloss.item():.3e}; "
          f"{len(weights)} tensors, {sum(w.size for w in weights.values())} values")

    if residual.form == "delta":
        check_delta_with_zero_gates_is_standard(residual, weights, ids)
    if residual.mode == "msar":
        check_msar_at_init_is_block_attnres(residual, weights, ids)
    check_gradients_present(model, grads)
    check_finite_differences(model, tokens, ids, grads)

    text = fathom_yaml(residual)
    check_config_text(text, residual)
    content = dict(config=text, tokens=tokens_np, weights=weights,
                   logits=logits.detach().numpy().copy(), loss=loss.item(), ce=ce.item(),
                   zloss=zloss.item(), grads=grads)
    path = os.path.normpath(os.path.join(FIXTURE_DIR, f"{stem}.h5"))
    write_checked_fixture(path, "routing", content, (BATCH, SEQ_LEN, TINY.vocab_size), Z_LOSS)


def main():
    make_torch_deterministic()
    print("reference checks:")
    check_standard_against_hugging_face(TINY, "llama", 20240700)
    qk_norm = ModelSpec(**{**TINY.__dict__, "qk_norm": True, "norm_eps": 1e-6})
    check_standard_against_hugging_face(qk_norm, "qwen3", 20240700)
    for form in ("replace", "delta"):
        check_full_is_block_of_one_sublayer(
            ResidualSpec("attnres", heads=2, granularity="full", form=form), 20240710)
        check_full_is_block_of_one_sublayer(
            ResidualSpec("msar", heads=2, granularity="full", form=form, streams=2,
                         stream_kernels=(2, 3)), 20240711)
    os.makedirs(FIXTURE_DIR, exist_ok=True)
    for stem, seed, residual in FIXTURES:
        make_fixture(stem, seed, residual)
    return 0


if __name__ == "__main__":
    sys.exit(main())
