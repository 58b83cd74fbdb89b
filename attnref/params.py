"""
Canonical parameters. Each model has one list, parameter_spec(cfg) -> [(name, shape)]
(attnref/sizes.py), that fixes the names, shapes and file order of its parameters; SpecModel
draws the initial values in that order and hands the parameters out in it, so files, optimizer
state and init agree by construction. ModelConfig: what both config dataclasses share.
"""

from typing import ClassVar

import torch
import torch.nn as nn

from attnref.container import config_from_meta, config_to_meta
from attnref.sizes import padded_vocab


class ModelConfig:
    """Mixin of SANConfig and GPT2Config (dataclasses with vocab_size, n_embd, n_head):
    MODEL is the value of the config key model=, which says whose file it is."""
    MODEL: ClassVar[str]

    @property
    def head_dim(self):
        return self.n_embd // self.n_head

    @property
    def padded_vocab_size(self):
        return padded_vocab(self.vocab_size)

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

