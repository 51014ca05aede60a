"""The unit description of a GPT-NeoX-style transformer, derived from its dimensions without building it.

One description serves everyone who counts: each unit (the embedding, each layer, the head) lists its
parameters with their names and shapes as the model registers them, read from the modules of
:mod:`zerotopo.placement.architecture` (the one statement of each architecture and its switches), and its
forward FLOPs per token. The sharding engine flattens exactly those parameters (a test holds the model to
the description), the preflight memory check and the cost model size the units from it, and the trainer's
MFU and the cost model's compute time use its FLOPs, so a grouped-query KV projection, a gated (SwiGLU)
MLP or a bias-free layer is counted the same everywhere.

FLOPs follow the formula GPT-NeoX logs (Narayanan et al., 2021), term by term: 2 per weight-matrix element
per token, ``4·s·heads·head_dim`` per token for the attention scores and context, and ``1.5·V·h`` per token
for the logits (the formula's ``V/(16·L·h)`` term). For a GELU MLP of ``4·h`` with multi-head attention this
is ``24·B·s·L·h²·(1 + s/(6h) + V/(16·L·h))`` for the forward pass; three times that for forward plus
backward, four times with activation checkpointing (the forward runs twice).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from zerotopo.placement.architecture import Architecture, ModuleSpec, ParamSpec

__all__ = ["ModelShape", "ModuleSpec", "ParamSpec", "UnitSpec"]


@dataclass(frozen=True)
class UnitSpec:
    """One sharding unit: its parameters in registration order and its forward FLOPs per token."""

    name: str
    """``embedding``, ``layer`` or ``head``."""
    params: tuple[ParamSpec, ...]
    """The parameters the engine flattens into this unit's buffer, in the model's order."""
    flops_per_token: float
    """Forward FLOPs per token at the shape's sequence length."""

    @property
    def numel(self) -> int:
        return sum(p.numel for p in self.params)


def _params(modules: list[ModuleSpec]) -> list[ParamSpec]:
    return [p for m in modules for p in m.params()]


@dataclass(frozen=True, kw_only=True)
class ModelShape(Architecture):
    """An :class:`~zerotopo.placement.architecture.Architecture` at a sequence length: its units, memory
    and FLOPs (NeoX defaults)."""

    seq_length: int
    """Tokens per sample ``s``."""
    name: str = "model"
    """A label for tables."""

    @property
    def ffn(self) -> int:
        return self.ffn_size

    # -- the unit description ---------------------------------------------------------------------------

    def embedding_unit(self) -> UnitSpec:
        return UnitSpec("embedding", tuple(_params(self.embedding_modules())), 0.0)

    def layer_unit(self) -> UnitSpec:
        """One transformer layer, in the order ``NeoXLayer`` registers its parameters."""
        params = _params(self.layer_modules())
        return UnitSpec(
            "layer", tuple(params), 2.0 * sum(p.numel for p in params if p.matmul) + self.attention_flops()
        )

    def attention_flops(self) -> float:
        """Forward FLOPs per token of the attention scores and context (``Q·Kᵀ`` and ``P·V``)."""
        return 4.0 * self.seq_length * self.num_attention_heads * self.head_dim

    def head_unit(self) -> UnitSpec:
        """Final norm and output projection (no projection of its own when tied to the embedding)."""
        return UnitSpec("head", tuple(_params(self.head_modules())), 1.5 * self.vocab_size * self.hidden_size)

    def units(self) -> list[UnitSpec]:
        """The engine's units in order: embedding, each layer, head."""
        return [self.embedding_unit()] + [self.layer_unit()] * self.num_layers + [self.head_unit()]

    # -- counts (all from the description) ---------------------------------------------------------------

    def layer_params(self) -> int:
        """Parameters of one transformer layer."""
        return self.layer_unit().numel

    def embedding_params(self) -> int:
        return self.embedding_unit().numel

    def head_params(self) -> int:
        """Final norm plus the output projection (none when tied to the embedding)."""
        return self.head_unit().numel

    def unit_params(self) -> list[int]:
        """Parameter counts of the default sharding units: embedding, each layer, head."""
        return [u.numel for u in self.units()]

    def param_count(self) -> int:
        return sum(self.unit_params())

    def forward_flops(self, batch_size: int) -> float:
        """Forward FLOPs for ``batch_size`` samples of ``seq_length`` tokens."""
        return float(batch_size) * self.seq_length * self._flops_per_token

    @cached_property
    def _flops_per_token(self) -> float:
        # computed once per shape: the planner asks for it once per candidate
        return self.num_layers * self.layer_unit().flops_per_token + self.head_unit().flops_per_token

    def step_flops(self, batch_size: int, *, checkpoint_activations: bool = False) -> float:
        """Forward + backward FLOPs (×3), or ×4 when activations are recomputed."""
        return self.forward_flops(batch_size) * (4.0 if checkpoint_activations else 3.0)

    def activation_bytes_per_layer(self, micro_batch: int, *, bytes_per_value: int = 2) -> float:
        """Activation memory of one layer for a micro-batch (Korthikanti et al. 2022, no sequence
        parallelism, flash attention so no ``a·s²`` term): ``s·b·h·34`` bytes at 16-bit."""
        return 34.0 * self.seq_length * micro_batch * self.hidden_size * bytes_per_value / 2.0
