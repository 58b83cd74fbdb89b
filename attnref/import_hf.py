"""
import_hf.py -- a Hugging Face transformers directory as a checkpoint of ours, the reverse of
export_hf.py: bit for bit for a directory it wrote, else Qwen3/Llama decoders of the SAN
family's shapes and GPT-2 models as they stand (what is accepted, and why the round trip is
exact: doc/export.md).

  python -m attnref.import_hf DIR CKPT
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import replace

import torch

from attnref import container, export_hf, gpt2, gpt2_files, san
from attnref.export_hf import META_KEY


class ImportHFError(ValueError):
    pass


def fail(source, msg):
    raise ImportHFError(f"{source}: {msg}")


def load_weights(d):
    """{name: fp32 tensor} from model.safetensors or a sharded model.safetensors.index.json."""
    from safetensors.torch import load_file
    single, index = os.path.join(d, "model.safetensors"), os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(single):
        files = [single]
    elif os.path.exists(index):
        with open(index) as f:
            files = [os.path.join(d, n) for n in sorted(set(json.load(f)["weight_map"].values()))]
    else:
        fail(d, "no model.safetensors (or model.safetensors.index.json); save the model with safetensors")
    out = {}
    for path in files:
        try:
            tensors = load_file(path)
        except Exception as e:           # safetensors raises its own error types
            fail(path, f"not a readable safetensors file ({e})")
        for k, v in tensors.items():
            out[k] = v.float() if v.is_floating_point() else v
    return out


def take(W, name, shape, source):
    if name not in W:
        fail(source, f"weight '{name}' missing")
    t = W[name]
    if tuple(t.shape) != tuple(shape):
        fail(source, f"weight '{name}' has shape {tuple(t.shape)}, expected {tuple(shape)}")
    return t.contiguous()


# -----------------------------------------------------------------------------------------
# Qwen3 / Llama -> SAN or FFN arm

def san_config_of(hc, ours, source):
    """Our SANConfig in the folded parametrisation (rms gains, standard residual) of a
    Qwen3/Llama config dict hc; ours: the exporter's config text or {}."""
    mt = hc.get("model_type")
    need = [(hc.get("hidden_act") == "silu", f"hidden_act is {hc.get('hidden_act')!r}, ours is SiLU (SwiGLU)"),
            (not hc.get("attention_bias", False), "attention_bias is set; our projections have no biases"),
            (not hc.get("mlp_bias", False), "mlp_bias is set; our projections have no biases"),
            (hc.get("rms_norm_eps") == san.NORM_EPS,
             f"rms_norm_eps is {hc.get('rms_norm_eps')}, ours is fixed at {san.NORM_EPS}"),
            (not hc.get("use_sliding_window", False), "sliding-window attention is on"),
            (all(t == "full_attention" for t in hc.get("layer_types") or []), "some layers are not full attention")]
    for ok, msg in need:
        if not ok:
            fail(source, f"{mt} model not of a shape we support: {msg}")
    rope = hc.get("rope_parameters") or {"rope_type": "default", "rope_theta": hc.get("rope_theta", 10000.0)}
    if rope.get("rope_type", "default") != "default" or hc.get("rope_scaling"):
        fail(source, f"RoPE type {rope.get('rope_type')!r} / scaling: ours is plain rotate-half RoPE")
    d, Hq = hc["hidden_size"], hc["num_attention_heads"]
    hd = hc.get("head_dim") or d // Hq
    if hd * Hq != d:
        fail(source, f"head_dim {hd} x {Hq} heads != hidden_size {d}; ours has head_dim = d / heads")
    ff = hc.get("intermediate_size", 0)
    defaults = san.SANConfig()
    kw = dict(vocab_size=hc["vocab_size"], seq_len=hc["max_position_embeddings"], n_layer=hc["num_hidden_layers"],
              n_embd=d, n_head=Hq, n_kv_head=hc.get("num_key_value_heads") or Hq,
              ffn="swiglu" if ff else "none", d_ff=ff or 4 * d, norm="rms", qk_norm=(mt == "qwen3"),
              residual="standard", sandwich=False, rope_theta=float(rope["rope_theta"]),
              doc_mask=bool(int(ours.get("doc_mask", int(defaults.doc_mask)))),
              bos_id=hc.get("bos_token_id") if hc.get("bos_token_id") is not None else int(ours.get("bos_id", 0)),
              z_loss=float(ours.get("z_loss", defaults.z_loss)))
    if ours and "d_ff" in ours and not ff:
        kw["d_ff"] = int(ours["d_ff"])        # unused without an FFN, but kept for the round trip
    return san.SANConfig(**kw)


def embed_scale_of(W, cfg, source):
    """Our embed_scale from the transformers pair (embed_tokens, lm_head): no lm_head (tied) or the
    same values (Qwen2.5's unscaled embedding) is 1; embed_tokens exactly sqrt(d) x lm_head (what
    export_hf writes for the SAN paper's scaled embedding) is sqrt-d. Any other pair has no
    counterpart here: ours ties the input embedding to the head."""
    V, d = cfg.vocab_size, cfg.n_embd
    embed = take(W, "model.embed_tokens.weight", (V, d), source)
    if "lm_head.weight" not in W:
        return "1"
    head = take(W, "lm_head.weight", (V, d), source)
    if torch.equal(embed, head):
        return "1"
    if torch.equal(embed, head * math.sqrt(d)):
        return "sqrt-d"
    fail(source, f"embed_tokens is neither lm_head nor exactly sqrt({d}) x lm_head: ours ties the two (input = "
                 f"1 or sqrt(d) x the output embedding), this model has independent ones")


def unfold_san(cfg, W, source):
    """Our parameters in the folded parametrisation (cfg: norm rms, residual standard) from
    transformers weights W."""
    V, Vp, d, hd = cfg.vocab_size, cfg.padded_vocab_size, cfg.n_embd, cfg.head_dim
    E = take(W, "lm_head.weight" if "lm_head.weight" in W else "model.embed_tokens.weight", (V, d), source)
    P = {"wte": torch.zeros(Vp, d)}
    P["wte"][:V] = E
    for i in range(cfg.n_layer):
        p, h = f"layers.{i}.", f"model.layers.{i}."
        P[p + "attn_norm.weight"] = take(W, h + "input_layernorm.weight", (d,), source)
        P[p + "attn.wq"] = take(W, h + "self_attn.q_proj.weight", (cfg.n_head * hd, d), source)
        P[p + "attn.wk"] = take(W, h + "self_attn.k_proj.weight", (cfg.n_kv_head * hd, d), source)
        P[p + "attn.wv"] = take(W, h + "self_attn.v_proj.weight", (cfg.n_kv_head * hd, d), source)
        if cfg.qk_norm:
            P[p + "attn.q_norm.weight"] = take(W, h + "self_attn.q_norm.weight", (hd,), source)
            P[p + "attn.k_norm.weight"] = take(W, h + "self_attn.k_norm.weight", (hd,), source)
        P[p + "attn.wo"] = take(W, h + "self_attn.o_proj.weight", (d, cfg.n_head * hd), source)
        if cfg.ffn == "swiglu":
            P[p + "ffn_norm.weight"] = take(W, h + "post_attention_layernorm.weight", (d,), source)
            P[p + "ffn.w_gate"] = take(W, h + "mlp.gate_proj.weight", (cfg.d_ff, d), source)
            P[p + "ffn.w_up"] = take(W, h + "mlp.up_proj.weight", (cfg.d_ff, d), source)
            P[p + "ffn.w_down"] = take(W, h + "mlp.down_proj.weight", (d, cfg.d_ff), source)
    P["final_norm.weight"] = take(W, "model.norm.weight", (d,), source)
    return P


def import_san(hc, W, d, log):
    meta = hc.get(META_KEY) or {}
    ours = meta.get("config") or {}
    folded_cfg = san_config_of(hc, ours, d)
    folded_cfg = replace(folded_cfg, embed_scale=embed_scale_of(W, folded_cfg, d),
                         out_init=ours.get("out_init", folded_cfg.out_init))  # (the init: for the round trip)
    P = unfold_san(folded_cfg, W, d)
    step = int(ours.get("step", 0))
    if not ours:
        log(f"{d}: not written by export_hf: imported as norm=rms, residual=standard; doc_mask and z_loss take "
            f"the defaults ({int(folded_cfg.doc_mask)}, {folded_cfg.z_loss})")
        return folded_cfg, P, step
    cfg = san.SANConfig.from_meta(ours, f"{d}/config.json [{META_KEY}]")
    if replace(cfg, norm="rms", residual="standard") != folded_cfg:
        fail(d, f"config.json [{META_KEY}] describes another model than config.json's own fields")
    side = os.path.join(d, meta["unfolded"]) if meta.get("unfolded") else None
    restored = dict(P)
    if side is not None:
        from safetensors.torch import load_file
        if not os.path.exists(side):
            log(f"{d}: {meta['unfolded']} is missing: imported as norm=rms, residual=standard (same function)")
            return folded_cfg, P, step
        restored.update({k: v.float() for k, v in load_file(side).items()})
    names = [n for n, _ in san.parameter_spec(cfg)]
    missing = [n for n in names if n not in restored]
    refolded = export_hf.fold_san(cfg, restored)[0] if not missing else None
    if refolded is None or any(not torch.equal(refolded[k], W[k]) for k in refolded):
        log(f"{d}: the weights differ from what the exporter wrote (folding the originals in "
            f"{meta.get('unfolded')} does not give them back): imported as norm=rms, residual=standard")
        return folded_cfg, P, step
    return cfg, {n: restored[n] for n in names}, step


# -----------------------------------------------------------------------------------------
# GPT-2

def import_gpt2(hc, W, d, log):
    need = [(hc.get("activation_function", "gelu_new") == "gelu_new",
             f"activation {hc.get('activation_function')!r}, ours is GELU (tanh approximation, gelu_new)"),
            (hc.get("n_inner") in (None, 4 * hc["n_embd"]), f"n_inner {hc.get('n_inner')}, ours is 4 x n_embd"),
            (hc.get("layer_norm_epsilon", 1e-5) == gpt2.LN_EPS, f"layer_norm_epsilon {hc.get('layer_norm_epsilon')}"),
            (hc.get("scale_attn_weights", True) and not hc.get("scale_attn_by_inverse_layer_idx", False),
             "attention scaling other than 1/sqrt(head_dim)"),
            (hc.get("tie_word_embeddings", True), "an untied LM head; ours is tied to wte")]
    for ok, msg in need:
        if not ok:
            fail(d, f"GPT-2 model not of the shape we support: {msg}")
    ours = (hc.get(META_KEY) or {}).get("config") or {}
    bos = hc.get("bos_token_id")
    cfg = gpt2.GPT2Config(vocab_size=hc["vocab_size"], seq_len=hc["n_positions"], n_layer=hc["n_layer"],
                                n_embd=hc["n_embd"], n_head=hc["n_head"],
                                bos_id=int(ours.get("bos_id", bos if bos is not None else 0)))
    W = {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in W.items()}
    V, dm = cfg.vocab_size, cfg.n_embd
    P = {}
    for name, shape in gpt2.parameter_spec(cfg):
        if name == "wte":
            P[name] = torch.zeros(shape)
            P[name][:V] = take(W, "wte.weight", (V, dm), d)
        elif name == "wpe":
            P[name] = take(W, "wpe.weight", shape, d)
        elif name.startswith("layers."):
            hf = name.replace("layers.", "h.", 1)
            if name.endswith(gpt2_files.HF_TRANSPOSED):
                P[name] = take(W, hf, shape[::-1], d).t().contiguous()
            else:
                P[name] = take(W, hf, shape, d)
        else:
            P[name] = take(W, name, shape, d)
    if "lm_head.weight" in W and not torch.equal(W["lm_head.weight"], W["wte.weight"]):
        fail(d, "lm_head.weight differs from wte.weight; ours ties them")
    return cfg, P, int(ours.get("step", 0))


# -----------------------------------------------------------------------------------------

def import_dir(d, ckpt, log=print):
    path = os.path.join(d, "config.json")
    try:
        with open(path) as f:
            hc = json.load(f)
    except OSError as e:
        fail(d, f"cannot read config.json ({e.strerror})")
    except ValueError as e:
        fail(path, f"not JSON ({e})")
    mt = hc.get("model_type")
    if mt not in ("qwen3", "llama", "gpt2"):
        fail(d, f"model_type {mt!r}: this importer knows qwen3, llama (the SAN family) and gpt2")
    W = load_weights(d)
    try:
        return _import(d, ckpt, hc, mt, W, log)
    except KeyError as e:
        fail(path, f"config field {e} missing")


def _import(d, ckpt, hc, mt, W, log):
    if mt in ("qwen3", "llama"):
        cfg, P, step = import_san(hc, W, d, log)
        model = san.SAN(cfg)
        container.load_params_into(model, {k: v.numpy() for k, v in P.items()}, d)
        container.save_checkpoint(ckpt, model, step)
    else:
        cfg, P, step = import_gpt2(hc, W, d, log)
        model = gpt2.GPT2(cfg)
        container.load_params_into(model, {k: v.numpy() for k, v in P.items()}, d)
        container.save_checkpoint(ckpt, model, step)
    log(f"imported {d} ({mt}) to {ckpt}")
    return cfg


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="transformers model directory (config.json + safetensors)")
    ap.add_argument("checkpoint", help="checkpoint to write (doc/formats.md)")
    args = ap.parse_args(argv)
    try:
        import_dir(args.dir, args.checkpoint)
    except (ImportHFError, container.ContainerError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
