"""tests/reference/routing_reference.py — a PyTorch reference of fathom's model family
(DESIGN 2, 2.1, 2.2, 2.3; the open points fixed in docs/design-notes.md, "Attention over
depth").

One readable module, float64 by default, written from the text of DESIGN alone (no
transformers code): the Llama/Qwen3 baseline and the attention-over-depth residuals.

    ModelSpec      the network (DESIGN 6 `model` keys; no RoPE scaling, untied head)
    ResidualSpec   the `residual` keys: mode standard | attnres | msar, heads, granularity
                   full | block, layers_per_block, form replace | delta, streams,
                   stream_kernels
    RoutingModel   torch.nn.Module; named_parameters() yields exactly the DESIGN 2.3 names
                   and shapes. forward(input_ids [B, T] int64) -> logits [B, T, V].
    route, stream_conv, stream_mix, loss_terms   the pieces, as plain functions

Sublayer j = 0 .. 2L-1 is layer j // 2's attention (j even) or MLP (j odd). With S
sublayers per block (full granularity: S = 1), sublayer j sits in block n = j // S + 1 at
position i = j % S; there are n_blocks = ceil(2L / S) blocks after b_0 = e, the last
possibly short. The full-granularity path is written separately from DESIGN's own words
(sources e, f_0 .. f_{j-1}) so that `forward_blocks(ids, 1)` can check it.
"""

import dataclasses
import math

import torch

SUBLAYER_NAMES = ("attn", "mlp")

# Benchmarks (launch/bench/peer.py) set this to run attention through PyTorch's fused
# scaled_dot_product_attention; the fixtures use the plain formula below.
USE_SDPA = False


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    qk_norm: bool = False


@dataclasses.dataclass(frozen=True)
class ResidualSpec:
    mode: str = "standard"          # standard | attnres | msar
    heads: int = 1                  # H: 1 AttnRes, > 1 MHAR (also the heads of MSAR routes)
    granularity: str = "block"      # full | block
    layers_per_block: int = 1
    form: str = "replace"           # replace | delta
    streams: int = 1                # MSAR m
    stream_kernels: tuple = (1,)    # MSAR k_r, one per stream

    def __post_init__(self):
        assert self.mode in ("standard", "attnres", "msar"), self.mode
        assert self.granularity in ("full", "block"), self.granularity
        assert self.form in ("replace", "delta"), self.form
        assert self.heads >= 1 and self.layers_per_block >= 1
        if self.mode == "msar":
            assert len(self.stream_kernels) == self.streams >= 1
            assert all(k >= 1 for k in self.stream_kernels)

    def sublayers_per_block(self):
        """S of DESIGN 2.1: 2 * layers_per_block, or 1 for full granularity."""
        return 1 if self.granularity == "full" else 2 * self.layers_per_block


def n_blocks_for(n_sublayers, sublayers_per_block):
    """Blocks after b_0: ceil(2L / S), the last one possibly short."""
    return -(-n_sublayers // sublayers_per_block)


# ---- the pieces --------------------------------------------------------------------------

def rms_normalize(x, eps):
    """x * rsqrt(mean(x^2) + eps) over the last dimension."""
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


def route(sources, query, key_norm, heads, eps):
    """Route (DESIGN 2.1), per token. sources: list of N tensors [B, T, d]; query, key_norm
    [d]. Keys are the sources RMS-normalised over the full width d, times key_norm; head h
    scores < query[h], key[h] > on its d/H channels (no 1/sqrt); a softmax over the N
    sources per head weighs the RAW sources. Returns [B, T, d]."""
    s = torch.stack(sources)                                   # [N, B, T, d]
    n_sources, batch, seq, d = s.shape
    per_head = d // heads
    keys = key_norm * rms_normalize(s, eps)                    # [N, B, T, d]
    keys = keys.view(n_sources, batch, seq, heads, per_head)
    scores = (keys * query.view(heads, per_head)).sum(dim=-1)  # [N, B, T, H]
    weights = torch.softmax(scores, dim=0)                     # over the sources
    values = s.view(n_sources, batch, seq, heads, per_head)
    return (weights.unsqueeze(-1) * values).sum(dim=0).reshape(batch, seq, d)


def stream_conv(x, taps, kernel_size):
    """E_r(x)_t = sum_{tau < kernel_size} taps[tau] * x_{t - tau}, zero before t = 0
    (DESIGN 2.2). x [B, T, d]; taps [k_max, d], of which only the first kernel_size rows
    are read (the rest get no gradient)."""
    seq = x.shape[1]
    out = taps[0] * x
    for tau in range(1, min(kernel_size, seq)):
        shifted = torch.nn.functional.pad(x[:, : seq - tau], (0, 0, tau, 0))
        out = out + taps[tau] * shifted
    return out


def stream_mix(streams, mix_bias, mix_proj, eps):
    """x = sum_r w_r o_r, w_r = sigmoid(beta_r + < theta_r, o_r * rsqrt(mean(o_r^2)+eps) >)
    (DESIGN 2.2). streams: list of m tensors [B, T, d]; mix_bias [m]; mix_proj [m, d]."""
    mixed = None
    for r, o in enumerate(streams):
        gate = torch.sigmoid(mix_bias[r] + (rms_normalize(o, eps) * mix_proj[r]).sum(-1))
        term = gate.unsqueeze(-1) * o
        mixed = term if mixed is None else mixed + term
    return mixed


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_tables(seq_len, head_dim, theta, dtype):
    """cos, sin [T, head_dim] of rotate-half RoPE, frequencies theta^(-2i/head_dim)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(seq_len, dtype=torch.float64)[:, None] * inv_freq[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def loss_terms(logits, tokens, z_loss):
    """loss, ce, zloss: means over the B*T tokens of lse_t - logit_t[target] and
    z_loss * lse_t^2. logits [B, T, V]; tokens [B, T+1] (targets tokens[:, 1:])."""
    targets = tokens[:, 1:]
    lse = torch.logsumexp(logits, dim=-1)
    target_logit = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)
    ce = (lse - target_logit).mean()
    zloss = (z_loss * lse * lse).mean()
    return ce + zloss, ce, zloss


# ---- the modules (their attribute paths are the DESIGN 2.3 names) -------------------------

def empty(*shape, dtype):
    return torch.nn.Parameter(torch.empty(*shape, dtype=dtype))


class RMSNorm(torch.nn.Module):
    def __init__(self, width, eps, dtype):
        super().__init__()
        self.weight = empty(width, dtype=dtype)
        self.eps = eps

    def forward(self, x):
        return self.weight * rms_normalize(x, self.eps)


def linear(n_in, n_out, dtype):
    return torch.nn.Linear(n_in, n_out, bias=False, dtype=dtype)


class Attention(torch.nn.Module):
    """GQA causal attention, optional per-head q/k RMSNorm before rotate-half RoPE."""

    def __init__(self, spec, dtype):
        super().__init__()
        self.spec = spec
        d, hd = spec.d_model, spec.head_dim
        self.q_proj = linear(d, spec.n_heads * hd, dtype)
        self.k_proj = linear(d, spec.n_kv_heads * hd, dtype)
        self.v_proj = linear(d, spec.n_kv_heads * hd, dtype)
        self.o_proj = linear(spec.n_heads * hd, d, dtype)
        if spec.qk_norm:
            self.q_norm = RMSNorm(hd, spec.norm_eps, dtype)
            self.k_norm = RMSNorm(hd, spec.norm_eps, dtype)

    def forward(self, x):
        spec = self.spec
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, spec.n_heads, spec.head_dim)
        k = self.k_proj(x).view(batch, seq, spec.n_kv_heads, spec.head_dim)
        v = self.v_proj(x).view(batch, seq, spec.n_kv_heads, spec.head_dim)
        if spec.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))        # [B, heads, T, head_dim]
        cos, sin = rope_tables(seq, spec.head_dim, spec.rope_theta, x.dtype)
        cos, sin = cos.to(x.device), sin.to(x.device)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if USE_SDPA:
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=True)
            return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))
        group = spec.n_heads // spec.n_kv_heads                 # query head h reads kv h // group
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(spec.head_dim)
        future = torch.ones(seq, seq, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class MLP(torch.nn.Module):
    def __init__(self, spec, dtype):
        super().__init__()
        self.gate_proj = linear(spec.d_model, spec.ffn_dim, dtype)
        self.up_proj = linear(spec.d_model, spec.ffn_dim, dtype)
        self.down_proj = linear(spec.ffn_dim, spec.d_model, dtype)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class RouteSite(torch.nn.Module):
    """The parameters of one routing site (DESIGN 2.3): query, key_norm [d] (MSAR [m, d]),
    alpha [1] in the delta form, mix_bias [m] and mix_proj [m, d] for MSAR with m > 1."""

    def __init__(self, spec, residual, dtype):
        super().__init__()
        d = spec.d_model
        shape = (residual.streams, d) if residual.mode == "msar" else (d,)
        self.query = empty(*shape, dtype=dtype)
        self.key_norm = empty(*shape, dtype=dtype)
        if residual.form == "delta":
            self.alpha = empty(1, dtype=dtype)
        if residual.mode == "msar" and residual.streams > 1:
            self.mix_bias = empty(residual.streams, dtype=dtype)
            self.mix_proj = empty(residual.streams, d, dtype=dtype)


class StreamSlot(torch.nn.Module):
    """model.route_streams.{n}.conv [m, k_max, d]: the causal convolutions of slot n."""

    def __init__(self, spec, residual, dtype):
        super().__init__()
        self.conv = empty(residual.streams, max(residual.stream_kernels), spec.d_model,
                          dtype=dtype)


class DecoderLayer(torch.nn.Module):
    def __init__(self, spec, residual, dtype):
        super().__init__()
        self.input_layernorm = RMSNorm(spec.d_model, spec.norm_eps, dtype)
        self.self_attn = Attention(spec, dtype)
        self.post_attention_layernorm = RMSNorm(spec.d_model, spec.norm_eps, dtype)
        self.mlp = MLP(spec, dtype)
        if residual.mode != "standard":
            self.attn_route = RouteSite(spec, residual, dtype)
            self.mlp_route = RouteSite(spec, residual, dtype)


class Decoder(torch.nn.Module):
    """The `model.` prefix of the names."""

    def __init__(self, spec, residual, dtype):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(spec.vocab_size, spec.d_model, dtype=dtype)
        self.layers = torch.nn.ModuleList(DecoderLayer(spec, residual, dtype)
                                          for _ in range(spec.n_layers))
        self.norm = RMSNorm(spec.d_model, spec.norm_eps, dtype)
        if residual.mode != "standard":
            self.final_route = RouteSite(spec, residual, dtype)
        if residual.mode != "standard" and residual.form == "delta":
            self.route_null = empty(spec.d_model, dtype=dtype)
        if residual.mode == "msar":
            slots = n_blocks_for(2 * spec.n_layers, residual.sublayers_per_block()) + 1
            self.route_streams = torch.nn.ModuleList(StreamSlot(spec, residual, dtype)
                                                     for _ in range(slots))


class RoutingModel(torch.nn.Module):
    def __init__(self, spec, residual=ResidualSpec(), dtype=torch.float64):
        super().__init__()
        self.spec, self.residual = spec, residual
        self.model = Decoder(spec, residual, dtype)
        self.lm_head = linear(spec.d_model, spec.vocab_size, dtype)
        self.reset_parameters()

    # ---- init (DESIGN 2, docs/design-notes.md) ----

    @torch.no_grad()
    def reset_parameters(self, init_std=0.02, generator=None):
        """Matrices N(0, init_std^2), norm weights 1, routing at its identity init: query 0,
        key_norm 1, alpha 0, null 0, conv tap 0 = 1 and other taps 0, mix_bias -ln(m-1),
        mix_proj 0."""
        for name, parameter in self.named_parameters():
            if parameter.dim() == 2 and "route" not in name:
                parameter.normal_(0.0, init_std, generator=generator)
            elif name.endswith("norm.weight"):
                parameter.fill_(1.0)
        self.reset_routing()

    @torch.no_grad()
    def reset_routing(self):
        m = self.residual.streams
        for name, parameter in self.named_parameters():
            last = name.rsplit(".", 1)[-1]
            if last in ("query", "alpha", "mix_proj", "route_null"):
                parameter.zero_()
            elif last == "key_norm":
                parameter.fill_(1.0)
            elif last == "mix_bias":
                parameter.fill_(-math.log(m - 1))
            elif last == "conv":
                parameter.zero_()
                parameter[:, 0, :] = 1.0

    # ---- the pieces of the forward ----

    def sublayer(self, j, x):
        """f_j(x): layer j // 2's attention or MLP behind its own pre-norm."""
        layer = self.model.layers[j // 2]
        if j % 2 == 0:
            return layer.self_attn(layer.input_layernorm(x))
        return layer.mlp(layer.post_attention_layernorm(x))

    def site(self, j):
        """The routing site before sublayer j; j = 2L is the final site."""
        if j == 2 * self.spec.n_layers:
            return self.model.final_route
        return getattr(self.model.layers[j // 2], SUBLAYER_NAMES[j % 2] + "_route")

    def read(self, site, sources, slots):
        """The routed mix at `site` over `sources` (list of [B, T, d]); slots[k] is the stream
        slot of sources[k] (None for the null source, which is not convolved)."""
        residual, eps = self.residual, self.spec.norm_eps
        if residual.mode == "attnres":
            return route(sources, site.query, site.key_norm, residual.heads, eps)
        outputs = []
        for r, kernel_size in enumerate(residual.stream_kernels):
            streams = [s if slot is None else
                       stream_conv(s, self.model.route_streams[slot].conv[r], kernel_size)
                       for s, slot in zip(sources, slots)]
            outputs.append(route(streams, site.query[r], site.key_norm[r], residual.heads,
                                 eps))
        if residual.streams == 1:
            return outputs[0]
        return stream_mix(outputs, site.mix_bias, site.mix_proj, eps)

    def read_site(self, j, stream, sources, slots):
        """x_j: the mix itself (replace), or stream + alpha_j * mix over [null] + sources
        (delta)."""
        site = self.site(j)
        if self.residual.form == "replace":
            return self.read(site, sources, slots)
        mix = self.read(site, [self.model.route_null.expand_as(stream)] + sources,
                        [None] + slots)
        return stream + site.alpha * mix

    def head(self, h):
        return self.lm_head(self.model.norm(h))

    # ---- the forwards ----

    def forward(self, input_ids):
        e = self.model.embed_tokens(input_ids)
        if self.residual.mode == "standard":
            return self.head(self.forward_standard(e))
        if self.residual.granularity == "full":
            return self.head(self.forward_full(e))
        return self.head(self.forward_by_blocks(e, self.residual.sublayers_per_block()))

    def forward_blocks(self, input_ids, sublayers_per_block):
        """The block forward with an explicit S, whatever the granularity: S = 1 must give
        the full-granularity model."""
        return self.head(self.forward_by_blocks(self.model.embed_tokens(input_ids),
                                                sublayers_per_block))

    def forward_standard(self, e):
        h = e
        for j in range(2 * self.spec.n_layers):
            h = h + self.sublayer(j, h)
        return h

    def forward_full(self, e):
        """Full granularity as DESIGN 2.1 states it: sublayer j reads the sources
        e, f_0 .. f_{j-1} (delta: null first, and x_j = p + alpha_j * Route); the final site
        reads e, f_0 .. f_{2L-1}. Source k has stream slot k."""
        sources, p = [e], e
        for j in range(2 * self.spec.n_layers + 1):
            x = self.read_site(j, p, list(sources), list(range(len(sources))))
            if j == 2 * self.spec.n_layers:
                return x
            f = self.sublayer(j, x)
            sources.append(f)
            p = p + f

    def forward_by_blocks(self, e, S):
        """Blocks of S sublayers: b_0 = e; block n >= 1 sums the outputs of sublayers
        (n-1)S .. nS-1; sublayer j is the i = j % S-th of block n = j // S + 1. Replace reads
        b_0 .. b_{n-1} plus the partial b_n^i when i > 0 and has no other stream; delta keeps
        p <- p + f_j and reads null, b_0 .. b_{n-1}. The final site reads every block."""
        n_sublayers = 2 * self.spec.n_layers
        blocks, partial, p = [e], None, e
        for j in range(n_sublayers):
            n, i = j // S + 1, j % S
            assert len(blocks) == n
            sources, slots = list(blocks), list(range(n))
            if self.residual.form == "replace" and i > 0:
                sources.append(partial)
                slots.append(n)
            f = self.sublayer(j, self.read_site(j, p, sources, slots))
            partial = f if i == 0 else partial + f
            p = p + f
            if i == S - 1 or j == n_sublayers - 1:
                blocks.append(partial)
        assert len(blocks) == n_blocks_for(n_sublayers, S) + 1
        return self.read_site(n_sublayers, p, list(blocks), list(range(len(blocks))))
