"""Tests of the export to Hugging Face transformers (attnref/export_hf.py), the import back
(attnref/import_hf.py), the exported tokenizer (attnref/hf_tokenizer.py) and lm-eval on an
exported model (dev/eval/). Offline: nothing is downloaded (HF_HUB_OFFLINE=1).

References are independent of the code under test: logits come from the PyTorch references
(train_san.py, train_gpt2.py), tokens from SentencePiece itself, eval scores from
dev/eval/reference_eval.py on the .bin items. Cost: 17 s on 2 idle cores (30 s when they are
busy): importing transformers (4 s), the whole KJV through both tokenizers (3 s), lm-eval on
two 12-item sets (3 s, its built-in task index skipped); the models are the tiny presets."""

import filecmp
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from attnref import container, export_hf, gpt2, import_hf, optim, san

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[2]

transformers = pytest.importorskip("transformers")
torch.set_num_threads(1)

LOGIT_TOL = 1e-4        # fp32, the bar; measured max |diff| <= 1.1e-6 on logits of size ~1


def quiet(*_):
    pass


# ------------------------------------------------------------------------------------------
# fixtures: a small SentencePiece model and real tokens from the offline corpus

@pytest.fixture(scope="module")
def spm_model(tmp_path_factory, kjv_chapters):
    """The paper's SentencePiece settings (attnref/tokenizer.py), small vocab, little text."""
    from synth_generator import generate
    from attnref.tokenizer import train_sentencepiece
    lines = [line for c in kjv_chapters[:150] for line in c["text"].split("\n")]
    for d in generate(600, 11):
        for f in ("query", "synthetic_reasoning", "synthetic_answer"):
            lines += [x for x in d[f].split("\n") if x]
    prefix = tmp_path_factory.mktemp("tok") / "small"
    train_sentencepiece(lines, prefix, vocab_size=700, num_threads=2)
    return str(prefix) + ".model"


@pytest.fixture(scope="module")
def sp(spm_model):
    from attnref.tokenizer import SPTokenizer
    return SPTokenizer(spm_model)


@pytest.fixture(scope="module")
def real_tokens(sp, kjv_chapters):
    """(2, 64) rows, each one document from its start: BOS + a held-out KJV chapter."""
    rows = [[sp.bos_id] + sp.encode(kjv_chapters[k]["text"])[:63] for k in (1000, 1100)]
    return torch.tensor(rows)


def randomised_san(cfg, seed=1):
    """A SAN whose gains and gates are far from their init, so every fold is exercised, and
    whose matrices are 8x their init, so that the sub-layers move the logits as much as the
    embedding does (at init they are ~1e-2 of the stream, and a wrong fold would hide under
    the logit tolerance)."""
    m = san.SAN(cfg).init_weights(seed)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for n, p in m.ordered_parameters():
            if p.ndim == 1:
                p.add_(torch.randn(p.shape, generator=g) * 0.5)
            elif n != "wte":
                p.mul_(8.0)
    return m


def san_cfg(V, **kw):
    return san.SANConfig(**dict(san.PRESETS["tiny"], vocab_size=V, **kw))


SAN_CASES = {
    "san-zcn-gated": {},
    "ffn-zcn-gated": dict(ffn="swiglu", d_ff=96),
    "san-rms-gated": dict(norm="rms"),
    "ffn-rms-standard": dict(ffn="swiglu", d_ff=64, norm="rms", residual="standard"),
    "ffn-zcn-rezero": dict(ffn="swiglu", d_ff=64, residual="rezero"),
    "san-zcn-standard-mha": dict(residual="standard", n_kv_head=4),
    "san-noqk-rezero-gqa4": dict(qk_norm=False, residual="rezero", n_kv_head=1),      # Llama
    "ffn-noqk-gated": dict(qk_norm=False, ffn="swiglu", d_ff=64),                      # Llama
    # the qwen presets' form: Llama, an unscaled embedding, plain init
    "ffn-qwen": dict(qk_norm=False, ffn="swiglu", d_ff=64, norm="rms", residual="standard", embed_scale="1",
                     out_init="plain"),
}


def export_model(model, tmp_path, spm=None, name="ckpt.bin", save=container.save_checkpoint, step=3):
    ckpt = tmp_path / name
    save(ckpt, model, step)
    out = tmp_path / (name + ".hf")
    export_hf.export(str(ckpt), str(out), spm, log=quiet)
    return ckpt, out


def load_hf(out):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    return model.eval()


# ------------------------------------------------------------------------------------------
# logits: transformers == the PyTorch reference

@pytest.mark.parametrize("case", sorted(SAN_CASES))
def test_san_logits_equal_reference(case, sp, real_tokens, tmp_path):
    cfg = san_cfg(sp.vocab_size, **SAN_CASES[case])
    ref = randomised_san(cfg)
    _, out = export_model(ref, tmp_path)
    hf = load_hf(out)
    assert type(hf).__name__ == ("Qwen3ForCausalLM" if cfg.qk_norm else "LlamaForCausalLM")
    assert hf.config.intermediate_size == (cfg.d_ff if cfg.ffn == "swiglu" else 0)
    assert hf.config.vocab_size == cfg.vocab_size            # padded rows dropped
    with torch.no_grad():
        want = ref(real_tokens)[0][..., : cfg.vocab_size]
        got = hf(real_tokens).logits
    assert got.shape == want.shape
    err = (got - want).abs().max().item()
    assert err < LOGIT_TOL, f"{case}: max |logit diff| {err}"
    assert want.abs().max().item() > 0.5                    # a model with something to compare


def test_gpt2_logits_equal_reference(sp, real_tokens, tmp_path):
    cfg = gpt2.GPT2Config(vocab_size=sp.vocab_size, seq_len=64, n_layer=2, n_embd=64, n_head=4, bos_id=sp.bos_id)
    ref = gpt2.GPT2(cfg).init_weights(5)
    g = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for n, p in ref.ordered_parameters():            # biases and LayerNorms away from 0 / 1
            if p.ndim == 1:
                p.add_(torch.randn(p.shape, generator=g) * 0.2)
    _, out = export_model(ref, tmp_path, save=container.save_checkpoint)
    hf = load_hf(out)
    assert type(hf).__name__ == "GPT2LMHeadModel"
    with torch.no_grad():
        err = (hf(real_tokens).logits - ref(real_tokens)[0][..., : cfg.vocab_size]).abs().max().item()
    assert err < LOGIT_TOL


# ------------------------------------------------------------------------------------------
# export then import: bit for bit

@pytest.mark.parametrize("case", sorted(SAN_CASES))
def test_san_round_trip_is_byte_exact(case, tmp_path):
    cfg = san_cfg(250, **SAN_CASES[case])
    ckpt, out = export_model(randomised_san(cfg, seed=2), tmp_path, step=17)
    back = tmp_path / "back.bin"
    import_hf.import_dir(str(out), str(back), log=quiet)
    assert filecmp.cmp(ckpt, back, shallow=False)


def test_gpt2_round_trip_is_byte_exact(tmp_path):
    cfg = gpt2.GPT2Config(**gpt2.PRESETS["tiny-wide"])
    ckpt, out = export_model(gpt2.GPT2(cfg).init_weights(9), tmp_path, save=container.save_checkpoint, step=4)
    back = tmp_path / "back.bin"
    import_hf.import_dir(str(out), str(back), log=quiet)
    assert filecmp.cmp(ckpt, back, shallow=False)


def test_round_trip_of_a_training_checkpoint_keeps_the_parameters(tmp_path):
    """A checkpoint with optimizer state: the model comes back exactly, the state does not."""
    cfg = san_cfg(250, ffn="swiglu", d_ff=64)
    model = randomised_san(cfg)
    opt = optim.Optimizer(model, optim.OptConfig())
    ckpt = tmp_path / "train.bin"
    container.save_checkpoint(ckpt, model, 12, opt)
    export_hf.export(str(ckpt), str(tmp_path / "hf"), log=quiet)
    import_hf.import_dir(str(tmp_path / "hf"), str(tmp_path / "back.bin"), log=quiet)
    _, meta, t = container.read_container(tmp_path / "back.bin")
    _, meta0, t0 = container.read_container(ckpt)
    assert meta["step"] == "12" and meta["has_optimizer"] == "0"
    for n, _ in san.parameter_spec(cfg):
        assert np.array_equal(t[n], t0[n]), n


def test_weights_changed_after_export_import_as_the_same_function(sp, real_tokens, tmp_path):
    """When the weights no longer match the sidecar of originals (e.g. fine-tuned in
    transformers), the import takes them as they stand: rms gains, standard residual."""
    cfg = san_cfg(sp.vocab_size, ffn="swiglu", d_ff=64)
    _, out = export_model(randomised_san(cfg), tmp_path)
    from safetensors.torch import load_file, save_file
    w = load_file(out / "model.safetensors")
    w["model.layers.1.self_attn.o_proj.weight"] *= 1.5
    save_file(w, out / "model.safetensors", metadata={"format": "pt"})
    msgs = []
    import_hf.import_dir(str(out), str(tmp_path / "back.bin"), log=msgs.append)
    assert any("differ from what the exporter wrote" in m for m in msgs)
    back = san.load_checkpoint(tmp_path / "back.bin")[0]
    assert (back.cfg.norm, back.cfg.residual) == ("rms", "standard")
    with torch.no_grad():
        err = (back(real_tokens)[0][..., : cfg.vocab_size] - load_hf(out)(real_tokens).logits).abs().max().item()
    assert err < LOGIT_TOL


def test_import_of_a_foreign_qwen3(real_tokens, sp, tmp_path):
    """A Qwen3 made by transformers itself (no export metadata), of our shapes: the import
    reads its weights by transformers' names and reproduces its logits."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    d = 48
    hc = Qwen3Config(vocab_size=sp.vocab_size, hidden_size=d, intermediate_size=80, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=64,
                     rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=sp.bos_id,
                     rope_parameters={"rope_type": "default", "rope_theta": 5000.0})
    torch.manual_seed(0)
    hf = Qwen3ForCausalLM(hc).eval()
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if n.endswith("norm.weight") or "layernorm" in n:
                p.add_(torch.randn(p.shape) * 0.3)
        hf.model.embed_tokens.weight.copy_(hf.lm_head.weight * math.sqrt(d))   # our tied, scaled form
    hf.save_pretrained(tmp_path / "q3")
    import_hf.import_dir(str(tmp_path / "q3"), str(tmp_path / "q3.bin"), log=quiet)
    ours = san.load_checkpoint(tmp_path / "q3.bin")[0]
    assert (ours.cfg.ffn, ours.cfg.d_ff, ours.cfg.norm, ours.cfg.rope_theta) == ("swiglu", 80, "rms", 5000.0)
    with torch.no_grad():
        err = (ours(real_tokens)[0][..., : sp.vocab_size] - hf(real_tokens).logits).abs().max().item()
    assert err < LOGIT_TOL
    # an untied embedding that is neither the head nor sqrt(d) x the head has no counterpart here
    with torch.no_grad():
        hf.model.embed_tokens.weight.mul_(2)
    hf.save_pretrained(tmp_path / "q3b")
    with pytest.raises(import_hf.ImportHFError, match="neither lm_head nor exactly sqrt"):
        import_hf.import_dir(str(tmp_path / "q3b"), str(tmp_path / "x.bin"), log=quiet)
    # Qwen2.5's form, a head tied to the unscaled input embedding, is --embed-scale 1
    hc.tie_word_embeddings = True
    tied = Qwen3ForCausalLM(hc).eval()
    tied.load_state_dict({k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}, strict=False)
    tied.tie_weights()
    tied.save_pretrained(tmp_path / "q3t")
    import_hf.import_dir(str(tmp_path / "q3t"), str(tmp_path / "q3t.bin"), log=quiet)
    ours = san.load_checkpoint(tmp_path / "q3t.bin")[0]
    assert ours.cfg.embed_scale == "1"
    with torch.no_grad():
        err = (ours(real_tokens)[0][..., : sp.vocab_size] - tied(real_tokens).logits).abs().max().item()
    assert err < LOGIT_TOL


@pytest.mark.skipif(not os.environ.get("TRAIN_SAN_BIN"), reason="TRAIN_SAN_BIN not set (make test sets it)")
def test_checkpoint_of_the_cuda_trainer_exports(tmp_path):
    """A checkpoint written by train_san (host backend) after 2 steps, with optimizer and
    resume state: it exports, transformers' logits equal the reference's on it, and the
    import gives back its parameters exactly."""
    import subprocess
    from attnref.shards import write_shard
    rng = np.random.default_rng(0)
    toks = []
    for _ in range(60):
        toks += [2] + list(rng.integers(3, 250, size=20))
    write_shard(tmp_path / "toy_train_000000.bin", np.array(toks, dtype=np.int64))
    proc = subprocess.run([str(ROOT / os.environ["TRAIN_SAN_BIN"]), "--preset", "tiny-ffn", "--residual", "rezero",
                           "--train-data", str(tmp_path / "toy_train_*.bin"), "--batch-size", "2", "--steps", "2",
                           "--optimizer", "adamw", "--checkpoint-dir", str(tmp_path / "ck"), "--sample-tokens", "0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    ckpt = tmp_path / "ck" / "final.bin"
    export_hf.export(str(ckpt), str(tmp_path / "hf"), log=quiet)
    ref = san.load_checkpoint(ckpt)[0].eval()
    x = torch.tensor([[2] + list(rng.integers(3, 250, size=40))])
    with torch.no_grad():
        err = (load_hf(tmp_path / "hf")(x).logits - ref(x)[0][..., :250]).abs().max().item()
    assert err < LOGIT_TOL
    import_hf.import_dir(str(tmp_path / "hf"), str(tmp_path / "back.bin"), log=quiet)
    _, _, back = container.read_container(tmp_path / "back.bin")
    _, _, orig = container.read_container(ckpt)
    for n, _ in san.parameter_spec(ref.cfg):
        assert np.array_equal(back[n], orig[n]), n


# ------------------------------------------------------------------------------------------
# what transformers cannot express is refused

@pytest.mark.parametrize("kw, message", [
    (dict(sandwich=True), "sandwich=1"),
    (dict(residual="none"), "residual=none"),
])
def test_inexpressible_configs_are_refused(kw, message, tmp_path, capsys):
    ckpt = tmp_path / "c.bin"
    container.save_checkpoint(ckpt, san.SAN(san_cfg(250, ffn="swiglu", d_ff=64, **kw)).init_weights(0))
    assert export_hf.main([str(ckpt), str(tmp_path / "hf")]) == 1
    err = capsys.readouterr().err
    assert message in err and str(ckpt) in err
    assert not (tmp_path / "hf").exists()


def test_unknown_config_keys_are_refused(tmp_path):
    cfg = san_cfg(250)
    model = san.SAN(cfg).init_weights(0)
    meta = cfg.to_meta() + [("rotary_scaling", "2"), ("step", "0"), ("has_optimizer", "0")]
    container.write_container(tmp_path / "c.bin", container.KIND_CHECKPOINT, meta, container.param_tensors(model))
    with pytest.raises(export_hf.ExportError, match="config keys rotary_scaling are unknown"):
        export_hf.export(str(tmp_path / "c.bin"), str(tmp_path / "hf"), log=quiet)


def test_attention_variants_are_refused(tmp_path):
    """A model with a non-standard attention kind (doc/deconstructing.md) has no transformers
    counterpart; the keys of an all-standard model are fine (every SAN checkpoint has them)."""
    cfg = san_cfg(250)
    model = san.SAN(cfg).init_weights(0)
    meta = dict(cfg.to_meta())
    meta.update(attention="mlp", layout="uniform", taylor_norm="joint", layer_attention="mlp,mlp", step="0",
                has_optimizer="0")
    container.write_container(tmp_path / "c.bin", container.KIND_CHECKPOINT, list(meta.items()),
                              container.param_tensors(model))
    with pytest.raises(export_hf.ExportError, match="attention=mlp .* cannot be exported"):
        export_hf.export(str(tmp_path / "c.bin"), str(tmp_path / "hf"), log=quiet)


def test_import_refuses_what_it_cannot_read(tmp_path, capsys):
    assert import_hf.main([str(tmp_path), str(tmp_path / "x.bin")]) == 1
    assert "cannot read config.json" in capsys.readouterr().err
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mistral"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(import_hf.ImportHFError, match="model_type 'mistral'"):
        import_hf.import_dir(str(tmp_path), str(tmp_path / "x.bin"), log=quiet)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    with pytest.raises(import_hf.ImportHFError, match="model.safetensors: not a readable safetensors file"):
        import_hf.import_dir(str(tmp_path), str(tmp_path / "x.bin"), log=quiet)


def test_tokenizer_must_fit_the_model(spm_model, tmp_path):
    ckpt = tmp_path / "c.bin"
    container.save_checkpoint(ckpt, san.SAN(san_cfg(250)).init_weights(0))
    with pytest.raises(export_hf.ExportError, match="700 pieces, but .* vocab_size 250"):
        export_hf.export(str(ckpt), str(tmp_path / "hf"), spm_model, log=quiet)


def test_the_trainers_tokenizer_bin_stands_for_its_model_or_is_refused_in_one_line(spm_model, sp, tmp_path, capsys):
    """--tokenizer X.bin (the file every trainer's --tokenizer takes) exports the X.model beside it
    when the .bin was made from it, and is otherwise refused in one line naming the .model to
    pass; so is a file that is no SentencePiece model (SentencePiece's own error is a page)."""
    import shutil
    from attnref.tokenizer import SPTokenizer, export_tokenizer_bin
    ckpt = tmp_path / "c.bin"
    container.save_checkpoint(ckpt, san.SAN(san_cfg(sp.vocab_size)).init_weights(0))
    shutil.copy(spm_model, tmp_path / "tok.model")
    export_tokenizer_bin(SPTokenizer(spm_model), tmp_path / "tok.bin")
    said = []
    export_hf.export(str(ckpt), str(tmp_path / "by_bin"), str(tmp_path / "tok.bin"), log=said.append)
    assert any(f"exporting its SentencePiece model {tmp_path / 'tok.model'}" in line for line in said), said
    export_hf.export(str(ckpt), str(tmp_path / "by_model"), spm_model, log=quiet)
    assert filecmp.cmp(tmp_path / "by_bin" / "tokenizer.json", tmp_path / "by_model" / "tokenizer.json", shallow=False)
    (tmp_path / "tok.model").unlink()
    for bad, fix in ((tmp_path / "tok.bin", f"pass the SentencePiece .model it was exported from (e.g. {tmp_path / 'tok.model'}"),
                     (ckpt, f"--tokenizer {ckpt} is not a SentencePiece model")):
        assert export_hf.main([str(ckpt), str(tmp_path / "hf"), "--tokenizer", str(bad)]) == 1
        err = capsys.readouterr().err
        assert fix in err and len(err.splitlines()) == 1, err


def test_an_export_is_readable_and_a_replaced_one_is_named(tmp_path):
    """Every file of an export has the umask's mode (safetensors writes 0600: another user could
    not load the model), and exporting into an earlier export says it replaces it."""
    ckpt = tmp_path / "c.bin"
    container.save_checkpoint(ckpt, san.SAN(san_cfg(250)).init_weights(0))
    mask = os.umask(0o022)
    try:
        said = []
        export_hf.export(str(ckpt), str(tmp_path / "hf"), log=said.append)
        assert not any("replaced" in line for line in said), said
        modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "hf").iterdir()}
        assert "model.safetensors" in modes and set(modes.values()) == {0o644}, modes
        export_hf.export(str(ckpt), str(tmp_path / "hf"), log=said.append)
        assert f"note: {tmp_path / 'hf'} holds an export already: its files are replaced" in said, said
    finally:
        os.umask(mask)


# ------------------------------------------------------------------------------------------
# tokenizer: AutoTokenizer == SentencePiece, token for token

@pytest.fixture(scope="module")
def hf_tok(spm_model, tmp_path_factory):
    from attnref.hf_tokenizer import sentencepiece_to_hf
    d = tmp_path_factory.mktemp("hftok")
    sentencepiece_to_hf(spm_model, 64).save_pretrained(d)
    return transformers.AutoTokenizer.from_pretrained(str(d))


ODD_TEXTS = ["  two leading spaces and trailing  ", "tabs\there\n\nblank lines\n", "naïve café – ☕ 日本語 🙂",
             "\n", " ", "", "x<|im_start|>y<think>z</think><|im_end|>", "<|im_start|", "a\r\nb",
             "<s> and </s>, <pad>, <unk> are text", "\u2581 already a marker", "   \n  \t "]


def test_tokenizer_round_trip_on_the_offline_corpus(sp, hf_tok, kjv_chapters):
    from synth_generator import generate
    texts = [c["text"] for c in kjv_chapters]
    texts += [d[f] for d in generate(300, 5) for f in ("query", "synthetic_reasoning", "synthetic_answer")]
    texts += ODD_TEXTS
    want = sp.encode_batch(texts)
    assert hf_tok(texts, add_special_tokens=False).input_ids == want
    assert hf_tok(texts[-len(ODD_TEXTS):]).input_ids == [[sp.bos_id] + w for w in want[-len(ODD_TEXTS):]]
    docs = [[sp.bos_id] + w + [sp.eos_id] for w in want]
    decoded = hf_tok.batch_decode(docs, skip_special_tokens=True)
    assert decoded == [sp.decode(d) for d in docs]
    # SentencePiece is lossless here except for a literal "\u2581", which it decodes as a space
    assert all(a == t for a, t in zip(decoded, texts) if "\u2581" not in t)
    assert sum(map(len, want)) > 500_000                              # the whole KJV went through


def test_tokenizer_specials(sp, hf_tok):
    assert (hf_tok.bos_token_id, hf_tok.eos_token_id, hf_tok.pad_token_id, hf_tok.unk_token_id) == \
        (sp.bos_id, sp.eos_id, sp.pad_id, sp.unk_id)
    for i, marker in enumerate(["<|im_start|>", "<|im_end|>", "<think>", "</think>"]):
        assert hf_tok.encode(marker, add_special_tokens=False) == sp.encode(marker) == [4 + i]
        assert hf_tok.decode([4 + i], skip_special_tokens=True) == marker       # kept, as SentencePiece does
    assert hf_tok.decode([sp.bos_id, sp.eos_id, sp.pad_id], skip_special_tokens=True) == ""
    assert len(hf_tok) == sp.vocab_size


def test_export_writes_a_working_tokenizer_and_generate_runs(sp, spm_model, tmp_path):
    cfg = san_cfg(sp.vocab_size)
    _, out = export_model(randomised_san(cfg), tmp_path, spm_model)
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    model = load_hf(out)
    assert model.generation_config.eos_token_id == sp.eos_id
    prompt = tok("In the beginning", return_tensors="pt")
    gen = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    # greedy continuation = argmax of the reference's logits, token by token
    ref = randomised_san(cfg)
    toks = prompt.input_ids[0].tolist()
    with torch.no_grad():
        for _ in range(8):
            toks.append(int(ref(torch.tensor([toks]))[0][0, -1, : cfg.vocab_size].argmax()))
            if toks[-1] == sp.eos_id:
                break
    assert gen[0].tolist() == toks


# ------------------------------------------------------------------------------------------
# lm-eval on the exported model == our evaluator on the same items

@pytest.fixture(scope="module")
def trained_san(sp, kjv_chapters, tmp_path_factory):
    """A tiny SAN trained briefly on KJV, so the scores are not those of a uniform model."""
    import kjv
    train, _ = kjv.split(kjv_chapters)
    ids = []
    for c in train[:60]:
        ids += [sp.bos_id] + sp.encode(c["text"]) + [sp.eos_id]
    data = torch.tensor(ids)
    cfg = san_cfg(sp.vocab_size, seq_len=128)
    model = san.SAN(cfg).init_weights(0)
    opt = optim.Optimizer(model, optim.OptConfig(optimizer="adamw", lr=3e-3, lr_other=3e-3))
    g = torch.Generator().manual_seed(0)
    B, T = 8, 64
    for _ in range(120):
        starts = torch.randint(0, len(data) - T - 1, (B,), generator=g)
        x = torch.stack([data[s:s + T] for s in starts])
        y = torch.stack([data[s + 1:s + T + 1] for s in starts])
        model.zero_grad(set_to_none=True)
        model(x, y)[1][0].backward()
        opt.step(3e-3, 3e-3)
    path = tmp_path_factory.mktemp("trained") / "san.bin"
    container.save_checkpoint(path, model, 120)
    return path


@pytest.fixture(scope="module")
def sanity_sets(sp, kjv_chapters, tmp_path_factory):
    """The KJV sanity sets of dev/data/sanity_evals.py, a few items each."""
    import kjv
    from attnref.evalset import KIND_CLOZE, KIND_MC, write_evalset
    from sanity_evals import kjv_items
    _, val = kjv.split(kjv_chapters)
    cloze, mc = kjv_items(sp, val, 12, 3)
    d = tmp_path_factory.mktemp("eval")
    write_evalset(d / "mc.bin", mc, KIND_MC, sp.vocab_size, "SANITY SET (not a benchmark): test mc")
    write_evalset(d / "cloze.bin", cloze, KIND_CLOZE, sp.vocab_size, "SANITY SET (not a benchmark): test cloze")
    return {"attn_sanity_mc": d / "mc.bin", "attn_sanity_cloze": d / "cloze.bin"}


def test_lm_eval_equals_reference_evaluation(trained_san, sanity_sets, spm_model, tmp_path):
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager
    from attnref.evalset import read_evalset
    import reference_eval
    out = tmp_path / "hf"
    export_hf.export(str(trained_san), str(out), spm_model, log=quiet)
    ref, V, T = reference_eval.load_reference(str(trained_san))
    lm = None
    for task, path in sorted(sanity_sets.items()):
        want = reference_eval.score_evalset(ref, V, T, read_evalset(path))
        tm = TaskManager(include_path=str(ROOT / "dev" / "eval"),
                         metadata={"evalset": str(path), "tokenizer": spm_model}, include_defaults=False)
        if lm is None:   # one model for both tasks
            from lm_eval.models.huggingface import HFLM
            lm = HFLM(pretrained=str(out), dtype="float32", add_bos_token=True, batch_size=4, device="cpu")
        res = lm_eval.simple_evaluate(model=lm, tasks=[task], task_manager=tm, log_samples=True)
        got = res["results"][task]
        samples = sorted(res["samples"][task], key=lambda s: s["doc_id"])
        assert len(samples) == want["n"] == 12
        for s, ours in zip(samples, want["items"]):
            theirs = [r[0] for r in s["resps"]]
            for (ll, greedy), (ll2, greedy2) in zip(ours, theirs):
                assert abs(ll - ll2) < 1e-4 * max(1.0, abs(ll)), (task, s["doc_id"], ll, ll2)
                assert greedy == greedy2
        assert got["acc,none"] == want["acc"]
        if task == "attn_sanity_mc":
            assert got["acc_norm,none"] == want["acc_norm"]
            assert 0 < want["acc"] < 1 or 0 < want["acc_norm"] < 1     # not a degenerate set
        else:
            assert got["perplexity,none"] == pytest.approx(want["perplexity"], rel=1e-4)
