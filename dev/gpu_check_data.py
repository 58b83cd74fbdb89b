"""The training shard of scripts/gpu_check.sh's train and profile stages: random tokens of the
SAN's 16,384-token vocabulary, a document start (BOS 2) every 1024 tokens, enough for 20 steps of
B 4 x T 2048. Usage: python dev/gpu_check_data.py DIR (writes DIR/san_000000.bin)."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from attnref.shards import write_shard  # noqa: E402


def main(directory):
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, 16384, size=4 * 2049 * 20)
    tokens[::1024] = 2
    write_shard(os.path.join(directory, "san_000000.bin"), tokens)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python dev/gpu_check_data.py DIR")
    main(sys.argv[1])
