#!/usr/bin/env python3
"""launch/bench/peer.py — PyTorch on the same GPU, same shapes: the peer column of the
benchmark table (docs/performance.md).

Cases (each prints one JSON line, then a table at the end):
  layers     4 Llama-3-8B decoder layers, forward + backward (T 4096, B 1), eager and
             torch.compile; TFLOP/s by the DESIGN 6 formula
  attention  scaled_dot_product_attention (causal, GQA 32/8, hd 128, T 4096), fwd + bwd;
             --attention-shapes adds others
  route      block-MHAR delta routing at the 8B shape: d 4096, H 8, microbatch 2 x 4096,
             64 sites over N = 2..9 sources (null + b_0..b_{n-1}), fwd + bwd, torch.compile
  msar       the same sites through MSAR (m 4, kernels 1 2 4 8), torch.compile
  step1b     one training step of the MHAR paper's 1B model (d 1280, L 36, 16/8 heads,
             FFN 5120, 32 x 1024 tokens): standard, MHAR (block, H 8) and MSAR, eager and
             with its repeated pieces compiled (compile_pieces)

Times are CUDA-event medians after warm-up. Usage:
  python3 launch/bench/peer.py [--cases layers,attention,route,msar,step1b] [--repeat 10]
                               [--step-modes standard,mhar,msar]
"""

import argparse
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "reference"))
import routing_reference as reference  # noqa: E402

DEVICE = "cuda"
BF16 = torch.bfloat16
PROFILE = False  # --profile: each kernel's time in the layers case, and bf16 dW products


def time_ms(function, repeat, warmup=3):
    """Median of `repeat` timings of function() in milliseconds, CUDA events."""
    for _ in range(warmup):
        function()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        function()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def peak_gib():
    return torch.cuda.max_memory_allocated() / 2**30


def llama8b_spec(layers):
    return reference.ModelSpec(vocab_size=128256, d_model=4096, n_layers=layers, n_heads=32,
                               n_kv_heads=8, head_dim=128, ffn_dim=14336,
                               rope_theta=500000.0, norm_eps=1e-5)


def case_layers(repeat):
    """4 decoder layers fwd + bwd on [1, 4096, 4096] bf16 inputs (no embedding, no head)."""
    spec = llama8b_spec(4)
    reference.USE_SDPA = True
    layers = torch.nn.ModuleList(reference.DecoderLayer(spec, reference.ResidualSpec(), BF16)
                                 for _ in range(4)).to(DEVICE)
    for parameter in layers.parameters():
        torch.nn.init.normal_(parameter, 0.0, 0.02) if parameter.dim() == 2 else parameter.data.fill_(1.0)

    def forward(h):
        for layer in layers:
            h = h + layer.self_attn(layer.input_layernorm(h))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return h

    x = torch.randn(1, 4096, 4096, device=DEVICE, dtype=BF16, requires_grad=True)
    matrix = sum(p.numel() for p in layers.parameters() if p.dim() == 2)
    tokens, T = 4096, 4096
    flops = 6 * matrix * tokens + 6 * 4 * T * spec.n_heads * spec.head_dim * tokens
    results = []
    for mode, model in (("eager", forward), ("compile", torch.compile(forward))):
        torch.cuda.reset_peak_memory_stats()

        def step():
            x.grad = None
            for p in layers.parameters():
                p.grad = None
            model(x).float().square().mean().backward()
        ms = time_ms(step, repeat)
        results.append(dict(case="layers", mode=mode, ms=ms, tflops=flops / ms / 1e9,
                            peak_gib=peak_gib()))
        if PROFILE:
            profile_kernels(step, f"layers {mode}")
    if PROFILE:
        for rows_, in_dim, out_dim in ((4096, 4096, 4096), (4096, 4096, 1024),
                                       (4096, 4096, 14336), (4096, 14336, 4096)):
            dout = torch.randn(rows_, out_dim, device=DEVICE, dtype=BF16)
            x_in = torch.randn(rows_, in_dim, device=DEVICE, dtype=BF16)
            gemm = 2 * rows_ * in_dim * out_dim
            ms = time_ms(lambda: torch.mm(dout.t(), x_in), repeat)
            results.append(dict(case="dweight", mode=f"bf16 {rows_}x{in_dim}x{out_dim}", ms=ms,
                                tflops=gemm / ms / 1e9))
    return results


def profile_kernels(step, label, steps=5, top=30):
    """Each kernel's device time a step, summed by name over `steps` profiled steps."""
    from torch.profiler import ProfilerActivity, profile
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    sums, counts = {}, {}
    for event in trace.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = getattr(event, "device_time", None)
        us = event.cuda_time if us is None else us
        sums[event.name] = sums.get(event.name, 0.0) + us / 1e3
        counts[event.name] = counts.get(event.name, 0) + 1
    total = sum(sums.values()) / steps
    print(f"# kernels of {label}: {total:.3f} ms of device time a step", flush=True)
    for name, ms in sorted(sums.items(), key=lambda item: -item[1])[:top]:
        print(f"#   {ms / steps:8.3f} ms {counts[name] // steps:4d}x  {name[:90]}", flush=True)


def case_attention(repeat, shape=(1, 4096, 32, 8, 128)):
    B, T, H, KV, hd = shape
    q = torch.randn(B, H, T, hd, device=DEVICE, dtype=BF16, requires_grad=True)
    k = torch.randn(B, KV, T, hd, device=DEVICE, dtype=BF16, requires_grad=True)
    v = torch.randn(B, KV, T, hd, device=DEVICE, dtype=BF16, requires_grad=True)
    grad = torch.randn(B, H, T, hd, device=DEVICE, dtype=BF16)
    forward_flops = 4 * B * T * T * H * hd / 2            # causal: half the square
    results = []

    def forward():
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                enable_gqa=True)
    ms_forward = time_ms(forward, repeat)
    out = forward()

    def forward_backward():
        q.grad = k.grad = v.grad = None
        forward().backward(grad)
    ms_both = time_ms(forward_backward, repeat)
    label = "" if shape == (1, 4096, 32, 8, 128) else f" B{B} T{T} {H}/{KV} hd{hd}"
    results.append(dict(case="attention", mode="forward" + label, ms=ms_forward,
                        tflops=forward_flops / ms_forward / 1e9))
    results.append(dict(case="attention", mode="forward+backward" + label, ms=ms_both,
                        tflops=3.5 * forward_flops / ms_both / 1e9))
    del out
    return results


def routing_sites(layers=32, blocks=8):
    """Sources per site of the 8B graft: site j reads null + b_0..b_{n-1}, n = j // S + 1."""
    S = 2 * layers // blocks
    return [j // S + 2 for j in range(2 * layers)]


def case_route(repeat, mode):
    d, H, tokens = 4096, 8, 2 * 4096
    m, kernels = 4, (1, 2, 4, 8)
    sites = routing_sites()
    n_max = max(sites)
    eps = 1e-5
    sources = [torch.randn(2, 4096, d, device=DEVICE, dtype=BF16, requires_grad=True)
               for _ in range(n_max)]
    stream = torch.randn(2, 4096, d, device=DEVICE, dtype=BF16, requires_grad=True)
    width = m if mode == "msar" else 1
    query = torch.randn(len(sites), width, d, device=DEVICE, dtype=BF16, requires_grad=True)
    key_norm = torch.ones(len(sites), width, d, device=DEVICE, dtype=BF16, requires_grad=True)
    alpha = torch.full((len(sites),), 0.1, device=DEVICE, dtype=BF16, requires_grad=True)
    taps = torch.randn(n_max, m, 8, d, device=DEVICE, dtype=BF16, requires_grad=True)
    mix_bias = torch.zeros(len(sites), m, device=DEVICE, dtype=BF16, requires_grad=True)
    mix_proj = torch.zeros(len(sites), m, d, device=DEVICE, dtype=BF16, requires_grad=True)

    def one_site(srcs, q, g, a, taps_r, bias, proj):
        if mode == "msar":
            outs = []
            for r, k in enumerate(kernels):
                # the null source (index 0) is not convolved
                expanded = [srcs[0]] + [reference.stream_conv(s, taps_r[i, r], k)
                                        for i, s in enumerate(srcs[1:], start=1)]
                outs.append(reference.route(expanded, q[r], g[r], H, eps))
            mix = reference.stream_mix(outs, bias, proj, eps)
        else:
            mix = reference.route(srcs, q[0], g[0], H, eps)
        return stream + a * mix

    # one compiled graph per source count (8 of them), not one per site
    torch._dynamo.config.cache_size_limit = 64
    site_compiled = torch.compile(one_site, dynamic=False)
    total_bytes = sum((2 * n + 2) * tokens * d * 2 for n in sites)  # fwd 1x + bwd 2x reads

    def microbatch():
        # each site's backward right after its forward: the sites share only leaf tensors
        # here, so this is the same work without holding 64 sites' intermediates at once
        for tensor in [*sources, stream, query, key_norm, alpha, taps, mix_bias, mix_proj]:
            tensor.grad = None
        for j, n in enumerate(sites):
            out = site_compiled(sources[:n], query[j], key_norm[j], alpha[j], taps,
                                mix_bias[j], mix_proj[j])
            out.float().square().mean().backward()
    torch.cuda.reset_peak_memory_stats()
    ms = time_ms(microbatch, repeat)
    return [dict(case=mode, mode="compile", ms=ms, gbs=total_bytes / ms / 1e6,
                 peak_gib=peak_gib(), sites=len(sites), n_max=n_max)]


def compile_pieces(model):
    """torch.compile the pieces a step repeats, not the whole 36-layer graph (whose compile
    outlasted a 380 s run): each layer's attention, MLP and norms (one graph per module kind,
    shared by the layers), the route per source count, the MSAR convolution per kernel size
    and the MSAR mix. Fusion across these seams is lost; the seams are where fathom's ops
    meet too."""
    torch._dynamo.config.cache_size_limit = 64
    torch._dynamo.config.accumulated_cache_size_limit = 512
    for layer in model.model.layers:
        for module in (layer.input_layernorm, layer.self_attn, layer.post_attention_layernorm,
                       layer.mlp):
            module.compile()
    model.model.norm.compile()
    reference.route = torch.compile(reference.route, dynamic=False)
    reference.stream_conv = torch.compile(reference.stream_conv, dynamic=False)
    reference.stream_mix = torch.compile(reference.stream_mix, dynamic=False)


def case_step1b(repeat, modes):
    spec = reference.ModelSpec(vocab_size=128256, d_model=1280, n_layers=36, n_heads=16,
                               n_kv_heads=8, head_dim=80, ffn_dim=5120, rope_theta=500000.0)
    reference.USE_SDPA = True
    residuals = {
        "standard": reference.ResidualSpec(),
        "mhar": reference.ResidualSpec(mode="attnres", heads=8, granularity="block",
                                       layers_per_block=4, form="replace"),
        "msar": reference.ResidualSpec(mode="msar", heads=8, granularity="block",
                                       layers_per_block=4, form="replace", streams=4,
                                       stream_kernels=(1, 2, 4, 8)),
    }
    pieces = (reference.route, reference.stream_conv, reference.stream_mix)
    results = []
    tokens = torch.randint(0, spec.vocab_size, (32, 1025), device=DEVICE)
    for name, residual in residuals.items():
        if name not in modes:
            continue
        model = reference.RoutingModel(spec, residual, dtype=BF16).to(DEVICE)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

        def step():
            optimizer.zero_grad(set_to_none=True)
            for micro in range(4):                      # 4 microbatches of 8 sequences
                batch = tokens[8 * micro: 8 * micro + 8]
                logits = model(batch[:, :-1])
                loss, _, _ = reference.loss_terms(logits.float(), batch, 1e-4)
                (loss / 4).backward()
            optimizer.step()
        for mode in ("eager", "compile"):
            if mode == "compile":
                compile_pieces(model)
            torch.cuda.reset_peak_memory_stats()
            started = time.monotonic()
            row = dict(case="step1b", mode=f"{name} {mode}")
            try:
                ms = time_ms(step, max(3, repeat // 3), warmup=2)
                row.update(ms=ms, tokens_per_s=32 * 1024 / ms * 1e3, peak_gib=peak_gib())
            except torch.OutOfMemoryError:
                # MSAR keeps every convolved source of every stream for the backward
                optimizer.zero_grad(set_to_none=True)
                torch.cuda.empty_cache()
                row.update(ms=float("nan"), note="out of memory")
            row.update(seconds=round(time.monotonic() - started, 1))
            results.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
        reference.route, reference.stream_conv, reference.stream_mix = pieces
        del model, optimizer
        torch.cuda.empty_cache()
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="layers,attention,route,msar,step1b")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--attention-shapes", default="1,4096,32,8,128",
                        help="B,T,heads,kv_heads,head_dim of the attention case; ';' between "
                             "shapes")
    parser.add_argument("--step-modes", default="standard,mhar,msar",
                        help="the residuals of step1b (each runs a 1B model eager, then compiled)")
    parser.add_argument("--profile", action="store_true",
                        help="layers: each kernel's device time a step (torch.profiler)")
    arguments = parser.parse_args()
    global PROFILE
    PROFILE = arguments.profile
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    rows = []
    for case in arguments.cases.split(","):
        if case == "layers":
            found = case_layers(arguments.repeat)
        elif case == "attention":
            found = []
            for text in arguments.attention_shapes.split(";"):
                found += case_attention(arguments.repeat,
                                        tuple(int(x) for x in text.split(",")))
        elif case in ("route", "msar"):
            found = case_route(arguments.repeat, case)
        elif case == "step1b":
            found = case_step1b(arguments.repeat, arguments.step_modes.split(","))
        else:
            sys.exit(f"peer.py: unknown case {case!r}")
        for row in found:
            print(json.dumps(row), flush=True)
        rows += found
    print(f"{'case':<10} {'mode':<38} {'ms':>9} {'rate':>16} {'peak GiB':>9}")
    for row in rows:
        rate = (f"{row['tflops']:.0f} TFLOP/s" if "tflops" in row else
                f"{row['gbs']:.0f} GB/s" if "gbs" in row else
                f"{row['tokens_per_s'] / 1e3:.1f}k tok/s" if "tokens_per_s" in row else
                row.get("note", ""))
        print(f"{row['case']:<10} {row['mode']:<38} {row['ms']:>9.3f} {rate:>16} "
              f"{row.get('peak_gib', float('nan')):>9.1f}")


if __name__ == "__main__":
    main()
