"""Writes the debug states that test_san checks the CUDA trainer against: one per
configuration of the test matrix (issue 4), each made by train_san.py's own command line
(doc/san-model.md, "Debug state"), all in one Python process so torch is imported once.

    python dev/test/make_debug_states.py OUT_DIR

The C++ trainer implements AdamW (Muon is issue 5), so every state uses --optimizer adamw.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
import torch  # noqa: E402

import train_san  # noqa: E402

ADAMW = ["--optimizer", "adamw"]
MATRIX = {
    "san": ["--preset", "tiny"],                              # GQA 4/2, zcn, qk-norm, gated, doc mask
    "ffn": ["--preset", "tiny-ffn"],
    "rms": ["--preset", "tiny", "--norm", "rms"],
    "noqk": ["--preset", "tiny", "--qk-norm", "0"],
    "standard": ["--preset", "tiny-ffn", "--residual", "standard"],
    "rezero": ["--preset", "tiny-ffn", "--residual", "rezero"],
    "noresidual": ["--preset", "tiny-ffn", "--residual", "none"],
    "sandwich": ["--preset", "tiny-ffn", "--sandwich", "1"],
    "gqa4": ["--preset", "tiny", "--n-kv-head", "1"],
    "mha": ["--preset", "tiny", "--n-kv-head", "4"],
    "nodoc": ["--preset", "tiny", "--doc-mask", "0"],
    "clip": ["--preset", "tiny-ffn", "--grad-clip", "0.05", "--schedule", "cosine"],
}


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_debug_states.py OUT_DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)  # deterministic and polite on small CI machines
    for name, flags in MATRIX.items():
        path = os.path.join(out, name + ".bin")
        rc = train_san.main(flags + ADAMW + ["--device", "cpu", "--write-debug-state", path])
        if rc not in (None, 0):
            sys.exit(f"train_san.py failed for {name}")
    print(f"wrote {len(MATRIX)} debug states to {out}")


if __name__ == "__main__":
    main()
