"""
The attention variants of "Deconstructing Attention" (doc/deconstructing.md), the reference of
train_san.cu's per-layer attention kinds: the kinds and layouts (llmc/mixers/attention_kinds.h),
the fixed-QK kinds' input scale, and the token mixers as explicit T x T weights: the plain maths
of llmc/kernels/attention_variants.cuh, without the kernels' running maxima and suffix sums.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnref.sizes import mlp_width  # the mlp mixer's width (parameter counts need it without torch)

KINDS = ("standard", "mlp", "approximate", "nonapprox", "rndembqk", "fixedseqqk", "staticembqk")
# the kinds whose queries and keys come from a fixed input run through the network (attnref/san.py
# FixedStream): rndembqk's is random, fixedseqqk's the embedding of fixed text tokens
FIXED_QK_KINDS = ("rndembqk", "fixedseqqk")
NAMED_LAYOUTS = ("uniform", "hybrid", "even", "odd", "top-simple", "middle-simple", "bottom-simple", "quarter",
                 "first", "last", "bilateral")
TAYLOR_NORMS = ("joint", "separate")


def standard_layers(layout, n_layer):
    """The layers (1-based, ascending) that keep standard attention under `layout` (the rules
    of llmc/mixers/attention_kinds.h: h = L // 2, q = max(1, round(L / 4)); the paper's sets at L = 24).
    Raises ValueError for a bad layout."""
    L, h, q = n_layer, n_layer // 2, max(1, (n_layer + 2) // 4)
    if layout == "uniform":
        return []
    if layout in ("hybrid", "even"):
        return list(range(2, L + 1, 2))
    if layout == "odd":
        return list(range(1, L + 1, 2))
    if layout == "top-simple":
        return list(range(1, h + 1))
    if layout == "bottom-simple":
        return list(range(h + 1, L + 1))
    if layout == "middle-simple":
        return list(range(1, min(q, L) + 1)) + list(range(max(q + 1, L - q + 1), L + 1))
    if layout == "quarter":
        return [(2 * k * L + q) // (2 * q) for k in range(1, q + 1)]
    if layout == "first":
        return [1]
    if layout == "last":
        return [L]
    if layout == "bilateral":
        return [1, L] if L > 1 else [1]
    layers = []
    for item in layout.split(","):
        if not item.strip().lstrip("-").isdigit() or item != item.strip():
            raise ValueError(f"'{layout}' is neither a named layout ({', '.join(NAMED_LAYOUTS)}) nor a list of layers")
        n = int(item)
        if not 1 <= n <= L:
            raise ValueError(f"layer {item} is out of range: the model has layers 1..{L}")
        if n in layers:
            raise ValueError(f"layer {item} is listed twice")
        layers.append(n)
    return sorted(layers)


def layer_kinds(attention, layout, n_layer):
    """One kind per layer (0-based list) from --attention and --layout; ValueError if bad."""
    if attention not in KINDS:
        raise ValueError(f"attention: unknown kind '{attention}' (choices: {', '.join(KINDS)})")
    try:
        keep = standard_layers(layout, n_layer)
    except ValueError as e:
        raise ValueError(f"layout: {e}") from None
    if attention == "standard" and layout != "uniform":
        raise ValueError(f"layout {layout} chooses the layers of a variant, but attention is standard")
    if attention != "standard" and len(keep) == n_layer:
        raise ValueError(f"layout {layout} keeps standard attention in all {n_layer} layers: "
                         f"attention {attention} would be used nowhere")
    return ["standard" if i + 1 in keep else attention for i in range(n_layer)]


class MlpMixer(nn.Module):
    """mlp: token mixing removed, a SwiGLU of each position's own (pre-normed) input in the
    attention sub-layer's place. u (B,T,d) -> (B,T,d)."""

    def __init__(self, cfg):
        super().__init__()
        d, m = cfg.n_embd, mlp_width(cfg)
        self.w_gate = nn.Parameter(torch.zeros(m, d))
        self.w_up = nn.Parameter(torch.zeros(m, d))
        self.w_down = nn.Parameter(torch.zeros(d, m))

    def forward(self, u):
        return (F.silu(u @ self.w_gate.t()) * (u @ self.w_up.t())) @ self.w_down.t()


def fixed_input_std(cfg):
    """rndembqk: the std of its fixed random input eps ~ N(0, std^2): the real stream's scale at
    init, the embedding's N(0, 0.02) times its multiplier (sqrt(d), or 1)."""
    return 0.02 * cfg.embed_multiplier


def _grouped(q, k):
    """q (B,Hq,T,hd) viewed as (B,Hkv,G,T,hd) next to k (B,Hkv,T,hd)."""
    B, Hq, T, hd = q.shape
    return q.view(B, k.shape[1], Hq // k.shape[1], T, hd)


def taylor_attention(q, k, v, mask, norm="joint"):
    """approximate: exp in the softmax replaced by 1 + x + x^2/2, x = q.k / sqrt(hd), over the
    pairs `mask` allows. joint: weights f(x) / sum f(x) (Based's feature map; f >= 1/2);
    separate: the three terms 1, x, x^2/2 each normalised by its own sum, then added (the
    paper's equations). q (B,Hq,T,hd), k, v (B,Hkv,T,hd) -> (B,Hq,T,hd)."""
    B, Hq, T, hd = q.shape
    x = torch.einsum("bkgtd,bksd->bkgts", _grouped(q, k), k) / math.sqrt(hd)
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    terms = [1.0 + x + 0.5 * x * x] if norm == "joint" else [torch.ones_like(x), x, 0.5 * x * x]
    out = 0.0
    for w in terms:
        w = torch.where(mask, w, zero)
        out = out + torch.einsum("bkgts,bksd->bkgtd", w / w.sum(-1, keepdim=True), v)
    return out.reshape(B, Hq, T, hd)


def nonapprox_attention(q, k, v, mask):
    """nonapprox: a scalar score per position from its own q and k, s[t] = q[t].k[t] / sqrt(hd),
    and out[t] = the softmax(s)-weighted average of the values the mask lets t see (every query
    of a document weighs a key alike). q (B,Hq,T,hd), k, v (B,Hkv,T,hd) -> (B,Hq,T,hd)."""
    B, Hq, T, hd = q.shape
    s = (_grouped(q, k) * k[:, :, None]).sum(-1) / math.sqrt(hd)          # (B,Hkv,G,T)
    scores = s[..., None, :].expand(*s.shape[:3], T, T)                   # [t, tau] = s[tau]
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return torch.einsum("bkgts,bksd->bkgtd", probs, v).reshape(B, Hq, T, hd)


def max_logits(kind, q, k, mask):
    """The largest |pre-softmax logit| over the pairs the mask allows (nonapprox: each
    position's own score), or 0 for mlp; q, k after QK-norm and RoPE."""
    hd = q.shape[-1]
    if kind == "nonapprox":
        return float(((_grouped(q, k) * k[:, :, None]).sum(-1) / math.sqrt(hd)).abs().max())
    x = torch.einsum("bkgtd,bksd->bkgts", _grouped(q, k), k) / math.sqrt(hd)
    return float(torch.where(mask, x.abs(), torch.zeros((), dtype=x.dtype)).max())
