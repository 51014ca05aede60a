"""The one description of a transformer's architecture: dimensions, switches, each unit's modules and
their names in Hugging Face and GPT-NeoX checkpoints.

Everything that depends on which parameters a model has reads this module and nothing else: the
``nn.Module`` builds each projection and norm from :meth:`Architecture.layer_modules` (shapes and biases),
the cost model's unit list (:class:`~zerotopo.placement.shape.ModelShape`) counts the same modules, and
the Hugging Face and GPT-NeoX name mapping (:meth:`Architecture.hf_segments`,
:func:`neox_name` and their inverses) reads the tables :data:`HF_FAMILIES` and :data:`NEOX_TOP`.
Each Hugging Face family is one entry of :data:`HF_FAMILIES` (:mod:`zerotopo.placement.hf_families`,
importable from here): its ``model_type`` and class, its tensor names, its ``config.json`` keys and the
field each carries, the values it fixes and how a model is recognized as it on export; the one adapter (:mod:`zerotopo.models.hf_config`) reads and writes every
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
from dataclasses import dataclass, field, fields
from typing import Any

from zerotopo.placement.hf_families import HF_FAMILIES as HF_FAMILIES
from zerotopo.placement.hf_families import REQUIRED as REQUIRED
from zerotopo.placement.hf_families import SET as SET
from zerotopo.placement.hf_families import HFFamily as HFFamily
from zerotopo.placement.hf_families import HFKey as HFKey
from zerotopo.placement.hf_families import refine as refine


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
