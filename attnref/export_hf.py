"""
export_hf.py -- a checkpoint of ours as a Hugging Face transformers directory (config.json,
model.safetensors, optionally the tokenizer) that transformers, lm-eval and vLLM load offline.
SAN and FFN arms become Qwen3 decoders (Llama without QK-norm) by exact folding, GPT-2 a
GPT2LMHeadModel; what they cannot express is refused. The mapping, the folding and why
import_hf gets the checkpoint back bit for bit: doc/export.md.

  python -m attnref.export_hf CKPT OUTDIR [--tokenizer data/offline/tokenizer.model]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import fields

import zlib

import numpy as np
import torch

from attnref import container, gpt2, gpt2_files, san
from attnref.tokenizer import TOKENIZER_MAGIC, SPTokenizer, tokenizer_fingerprint

META_KEY = "attn_c"                                   # our config text inside config.json
UNFOLDED_FILE = "attn_c_unfolded.safetensors"         # originals of the tensors folding changed
FORMAT_VERSION = 1
DERIVED_KEYS = {"padded_vocab_size", "head_dim", "step", "has_optimizer", "model"}
# the attention kinds of doc/deconstructing.md: exportable when every layer is standard
VARIANT_KEYS = {"attention", "layout", "taylor_norm", "layer_attention"}
IGNORED_PREFIXES = ("opt.", "run.", "resume.", "debug.")  # training settings and state: not part of the model


class ExportError(ValueError):
    pass


# -----------------------------------------------------------------------------------------
# Reading our checkpoint

def read_checkpoint(path):
    """(kind 'san'|'gpt2', config, meta, {name: fp32 tensor}) of a model checkpoint. Refuses
    config keys it does not know: they may change the model (e.g. attention kinds), and an
    export that silently dropped them would not be the model that was trained."""
    _, meta, tensors = container.read_container(path, container.KIND_CHECKPOINT)
    if meta.get("model") == "gpt2":
        kind, cfg = "gpt2", gpt2.GPT2Config.from_meta(meta, str(path))
        spec = gpt2.parameter_spec(cfg)
    else:
        kind, cfg = "san", san.SANConfig.from_meta(meta, str(path))
        spec = san.parameter_spec(cfg)
    if meta.get("attention", "standard") != "standard":
        raise ExportError(f"{path}: attention={meta['attention']} (layers {meta.get('layer_attention', '?')}) cannot "
                          f"be exported: transformers' decoders have standard attention in every layer")
    known = {f.name for f in fields(cfg)} | DERIVED_KEYS | VARIANT_KEYS
    unknown = sorted(k for k in meta if k not in known and not k.startswith(IGNORED_PREFIXES) and k != "seed")
    if unknown:
        raise ExportError(f"{path}: config keys {', '.join(unknown)} are unknown to this exporter; they may "
                          f"change the model (e.g. non-standard attention kinds), which transformers' "
                          f"{'GPT-2' if kind == 'gpt2' else 'Qwen3/Llama'} decoder cannot express")
    params = {}
    for name, shape in spec:
        if name not in tensors:
            raise ExportError(f"{path}: parameter '{name}' missing")
        t = torch.from_numpy(tensors[name].astype("float32"))
        if tuple(t.shape) != tuple(shape):
            raise ExportError(f"{path}: parameter '{name}' has shape {tuple(t.shape)}, expected {tuple(shape)}")
        params[name] = t
    return kind, cfg, meta, params


# -----------------------------------------------------------------------------------------
# SAN / FFN arm -> Qwen3 (Llama without QK-norm)

def check_expressible(cfg, source):
    if cfg.sandwich:
        raise ExportError(f"{source}: sandwich=1 (a norm on each sub-layer output) cannot be exported: Qwen3 and "
                          f"Llama decoder layers add the sub-layer output to the stream unnormalised")
    if cfg.residual == "none":
        raise ExportError(f"{source}: residual=none (no skip connection) cannot be exported: transformers' "
                          f"decoder layers always add each sub-layer's output to the residual stream")


def norm_weight(cfg, gain):
    """The RMSNorm weight equal to our gain: ZCN multiplies by (1 + gain), rms by gain."""
    return (1.0 + gain) if cfg.norm == "zcn" else gain.clone()


def residual_scale(cfg, gate):
    """The factor our residual puts on a sub-layer output, or None for 'standard'."""
    if cfg.residual == "gated":
        return torch.sigmoid(gate)
    if cfg.residual == "rezero":
        return gate.clone()
    return None


def fold_san(cfg, P):
    """{transformers name: tensor} for SAN parameters P ({our name: fp32 tensor}), and the
    names of ours whose values folding changed (their originals go to the sidecar)."""
    V, d = cfg.vocab_size, cfg.n_embd
    wte = P["wte"][:V]
    out = {"model.embed_tokens.weight": wte * cfg.embed_multiplier,  # the product ours takes after lookup
           "lm_head.weight": wte.clone(),
           "model.norm.weight": norm_weight(cfg, P["final_norm.weight"])}
    changed = ["final_norm.weight"] if cfg.norm == "zcn" else []
    for i in range(cfg.n_layer):
        p, h = f"layers.{i}.", f"model.layers.{i}."
        out[h + "input_layernorm.weight"] = norm_weight(cfg, P[p + "attn_norm.weight"])
        out[h + "self_attn.q_proj.weight"] = P[p + "attn.wq"].clone()
        out[h + "self_attn.k_proj.weight"] = P[p + "attn.wk"].clone()
        out[h + "self_attn.v_proj.weight"] = P[p + "attn.wv"].clone()
        gains = [p + "attn_norm.weight"]
        if cfg.qk_norm:
            out[h + "self_attn.q_norm.weight"] = norm_weight(cfg, P[p + "attn.q_norm.weight"])
            out[h + "self_attn.k_norm.weight"] = norm_weight(cfg, P[p + "attn.k_norm.weight"])
            gains += [p + "attn.q_norm.weight", p + "attn.k_norm.weight"]
        s = residual_scale(cfg, P.get(p + "attn_gate"))
        out[h + "self_attn.o_proj.weight"] = P[p + "attn.wo"] * s if s is not None else P[p + "attn.wo"].clone()
        if s is not None:
            changed += [p + "attn.wo", p + "attn_gate"]
        if cfg.ffn == "swiglu":
            out[h + "post_attention_layernorm.weight"] = norm_weight(cfg, P[p + "ffn_norm.weight"])
            out[h + "mlp.gate_proj.weight"] = P[p + "ffn.w_gate"].clone()
            out[h + "mlp.up_proj.weight"] = P[p + "ffn.w_up"].clone()
            s = residual_scale(cfg, P.get(p + "ffn_gate"))
            out[h + "mlp.down_proj.weight"] = P[p + "ffn.w_down"] * s if s is not None else P[p + "ffn.w_down"].clone()
            gains += [p + "ffn_norm.weight"]
            if s is not None:
                changed += [p + "ffn.w_down", p + "ffn_gate"]
        else:
            # no MLP: intermediate_size 0; the norm before it normalises for nothing
            out[h + "post_attention_layernorm.weight"] = torch.ones(d)
            out[h + "mlp.gate_proj.weight"] = torch.zeros(0, d)
            out[h + "mlp.up_proj.weight"] = torch.zeros(0, d)
            out[h + "mlp.down_proj.weight"] = torch.zeros(d, 0)
        if cfg.norm == "zcn":
            changed += gains
    return out, changed


def san_hf_config(cfg, eos_id=None):
    """Qwen3Config (qk_norm) or LlamaConfig (no qk_norm) of the SAN/FFN arm."""
    from transformers import LlamaConfig, Qwen3Config
    common = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.n_embd, num_hidden_layers=cfg.n_layer,
                  intermediate_size=cfg.d_ff if cfg.ffn == "swiglu" else 0,
                  num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_kv_head, head_dim=cfg.head_dim,
                  hidden_act="silu", max_position_embeddings=cfg.seq_len, rms_norm_eps=san.NORM_EPS,
                  rope_parameters={"rope_type": "default", "rope_theta": float(cfg.rope_theta)},
                  attention_bias=False, attention_dropout=0.0, tie_word_embeddings=False,
                  bos_token_id=cfg.bos_id, eos_token_id=eos_id, pad_token_id=None, dtype="float32")
    if cfg.qk_norm:
        return Qwen3Config(use_sliding_window=False, sliding_window=None, **common)
    return LlamaConfig(mlp_bias=False, **common)


# -----------------------------------------------------------------------------------------
# GPT-2 -> GPT2LMHeadModel

def gpt2_tensors(cfg, P):
    """{transformers name: tensor}: Conv1D weights are (in, out), ours (out, in); lm_head is
    tied to wte and not stored."""
    out = {"transformer.wte.weight": P["wte"][:cfg.vocab_size].clone(), "transformer.wpe.weight": P["wpe"].clone(),
           "transformer.ln_f.weight": P["ln_f.weight"].clone(), "transformer.ln_f.bias": P["ln_f.bias"].clone()}
    for name, _ in gpt2.parameter_spec(cfg):
        if name.startswith("layers."):
            hf = "transformer." + name.replace("layers.", "h.", 1)
            t = P[name]
            out[hf] = t.t().contiguous() if name.endswith(gpt2_files.HF_TRANSPOSED) else t.clone()
    return out


def gpt2_hf_config(cfg, eos_id=None):
    from transformers import GPT2Config
    return GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.seq_len, n_embd=cfg.n_embd, n_layer=cfg.n_layer,
                      n_head=cfg.n_head, n_inner=4 * cfg.n_embd, activation_function="gelu_new",
                      layer_norm_epsilon=gpt2.LN_EPS, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                      scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False,
                      tie_word_embeddings=True, bos_token_id=cfg.bos_id,
                      eos_token_id=eos_id if eos_id is not None else cfg.bos_id, dtype="float32")


# -----------------------------------------------------------------------------------------
# Export

def model_meta(meta):
    """Our config text without the training state (optimizer, data position)."""
    return {k: v for k, v in meta.items() if not k.startswith(IGNORED_PREFIXES) and k not in ("has_optimizer", "seed")}


def sentencepiece_model(path, log):
    """The SentencePiece model --tokenizer names. The trainers' tokenizer .bin (a decode table,
    doc/formats.md) stands for the .model of the same name beside it when that is the model it was
    exported from; otherwise one line says which file to pass."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) >= 1024 and int(np.frombuffer(data[:4], dtype="<i4")[0]) == TOKENIZER_MAGIC:
        beside = os.path.splitext(path)[0] + ".model"
        h = np.frombuffer(data[:1024], dtype="<i4")
        if os.path.exists(beside) and (zlib.crc32(data[1024:], zlib.crc32(h[2:9].tobytes())) ==
                                       tokenizer_fingerprint(SPTokenizer(beside)) & 0xFFFFFFFF):
            log(f"note: --tokenizer {path} is the trainers' tokenizer .bin; exporting its SentencePiece model {beside}")
            return beside
        raise ExportError(f"--tokenizer {path} is the trainers' tokenizer .bin, which holds no merge rules: pass the "
                          f"SentencePiece .model it was exported from" +
                          (f" ({beside} is another tokenizer's)" if os.path.exists(beside) else
                           f" (e.g. {beside}, which the tokenizer scripts write beside it)"))
    try:
        SPTokenizer(path)
    except Exception as e:  # (SentencePiece's own error: a page of C++ context)
        raise ExportError(f"--tokenizer {path} is not a SentencePiece model ({str(e).splitlines()[0][:80]}): pass the "
                          f".model that dev/data/train_tokenizer.py wrote") from None
    return path


def readable(outdir):
    """safetensors writes its files 0600; an export is for others to load: the umask's mode."""
    mask = os.umask(0)
    os.umask(mask)
    for name in os.listdir(outdir):
        path = os.path.join(outdir, name)
        if os.path.isfile(path):
            os.chmod(path, 0o666 & ~mask)


def export(ckpt, outdir, tokenizer=None, log=print):
    """Writes the transformers directory; returns the config object written."""
    from safetensors.torch import save_file
    from transformers import GenerationConfig
    kind, cfg, meta, P = read_checkpoint(ckpt)
    hf_tok = None
    eos_id = None
    if tokenizer:
        from attnref.hf_tokenizer import sentencepiece_to_hf
        tokenizer = sentencepiece_model(tokenizer, log)
        hf_tok = sentencepiece_to_hf(tokenizer, cfg.seq_len)
        if len(hf_tok) != cfg.vocab_size:
            raise ExportError(f"--tokenizer {tokenizer}: {len(hf_tok)} pieces, but {ckpt} has vocab_size "
                              f"{cfg.vocab_size}")
        if hf_tok.bos_token_id != cfg.bos_id:
            raise ExportError(f"--tokenizer {tokenizer}: BOS is {hf_tok.bos_token_id}, {ckpt} has bos_id {cfg.bos_id}")
        eos_id = hf_tok.eos_token_id
    padded_rows = P["wte"][cfg.vocab_size:]
    if padded_rows.numel() and padded_rows.abs().max().item() > 0:
        log(f"note: {ckpt}: the padded embedding rows (ids >= {cfg.vocab_size}) are not zero; they are never "
            f"used and are not exported")
    if kind == "gpt2":
        hf_cfg, tensors, changed = gpt2_hf_config(cfg, eos_id), gpt2_tensors(cfg, P), []
    else:
        check_expressible(cfg, ckpt)
        hf_cfg = san_hf_config(cfg, eos_id)
        tensors, changed = fold_san(cfg, P)
        if cfg.doc_mask:
            log("note: doc_mask=1: the exported model attends across documents; it equals ours on inputs whose "
                "only BOS is the first token")
    setattr(hf_cfg, META_KEY, {"format": FORMAT_VERSION, "kind": kind, "config": model_meta(meta),
                               "unfolded": UNFOLDED_FILE if changed else None})
    if os.path.exists(os.path.join(outdir, "config.json")):
        log(f"note: {outdir} holds an export already: its files are replaced")
    os.makedirs(outdir, exist_ok=True)
    hf_cfg.save_pretrained(outdir)
    GenerationConfig(bos_token_id=cfg.bos_id, eos_token_id=hf_cfg.eos_token_id,
                     pad_token_id=hf_tok.pad_token_id if hf_tok is not None else None).save_pretrained(outdir)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(outdir, "model.safetensors"),
              metadata={"format": "pt"})
    side = os.path.join(outdir, UNFOLDED_FILE)
    if changed:
        save_file({n: P[n].contiguous() for n in changed}, side, metadata={"format": "pt"})
    elif os.path.exists(side):
        os.remove(side)                # a stale sidecar would be read by import_hf
    if hf_tok is not None:
        hf_tok.save_pretrained(outdir)
    readable(outdir)
    log(f"exported {ckpt} ({kind}, {type(hf_cfg).__name__}: {cfg.n_layer} layers, d {cfg.n_embd}, vocab "
        f"{cfg.vocab_size}) to {outdir}" + ("" if hf_tok is not None else " without a tokenizer (--tokenizer)"))
    return hf_cfg


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="model checkpoint written by train_san / train_gpt2 (.py or .cu)")
    ap.add_argument("outdir", help="directory to write (created; files of the same names are replaced, with a note)")
    ap.add_argument("--tokenizer", metavar="MODEL",
                    help="SentencePiece model the checkpoint was trained with (e.g. data/offline/tokenizer.model; "
                         "its tokenizer.bin stands for the .model beside it)")
    args = ap.parse_args(argv)
    try:
        export(args.checkpoint, args.outdir, args.tokenizer)
    except (ExportError, container.ContainerError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
