"""The one description of a transformer's architecture: dimensions, switches, each unit's modules and
their names in Hugging Face and GPT-NeoX checkpoints.

Everything that depends on which parameters a model has reads this module and nothing else: the
``nn.Module`` builds each projection and norm from :meth:`Architecture.layer_modules` (shapes and biases),
the cost model's unit list (:class:`~zerotopo.placement.shape.ModelShape`) counts the same modules, and
the Hugging Face and GPT-NeoX name mapping (:meth:`Architecture.hf_segments`,
:func:`neox_name` and their inverses) reads the tables :data:`HF_FAMILIES` and :data:`NEOX_TOP`.
Each Hugging Face family is one entry of :data:`HF_FAMILIES`: its ``model_type`` and class, its tensor
names, its ``config.json`` keys and the field each carries, the values it fixes and how a model is
recognized as it on export; the one adapter (:mod:`zerotopo.models.hf_config`) reads and writes every
``config.json`` from that entry. A new switch is a field of :class:`Architecture` (with its NeoX key and
the earlier value runs saved before it existed had), its modules in :meth:`Architecture.layer_modules`
and, where a Hugging Face family holds it, a key or fixed value of that family's entry.

[Note: NeoX layout] With one key/value head per query head the fused ``query_key_value`` projection
produces, per token, ``heads`` groups of ``[q | k | v]`` each ``head_dim`` wide, which is GPT-NeoX's and
Hugging Face's ``GPTNeoXForCausalLM`` layout; with fewer key/value heads (grouped-query attention) it is
three blocks ``[q_all | k_all | v_all]``. Llama-family checkpoints hold ``q_proj``/``k_proj``/``v_proj``
apart, so their rows are cut from the fused matrix (:meth:`Architecture.hf_segments`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any


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
class ModuleSpec:
    """One module with parameters: a projection (``linear``), a ``norm`` or the token ``embedding``."""

    name: str
    """Its path inside the unit (``attention.dense``); empty for a unit that is the module itself."""
    kind: str
    """``linear`` (weight ``[out, in]``, every token multiplied by it), ``norm`` (weight ``[size]``) or
    ``embedding`` (weight ``[vocab, hidden]``, looked up)."""
    shape: tuple[int, ...]
    """The weight's shape."""
    bias: bool = False
    """Whether it has a bias (``[shape[0]]``)."""

    def params(self) -> list[ParamSpec]:
        """Its parameters in registration order: the weight, then the bias."""
        prefix = f"{self.name}." if self.name else ""
        out = [ParamSpec(f"{prefix}weight", self.shape, matmul=self.kind == "linear")]
        return out + ([ParamSpec(f"{prefix}bias", self.shape[:1])] if self.bias else [])


def _switch(
    default: Any, neox_key: str | None, hf: str, *, later: bool = False, follows: str | None = None
) -> Any:
    """A switch of :class:`Architecture`: its default, the NeoX YAML key that sets it (None: only a Hugging
    Face ``config.json`` does), where Hugging Face says it (for messages), whether it was added after
    runs were first saved (``later``: every such run had the default, and a run's identity leaves the
    switch out at that value, so their checkpoints resume) and the switch whose value a None stands for
    (``follows``)."""
    meta = {"neox_key": neox_key, "hf": hf, "later": later, "follows": follows}
    return field(default=default, metadata=meta)


@dataclass(frozen=True, kw_only=True)
class Architecture:
    """The dimensions and switches that decide a model's parameters (NeoX defaults), and the modules they
    make. :class:`~zerotopo.models.config.NeoXConfig` and :class:`~zerotopo.placement.shape.ModelShape`
    are both an ``Architecture``, so a switch is declared, spelled and defaulted once."""

    num_layers: int
    """Transformer layers ``L``."""
    hidden_size: int
    """Model width ``h``."""
    num_attention_heads: int
    """Attention heads; ``hidden_size`` must be a multiple."""
    vocab_size: int
    """Rows of the embedding and the output projection (NeoX pads the tokenizer's to a multiple of 128)."""
    intermediate_size: int | None = None
    """MLP width (of each of the gate and up projections when ``gated_mlp``); ``4·hidden_size`` when None."""
    num_kv_heads: int | None = None
    """Key/value heads (grouped-query attention; 1 is multi-query); ``num_attention_heads`` when None."""
    gated_mlp: bool = _switch(False, "mlp_type", "model_type (llama: gated)")
    """A gated MLP ``w2(act(w1·x) * w3·x)`` (NeoX's ``mlp_type: llama`` / ``activation: swiglu``), three
    matrices instead of two."""
    use_bias_in_attn_linear: bool = _switch(True, "use_bias_in_attn_linear", "attention_bias")
    """Biases on ``query_key_value`` and ``attention.dense``."""
    qkv_bias: bool | None = _switch(
        None, None, "model_type (qwen2)", later=True, follows="use_bias_in_attn_linear"
    )
    """Biases on ``query_key_value`` alone; None: as ``use_bias_in_attn_linear``. Qwen2 has them (true)
    with an unbiased output projection (``use_bias_in_attn_linear: false``)."""
    use_bias_in_mlp: bool = _switch(True, "use_bias_in_mlp", "mlp_bias")
    """Biases on the MLP projections."""
    use_bias_in_norms: bool = _switch(True, "use_bias_in_norms", "model_type (llama: none)")
    """Biases (offsets) in the norms; Llama has none."""
    tie_embeddings: bool = _switch(False, "no_weight_tying", "tie_word_embeddings")
    """The head's projection reuses the embedding matrix (one shared parameter)."""
    qk_norm: bool = _switch(False, "qk_norm", "model_type (olmo2: q_norm, k_norm)", later=True)
    """OLMo-2's QK-norm: the configured ``norm`` over the whole query projection (``heads·head_dim``) and
    the whole key projection (``kv_heads·head_dim``), before rotary (Team OLMo, "2 OLMo 2 Furious",
    arXiv:2501.00656)."""
    post_norm: bool = _switch(False, "post_norm", "model_type (olmo2)", later=True)
    """OLMo-2's norm placement: the layer's norms on the outputs of attention and MLP,
    ``x + norm(attn(x))``, instead of on their inputs (``input_layernorm`` then follows attention and
    ``post_attention_layernorm`` the MLP)."""

    @property
    def ffn_size(self) -> int:
        return self.intermediate_size or 4 * self.hidden_size

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def has_qkv_bias(self) -> bool:
        """Whether ``query_key_value`` has a bias (``qkv_bias``, else ``use_bias_in_attn_linear``)."""
        return self.use_bias_in_attn_linear if self.qkv_bias is None else self.qkv_bias

    @property
    def grouped_query(self) -> bool:
        """Fewer key/value heads than query heads (grouped-query or multi-query attention)."""
        return self.kv_heads != self.num_attention_heads

    def switch_value(self, name: str) -> Any:
        """Attribute ``name``, where it is a switch whose None follows another, that other's value
        (``qkv_bias`` None: ``use_bias_in_attn_linear``)."""
        value = getattr(self, name)
        follows = self.following(name)
        return getattr(self, follows) if value is None and follows else value

    @classmethod
    def following(cls, name: str) -> str | None:
        """The switch a None of switch ``name`` stands for, if any."""
        for f in cls.switches():
            if f.name == name:
                return f.metadata["follows"]
        return None

    # -- the modules of each unit, in registration order ----------------------------------------------

    def _norm(self, name: str, size: int | None = None) -> ModuleSpec:
        return ModuleSpec(name, "norm", (size or self.hidden_size,), self.use_bias_in_norms)

    def embedding_modules(self) -> list[ModuleSpec]:
        """The embedding unit: the token embedding itself."""
        return [ModuleSpec("", "embedding", (self.vocab_size, self.hidden_size))]

    def layer_modules(self) -> list[ModuleSpec]:
        """One transformer layer: its two norms, attention (fused QKV, output) and MLP."""
        h, f, d = self.hidden_size, self.ffn_size, self.head_dim
        qkv = ((self.num_attention_heads + 2 * self.kv_heads) * d, h)
        mods = [self._norm("input_layernorm"), self._norm("post_attention_layernorm")]
        mods.append(ModuleSpec("attention.query_key_value", "linear", qkv, self.has_qkv_bias))
        N = self.num_attention_heads
        mods.append(ModuleSpec("attention.dense", "linear", (h, N * d), self.use_bias_in_attn_linear))
        if self.qk_norm:
            mods += [self._norm("attention.q_norm", N * d), self._norm("attention.k_norm", self.kv_heads * d)]
        if self.gated_mlp:
            mlp = [("mlp.w1", (f, h)), ("mlp.w3", (f, h)), ("mlp.w2", (h, f))]  # gate, up, down
        else:
            mlp = [("mlp.dense_h_to_4h", (f, h)), ("mlp.dense_4h_to_h", (h, f))]
        return mods + [ModuleSpec(n, "linear", s, self.use_bias_in_mlp) for n, s in mlp]

    def head_modules(self) -> list[ModuleSpec]:
        """The head unit: the final norm and the output projection (none of its own when tied)."""
        mods = [self._norm("final_layer_norm")]
        if not self.tie_embeddings:
            mods.append(ModuleSpec("embed_out", "linear", (self.vocab_size, self.hidden_size)))
        return mods

    def module_spec(self, name: str) -> ModuleSpec:
        """The layer's module ``name`` (a KeyError naming the ones there are otherwise)."""
        for m in self.layer_modules() + self.head_modules():
            if m.name == name:
                return m
        raise KeyError(f"this architecture's layers and head have no module {name!r}")

    def model_params(self) -> dict[str, tuple[int, ...]]:
        """Every parameter of the whole model, named as ``GPTNeoX.named_parameters()`` names them (a tied
        output projection once, as the embedding's)."""
        out = {f"embed_in.{p.name}": p.shape for m in self.embedding_modules() for p in m.params()}
        for i in range(self.num_layers):
            out.update({f"layers.{i}.{p.name}": p.shape for m in self.layer_modules() for p in m.params()})
        out.update({f"head.{p.name}": p.shape for m in self.head_modules() for p in m.params()})
        return out

    # -- names in Hugging Face and GPT-NeoX checkpoints --------------------------------------------------

    def hf_segments(self, family: str, name: str, rows: int) -> list[tuple[str, int, int]]:
        """Where the ``rows`` rows of zerotopo parameter ``name`` are in a Hugging Face checkpoint of
        ``family`` (a key of :data:`HF_FAMILIES`): ``(hf_name, first_row, rows)`` runs in order."""
        fam = HF_FAMILIES[family]
        if name in fam.top:
            return [(fam.top[name], 0, rows)]
        prefix, _, rest = name.partition(".")
        index, _, rest = rest.partition(".")
        module, _, kind = rest.rpartition(".")
        if prefix != "layers" or not index.isdigit():
            raise KeyError(f"parameter {name!r} has no Hugging Face {family} name")
        base = f"{fam.layer_prefix}{index}."
        if module == "attention.query_key_value" and fam.split_qkv is not None:
            q, k, v = (f"{base}{p}.{kind}" for p in fam.split_qkv)
            N, K, D = self.num_attention_heads, self.kv_heads, self.head_dim
            if K == N:  # per head q|k|v, see [Note: NeoX layout]
                return [(t, n * D, D) for n in range(N) for t in (q, k, v)]
            return [(q, 0, N * D), (k, 0, K * D), (v, 0, K * D)]
        if fam.split_qkv is not None and module not in fam.layer:
            raise KeyError(f"parameter {name!r} has no Hugging Face {family} name")
        return [(f"{base}{fam.layer.get(module, module)}.{kind}", 0, rows)]

    def hf_shapes(self, family: str, shapes: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """The Hugging Face tensors (name -> shape) that zerotopo parameters of ``shapes`` become."""
        out: dict[str, tuple[int, ...]] = {}
        for name, shape in shapes.items():
            shape = tuple(int(s) for s in shape)
            for hf, row0, rows in self.hf_segments(family, name, shape[0]):
                out[hf] = (max(out.get(hf, (0,))[0], row0 + rows), *shape[1:])
        return out

    @classmethod
    def switches(cls) -> list[Any]:
        """The switch fields (each a :func:`_switch`), for messages and identities."""
        return [f for f in fields(cls) if "neox_key" in f.metadata]

    @classmethod
    def later_fields(cls) -> dict[str, Any]:
        """Switches added after runs were first saved, with the value every earlier run had."""
        return {f.name: f.default for f in cls.switches() if f.metadata["later"]}


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
    is a check or a constant). Every switch of :class:`Architecture` that no key carries and
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

#: GPT-NeoX's pipeline: the embedding is layer 0, a function without parameters layer 1, the transformer
#: layers follow from :data:`NEOX_FIRST_LAYER`, then a function, the final norm and the output head.
NEOX_FIRST_LAYER = 2
NEOX_TOP = {
    "embed_in.weight": (lambda L: 0, "word_embeddings.weight"),
    "head.final_layer_norm.weight": (lambda L: L + 3, "norm.weight"),
    "head.final_layer_norm.bias": (lambda L: L + 3, "norm.bias"),
    "head.embed_out.weight": (lambda L: L + 4, "final_linear.weight"),
}


def neox_name(name: str, num_layers: int) -> tuple[int, str]:
    """Zerotopo parameter ``name`` of a ``num_layers``-layer model as GPT-NeoX's pipeline stores it:
    ``(pipeline layer, key)``."""
    top = {z: (at(num_layers), key) for z, (at, key) in NEOX_TOP.items()}
    if name in top:
        return top[name]
    prefix, _, rest = name.partition(".")
    index, _, key = rest.partition(".")
    if prefix != "layers" or not index.isdigit():
        raise KeyError(f"parameter {name!r} has no GPT-NeoX name")
    return int(index) + NEOX_FIRST_LAYER, key


def from_neox(index: int, key: str, num_layers: int) -> str | None:
    """The zerotopo name of entry ``key`` of GPT-NeoX's pipeline layer ``index`` in a ``num_layers``-layer
    model (the inverse of :func:`neox_name`; the final norm and head are matched by key), or None."""
    if NEOX_FIRST_LAYER <= index < num_layers + NEOX_FIRST_LAYER:
        return f"layers.{index - NEOX_FIRST_LAYER}.{key}"
    for z, (_, neox_key) in NEOX_TOP.items():
        if key == neox_key and (index == 0 or z != "embed_in.weight"):
            return z
    return None
