"""The unit description of a GPT-NeoX-style transformer, derived from its dimensions without building it.

One description serves everyone who counts: each unit (the embedding, each layer, the head) lists its
parameters with their names and shapes as the model registers them (bias and norm flags included), and its
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

import math
from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class ParamSpec:
    """One parameter of a unit, named as the model's module registers it (relative to the unit)."""

    name: str
    """E.g. ``attention.query_key_value.weight``."""
    shape: tuple[int, ...]
    """The tensor's shape."""
    matmul: bool = False
    """A weight matrix every token is multiplied by (2 FLOPs per element per token)."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def module(self) -> str:
        """The owning module's path inside the unit (``attention.dense`` for ``attention.dense.bias``)."""
        return self.name.rpartition(".")[0]


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


@dataclass(frozen=True)
class ModelShape:
    """The dimensions and switches that decide a model's units, memory and FLOPs (NeoX defaults)."""

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
    """MLP width (of each of the gate and up projections when gated); ``4·hidden_size`` when not given."""
    tied_embeddings: bool = False
    """Whether the output projection reuses the input embedding."""
    name: str = "model"
    """A label for tables."""
    num_kv_heads: int | None = None
    """Key/value heads (grouped-query attention); ``num_attention_heads`` when not given."""
    gated_mlp: bool = False
    """A gated MLP (SwiGLU: ``w2(act(w1·x) * w3·x)``, three matrices) instead of two matrices."""
    attention_bias: bool = True
    """Biases on the QKV and attention output projections."""
    qkv_bias: bool | None = None
    """Biases on the QKV projection alone (Qwen2); None: as ``attention_bias``."""
    mlp_bias: bool = True
    """Biases on the MLP projections."""
    norm_bias: bool = True
    """Biases (offsets) in the norms."""

    @property
    def ffn(self) -> int:
        return self.intermediate_size or 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    # -- the unit description ---------------------------------------------------------------------------

    def _norm(self, name: str) -> list[ParamSpec]:
        h = self.hidden_size
        return [ParamSpec(f"{name}.weight", (h,))] + (
            [ParamSpec(f"{name}.bias", (h,))] if self.norm_bias else []
        )

    @staticmethod
    def _linear(name: str, out: int, inp: int, bias: bool) -> list[ParamSpec]:
        return [ParamSpec(f"{name}.weight", (out, inp), matmul=True)] + (
            [ParamSpec(f"{name}.bias", (out,))] if bias else []
        )

    def embedding_unit(self) -> UnitSpec:
        return UnitSpec("embedding", (ParamSpec("weight", (self.vocab_size, self.hidden_size)),), 0.0)

    def layer_unit(self) -> UnitSpec:
        """One transformer layer, in the order ``NeoXLayer`` registers its parameters."""
        h, f, d = self.hidden_size, self.ffn, self.head_dim
        qkv_out = (self.num_attention_heads + 2 * self.kv_heads) * d
        params = self._norm("input_layernorm") + self._norm("post_attention_layernorm")
        qkv_bias = self.attention_bias if self.qkv_bias is None else self.qkv_bias
        params += self._linear("attention.query_key_value", qkv_out, h, qkv_bias)
        params += self._linear("attention.dense", h, self.num_attention_heads * d, self.attention_bias)
        if self.gated_mlp:
            params += self._linear("mlp.w1", f, h, self.mlp_bias) + self._linear(
                "mlp.w3", f, h, self.mlp_bias
            )
            params += self._linear("mlp.w2", h, f, self.mlp_bias)
        else:
            params += self._linear("mlp.dense_h_to_4h", f, h, self.mlp_bias)
            params += self._linear("mlp.dense_4h_to_h", h, f, self.mlp_bias)
        return UnitSpec(
            "layer", tuple(params), 2.0 * sum(p.numel for p in params if p.matmul) + self.attention_flops()
        )

    def attention_flops(self) -> float:
        """Forward FLOPs per token of the attention scores and context (``Q·Kᵀ`` and ``P·V``)."""
        return 4.0 * self.seq_length * self.num_attention_heads * self.head_dim

    def head_unit(self) -> UnitSpec:
        """Final norm and output projection (no projection of its own when tied to the embedding)."""
        h, V = self.hidden_size, self.vocab_size
        params = self._norm("final_layer_norm")
        if not self.tied_embeddings:
            params.append(ParamSpec("embed_out.weight", (V, h), matmul=True))
        return UnitSpec("head", tuple(params), 1.5 * V * h)

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
