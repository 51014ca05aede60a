"""The Hugging Face families of the architecture description (:mod:`zerotopo.placement.architecture`):
one entry each, with its ``model_type`` and class, how it names a model's tensors, the ``config.json``
keys it reads and writes and the model-config field each carries, the values it fixes, and the marks by
which a model is recognized as it on export. The one adapter (:mod:`zerotopo.models.hf_config`) reads and
writes every ``config.json`` from these entries; a family that is another with switches fixed is one
:func:`refine` entry."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any


class _Marker:
    """A named marker value of the family table (shown by its name)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


REQUIRED = _Marker("REQUIRED")
"""An :class:`HFKey` default: the key must be in the ``config.json``."""
SET = _Marker("SET")
"""A value of :attr:`HFFamily.marks`: the field is anything but None."""


@dataclass(frozen=True)
class HFKey:
    """One ``config.json`` key of a Hugging Face family and the model-config field it carries."""

    key: str
    """The key as ``config.json`` spells it."""
    field: str | None
    """The model-config field it sets when read and is written from (None: a check or a constant)."""
    kind: str
    """How its value converts, a key of the adapter's ``KINDS``
    (:mod:`zerotopo.models.hf_config`): ``int``, ``float``, ``bool``, ``rope``, ``window`` ..."""
    default: Any = REQUIRED
    """Read when the key is absent (:data:`REQUIRED`: its absence is an error); a ``const`` key's value."""


@dataclass(frozen=True)
class HFFamily:
    """One Hugging Face architecture: its class, how it names a model's tensors, the ``config.json`` keys
    it reads and writes, the values it fixes, and how a model is recognized as it on export."""

    name: str
    """Its name in messages (``Llama``)."""
    architecture: str
    """The ``architectures`` entry of its ``config.json`` (``LlamaForCausalLM``)."""
    top: dict[str, str]
    """zerotopo parameter -> Hugging Face tensor, for the embedding and head."""
    layer_prefix: str
    """What comes before a layer's index (``model.layers.``)."""
    layer: dict[str, str] = field(default_factory=dict)
    """zerotopo module in a layer -> Hugging Face module, where they differ."""
    split_qkv: tuple[str, str, str] | None = None
    """The q, k and v projections the fused ``query_key_value`` is cut into; None: one fused tensor."""
    keys: tuple[HFKey, ...] = ()
    """The ``config.json`` keys, in the order they are written; each carries one model-config field (or
    is a check or a constant). Every switch of
    :class:`~zerotopo.placement.architecture.Architecture` that no key carries and
    :attr:`fixes` does not name must be at its default to be written as this family."""
    fixes: dict[str, Any] = field(default_factory=dict)
    """Model-config field -> the value the family holds it at: reading sets it, writing requires it.
    None for a switch that follows another (``qkv_bias``) requires it to equal the one it follows (as
    the family fixes that one, or as the model has it)."""
    parent: str | None = None
    """The family this one refines (its ``model_type``); None for the family of every other model."""
    marks: tuple[dict[str, Any], ...] = ()
    """How a model of :attr:`parent` is recognized as this family on export: it matches any one of these
    sets of attribute values (:data:`SET`: not None). Siblings are tried in table order."""
    config_drop: tuple[str, ...] = ()
    """Keys read (as checks) but left out when writing, where the family's class has no use for them."""

    def keyed(self) -> set[str]:
        """The model-config fields a key carries."""
        return {k.field for k in self.keys if k.field is not None}


def refine(
    parent: str,
    name: str,
    architecture: str,
    *,
    marks: tuple[dict[str, Any], ...],
    fixes: dict[str, Any] | None = None,
    keys: tuple[HFKey, ...] = (),
    layer: dict[str, str] | None = None,
    config_drop: tuple[str, ...] = (),
) -> HFFamily:
    """A family that is the one of :data:`HF_FAMILIES` under ``parent`` with some switches fixed (their
    keys dropped), some fields keyed (their fixed values dropped; the keys written after the parent's),
    and some layer modules named otherwise: the one entry a family that differs only so needs."""
    base = HF_FAMILIES[parent]
    fixes = fixes or {}
    added = {k.field for k in keys}
    kept = tuple(k for k in base.keys if k.field not in fixes and k.field not in added)
    return replace(
        base,
        name=name,
        architecture=architecture,
        layer={**base.layer, **(layer or {})},
        keys=kept + keys,
        fixes={f: v for f, v in {**base.fixes, **fixes}.items() if f not in added},
        parent=parent,
        marks=marks,
        config_drop=base.config_drop + config_drop,
    )


def _keys(*spec: tuple[Any, ...]) -> tuple[HFKey, ...]:
    return tuple(HFKey(*s) for s in spec)


_SHAPE_KEYS = (
    ("vocab_size", "vocab_size", "int"),
    ("hidden_size", "hidden_size", "int"),
    ("num_hidden_layers", "num_layers", "int"),
    ("num_attention_heads", "num_attention_heads", "int"),
)
_NEOX = HFFamily(
    "GPT-NeoX",
    "GPTNeoXForCausalLM",
    top={
        "embed_in.weight": "gpt_neox.embed_in.weight",
        "head.final_layer_norm.weight": "gpt_neox.final_layer_norm.weight",
        "head.final_layer_norm.bias": "gpt_neox.final_layer_norm.bias",
        "head.embed_out.weight": "embed_out.weight",
    },
    layer_prefix="gpt_neox.layers.",
    keys=_keys(
        ("architectures", None, "architectures"),
        ("model_type", None, "model_type"),
        *_SHAPE_KEYS,
        ("intermediate_size", "intermediate_size", "ffn", None),
        ("rotary_pct", "rotary_pct", "rotary_pct", 0.25),
        ("rotary_emb_base", "rotary_emb_base", "rope_base", 10000),
        ("max_position_embeddings", "max_position_embeddings", "int", 2048),
        ("use_parallel_residual", "gpt_j_residual", "bool", True),
        ("layer_norm_eps", "layernorm_epsilon", "float", 1e-5),
        ("hidden_act", "gelu_approximate", "gelu", "gelu"),
        ("tie_word_embeddings", "tie_embeddings", "bool", False),
        ("attention_bias", "use_bias_in_attn_linear", "bool", True),
        ("initializer_range", "init_std", "float", 0.02),
        ("torch_dtype", None, "const", "float32"),
    ),
    fixes={
        "use_bias_in_norms": True,
        "use_bias_in_mlp": True,
        "rope_type": "default",
        "sliding_window": None,
        "qkv_bias": None,
        "norm": "layernorm",
        "gated_mlp": False,
        "activation": "gelu",
    },
)
_LLAMA = HFFamily(
    "Llama",
    "LlamaForCausalLM",
    top={
        "embed_in.weight": "model.embed_tokens.weight",
        "head.final_layer_norm.weight": "model.norm.weight",
        "head.embed_out.weight": "lm_head.weight",
    },
    layer_prefix="model.layers.",
    layer={
        "input_layernorm": "input_layernorm",
        "post_attention_layernorm": "post_attention_layernorm",
        "attention.dense": "self_attn.o_proj",
        "mlp.w1": "mlp.gate_proj",
        "mlp.w3": "mlp.up_proj",
        "mlp.w2": "mlp.down_proj",
    },
    split_qkv=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    keys=_keys(
        *_SHAPE_KEYS,
        ("num_key_value_heads", "num_kv_heads", "kv_heads", None),
        ("head_dim", None, "head_dim", None),
        ("intermediate_size", "intermediate_size", "ffn"),
        ("hidden_act", "activation", "activation", "silu"),
        ("max_position_embeddings", "max_position_embeddings", "int", 2048),
        ("rms_norm_eps", "rms_norm_epsilon", "float", 1e-6),
        ("rope_theta", "rotary_emb_base", "rope_theta", 10000),
        ("rope_parameters", "rope_type", "rope"),
        ("attention_bias", "use_bias_in_attn_linear", "bool", False),
        ("mlp_bias", "use_bias_in_mlp", "bool", False),
        ("tie_word_embeddings", "tie_embeddings", "bool", False),
        ("initializer_range", "init_std", "float", 0.02),
        ("torch_dtype", None, "const", "float32"),
        ("architectures", None, "architectures"),
        ("model_type", None, "model_type"),
        ("rope_scaling", None, "rope_scaling"),
        ("pretraining_tp", None, "pretraining_tp", 1),
    ),
    fixes={
        "norm": "rmsnorm",
        "use_bias_in_norms": False,
        "gated_mlp": True,
        "rotary_pct": 1.0,
        "gpt_j_residual": False,
        "qkv_bias": None,
        "sliding_window": None,
    },
    parent="gpt_neox",
    marks=({"norm": "rmsnorm"}, {"gated_mlp": True}, {"grouped_query": True}),
)

#: Hugging Face ``model_type`` -> its architecture. OLMo-2, Qwen2 and Mistral are Llama with switches
#: fixed (and OLMo-2's norms named for where they sit); :func:`refine` makes such an entry. On export
#: Llama's refinements are tried in this order (a window with q/k/v-only biases is Qwen2's).
HF_FAMILIES: dict[str, HFFamily] = {"gpt_neox": _NEOX, "llama": _LLAMA}
HF_FAMILIES["olmo2"] = refine(
    "llama",
    "OLMo-2",
    "Olmo2ForCausalLM",
    marks=({"qk_norm": True}, {"post_norm": True}),
    fixes={"use_bias_in_mlp": False, "qk_norm": True, "post_norm": True},
    layer={
        "input_layernorm": "post_attention_layernorm",  # post_norm: after attention
        "post_attention_layernorm": "post_feedforward_layernorm",  # and after the MLP
        "attention.q_norm": "self_attn.q_norm",
        "attention.k_norm": "self_attn.k_norm",
    },
    config_drop=("head_dim",),
)
HF_FAMILIES["qwen2"] = refine(
    "llama",
    "Qwen2",
    "Qwen2ForCausalLM",
    marks=({"has_qkv_bias": True, "use_bias_in_attn_linear": False},),
    fixes={"use_bias_in_attn_linear": False, "qkv_bias": True, "use_bias_in_mlp": False},
    keys=_keys(("sliding_window", "sliding_window", "layer_window", None)),
)
HF_FAMILIES["mistral"] = refine(
    "llama",
    "Mistral",
    "MistralForCausalLM",
    marks=({"sliding_window": SET},),
    fixes={"use_bias_in_attn_linear": False, "use_bias_in_mlp": False},
    keys=_keys(("sliding_window", "sliding_window", "window", None)),
)
