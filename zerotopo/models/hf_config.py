"""The one adapter between a Hugging Face ``config.json`` and :class:`NeoXConfig`, both directions.

What each family reads, writes, fixes and is recognized by is data: its entry of
:data:`zerotopo.placement.hf_families.HF_FAMILIES`. This module knows only how each kind of key converts
(:data:`KINDS`: an integer, GPT-NeoX's GELU flag, a rotary parameter block, a sliding window ...), and
from the entries it reads a ``config.json`` (:func:`hf_to_neox_config`), picks the family a model is
written as (:func:`hf_model_type`), writes its ``config.json`` (:func:`hf_config_dict`) and refuses what
that family cannot hold (:func:`export_architecture`). It names no family.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from zerotopo.errors import ZerotopoError
from zerotopo.models.config import NeoXConfig
from zerotopo.placement.architecture import Architecture
from zerotopo.placement.hf_families import HF_FAMILIES, REQUIRED, SET, HFFamily, HFKey

#: rope types read from ``rope_parameters`` / ``rope_scaling`` (see :func:`zerotopo.models.neox.llama3_inv_freq`)
HF_ROPE_TYPES = ("default", "llama3")
_APPROX_GELU = {"gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_accurate"}
DEFAULT_MODEL_TYPE = "gpt_neox"
"""The ``model_type`` of a ``config.json`` that names none."""


# -- reading ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Reading:
    """A ``config.json`` being read: its fields, where it came from (for messages) and its rotary
    parameters (:func:`_rope`)."""

    raw: dict[str, Any]
    source: str
    rope: dict[str, Any]

    def get(self, key: HFKey) -> Any:
        """The key's value, its default when absent (a KeyError naming it when it has none)."""
        if key.default is REQUIRED:
            return self.raw[key.key]
        return self.raw.get(key.key, key.default)


def _rope(raw: dict[str, Any], source: str, family: HFFamily) -> dict[str, Any]:
    """The rotary parameters of a config.json: transformers >=5's ``rope_parameters`` merged over <5's
    ``rope_scaling``, with ``rope_type`` one of :data:`HF_ROPE_TYPES` (and the family's, if it fixes it)."""
    rope: dict[str, Any] = {}
    for key in ("rope_scaling", "rope_parameters"):
        part = raw.get(key)
        if part is None:
            continue
        if not isinstance(part, dict):
            raise ZerotopoError(f"{source}: {key} must be an object, found {str(part)[:60]!r}")
        rope.update(part)
    kind = rope.get("rope_type", rope.get("type")) or "default"
    if kind not in HF_ROPE_TYPES:
        raise ZerotopoError(
            f"{source}: rope_type {kind!r} is not supported; zerotopo computes {', '.join(HF_ROPE_TYPES)} "
            "rotary frequencies (Llama 3.1-3.3's scaling is llama3; YaRN, linear, dynamic and longrope are "
            "not implemented)"
        )
    fixed = family.fixes.get("rope_type")
    if fixed is not None and kind != fixed:
        raise ZerotopoError(f"{source}: rope_type {kind!r} with {family.name}; only {fixed} rotary")
    rope["rope_type"] = kind
    return rope


def _number(value: Any) -> int | float:
    """A float that is an integer as an int (``rope_theta: 10000.0`` is base 10000)."""
    f = float(value)
    return int(f) if f.is_integer() else f


def _read_as(convert: Callable[[Any], Any]) -> Callable[[_Reading, HFKey], dict[str, Any]]:
    return lambda r, k: {k.field: convert(r.get(k))}


def _read_ffn(r: _Reading, k: HFKey) -> dict[str, Any]:
    """The MLP width; for a key with a default, absent or null is four times the hidden size."""
    value = r.get(k)
    if k.default is REQUIRED:
        return {k.field: int(value)}
    return {k.field: int(value or 4 * int(r.raw["hidden_size"]))}


def _read_kv_heads(r: _Reading, k: HFKey) -> dict[str, Any]:
    """Key/value heads; absent or null: one per query head."""
    return {k.field: int(r.get(k) or int(r.raw["num_attention_heads"]))}


def _check_head_dim(r: _Reading, k: HFKey) -> dict[str, Any]:
    """Refuse a head width other than ``hidden_size / num_attention_heads``."""
    hidden, heads = int(r.raw["hidden_size"]), int(r.raw["num_attention_heads"])
    if r.raw.get(k.key) not in (None, hidden // heads):
        raise ZerotopoError(
            f"{r.source}: head_dim {r.raw[k.key]} is not hidden_size / num_attention_heads = {hidden // heads}; "
            "zerotopo's attention keeps heads x head_dim = hidden_size"
        )
    return {}


def _read_gelu(r: _Reading, k: HFKey) -> dict[str, Any]:
    """GPT-NeoX's ``hidden_act``: exact GELU, or one of the tanh approximations."""
    act = r.get(k)
    if act != "gelu" and act not in _APPROX_GELU:
        raise ZerotopoError(f"{r.source}: hidden_act {act!r} is not supported (gelu or gelu_new)")
    return {k.field: act in _APPROX_GELU}


def _read_activation(r: _Reading, k: HFKey) -> dict[str, Any]:
    """A gated MLP's ``hidden_act``: SiLU, exact GELU or a tanh-approximate GELU."""
    act = r.get(k)
    if act == "silu":
        return {k.field: act}
    if act != "gelu" and act not in _APPROX_GELU:
        raise ZerotopoError(f"{r.source}: hidden_act {act!r} is not supported (silu, or gelu)")
    return {k.field: "gelu", "gelu_approximate": act in _APPROX_GELU}


def _write_activation(cfg: NeoXConfig, k: HFKey, model_type: str) -> dict[str, Any]:
    if cfg.activation == "gelu" and cfg.gelu_approximate:
        return {k.key: "gelu_pytorch_tanh"}  # transformers' name for torch's tanh GELU
    return {k.key: cfg.activation}


def _read_rotary_pct(r: _Reading, k: HFKey) -> dict[str, Any]:
    """The rotated fraction of each head: ``partial_rotary_factor`` (>=5) or the key (<5)."""
    raw = r.raw
    pct = r.rope.get("partial_rotary_factor", raw.get(k.key, raw.get("partial_rotary_factor", k.default)))
    return {k.field: float(pct)}


def _read_rope_base(r: _Reading, k: HFKey) -> dict[str, Any]:
    """The rotary base: ``rope_parameters.rope_theta`` (>=5) or the key (<5)."""
    raw = r.raw
    return {k.field: _number(r.rope.get("rope_theta", raw.get(k.key, raw.get("rope_theta", k.default))))}


def _read_rope(r: _Reading, k: HFKey) -> dict[str, Any]:
    """NeoXConfig's ``rope_*`` fields for the rotary parameters (none for default rotary)."""
    if r.rope["rope_type"] == "default":
        return {}
    try:
        return dict(
            rope_type="llama3",
            rope_factor=float(r.rope["factor"]),
            rope_low_freq_factor=float(r.rope["low_freq_factor"]),
            rope_high_freq_factor=float(r.rope["high_freq_factor"]),
            rope_original_max_position=int(
                r.rope.get("original_max_position_embeddings") or r.raw.get("max_position_embeddings", 2048)
            ),
        )
    except KeyError as exc:
        raise ZerotopoError(f"{r.source}: llama3 rope scaling needs {exc.args[0]!r}") from None


def _checked_window(window: Any, source: str) -> int | None:
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ZerotopoError(f"{source}: sliding_window {window!r}; expected a positive integer or null")
    return window


def _read_window(r: _Reading, k: HFKey) -> dict[str, Any]:
    """A window every layer uses (``sliding_window``; null: full causal attention)."""
    return {k.field: _checked_window(r.get(k), r.source)}


def _read_layer_window(r: _Reading, k: HFKey) -> dict[str, Any]:
    """A window switched on by ``use_sliding_window`` for the layers from ``max_window_layers`` on (or as
    ``layer_types`` lists them); a window on some layers only is refused."""
    raw, layers = r.raw, int(r.raw["num_hidden_layers"])
    if not raw.get("use_sliding_window", False):
        return {k.field: None}
    kinds = raw.get("layer_types") or [
        "sliding_attention" if i >= int(raw.get("max_window_layers", 28)) else "full_attention"
        for i in range(layers)
    ]
    sliding = sum(kind == "sliding_attention" for kind in kinds)
    if sliding == 0:
        return {k.field: None}
    if sliding != layers:
        raise ZerotopoError(
            f"{r.source}: a sliding window on {sliding} of {layers} layers (use_sliding_window with "
            "max_window_layers / layer_types); zerotopo applies one window to every layer or none"
        )
    return {k.field: _checked_window(r.get(k), r.source)}


def _check_tp(r: _Reading, k: HFKey) -> dict[str, Any]:
    """Refuse Llama's ``pretraining_tp`` other than 1."""
    if int(r.get(k) or 1) != 1:
        raise ZerotopoError(f"{r.source}: {k.key} {r.raw[k.key]}; only 1 is supported")
    return {}


# -- writing ------------------------------------------------------------------------------------------


def rope_parameters(cfg: NeoXConfig) -> dict[str, Any]:
    """The ``rope_parameters`` (transformers >=5; ``rope_scaling`` before) of ``cfg``'s rotary."""
    rope: dict[str, Any] = {"rope_type": cfg.rope_type, "rope_theta": float(cfg.rotary_emb_base)}
    if cfg.rope_type == "llama3":
        rope.update(
            factor=cfg.rope_factor,
            low_freq_factor=cfg.rope_low_freq_factor,
            high_freq_factor=cfg.rope_high_freq_factor,
            original_max_position_embeddings=cfg.rope_original_max_position,
        )
    return rope


def _write_field(cfg: NeoXConfig, k: HFKey, model_type: str) -> dict[str, Any]:
    return {k.key: getattr(cfg, k.field)}


def _write_as(value: Callable[[NeoXConfig], Any]) -> Callable[[NeoXConfig, HFKey, str], dict[str, Any]]:
    return lambda cfg, k, model_type: {k.key: value(cfg)}


def _write_rope_scaling(cfg: NeoXConfig, k: HFKey, model_type: str) -> dict[str, Any]:
    """transformers <5's copy of the rotary parameters, for rotary other than default."""
    return {} if cfg.rope_type == "default" else {k.key: rope_parameters(cfg)}


def _write_layer_window(cfg: NeoXConfig, k: HFKey, model_type: str) -> dict[str, Any]:
    """``use_sliding_window`` and the window on every layer (``max_window_layers`` 0), or none."""
    window = cfg.sliding_window
    layers = 0 if window is not None else cfg.num_layers
    return {"use_sliding_window": window is not None, k.key: window, "max_window_layers": layers}


Reader = Callable[[_Reading, HFKey], dict[str, Any]]
Writer = Callable[[NeoXConfig, HFKey, str], dict[str, Any]]

#: Each kind of :class:`~zerotopo.placement.hf_families.HFKey`: how it is read into model-config
#: fields and written from them (None: not read, or not written).
KINDS: dict[str, tuple[Reader | None, Writer | None]] = {
    "int": (_read_as(int), _write_field),
    "float": (_read_as(float), _write_field),
    "bool": (_read_as(bool), _write_field),
    "ffn": (_read_ffn, _write_as(lambda cfg: cfg.ffn_size)),
    "kv_heads": (_read_kv_heads, _write_as(lambda cfg: cfg.kv_heads)),
    "head_dim": (_check_head_dim, _write_as(lambda cfg: cfg.head_dim)),
    "gelu": (_read_gelu, _write_as(lambda cfg: "gelu_new" if cfg.gelu_approximate else "gelu")),
    "activation": (_read_activation, _write_activation),
    "rotary_pct": (_read_rotary_pct, _write_field),
    "rope_base": (_read_rope_base, _write_field),
    "rope_theta": (_read_rope_base, _write_as(lambda cfg: float(cfg.rotary_emb_base))),
    "rope": (_read_rope, _write_as(rope_parameters)),
    "rope_scaling": (None, _write_rope_scaling),
    "window": (_read_window, _write_field),
    "layer_window": (_read_layer_window, _write_layer_window),
    "pretraining_tp": (_check_tp, None),
    "const": (None, lambda cfg, k, model_type: {k.key: k.default}),
    "architectures": (None, lambda cfg, k, model_type: {k.key: [HF_FAMILIES[model_type].architecture]}),
    "model_type": (None, lambda cfg, k, model_type: {k.key: model_type}),
}


# -- the adapter --------------------------------------------------------------------------------------


@contextlib.contextmanager
def _config_json_errors(source: str) -> Iterator[None]:
    """A missing key or a value of the wrong type in ``source`` (a config.json) as one error naming it."""
    try:
        yield
    except KeyError as exc:
        raise ZerotopoError(f"{source}: missing {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ZerotopoError(f"{source}: {exc}") from None


def hf_family(raw: dict[str, Any], source: str = "config.json") -> HFFamily:
    """The family a ``config.json``'s ``model_type`` names (GPT-NeoX when it names none)."""
    model_type = raw.get("model_type", DEFAULT_MODEL_TYPE)
    if model_type not in HF_FAMILIES:
        raise ZerotopoError(
            f"{source}: model_type is {model_type!r}; zerotopo reads {', '.join(HF_FAMILIES)} "
            f"({', '.join(f.architecture for f in HF_FAMILIES.values())})"
        )
    return HF_FAMILIES[model_type]


def hf_to_neox_config(raw: dict[str, Any], source: str = "config.json") -> NeoXConfig:
    """The model a Hugging Face ``config.json`` describes (transformers <5 and >=5 layouts): each key of
    its family read into the field it carries, then the values the family fixes."""
    family = hf_family(raw, source)
    reading = _Reading(raw, source, _rope(raw, source, family))
    fields: dict[str, Any] = {}
    with _config_json_errors(source):
        for key in family.keys:
            read = KINDS[key.kind][0]
            if read is not None:
                fields.update(read(reading, key))
        fields.update(family.fixes)
        return NeoXConfig(**fields)


def _recognizes(family: HFFamily, cfg: NeoXConfig) -> bool:
    """Whether ``cfg`` matches one of the family's :attr:`~zerotopo.placement.hf_families.HFFamily.marks`."""

    def matches(value: Any, mark: Any) -> bool:
        return value is not None if mark is SET else value == mark

    return any(all(matches(getattr(cfg, k), v) for k, v in mark.items()) for mark in family.marks)


def hf_model_type(cfg: NeoXConfig) -> str:
    """The Hugging Face ``model_type`` ``cfg``'s model is written as: from the family of every model down
    through the first refinement whose marks it has, as long as one has (GPT-NeoX; Llama for RMSNorm, a
    gated MLP or grouped-query heads; then OLMo-2's norms, Qwen2's q/k/v-only biases, Mistral's window)."""
    current = next(t for t, f in HF_FAMILIES.items() if f.parent is None)
    while True:
        child = next((t for t, f in HF_FAMILIES.items() if f.parent == current and _recognizes(f, cfg)), None)
        if child is None:
            return current
        current = child


def hf_config_dict(cfg: NeoXConfig) -> dict[str, Any]:
    """The ``config.json`` fields the class of :func:`hf_model_type` needs to rebuild this model: each key
    of the family written from the field it carries (see :func:`export_architecture` for the models no
    family holds exactly; this never refuses)."""
    model_type = hf_model_type(cfg)
    family = HF_FAMILIES[model_type]
    out: dict[str, Any] = {}
    for key in family.keys:
        write = KINDS[key.kind][1]
        if write is not None:
            out.update(write(cfg, key, model_type))
    for key in family.config_drop:
        out.pop(key, None)
    return out


def shown(neox_key: str, value: Any) -> Any:
    """A model-config value as the NeoX key ``neox_key`` says it."""
    if neox_key == "no_weight_tying":
        return not value
    if neox_key == "mlp_type":
        return "llama" if value else "regular"
    return value


def _requirement(cfg: NeoXConfig, family: HFFamily, field: str, want: Any) -> tuple[str, Any, Any]:
    """``(key, ours, needed)`` for model-config field ``field`` held at ``want`` (a None of a following
    switch: at the value the family fixes the switch it follows at, else the model's), named and shown
    as the NeoX key says it."""
    follows = Architecture.following(field)
    if want is None and follows:
        want = family.fixes.get(follows, cfg.switch_value(follows))
    meta = {f.name: f.metadata for f in Architecture.switches()}.get(field, {})
    name = meta.get("neox_key") or field
    return name, shown(name, cfg.switch_value(field)), shown(name, want)


def _requirements(cfg: NeoXConfig, family: HFFamily) -> list[tuple[str, Any, Any]]:
    """What the family needs of ``cfg``: its fixed values, and every switch it neither keys nor fixes at
    its default."""
    out = [_requirement(cfg, family, f, want) for f, want in family.fixes.items()]
    stated = family.keyed() | set(family.fixes)
    return out + [
        _requirement(cfg, family, f.name, f.default) for f in Architecture.switches() if f.name not in stated
    ]


def export_architecture(cfg: NeoXConfig) -> str:
    """The architecture class (see :func:`hf_model_type`), or a ZerotopoError naming each key that no
    Hugging Face architecture can express together with the others."""
    family = HF_FAMILIES[hf_model_type(cfg)]
    wrong = dict.fromkeys(_requirements(cfg, family))
    bad = [f"{key}: {ours!r} (needs {want!r})" for key, ours, want in wrong if ours != want]
    if bad:
        raise ZerotopoError(
            f"this model has no Hugging Face architecture: as the nearest, {family.architecture}, it would need "
            f"{'; '.join(bad)}. transformers' GPTNeoXForCausalLM always has MLP and LayerNorm biases and "
            "plain rotary over all positions; LlamaForCausalLM (and Qwen2, Mistral, OLMo-2) needs RMSNorm, a gated "
            "SiLU (or GELU) MLP, full rotary and a sequential residual; Qwen2 biases q/k/v only, Mistral nothing. "
            "Train with those keys to export, or keep the zerotopo checkpoint"
        )
    return family.architecture
