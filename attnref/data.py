"""
Training data of both references: batches from llm.c-format token shards (the formats and
their one reader live in attnref/shards.py, the data scripts' module; doc/formats.md
"Token shards"), with the region labels of the shards that have a region sidecar, and the
deterministic batch of the debug states.
"""

import glob
import os

import numpy as np
import torch

# attnref/shards.py holds the token-shard and sidecar formats (magic numbers, readers,
# writers) for the data scripts and for us: one implementation of each.
from attnref.shards import REGION_NAMES, read_regions, read_shard, regions_path  # noqa: F401 (REGION_NAMES: for evaluation)


class ShardLoader:
    """Sequential batches of B rows x (T+1) tokens; consecutive rows overlap by one token
    (row r covers tokens [pos + rT, pos + (r+1)T]), so every token is a target once. Shards
    with a region sidecar (x.regions next to x.bin; doc/formats.md) also give each batch's
    (B, T+1) region labels in `regions` (llmc/data/dataloader.h reads the same files)."""

    def __init__(self, pattern, B, T, vocab_size):
        self.files = sorted(f for f in glob.glob(pattern) if f.endswith(".bin"))
        if not self.files:
            raise ValueError(f"no token shards match {pattern!r}")
        self.B, self.T, self.V = B, T, vocab_size
        self.has_regions = any(os.path.exists(regions_path(f)) for f in self.files)
        self.regions = None
        self.reset()

    def _load(self, i):
        self.tokens = read_shard(self.files[i])
        self.labels = None
        sidecar = regions_path(self.files[i])
        if self.has_regions and os.path.exists(sidecar):
            self.labels = read_regions(sidecar)
            if len(self.labels) != len(self.tokens):
                raise ValueError(f"{sidecar}: {len(self.labels)} labels for "
                                 f"{len(self.tokens)} tokens")

    def reset(self):
        self.shard, self.pos = 0, 0
        self._load(0)
        self._check_fits()

    def _check_fits(self):
        if len(self.tokens) < self.B * self.T + 1:
            raise ValueError(f"{self.files[self.shard]}: {len(self.tokens)} tokens, fewer than one batch "
                             f"({self.B}x{self.T}+1)")

    def next_batch(self):
        n = self.B * self.T
        if self.pos + n + 1 > len(self.tokens):
            self.shard = (self.shard + 1) % len(self.files)
            self._load(self.shard)
            self.pos = 0
            self._check_fits()
        buf = np.asarray(self.tokens[self.pos:self.pos + n + 1], dtype=np.int64)
        if buf.max() >= self.V:
            raise ValueError(f"{self.files[self.shard]}: token id {buf.max()} >= vocab_size {self.V}")
        if self.has_regions:  # (B, T+1): row b's window, as the tokens (0 "other" without a sidecar)
            lab = np.zeros(n + 1, np.int64) if self.labels is None else np.asarray(
                self.labels[self.pos:self.pos + n + 1], dtype=np.int64)
            idx = np.arange(self.B)[:, None] * self.T + np.arange(self.T + 1)[None, :]
            self.regions = lab[idx]
        self.pos += n
        x = torch.from_numpy(buf[:-1].reshape(self.B, self.T))
        y = torch.from_numpy(buf[1:].reshape(self.B, self.T))
        return x, y


# -----------------------------------------------------------------------------------------
# Debug state

def debug_batch(cfg, B, seed):
    """A deterministic batch of B x (T+1) tokens: uniform ids, with BOS placed so that row 0
    starts with a partial document (no BOS at 0) and every row holds several documents."""
    g = torch.Generator().manual_seed(seed + 1)
    T = cfg.seq_len
    toks = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=g)
    for b in range(B):
        starts = torch.randint(0, T + 1, (3,), generator=g).tolist()
        if b > 0:
            starts.append(0)
        for s in starts:
            toks[b, s] = cfg.bos_id
    toks[0, 0] = (cfg.bos_id + 1) % cfg.vocab_size
    return toks[:, :-1].contiguous(), toks[:, 1:].contiguous()


