"""Writes the debug states that test_gpt2 checks the CUDA GPT-2 trainer against, each made
by train_gpt2.py's own command line (doc/formats.md "GPT-2 checkpoints", "Debug state"),
all in one Python process so torch is imported once; and, for the llm.c compatibility
check, llm.c model files (fp32 version 3 and bf16 version 5) of each state's initial
parameters under OUT_DIR/llmc/<name>.<dtype>.llmc.

    python dev/test/make_gpt2_debug_states.py OUT_DIR
"""
import os
import sys

import torch

# train_gpt2.py is a file at the repository root, not in an installed package: run as a file, this
# script has only dev/test/ on its path
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import train_gpt2  # noqa: E402

MATRIX = {
    # padded vocab (250 -> 256), head_dim 16, wsd schedule, weight decay visible in 10 steps
    "tiny": ["--preset", "tiny", "--lr", "1e-3", "--weight-decay", "0.1"],
    # V = 384 (no padding), head_dim 48 (padded lanes in the attention kernels), odd layer
    # count, clipping active on every step, cosine schedule, separate rate for the other group
    "wide": ["--preset", "tiny-wide", "--lr", "2e-3", "--lr-other", "1e-3", "--grad-clip", "0.05",
             "--schedule", "cosine"],
}


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_gpt2_debug_states.py OUT_DIR")
    out = sys.argv[1]
    os.makedirs(os.path.join(out, "llmc"), exist_ok=True)
    torch.set_num_threads(1)  # deterministic and polite on small CI machines
    for name, flags in MATRIX.items():
        path = os.path.join(out, name + ".bin")
        llmc = os.path.join(out, "llmc", name)
        rc = train_gpt2.main(flags + ["--device", "cpu", "--write-debug-state", path,
                                      "--write-llmc", llmc + ".fp32.llmc", "--llmc-dtype", "fp32"])
        rc = rc or train_gpt2.main(flags + ["--device", "cpu", "--write-llmc", llmc + ".bf16.llmc",
                                            "--llmc-dtype", "bf16"])
        if rc not in (None, 0):
            sys.exit(f"train_gpt2.py failed for {name}")
    print(f"wrote {len(MATRIX)} GPT-2 debug states to {out}")


if __name__ == "__main__":
    main()
