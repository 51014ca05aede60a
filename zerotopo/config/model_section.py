"""The ``model`` section of the config tree: the model's shape, architecture switches and init."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from zerotopo.config import checks as c
from zerotopo.config.section import Section, setting
from zerotopo.errors import ConfigError
from zerotopo.models.config import INIT_METHODS, NeoXConfig, mlp_width
from zerotopo.placement.shape import ModelShape


@dataclass(frozen=True)
class ModelConfig(Section):
    """The model's shape, architecture switches and initialization."""

    NAME: ClassVar[str] = "model"

    num_layers: int = setting(c.integer(1, 10_000), 4)
    """Transformer layers."""
    hidden_size: int = setting(c.integer(1, 1 << 20), 128)
    """Model width; a multiple of ``num_attention_heads``."""
    num_attention_heads: int = setting(c.integer(1, 1 << 16), 4)
    """Attention heads."""
    intermediate_size: int | None = setting(c.optional(c.integer(1, 1 << 22)))
    """MLP width; ``4·hidden_size`` when not set. With ``mlp_type: llama`` the gate/up width (``8h/3``
    rounded up to ``mlp_multiple_of`` when not set); with ``activation: swiglu`` the ungated width that NeoX
    scales by 2/3 and splits between gate and up (see :func:`zerotopo.models.config.mlp_width`)."""
    mlp_multiple_of: int | None = setting(c.optional(c.integer(1, 1 << 20)))
    """The MLP width is rounded up to a multiple of this (NeoX: 256 for ``mlp_type: llama``, else 1)."""
    mlp_type: str = setting(c.choice("regular", "llama"), "regular")
    """``regular`` (two matrices) or ``llama``: NeoX's gated ``LLaMAParallelMLP``, ``w2(act(w1·x) * w3·x)``,
    without biases unless ``use_bias_in_mlp: true`` is given."""
    num_kv_heads: int | None = setting(c.optional(c.integer(1, 1 << 16)))
    """Key/value heads: grouped-query attention (1: multi-query); ``num_attention_heads`` when not set."""
    seq_length: int = setting(c.integer(1, 1 << 24), 128)
    """Tokens per training sample."""
    max_position_embeddings: int | None = setting(c.optional(c.integer(1, 1 << 24)))
    """Longest supported sequence; ``seq_length`` when not set, and never below it."""
    pos_emb: str = setting(
        c.const("rotary", "zerotopo's NeoX model uses rotary position embeddings"), "rotary"
    )
    """Position embedding; only ``rotary``."""
    rotary_pct: float = setting(c.number(0.0, 1.0), 1.0)
    """Fraction of each head's dimensions that get rotary embeddings (NeoX's default 1.0: all; Pythia and
    NeoX-20B set 0.25)."""
    rotary_emb_base: int = setting(c.integer(1), 10000)
    """Base of the rotary frequencies."""
    gpt_j_residual: bool = setting(c.boolean, False)
    """Parallel attention+MLP residual (NeoX-20B, Pythia); NeoX's default is sequential."""
    norm: str = setting(c.choice("layernorm", "rmsnorm"), "layernorm")
    """Normalization: ``layernorm`` or ``rmsnorm`` (Llama's)."""
    layernorm_epsilon: float = setting(c.number(0.0, 1.0, lo_open=True), 1e-5)
    """LayerNorm epsilon."""
    rms_norm_epsilon: float = setting(c.number(0.0, 1.0, lo_open=True), 1e-8)
    """RMSNorm epsilon (NeoX's default 1e-8; Llama 1e-6)."""
    use_bias_in_norms: bool = setting(c.boolean, True)
    """Biases (offsets) in the norms."""
    bias_gelu_fusion: bool = setting(c.boolean, False)
    """NeoX's fused bias+GELU kernel, which computes the tanh approximation; here it selects that GELU."""
    activation: str = setting(c.choice("gelu", "silu", "swiglu"), "gelu")
    """MLP activation: ``gelu``, ``silu`` (gated with ``mlp_type: llama``: SwiGLU) or ``swiglu`` (NeoX's
    gated SiLU on the regular MLP)."""
    use_bias_in_attn_linear: bool = setting(c.boolean, True)
    """Biases on the QKV and attention output projections."""
    use_bias_in_mlp: bool = setting(c.boolean, True)
    """Biases on the MLP projections."""
    qk_norm: bool = setting(c.boolean, False)
    """OLMo-2's QK-norm: ``norm`` over the whole query and key projections before rotary (not NeoX's
    per-head ``use_qk_layernorm``)."""
    post_norm: bool = setting(c.boolean, False)
    """OLMo-2's norm placement: each layer's norms on the outputs of attention and MLP instead of their
    inputs."""
    vocab_multiple_of: int = setting(c.integer(1, 1 << 20), 128)
    """The tokenizer's vocabulary is padded up to a multiple of this (fast matmuls)."""
    no_weight_tying: bool = setting(c.boolean, True)
    """Untied input and output embeddings. NeoX's own default is False (tied), but every released
    NeoX/Pythia config sets it true, so zerotopo defaults to untied. False (tied) trains: the shared matrix
    is sharded once, in the embedding's unit, and the head gathers it from there."""
    init_method: str = setting(c.choice(*INIT_METHODS), "normal")
    """Init of embeddings, QKV and the first MLP projection: normal | scaled_normal | small_init | wang_init."""
    output_layer_init_method: str = setting(c.choice(*INIT_METHODS), "scaled_normal")
    """Init of the attention output and second MLP projections."""
    init_method_std: float = setting(c.number(0.0, 1.0, lo_open=True), 0.02)
    """Standard deviation of the ``normal`` / ``scaled_normal`` inits."""
    hidden_dropout: float = setting(c.const(0, "dropout is not implemented (NeoX's large configs set 0)"), 0)
    """Dropout after attention and MLP; only 0."""
    attention_dropout: float = setting(
        c.const(0, "dropout is not implemented (NeoX's large configs set 0)"), 0
    )
    """Dropout on attention probabilities; only 0."""
    checkpoint_activations: bool = setting(c.boolean, False)
    """Recompute each layer's activations in the backward pass (one layer per checkpoint)."""

    def check(self) -> None:
        """Width and heads, rotary dimensions, positions, and the architecture switches that zerotopo
        cannot honour together."""
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                f"{self.num_attention_heads}; pick a head count that divides the width",
                **self._first("hidden_size", "num_attention_heads", key="hidden_size"),
            )
        self._check_architecture()
        head_dim = self.hidden_size // self.num_attention_heads
        if int(head_dim * self.rotary_pct) % 2:
            raise ConfigError(
                f"{self.rotary_pct} rotates {int(head_dim * self.rotary_pct)} of {head_dim} head dims; rotary "
                "needs an even count, pick a rotary_pct that gives one",
                **self.where("rotary_pct"),
            )
        if self.max_position_embeddings is not None and self.max_position_embeddings < self.seq_length:
            raise ConfigError(
                f"{self.max_position_embeddings} is below seq_length {self.seq_length}; raise it to at least "
                "seq_length",
                **self.where("max_position_embeddings"),
            )

    def _check_architecture(self) -> None:
        """Architecture switches whose combination zerotopo cannot honour, refused naming the key."""
        if self.num_kv_heads is not None and self.num_attention_heads % self.num_kv_heads:
            raise ConfigError(
                f"{self.num_kv_heads} does not divide num_attention_heads {self.num_attention_heads}; "
                "num_kv_heads takes a divisor of the head count (1: multi-query attention, num_attention_heads: "
                "multi-head)",
                **self.where("num_kv_heads"),
            )
        if self.mlp_type == "llama" and self.activation == "swiglu":
            raise ConfigError(
                "activation swiglu with mlp_type llama would gate twice; with mlp_type llama set activation to "
                "silu (SwiGLU) or gelu, or keep activation swiglu with mlp_type regular (NeoX's newer form)",
                **self._first("activation", "mlp_type", key="activation"),
            )
        if self.bias_gelu_fusion and self.activation != "gelu":
            raise ConfigError(
                f"true selects the tanh-approximate GELU, but activation is {self.activation}; "
                "bias_gelu_fusion takes true only with activation gelu (false with silu or swiglu)",
                **self.where("bias_gelu_fusion"),
            )

    def _first(self, *names: str, key: str) -> dict[str, str | None]:
        """The file of the first of ``names`` that was given, with the error's key ``key``."""
        source = next((self.where(n)["source"] for n in names if self.is_given(n)), None)
        return {"source": source, "key": self.where(key)["key"]}

    def padded_vocab(self, vocab_size: int) -> int:
        """The tokenizer's vocabulary rounded up to a multiple of ``vocab_multiple_of``."""
        m = self.vocab_multiple_of
        return -(-vocab_size // m) * m

    def mlp_style(self) -> str:
        """``regular``, ``llama`` (``mlp_type: llama``) or ``gated`` (``activation: swiglu``)."""
        return "llama" if self.mlp_type == "llama" else "gated" if self.activation == "swiglu" else "regular"

    def model_config(self, vocab_size: int) -> NeoXConfig:
        """The model for a tokenizer of ``vocab_size`` tokens (padded here)."""
        style = self.mlp_style()
        width = self.intermediate_size
        if style != "regular" or self.mlp_multiple_of:
            width = mlp_width(self.hidden_size, self.intermediate_size, self.mlp_multiple_of, style)
        # NeoX's LLaMAParallelMLP has no biases; an explicit use_bias_in_mlp still wins
        mlp_bias = self.use_bias_in_mlp if style != "llama" or self.is_given("use_bias_in_mlp") else False
        return NeoXConfig(
            vocab_size=self.padded_vocab(vocab_size),
            hidden_size=self.hidden_size,
            num_layers=self.num_layers,
            num_attention_heads=self.num_attention_heads,
            intermediate_size=width,
            norm=self.norm,
            rms_norm_epsilon=self.rms_norm_epsilon,
            use_bias_in_norms=self.use_bias_in_norms,
            activation="silu" if self.activation == "swiglu" else self.activation,
            gated_mlp=style != "regular",
            num_kv_heads=self.num_kv_heads,
            max_position_embeddings=self.max_position_embeddings or self.seq_length,
            rotary_pct=self.rotary_pct,
            rotary_emb_base=self.rotary_emb_base,
            gpt_j_residual=self.gpt_j_residual,
            layernorm_epsilon=self.layernorm_epsilon,
            use_bias_in_attn_linear=self.use_bias_in_attn_linear,
            use_bias_in_mlp=mlp_bias,
            qk_norm=self.qk_norm,
            post_norm=self.post_norm,
            gelu_approximate=self.bias_gelu_fusion,
            tie_embeddings=not self.no_weight_tying,
            init_method=self.init_method,
            output_layer_init_method=self.output_layer_init_method,
            init_std=self.init_method_std,
            checkpoint_activations=self.checkpoint_activations,
        )

    def model_shape(self, vocab_size: int, name: str = "neox") -> ModelShape:
        """The :class:`ModelShape` for the cost model, without building the model."""
        return self.model_config(vocab_size).shape(self.seq_length, name=name)
