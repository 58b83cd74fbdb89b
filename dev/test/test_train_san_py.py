"""Tests of the PyTorch reference train_san.py (model, loss, optimizers, schedules, file
formats, data reader, CLI). Run: .venv/bin/python -m pytest dev/test/test_train_san_py.py

Every expected value here is derived in the test from a definition (doc/san-model.md,
doc/formats.md) or computed by an independent formulation, never copied from a run."""

import math
import os
import struct
import subprocess
import sys
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from attnref import container, data, ops, optim, san, training
import train_san as ts

ROOT = Path(__file__).resolve().parents[2]

torch.set_num_threads(1)   # tiny tensors: threads only add contention

# a micro config for float64 gradient checks; V=20 pads to 128
MICRO = dict(vocab_size=20, seq_len=8, n_layer=2, n_embd=8, n_head=2, n_kv_head=1,
             ffn="none", norm="zcn", qk_norm=True, residual="gated", sandwich=False,
             rope_theta=10000.0, doc_mask=True, bos_id=2, z_loss=1e-2)


def micro(**kw):
    return san.SANConfig(**dict(MICRO, **kw))


def batch_with_docs(cfg, B, seed=0):
    """(inputs, targets) with BOS at fixed places: row 0 starts mid-document."""
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(3, cfg.vocab_size, (B, cfg.seq_len + 1), generator=g)
    T = cfg.seq_len
    for b in range(B):
        for s in (T // 3 + b % 2, (2 * T) // 3, T):
            toks[b, s] = cfg.bos_id
    if B > 1:
        toks[1, 0] = cfg.bos_id
    return toks[:, :-1].contiguous(), toks[:, 1:].contiguous()


def randomize_gains(model, seed=1):
    """Non-trivial gains/gates so their gradients are exercised (init makes them 0/1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.ordered_parameters():
            if p.ndim == 1:
                p.add_(torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype) * 0.3)


# ------------------------------------------------------------------------------------------
# parameters, counts, init

def independent_count(cfg):
    """Parameter count written out from the architecture description (doc/san-model.md)."""
    d, hd = cfg.n_embd, cfg.n_embd // cfg.n_head
    Vp = -(-cfg.vocab_size // 128) * 128
    gate = 1 if cfg.residual in ("gated", "rezero") else 0
    attn = d + d * d + 2 * d * cfg.n_kv_head * hd + d * d
    attn += (2 * hd if cfg.qk_norm else 0) + (d if cfg.sandwich else 0) + gate
    ffn = 0
    if cfg.ffn == "swiglu":
        ffn = d + 3 * d * cfg.d_ff + (d if cfg.sandwich else 0) + gate
    nonemb = cfg.n_layer * (attn + ffn) + d
    return Vp * d + nonemb, nonemb


@pytest.mark.parametrize("kw", [
    {}, dict(ffn="swiglu"), dict(ffn="swiglu", sandwich=True, residual="rezero"),
    dict(qk_norm=False, residual="standard"), dict(residual="none", n_kv_head=2),
    dict(vocab_size=129, n_head=4, n_kv_head=4, n_embd=16)])
def test_parameter_count_independent(kw):
    cfg = micro(**kw)
    model = san.SAN(cfg)
    assert san.count_parameters(cfg) == independent_count(cfg)
    assert sum(p.numel() for p in model.parameters()) == independent_count(cfg)[0]
    assert [n for n, _ in model.ordered_parameters()] == [n for n, _ in san.parameter_spec(cfg)]


def test_presets_match_paper_matchings():
    counts = {k: independent_count(san.SANConfig(**san.PRESETS[k])) for k in ("san20", "ffn20", "ffn4", "ffn9")}
    for k, c in counts.items():
        assert san.count_parameters(san.SANConfig(**san.PRESETS[k])) == c
    san_nonemb = counts["san20"][1]
    # iso-param: 4 FFN layers hold the non-embedding parameters of 20 SAN layers (within 1%)
    assert abs(counts["ffn4"][1] - san_nonemb) / san_nonemb < 0.01
    # iso-depth: the paper's "~3.6x params" is the ratio of total (embedding included) counts
    assert round(counts["ffn20"][0] / counts["san20"][0], 1) == 3.6
    # iso-FLOP: by flops_per_token the SAN's FLOPs/token fall between the 9- and 10-layer FFN
    # models (9.56 layers); the paper's partner is "~9"
    f = lambda L: san.flops_per_token(san.SANConfig(**dict(san.PRESETS["ffn9"], n_layer=L)))
    san_f = san.flops_per_token(san.SANConfig(**san.PRESETS["san20"]))
    assert f(9) < san_f < f(10) and san.PRESETS["ffn9"]["n_layer"] == 9
    assert san.SANConfig(vocab_size=50257, bos_id=0).padded_vocab_size == 50304


def test_init_follows_spec():
    cfg = san.SANConfig(vocab_size=1000, seq_len=16, n_layer=3, n_embd=128, n_head=4, n_kv_head=2,
                       ffn="swiglu", sandwich=True)
    model = san.SAN(cfg).init_weights(7)
    P = dict(model.ordered_parameters())
    assert torch.all(P["wte"][cfg.vocab_size:] == 0)
    assert abs(P["wte"][: cfg.vocab_size].std().item() - 0.02) < 0.001
    for n, p in P.items():
        if n.endswith("attn.wo") or n.endswith("ffn.w_down"):
            assert abs(p.std().item() / (0.02 / math.sqrt(2 * cfg.n_layer)) - 1) < 0.05, n
        elif p.ndim == 2 and n != "wte":
            assert abs(p.std().item() / 0.02 - 1) < 0.05, n
        elif p.ndim == 1:
            assert torch.all(p == 0), n           # zcn gains and gates
    rms = san.SAN(replace(cfg, norm="rms")).init_weights(7)
    for (n, a), (_, b) in zip(model.ordered_parameters(), rms.ordered_parameters()):
        if n.endswith(".weight") and a.ndim == 1:
            assert torch.all(b == 1), n
        else:
            assert torch.equal(a, b), n          # gains consume no random numbers


# ------------------------------------------------------------------------------------------
# the forward pass against a second, loop-based implementation written from the spec

def spec_forward(cfg, P, idx):
    """Logits of one row idx (T,) written from the SAN paper with per-head loops,
    complex-number RoPE and an explicit allowed-key list (float64)."""
    d, hd, T = cfg.n_embd, cfg.n_embd // cfg.n_head, len(idx)

    def norm(x, g):
        r = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)
        return r * (1 + g) if cfg.norm == "zcn" else r * g

    def rope(v, t):                         # v (hd,), position t
        z = torch.complex(v[: hd // 2], v[hd // 2:])
        ang = torch.tensor([t / cfg.rope_theta ** (2 * i / hd) for i in range(hd // 2)], dtype=torch.float64)
        z = z * torch.exp(1j * ang)
        return torch.cat([z.real, z.imag])

    def add(x, h, pre):
        if cfg.sandwich:
            h = norm(h, P[pre + "_post_norm.weight"])
        if cfg.residual == "gated":
            return x + torch.sigmoid(P[pre + "_gate"]) * h
        if cfg.residual == "rezero":
            return x + P[pre + "_gate"] * h
        return x + h if cfg.residual == "standard" else h

    doc, seen = [], 0
    for tok in idx.tolist():
        seen += tok == cfg.bos_id
        doc.append(seen if cfg.doc_mask else 0)
    x = P["wte"][idx] * math.sqrt(d)
    for i in range(cfg.n_layer):
        L = f"layers.{i}."
        u = norm(x, P[L + "attn_norm.weight"])
        heads = []
        for h in range(cfg.n_head):
            kvh = h * cfg.n_kv_head // cfg.n_head
            Wq = P[L + "attn.wq"][h * hd:(h + 1) * hd]
            Wk = P[L + "attn.wk"][kvh * hd:(kvh + 1) * hd]
            Wv = P[L + "attn.wv"][kvh * hd:(kvh + 1) * hd]
            q, k, v = u @ Wq.T, u @ Wk.T, u @ Wv.T
            if cfg.qk_norm:
                q, k = norm(q, P[L + "attn.q_norm.weight"]), norm(k, P[L + "attn.k_norm.weight"])
            q = torch.stack([rope(q[t], t) for t in range(T)])
            k = torch.stack([rope(k[t], t) for t in range(T)])
            out = []
            for t in range(T):
                keys = [s for s in range(t + 1) if doc[s] == doc[t]]
                w = torch.softmax(torch.stack([q[t] @ k[s] for s in keys]) / math.sqrt(hd), 0)
                out.append(sum(wi * v[s] for wi, s in zip(w, keys)))
            heads.append(torch.stack(out))
        x = add(x, torch.cat(heads, -1) @ P[L + "attn.wo"].T, L + "attn")
        if cfg.ffn == "swiglu":
            u = norm(x, P[L + "ffn_norm.weight"])
            a = u @ P[L + "ffn.w_gate"].T
            hid = a * torch.sigmoid(a) * (u @ P[L + "ffn.w_up"].T)
            x = add(x, hid @ P[L + "ffn.w_down"].T, L + "ffn")
    return norm(x, P["final_norm.weight"]) @ P["wte"].T


@pytest.mark.parametrize("kw", [
    {}, dict(ffn="swiglu", d_ff=12, sandwich=True, norm="rms"), dict(residual="rezero", qk_norm=False),
    dict(residual="none", n_kv_head=2), dict(residual="standard", doc_mask=False, n_head=4, n_embd=16)])
def test_forward_matches_spec_implementation(kw):
    cfg = micro(**kw)
    model = san.SAN(cfg).init_weights(8).double()
    randomize_gains(model)
    with torch.no_grad():
        for n, p in model.ordered_parameters():
            if n.endswith("_gate"):
                p.fill_(0.4)
    P = {n: p.detach() for n, p in model.ordered_parameters()}
    x, _ = batch_with_docs(cfg, 2)
    logits = model(x)[0].detach()
    for b in range(2):
        torch.testing.assert_close(logits[b], spec_forward(cfg, P, x[b]), rtol=1e-9, atol=1e-10)


# ------------------------------------------------------------------------------------------
# gradients vs finite differences (float64)

@pytest.mark.parametrize("kw", [
    {}, dict(ffn="swiglu", d_ff=12), dict(norm="rms"), dict(qk_norm=False),
    dict(residual="standard"), dict(residual="rezero"), dict(residual="none"),
    dict(sandwich=True, ffn="swiglu", d_ff=12), dict(doc_mask=False), dict(n_kv_head=2),
    dict(n_head=4, n_kv_head=1, n_embd=16)])
def test_gradcheck(kw):
    cfg = micro(**kw)
    model = san.SAN(cfg).init_weights(3).double()
    randomize_gains(model)
    with torch.no_grad():   # rezero/none start with dead paths; give the gates a value
        for n, p in model.ordered_parameters():
            if n.endswith("_gate"):
                p.fill_(0.7)
    x, y = batch_with_docs(cfg, 2)
    names = [n for n, _ in model.ordered_parameters()]
    values = tuple(p.detach().clone().requires_grad_(True) for _, p in model.ordered_parameters())

    def f(*vals):
        _, (loss, _, _) = functional_call(model, dict(zip(names, vals)), (x, y))
        return loss

    assert torch.autograd.gradcheck(f, values, eps=1e-6, atol=1e-6, rtol=1e-4, fast_mode=True)


# ------------------------------------------------------------------------------------------
# attention, masks, RoPE, GQA

def test_doc_mask_attention_vs_per_document_loop():
    g = torch.Generator().manual_seed(0)
    B, Hq, Hkv, T, hd, bos = 2, 4, 2, 12, 4, 2
    q, k, v = (torch.randn(B, H, T, hd, generator=g, dtype=torch.float64) for H in (Hq, Hkv, Hkv))
    idx = torch.randint(3, 9, (B, T), generator=g)
    idx[0, [3, 4, 9]] = bos
    idx[1, [0, 7]] = bos
    doc = ops.document_ids(idx, bos)
    out = ops.gqa_attention(q, k, v, ops.attention_mask(T, doc, "cpu"))
    ref = torch.zeros_like(out)
    for b in range(B):
        # split the row at BOS tokens; the part before the first BOS is its own document
        starts = [0] + [t for t in range(T) if idx[b, t] == bos and t > 0] + [T]
        for s0, s1 in zip(starts[:-1], starts[1:]):
            for h in range(Hq):
                kv = h // (Hq // Hkv)
                for t in range(s0, s1):
                    w = torch.tensor([float(q[b, h, t] @ k[b, kv, s]) / math.sqrt(hd) for s in range(s0, t + 1)],
                                     dtype=torch.float64)
                    w = torch.exp(w - w.max())
                    w = w / w.sum()
                    ref[b, h, t] = sum(w[i] * v[b, kv, s0 + i] for i in range(t + 1 - s0))
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    # without the document mask the same inputs must give a different answer
    plain = ops.gqa_attention(q, k, v, ops.attention_mask(T, None, "cpu"))
    assert not torch.allclose(plain, ref)


def test_doc_mask_model_equals_each_document_alone():
    cfg = micro(seq_len=16, doc_mask=True)
    model = san.SAN(cfg).init_weights(5).double()
    randomize_gains(model)
    g = torch.Generator().manual_seed(2)
    row = torch.randint(3, cfg.vocab_size, (1, 16), generator=g)
    row[0, [5, 11]] = cfg.bos_id                    # docs: [0,5) tail, [5,11), [11,16)
    packed, _ = model(row)
    for s0, s1 in ((0, 5), (5, 11), (11, 16)):
        alone, _ = model(row[:, s0:s1])
        torch.testing.assert_close(packed[:, s0:s1], alone, rtol=1e-9, atol=1e-10)
    model.cfg.doc_mask = False       # negative control: without the mask docs interact
    unmasked, _ = model(row)
    assert not torch.allclose(unmasked[:, 5:11], packed[:, 5:11])


def test_loss_mask_and_loss_definition():
    cfg = micro(vocab_size=50, z_loss=0.3)
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 8, cfg.padded_vocab_size, generator=g, dtype=torch.float64)
    logits[..., cfg.vocab_size:] = 100.0            # padded columns must not matter
    y = torch.randint(3, 50, (2, 8), generator=g)
    y[0, 3] = cfg.bos_id
    y[1, 0] = cfg.bos_id
    y[1, 5] = -1
    keep = [(b, t) for b in range(2) for t in range(8) if y[b, t] >= 0 and y[b, t] != cfg.bos_id]
    ce = sum(-F.log_softmax(logits[b, t, :50], -1)[y[b, t]] for b, t in keep) / len(keep)
    z = sum(torch.logsumexp(logits[b, t, :50], -1) ** 2 for b, t in keep) / len(keep)
    loss, ce_, z_ = ops.san_loss(logits, y, cfg)
    torch.testing.assert_close(ce_, ce)
    torch.testing.assert_close(z_, z)
    torch.testing.assert_close(loss, ce + 0.3 * z)
    # doc mask off: only the -1 target is dropped
    off = replace(cfg, doc_mask=False)
    assert int(ops.loss_mask(y, off).sum()) == 15 and int(ops.loss_mask(y, cfg).sum()) == len(keep)
    # everything masked: loss 0, not NaN
    l0, _, _ = ops.san_loss(logits, torch.full_like(y, -1), cfg)
    assert l0.item() == 0.0


def test_document_ids_rule():
    idx = torch.tensor([[5, 6, 2, 7, 2, 2, 8], [2, 3, 3, 3, 3, 3, 3]])
    assert ops.document_ids(idx, 2).tolist() == [[0, 0, 1, 1, 2, 3, 3], [1, 1, 1, 1, 1, 1, 1]]


def test_rope_vs_complex_formulation():
    g = torch.Generator().manual_seed(0)
    B, H, T, hd, theta = 2, 3, 17, 8, 500.0
    x = torch.randn(B, H, T, hd, generator=g, dtype=torch.float64)
    cos, sin = san.rope_cos_sin(T, hd, theta, torch.float64, "cpu")
    out = san.apply_rope(x, cos, sin)
    half = hd // 2
    z = torch.complex(x[..., :half], x[..., half:])                 # pair (i, i + hd/2)
    freqs = torch.tensor([1.0 / theta ** (2 * i / hd) for i in range(half)], dtype=torch.float64)
    angles = torch.outer(torch.arange(T, dtype=torch.float64), freqs)
    rot = z * torch.polar(torch.ones_like(angles), angles)
    torch.testing.assert_close(out, torch.cat([rot.real, rot.imag], -1), rtol=1e-12, atol=1e-12)
    # relative-position property: <R_t q, R_s k> depends on t - s only
    q, k = x[0, 0, 0], x[0, 0, 1]
    rq, rk = (san.apply_rope(v.expand(1, 1, T, hd).clone(), cos, sin)[0, 0] for v in (q, k))
    assert abs(float(rq[9] @ rk[4]) - float(rq[12] @ rk[7])) < 1e-10


@pytest.mark.parametrize("hkv", [1, 2])
def test_gqa_vs_repeated_kv_mha(hkv):
    cfg = micro(n_head=4, n_kv_head=hkv, n_embd=16, ffn="swiglu", d_ff=8)
    mha_cfg = replace(cfg, n_kv_head=4)
    gqa = san.SAN(cfg).init_weights(9).double()
    randomize_gains(gqa)
    mha = san.SAN(mha_cfg).double()
    G, hd = 4 // hkv, cfg.head_dim
    src = dict(gqa.ordered_parameters())
    with torch.no_grad():
        for n, p in mha.ordered_parameters():
            w = src[n]
            if n.endswith("attn.wk") or n.endswith("attn.wv"):
                w = w.view(hkv, hd, -1).repeat_interleave(G, dim=0).reshape(4 * hd, -1)
            p.copy_(w)
    x, _ = batch_with_docs(cfg, 2)
    torch.testing.assert_close(gqa(x)[0], mha(x)[0], rtol=1e-10, atol=1e-10)


def test_sdpa_path_matches_explicit():
    cfg = micro(n_head=4, n_kv_head=2, n_embd=16)
    model = san.SAN(cfg).init_weights(1).double()
    randomize_gains(model)
    x, _ = batch_with_docs(cfg, 3)
    a = model(x)[0]
    model.attn_impl = "sdpa"
    torch.testing.assert_close(model(x)[0], a, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("doc_mask", [0, 1])
def test_fast_path_matches_explicit(doc_mask):
    """The speed path (SDPA is_causal / FlexAttention with the document block mask, GQA without
    repeated k, v) against the explicit maths, eager fp32 on the CPU: logits, and gradients
    where the CPU has a backward (FlexAttention's, used with the document mask, is GPU-only)."""
    import warnings
    cfg = micro(n_head=4, n_kv_head=2, n_embd=16, doc_mask=doc_mask)
    model = san.SAN(cfg).init_weights(1)
    randomize_gains(model)
    x, y = batch_with_docs(cfg, 3)
    results = []
    for impl in ("explicit", "fast"):
        model.attn_impl = impl
        model.zero_grad(set_to_none=True)
        with warnings.catch_warnings(), torch.set_grad_enabled(not doc_mask):
            warnings.simplefilter("ignore")  # FlexAttention in eager mode says it is unfused
            logits, (loss, _, _) = model(x, y)
        if doc_mask:
            results.append((logits.detach(), []))
            continue
        loss.backward()
        results.append((logits.detach(), [p.grad.clone() for _, p in model.ordered_parameters()]))
    (ref_logits, ref_grads), (logits, grads) = results
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------------------------------
# Newton-Schulz and optimizers

def quintic_iterate(s, steps=5):
    a, b, c = 3.4445, -4.7750, 2.0315
    for _ in range(steps):
        s = a * s + b * s ** 3 + c * s ** 5
    return s


@pytest.mark.parametrize("shape", [(48, 48), (96, 24), (24, 96), (32, 64), (128, 32)])
def test_newton_schulz_singular_values(shape):
    g = torch.Generator().manual_seed(shape[0] * 1000 + shape[1])
    G = torch.randn(shape, generator=g, dtype=torch.float64)
    s_in = torch.linalg.svdvals(G) / (G.norm() + 1e-7)
    # exact property (float64): singular values map through the scalar quintic, 5 times
    out = optim.newton_schulz(G)
    expect = torch.sort(quintic_iterate(s_in)).values
    torch.testing.assert_close(torch.sort(torch.linalg.svdvals(out)).values, expect, rtol=1e-8, atol=1e-10)
    # fp32 path: singular values inside the band the quintic produces on [s_min, s_max]
    grid = torch.linspace(float(s_in.min()), float(s_in.max()), 20001, dtype=torch.float64)
    band = quintic_iterate(grid)
    lo, hi = float(band.min()), float(band.max())
    sv32 = torch.linalg.svdvals(optim.newton_schulz(G.float()).double())
    assert lo - 1e-3 <= float(sv32.min()) and float(sv32.max()) <= hi + 1e-3, (lo, hi, sv32)
    # and never above the quintic's maximum over (0, 1]
    top = float(quintic_iterate(torch.linspace(1e-6, 1, 100001, dtype=torch.float64)).max())
    assert float(sv32.max()) <= top + 1e-3 and top < 1.25
    # singular vectors kept: out = U f(S) V^T
    U, S, Vh = torch.linalg.svd(G, full_matrices=False)
    torch.testing.assert_close(out, U @ torch.diag(quintic_iterate(S / (G.norm() + 1e-7))) @ Vh,
                               rtol=1e-8, atol=1e-10)


def test_adamw_matches_torch_adamw():
    cfg = micro(ffn="swiglu", d_ff=12)
    model = san.SAN(cfg).init_weights(0)
    ref = san.SAN(cfg)
    ref.load_state_dict(model.state_dict())
    oc = optim.OptConfig(optimizer="adamw", lr=1e-2, lr_other=3e-3, weight_decay=0.1, grad_clip=0)
    opt = optim.Optimizer(model, oc)
    mats = [p for n, p in ref.ordered_parameters() if p.ndim == 2 and n != "wte"]
    rest = [p for n, p in ref.ordered_parameters() if not (p.ndim == 2 and n != "wte")]
    topt = torch.optim.AdamW([dict(params=mats, lr=1e-2, weight_decay=0.1),
                              dict(params=rest, lr=3e-3, weight_decay=0.0)], betas=(0.9, 0.95), eps=1e-8)
    x, y = batch_with_docs(cfg, 2)
    for _ in range(3):
        for m in (model, ref):
            m.zero_grad()
            m(x, y)[1][0].backward()
        opt.step(1e-2, 3e-3)
        topt.step()
    for (n, a), (_, b) in zip(model.ordered_parameters(), ref.ordered_parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7, msg=n)


@pytest.mark.parametrize("order", ["keller", "paper"])
def test_muon_update_equations(order):
    """Two steps of Muon on one matrix, against the equations written out here."""
    torch.manual_seed(0)
    cfg = micro(ffn="swiglu", d_ff=12)     # w_gate is tall (12 x 8): shape factor sqrt(1.5)
    model = san.SAN(cfg).init_weights(0).double()
    oc = optim.OptConfig(optimizer="muon", muon_order=order, lr=0.05, lr_other=0.0, weight_decay=0.1)
    opt = optim.Optimizer(model, oc)
    P = dict(model.ordered_parameters())
    name = "layers.0.ffn.w_gate"
    W = P[name].detach().clone()
    M = torch.zeros_like(W)
    mu, lr, wd = 0.95, 0.05, 0.1
    for step in range(2):
        G = torch.randn_like(W)
        for p in P.values():
            p.grad = torch.zeros_like(p)
        P[name].grad = G.clone()
        opt.step(lr, 0.0)
        if order == "keller":
            M = mu * M + (1 - mu) * G
            U = optim.newton_schulz((1 - mu) * G + mu * M) * math.sqrt(12 / 8)
        else:
            O = optim.newton_schulz(G)                   # the SAN paper's code: no (1 - mu) damping
            M = mu * M + O
            U = O + mu * M
        W = W * (1 - lr * wd) - lr * U
        torch.testing.assert_close(P[name].detach(), W, rtol=1e-12, atol=1e-14)
    # the non-matrix group used AdamW at lr 0: embedding and gains unchanged
    assert "opt.m.wte" in opt.state_tensors() and "opt.mom.wte" not in opt.state_tensors()


def test_muon_paper_order_first_step_size():
    """From zero momentum the paper order moves W by exactly lr (1 + mu) NS(G): a (1 - mu)
    factor on the orthogonalised gradient (20x smaller steps at mu 0.95) fails this."""
    cfg = micro()
    model = san.SAN(cfg).init_weights(0).double()
    mu, lr = 0.95, 0.01
    opt = optim.Optimizer(model, optim.OptConfig(optimizer="muon", muon_order="paper", lr=lr, lr_other=0.0,
                                              weight_decay=0.0, muon_momentum=mu))
    P = dict(model.ordered_parameters())
    name = "layers.0.attn.wq"
    W0 = P[name].detach().clone()
    G = torch.randn_like(W0, generator=torch.Generator().manual_seed(3))
    for p in P.values():
        p.grad = torch.zeros_like(p)
    P[name].grad = G.clone()
    opt.step(lr, 0.0)
    step = (W0 - P[name].detach()) / lr
    O = optim.newton_schulz(G)
    torch.testing.assert_close(step, (1 + mu) * O, rtol=1e-10, atol=1e-12)
    # the orthogonalised update has spectral size ~1 (NS's singular values lie in ~[0.7, 1.2])
    assert 1.5 < torch.linalg.matrix_norm(step, ord=2).item() < 2.5


def test_grad_clip():
    p = torch.nn.Parameter(torch.zeros(3))
    q = torch.nn.Parameter(torch.zeros(2, 2))
    p.grad = torch.tensor([3.0, 0.0, 0.0])
    q.grad = torch.tensor([[0.0, 4.0], [0.0, 0.0]])
    norm = optim.clip_grad_norm([("p", p), ("q", q)], 1.0)
    assert norm == pytest.approx(5.0)
    torch.testing.assert_close(p.grad, torch.tensor([3.0, 0, 0]) / (5 + 1e-6))
    p.grad = torch.tensor([0.3, 0.0, 0.0])
    q.grad = torch.zeros(2, 2)
    optim.clip_grad_norm([("p", p), ("q", q)], 1.0)
    assert torch.equal(p.grad, torch.tensor([0.3, 0.0, 0.0]))   # below the threshold: untouched


# ------------------------------------------------------------------------------------------
# schedules

def cos_mix(p, final):
    return final + (1 - final) * 0.5 * (1 + math.cos(math.pi * p))


def test_schedule_boundaries():
    """Step s runs at the rate of progress s, step counts floored: the SAN paper code's optax
    schedule (doc/san-model.md "Schedules")."""
    f = optim.lr_multiplier
    N = 100                                   # W = 5 warmup, D = 15 decay steps
    assert f(0, N, "wsd") == 0.0              # the first update at rate 0
    assert f(1, N, "wsd") == pytest.approx(1 / 5) and f(4, N, "wsd") == pytest.approx(4 / 5)
    assert f(5, N, "wsd") == 1.0 and f(85, N, "wsd") == 1.0
    assert f(86, N, "wsd") == pytest.approx(cos_mix(1 / 15, 0.05))
    assert f(92, N, "wsd") == pytest.approx(cos_mix(7 / 15, 0.05))
    assert f(99, N, "wsd") == pytest.approx(cos_mix(14 / 15, 0.05))
    assert f(5, N, "cosine") == 1.0 and f(6, N, "cosine") == pytest.approx(cos_mix(1 / 95, 0.05))
    assert f(99, N, "cosine") == pytest.approx(cos_mix(94 / 95, 0.05))
    assert f(6, N, "linear") == pytest.approx(1 - 0.95 / 95)
    assert f(99, N, "linear") == pytest.approx(1 - 0.95 * 94 / 95)
    assert f(1, N, "constant") == pytest.approx(0.2) and f(99, N, "constant") == 1.0
    assert f(0, N, "wsd", warmup_frac=0.0) == 1.0
    # floored, with slack for a fraction written for a whole count: 0.29 * 100 = 28.999999999999996
    # -> 29 warmup steps; 0.25 * 10 = 2.5 -> 2
    assert f(29, N, "wsd", warmup_frac=0.29) == 1.0 and f(28, N, "wsd", warmup_frac=0.29) == pytest.approx(28 / 29)
    assert f(2, 10, "wsd", warmup_frac=0.25) == 1.0 and f(1, 10, "wsd", warmup_frac=0.25) == 0.5
    # the SAN paper's 100,000 steps: W = 5,000, D = 15,000
    assert f(4999, 100_000, "wsd") == pytest.approx(4999 / 5000) and f(85_000, 100_000, "wsd") == 1.0
    assert f(85_001, 100_000, "wsd") == pytest.approx(cos_mix(1 / 15_000, 0.05))
    for kind in ("wsd", "cosine", "linear"):
        vals = [f(s, N, kind) for s in range(5, N)]
        assert all(a >= b for a, b in zip(vals, vals[1:])), kind
    with pytest.raises(ValueError):
        f(0, 10, "wsd", warmup_frac=0.6, decay_frac=0.6)
    with pytest.raises(ValueError):
        f(10, 10, "wsd")


# ------------------------------------------------------------------------------------------
# file formats

def test_container_round_trip_bit_exact(tmp_path):
    g = np.random.default_rng(0)
    a32 = g.standard_normal((3, 5, 7)).astype(np.float32)
    a32[0, 0, 0] = np.float32(-0.0)
    ints = g.integers(-2**31, 2**31 - 1, size=(4, 9)).astype(np.int32)
    bf = g.standard_normal((33,)).astype(np.float32)
    tensors = [("a", a32, "fp32"), ("scalar", np.array([1.5], np.float32), "fp32"),
               ("ints", ints, "int32"), ("bf", bf, "bf16"), ("empty", np.zeros((0, 4), np.float32), "fp32")]
    meta = [("alpha", "1"), ("beta", "x y"), ("gamma", repr(0.1))]
    p = tmp_path / "c.bin"
    container.write_container(p, container.KIND_CHECKPOINT, meta, tensors)
    kind, m, t = container.read_container(p, container.KIND_CHECKPOINT)
    assert kind == container.KIND_CHECKPOINT and m == dict(meta) and list(t) == [n for n, _, _ in tensors]
    assert t["a"].tobytes() == a32.tobytes() and t["ints"].tobytes() == ints.tobytes()
    assert t["empty"].shape == (0, 4)
    # bf16: round-to-nearest-even, as torch converts
    assert np.array_equal(t["bf"], torch.from_numpy(bf).to(torch.bfloat16).float().numpy())
    # layout as documented: header fields, 64-byte alignment, exact file size
    raw = p.read_bytes()
    magic, ver, kind, mb, nt, doff, dbytes = struct.unpack_from("<8sIIQQQQ", raw)
    assert (magic, ver, nt) == (b"ATTNFILE", 2, 5) and doff % 64 == 0 and len(raw) == doff + dbytes
    name, dt, nd, *rest = struct.unpack_from("<64sII4QQQI", raw, 64 + mb + 3 * 128)
    assert name.rstrip(b"\0") == b"bf" and dt == 1 and nd == 1 and rest[0] == 33 and rest[4] % 64 == 0
    assert raw[doff + rest[4]: doff + rest[4] + 66] == container.fp32_to_bf16_bits(bf).tobytes()
    # the CRCs as doc/formats.md defines them, with zlib alone: the tensor's over its data, the
    # header's over the header without its field, the config text, the table and the padding
    assert rest[6] == zlib.crc32(raw[doff + rest[4]: doff + rest[4] + rest[5]])
    assert struct.unpack_from("<I", raw, 48)[0] == zlib.crc32(raw[64:doff], zlib.crc32(raw[52:64], zlib.crc32(raw[:48])))
    # every reader check names the file
    with pytest.raises(container.ContainerError, match="expected a debug state"):
        container.read_container(p, container.KIND_DEBUG_STATE)
    (tmp_path / "trunc.bin").write_bytes(raw[:-1])
    with pytest.raises(container.ContainerError, match="trunc.bin: size"):
        container.read_container(tmp_path / "trunc.bin")
    (tmp_path / "magic.bin").write_bytes(b"X" + raw[1:])
    with pytest.raises(container.ContainerError, match="magic.bin: bad magic"):
        container.read_container(tmp_path / "magic.bin")


def test_checkpoint_round_trip_and_resume(tmp_path):
    cfg = micro(ffn="swiglu", d_ff=12, sandwich=True, norm="rms")
    oc = optim.OptConfig(optimizer="muon", lr=0.02, lr_other=0.01, schedule="cosine")
    x, y = batch_with_docs(cfg, 2)

    def fresh():
        m = san.SAN(cfg).init_weights(11)
        return m, optim.Optimizer(m, oc)

    m1, o1 = fresh()
    r1 = training.train_steps(m1, o1, x, y, 3, 8)
    container.save_checkpoint(tmp_path / "ck.bin", m1, o1.step_count, o1)
    m2, step, meta, tensors = san.load_checkpoint(tmp_path / "ck.bin")
    assert step == 3 and m2.cfg == cfg
    for (n, a), (_, b) in zip(m1.ordered_parameters(), m2.ordered_parameters()):
        assert torch.equal(a, b), n
    o2 = optim.Optimizer(m2, optim.OptConfig.from_meta(meta))
    o2.load_state_tensors(tensors, step, "ck.bin")
    for k, v in o1.state_tensors().items():
        assert torch.equal(v, o2.state_tensors()[k]), k
    ra = training.train_steps(m1, o1, x, y, 3, 8)
    rb = training.train_steps(m2, o2, x, y, 3, 8)
    assert ra == rb                                   # bit-exact continuation
    assert ra["loss"][-1] < r1["loss"][0]
    # a file whose parameter has the wrong shape is rejected with its name
    _, meta, tensors = container.read_container(tmp_path / "ck.bin")
    bad = [(n, a if n != "final_norm.weight" else a[:-1], "fp32") for n, a in tensors.items()]
    container.write_container(tmp_path / "bad.bin", container.KIND_CHECKPOINT, list(meta.items()), bad)
    with pytest.raises(container.ContainerError, match="final_norm.weight"):
        san.load_checkpoint(tmp_path / "bad.bin")


def test_debug_state_contents(tmp_path):
    cfg = micro(ffn="swiglu", d_ff=12)
    oc = optim.OptConfig(optimizer="muon", muon_order="paper", lr=0.02, lr_other=0.005)
    path = tmp_path / "d.bin"
    training.write_debug_state(path, san.SAN(cfg).init_weights(5), oc, optim.Optimizer, seed=5, batch_size=3,
                               n_steps=10)
    kind, meta, t = container.read_container(path, container.KIND_DEBUG_STATE)
    cfg2 = san.SANConfig.from_meta(meta)
    assert cfg2 == cfg and optim.OptConfig.from_meta(meta) == oc
    assert meta["debug.steps"] == "10" and meta["debug.precision"] == "fp64"
    spec = [n for n, _ in san.parameter_spec(cfg)]
    names = list(t)
    assert names[: len(spec)] == spec
    assert [n[5:] for n in names if n.startswith("grad.")] == spec
    assert [n[6:] for n in names if n.startswith("final.")] == spec
    # recompute everything independently from the stored parameters and batch
    model = san.SAN(cfg2)
    container.load_params_into(model, t, str(path))
    model.double()
    x = torch.from_numpy(t["batch.inputs"]).long()
    y = torch.from_numpy(t["batch.targets"]).long()
    assert x.shape == (3, cfg.seq_len) and torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(torch.from_numpy(t["batch.doc_ids"]).long(), ops.document_ids(x, cfg.bos_id))
    assert torch.equal(torch.from_numpy(t["batch.loss_mask"]).bool(), y != cfg.bos_id)
    logits, (loss, ce, lse_sq) = model(x, y)
    loss.backward()
    assert t["logits"].shape == (3, cfg.seq_len, cfg.padded_vocab_size)
    np.testing.assert_array_equal(t["logits"], logits.float().detach().numpy())
    assert t["loss"][0] == np.float32(loss.item()) == t["traj.loss"][0]
    assert t["loss.ce"][0] + cfg.z_loss * t["loss.lse_sq"][0] == pytest.approx(t["loss"][0], rel=1e-6)
    for n, p in model.ordered_parameters():
        np.testing.assert_array_equal(t["grad." + n], p.grad.float().numpy(), err_msg=n)
    assert len(t["traj.loss"]) == 10 and t["traj.loss"][-1] < t["traj.loss"][0]
    lrs = [oc.lr * optim.lr_multiplier(s, 10, "wsd") for s in range(10)]
    np.testing.assert_allclose(t["traj.lr_matrix"], lrs, rtol=1e-6)


def test_cli_writes_debug_state(tmp_path, capsys):
    out = tmp_path / "cli.bin"
    r = subprocess.run([sys.executable, str(ROOT / "train_san.py"), "--preset", "tiny", "--n-layer", "1",
                        "--residual", "rezero", "--optimizer", "adamw", "--debug-steps", "3",
                        "--write-debug-state", str(out)], capture_output=True, text=True, cwd=tmp_path,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr
    _, meta, t = container.read_container(out, container.KIND_DEBUG_STATE)
    assert meta["residual"] == "rezero" and meta["n_layer"] == "1" and meta["opt.optimizer"] == "adamw"
    assert meta["opt.lr"] == repr(6e-4) and len(t["traj.loss"]) == 3
    assert ts.main(["--n-head", "3"]) == 1
    assert "n_embd (64) must be divisible by n_head (3)" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------
# ZCN vs RMSNorm: optimizer-equivalent when gains get no weight decay

@pytest.mark.parametrize("optimizer", ["muon", "adamw"])
def test_zcn_rms_same_trajectory(optimizer):
    cfg = san.SANConfig(**dict(san.PRESETS["tiny-ffn"], n_layer=2, sandwich=True))
    x, y = data.debug_batch(cfg, 2, seed=0)
    oc = optim.OptConfig(optimizer=optimizer, lr=0.02 if optimizer == "muon" else 3e-3, lr_other=3e-3,
                      weight_decay=0.1)
    runs = {}
    for norm in ("zcn", "rms"):
        m = san.SAN(replace(cfg, norm=norm)).init_weights(0)
        runs[norm] = (m, training.train_steps(m, optim.Optimizer(m, oc), x, y, 10, 10))
    lz, lr_ = runs["zcn"][1]["loss"], runs["rms"][1]["loss"]
    np.testing.assert_allclose(lz, lr_, rtol=2e-5)
    assert lz[-1] < lz[0] - 0.05                     # it did train
    for (n, a), (_, b) in zip(runs["zcn"][0].ordered_parameters(), runs["rms"][0].ordered_parameters()):
        if a.ndim == 1 and n.endswith(".weight"):
            a = a + 1                                 # effective ZCN gain is 1 + g
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5, msg=n)


# ------------------------------------------------------------------------------------------
# token shards and the training CLI

def write_shard(path, tokens, version=1):
    header = np.zeros(256, dtype="<i4")
    header[:3] = (20240520, version, len(tokens))
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype="<u2" if version == 1 else "<u4").tobytes())


def test_shard_reader(tmp_path):
    toks = np.arange(1000) % 250
    write_shard(tmp_path / "a_000.bin", toks, 1)
    write_shard(tmp_path / "a_001.bin", toks + 70000, 2)
    assert np.array_equal(data.read_shard(tmp_path / "a_000.bin"), toks)
    assert np.array_equal(data.read_shard(tmp_path / "a_001.bin"), toks + 70000)
    loader = data.ShardLoader(str(tmp_path / "a_000.bin"), 2, 10, 250)
    x, y = loader.next_batch()
    assert x.tolist() == [list(range(10)), list(range(10, 20))] and torch.equal(y, x + 1)
    bad = bytearray((tmp_path / "a_000.bin").read_bytes())
    bad[0] = 0
    (tmp_path / "bad.bin").write_bytes(bytes(bad))
    with pytest.raises(ValueError, match="bad.bin: bad magic"):
        data.read_shard(tmp_path / "bad.bin")
    (tmp_path / "short.bin").write_bytes((tmp_path / "a_000.bin").read_bytes()[:-2])
    with pytest.raises(ValueError, match="short.bin: size"):
        data.read_shard(tmp_path / "short.bin")
    with pytest.raises(ValueError, match="token id"):
        data.ShardLoader(str(tmp_path / "a_001.bin"), 2, 10, 250).next_batch()


def test_cli_train_save_load(tmp_path, capsys):
    # a learnable stream: documents "BOS 10 11 ... 10+k" of varying length
    rng = np.random.default_rng(0)
    toks = []
    while len(toks) < 40000:
        toks += [2] + list(range(10, 10 + int(rng.integers(5, 30))))
    write_shard(tmp_path / "tr_000.bin", toks[:30000])
    write_shard(tmp_path / "va_000.bin", toks[30000:])
    ck = tmp_path / "m.bin"
    common = ["--preset", "tiny", "--n-layer", "1", "--max-seq-len", "32", "--batch-size", "4", "--device", "cpu"]
    assert ts.main(common + ["--train-data", str(tmp_path / "tr_*.bin"), "--val-data", str(tmp_path / "va_*.bin"),
                             "--steps", "30", "--val-every", "30", "--lr-other", "0.01",
                             "--save-checkpoint", str(ck)]) == 0
    out = capsys.readouterr().out
    vals = [float(l.split("val loss")[1]) for l in out.splitlines() if "val loss" in l]
    assert len(vals) == 2 and vals[1] < vals[0] - 0.5, out
    assert ts.main(["--load-checkpoint", str(ck), "--val-data", str(tmp_path / "va_*.bin"),
                    "--batch-size", "4", "--device", "cpu", "--sample-tokens", "5"]) == 0
    out2 = capsys.readouterr().out
    assert f"val loss {vals[1]:.4f}" in out2 and "sample (token ids): 2 " in out2
    assert ts.main(["--load-checkpoint", str(ck), "--n-layer", "2"]) == 1
    assert "cannot be combined with --load-checkpoint" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu():
    cfg = micro(ffn="swiglu", d_ff=12, n_head=4, n_kv_head=2, n_embd=16)
    model = san.SAN(cfg).init_weights(2)
    randomize_gains(model)
    x, y = batch_with_docs(cfg, 2)
    l_cpu, (loss_cpu, _, _) = model(x, y)
    gpu = san.SAN(cfg).cuda()
    gpu.load_state_dict(model.state_dict())
    torch.backends.cuda.matmul.allow_tf32 = False
    l_gpu, (loss_gpu, _, _) = gpu(x.cuda(), y.cuda())
    torch.testing.assert_close(l_gpu.cpu(), l_cpu, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(loss_gpu.cpu(), loss_cpu, rtol=1e-5, atol=1e-6)
