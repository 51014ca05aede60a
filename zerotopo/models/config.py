"""The GPT-NeoX model configuration: plain data, no torch, so configs and plans load in milliseconds."""

from __future__ import annotations

from dataclasses import dataclass

from zerotopo.models.shape import ModelShape

INIT_METHODS = ("normal", "scaled_normal", "small_init", "wang_init")


@dataclass
class NeoXConfig:
    """Hyperparameters of a GPT-NeoX model (names follow the NeoX YAML keys)."""

    vocab_size: int
    """Rows of the embedding and the output projection (already padded, see ``NeoXArgs.padded_vocab``)."""
    hidden_size: int
    """Model width ``h``."""
    num_layers: int
    """Transformer layers ``L``."""
    num_attention_heads: int
    """Attention heads; ``hidden_size`` must be a multiple."""
    intermediate_size: int | None = None
    """MLP width; ``4·hidden_size`` when None."""
    max_position_embeddings: int = 2048
    """Longest sequence the model is meant for (recorded for Hugging Face's config; rotary tables are
    computed for the actual length)."""
    rotary_pct: float = 0.25
    """Fraction of each head's dimensions that get rotary embeddings (NeoX/Pythia: 0.25)."""
    rotary_emb_base: int = 10000
    """Base of the rotary frequencies."""
    gpt_j_residual: bool = True
    """Parallel residual ``x + attn(ln1(x)) + mlp(ln2(x))`` (NeoX-20B, Pythia); False: sequential."""
    layernorm_epsilon: float = 1e-5
    """Epsilon of every LayerNorm."""
    use_bias_in_attn_linear: bool = True
    """Biases on ``query_key_value`` and ``attention.dense``."""
    use_bias_in_mlp: bool = True
    """Biases on ``dense_h_to_4h`` and ``dense_4h_to_h``."""
    gelu_approximate: bool = False
    """Tanh-approximate GELU, which NeoX's fused ``bias_gelu_fusion`` kernel computes; False: exact erf GELU."""
    tie_embeddings: bool = False
    """The head's projection reuses ``embed_in.weight`` (one shared Parameter). NeoX default: untied."""
    init_method: str = "normal"
    """Init of the embeddings, ``query_key_value`` and ``dense_h_to_4h``: normal | scaled_normal |
    small_init | wang_init."""
    output_layer_init_method: str = "scaled_normal"
    """Init of the layers' output projections (``attention.dense``, ``mlp.dense_4h_to_h``)."""
    init_std: float = 0.02
    """Standard deviation of the ``normal`` and ``scaled_normal`` inits."""
    checkpoint_activations: bool = False
    """Recompute each layer's activations in the backward pass instead of storing them."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                f"{self.num_attention_heads}; pick a head count that divides it"
            )
        for name in ("init_method", "output_layer_init_method"):
            if getattr(self, name) not in INIT_METHODS:
                raise ValueError(f"{name}={getattr(self, name)!r}; expected one of {', '.join(INIT_METHODS)}")
        if not 0.0 <= self.rotary_pct <= 1.0:
            raise ValueError(f"rotary_pct={self.rotary_pct}; expected a fraction in [0, 1]")
        if self.rotary_ndims % 2:
            raise ValueError(
                f"rotary_pct={self.rotary_pct} rotates {self.rotary_ndims} of {self.head_dim} head dims; "
                "rotary needs an even count, pick a rotary_pct that gives one"
            )

    @property
    def ffn_size(self) -> int:
        return self.intermediate_size or 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def rotary_ndims(self) -> int:
        """Leading dimensions of each head that are rotated (NeoX truncates, as here)."""
        return int(self.head_dim * self.rotary_pct)

    def shape(self, seq_length: int, name: str = "neox") -> ModelShape:
        """The :class:`ModelShape` the cost model and planner use for this model."""
        return ModelShape(
            num_layers=self.num_layers,
            hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads,
            seq_length=seq_length,
            vocab_size=self.vocab_size,
            intermediate_size=self.ffn_size,
            tied_embeddings=self.tie_embeddings,
            name=name,
        )
