"""
Model sizes without torch: both models' parameter lists (names, shapes, file order: the
contract with train_san.cu and train_gpt2.cu), and the parameter counts and training FLOPs
per token that follow from them. san.py and gpt2.py build their modules from these lists;
study/match.py and the study reports count with them where torch is not installed.
doc/san-model.md and doc/gpt2.md list the parameters.
"""

import math

VOCAB_PAD = 128  # the embedding and the logits are padded to a multiple of this (both models)


def padded_vocab(vocab_size):
    return -(-vocab_size // VOCAB_PAD) * VOCAB_PAD


def palm_flops_per_token(non_embedding, cfg, mixing_layers):
    """Training FLOPs per token, PaLM's convention (the trainers' MFU): 6 x (non-embedding
    parameters + the LM head's V x d) for every matmul forward and backward, plus 12 x T x d for
    the scores and values of each layer that mixes over T x T pairs (no causal halving)."""
    return 6 * (non_embedding + cfg.vocab_size * cfg.n_embd) + 12 * mixing_layers * cfg.seq_len * cfg.n_embd


def _numel(spec):
    return sum(math.prod(shape) for _, shape in spec)


# -----------------------------------------------------------------------------------------
# The SAN family. `cfg` is a san.SANConfig or any object with its size fields (study/match.py's
# Arm): vocab_size, seq_len, n_layer, n_embd, n_head, n_kv_head, ffn, d_ff (0: 4 d), qk_norm,
# residual, sandwich, and kinds (the attention kind of each layer, attnref/variants.py).

def ffn_width(cfg):
    return cfg.d_ff if cfg.d_ff > 0 else 4 * cfg.n_embd


def mlp_width(cfg):
    """The SwiGLU width m of an mlp layer: 3 d m weights as near as integers allow to W_q, W_k,
    W_v, W_o's d (2 Hq hd + 2 Hkv hd), i.e. m = round((2 Hq hd + 2 Hkv hd) / 3), halves up."""
    hd = cfg.n_embd // cfg.n_head
    per_d = 2 * cfg.n_head * hd + 2 * cfg.n_kv_head * hd
    return (2 * per_d + 3) // 6


def san_parameter_spec(cfg):
    """[(name, shape)] in canonical order (the order of tensors in every file)."""
    spec = [("wte", (padded_vocab(cfg.vocab_size), cfg.n_embd))]
    for i, kind in enumerate(cfg.kinds):
        spec += san_layer_spec(cfg, kind, f"layers.{i}.")
    return spec + [("final_norm.weight", (cfg.n_embd,))]


def san_layer_spec(cfg, kind, p=""):
    """[(name, shape)] of one layer whose token mixer is `kind`, names prefixed by p."""
    d, hd = cfg.n_embd, cfg.n_embd // cfg.n_head
    dq, dkv = cfg.n_head * hd, cfg.n_kv_head * hd
    has_gate = cfg.residual in ("gated", "rezero")
    spec = [(p + "attn_norm.weight", (d,))]
    if kind == "mlp":      # token mixing removed: a SwiGLU in the attention's place
        m = mlp_width(cfg)
        spec += [(p + "attn.w_gate", (m, d)), (p + "attn.w_up", (m, d)), (p + "attn.w_down", (d, m))]
    else:                  # every other kind keeps standard attention's tensors
        spec += [(p + "attn.wq", (dq, d)),
                 (p + "attn.wk", (dkv, d)),
                 (p + "attn.wv", (dkv, d))]
        if cfg.qk_norm:
            spec += [(p + "attn.q_norm.weight", (hd,)), (p + "attn.k_norm.weight", (hd,))]
        spec += [(p + "attn.wo", (d, dq))]
    if cfg.sandwich:
        spec += [(p + "attn_post_norm.weight", (d,))]
    if has_gate:
        spec += [(p + "attn_gate", (1,))]
    if cfg.ffn == "swiglu":
        d_ff = ffn_width(cfg)
        spec += [(p + "ffn_norm.weight", (d,)),
                 (p + "ffn.w_gate", (d_ff, d)),
                 (p + "ffn.w_up", (d_ff, d)),
                 (p + "ffn.w_down", (d, d_ff))]
        if cfg.sandwich:
            spec += [(p + "ffn_post_norm.weight", (d,))]
        if has_gate:
            spec += [(p + "ffn_gate", (1,))]
    return spec


def san_parameter_counts(cfg):
    """(total, non-embedding): total includes the padded embedding rows, as the trainers count.
    (Each kind's layer counted once: study/match.py asks this of hundreds of depths.)"""
    kinds = list(cfg.kinds)
    per_layer = {kind: _numel(san_layer_spec(cfg, kind)) for kind in set(kinds)}
    embedding = padded_vocab(cfg.vocab_size) * cfg.n_embd
    total = embedding + sum(per_layer[kind] for kind in kinds) + cfg.n_embd
    return total, total - embedding


def san_flops_per_token(cfg):
    """palm_flops_per_token; the layers that mix over T x T pairs are standard, approximate,
    staticembqk and the fixed-QK kinds: not mlp, nor nonapprox with its one score per position."""
    pairwise = sum(k not in ("mlp", "nonapprox") for k in cfg.kinds)
    return palm_flops_per_token(san_parameter_counts(cfg)[1], cfg, pairwise)


# -----------------------------------------------------------------------------------------
# GPT-2. `cfg` has vocab_size, seq_len (the rows of wpe), n_layer and n_embd.

GPT2_LAYER_FIELDS = [  # (name, shape as a function of d), PyTorch (out, in) layout
    ("ln_1.weight", lambda d: (d,)), ("ln_1.bias", lambda d: (d,)),
    ("attn.c_attn.weight", lambda d: (3 * d, d)), ("attn.c_attn.bias", lambda d: (3 * d,)),
    ("attn.c_proj.weight", lambda d: (d, d)), ("attn.c_proj.bias", lambda d: (d,)),
    ("ln_2.weight", lambda d: (d,)), ("ln_2.bias", lambda d: (d,)),
    ("mlp.c_fc.weight", lambda d: (4 * d, d)), ("mlp.c_fc.bias", lambda d: (4 * d,)),
    ("mlp.c_proj.weight", lambda d: (d, 4 * d)), ("mlp.c_proj.bias", lambda d: (d,)),
]


def gpt2_parameter_spec(cfg):
    """[(name, shape)] in canonical order (the order of tensors in every file)."""
    d = cfg.n_embd
    spec = [("wte", (padded_vocab(cfg.vocab_size), d)), ("wpe", (cfg.seq_len, d))]
    for i in range(cfg.n_layer):
        spec += [(f"layers.{i}.{name}", shape(d)) for name, shape in GPT2_LAYER_FIELDS]
    spec += [("ln_f.weight", (d,)), ("ln_f.bias", (d,))]
    return spec


def gpt2_parameter_counts(cfg):
    """(total, non-embedding): total includes the padded wte rows; non-embedding leaves out wte
    and wpe."""
    total = _numel(gpt2_parameter_spec(cfg))
    return total, total - (padded_vocab(cfg.vocab_size) + cfg.seq_len) * cfg.n_embd


def gpt2_flops_per_token(cfg):
    return palm_flops_per_token(gpt2_parameter_counts(cfg)[1], cfg, cfg.n_layer)
