"""Writes the debug states that test_san checks the CUDA trainer against: one per
configuration of the test matrix (issue 4), each made by train_san.py's own command line
(doc/san-model.md, "Debug state"), all in one Python process so torch is imported once.

    python dev/test/make_debug_states.py OUT_DIR

The architecture matrix runs with --optimizer adamw; the Muon states (both orders, the SAN
and FFN arms, GQA shapes, with clipping) check the Muon step (issue 5).
"""
import os
import sys

import torch

# train_san.py is a file at the repository root, not in an installed package: run as a file, this
# script has only dev/test/ on its path
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import train_san  # noqa: E402

# The rates are pinned so that the FFN states do not take the FFN arm's larger defaults:
# test_san's tolerances were measured at these step sizes. The paper order's undamped update
# is (1+mu) O from zero momentum, so its lr 1e-3 moves the weights as far per step as the
# keller order's 0.02 does (0.02 x (1-mu)(1+mu) ~ 1e-3 x (1+mu)).
ADAMW = ["--optimizer", "adamw", "--lr", "6e-4"]
MUON = ["--optimizer", "muon", "--muon-order", "keller", "--lr", "0.02"]
PAPER = ["--optimizer", "muon", "--muon-order", "paper", "--lr", "1e-3"]
MATRIX = {
    "san": ["--preset", "tiny"] + ADAMW,                      # GQA 4/2, zcn, qk-norm, gated, doc mask
    "ffn": ["--preset", "tiny-ffn"] + ADAMW,
    "rms": ["--preset", "tiny", "--norm", "rms"] + ADAMW,
    "noqk": ["--preset", "tiny", "--qk-norm", "0"] + ADAMW,
    "standard": ["--preset", "tiny-ffn", "--residual", "standard"] + ADAMW,
    "rezero": ["--preset", "tiny-ffn", "--residual", "rezero"] + ADAMW,
    "noresidual": ["--preset", "tiny-ffn", "--residual", "none"] + ADAMW,
    "sandwich": ["--preset", "tiny-ffn", "--sandwich", "1"] + ADAMW,
    "gqa4": ["--preset", "tiny", "--n-kv-head", "1"] + ADAMW,
    "mha": ["--preset", "tiny", "--n-kv-head", "4"] + ADAMW,
    "nodoc": ["--preset", "tiny", "--doc-mask", "0"] + ADAMW,
    # head dim 64 (the paper's): the tensor-core attention's main shape, GQA 2/1
    "hd64": ["--preset", "tiny", "--n-embd", "128", "--n-head", "2", "--n-kv-head", "1"] + ADAMW,
    "clip": ["--preset", "tiny-ffn", "--grad-clip", "0.05", "--schedule", "cosine"] + ADAMW,
    # the qwen presets' form (doc/deconstructing.md "Presets"): MHA, rms, no QK-norm, plain residuals,
    # the embedding unscaled
    "qwen": ["--preset", "tiny-ffn", "--n-kv-head", "4", "--norm", "rms", "--qk-norm", "0", "--residual", "standard",
             "--embed-scale", "1", "--out-init", "plain"] + ADAMW,
    # Muon: matrix shapes (tiny: wq/wo 64x64, wk/wv 32x64 GQA; tiny-ffn adds w_gate/w_up
    # 128x64 tall and w_down 64x128 wide; gqa4: wk/wv 16x64)
    "muon_san": ["--preset", "tiny"] + MUON,
    "muon_ffn": ["--preset", "tiny-ffn"] + MUON,
    "muon_gqa4": ["--preset", "tiny", "--n-kv-head", "1"] + MUON,
    "muon_clip": ["--preset", "tiny-ffn", "--grad-clip", "0.05", "--schedule", "cosine"] + MUON,
    "paper_san": ["--preset", "tiny"] + PAPER,
    "paper_ffn": ["--preset", "tiny-ffn"] + PAPER,
}
# The attention variants (doc/deconstructing.md): each uniform in the SAN and as the paper's
# hybrid (variant in layer 1, standard in layer 2) in the FFN arm, plus the switches they add.
# rndembqk and fixedseqqk states carry their fixed input (fixed_qk.input / fixed_qk.tokens: the
# reference draws them, there being no training data here).
for kind in ("mlp", "approximate", "nonapprox", "staticembqk", "rndembqk", "fixedseqqk"):
    MATRIX[f"{kind}_uniform"] = ["--preset", "tiny", "--attention", kind] + ADAMW
    MATRIX[f"{kind}_hybrid"] = ["--preset", "tiny-ffn", "--attention", kind, "--layout", "hybrid"] + ADAMW
# (approximate's separate normalisation has no state: it divides by sum x, which crosses zero at
# random init, so its fp32/bf16 results are as ill-conditioned as that makes them; the kernel
# test checks it on well-conditioned inputs, doc/deconstructing.md)
MATRIX["nonapprox_noqk"] = ["--preset", "tiny", "--attention", "nonapprox", "--qk-norm", "0"] + ADAMW
# MHA: the mlp width rounds (d 64: 4d/3 = 85.3 -> 85); an explicit layout list
MATRIX["mlp_mha"] = ["--preset", "tiny", "--n-kv-head", "4", "--attention", "mlp", "--layout", "2"] + ADAMW


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_debug_states.py OUT_DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)  # deterministic and polite on small CI machines
    for name, flags in MATRIX.items():
        path = os.path.join(out, name + ".bin")
        rc = train_san.main(flags + ["--device", "cpu", "--write-debug-state", path])
        if rc not in (None, 0):
            sys.exit(f"train_san.py failed for {name}")
    print(f"wrote {len(MATRIX)} debug states to {out}")


if __name__ == "__main__":
    main()
