"""
The SAN family (doc/san-model.md): attention-only Simple Attention Networks and their
SwiGLU-FFN control arm, the numerical twin of train_san.cu in explicit maths (fp32, fp64 for
the debug states). Reads top to bottom: config and presets -> init (the parameter list is
sizes.py's) -> norms and RoPE -> attention -> FFN -> block -> model -> checkpoint load.
"""

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from attnref import presets, sizes
from attnref.container import KIND_CHECKPOINT, ContainerError, load_params_into, read_container
from attnref.ops import (attention_mask, document_ids, fast_attention, fast_attention_mask, gqa_attention, san_loss,
                         sdpa_attention)
from attnref.params import ModelConfig, SpecModel
from attnref.data import debug_batch
from attnref.variants import (FIXED_QK_KINDS, TAYLOR_NORMS, MlpMixer, fixed_input_std, layer_kinds,
                              nonapprox_attention, taylor_attention)

# -----------------------------------------------------------------------------------------
# Configuration

NORM_EPS = 1e-6          # epsilon inside every ZCN / RMS norm (fixed, not a config field)
EMBED_SCALES = ("sqrt-d", "1")
OUT_INITS = ("scaled", "plain")
INIT_STD = 0.02          # std of every matrix and of the embedding


@dataclass
class SANConfig(ModelConfig):
    """The SAN family (doc/san-model.md "Config"). Field names are the keys of the
    config text in checkpoints and debug states (doc/formats.md)."""
    MODEL: ClassVar[str] = "san"   # the config key model= of SAN files (GPT-2's say gpt2)
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
    # the attention variants of "Deconstructing Attention" (doc/deconstructing.md, attnref/variants.py)
    attention: str = "standard"    # the kind of every layer the layout does not keep standard
    layout: str = "uniform"        # which layers keep standard attention
    taylor_norm: str = "joint"     # approximate: joint (Based's feature map) | separate (the paper's terms)
    embed_scale: str = "sqrt-d"    # the embedding's output multiplier: sqrt-d (the SAN paper's) | 1 (Qwen2.5's)
    out_init: str = "scaled"       # W_o / W_down init: scaled N(0, 0.02 / sqrt(2L)) | plain N(0, 0.02) (Qwen2.5's)

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
        need(self.taylor_norm in TAYLOR_NORMS, f"taylor_norm must be joint|separate (got {self.taylor_norm!r})")
        need(self.embed_scale in EMBED_SCALES, f"embed_scale must be sqrt-d|1 (got {self.embed_scale!r})")
        need(self.out_init in OUT_INITS, f"out_init must be scaled|plain (got {self.out_init!r})")
        try:
            self.kinds = layer_kinds(self.attention, self.layout, self.n_layer)   # one per layer
        except ValueError as e:
            need(False, str(e))

    @property
    def embed_multiplier(self):
        """What the embedding lookup is multiplied by."""
        return math.sqrt(self.n_embd) if self.embed_scale == "sqrt-d" else 1.0

    def to_meta(self):
        """The config text, plus the derived per-layer kinds (checked on load, as train_san.cu);
        embed_scale and out_init only when not the default, as train_san.cu writes them."""
        defaults = {"embed_scale": "sqrt-d", "out_init": "scaled"}
        meta = [(k, v) for k, v in super().to_meta() if defaults.get(k) != v]
        return meta + [("layer_attention", ",".join(self.kinds))]

    @classmethod
    def from_meta(cls, meta, source="<meta>"):
        """Files from before the variants have no attention keys: standard attention everywhere."""
        meta = dict(meta)
        for key in ("attention", "layout", "taylor_norm", "embed_scale", "out_init"):
            meta.setdefault(key, str(getattr(cls, key)))
        cfg = super().from_meta(meta, source)
        if "layer_attention" in meta and meta["layer_attention"] != ",".join(cfg.kinds):
            raise ValueError(f"{source}: layer_attention={meta['layer_attention']} does not follow from "
                             f"attention={cfg.attention} layout={cfg.layout} ({','.join(cfg.kinds)})")
        return cfg


# Presets: presets/NAME.conf, the files train_san compiles in (attnref/presets.py reads them): each
# sets every model flag, as {SANConfig field: value}. (The paper's arms san20 and its iso-depth,
# iso-param and iso-FLOP partners ffn20, ffn4, ffn9; the tiny ones; "Deconstructing Attention"'s
# Qwen2.5-style decoders at its Table 10's sizes and at a CPU's.)
def preset_config(preset):
    """{SANConfig field: value} of a presets.Preset (presets.model_config)."""
    return presets.model_config(preset, SANConfig)


training_flag = presets.flag_of_field   # a model field's flag without the --


PRESET_FILES = presets.load_presets()
PRESETS = {name: preset_config(p) for name, p in PRESET_FILES.items()}


# -----------------------------------------------------------------------------------------
# Parameters: names, shapes and order are attnref/sizes.py's (without torch, so that study/match.py
# counts with them); that list IS the contract with train_san.cu. The init is here.

parameter_spec = sizes.san_parameter_spec
count_parameters = sizes.san_parameter_counts      # (total, non-embedding)
flops_per_token = sizes.san_flops_per_token


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
        is_output = name.endswith("attn.wo") or name.endswith("ffn.w_down") or name.endswith("attn.w_down")
        if is_output and cfg.out_init == "scaled":
            std = INIT_STD / math.sqrt(2 * cfg.n_layer)
        return torch.randn(shape, generator=gen) * std
    if name.endswith(".weight"):                      # norm gains
        return torch.zeros(shape) if cfg.norm == "zcn" else torch.ones(shape)
    if name.endswith("_gate"):                        # residual gate scalars (gated/rezero)
        return torch.zeros(shape)
    raise AssertionError(f"no init rule for {name}")


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


class Norm(nn.Module):
    def __init__(self, dim, kind):
        super().__init__()
        self.kind = kind
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        return apply_norm(x, self.weight, self.kind)


class Attention(nn.Module):
    """The attention sub-layer of a block: q, k, v projections (GQA: Hkv kv heads shared by
    groups of query heads), optional per-head q/k norm, RoPE, masked softmax attention,
    output projection. u (B,T,d) -> (B,T,d). The variants of doc/deconstructing.md that keep
    these tensors differ here: approximate (Taylor weights), nonapprox (q = SiLU(u W_q), one
    score per position, no RoPE), staticembqk (q, k from u0, the pre-normed embedding),
    rndembqk and fixedseqqk (q, k given: the fixed stream's, Block.forward)."""

    def __init__(self, cfg, kind="standard"):
        super().__init__()
        self.cfg = cfg
        self.kind = kind
        d, hd = cfg.n_embd, cfg.head_dim
        self.wq = nn.Parameter(torch.zeros(cfg.n_head * hd, d))
        self.wk = nn.Parameter(torch.zeros(cfg.n_kv_head * hd, d))
        self.wv = nn.Parameter(torch.zeros(cfg.n_kv_head * hd, d))
        self.wo = nn.Parameter(torch.zeros(d, cfg.n_head * hd))
        if cfg.qk_norm:
            self.q_norm = Norm(hd, cfg.norm)
            self.k_norm = Norm(hd, cfg.norm)

    def qk(self, qk_in, cos, sin):
        """Queries and keys of standard attention: qk_in (B,T,d) -> q (B,Hq,T,hd), k (B,Hkv,T,hd)
        after QK-norm and RoPE (nonapprox: q = SiLU(.), no RoPE)."""
        cfg = self.cfg
        B, T, _ = qk_in.shape
        hd = cfg.head_dim
        q = (qk_in @ self.wq.t()).view(B, T, cfg.n_head, hd)
        k = (qk_in @ self.wk.t()).view(B, T, cfg.n_kv_head, hd)
        if self.kind == "nonapprox":
            q = F.silu(q)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)           # per head, over head_dim
        q, k = q.transpose(1, 2), k.transpose(1, 2)         # (B,H,T,hd)
        if self.kind != "nonapprox":                         # nonapprox: q[t].k[t], RoPE would cancel
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return q, k

    def forward(self, u, cos, sin, mask, impl="explicit", u0=None, qk=None):
        """qk: (q, k) given from elsewhere (rndembqk, fixedseqqk: the fixed stream's, broadcast
        over the batch); then only v comes from u and the mixer is standard attention."""
        cfg = self.cfg
        B, T, _ = u.shape
        hd = cfg.head_dim
        if qk is None:
            q, k = self.qk(u0 if self.kind == "staticembqk" else u, cos, sin)
        else:
            q, k = qk
        v = (u @ self.wv.t()).view(B, T, cfg.n_kv_head, hd).transpose(1, 2)   # (B,Hkv,T,hd)
        if self.kind == "nonapprox":
            y = nonapprox_attention(q, k, v, mask)
        elif self.kind == "approximate":
            y = taylor_attention(q, k, v, mask, cfg.taylor_norm)
        else:
            attn = {"explicit": gqa_attention, "sdpa": sdpa_attention, "fast": fast_attention}[impl]
            y = attn(q, k, v, mask)                          # (B,Hq,T,hd)
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
    """One layer: the attention branch and, in the FFN arm, the SwiGLU branch. Each branch is
    <name>_norm (pre-norm), the sub-layer <name>, with sandwich norm <name>_post_norm on its
    output, and with gated / rezero residuals the scalar <name>_gate."""

    def __init__(self, cfg, kind="standard"):
        super().__init__()
        self.cfg = cfg
        self.kind = kind
        self.add_branch("attn", MlpMixer(cfg) if kind == "mlp" else Attention(cfg, kind))
        if cfg.ffn == "swiglu":
            self.add_branch("ffn", SwiGLU(cfg))

    def add_branch(self, name, sublayer):
        cfg = self.cfg
        setattr(self, name + "_norm", Norm(cfg.n_embd, cfg.norm))
        setattr(self, name, sublayer)
        if cfg.sandwich:
            setattr(self, name + "_post_norm", Norm(cfg.n_embd, cfg.norm))
        if cfg.residual in ("gated", "rezero"):
            setattr(self, name + "_gate", nn.Parameter(torch.zeros(1)))

    def residual(self, name, x, h):
        """x: stream, h: the output of sub-layer `name`."""
        if self.cfg.sandwich:
            h = getattr(self, name + "_post_norm")(h)
        mode = self.cfg.residual
        if mode == "gated":
            return x + torch.sigmoid(getattr(self, name + "_gate")) * h
        if mode == "rezero":
            return x + getattr(self, name + "_gate") * h
        if mode == "standard":
            return x + h
        return h                                             # "none": no skip connection

    def forward(self, x, cos, sin, mask, impl="explicit", x0=None, skip="none", f=None, f_mask=None):
        """x0: the embedding stream as it entered layer 1 (staticembqk's queries and keys).
        f: the fixed stream (1,T,d) of rndembqk / fixedseqqk, or None; f_mask its (causal) mask.
        Returns (x, f): the fixed stream passes through every layer as standard attention on
        itself; a fixed-QK layer's real rows take their q, k from it (broadcast over the batch:
        autograd sums their gradients into the fixed stream) and v from their own input.
        skip (evaluation, --skip-nonstandard): a non-standard layer leaves out its attention
        sub-layer ("attention") or its whole block ("block")."""
        skipped = skip != "none" and self.kind != "standard"
        if skipped and skip == "block":
            return x, f
        if skipped:
            pass
        elif self.kind == "mlp":
            x = self.residual("attn", x, self.attn(self.attn_norm(x)))
        elif self.kind in FIXED_QK_KINDS:
            uf = self.attn_norm(f)
            qf, kf = self.attn.qk(uf, cos, sin)                 # (1,H,T,hd)
            B = x.shape[0]
            shared = (qf.expand(B, -1, -1, -1).contiguous(), kf.expand(B, -1, -1, -1).contiguous())
            x = self.residual("attn", x, self.attn(self.attn_norm(x), cos, sin, mask, impl, qk=shared))
            f = self.residual("attn", f, self.attn(uf, cos, sin, f_mask, impl, qk=(qf, kf)))
        else:
            u0 = self.attn_norm(x0) if self.kind == "staticembqk" else None
            x = self.residual("attn", x, self.attn(self.attn_norm(x), cos, sin, mask, impl, u0))
            if f is not None:                                   # (only standard layers see f here)
                f = self.residual("attn", f, self.attn(self.attn_norm(f), cos, sin, f_mask, impl))
        if self.cfg.ffn == "swiglu":
            x = self.residual("ffn", x, self.ffn(self.ffn_norm(x)))
            if f is not None:
                f = self.residual("ffn", f, self.ffn(self.ffn_norm(f)))
        return x, f


class SAN(SpecModel):
    """The model. With rndembqk or fixedseqqk layers it also holds their fixed input, model
    state that is not a parameter (a buffer: in checkpoints, not trained): rndembqk's
    fixed_input (T_max, d), eps ~ N(0, (0.02 x the embedding multiplier)^2); fixedseqqk's fixed_tokens (T_max,),
    embedded with the live embedding at every forward."""
    parameter_spec = staticmethod(parameter_spec)
    init_value = staticmethod(init_value)            # the SAN paper's init (doc/san-model.md "Parameters")
    is_matrix_param = staticmethod(is_matrix_param)

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Parameter(torch.zeros(cfg.padded_vocab_size, cfg.n_embd))
        self.layers = nn.ModuleList([Block(cfg, kind) for kind in cfg.kinds])
        self.final_norm = Norm(cfg.n_embd, cfg.norm)
        self.attn_impl = "explicit"        # "sdpa": the cross-check path; "fast": the fused speed path
        self.skip = "none"                 # evaluation: attention | block (Block.forward)
        if cfg.attention == "rndembqk":
            self.register_buffer("fixed_input", torch.zeros(cfg.seq_len, cfg.n_embd))
        if cfg.attention == "fixedseqqk":
            self.register_buffer("fixed_tokens", torch.zeros(cfg.seq_len, dtype=torch.int64))
        self.check_spec()

    # ---- the fixed input of rndembqk / fixedseqqk (model state, not parameters) ----
    def init_weights(self, seed, fixed_tokens=None):
        """Parameters from `seed` (SpecModel), then the fixed input: rndembqk's eps from its own
        generator (seed + 1, so the parameters do not depend on the kind); fixedseqqk's tokens
        as given (the first T_max tokens of the training data), or, when none are given (debug
        states), a debug_batch-style row of seed + 1: uniform ids with documents."""
        super().init_weights(seed)
        cfg = self.cfg
        with torch.no_grad():
            if cfg.attention == "rndembqk":
                gen = torch.Generator().manual_seed(seed + 1)
                self.fixed_input.copy_(torch.randn(cfg.seq_len, cfg.n_embd, generator=gen) * fixed_input_std(cfg))
            if cfg.attention == "fixedseqqk":
                if fixed_tokens is None:
                    fixed_tokens = debug_batch(cfg, 1, seed + 1)[0][0]
                self.set_fixed_tokens(fixed_tokens)
        return self

    def set_fixed_tokens(self, tokens, source="fixed tokens"):
        tokens = torch.as_tensor(tokens, dtype=torch.int64).reshape(-1)
        if tokens.numel() != self.cfg.seq_len:
            raise ValueError(f"{source}: {tokens.numel()} fixed tokens, fixedseqqk needs seq_len = {self.cfg.seq_len}")
        if int(tokens.min()) < 0 or int(tokens.max()) >= self.cfg.vocab_size:
            raise ValueError(f"{source}: a fixed token is outside the vocabulary of {self.cfg.vocab_size}")
        with torch.no_grad():
            self.fixed_tokens.copy_(tokens.to(self.fixed_tokens.device))

    def state_tensors(self):
        """[(name, tensor, dtype)]: the model state that is not a parameter, as files store it."""
        if self.cfg.attention == "rndembqk":
            return [("fixed_qk.input", self.fixed_input, "fp32")]
        if self.cfg.attention == "fixedseqqk":
            return [("fixed_qk.tokens", self.fixed_tokens, "int32")]
        return []

    def load_state_tensors(self, tensors, source):
        """The fixed input from a file's tensors (checks presence and shape)."""
        for name, t, _ in self.state_tensors():
            if name not in tensors:
                raise ContainerError(f"{source}: tensor '{name}' (the {self.cfg.attention} fixed input) is missing")
            a = np.asarray(tensors[name])
            if tuple(a.shape) != tuple(t.shape):
                raise ContainerError(f"{source}: tensor '{name}' has shape {tuple(a.shape)}, expected {tuple(t.shape)}")
            if name == "fixed_qk.tokens":
                self.set_fixed_tokens(a, f"{source}: tensor '{name}'")
            else:
                with torch.no_grad():
                    t.copy_(torch.from_numpy(a.astype(np.float32)))

    def fixed_stream(self, T):
        """The fixed stream's input (1,T,d): its first T positions (causal, so a shorter row sees
        exactly the first T positions of the full fixed run)."""
        if self.cfg.attention == "rndembqk":
            return self.fixed_input[None, :T]
        return F.embedding(self.fixed_tokens[None, :T], self.wte) * self.cfg.embed_multiplier

    def forward(self, idx, targets=None):
        """idx (B,T) int64 token ids < vocab_size. Returns logits (B,T,Vp) and, when
        targets are given, (loss, ce, lse_sq) from san_loss."""
        cfg = self.cfg
        B, T = idx.shape
        if T > cfg.seq_len:
            raise ValueError(f"sequence length {T} exceeds seq_len {cfg.seq_len}")
        x = F.embedding(idx, self.wte) * cfg.embed_multiplier
        cos, sin = rope_cos_sin(T, cfg.head_dim, cfg.rope_theta, x.dtype, x.device)
        doc = document_ids(idx, cfg.bos_id) if cfg.doc_mask else None
        if self.attn_impl == "fast" and any(k != "standard" for k in cfg.kinds):
            raise ValueError("--attn-impl fast runs standard attention only; the attention variants need the "
                             "explicit maths (--attn-impl explicit)")
        mask = fast_attention_mask(T, doc) if self.attn_impl == "fast" else attention_mask(T, doc, idx.device)
        # the fixed stream: one sequence, causal without documents (doc/deconstructing.md); not
        # needed when --skip-nonstandard leaves out the layers that use it
        f, f_mask = None, None
        if cfg.attention in FIXED_QK_KINDS and self.skip == "none":
            f, f_mask = self.fixed_stream(T).to(x.dtype), attention_mask(T, None, idx.device)
        x0 = x
        for layer in self.layers:
            x, f = layer(x, cos, sin, mask, self.attn_impl, x0, self.skip, f, f_mask)
        x = self.final_norm(x)
        logits = x @ self.wte.t()                            # (B,T,Vp), fp32 or wider
        if targets is None:
            return logits, None
        return logits, san_loss(logits, targets, cfg)


# -----------------------------------------------------------------------------------------
# Checkpoint load (the save is container.save_checkpoint, shared with GPT-2)

def load_checkpoint(path, device="cpu"):
    """Returns (model, step, meta, tensors). The optimizer state, if any, stays in
    tensors/meta: restore it with optim.Optimizer(...).load_state_tensors."""
    _, meta, tensors = read_container(path, KIND_CHECKPOINT)
    kind = meta.get("model", "san")  # files from before the key are SAN files
    if kind != "san":
        raise ValueError(f"{path} is a {kind} checkpoint (config key model={kind}): it belongs to train_{kind}, "
                         f"not train_san")
    cfg = SANConfig.from_meta(meta, str(path))
    model = SAN(cfg)
    load_params_into(model, tensors, str(path))
    model.load_state_tensors(tensors, str(path))
    step = int(meta.get("step", "0"))
    return model.to(device), step, meta, tensors


