"""Tests of the PyTorch reference train_gpt2.py: the model against an independent
formulation, the init rules, the checkpoint container round trip, llm.c model files, and
the Hugging Face weight mapping (on a safetensors file written here, since the tests have
no network). Run: .venv/bin/python -m pytest dev/test/test_train_gpt2_py.py"""

import json
import math
import struct

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnref import container, gpt2, gpt2_files, optim, san


torch.set_num_threads(1)

MICRO = dict(vocab_size=20, seq_len=8, n_layer=2, n_embd=8, n_head=2, bos_id=2)   # V pads to 128


def independent_logits(model, idx):
    """GPT-2 written out with torch's own layer_norm, linear and scaled_dot_product_attention."""
    cfg, P = model.cfg, dict(model.named_parameters())
    B, T = idx.shape
    h = P["wte"][idx] + P["wpe"][:T]
    for i in range(cfg.n_layer):
        p = lambda n: P[f"layers.{i}.{n}"]  # noqa: E731
        u = F.layer_norm(h, (cfg.n_embd,), p("ln_1.weight"), p("ln_1.bias"), 1e-5)
        q, k, v = (t.view(B, T, cfg.n_head, -1).transpose(1, 2)
                   for t in F.linear(u, p("attn.c_attn.weight"), p("attn.c_attn.bias")).chunk(3, -1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, -1)
        h = h + F.linear(y, p("attn.c_proj.weight"), p("attn.c_proj.bias"))
        u = F.layer_norm(h, (cfg.n_embd,), p("ln_2.weight"), p("ln_2.bias"), 1e-5)
        g = F.gelu(F.linear(u, p("mlp.c_fc.weight"), p("mlp.c_fc.bias")), approximate="tanh")
        h = h + F.linear(g, p("mlp.c_proj.weight"), p("mlp.c_proj.bias"))
    return F.layer_norm(h, (cfg.n_embd,), P["ln_f.weight"], P["ln_f.bias"], 1e-5) @ P["wte"].t()


def randomised(cfg, seed=0):
    """A model whose biases and LayerNorm parameters are not at their init values, so that
    every parameter matters in the comparisons."""
    m = gpt2.GPT2(cfg).init_weights(seed)
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for n, p in m.ordered_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    return m


def test_forward_matches_independent_formulation():
    cfg = gpt2.GPT2Config(**MICRO)
    m = randomised(cfg).double()
    idx = torch.randint(0, cfg.vocab_size, (3, cfg.seq_len), generator=torch.Generator().manual_seed(1))
    logits, _ = m(idx)
    assert torch.allclose(logits, independent_logits(m, idx), atol=1e-12, rtol=0)


def test_loss_is_cross_entropy_over_the_real_vocabulary():
    cfg = gpt2.GPT2Config(**MICRO)
    m = randomised(cfg).double()
    x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=torch.Generator().manual_seed(2))
    y = x.roll(-1, 1)
    y[0, 3] = -1                                           # ignored target
    logits, (loss, ce, _) = m(x, y)
    ref = F.cross_entropy(logits[..., :cfg.vocab_size].reshape(-1, cfg.vocab_size), y.reshape(-1), ignore_index=-1)
    assert abs(loss.item() - ref.item()) < 1e-12 and loss.item() == ce.item()


def test_init_rules():
    cfg = gpt2.GPT2Config(vocab_size=300, seq_len=64, n_layer=4, n_embd=64, n_head=4, bos_id=0)
    m = gpt2.GPT2(cfg).init_weights(3)
    p = dict(m.ordered_parameters())
    assert torch.all(p["wte"][300:] == 0) and p["wte"].shape == (384, 64)
    assert abs(p["wte"][:300].std().item() - 0.02) < 0.002 and abs(p["wpe"].std().item() - 0.02) < 0.002
    assert abs(p["layers.0.mlp.c_fc.weight"].std().item() - 0.02) < 0.002
    assert abs(p["layers.1.attn.c_proj.weight"].std().item() - 0.02 / math.sqrt(8)) < 0.001
    assert abs(p["layers.2.mlp.c_proj.weight"].std().item() - 0.02 / math.sqrt(8)) < 0.001
    assert torch.all(p["layers.3.ln_2.weight"] == 1) and torch.all(p["ln_f.bias"] == 0)
    assert torch.all(p["layers.0.attn.c_attn.bias"] == 0)
    decayed = {n for n, q in m.ordered_parameters() if gpt2.is_matrix_param(n, tuple(q.shape))}
    assert decayed == {f"layers.{i}.{k}.weight" for i in range(4)
                       for k in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")}


def test_parameter_count_of_gpt2_124m():
    # 124M with the vocabulary padded to 50304 (what llm.c reports for gpt2_124M.bin)
    total, nonemb = gpt2.count_parameters(gpt2.GPT2Config(**gpt2.PRESETS["gpt2"]))
    d, L = 768, 12
    assert total == 50304 * d + 1024 * d + L * (12 * d * d + 13 * d) + 2 * d == 124475904
    assert nonemb == total - (50304 + 1024) * d


def test_checkpoint_round_trip(tmp_path):
    cfg = gpt2.GPT2Config(**MICRO)
    m = randomised(cfg)
    opt = gpt2.make_optimizer(m, optim.OptConfig(optimizer="adamw", lr=1e-3, lr_other=1e-3))
    x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    _, (loss, _, _) = m(x, x)
    loss.backward()
    opt.step(1e-3, 1e-3)
    container.save_checkpoint(tmp_path / "c.bin", m, 1, opt)
    m2, step, meta, tensors = gpt2.load_checkpoint(tmp_path / "c.bin")
    assert step == 1 and meta["model"] == "gpt2" and meta["has_optimizer"] == "1"
    for (n, a), (_, b) in zip(m.ordered_parameters(), m2.ordered_parameters()):
        assert torch.equal(a, b), n
    assert all(f"opt.m.{n}" in tensors and f"opt.v.{n}" in tensors for n, _ in m.ordered_parameters())


def test_san_checkpoint_is_rejected(tmp_path):
    container.save_checkpoint(tmp_path / "san.bin", san.SAN(san.SANConfig(**san.PRESETS["tiny"])).init_weights(0))
    with pytest.raises(ValueError, match="not a GPT-2 file"):
        gpt2.load_checkpoint(tmp_path / "san.bin")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_llmc_file_round_trip_and_layout(tmp_path, dtype):
    cfg = gpt2.GPT2Config(**MICRO)
    m = randomised(cfg)
    path = tmp_path / "m.llmc"
    gpt2_files.write_llmc(path, m, dtype)
    header = np.fromfile(path, dtype="<i4", count=256)
    assert list(header[:8]) == [20240326, 3 if dtype == "fp32" else 5, 8, 20, 2, 2, 8, 128] and not header[8:].any()
    # layout: kinds stacked over layers; check one tensor at its computed offset
    d, L, item = 8, 2, 4 if dtype == "fp32" else 2
    offset = 1024 + (128 * d + 8 * d + L * d + L * d) * item      # after wte, wpe, ln_1.weight, ln_1.bias
    raw = np.fromfile(path, dtype="<f4" if item == 4 else "<u2", count=L * 3 * d * d, offset=offset)
    want = torch.stack([dict(m.ordered_parameters())[f"layers.{i}.attn.c_attn.weight"] for i in range(L)])
    got = raw if item == 4 else container.bf16_bits_to_fp32(raw)
    want = want.detach().numpy().ravel()
    if item == 2:
        want = container.bf16_bits_to_fp32(container.fp32_to_bf16_bits(want))
    assert np.array_equal(got, want)
    cfg2, tensors = gpt2_files.read_llmc(path, bos_id=2)
    assert cfg2 == cfg
    for n, p in m.ordered_parameters():
        a = p.detach().numpy()
        if dtype == "bf16":
            a = container.bf16_bits_to_fp32(container.fp32_to_bf16_bits(a))
        assert np.array_equal(tensors[n], a), n


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, a in tensors.items():
        data = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_hugging_face_mapping(tmp_path, monkeypatch):
    """A safetensors file in Hugging Face's GPT-2 layout (Conv1D weights (in, out), unpadded
    wte, h.<i>. names, mask buffers) loads into the model it was made from."""
    cfg = gpt2.GPT2Config(vocab_size=50257, seq_len=16, n_layer=2, n_embd=8, n_head=2, bos_id=50256)
    m = randomised(cfg)
    hf = {"wte.weight": m.wte.detach().numpy()[:50257], "wpe.weight": m.wpe.detach().numpy()}
    for n, p in m.ordered_parameters():
        if n.startswith("layers."):
            a = p.detach().numpy()
            hf[n.replace("layers.", "h.", 1)] = a.T if n.endswith(gpt2_files.HF_TRANSPOSED) else a
    for i in range(cfg.n_layer):
        hf[f"h.{i}.attn.bias"] = np.ones((1, 1, 16, 16), np.float32)   # old exports carry the mask
    hf["ln_f.weight"], hf["ln_f.bias"] = m.ln_f.weight.detach().numpy(), m.ln_f.bias.detach().numpy()
    write_safetensors(tmp_path / "model.safetensors", hf)
    loaded = gpt2_files.read_safetensors(tmp_path / "model.safetensors")
    monkeypatch.setattr(gpt2_files, "load_hf_weights", lambda name: loaded)
    monkeypatch.setitem(gpt2.PRESETS, "gpt2", dict(vocab_size=50257, seq_len=16, n_layer=2, n_embd=8, n_head=2,
                                                 bos_id=50256))
    m2 = gpt2_files.gpt2_from_hf("gpt2")
    for (n, a), (_, b) in zip(m.ordered_parameters(), m2.ordered_parameters()):
        assert torch.equal(a, b), n


def test_schedule_horizon_and_embedding_decay_reach_the_optimizer():
    """--schedule-steps and --decay-embedding (as train_gpt2.cu takes them through the shared options)
    reach the reference's optimizer config; left out they keep the defaults."""
    import train_gpt2
    p = train_gpt2.build_parser()
    oc = train_gpt2.opt_from_args(p.parse_args(["--schedule-steps", "7", "--decay-embedding", "1"]))
    assert (oc.schedule_steps, oc.decay_embedding) == (7, 1)
    oc = train_gpt2.opt_from_args(p.parse_args([]))
    assert (oc.schedule_steps, oc.decay_embedding) == (0, 0)
