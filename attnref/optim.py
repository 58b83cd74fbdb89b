"""
The optimizers and learning-rate schedules of both references (doc/san-model.md
"Optimizers"): AdamW, and Muon (Newton-Schulz orthogonalisation, in the Keller order or
the SAN paper's) on the matrix group with AdamW on the rest; global grad-norm clipping;
warmup-stable-decay, cosine, linear and constant schedules.
"""

import math
from dataclasses import dataclass, fields

import torch

from attnref.container import format_meta_value, parse_meta_value

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
    weight_decay: float = 0.01     # decoupled, matrix group only (and the embeddings with decay_embedding)
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
    schedule_steps: int = 0        # steps the schedule runs over (0: the run's); past them the last rate holds
    decay_embedding: int = 0       # 1: the embeddings (the non-matrix group's 2-D tensors) decay too

    def validate(self):
        ok = (self.optimizer in ("muon", "adamw") and self.muon_order in ("keller", "paper")
              and self.schedule in ("wsd", "cosine", "linear", "constant")
              and 0 <= self.warmup_frac <= 1 and 0 <= self.decay_frac <= 1 and self.final_frac >= 0
              and self.schedule_steps >= 0 and self.decay_embedding in (0, 1)
              and self.ns_steps >= 0 and self.lr >= 0 and self.lr_other >= 0)
        if not ok:
            raise ValueError(f"bad optimizer config: {self}")

    def to_meta(self):
        # opt.schedule_steps and opt.decay_embedding only when set, as the trainers write them (a file
        # without them: the run's steps, no decay of the embeddings)
        return [("opt." + f.name, format_meta_value(getattr(self, f.name))) for f in fields(self)
                if f.name not in ("schedule_steps", "decay_embedding") or getattr(self, f.name) > 0]

    @classmethod
    def from_meta(cls, meta, source="<meta>"):
        kw = {f.name: parse_meta_value(meta["opt." + f.name], f.type, f"{source}: opt.{f.name}")
              for f in fields(cls) if "opt." + f.name in meta}
        return cls(**kw)


class Optimizer:
    """AdamW or Muon on the matrix group, AdamW (no decay) on the rest. Equations in
    doc/san-model.md "Optimizers". State is kept per parameter name. The model says which
    parameters form the matrix group (its is_matrix_param)."""

    def __init__(self, model, oc):
        oc.validate()
        self.oc = oc
        self.params = model.ordered_parameters()
        self.matrix = {n for n, p in self.params if model.is_matrix_param(n, tuple(p.shape))}
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
            # Hugging Face-style with decay_embedding: every 2-D tensor decays, the embedding included
            wd = oc.weight_decay if is_mat or (oc.decay_embedding and p.dim() == 2) else 0.0
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


def floor_steps(frac, total):
    """The schedule's step counts: floor(frac * total), as the SAN paper code's int(), with 1e-9
    of slack so that a fraction written for a whole count (2,000 of 120,000) gives that count."""
    return int(math.floor(frac * total + 1e-9))


def lr_multiplier(step, total, kind, warmup_frac=0.05, decay_frac=0.15, final_frac=0.05, horizon=0):
    """Multiplier of the peak rate at optimizer step `step` (0-based) of `total`; with a
    `horizon` > 0 (--schedule-steps) the schedule runs over that many steps instead and the
    steps past it keep its last rate (as llmc/optim/schedule.h).
    Step s runs at the rate of progress s (the SAN paper code's optax convention): the first
    update of a warmup runs at rate 0.
    W = floor(warmup_frac * total): steps 0..W-1 ramp linearly as step/W.
    wsd: constant 1 until step total-D-1, D = floor(decay_frac * total); then with
         p = (step - (total-D)) / D in [0, 1), f = final + (1-final)(1+cos(pi p))/2.
    cosine / linear: after warmup, p = (step - W) / (total - W) and
         f = final + (1-final)(1+cos(pi p))/2, resp. f = 1 - (1-final) p.
    constant: 1 after warmup. The last step of wsd/cosine/linear is one step short of `final`."""
    if not 0 <= step < total:
        raise ValueError(f"step {step} outside [0, {total})")
    if horizon > 0:
        step, total = min(step, horizon - 1), horizon
    W = floor_steps(warmup_frac, total)
    D = floor_steps(decay_frac, total) if kind == "wsd" else 0
    if W + D > total:
        raise ValueError(f"warmup ({W}) + decay ({D}) steps exceed total ({total})")
    if step < W:
        return step / W
    if kind == "constant":
        return 1.0
    if kind == "wsd":
        start = total - D
        if step < start:
            return 1.0
        p = (step - start) / D
        return final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * p))
    p = (step - W) / (total - W)
    if kind == "cosine":
        return final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * p))
    if kind == "linear":
        return 1.0 - (1 - final_frac) * p
    raise ValueError(f"unknown schedule {kind!r}")


def group_lrs(oc, step, total):
    f = lr_multiplier(step, total, oc.schedule, oc.warmup_frac, oc.decay_frac, oc.final_frac, oc.schedule_steps)
    return oc.lr * f, oc.lr_other * f

