"""Model shapes, parameter counts and FLOPs of GPT-NeoX-style transformers, without building a model.

The cost model and the planner work from a :class:`ModelShape` alone, so a 20B plan is costed in
milliseconds on a laptop. FLOPs follow the formula GPT-NeoX logs (Narayanan et al., 2021):
``24·B·s·L·h²·(1 + s/(6h) + V/(16·L·h))`` for the forward pass, three times that for forward plus
backward, four times with activation checkpointing (the forward runs twice).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    """The dimensions that decide a NeoX model's memory and FLOPs."""

    num_layers: int
    """Transformer layers ``L``."""
    hidden_size: int
    """Model width ``h``."""
    num_attention_heads: int
    """Attention heads; ``hidden_size`` must be a multiple."""
    seq_length: int
    """Tokens per sample ``s``."""
    vocab_size: int
    """Vocabulary ``V`` as the embedding holds it (NeoX pads it to a multiple of 128)."""
    intermediate_size: int | None = None
    """MLP width; ``4·hidden_size`` when not given."""
    tied_embeddings: bool = False
    """Whether the output projection reuses the input embedding."""
    name: str = "model"
    """A label for tables."""

    @property
    def ffn(self) -> int:
        return self.intermediate_size or 4 * self.hidden_size

    def layer_params(self) -> int:
        """Parameters of one transformer layer: QKV, output projection, MLP, two LayerNorms, with biases."""
        h, f = self.hidden_size, self.ffn
        return (3 * h * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h) + 4 * h

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def head_params(self) -> int:
        """Final LayerNorm plus the output projection (none when tied to the embedding)."""
        return 2 * self.hidden_size + (0 if self.tied_embeddings else self.vocab_size * self.hidden_size)

    def unit_params(self) -> list[int]:
        """Parameter counts of the default sharding units: embedding, each layer, head."""
        return [self.embedding_params()] + [self.layer_params()] * self.num_layers + [self.head_params()]

    def param_count(self) -> int:
        return sum(self.unit_params())

    def forward_flops(self, batch_size: int) -> float:
        """Forward FLOPs for ``batch_size`` samples of ``seq_length`` tokens (NeoX/Megatron formula)."""
        B, s, L, h, V = batch_size, self.seq_length, self.num_layers, self.hidden_size, self.vocab_size
        return 24.0 * B * s * L * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * L * h))

    def step_flops(self, batch_size: int, *, checkpoint_activations: bool = False) -> float:
        """Forward + backward FLOPs (×3), or ×4 when activations are recomputed."""
        return self.forward_flops(batch_size) * (4.0 if checkpoint_activations else 3.0)

    def activation_bytes_per_layer(self, micro_batch: int, *, bytes_per_value: int = 2) -> float:
        """Activation memory of one layer for a micro-batch (Korthikanti et al. 2022, no sequence
        parallelism, flash attention so no ``a·s²`` term): ``s·b·h·34`` bytes at 16-bit."""
        return 34.0 * self.seq_length * micro_batch * self.hidden_size * bytes_per_value / 2.0
