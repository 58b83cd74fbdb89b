"""
Canonical parameters. Each model keeps one list, parameter_spec(cfg) -> [(name, shape)],
that fixes the names, shapes and file order of its parameters (the contract with its CUDA
trainer); SpecModel draws the initial values in that order and hands the parameters out in
it, so files, optimizer state and init agree by construction. ModelConfig is what both
config dataclasses share: the derived sizes and the config text of doc/formats.md.
"""

from typing import ClassVar

import torch
import torch.nn as nn

from attnref.container import config_from_meta, config_to_meta

VOCAB_PAD = 128  # the embedding / logits are padded to a multiple of this (both models)


class ModelConfig:
    """Mixin of SANConfig and GPT2Config (dataclasses with vocab_size, n_embd, n_head):
    MODEL is the value of the config key model=, which says whose file it is."""
    MODEL: ClassVar[str]

    @property
    def head_dim(self):
        return self.n_embd // self.n_head

    @property
    def padded_vocab_size(self):
        return (self.vocab_size + VOCAB_PAD - 1) // VOCAB_PAD * VOCAB_PAD

    def to_meta(self):
        return config_to_meta(self.MODEL, self)

    @classmethod
    def from_meta(cls, meta, source="<meta>"):
        return config_from_meta(cls, meta, source)


class SpecModel(nn.Module):
    """Base of SAN and GPT2. A subclass sets three static methods from its module:
    parameter_spec(cfg), init_value(cfg, name, shape, gen) and is_matrix_param(name, shape)
    (which parameters the optimizer treats as matrices), and keeps its config in self.cfg."""

    def check_spec(self):
        names = {n for n, _ in self.named_parameters()}
        assert names == {n for n, _ in self.parameter_spec(self.cfg)}, "module tree != parameter_spec"

    def init_weights(self, seed):
        """Initial values drawn in canonical order from a CPU generator, so the result does
        not depend on the device."""
        gen = torch.Generator().manual_seed(seed)
        params = dict(self.named_parameters())
        with torch.no_grad():
            for name, shape in self.parameter_spec(self.cfg):
                params[name].copy_(self.init_value(self.cfg, name, shape, gen))
        return self

    def ordered_parameters(self):
        """[(name, Parameter)] in canonical order."""
        params = dict(self.named_parameters())
        return [(n, params[n]) for n, _ in self.parameter_spec(self.cfg)]


def palm_flops_per_token(cfg, non_embedding):
    """Training FLOPs per token, PaLM convention: 6 * (non-embedding params + LM head V*d)
    + 12 * L * T * d for attention scores and values (full T x T, no causal halving)."""
    return 6 * (non_embedding + cfg.vocab_size * cfg.n_embd) + 12 * cfg.n_layer * cfg.seq_len * cfg.n_embd
