"""The GPT-NeoX model configuration: plain data, no torch, so configs and plans load in milliseconds."""

from __future__ import annotations

from dataclasses import dataclass, fields

from zerotopo.placement.architecture import Architecture
from zerotopo.placement.shape import ModelShape

INIT_METHODS = ("normal", "scaled_normal", "small_init", "wang_init")
NORMS = ("layernorm", "rmsnorm")
ACTIVATIONS = ("gelu", "silu")
ROPE_TYPES = ("default", "llama3")


#: Fields added after runs were first saved, with the value every earlier run had: a run's identity
#: (:func:`model_identity`) leaves them out at that value, so checkpoints written before they existed resume.
LATER_FIELDS: dict[str, object] = {
    **Architecture.later_fields(),
    "rope_type": "default",
    "rope_factor": 1.0,
    "rope_low_freq_factor": 1.0,
    "rope_high_freq_factor": 4.0,
    "rope_original_max_position": 8192,
    "sliding_window": None,
}


def model_identity(cfg: NeoXConfig) -> dict[str, object]:
    """The fields that make two runs' models the same model (``checkpoint_activations`` and
    :data:`LATER_FIELDS` at their earlier value left out)."""
    from dataclasses import asdict

    return {
        k: v
        for k, v in asdict(cfg).items()
        if k != "checkpoint_activations" and not (k in LATER_FIELDS and v == LATER_FIELDS[k])
    }


def mlp_width(hidden_size: int, intermediate_size: int | None, multiple_of: int | None, style: str) -> int:
    """The MLP width (of each gate/up projection when gated) as GPT-NeoX derives it.

    ``style`` ``regular``: ``intermediate_size`` or ``4·h``, rounded up to ``multiple_of``. ``llama``
    (NeoX's ``LLaMAParallelMLP``, ``mlp_type: llama``): ``intermediate_size`` as given, else ``8h/3`` rounded
    up to ``multiple_of`` (256 when unset): 11008 for ``h`` = 4096. ``gated`` (NeoX's ``ParallelMLP`` with
    ``activation: swiglu``): ``intermediate_size`` (default ``4h``) names the ungated width; two thirds of
    it are split between gate and up and each half is rounded up to ``multiple_of``: 32768 gives 11008.
    """
    m = multiple_of or (256 if style == "llama" else 1)

    def up(n: int) -> int:
        return -(-n // m) * m

    if style == "llama":
        return intermediate_size or up(int(2 * hidden_size * 4 / 3))
    ffn = intermediate_size or 4 * hidden_size
    if style == "gated":
        return up(int(ffn * 2 / 3) // 2)
    if style != "regular":
        raise ValueError(f"MLP style {style!r}; expected regular, llama or gated")
    return up(ffn)


@dataclass(frozen=True, kw_only=True)
class NeoXConfig(Architecture):
    """Hyperparameters of a GPT-NeoX model (names follow the NeoX YAML keys): its
    :class:`~zerotopo.placement.architecture.Architecture` (dimensions and the switches that decide its
    parameters) and what the forward computes and how it is initialized."""

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
    gelu_approximate: bool = False
    """Tanh-approximate GELU, which NeoX's fused ``bias_gelu_fusion`` kernel computes; False: exact erf GELU."""
    init_method: str = "normal"
    """Init of the embeddings, ``query_key_value`` and ``dense_h_to_4h``: normal | scaled_normal |
    small_init | wang_init."""
    output_layer_init_method: str = "scaled_normal"
    """Init of the layers' output projections (``attention.dense``, ``mlp.dense_4h_to_h``)."""
    init_std: float = 0.02
    """Standard deviation of the ``normal`` and ``scaled_normal`` inits."""
    checkpoint_activations: bool = False
    """Recompute each layer's activations in the backward pass instead of storing them."""
    norm: str = "layernorm"
    """``layernorm`` (GPT-NeoX, Pythia) or ``rmsnorm`` (Llama: ``x·rsqrt(mean(x²) + eps)·weight``)."""
    rms_norm_epsilon: float = 1e-8
    """Epsilon of every RMSNorm (NeoX's default 1e-8; Llama uses 1e-6 or 1e-5)."""
    activation: str = "gelu"
    """The MLP's activation: ``gelu`` or ``silu`` (with ``gated_mlp``: SwiGLU)."""
    rope_type: str = "default"
    """Rotary frequencies: ``default`` (``base^(-2i/d)``) or ``llama3`` (Llama 3.1's rescaling of the low
    and middle frequencies by ``rope_factor``, from ``rope_low_freq_factor``, ``rope_high_freq_factor`` and
    ``rope_original_max_position``)."""
    rope_factor: float = 1.0
    """``llama3``: the factor the lowest frequencies are divided by (8 in Llama 3.1, 32 in Llama 3.2)."""
    rope_low_freq_factor: float = 1.0
    """``llama3``: wavelengths above ``rope_original_max_position / rope_low_freq_factor`` are scaled."""
    rope_high_freq_factor: float = 4.0
    """``llama3``: wavelengths below ``rope_original_max_position / rope_high_freq_factor`` are kept; the
    band between is interpolated."""
    rope_original_max_position: int = 8192
    """``llama3``: the context length the model was pretrained with before the rescaling."""
    sliding_window: int | None = None
    """Each position attends to itself and the ``sliding_window - 1`` positions before it (Mistral);
    None: every earlier position. A window at least the sequence length computes full causal attention."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                f"{self.num_attention_heads}; pick a head count that divides it"
            )
        for name in ("init_method", "output_layer_init_method"):
            if getattr(self, name) not in INIT_METHODS:
                raise ValueError(f"{name}={getattr(self, name)!r}; expected one of {', '.join(INIT_METHODS)}")
        if self.norm not in NORMS:
            raise ValueError(f"norm={self.norm!r}; expected one of {', '.join(NORMS)}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation={self.activation!r}; expected one of {', '.join(ACTIVATIONS)}")
        if self.num_attention_heads % self.kv_heads:
            raise ValueError(
                f"num_kv_heads={self.num_kv_heads} does not divide num_attention_heads "
                f"{self.num_attention_heads}; pick a divisor (1 is multi-query attention)"
            )
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"rope_type={self.rope_type!r}; expected one of {', '.join(ROPE_TYPES)}")
        if self.rope_type == "llama3" and not (
            self.rope_factor > 0 and 0 < self.rope_low_freq_factor < self.rope_high_freq_factor
        ):
            raise ValueError(
                f"llama3 rope scaling needs factor > 0 and 0 < low_freq_factor < high_freq_factor, got "
                f"factor={self.rope_factor}, low_freq_factor={self.rope_low_freq_factor}, "
                f"high_freq_factor={self.rope_high_freq_factor}"
            )
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window={self.sliding_window}; expected a positive width or None")
        if not 0.0 <= self.rotary_pct <= 1.0:
            raise ValueError(f"rotary_pct={self.rotary_pct}; expected a fraction in [0, 1]")
        if self.rotary_ndims % 2:
            raise ValueError(
                f"rotary_pct={self.rotary_pct} rotates {self.rotary_ndims} of {self.head_dim} head dims; "
                "rotary needs an even count, pick a rotary_pct that gives one"
            )

    @property
    def norm_epsilon(self) -> float:
        return self.rms_norm_epsilon if self.norm == "rmsnorm" else self.layernorm_epsilon

    @property
    def rotary_ndims(self) -> int:
        """Leading dimensions of each head that are rotated (NeoX truncates, as here)."""
        return int(self.head_dim * self.rotary_pct)

    def shape(self, seq_length: int, name: str = "neox") -> ModelShape:
        """The :class:`ModelShape` the cost model and planner use for this model."""
        arch = {f.name: getattr(self, f.name) for f in fields(Architecture)}
        arch.update(intermediate_size=self.ffn_size, num_kv_heads=self.kv_heads, qkv_bias=self.has_qkv_bias)
        return ModelShape(**arch, seq_length=seq_length, name=name)
