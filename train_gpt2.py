"""
train_gpt2.py -- PyTorch reference for the GPT-2 baseline, the numerical twin of train_gpt2.cu.

The model (doc/gpt2.md): learned token and position embeddings, pre-LayerNorm blocks
(LayerNorm with bias, eps 1e-5), multi-head causal attention with a fused qkv projection,
a GELU (tanh approximation) MLP of width 4d, biases on every linear layer, a final
LayerNorm, and the LM head tied to the token embedding. The vocabulary is padded to a
multiple of 128 (padded rows are zero; the loss and the softmax use the real V only).

It does five things:
  * builds the model from a size preset and a seed (GPT-2 init, no download), or loads the
    pretrained GPT-2 weights from Hugging Face when the network allows (--init-from-hf),
  * reads and writes our tensor container (doc/formats.md "GPT-2 checkpoints"):
    checkpoints and debug states for test_gpt2.cu,
  * reads and writes llm.c's GPT-2 model files (--write-llmc, --init-from-llmc),
  * trains on llm.c-format token shards (a small loop, for demos and cross-checks),
  * evaluates and samples.

The container code, the AdamW implementation, the schedules, the data loader and the
debug batch are train_san.py's (imported, not copied): one implementation for both
references.

Examples:
  python train_gpt2.py --preset tiny --write-debug-state out.bin
  python train_gpt2.py --preset gpt2 --init-from-hf gpt2 --save-checkpoint gpt2_124M.ckpt
  python train_gpt2.py --preset tiny --write-llmc tiny_llmc.bin --llmc-dtype fp32
  python train_gpt2.py --preset demo --train-data "data/offline/kjv/kjv_train_*.bin" --steps 100
"""

import argparse
import json
import math
import os
import struct
import sys
import time
from dataclasses import dataclass, fields
from typing import ClassVar

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import train_san
from train_san import (KIND_CHECKPOINT, KIND_DEBUG_STATE, ContainerError, OptConfig, SANOptimizer, ShardLoader,
                       attention_mask, clip_grad_norm, debug_batch, format_meta_value, gqa_attention, group_lrs,
                       parse_meta_value, read_container, san_loss, train_steps, write_container)

# -----------------------------------------------------------------------------------------
# Configuration

LN_EPS = 1e-5            # LayerNorm epsilon (GPT-2's)
INIT_STD = 0.02          # std of every matrix and both embeddings
VOCAB_PAD = 128          # embedding / logits padded to a multiple of this


@dataclass
class GPT2Config:
    """Field names are the keys of the config text in GPT-2 checkpoints and debug states
    (doc/formats.md "GPT-2 checkpoints"), besides `model=gpt2` and the derived keys."""
    vocab_size: int = 250          # real vocabulary V
    seq_len: int = 64              # max context T (rows of wpe)
    n_layer: int = 2               # L
    n_embd: int = 64               # d
    n_head: int = 4                # H; head_dim = d / H
    bos_id: int = 2                # token that starts a sample (GPT-2 BPE: 50256 <|endoftext|>)

    # read by train_san.san_loss and loss_mask: GPT-2 has no z-loss and no document mask
    z_loss: ClassVar[float] = 0.0
    doc_mask: ClassVar[bool] = False

    def __post_init__(self):
        def need(cond, msg):
            if not cond:
                raise ValueError(f"bad config: {msg}")
        need(self.vocab_size > 0 and self.seq_len > 0 and self.n_layer > 0 and self.n_embd > 0,
             "vocab_size, seq_len, n_layer and n_embd must be > 0")
        need(self.n_head > 0 and self.n_embd % self.n_head == 0,
             f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        need(self.head_dim <= 128, f"head_dim ({self.head_dim}) must be <= 128 (the CUDA attention kernels)")
        need(0 <= self.bos_id < self.vocab_size, f"bos_id ({self.bos_id}) must be < vocab_size ({self.vocab_size})")

    @property
    def head_dim(self):
        return self.n_embd // self.n_head

    @property
    def padded_vocab_size(self):
        return (self.vocab_size + VOCAB_PAD - 1) // VOCAB_PAD * VOCAB_PAD

    def to_meta(self):
        out = [("model", "gpt2")]
        out += [(f.name, format_meta_value(getattr(self, f.name))) for f in fields(self)]
        out += [("padded_vocab_size", str(self.padded_vocab_size)), ("head_dim", str(self.head_dim))]
        return out

    @classmethod
    def from_meta(cls, meta, source="<meta>"):
        if meta.get("model") != "gpt2":
            kind = meta.get("model", "san")  # SAN files from before the key have none
            raise ValueError(f"{source}: not a GPT-2 file (config key model={kind}, expected gpt2): it belongs to "
                             f"train_{kind}, not train_gpt2")
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


_GPT2_BPE = dict(vocab_size=50257, seq_len=1024, bos_id=50256)
PRESETS = {
    "tiny": dict(vocab_size=250, seq_len=64, n_layer=2, n_embd=64, n_head=4, bos_id=2),      # padded vocab (256)
    "tiny-wide": dict(vocab_size=384, seq_len=32, n_layer=3, n_embd=96, n_head=2, bos_id=2),  # V % 128 == 0, hd 48
    "demo": dict(vocab_size=8192, seq_len=128, n_layer=4, n_embd=128, n_head=4, bos_id=2),   # offline corpus, CPU
    "gpt2": dict(_GPT2_BPE, n_layer=12, n_embd=768, n_head=12),         # 124M
    "gpt2-medium": dict(_GPT2_BPE, n_layer=24, n_embd=1024, n_head=16),  # 350M
    "gpt2-large": dict(_GPT2_BPE, n_layer=36, n_embd=1280, n_head=20),   # 774M
    "gpt2-xl": dict(_GPT2_BPE, n_layer=48, n_embd=1600, n_head=25),      # 1558M
}


# -----------------------------------------------------------------------------------------
# Parameters: names, shapes, order and init. This list IS the contract with train_gpt2.cu.

LAYER_FIELDS = [  # (name, shape as a function of d), PyTorch (out, in) layout
    ("ln_1.weight", lambda d: (d,)), ("ln_1.bias", lambda d: (d,)),
    ("attn.c_attn.weight", lambda d: (3 * d, d)), ("attn.c_attn.bias", lambda d: (3 * d,)),
    ("attn.c_proj.weight", lambda d: (d, d)), ("attn.c_proj.bias", lambda d: (d,)),
    ("ln_2.weight", lambda d: (d,)), ("ln_2.bias", lambda d: (d,)),
    ("mlp.c_fc.weight", lambda d: (4 * d, d)), ("mlp.c_fc.bias", lambda d: (4 * d,)),
    ("mlp.c_proj.weight", lambda d: (d, 4 * d)), ("mlp.c_proj.bias", lambda d: (d,)),
]


def parameter_spec(cfg):
    """[(name, shape)] in canonical order (the order of tensors in every file)."""
    d = cfg.n_embd
    spec = [("wte", (cfg.padded_vocab_size, d)), ("wpe", (cfg.seq_len, d))]
    for i in range(cfg.n_layer):
        spec += [(f"layers.{i}.{name}", shape(d)) for name, shape in LAYER_FIELDS]
    spec += [("ln_f.weight", (d,)), ("ln_f.bias", (d,))]
    return spec


def is_matrix_param(name, shape):
    """Matrix group (weight decay): the 2-D projection weights; not the embeddings."""
    return len(shape) == 2 and name not in ("wte", "wpe")


def init_value(cfg, name, shape, gen):
    """GPT-2 init, drawn from `gen` in canonical order: N(0, 0.02) for both embeddings (the
    padded rows of wte stay 0) and every matrix, N(0, 0.02 / sqrt(2 L)) for the two
    projections into the residual stream, biases 0, LayerNorm weights 1."""
    if name == "wte":
        w = torch.zeros(shape)
        w[: cfg.vocab_size] = torch.randn(cfg.vocab_size, shape[1], generator=gen) * INIT_STD
        return w
    if len(shape) == 2:
        std = INIT_STD / math.sqrt(2 * cfg.n_layer) if name.endswith("c_proj.weight") else INIT_STD
        return torch.randn(shape, generator=gen) * std
    if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
        return torch.ones(shape)
    if name.endswith(".bias"):
        return torch.zeros(shape)
    raise AssertionError(f"no init rule for {name}")


def count_parameters(cfg):
    """(total, non-embedding) counts; total includes the padded wte rows, non-embedding
    excludes wte and wpe."""
    total = sum(math.prod(s) for _, s in parameter_spec(cfg))
    return total, total - (cfg.padded_vocab_size + cfg.seq_len) * cfg.n_embd


def flops_per_token(cfg):
    """Training FLOPs per token, PaLM convention (as train_san.py): 6 * (non-embedding
    params + LM head V*d) + 12 * L * T * d."""
    _, nonemb = count_parameters(cfg)
    return 6 * (nonemb + cfg.vocab_size * cfg.n_embd) + 12 * cfg.n_layer * cfg.seq_len * cfg.n_embd


# -----------------------------------------------------------------------------------------
# Model (explicit maths; shapes in comments)

class LayerNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, LN_EPS)


class Linear(nn.Module):
    """y = x W^T + b with W (out, in): the layout of every file."""
    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_out, n_in))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return x @ self.weight.t() + self.bias


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.c_attn = Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, u, mask):
        cfg = self.cfg
        B, T, d = u.shape
        q, k, v = self.c_attn(u).split(d, dim=-1)                     # each (B,T,d) = (B,T,H,hd)
        q, k, v = (t.view(B, T, cfg.n_head, cfg.head_dim).transpose(1, 2) for t in (q, k, v))
        y = gqa_attention(q, k, v, mask)                               # (B,H,T,hd), MHA: Hkv = H
        return self.c_proj(y.transpose(1, 2).reshape(B, T, d))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, u):
        return self.c_proj(F.gelu(self.c_fc(u), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = LayerNorm(cfg.n_embd)
        self.attn = Attention(cfg)
        self.ln_2 = LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x, mask):
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Parameter(torch.zeros(cfg.padded_vocab_size, cfg.n_embd))
        self.wpe = nn.Parameter(torch.zeros(cfg.seq_len, cfg.n_embd))
        self.layers = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = LayerNorm(cfg.n_embd)
        assert {n for n, _ in self.named_parameters()} == {n for n, _ in parameter_spec(cfg)}, \
            "module tree != parameter_spec"

    def init_weights(self, seed):
        gen = torch.Generator().manual_seed(seed)
        params = dict(self.named_parameters())
        with torch.no_grad():
            for name, shape in parameter_spec(self.cfg):
                params[name].copy_(init_value(self.cfg, name, shape, gen))
        return self

    def ordered_parameters(self):
        params = dict(self.named_parameters())
        return [(n, params[n]) for n, _ in parameter_spec(self.cfg)]

    def forward(self, idx, targets=None):
        """idx (B,T) token ids < vocab_size. Returns logits (B,T,Vp) and, with targets,
        (loss, ce, lse_sq) from train_san.san_loss (z_loss = 0, no document mask: the loss
        is the mean cross-entropy over the targets >= 0, softmax over the real V)."""
        cfg = self.cfg
        B, T = idx.shape
        if T > cfg.seq_len:
            raise ValueError(f"sequence length {T} exceeds seq_len {cfg.seq_len}")
        x = F.embedding(idx, self.wte) + self.wpe[:T]
        mask = attention_mask(T, None, idx.device)
        for layer in self.layers:
            x = layer(x, mask)
        logits = self.ln_f(x) @ self.wte.t()
        if targets is None:
            return logits, None
        return logits, san_loss(logits, targets, cfg)


def make_optimizer(model, oc):
    """AdamW of train_san.SANOptimizer with the GPT-2 parameter groups (the embeddings,
    biases and LayerNorm parameters are not decayed)."""
    if oc.optimizer != "adamw":
        raise ValueError("the GPT-2 trainers use AdamW (--optimizer adamw)")
    opt = SANOptimizer(model, oc)
    opt.matrix = {n for n, p in opt.params if is_matrix_param(n, tuple(p.shape))}
    return opt


# -----------------------------------------------------------------------------------------
# Our container (doc/formats.md "GPT-2 checkpoints")

def save_checkpoint(path, model, step=0, optimizer=None):
    meta = model.cfg.to_meta() + [("step", str(step)), ("has_optimizer", "1" if optimizer else "0")]
    tensors = [(n, p, "fp32") for n, p in model.ordered_parameters()]
    if optimizer is not None:
        meta += optimizer.oc.to_meta()
        tensors += [(n, t, "fp32") for n, t in optimizer.state_tensors().items()]
    write_container(path, KIND_CHECKPOINT, meta, tensors)


def set_parameters(model, tensors, source):
    """Copies every canonical parameter from {name: array} (checks presence and shape)."""
    with torch.no_grad():
        for n, p in model.ordered_parameters():
            if n not in tensors:
                raise ContainerError(f"{source}: parameter '{n}' missing")
            a = np.asarray(tensors[n], dtype=np.float32)
            if tuple(a.shape) != tuple(p.shape):
                raise ContainerError(f"{source}: parameter '{n}' has shape {tuple(a.shape)}, expected {tuple(p.shape)}")
            p.copy_(torch.from_numpy(a))


def load_checkpoint(path, device="cpu"):
    """Returns (model, step, meta, tensors); restore the optimizer with
    make_optimizer(...).load_state_tensors(tensors, step, path)."""
    _, meta, tensors = read_container(path, KIND_CHECKPOINT)
    cfg = GPT2Config.from_meta(meta, str(path))
    model = GPT2(cfg)
    set_parameters(model, tensors, str(path))
    return model.to(device), int(meta.get("step", "0")), meta, tensors


# -----------------------------------------------------------------------------------------
# llm.c model files (doc/formats.md "GPT-2 checkpoints", llm.c compatibility)

LLMC_MAGIC = 20240326
LLMC_VERSION_FP32 = 3
LLMC_VERSION_BF16 = 5
# llm.c stores each kind of tensor for all layers together, in this order
LLMC_LAYER_ORDER = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                    "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                    "mlp.c_proj.weight", "mlp.c_proj.bias"]


def write_llmc(path, model, dtype="fp32"):
    """llm.c GPT-2 model file: 256 int32 header [magic, version (3 fp32, 5 bf16), maxT, V, L,
    H, C, Vp, 0...], then wte (Vp, C), wpe (maxT, C), each per-layer kind stacked over the
    layers in LLMC_LAYER_ORDER, ln_f weight and bias."""
    cfg = model.cfg
    p = {n: t.detach().cpu().float().numpy() for n, t in model.ordered_parameters()}
    header = np.zeros(256, dtype="<i4")
    header[:8] = [LLMC_MAGIC, LLMC_VERSION_FP32 if dtype == "fp32" else LLMC_VERSION_BF16, cfg.seq_len,
                  cfg.vocab_size, cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.padded_vocab_size]
    arrays = [p["wte"], p["wpe"]]
    arrays += [np.stack([p[f"layers.{i}.{name}"] for i in range(cfg.n_layer)]) for name in LLMC_LAYER_ORDER]
    arrays += [p["ln_f.weight"], p["ln_f.bias"]]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for a in arrays:
            if dtype == "fp32":
                f.write(np.ascontiguousarray(a, dtype="<f4").tobytes())
            else:
                f.write(train_san.fp32_to_bf16_bits(np.ascontiguousarray(a, dtype=np.float32)).astype("<u2").tobytes())


def read_llmc(path, bos_id=None):
    """(GPT2Config, {name: fp32 array}) from an llm.c GPT-2 model file (version 3 or 5)."""
    size = os.path.getsize(path)
    header = np.fromfile(path, dtype="<i4", count=256)
    if len(header) < 256 or header[0] != LLMC_MAGIC:
        raise ContainerError(f"{path}: not an llm.c GPT-2 model file (magic {header[0] if len(header) else None}, "
                             f"expected {LLMC_MAGIC})")
    if header[1] not in (LLMC_VERSION_FP32, LLMC_VERSION_BF16):
        raise ContainerError(f"{path}: llm.c model version {header[1]} (this reader knows 3 = fp32, 5 = bf16)")
    maxT, V, L, H, C, Vp = (int(x) for x in header[2:8])
    if Vp < V:
        raise ContainerError(f"{path}: padded vocab {Vp} < vocab {V}")
    cfg = GPT2Config(vocab_size=V, seq_len=maxT, n_layer=L, n_embd=C, n_head=H,
                     bos_id=bos_id if bos_id is not None else (50256 if V == 50257 else 0))
    d = C
    shapes = [("wte", (Vp, d)), ("wpe", (maxT, d))]
    shapes += [(name, (L,) + dict(LAYER_FIELDS)[name](d)) for name in LLMC_LAYER_ORDER]
    shapes += [("ln_f.weight", (d,)), ("ln_f.bias", (d,))]
    itemsize = 4 if header[1] == LLMC_VERSION_FP32 else 2
    expected = 1024 + sum(math.prod(s) for _, s in shapes) * itemsize
    if size != expected:
        raise ContainerError(f"{path}: {size} bytes, expected {expected} for this header")
    raw = np.fromfile(path, dtype="<f4" if itemsize == 4 else "<u2", offset=1024)
    tensors, off = {}, 0
    for name, shape in shapes:
        n = math.prod(shape)
        a = raw[off:off + n].reshape(shape)
        tensors[name] = train_san.bf16_bits_to_fp32(a) if itemsize == 2 else a.astype(np.float32)
        off += n
    out = {"wte": np.zeros((cfg.padded_vocab_size, d), np.float32), "wpe": tensors["wpe"],
           "ln_f.weight": tensors["ln_f.weight"], "ln_f.bias": tensors["ln_f.bias"]}
    out["wte"][:V] = tensors["wte"][:V]
    for name in LLMC_LAYER_ORDER:
        for i in range(L):
            out[f"layers.{i}.{name}"] = tensors[name][i]
    return cfg, out


# -----------------------------------------------------------------------------------------
# Pretrained GPT-2 from Hugging Face (needs the network)

# Hugging Face's GPT-2 stores these four as Conv1D weights, (in, out): transposed here
HF_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def read_safetensors(path):
    """{name: fp32 array} from a .safetensors file (8-byte header length, JSON header,
    raw little-endian data), without the safetensors package."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        base = 8 + n
    dtypes = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in dtypes:
            continue  # e.g. the boolean attention-mask buffers of old exports
        begin, end = info["data_offsets"]
        a = np.fromfile(path, dtype=dtypes[info["dtype"]], count=(end - begin) // np.dtype(dtypes[info["dtype"]]).itemsize,
                        offset=base + begin).reshape(info["shape"])
        out[name] = train_san.bf16_bits_to_fp32(a) if info["dtype"] == "BF16" else a.astype(np.float32)
    return out


def load_hf_weights(name):
    """{hf name without the 'transformer.' prefix: fp32 array} of a pretrained GPT-2
    (gpt2, gpt2-medium, gpt2-large, gpt2-xl): through transformers when it is installed,
    else the repository's model.safetensors through huggingface_hub."""
    try:
        from transformers import GPT2LMHeadModel
        sd = {k: v.float().numpy() for k, v in GPT2LMHeadModel.from_pretrained(name).state_dict().items()}
    except ImportError:
        from huggingface_hub import hf_hub_download
        repo = name if "/" in name else f"openai-community/{name}"
        sd = read_safetensors(hf_hub_download(repo, "model.safetensors"))
    return {(k[len("transformer."):] if k.startswith("transformer.") else k): v for k, v in sd.items()}


def gpt2_from_hf(name, seq_len=None):
    """Our GPT2 with the pretrained weights of Hugging Face model `name` (its preset's
    size; seq_len may shorten the context: wpe keeps its first rows)."""
    preset = name.split("/")[-1]  # "gpt2" or "openai-community/gpt2"
    if preset not in PRESETS:
        raise ValueError(f"--init-from-hf: unknown model {name!r} (gpt2, gpt2-medium, gpt2-large, gpt2-xl)")
    kw = dict(PRESETS[preset])
    if seq_len:
        kw["seq_len"] = seq_len
    cfg = GPT2Config(**kw)
    sd = load_hf_weights(name)
    tensors = {}
    for ours, shape in parameter_spec(cfg):
        if ours == "wte":
            w = np.zeros(shape, np.float32)
            w[: cfg.vocab_size] = sd["wte.weight"]
        elif ours == "wpe":
            w = sd["wpe.weight"][: cfg.seq_len]
        else:
            hf = ours.replace("layers.", "h.", 1)
            w = sd[hf].T if ours.endswith(HF_TRANSPOSED) else sd[hf]
        tensors[ours] = np.ascontiguousarray(w)
    model = GPT2(cfg)
    set_parameters(model, tensors, f"huggingface:{name}")
    return model


# -----------------------------------------------------------------------------------------
# Debug state (the contents of doc/formats.md "Debug state", with the GPT-2 config keys)

def write_debug_state(path, cfg, oc, seed=42, batch_size=4, n_steps=10, schedule_steps=None, precision="fp64",
                      model=None):
    schedule_steps = schedule_steps or n_steps
    model = model if model is not None else GPT2(cfg).init_weights(seed)
    init_params = [(n, p.detach().clone()) for n, p in model.ordered_parameters()]
    if precision == "fp64":
        model = model.double()
    x, y = debug_batch(cfg, batch_size, seed)
    logits, (loss, ce, lse_sq) = model(x, y)
    model.zero_grad(set_to_none=True)
    loss.backward()
    grads = [(n, p.grad.detach().clone()) for n, p in model.ordered_parameters()]
    model.zero_grad(set_to_none=True)
    opt = make_optimizer(model, oc)
    rec = train_steps(model, opt, x, y, n_steps, schedule_steps)
    meta = cfg.to_meta() + oc.to_meta() + [
        ("seed", str(seed)), ("debug.batch_size", str(batch_size)), ("debug.steps", str(n_steps)),
        ("debug.schedule_steps", str(schedule_steps)), ("debug.precision", precision)]
    t = [(n, p, "fp32") for n, p in init_params]
    t += [("batch.inputs", x, "int32"), ("batch.targets", y, "int32"),
          ("batch.doc_ids", torch.zeros_like(x), "int32"), ("batch.loss_mask", (y >= 0).long(), "int32"),
          ("logits", logits, "fp32"),
          ("loss", loss.reshape(1), "fp32"), ("loss.ce", ce.reshape(1), "fp32"),
          ("loss.lse_sq", lse_sq.reshape(1), "fp32")]
    t += [("grad." + n, g, "fp32") for n, g in grads]
    t += [("traj." + k, np.array(v, dtype=np.float64), "fp32") for k, v in rec.items()]
    t += [("final." + n, p, "fp32") for n, p in model.ordered_parameters()]
    write_container(path, KIND_DEBUG_STATE, meta, t)
    return loss.item(), rec


# -----------------------------------------------------------------------------------------
# CLI

def build_parser():
    p = argparse.ArgumentParser(description="PyTorch reference for GPT-2 (see doc/gpt2.md)",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--preset", default="tiny", choices=sorted(PRESETS), help="base config; flags below override it")
    g = p.add_argument_group("model config (default: the preset's value)")
    for f in fields(GPT2Config):
        g.add_argument(train_san.model_flag(f.name), dest=f.name, type=int, default=None)
    g.add_argument("--init-from-hf", metavar="NAME", help="pretrained weights from Hugging Face (gpt2, gpt2-medium, ...)")
    g.add_argument("--init-from-llmc", metavar="PATH", help="weights (and config) from an llm.c GPT-2 model file")
    o = p.add_argument_group("optimizer and schedule (AdamW)")
    o.add_argument("--lr", type=float, default=6e-4, help="peak rate of the matrix group")
    o.add_argument("--lr-other", type=float, default=None, help="peak rate of embeddings/biases/LayerNorm (default: --lr)")
    for name in ("weight_decay", "beta1", "beta2", "eps", "grad_clip", "warmup_frac", "decay_frac", "final_frac"):
        o.add_argument("--" + name.replace("_", "-"), type=float, default=getattr(OptConfig, name))
    o.add_argument("--schedule", choices=("wsd", "cosine", "linear", "constant"), default="wsd")
    r = p.add_argument_group("run")
    r.add_argument("--seed", type=int, default=42)
    r.add_argument("--device", default="auto", help="auto | cpu | cuda")
    r.add_argument("--write-debug-state", metavar="PATH", help="write a debug state and exit")
    r.add_argument("--debug-batch-size", type=int, default=4)
    r.add_argument("--debug-steps", type=int, default=10)
    r.add_argument("--debug-schedule-steps", type=int, default=0, help="schedule length (0: --debug-steps)")
    r.add_argument("--debug-precision", choices=("fp32", "fp64"), default="fp64")
    r.add_argument("--write-llmc", metavar="PATH", help="write the (initial or trained) model as an llm.c model file")
    r.add_argument("--llmc-dtype", choices=("fp32", "bf16"), default="fp32")
    r.add_argument("--load-checkpoint", metavar="PATH", help="model (and optimizer state) to start from")
    r.add_argument("--init-from", metavar="PATH",
                   help="model config and parameters to start from, the optimizer fresh (as the C++ trainers)")
    r.add_argument("--save-checkpoint", metavar="PATH", help="checkpoint written at the end")
    r.add_argument("--train-data", metavar="GLOB", help="training shards (llm.c format)")
    r.add_argument("--val-data", metavar="GLOB", help="validation shards")
    r.add_argument("--steps", type=int, default=0, help="optimizer steps (0: no training)")
    r.add_argument("--batch-size", type=int, default=8)
    r.add_argument("--seq-len", dest="row_len", type=int, default=0,
                   help="tokens per row (0: the model's context, --max-seq-len)")
    r.add_argument("--val-every", type=int, default=50)
    r.add_argument("--val-batches", type=int, default=train_san.VAL_BATCHES)
    r.add_argument("--sample-tokens", type=int, default=0, help="tokens to sample at the end (printed as ids)")
    r.add_argument("--tokenizer", metavar="PATH",
                   help="tokenizer .bin (as train_gpt2.cu reads it): sets the vocabulary size and BOS, decodes the sample")
    return p


def config_from_args(args):
    kw = dict(PRESETS[args.preset])
    for f in fields(GPT2Config):
        if getattr(args, f.name) is not None:
            kw[f.name] = getattr(args, f.name)
    return GPT2Config(**kw)


def opt_from_args(args):
    kw = {name: getattr(args, name) for name in ("weight_decay", "beta1", "beta2", "eps", "grad_clip", "schedule",
                                                 "warmup_frac", "decay_frac", "final_frac")}
    oc = OptConfig(optimizer="adamw", lr=args.lr, lr_other=args.lr if args.lr_other is None else args.lr_other, **kw)
    oc.validate()
    return oc


def build_model(args):
    """(model, step, checkpoint meta, checkpoint tensors) from the flags."""
    sources = [s for s in (args.load_checkpoint, args.init_from, args.init_from_hf, args.init_from_llmc) if s]
    if len(sources) > 1:
        raise ValueError("--load-checkpoint, --init-from, --init-from-hf and --init-from-llmc are exclusive")
    if args.load_checkpoint:
        return load_checkpoint(args.load_checkpoint)
    if args.init_from:  # the model only: the optimizer and the schedule start fresh
        return load_checkpoint(args.init_from)[0], 0, None, None
    if args.init_from_hf:
        return gpt2_from_hf(args.init_from_hf, args.seq_len), 0, None, None
    if args.init_from_llmc:
        cfg, tensors = read_llmc(args.init_from_llmc, args.bos_id)
        model = GPT2(cfg)
        set_parameters(model, tensors, args.init_from_llmc)
        return model, 0, None, None
    return GPT2(config_from_args(args)).init_weights(args.seed), 0, None, None


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        oc = opt_from_args(args)
        tb = train_san.load_tokenizer_bin(args.tokenizer) if args.tokenizer else None
        if tb is not None and not (args.load_checkpoint or args.init_from or args.init_from_hf or args.init_from_llmc):
            if args.vocab_size is None:  # the tokenizer sets the vocabulary (as train_gpt2.cu)
                args.vocab_size = tb["vocab_size"]
            if args.bos_id is None and tb["bos"] >= 0:
                args.bos_id = tb["bos"]
        model, step0, ckpt_meta, ckpt_tensors = build_model(args)
        if tb is not None and tb["vocab_size"] != model.cfg.vocab_size:
            raise ValueError(f"--tokenizer {args.tokenizer} has a vocabulary of {tb['vocab_size']}; the model has "
                             f"{model.cfg.vocab_size}")
        T = args.row_len or model.cfg.seq_len
        if not 0 < T <= model.cfg.seq_len:
            raise ValueError(f"--seq-len {args.row_len}: rows must be 1 .. {model.cfg.seq_len} tokens (the context)")
    except (ValueError, ContainerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    cfg = model.cfg
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    total, nonemb = count_parameters(cfg)
    print(f"config: {' '.join(f'{k}={v}' for k, v in cfg.to_meta())}")
    print(f"parameters: {total:,} total, {nonemb:,} non-embedding; {flops_per_token(cfg) / 1e6:.2f} MFLOPs/token")

    if args.write_debug_state:
        if args.write_llmc:  # the initial parameters, before the debug state trains the model
            write_llmc(args.write_llmc, model, args.llmc_dtype)
            print(f"llm.c model file: {args.write_llmc} (initial parameters)")
        loss, rec = write_debug_state(args.write_debug_state, cfg, oc, args.seed, args.debug_batch_size,
                                      args.debug_steps, args.debug_schedule_steps or None, args.debug_precision,
                                      model=model)
        print(f"debug state: {args.write_debug_state}  loss {loss:.6f}  "
              f"trajectory {' '.join(f'{v:.4f}' for v in rec['loss'])}")
        return 0

    model = model.to(device)
    B = args.batch_size
    val = ShardLoader(args.val_data, B, T, cfg.vocab_size) if args.val_data else None
    opt = None
    if args.steps > 0:
        if not args.train_data:
            print("error: --steps needs --train-data", file=sys.stderr)
            return 1
        train = ShardLoader(args.train_data, B, T, cfg.vocab_size)
        opt = make_optimizer(model, oc)
        if ckpt_meta is not None and ckpt_meta.get("has_optimizer") == "1":
            opt.load_state_tensors(ckpt_tensors, step0, args.load_checkpoint)
        total_steps = step0 + args.steps
        for step in range(step0, total_steps):
            if val and step % args.val_every == 0:
                print(f"step {step:5d} | val loss {train_san.evaluate(model, val, args.val_batches):.4f}")
            t0 = time.time()
            model.zero_grad(set_to_none=True)
            x, y = train.next_batch()
            _, (loss, _, _) = model(x.to(device), y.to(device))
            loss.backward()
            norm = clip_grad_norm(model.ordered_parameters(), oc.grad_clip)
            lr_m, lr_o = group_lrs(oc, step, total_steps)
            opt.step(lr_m, lr_o)
            dt = time.time() - t0
            print(f"step {step + 1:5d}/{total_steps} | loss {loss.item():.4f} | lr {lr_m:.3e} | norm {norm:.3f} | "
                  f"{dt * 1000:.0f} ms | {B * T / dt:.0f} tok/s")
        step0 = total_steps
    if val:
        print(f"step {step0:5d} | val loss {train_san.evaluate(model, val, args.val_batches):.4f}")
    if args.save_checkpoint:
        save_checkpoint(args.save_checkpoint, model, step0, opt)
        print(f"checkpoint: {args.save_checkpoint}")
    if args.write_llmc:
        write_llmc(args.write_llmc, model, args.llmc_dtype)
        print(f"llm.c model file: {args.write_llmc}")
    if args.sample_tokens > 0:
        toks = train_san.sample(model, [cfg.bos_id], args.sample_tokens, seed=args.seed)
        print("sample (token ids):", " ".join(map(str, toks)))
        if tb is not None:
            print("sample (text):", train_san.decode_sample(tb, toks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
