"""
The GPT-2 baseline (doc/gpt2.md), the numerical twin of train_gpt2.cu: learned positions,
LayerNorm with bias, fused-qkv causal MHA, a GELU MLP of width 4d, a tied LM head, the
vocabulary padded to a multiple of 128. Reads top to bottom: config and presets -> init (the
parameter list is sizes.py's) -> model -> optimizer groups -> checkpoint load.
"""

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnref import presets, sizes
from attnref.container import KIND_CHECKPOINT, load_params_into, read_container
from attnref.ops import attention_mask, gqa_attention, san_loss
from attnref.optim import Optimizer
from attnref.params import ModelConfig, SpecModel

# -----------------------------------------------------------------------------------------
# Configuration

LN_EPS = 1e-5            # LayerNorm epsilon (GPT-2's)
INIT_STD = 0.02          # std of every matrix and both embeddings


@dataclass
class GPT2Config(ModelConfig):
    """Field names are the keys of the config text in GPT-2 checkpoints and debug states
    (doc/formats.md "GPT-2 checkpoints"), besides `model=gpt2` and the derived keys."""
    vocab_size: int = 250          # real vocabulary V
    seq_len: int = 64              # max context T (rows of wpe)
    n_layer: int = 2               # L
    n_embd: int = 64               # d
    n_head: int = 4                # H; head_dim = d / H
    bos_id: int = 2                # token that starts a sample (GPT-2 BPE: 50256 <|endoftext|>)

    MODEL: ClassVar[str] = "gpt2"
    # read by ops.san_loss and ops.loss_mask: GPT-2 has no z-loss and no document mask
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

    @classmethod
    def from_meta(cls, meta, source="<meta>"):
        if meta.get("model") != "gpt2":
            kind = meta.get("model", "san")  # SAN files from before the key have none
            raise ValueError(f"{source}: not a GPT-2 file (config key model={kind}, expected gpt2): it belongs to "
                             f"train_{kind}, not train_gpt2")
        return super().from_meta(meta, source)


# Presets: presets/gpt2/NAME.conf, the files train_gpt2 compiles in (attnref/presets.py reads them):
# each sets every model flag, as {GPT2Config field: value}. (The tiny ones for the tests, demo for a
# CPU, and OpenAI's four GPT-2 sizes.)
def preset_config(preset):
    """{GPT2Config field: value} of a presets.Preset; a GPT-2 preset has no keys of its own (no swept
    rates, no recipe), as train_gpt2 reads it."""
    if preset.swept or preset.tuned_for:
        raise presets.PresetFileError(f"{preset.path}: unknown setting "
                                      f"{'tuned-for' if preset.tuned_for else 'swept-*'} (a GPT-2 preset sets model flags only)")
    return presets.model_config(preset, GPT2Config)


PRESET_FILES = presets.load_presets(presets.GPT2_PRESET_DIR)
PRESETS = {name: preset_config(p) for name, p in PRESET_FILES.items()}


# -----------------------------------------------------------------------------------------
# Parameters: names, shapes and order are attnref/sizes.py's, beside the SAN's (without torch);
# that list IS the contract with train_gpt2.cu. The init is here.

parameter_spec = sizes.gpt2_parameter_spec
count_parameters = sizes.gpt2_parameter_counts  # (total, non-embedding: without wte and wpe)
flops_per_token = sizes.gpt2_flops_per_token


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


class GPT2(SpecModel):
    parameter_spec = staticmethod(parameter_spec)
    init_value = staticmethod(init_value)
    is_matrix_param = staticmethod(is_matrix_param)

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Parameter(torch.zeros(cfg.padded_vocab_size, cfg.n_embd))
        self.wpe = nn.Parameter(torch.zeros(cfg.seq_len, cfg.n_embd))
        self.layers = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = LayerNorm(cfg.n_embd)
        self.check_spec()

    def forward(self, idx, targets=None):
        """idx (B,T) token ids < vocab_size. Returns logits (B,T,Vp) and, with targets,
        (loss, ce, lse_sq) from ops.san_loss (z_loss = 0, no document mask: the loss
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
    """optim.Optimizer in its AdamW form, the only one the GPT-2 trainers have; the model's
    is_matrix_param leaves the embeddings, biases and LayerNorm parameters undecayed."""
    if oc.optimizer != "adamw":
        raise ValueError("the GPT-2 trainers use AdamW (--optimizer adamw)")
    return Optimizer(model, oc)


# -----------------------------------------------------------------------------------------
# Checkpoint load (the save is container.save_checkpoint, shared with the SAN)

def load_checkpoint(path, device="cpu"):
    """Returns (model, step, meta, tensors); restore the optimizer with
    make_optimizer(...).load_state_tensors(tensors, step, path)."""
    _, meta, tensors = read_container(path, KIND_CHECKPOINT)
    cfg = GPT2Config.from_meta(meta, str(path))
    model = GPT2(cfg)
    load_params_into(model, tensors, str(path))
    return model.to(device), int(meta.get("step", "0")), meta, tensors


