"""
train_san.py -- PyTorch reference for the SAN family (attention-only "Simple Attention
Networks" and their SwiGLU-FFN control arm), the numerical twin of train_san.cu.

It does five things:
  * defines the model exactly as doc/san-model.md describes it (explicit maths: our own
    masked GQA attention, RoPE, ZCN/RMS norms; fp32 by default, fp64 for references),
  * implements the optimizers (AdamW, Muon in two orders) and the LR schedules,
  * reads/writes the tensor container of doc/formats.md ("Model checkpoints",
    "Debug state"): checkpoints (save + load) and debug states for test_san.cu,
  * trains on llm.c-format token shards (a small loop, for demos and cross-checks),
  * loads a checkpoint to evaluate it or sample from it.

Examples:
  python train_san.py --preset tiny --write-debug-state out.bin
  python train_san.py --preset tiny-ffn --norm rms --optimizer adamw --write-debug-state out.bin
  python train_san.py --preset tiny --train-data "data/x/*train*.bin" --val-data "data/x/*val*.bin" \
      --steps 200 --save-checkpoint model.bin
  python train_san.py --load-checkpoint model.bin --val-data "data/x/*val*.bin" --sample-tokens 64

Reads top to bottom: config -> parameters -> model -> loss -> optimizers -> schedules ->
file container -> data -> debug state / training / CLI.
"""

import argparse
import glob
import math
import os
import struct
import sys
import time
from dataclasses import dataclass, fields, replace

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# -----------------------------------------------------------------------------------------
# Configuration

NORM_EPS = 1e-6          # epsilon inside every ZCN / RMS norm (fixed, not a config field)
INIT_STD = 0.02          # std of every matrix and of the embedding
VOCAB_PAD = 128          # the embedding / logits are padded to a multiple of this


@dataclass
class SANConfig:
    """The SAN family (shared/DESIGN.md "The SAN family"). Field names are the keys of the
    config text in checkpoints and debug states (doc/formats.md)."""
    vocab_size: int = 250          # real vocabulary V; loss and softmax run over these ids only
    seq_len: int = 64              # max context T
    n_layer: int = 2               # L
    n_embd: int = 64               # d
    n_head: int = 4                # query heads Hq; head_dim = d / Hq
    n_kv_head: int = 2             # kv heads Hkv (Hq % Hkv == 0); Hkv == Hq is MHA
    ffn: str = "none"              # none (SAN) | swiglu (FFN control arm)
    d_ff: int = 0                  # FFN width; 0 means 4 * d (resolved in __post_init__)
    norm: str = "zcn"              # zcn: (1+g)*x/rms, g init 0 | rms: g*x/rms, g init 1
    qk_norm: bool = True           # per-head norm of q and k (gains shared across heads)
    residual: str = "gated"        # gated | standard | rezero | none
    sandwich: bool = False         # norm (own gain) on each sub-layer output before its gate
    rope_theta: float = 10000.0    # RoPE base, rotate-half convention
    doc_mask: bool = True          # same-document attention + mask of boundary-crossing targets
    bos_id: int = 2                # token that starts a document (used when doc_mask is on)
    z_loss: float = 1e-4           # coefficient of mean(logsumexp^2)

    def __post_init__(self):
        if self.d_ff == 0:
            self.d_ff = 4 * self.n_embd
        self.validate()

    def validate(self):
        def need(cond, msg):
            if not cond:
                raise ValueError(f"bad config: {msg}")
        need(self.vocab_size > 0, f"vocab_size must be > 0 (got {self.vocab_size})")
        need(self.seq_len > 0, f"seq_len must be > 0 (got {self.seq_len})")
        need(self.n_layer > 0, f"n_layer must be > 0 (got {self.n_layer})")
        need(self.n_head > 0 and self.n_kv_head > 0, "n_head and n_kv_head must be > 0")
        need(self.n_embd % self.n_head == 0,
             f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        need(self.n_head % self.n_kv_head == 0,
             f"n_head ({self.n_head}) must be divisible by n_kv_head ({self.n_kv_head})")
        need(self.head_dim % 2 == 0, f"head_dim ({self.head_dim}) must be even for RoPE")
        need(self.ffn in ("none", "swiglu"), f"ffn must be none|swiglu (got {self.ffn!r})")
        need(self.d_ff > 0, f"d_ff must be > 0 (got {self.d_ff})")
        need(self.norm in ("zcn", "rms"), f"norm must be zcn|rms (got {self.norm!r})")
        need(self.residual in ("gated", "standard", "rezero", "none"),
             f"residual must be gated|standard|rezero|none (got {self.residual!r})")
        need(self.rope_theta > 0, f"rope_theta must be > 0 (got {self.rope_theta})")
        need(0 <= self.bos_id < self.vocab_size,
             f"bos_id ({self.bos_id}) must be a token id < vocab_size ({self.vocab_size})")
        need(self.z_loss >= 0, f"z_loss must be >= 0 (got {self.z_loss})")

    @property
    def head_dim(self):
        return self.n_embd // self.n_head

    @property
    def padded_vocab_size(self):
        return (self.vocab_size + VOCAB_PAD - 1) // VOCAB_PAD * VOCAB_PAD

    # --- config text ("key=value" lines, see doc/formats.md) -------------------------
    def to_meta(self):
        out = [("model", "san")]  # which trainer a file belongs to (train_gpt2's say gpt2)
        for f in fields(self):
            v = getattr(self, f.name)
            out.append((f.name, format_meta_value(v)))
        # derived values, written for readers' convenience and checked on load
        out.append(("padded_vocab_size", str(self.padded_vocab_size)))
        out.append(("head_dim", str(self.head_dim)))
        return out

    @classmethod
    def from_meta(cls, meta, source="<meta>"):
        kw = {}
        for f in fields(cls):
            if f.name not in meta:
                raise ValueError(f"{source}: config key '{f.name}' missing")
            kw[f.name] = parse_meta_value(meta[f.name], f.type, f"{source}: key '{f.name}'")
        cfg = cls(**kw)
        for key, val in (("padded_vocab_size", cfg.padded_vocab_size), ("head_dim", cfg.head_dim)):
            if key in meta and int(meta[key]) != val:
                raise ValueError(f"{source}: {key}={meta[key]} does not match the config ({val})")
        return cfg


def format_meta_value(v):
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        return repr(v)            # shortest text that parses back to the same double
    return str(v)


def parse_meta_value(text, typ, what):
    try:
        if typ in (bool, "bool"):
            if text not in ("0", "1"):
                raise ValueError
            return text == "1"
        if typ in (int, "int"):
            return int(text)
        if typ in (float, "float"):
            return float(text)
        return text
    except ValueError:
        raise ValueError(f"{what}: cannot parse {text!r} as {getattr(typ, '__name__', typ)}") from None


# Presets: the paper's arms (d512, 8 query / 4 kv heads, vocab 16384, T 2048) and tiny ones.
# iso-depth: same L with FFN; iso-param: L/5... -> 4 layers (one SwiGLU block has 4x the
# parameters of one GQA block here, so 20 SAN layers ~ 4 FFN layers); iso-FLOP: ~9 layers
# (see flops_per_token and doc/san-model.md).
_PAPER = dict(vocab_size=16384, seq_len=2048, n_embd=512, n_head=8, n_kv_head=4,
              norm="zcn", qk_norm=True, residual="gated", sandwich=False,
              rope_theta=10000.0, doc_mask=True, bos_id=2, z_loss=1e-4)
_TINY = dict(vocab_size=250, seq_len=64, n_layer=2, n_embd=64, n_head=4, n_kv_head=2,
             norm="zcn", qk_norm=True, residual="gated", sandwich=False,
             rope_theta=10000.0, doc_mask=True, bos_id=2, z_loss=1e-4)
PRESETS = {
    "san20": dict(_PAPER, n_layer=20, ffn="none"),     # the paper's SAN
    "ffn20": dict(_PAPER, n_layer=20, ffn="swiglu"),   # iso-depth partner
    "ffn4": dict(_PAPER, n_layer=4, ffn="swiglu"),     # iso-param partner
    "ffn9": dict(_PAPER, n_layer=9, ffn="swiglu"),     # iso-FLOP partner
    "tiny": dict(_TINY, ffn="none"),
    "tiny-ffn": dict(_TINY, ffn="swiglu", d_ff=128),
    # a small SAN that learns the offline data on a CPU in minutes (as train_san.cu's demo)
    "demo": dict(_TINY, vocab_size=8192, seq_len=128, n_layer=4, n_embd=128, n_head=4, n_kv_head=2, ffn="none"),
}
# "Deconstructing Attention"'s Qwen2.5-style decoders (as train_san.cu; doc/deconstructing.md "Presets"):
# RMSNorm, SwiGLU, RoPE theta 1e6, MHA, plain residuals, no QK-norm, no biases, GPT-2's vocabulary,
# no z-loss; the smaller ones take d_ff from the 500M's 4864/896 rounded to a multiple of 128.
_QWEN = dict(vocab_size=50257, seq_len=2048, ffn="swiglu", norm="rms", qk_norm=False, residual="standard",
             sandwich=False, rope_theta=1e6, doc_mask=True, bos_id=50256, z_loss=0.0)
PRESETS.update({
    "qwen-70m": dict(_QWEN, n_layer=6, n_embd=512, n_head=8, n_kv_head=8, d_ff=2816),
    "qwen-160m": dict(_QWEN, n_layer=12, n_embd=768, n_head=12, n_kv_head=12, d_ff=4224),
    "qwen-500m": dict(_QWEN, n_layer=24, n_embd=896, n_head=14, n_kv_head=14, d_ff=4864),
    "qwen3-1.7b": dict(_QWEN, n_layer=28, n_embd=2048, n_head=16, n_kv_head=8, d_ff=6144, qk_norm=True),
    "qwen-cpu": dict(_QWEN, vocab_size=8192, seq_len=128, bos_id=2, n_layer=4, n_embd=128, n_head=4, n_kv_head=4,
                     d_ff=640),
    "qwen3-cpu": dict(_QWEN, vocab_size=8192, seq_len=128, bos_id=2, n_layer=4, n_embd=128, n_head=4, n_kv_head=2,
                      d_ff=384, qk_norm=True),
})


# -----------------------------------------------------------------------------------------
# Parameters: names, shapes, order and init. This list IS the contract with train_san.cu.

def parameter_spec(cfg):
    """[(name, shape)] in canonical order (the order of tensors in every file)."""
    d, hd = cfg.n_embd, cfg.head_dim
    dq, dkv = cfg.n_head * hd, cfg.n_kv_head * hd
    has_gate = cfg.residual in ("gated", "rezero")
    spec = [("wte", (cfg.padded_vocab_size, d))]
    for i in range(cfg.n_layer):
        p = f"layers.{i}."
        spec += [(p + "attn_norm.weight", (d,)),
                 (p + "attn.wq", (dq, d)),
                 (p + "attn.wk", (dkv, d)),
                 (p + "attn.wv", (dkv, d))]
        if cfg.qk_norm:
            spec += [(p + "attn.q_norm.weight", (hd,)), (p + "attn.k_norm.weight", (hd,))]
        spec += [(p + "attn.wo", (d, dq))]
        if cfg.sandwich:
            spec += [(p + "attn_post_norm.weight", (d,))]
        if has_gate:
            spec += [(p + "attn_gate", (1,))]
        if cfg.ffn == "swiglu":
            spec += [(p + "ffn_norm.weight", (d,)),
                     (p + "ffn.w_gate", (cfg.d_ff, d)),
                     (p + "ffn.w_up", (cfg.d_ff, d)),
                     (p + "ffn.w_down", (d, cfg.d_ff))]
            if cfg.sandwich:
                spec += [(p + "ffn_post_norm.weight", (d,))]
            if has_gate:
                spec += [(p + "ffn_gate", (1,))]
    spec += [("final_norm.weight", (d,))]
    return spec


def is_matrix_param(name, shape):
    """Matrix group (Muon / AdamW with weight decay): every 2-D weight except the embedding."""
    return len(shape) == 2 and name != "wte"


def init_value(cfg, name, shape, gen):
    """Initial value of one parameter (fp32, CPU), drawn from `gen` in canonical order."""
    if name == "wte":
        w = torch.zeros(shape)
        w[: cfg.vocab_size] = torch.randn(cfg.vocab_size, shape[1], generator=gen) * INIT_STD
        return w                                      # padded rows: exactly zero
    if len(shape) == 2:
        std = INIT_STD
        if name.endswith("attn.wo") or name.endswith("ffn.w_down"):
            std = INIT_STD / math.sqrt(2 * cfg.n_layer)
        return torch.randn(shape, generator=gen) * std
    if name.endswith(".weight"):                      # norm gains
        return torch.zeros(shape) if cfg.norm == "zcn" else torch.ones(shape)
    if name.endswith("_gate"):                        # residual gate scalars (gated/rezero)
        return torch.zeros(shape)
    raise AssertionError(f"no init rule for {name}")


def count_parameters(cfg):
    """(total, non-embedding) parameter counts, padded embedding included in total."""
    total = sum(math.prod(s) for _, s in parameter_spec(cfg))
    return total, total - cfg.padded_vocab_size * cfg.n_embd


def flops_per_token(cfg):
    """Training FLOPs per token, PaLM convention: 6 * (non-embedding params + LM head V*d)
    + 12 * L * T * d for attention scores and values (full T x T, no causal halving)."""
    _, nonemb = count_parameters(cfg)
    return 6 * (nonemb + cfg.vocab_size * cfg.n_embd) + 12 * cfg.n_layer * cfg.seq_len * cfg.n_embd


# -----------------------------------------------------------------------------------------
# Model pieces (explicit maths; shapes in comments)

def rms_normalize(x):
    """x / sqrt(mean(x^2) + eps) over the last dim; fp32 or wider."""
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS)


def apply_norm(x, gain, kind):
    """ZCN: (1 + gain) * rmsnorm(x)   RMS: gain * rmsnorm(x)."""
    y = rms_normalize(x)
    return y * (1.0 + gain) if kind == "zcn" else y * gain


def document_ids(idx, bos_id):
    """(B,T) int64: number of BOS tokens at positions <= t in the row. Tokens before the
    first BOS of a row get id 0 (the tail of a document begun in an earlier row)."""
    return torch.cumsum((idx == bos_id).to(torch.int64), dim=1)


def loss_mask(targets, cfg):
    """(B,T) bool: which targets enter the loss. A target < 0 is always ignored; with the
    document mask on, a target equal to BOS (the prediction that crosses into the next
    document) is ignored too."""
    m = targets >= 0
    if cfg.doc_mask:
        m = m & (targets != cfg.bos_id)
    return m


def rope_cos_sin(T, head_dim, theta, dtype, device):
    """(T, head_dim/2) cos and sin tables; angles computed in fp64, then cast.
    angle[t, i] = t * theta^(-2i/head_dim)."""
    half = head_dim // 2
    inv_freq = theta ** (-(torch.arange(half, dtype=torch.float64) * 2.0 / head_dim))
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cos(ang).to(dtype=dtype, device=device), torch.sin(ang).to(dtype=dtype, device=device)


def apply_rope(x, cos, sin):
    """Rotate-half RoPE. x (B,H,T,hd); pairs are (x[i], x[i+hd/2])."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def attention_mask(T, doc_ids, device):
    """(B or 1, 1, 1, T, T) bool: True where query t may attend key s (s <= t, and the same
    document when doc_ids is given)."""
    causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    if doc_ids is None:
        return causal[None, None, None]
    same = doc_ids[:, :, None] == doc_ids[:, None, :]
    return (causal[None] & same)[:, None, None]


def gqa_attention(q, k, v, mask):
    """Explicit grouped-query causal attention.
    q (B,Hq,T,hd), k,v (B,Hkv,T,hd); query head h uses kv head h // (Hq/Hkv).
    mask from attention_mask. Returns (B,Hq,T,hd)."""
    B, Hq, T, hd = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    qg = q.view(B, Hkv, G, T, hd)
    scores = torch.einsum("bkgtd,bksd->bkgts", qg, k) / math.sqrt(hd)
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("bkgts,bksd->bkgtd", probs, v)
    return out.reshape(B, Hq, T, hd)


def sdpa_attention(q, k, v, mask):
    """Second path via F.scaled_dot_product_attention (cross-check only)."""
    G = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(G, dim=1)
    v = v.repeat_interleave(G, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, :, 0])


class Norm(nn.Module):
    def __init__(self, dim, kind):
        super().__init__()
        self.kind = kind
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        return apply_norm(x, self.weight, self.kind)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        d, hd = cfg.n_embd, cfg.head_dim
        self.wq = nn.Parameter(torch.zeros(cfg.n_head * hd, d))
        self.wk = nn.Parameter(torch.zeros(cfg.n_kv_head * hd, d))
        self.wv = nn.Parameter(torch.zeros(cfg.n_kv_head * hd, d))
        self.wo = nn.Parameter(torch.zeros(d, cfg.n_head * hd))
        if cfg.qk_norm:
            self.q_norm = Norm(hd, cfg.norm)
            self.k_norm = Norm(hd, cfg.norm)

    def forward(self, u, cos, sin, mask, impl="explicit"):
        cfg = self.cfg
        B, T, _ = u.shape
        hd = cfg.head_dim
        q = (u @ self.wq.t()).view(B, T, cfg.n_head, hd)
        k = (u @ self.wk.t()).view(B, T, cfg.n_kv_head, hd)
        v = (u @ self.wv.t()).view(B, T, cfg.n_kv_head, hd)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)           # per head, over head_dim
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)   # (B,H,T,hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        attn = gqa_attention if impl == "explicit" else sdpa_attention
        y = attn(q, k, v, mask)                              # (B,Hq,T,hd)
        y = y.transpose(1, 2).reshape(B, T, cfg.n_head * hd)
        return y @ self.wo.t()


class SwiGLU(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg.n_embd
        self.w_gate = nn.Parameter(torch.zeros(cfg.d_ff, d))
        self.w_up = nn.Parameter(torch.zeros(cfg.d_ff, d))
        self.w_down = nn.Parameter(torch.zeros(d, cfg.d_ff))

    def forward(self, u):
        return (F.silu(u @ self.w_gate.t()) * (u @ self.w_up.t())) @ self.w_down.t()


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        has_gate = cfg.residual in ("gated", "rezero")
        self.attn_norm = Norm(cfg.n_embd, cfg.norm)
        self.attn = Attention(cfg)
        if cfg.sandwich:
            self.attn_post_norm = Norm(cfg.n_embd, cfg.norm)
        if has_gate:
            self.attn_gate = nn.Parameter(torch.zeros(1))
        if cfg.ffn == "swiglu":
            self.ffn_norm = Norm(cfg.n_embd, cfg.norm)
            self.ffn = SwiGLU(cfg)
            if cfg.sandwich:
                self.ffn_post_norm = Norm(cfg.n_embd, cfg.norm)
            if has_gate:
                self.ffn_gate = nn.Parameter(torch.zeros(1))

    def residual(self, x, h, post_norm, gate):
        """x: stream, h: sub-layer output."""
        if post_norm is not None:
            h = post_norm(h)
        mode = self.cfg.residual
        if mode == "gated":
            return x + torch.sigmoid(gate) * h
        if mode == "rezero":
            return x + gate * h
        if mode == "standard":
            return x + h
        return h                                             # "none": no skip connection

    def forward(self, x, cos, sin, mask, impl="explicit"):
        cfg = self.cfg
        h = self.attn(self.attn_norm(x), cos, sin, mask, impl)
        x = self.residual(x, h, getattr(self, "attn_post_norm", None), getattr(self, "attn_gate", None))
        if cfg.ffn == "swiglu":
            h = self.ffn(self.ffn_norm(x))
            x = self.residual(x, h, getattr(self, "ffn_post_norm", None), getattr(self, "ffn_gate", None))
        return x


class SAN(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Parameter(torch.zeros(cfg.padded_vocab_size, cfg.n_embd))
        self.layers = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.final_norm = Norm(cfg.n_embd, cfg.norm)
        self.attn_impl = "explicit"        # "sdpa" switches to the cross-check path
        names = {n for n, _ in self.named_parameters()}
        assert names == {n for n, _ in parameter_spec(cfg)}, "module tree != parameter_spec"

    def init_weights(self, seed):
        """Init of shared/papers/SAN.md, drawn in canonical order from a CPU generator so
        the result does not depend on the device."""
        gen = torch.Generator().manual_seed(seed)
        params = dict(self.named_parameters())
        with torch.no_grad():
            for name, shape in parameter_spec(self.cfg):
                params[name].copy_(init_value(self.cfg, name, shape, gen))
        return self

    def ordered_parameters(self):
        """[(name, Parameter)] in canonical order."""
        params = dict(self.named_parameters())
        return [(n, params[n]) for n, _ in parameter_spec(self.cfg)]

    def forward(self, idx, targets=None):
        """idx (B,T) int64 token ids < vocab_size. Returns logits (B,T,Vp) and, when
        targets are given, (loss, ce, lse_sq) from san_loss."""
        cfg = self.cfg
        B, T = idx.shape
        if T > cfg.seq_len:
            raise ValueError(f"sequence length {T} exceeds seq_len {cfg.seq_len}")
        x = F.embedding(idx, self.wte) * math.sqrt(cfg.n_embd)
        cos, sin = rope_cos_sin(T, cfg.head_dim, cfg.rope_theta, x.dtype, x.device)
        doc = document_ids(idx, cfg.bos_id) if cfg.doc_mask else None
        mask = attention_mask(T, doc, idx.device)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, self.attn_impl)
        x = self.final_norm(x)
        logits = x @ self.wte.t()                            # (B,T,Vp), fp32 or wider
        if targets is None:
            return logits, None
        return logits, san_loss(logits, targets, cfg)


def san_loss(logits, targets, cfg):
    """Masked mean cross-entropy + z_loss * mean(lse^2), both over the unmasked positions,
    softmax over the real vocabulary only. Returns (loss, ce_mean, lse_sq_mean)."""
    logits = logits[..., : cfg.vocab_size]
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    m = loss_mask(targets, cfg)
    n = m.sum().clamp(min=1).to(logits.dtype)                # all masked -> loss 0
    lse = torch.logsumexp(logits, dim=-1)                    # (B,T)
    tgt = torch.gather(logits, -1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    mf = m.to(logits.dtype)
    ce = ((lse - tgt) * mf).sum() / n
    lse_sq = (lse * lse * mf).sum() / n
    return ce + cfg.z_loss * lse_sq, ce, lse_sq


# -----------------------------------------------------------------------------------------
# Optimizers

NS_COEFFS = (3.4445, -4.7750, 2.0315)
NS_EPS = 1e-7


def newton_schulz(G, steps=5, coeffs=NS_COEFFS):
    """Approximate orthogonalisation: X0 = G / (||G||_F + 1e-7), worked on in the wide
    orientation (rows <= cols; tall inputs are transposed and transposed back), then
    `steps` times X <- a X + (b A + c A^2) X with A = X X^T. Each singular value s of X0
    is mapped by p(s) = a s + b s^3 + c s^5 per step; the singular vectors are kept."""
    a, b, c = coeffs
    X = G / (G.norm() + NS_EPS)
    tall = X.shape[0] > X.shape[1]
    if tall:
        X = X.t()
    for _ in range(steps):
        A = X @ X.t()
        X = a * X + (b * A + c * (A @ A)) @ X
    return X.t() if tall else X


@dataclass
class OptConfig:
    optimizer: str = "muon"        # muon | adamw
    muon_order: str = "keller"     # keller: momentum, then orthogonalise, shape factor | paper
    lr: float = 0.02               # peak rate of the matrix group
    lr_other: float = 3e-4         # peak rate of the non-matrix group (embedding, gains, gates)
    weight_decay: float = 0.01     # decoupled, matrix group only
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    muon_momentum: float = 0.95
    ns_steps: int = 5
    grad_clip: float = 1.0         # global-norm clip; <= 0 disables
    schedule: str = "wsd"          # wsd | cosine | linear | constant
    warmup_frac: float = 0.05
    decay_frac: float = 0.15       # wsd only: final fraction of steps that decays
    final_frac: float = 0.05       # lr at the end of decay, as a fraction of peak

    def validate(self):
        ok = (self.optimizer in ("muon", "adamw") and self.muon_order in ("keller", "paper")
              and self.schedule in ("wsd", "cosine", "linear", "constant")
              and 0 <= self.warmup_frac <= 1 and 0 <= self.decay_frac <= 1 and self.final_frac >= 0
              and self.ns_steps >= 0 and self.lr >= 0 and self.lr_other >= 0)
        if not ok:
            raise ValueError(f"bad optimizer config: {self}")

    def to_meta(self):
        return [("opt." + f.name, format_meta_value(getattr(self, f.name))) for f in fields(self)]

    @classmethod
    def from_meta(cls, meta, source="<meta>"):
        kw = {f.name: parse_meta_value(meta["opt." + f.name], f.type, f"{source}: opt.{f.name}")
              for f in fields(cls) if "opt." + f.name in meta}
        return cls(**kw)


class SANOptimizer:
    """AdamW or Muon on the matrix group, AdamW (no decay) on the rest. Equations in
    doc/san-model.md "Optimizers". State is kept per parameter name."""

    def __init__(self, model, oc):
        oc.validate()
        self.oc = oc
        self.params = model.ordered_parameters()
        self.matrix = {n for n, p in self.params if is_matrix_param(n, tuple(p.shape))}
        self.step_count = 0
        self.state = {}
        for n, p in self.params:
            if oc.optimizer == "muon" and n in self.matrix:
                self.state[n] = {"mom": torch.zeros_like(p)}
            else:
                self.state[n] = {"m": torch.zeros_like(p), "v": torch.zeros_like(p)}

    @torch.no_grad()
    def step(self, lr_matrix, lr_other):
        oc = self.oc
        self.step_count += 1
        t = self.step_count
        for n, p in self.params:
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            is_mat = n in self.matrix
            lr = lr_matrix if is_mat else lr_other
            wd = oc.weight_decay if is_mat else 0.0
            st = self.state[n]
            if "mom" in st:
                self._muon(p, g, st["mom"], lr, wd)
            else:
                m, v = st["m"], st["v"]
                m.mul_(oc.beta1).add_(g, alpha=1 - oc.beta1)
                v.mul_(oc.beta2).addcmul_(g, g, value=1 - oc.beta2)
                mhat = m / (1 - oc.beta1 ** t)
                vhat = v / (1 - oc.beta2 ** t)
                p.mul_(1 - lr * wd)
                p.sub_(lr * mhat / (vhat.sqrt() + oc.eps))

    def _muon(self, p, g, mom, lr, wd):
        oc, mu = self.oc, self.oc.muon_momentum
        rows, cols = p.shape
        if oc.muon_order == "keller":
            mom.mul_(mu).add_(g, alpha=1 - mu)                  # M = mu M + (1-mu) g
            u = g * (1 - mu) + mom * mu                          # Nesterov
            upd = newton_schulz(u, oc.ns_steps) * math.sqrt(max(1.0, rows / cols))
        else:                                                    # paper: orthogonalise first
            o = newton_schulz(g, oc.ns_steps)
            mom.mul_(mu).add_(o)                                 # M = mu M + O (no 1-mu)
            upd = o + mom * mu
        p.mul_(1 - lr * wd)
        p.sub_(lr * upd)

    def state_tensors(self):
        """{file name: tensor} for checkpoints: opt.m.<p>, opt.v.<p>, opt.mom.<p>."""
        out = {}
        for n, _ in self.params:
            for key, t in self.state[n].items():
                out[f"opt.{key}.{n}"] = t
        return out

    def load_state_tensors(self, tensors, step, source):
        self.step_count = step
        for n, _ in self.params:
            for key, t in self.state[n].items():
                name = f"opt.{key}.{n}"
                if name not in tensors:
                    raise ValueError(f"{source}: optimizer tensor '{name}' missing")
                src = torch.as_tensor(tensors[name])
                if tuple(src.shape) != tuple(t.shape):
                    raise ValueError(f"{source}: '{name}' has shape {tuple(src.shape)}, expected {tuple(t.shape)}")
                t.copy_(src)


def clip_grad_norm(params, max_norm):
    """Global L2 norm over all gradients (returned before clipping); if max_norm > 0 the
    gradients are multiplied by min(1, max_norm / (norm + 1e-6))."""
    grads = [p.grad for _, p in params if p.grad is not None]
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads)).item() if grads else 0.0
    if max_norm > 0:
        scale = min(1.0, max_norm / (norm + 1e-6))
        if scale < 1.0:
            for g in grads:
                g.mul_(scale)
    return norm


# -----------------------------------------------------------------------------------------
# Learning-rate schedules

def round_steps(frac, total):
    return int(math.floor(frac * total + 0.5))


def lr_multiplier(step, total, kind, warmup_frac=0.05, decay_frac=0.15, final_frac=0.05):
    """Multiplier of the peak rate at optimizer step `step` (0-based) of `total`.
    W = round(warmup_frac * total): steps 0..W-1 ramp linearly as (step+1)/W.
    wsd: constant 1 until step total-D-1, D = round(decay_frac * total); then with
         p = (step - (total-D) + 1) / D in (0, 1], f = final + (1-final)(1+cos(pi p))/2.
    cosine / linear: after warmup, p = (step - W + 1) / (total - W) and
         f = final + (1-final)(1+cos(pi p))/2, resp. f = 1 - (1-final) p.
    constant: 1 after warmup. The last step of wsd/cosine/linear is exactly `final`."""
    if not 0 <= step < total:
        raise ValueError(f"step {step} outside [0, {total})")
    W = round_steps(warmup_frac, total)
    D = round_steps(decay_frac, total) if kind == "wsd" else 0
    if W + D > total:
        raise ValueError(f"warmup ({W}) + decay ({D}) steps exceed total ({total})")
    if step < W:
        return (step + 1) / W
    if kind == "constant":
        return 1.0
    if kind == "wsd":
        start = total - D
        if step < start:
            return 1.0
        p = (step - start + 1) / D
        return final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * p))
    p = (step - W + 1) / (total - W)
    if kind == "cosine":
        return final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * p))
    if kind == "linear":
        return 1.0 - (1 - final_frac) * p
    raise ValueError(f"unknown schedule {kind!r}")


def group_lrs(oc, step, total):
    f = lr_multiplier(step, total, oc.schedule, oc.warmup_frac, oc.decay_frac, oc.final_frac)
    return oc.lr * f, oc.lr_other * f


# -----------------------------------------------------------------------------------------
# File container (doc/formats.md "Model checkpoints" and "Debug state")

FILE_MAGIC = b"ATTNFILE"
FILE_VERSION = 1
KIND_CHECKPOINT = 1
KIND_DEBUG_STATE = 2
KIND_NAMES = {KIND_CHECKPOINT: "checkpoint", KIND_DEBUG_STATE: "debug state"}
HEADER_BYTES = 64
ENTRY_BYTES = 128
NAME_BYTES = 64
MAX_NDIM = 4
ALIGN = 64
DT_FP32, DT_BF16, DT_INT32 = 0, 1, 2
DTYPE_ITEMSIZE = {DT_FP32: 4, DT_BF16: 2, DT_INT32: 4}
DTYPE_NAMES = {"fp32": DT_FP32, "bf16": DT_BF16, "int32": DT_INT32}


def _align(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def fp32_to_bf16_bits(a):
    """fp32 array -> uint16 bf16 bits, round to nearest even (NaN kept quiet)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def bf16_bits_to_fp32(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def _to_numpy(t):
    if isinstance(t, torch.Tensor):
        t = t.detach().cpu()
        if t.dtype in (torch.float64, torch.float16, torch.bfloat16):
            t = t.float()
        return t.numpy()
    return np.asarray(t)


def write_container(path, kind, meta, tensors):
    """meta: [(key, value-text)]; tensors: [(name, array-like, dtype-name)] with dtype-name
    in fp32 | bf16 | int32. Written atomically (path.tmp, then rename)."""
    text = "".join(f"{k}={v}\n" for k, v in meta).encode("ascii")
    for k, v in meta:
        if "=" in k or "\n" in k or "\n" in str(v) or not k:
            raise ValueError(f"bad meta entry {k!r}={v!r}")
    entries, blobs, offset = [], [], 0
    names = set()
    for name, arr, dt in tensors:
        code = DTYPE_NAMES[dt]
        a = _to_numpy(arr)
        if code == DT_FP32:
            data = np.ascontiguousarray(a, dtype="<f4")
        elif code == DT_INT32:
            if a.size and (a.min() < -2**31 or a.max() >= 2**31):
                raise ValueError(f"tensor {name} does not fit int32")
            data = np.ascontiguousarray(a, dtype="<i4")
        else:
            data = fp32_to_bf16_bits(np.asarray(a, dtype=np.float32)).astype("<u2")
        nb = name.encode("ascii")
        if len(nb) >= NAME_BYTES or name in names:
            raise ValueError(f"tensor name {name!r} too long or repeated")
        if data.ndim > MAX_NDIM:
            raise ValueError(f"tensor {name} has {data.ndim} dims (max {MAX_NDIM})")
        names.add(name)
        shape = list(data.shape) + [0] * (MAX_NDIM - data.ndim)
        entries.append(struct.pack("<64sII4QQQ8x", nb, code, data.ndim, *shape, offset, data.nbytes))
        blobs.append((offset, data.tobytes()))
        offset = _align(offset + data.nbytes)
    data_offset = _align(HEADER_BYTES + len(text) + ENTRY_BYTES * len(entries))
    data_bytes = offset
    header = struct.pack("<8sIIQQQQ16x", FILE_MAGIC, FILE_VERSION, kind, len(text), len(entries),
                         data_offset, data_bytes)
    assert len(header) == HEADER_BYTES and all(len(e) == ENTRY_BYTES for e in entries)
    tmp = str(path) + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header)
        f.write(text)
        for e in entries:
            f.write(e)
        f.write(b"\0" * (data_offset - f.tell()))
        for off, blob in blobs:
            f.write(b"\0" * (data_offset + off - f.tell()))
            f.write(blob)
        f.write(b"\0" * (data_offset + data_bytes - f.tell()))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class ContainerError(ValueError):
    pass


def read_container(path, expect_kind=None):
    """Returns (kind, meta dict, {name: numpy array}) with tensors in file order; bf16 is
    returned as float32. Every check failure names the file and what is wrong."""
    def fail(msg):
        raise ContainerError(f"{path}: {msg}")
    try:
        with open(path, "rb") as f:
            buf = f.read()
    except OSError as e:
        raise ContainerError(f"{path}: cannot read ({e.strerror})") from None
    if len(buf) < HEADER_BYTES:
        fail(f"file is {len(buf)} bytes, shorter than the {HEADER_BYTES}-byte header")
    magic, version, kind, meta_bytes, n_tensors, data_offset, data_bytes = \
        struct.unpack_from("<8sIIQQQQ", buf, 0)
    if magic != FILE_MAGIC:
        fail(f"bad magic {magic!r}, expected {FILE_MAGIC!r} (not an attn.c checkpoint/debug state)")
    if version != FILE_VERSION:
        fail(f"unsupported version {version}, this reader knows version {FILE_VERSION}")
    if kind not in KIND_NAMES:
        fail(f"unknown kind {kind}")
    if expect_kind is not None and kind != expect_kind:
        fail(f"is a {KIND_NAMES[kind]}, expected a {KIND_NAMES[expect_kind]}")
    table_end = HEADER_BYTES + meta_bytes + ENTRY_BYTES * n_tensors
    if data_offset % ALIGN or data_offset < table_end:
        fail(f"data offset {data_offset} is not a multiple of {ALIGN} at or after the table end {table_end}")
    if len(buf) != data_offset + data_bytes:
        fail(f"size is {len(buf)} bytes, header says {data_offset + data_bytes}")
    try:
        text = buf[HEADER_BYTES:HEADER_BYTES + meta_bytes].decode("ascii")
    except UnicodeDecodeError:
        fail("config text is not ASCII")
    meta = {}
    for line in text.split("\n")[:-1] if text else []:
        key, sep, val = line.partition("=")
        if not sep or not key:
            fail(f"config line {line!r} is not key=value")
        if key in meta:
            fail(f"config key {key!r} repeated")
        meta[key] = val
    if text and not text.endswith("\n"):
        fail("config text does not end with a newline")
    tensors = {}
    for i in range(n_tensors):
        e = struct.unpack_from("<64sII4QQQ", buf, HEADER_BYTES + meta_bytes + i * ENTRY_BYTES)
        raw_name, code, ndim, shape, offset, nbytes = e[0], e[1], e[2], e[3:7], e[7], e[8]
        name = raw_name.split(b"\0", 1)[0].decode("ascii", "replace")
        if b"\0" not in raw_name or not name:
            fail(f"tensor {i}: name is empty or not NUL-terminated")
        if code not in DTYPE_ITEMSIZE:
            fail(f"tensor {name}: unknown dtype code {code}")
        if ndim > MAX_NDIM or any(shape[ndim:]):
            fail(f"tensor {name}: bad ndim {ndim} / shape {shape}")
        shp = tuple(int(s) for s in shape[:ndim])
        if nbytes != math.prod(shp) * DTYPE_ITEMSIZE[code]:
            fail(f"tensor {name}: {nbytes} bytes does not match shape {shp}")
        if offset % ALIGN or offset + nbytes > data_bytes:
            fail(f"tensor {name}: offset {offset} (+{nbytes}) outside the data section ({data_bytes} bytes)")
        if name in tensors:
            fail(f"tensor {name} repeated")
        start = data_offset + offset
        np_dt = {DT_FP32: "<f4", DT_BF16: "<u2", DT_INT32: "<i4"}[code]
        a = np.frombuffer(buf, dtype=np_dt, count=math.prod(shp), offset=start).reshape(shp).copy()
        tensors[name] = bf16_bits_to_fp32(a) if code == DT_BF16 else a
    return kind, meta, tensors


def param_tensors(model):
    return [(n, p, "fp32") for n, p in model.ordered_parameters()]


def load_params_into(model, tensors, source):
    """Copy every canonical parameter from tensors (checks presence and shape)."""
    with torch.no_grad():
        for n, p in model.ordered_parameters():
            if n not in tensors:
                raise ContainerError(f"{source}: parameter '{n}' missing")
            a = tensors[n]
            if tuple(a.shape) != tuple(p.shape):
                raise ContainerError(f"{source}: parameter '{n}' has shape {tuple(a.shape)}, "
                                     f"expected {tuple(p.shape)}")
            p.copy_(torch.from_numpy(np.asarray(a, dtype=np.float32)))


def save_checkpoint(path, model, step=0, optimizer=None):
    meta = model.cfg.to_meta() + [("step", str(step)), ("has_optimizer", "1" if optimizer else "0")]
    tensors = param_tensors(model)
    if optimizer is not None:
        meta += optimizer.oc.to_meta()
        tensors += [(n, t, "fp32") for n, t in optimizer.state_tensors().items()]
    write_container(path, KIND_CHECKPOINT, meta, tensors)


def load_checkpoint(path, device="cpu"):
    """Returns (model, step, meta, tensors). The optimizer state, if any, stays in
    tensors/meta: restore it with SANOptimizer(...).load_state_tensors."""
    _, meta, tensors = read_container(path, KIND_CHECKPOINT)
    kind = meta.get("model", "san")  # files from before the key are SAN files
    if kind != "san":
        raise ValueError(f"{path} is a {kind} checkpoint (config key model={kind}): it belongs to train_{kind}, "
                         f"not train_san")
    cfg = SANConfig.from_meta(meta, str(path))
    model = SAN(cfg)
    load_params_into(model, tensors, str(path))
    step = int(meta.get("step", "0"))
    return model.to(device), step, meta, tensors


# -----------------------------------------------------------------------------------------
# Token shards (llm.c format; doc/formats.md "Token shards")

SHARD_MAGIC = 20240520
SHARD_HEADER_INTS = 256


def read_shard(path):
    """Token array (memmap, uint16 for version 1, uint32 for version 2) after checking the
    header and the file size."""
    size = os.path.getsize(path)
    if size < SHARD_HEADER_INTS * 4:
        raise ValueError(f"{path}: {size} bytes, shorter than the 1024-byte shard header")
    header = np.fromfile(path, dtype="<i4", count=SHARD_HEADER_INTS)
    if header[0] != SHARD_MAGIC:
        raise ValueError(f"{path}: bad magic {header[0]}, expected {SHARD_MAGIC} (llm.c token shard)")
    if header[1] not in (1, 2):
        raise ValueError(f"{path}: unsupported version {header[1]} (1 = uint16, 2 = uint32 tokens)")
    ntok = int(header[2])
    itemsize = 2 if header[1] == 1 else 4
    if ntok < 0 or size != SHARD_HEADER_INTS * 4 + ntok * itemsize:
        raise ValueError(f"{path}: size {size} does not match {ntok} tokens of {itemsize} bytes")
    return np.memmap(path, dtype="<u2" if itemsize == 2 else "<u4", mode="r",
                     offset=SHARD_HEADER_INTS * 4, shape=(ntok,))


class ShardLoader:
    """Sequential batches of B rows x (T+1) tokens; consecutive rows overlap by one token
    (row r covers tokens [pos + rT, pos + (r+1)T]), so every token is a target once. Shards
    with a region sidecar (x.regions next to x.bin; doc/formats.md) also give each batch's
    (B, T+1) region labels in `regions` (llmc/dataloader.h reads the same files)."""

    def __init__(self, pattern, B, T, vocab_size):
        self.files = sorted(f for f in glob.glob(pattern) if f.endswith(".bin"))
        if not self.files:
            raise ValueError(f"no token shards match {pattern!r}")
        self.B, self.T, self.V = B, T, vocab_size
        self.has_regions = any(os.path.exists(self._regions_path(f)) for f in self.files)
        self.regions = None
        self.reset()

    @staticmethod
    def _regions_path(shard):
        return shard[:-4] + ".regions"

    def _load(self, i):
        self.tokens = read_shard(self.files[i])
        self.labels = None
        if self.has_regions and os.path.exists(self._regions_path(self.files[i])):
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "dev", "data"))
            from shards import read_regions
            self.labels = read_regions(self._regions_path(self.files[i]))
            if len(self.labels) != len(self.tokens):
                raise ValueError(f"{self._regions_path(self.files[i])}: {len(self.labels)} labels for "
                                 f"{len(self.tokens)} tokens")

    def reset(self):
        self.shard, self.pos = 0, 0
        self._load(0)
        self._check_fits()

    def _check_fits(self):
        if len(self.tokens) < self.B * self.T + 1:
            raise ValueError(f"{self.files[self.shard]}: {len(self.tokens)} tokens, fewer than one batch "
                             f"({self.B}x{self.T}+1)")

    def next_batch(self):
        n = self.B * self.T
        if self.pos + n + 1 > len(self.tokens):
            self.shard = (self.shard + 1) % len(self.files)
            self._load(self.shard)
            self.pos = 0
            self._check_fits()
        buf = np.asarray(self.tokens[self.pos:self.pos + n + 1], dtype=np.int64)
        if buf.max() >= self.V:
            raise ValueError(f"{self.files[self.shard]}: token id {buf.max()} >= vocab_size {self.V}")
        if self.has_regions:  # (B, T+1): row b's window, as the tokens (0 "other" without a sidecar)
            lab = np.zeros(n + 1, np.int64) if self.labels is None else np.asarray(
                self.labels[self.pos:self.pos + n + 1], dtype=np.int64)
            idx = np.arange(self.B)[:, None] * self.T + np.arange(self.T + 1)[None, :]
            self.regions = lab[idx]
        self.pos += n
        x = torch.from_numpy(buf[:-1].reshape(self.B, self.T))
        y = torch.from_numpy(buf[1:].reshape(self.B, self.T))
        return x, y


# -----------------------------------------------------------------------------------------
# Debug state

def debug_batch(cfg, B, seed):
    """A deterministic batch of B x (T+1) tokens: uniform ids, with BOS placed so that row 0
    starts with a partial document (no BOS at 0) and every row holds several documents."""
    g = torch.Generator().manual_seed(seed + 1)
    T = cfg.seq_len
    toks = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=g)
    for b in range(B):
        starts = torch.randint(0, T + 1, (3,), generator=g).tolist()
        if b > 0:
            starts.append(0)
        for s in starts:
            toks[b, s] = cfg.bos_id
    toks[0, 0] = (cfg.bos_id + 1) % cfg.vocab_size
    return toks[:, :-1].contiguous(), toks[:, 1:].contiguous()


def train_steps(model, opt, x, y, n_steps, total_steps):
    """n_steps optimizer steps on one fixed batch; returns per-step records of the loss
    before the update, the pre-clip grad norm and the two group rates."""
    rec = {"loss": [], "grad_norm": [], "lr_matrix": [], "lr_other": []}
    for s in range(n_steps):
        model.zero_grad(set_to_none=True)
        _, (loss, _, _) = model(x, y)
        loss.backward()
        norm = clip_grad_norm(model.ordered_parameters(), opt.oc.grad_clip)
        lr_m, lr_o = group_lrs(opt.oc, opt.step_count, total_steps)
        opt.step(lr_m, lr_o)
        for k, v in zip(rec, (loss.item(), norm, lr_m, lr_o)):
            rec[k].append(v)
    return rec


def write_debug_state(path, cfg, oc, seed=42, batch_size=4, n_steps=10, schedule_steps=None,
                      precision="fp64"):
    """Debug state of doc/formats.md: config + optimizer settings, initial parameters, one
    batch, logits, loss, all gradients, an n_steps trajectory and the final parameters.
    Everything is computed in `precision` (fp64 by default: a more exact reference for
    the fp32 CUDA build) from fp32 initial parameters, and stored as fp32."""
    schedule_steps = schedule_steps or n_steps
    model = SAN(cfg).init_weights(seed)
    init_params = [(n, p.detach().clone()) for n, p in model.ordered_parameters()]
    if precision == "fp64":
        model = model.double()
    x, y = debug_batch(cfg, batch_size, seed)
    logits, (loss, ce, lse_sq) = model(x, y)
    model.zero_grad(set_to_none=True)
    loss.backward()
    grads = [(n, p.grad.detach().clone()) for n, p in model.ordered_parameters()]
    model.zero_grad(set_to_none=True)
    opt = SANOptimizer(model, oc)
    rec = train_steps(model, opt, x, y, n_steps, schedule_steps)
    meta = cfg.to_meta() + oc.to_meta() + [
        ("seed", str(seed)), ("debug.batch_size", str(batch_size)), ("debug.steps", str(n_steps)),
        ("debug.schedule_steps", str(schedule_steps)), ("debug.precision", precision)]
    doc = document_ids(x, cfg.bos_id) if cfg.doc_mask else torch.zeros_like(x)
    t = [(n, p, "fp32") for n, p in init_params]
    t += [("batch.inputs", x, "int32"), ("batch.targets", y, "int32"),
          ("batch.doc_ids", doc, "int32"), ("batch.loss_mask", loss_mask(y, cfg).long(), "int32"),
          ("logits", logits, "fp32"),
          ("loss", loss.reshape(1), "fp32"), ("loss.ce", ce.reshape(1), "fp32"),
          ("loss.lse_sq", lse_sq.reshape(1), "fp32")]
    t += [("grad." + n, g, "fp32") for n, g in grads]
    t += [("traj." + k, np.array(v, dtype=np.float64), "fp32") for k, v in rec.items()]
    t += [("final." + n, p, "fp32") for n, p in model.ordered_parameters()]
    write_container(path, KIND_DEBUG_STATE, meta, t)
    return loss.item(), rec


# -----------------------------------------------------------------------------------------
# Evaluation and sampling

VAL_BATCHES = 8  # the CUDA trainers' --val-batches default


REGION_NAMES = ("other", "query", "trace", "answer")


@torch.no_grad()
def evaluate_regions(model, loader, n_batches=VAL_BATCHES):
    """(validation loss, {region name: loss}) over the first n_batches batches: cross-entropy
    only (the z-loss term is not part of it), token-weighted: the sum over every counted
    target / their number. Per region of the target token when the shards have region
    sidecars, over the targets whose whole document is in the row (after the row's first
    BOS; with the document mask only, as train_san.cu), as llmc/training.h evaluate()."""
    model.eval()
    loader.reset()
    cfg = model.cfg
    ce_sum, count = 0.0, 0
    region_sum, region_count = np.zeros(len(REGION_NAMES)), np.zeros(len(REGION_NAMES), np.int64)
    dev = model.wte.device
    doc_start = cfg.bos_id if getattr(cfg, "doc_mask", False) else None
    for _ in range(n_batches):
        x, y = loader.next_batch()
        x, y = x.to(dev), y.to(dev)
        logits, (_, ce, _) = model(x, y)
        mask = loss_mask(y, cfg)
        n = int(mask.sum())
        ce_sum += ce.item() * n
        count += n
        if loader.regions is None or doc_start is None:
            continue
        V = cfg.vocab_size
        per = torch.nn.functional.cross_entropy(logits[..., :V].double().reshape(-1, V), y.clamp(min=0).reshape(-1),
                                                reduction="none").reshape(y.shape).cpu().numpy()
        whole = (torch.cumsum((x == doc_start).long(), dim=1) > 0)
        counted = (mask & whole).cpu().numpy()
        labels = loader.regions[:, 1:]  # the target token's region
        for g in range(len(REGION_NAMES)):
            sel = counted & (labels == g)
            region_sum[g] += per[sel].sum()
            region_count[g] += int(sel.sum())
    model.train()
    regions = {REGION_NAMES[g]: region_sum[g] / region_count[g] for g in range(len(REGION_NAMES))
               if region_count[g] > 0}
    return ce_sum / max(count, 1), regions


def evaluate(model, loader, n_batches=VAL_BATCHES):
    """The validation loss of evaluate_regions."""
    return evaluate_regions(model, loader, n_batches)[0]


def format_val(loss, regions):
    """"val loss X | query Y | ..." as train_san.cu prints it."""
    return f"val loss {loss:.4f}" + "".join(f" | {name} {value:.4f}" for name, value in regions.items())


@torch.no_grad()
def sample(model, prompt, n_tokens, temperature=1.0, seed=0):
    """Multinomial sampling over the real vocabulary; the context is cropped to seq_len."""
    g = torch.Generator(device=model.wte.device).manual_seed(seed)
    cfg = model.cfg
    toks = list(prompt)
    for _ in range(n_tokens):
        ctx = torch.tensor([toks[-cfg.seq_len:]], device=model.wte.device)
        logits, _ = model(ctx)
        lg = logits[0, -1, : cfg.vocab_size].double() / max(temperature, 1e-6)
        toks.append(int(torch.multinomial(torch.softmax(lg, -1), 1, generator=g)))
    return toks


# -----------------------------------------------------------------------------------------
# CLI

def resolve_device(name):
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def build_parser():
    p = argparse.ArgumentParser(description="PyTorch reference for the SAN family (see doc/san-model.md)",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--preset", default="tiny", choices=sorted(PRESETS), help="base config; flags below override it")
    g = p.add_argument_group("model config (default: the preset's value)")
    for f in fields(SANConfig):
        flag = model_flag(f.name)
        if f.type in (bool, "bool"):
            g.add_argument(flag, dest=f.name, type=int, choices=(0, 1), default=None)
        elif f.name in ("ffn", "norm", "residual"):
            choices = {"ffn": ("none", "swiglu"), "norm": ("zcn", "rms"),
                       "residual": ("gated", "standard", "rezero", "none")}[f.name]
            g.add_argument(flag, dest=f.name, choices=choices, default=None)
        else:
            g.add_argument(flag, dest=f.name, type=int if f.type in (int, "int") else float, default=None)
    o = p.add_argument_group("optimizer and schedule")
    o.add_argument("--optimizer", choices=("muon", "adamw"), default="muon")
    o.add_argument("--muon-order", choices=("keller", "paper"), default="keller")
    o.add_argument("--lr", type=float, default=None, help="matrix-group peak rate (muon 0.02, adamw 6e-4)")
    o.add_argument("--lr-other", type=float, default=None,
                   help="non-matrix-group peak rate (muon 3e-4, adamw: same as --lr)")
    o.add_argument("--lr-scale-gpus", type=int, default=1,
                   help="scale rates for N GPUs: AdamW rates x N, Muon rate x sqrt(N)")
    for f in fields(OptConfig):
        if f.name in ("optimizer", "muon_order", "lr", "lr_other"):
            continue
        flag = "--" + f.name.replace("_", "-")
        if f.name == "schedule":
            o.add_argument(flag, choices=("wsd", "cosine", "linear", "constant"), default=f.default)
        else:
            o.add_argument(flag, type=type(f.default), default=f.default)
    r = p.add_argument_group("run")
    r.add_argument("--seed", type=int, default=42)
    r.add_argument("--device", default="auto", help="auto | cpu | cuda")
    r.add_argument("--write-debug-state", metavar="PATH", help="write a debug state and exit")
    r.add_argument("--debug-batch-size", type=int, default=4)
    r.add_argument("--debug-steps", type=int, default=10)
    r.add_argument("--debug-schedule-steps", type=int, default=0, help="schedule length (0: --debug-steps)")
    r.add_argument("--debug-precision", choices=("fp32", "fp64"), default="fp64")
    r.add_argument("--load-checkpoint", metavar="PATH", help="model (and optimizer state) to start from")
    r.add_argument("--init-from", metavar="PATH",
                   help="model config and parameters to start from, the optimizer fresh (as the C++ trainers)")
    r.add_argument("--save-checkpoint", metavar="PATH", help="checkpoint written at the end of training")
    r.add_argument("--train-data", metavar="GLOB", help="training shards (llm.c format)")
    r.add_argument("--val-data", metavar="GLOB", help="validation shards")
    r.add_argument("--steps", type=int, default=0, help="optimizer steps (0: no training)")
    r.add_argument("--batch-size", type=int, default=8)
    r.add_argument("--seq-len", dest="row_len", type=int, default=0,
                   help="tokens per row (0: the model's context, --max-seq-len)")
    r.add_argument("--grad-accum", type=int, default=0,
                   help="micro-batches per step (0: --global-batch / --batch-size, or 1)")
    r.add_argument("--global-batch", type=int, default=0, help="rows per optimizer step (0: batch-size x grad-accum)")
    r.add_argument("--paper-setup", type=int, choices=(0, 1), default=0,
                   help="1: the SAN paper's recipe as defaults (doc/san-model.md 'Paper setup'); flags given win")
    r.add_argument("--val-every", type=int, default=50)
    r.add_argument("--val-batches", type=int, default=VAL_BATCHES)
    r.add_argument("--sample-tokens", type=int, default=0, help="tokens to sample at the end (printed as ids)")
    r.add_argument("--tokenizer", metavar="PATH",
                   help="tokenizer .bin (dev/data/tokenizer.py, as the C++ trainers read it): sets the vocabulary "
                        "size and decodes the sample")
    r.add_argument("--attn-impl", choices=("explicit", "sdpa"), default="explicit")
    return p


def model_flag(field):
    """The command-line flag of a model config field, as train_san.cu names it (the model's
    context is --max-seq-len; --seq-len is the length of the rows trained and validated on)."""
    return "--max-seq-len" if field == "seq_len" else "--" + field.replace("_", "-")


def load_tokenizer_bin(path):
    """The tokenizer .bin as dev/data/tokenizer.py reads it, or a ValueError naming the file."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "dev", "data"))
    from tokenizer import read_tokenizer_bin
    try:
        return read_tokenizer_bin(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"--tokenizer {path}: not a readable tokenizer .bin ({e}); dev/data/tokenizer.py writes "
                         f"them (data/offline/tokenizer.bin)") from None


def decode_sample(tb, ids):
    """Text of token ids with the tokenizer .bin table (llmc/tokenizer.h's decoding; an
    incomplete UTF-8 character at the end is held back, other broken bytes become U+FFFD)."""
    from tokenizer import decode_with_bin
    data = decode_with_bin(tb, ids)
    for cut in range(min(3, len(data)), 0, -1):  # a character cut short by the end: hold it back
        lead = data[-cut]
        need = 2 if lead >> 5 == 0x6 else 3 if lead >> 4 == 0xE else 4 if lead >> 3 == 0x1E else 0
        if need > cut and all(b >> 6 == 0x2 for b in data[-cut + 1:]):
            data = data[:-cut]
            break
    return data.decode("utf-8", errors="replace")


def config_from_args(args):
    kw = dict(PRESETS[args.preset])
    for f in fields(SANConfig):
        v = getattr(args, f.name)
        if v is not None:
            kw[f.name] = bool(v) if f.type in (bool, "bool") else v
    return SANConfig(**kw)


def default_rates(cfg):
    """The SAN paper's locked per-device peak rates of this arm: (Muon, AdamW, AdamW side of
    Muon); the FFN arm has its own (as llmc/optimizer.h DefaultRates via train_san.cu)."""
    return (0.04, 2.4e-3, 3e-4) if cfg.ffn != "none" else (0.02, 6e-4, 3e-4)


def opt_from_args(args, cfg):
    muon_rate, adamw_rate, muon_other = default_rates(cfg)
    lr = args.lr if args.lr is not None else (muon_rate if args.optimizer == "muon" else adamw_rate)
    lr_other = args.lr_other if args.lr_other is not None else (muon_other if args.optimizer == "muon" else lr)
    n = args.lr_scale_gpus
    if n < 1:
        raise ValueError("--lr-scale-gpus must be >= 1")
    lr *= math.sqrt(n) if args.optimizer == "muon" else n
    lr_other *= n
    kw = {f.name: getattr(args, f.name) for f in fields(OptConfig)
          if f.name not in ("lr", "lr_other")}
    oc = OptConfig(lr=lr, lr_other=lr_other, **kw)
    oc.validate()
    return oc


# --paper-setup 1: the SAN paper's reference recipe as defaults that explicit flags override
# (as train_san.cu): a global batch of 512 rows (gradient accumulation over --batch-size
# rows), rates scaled as for 8 devices, Muon in the paper's order, WSD 5% / 15% / 0.05.
# (Newton-Schulz and gradient accumulation are fp32 here anyway.)
PAPER_SETUP = dict(global_batch=512, lr_scale_gpus=8, optimizer="muon", muon_order="paper", schedule="wsd",
                   warmup_frac=0.05, decay_frac=0.15, final_frac=0.05)


def parse_args(argv=None):
    parser = build_parser()
    early, _ = parser.parse_known_args(argv)
    if early.paper_setup:
        parser.set_defaults(**PAPER_SETUP)
    args = parser.parse_args(argv)
    if args.global_batch:
        if args.global_batch % args.batch_size:
            parser.error(f"--global-batch {args.global_batch} is not a multiple of --batch-size {args.batch_size}")
        accum = args.global_batch // args.batch_size
        if args.grad_accum and args.grad_accum != accum:
            parser.error(f"--grad-accum {args.grad_accum} contradicts --global-batch {args.global_batch} / "
                         f"--batch-size {args.batch_size} = {accum} micro-batches")
        args.grad_accum = accum
    args.grad_accum = args.grad_accum or 1
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        device = resolve_device(args.device)
        tb = load_tokenizer_bin(args.tokenizer) if args.tokenizer else None
        step0, ckpt_tensors, ckpt_meta = 0, None, None
        if args.init_from and args.load_checkpoint:
            raise ValueError("--init-from and --load-checkpoint are exclusive")
        if args.load_checkpoint or args.init_from:
            given = [model_flag(f.name) for f in fields(SANConfig) if getattr(args, f.name) is not None]
            if given:
                raise ValueError(f"model config flags ({', '.join(given)}) cannot be combined with "
                                 f"--load-checkpoint or --init-from: the config comes from the checkpoint")
            source = args.load_checkpoint or args.init_from
            model, step0, ckpt_meta, ckpt_tensors = load_checkpoint(source, device)
            if args.init_from:  # the model only: the optimizer and the schedule start fresh
                step0, ckpt_meta, ckpt_tensors = 0, None, None
            cfg = model.cfg
            if tb is not None and tb["vocab_size"] != cfg.vocab_size:
                raise ValueError(f"--tokenizer {args.tokenizer} has a vocabulary of {tb['vocab_size']}; the model in "
                                 f"{source} has {cfg.vocab_size}")
        else:
            if tb is not None and args.vocab_size is None:  # the tokenizer sets the vocabulary (as train_san.cu)
                args.vocab_size = tb["vocab_size"]
            cfg = config_from_args(args)
            model = None
        oc = opt_from_args(args, cfg)
        T = args.row_len or cfg.seq_len
        if not 0 < T <= cfg.seq_len:
            raise ValueError(f"--seq-len {args.row_len}: rows must be 1 .. {cfg.seq_len} tokens (the model's context)")
    except (ValueError, ContainerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    total, nonemb = count_parameters(cfg)
    print(f"config: {' '.join(f'{k}={v}' for k, v in cfg.to_meta())}")
    print(f"parameters: {total:,} total, {nonemb:,} non-embedding; {flops_per_token(cfg) / 1e6:.2f} MFLOPs/token")

    if args.write_debug_state:
        loss, rec = write_debug_state(args.write_debug_state, cfg, oc, args.seed, args.debug_batch_size,
                                      args.debug_steps, args.debug_schedule_steps or None,
                                      args.debug_precision)
        print(f"debug state: {args.write_debug_state}  loss {loss:.6f}  "
              f"trajectory {' '.join(f'{v:.4f}' for v in rec['loss'])}")
        return 0

    if model is None:
        model = SAN(cfg).init_weights(args.seed).to(device)
    model.attn_impl = args.attn_impl
    B = args.batch_size
    val = ShardLoader(args.val_data, B, T, cfg.vocab_size) if args.val_data else None

    if args.steps > 0:
        if not args.train_data:
            print("error: --steps needs --train-data", file=sys.stderr)
            return 1
        train = ShardLoader(args.train_data, B, T, cfg.vocab_size)
        opt = SANOptimizer(model, oc)
        if ckpt_meta is not None and ckpt_meta.get("has_optimizer") == "1":
            opt.load_state_tensors(ckpt_tensors, step0, args.load_checkpoint)
        total_steps = step0 + args.steps
        print(f"optimizer: {' '.join(f'{k}={v}' for k, v in oc.to_meta())}")
        for step in range(step0, total_steps):
            if val and (step % args.val_every == 0):
                print(f"step {step:5d} | {format_val(*evaluate_regions(model, val, args.val_batches))}")
            t0 = time.time()
            model.zero_grad(set_to_none=True)
            loss_acc = 0.0
            for _ in range(args.grad_accum):
                x, y = train.next_batch()
                _, (loss, _, _) = model(x.to(device), y.to(device))
                (loss / args.grad_accum).backward()
                loss_acc += loss.item() / args.grad_accum
            norm = clip_grad_norm(model.ordered_parameters(), oc.grad_clip)
            lr_m, lr_o = group_lrs(oc, step, total_steps)
            opt.step(lr_m, lr_o)
            dt = time.time() - t0
            print(f"step {step + 1:5d}/{total_steps} | loss {loss_acc:.4f} | lr {lr_m:.3e}/{lr_o:.3e} | "
                  f"norm {norm:.3f} | {dt * 1000:.0f} ms | {B * T * args.grad_accum / dt:.0f} tok/s")
        if val:
            print(f"step {total_steps:5d} | {format_val(*evaluate_regions(model, val, args.val_batches))}")
        if args.save_checkpoint:
            save_checkpoint(args.save_checkpoint, model, total_steps, opt)
            print(f"checkpoint: {args.save_checkpoint}")
    elif val:
        print(format_val(*evaluate_regions(model, val, args.val_batches)))
    elif args.save_checkpoint:
        save_checkpoint(args.save_checkpoint, model, step0)
        print(f"checkpoint: {args.save_checkpoint}")

    if args.sample_tokens > 0:
        toks = sample(model, [cfg.bos_id], args.sample_tokens, seed=args.seed)
        print("sample (token ids):", " ".join(map(str, toks)))
        if tb is not None:
            print("sample (text):", decode_sample(tb, toks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
