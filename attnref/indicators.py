"""
The attention-pattern indicators and logit statistics of "Deconstructing Attention" (its
radar plots and logit figures) from the reference model's queries and keys, in whole-tensor
float64: the independent side of llmc/model/attention_indicators.h (definitions:
doc/deconstructing.md "Attention-pattern indicators").

    qk = layer_queries_keys(model, idx)      per layer: (q, k, mask) of the real rows, or None
    attention_weights(form, q, k, mask)      (B, Hq, T, T) the weights, or None
    indicators(A, mask)                      {"entropy", "conc", "sink", "sink_doc", "locfoc", "headdiv"}
    logit_summary(form, q, k, mask)          {"quantiles", "hist"} of |q.k| / sqrt(hd)
    measure(model, idx)                      every layer's, as the trainer logs them
"""
import math

import numpy as np
import torch

from attnref.san import Attention

LEVELS = (0.5, 0.9, 0.99, 0.999, 1.0)   # the quantiles of |logit| logged
EDGES = 10.0 ** (np.arange(-12, 17) / 4.0)  # 1e-3 .. 1e4, four bins per decade
LOCFOC = 4                               # LocFoc N for N = 0..3


def weight_form(kind, cfg):
    """What a layer's weights are: "softmax", "taylor" (joint Taylor), "own" (nonapprox: each
    key's own score), "pairs" (scores but no attention matrix: Taylor separate), None (mlp)."""
    if kind == "mlp":
        return None
    if kind == "approximate":
        return "taylor" if cfg.taylor_norm == "joint" else "pairs"
    return "own" if kind == "nonapprox" else "softmax"


def layer_queries_keys(model, idx):
    """Runs the model on idx (B, T) and returns, per layer, the (q, k, mask) its attention
    sub-layer used for the real rows (q (B,Hq,T,hd), k (B,Hkv,T,hd) after QK-norm and RoPE;
    mask (B or 1, 1, 1, T, T) as attnref.ops.attention_mask), or None where no attention ran
    (mlp, a skipped layer). The fixed stream's call (rndembqk, fixedseqqk) comes second in a
    block and is not kept."""
    seen = {}

    def hook(module, args, kwargs):
        if module in seen:                      # the fixed stream's call
            return
        u, cos, sin, mask = args[:4]
        u0 = args[5] if len(args) > 5 else kwargs.get("u0")
        qk = kwargs.get("qk")
        if qk is None:
            q, k = module.qk(u0 if module.kind == "staticembqk" else u, cos, sin)
        else:
            q, k = qk
        seen[module] = (q.detach(), k.detach(), mask)

    attns = [layer.attn if isinstance(layer.attn, Attention) else None for layer in model.layers]
    handles = [a.register_forward_pre_hook(hook, with_kwargs=True) for a in attns if a is not None]
    try:
        with torch.no_grad():
            model(idx)
    finally:
        for h in handles:
            h.remove()
    return [seen.get(a) if a is not None else None for a in attns]


def _logits(q, k):
    """q (B,Hq,T,hd), k (B,Hkv,T,hd) -> x (B,Hq,T,T) = q.k / sqrt(hd) in float64."""
    q, k = q.double(), k.double()
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    return q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), (q * k).sum(-1) / math.sqrt(q.shape[-1])


def attention_weights(form, q, k, mask):
    """The attention matrices (B, Hq, T, T), float64, zero where the mask hides a key; None
    where the form has none."""
    if form not in ("softmax", "taylor", "own"):
        return None
    x, own = _logits(q, k)
    vis = mask.reshape(mask.shape[0], 1, *mask.shape[-2:])
    if form == "taylor":
        f = torch.where(vis, 1.0 + x + 0.5 * x * x, torch.zeros((), dtype=x.dtype))
        return f / f.sum(-1, keepdim=True)
    scores = own[..., None, :].expand_as(x) if form == "own" else x
    return torch.softmax(scores.masked_fill(~vis, float("-inf")), dim=-1)


def indicators(A, mask):
    """Per head (entropy, conc, sink, sink_doc, locfoc[N]) and per layer (headdiv) from A (B,H,T,T)."""
    B, H, T, _ = A.shape
    vis = mask.reshape(mask.shape[0], 1, T, T).expand(B, 1, T, T)
    plogp = torch.where(A > 0, A * torch.log(torch.where(A > 0, A, torch.ones_like(A))), torch.zeros_like(A))
    entropy = -plogp.sum((-1, -2)).mean(0)
    conc = torch.linalg.matrix_norm(A, ord="fro").mean(0)
    sink = A[..., 0].mean((0, 2))                           # the paper's A[:,1]/L: the row's first token
    first = vis.to(torch.int64).argmax(-1)                  # (B,1,T): the first key each query sees
    sink_doc = A.gather(-1, first.expand(B, H, T)[..., None])[..., 0].mean((0, 2))
    locfoc = []
    for n in range(LOCFOC):
        a = torch.diagonal(A, offset=-n, dim1=-2, dim2=-1)     # (B,H,T-n): a[t][t-n]
        v = torch.diagonal(vis, offset=-n, dim1=-2, dim2=-1)   # (B,1,T-n)
        locfoc.append((a * v).sum((0, 2)) / v.sum())
    spread = A.std(dim=1, unbiased=False)                      # (B,T,T) over the heads
    headdiv = spread[vis[:, 0]].mean()
    return {"entropy": entropy.tolist(), "conc": conc.tolist(), "sink": sink.tolist(), "sink_doc": sink_doc.tolist(),
            "locfoc": [l.tolist() for l in locfoc], "headdiv": float(headdiv)}


def logit_summary(form, q, k, mask):
    """|x| over the visible pairs ("own": each position's own score): quantiles at LEVELS (the
    ceil(p n)-th smallest) and counts per bin of EDGES (below the first edge: the first bin;
    from the last edge on: the last)."""
    if form is None:
        return None
    x, own = _logits(q, k)
    if form == "own":
        values = own.abs().flatten()
    else:
        vis = mask.reshape(mask.shape[0], 1, *mask.shape[-2:]).expand_as(x)
        values = x.abs()[vis]
    v = np.sort(values.numpy())
    n = len(v)
    quantiles = [float(v[max(1, math.ceil(p * n)) - 1]) for p in LEVELS]
    hist = np.bincount(np.digitize(v, EDGES[1:-1]), minlength=len(EDGES) - 1)
    return {"quantiles": quantiles, "hist": hist.tolist()}


def measure(model, idx):
    """Every layer's indicators and logit summary on idx: a list of (indicators or None,
    logit summary or None), the trainer's attn_* and logit_abs_* keys."""
    out = []
    for kind, qk in zip(model.cfg.kinds, layer_queries_keys(model, idx)):
        if qk is None:
            out.append((None, None))
            continue
        form = weight_form(kind, model.cfg)
        A = attention_weights(form, *qk)
        out.append((indicators(A, qk[2]) if A is not None else None, logit_summary(form, *qk)))
    return out
