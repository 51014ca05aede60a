"""Hugging Face ``GPTNeoXForCausalLM``, ``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``MistralForCausalLM``
and ``Olmo2ForCausalLM`` state dicts, configs and safetensors files.

Every tensor name comes from the architecture's description
(:data:`zerotopo.placement.architecture.HF_FAMILIES`). A model with NeoX's own architecture (LayerNorm,
GELU MLP, one key/value head per query head) is a ``GPTNeoXForCausalLM``: the names differ only by prefix
and the fused QKV layout is the same (the description's [Note: NeoX layout]), so conversion is a renaming.
A Llama-architecture model (RMSNorm without biases, gated SiLU MLP, full rotary, sequential residual; any
number of key/value heads) is a ``LlamaForCausalLM``: the fused ``query_key_value`` rows are cut into
``q_proj``/``k_proj``/``v_proj`` (per head when there are as many key/value heads as query heads, in three
blocks otherwise) and the MLP's ``w1``/``w3``/``w2`` are ``gate_proj``/``up_proj``/``down_proj``; Llama's
rotary is the same non-interleaved ``rotate_half`` form. Qwen2 (biases on q/k/v only), Mistral (a sliding
window) and OLMo-2 (QK-norm, norms after attention and MLP) name their tensors as Llama does.
Anything else has no Hugging Face architecture that holds it, and :func:`export_architecture` says which
key prevents each.

``transformers`` is not needed: the files written here open with ``from_pretrained`` once
``hf_config_dict`` is saved as ``config.json`` beside them.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from zerotopo.errors import ZerotopoError
from zerotopo.models.neox import GPTNeoX, NeoXConfig
from zerotopo.placement.architecture import HF_FAMILIES, Architecture

# Hugging Face's non-parameter buffers: functions of the config, never loaded
IGNORABLE = (".attention.bias", ".attention.masked_bias", ".inv_freq")

Segment = tuple[str, int, int]
"""``(hf_name, first_row, rows)``: a run of rows of a Hugging Face tensor inside a zerotopo parameter."""


def is_llama(cfg: NeoXConfig) -> bool:
    """Whether the model is written with Llama's tensor names (``LlamaForCausalLM``, and Qwen2 and Mistral,
    which name their tensors as Llama does; see :func:`export_architecture`)."""
    return cfg.norm == "rmsnorm" or cfg.gated_mlp or cfg.kv_heads != cfg.num_attention_heads


#: Hugging Face ``model_type`` -> architecture class, for the model types zerotopo writes.
ARCHITECTURES = {model_type: family.architecture for model_type, family in HF_FAMILIES.items()}


def _marked(cfg: NeoXConfig) -> str | None:
    """The family whose :attr:`~zerotopo.placement.architecture.HFFamily.marks` ``cfg`` has, if any."""
    for model_type, family in HF_FAMILIES.items():
        if any(getattr(cfg, k) == v for k, v in family.marks.items()):
            return model_type
    return None


def hf_model_type(cfg: NeoXConfig) -> str:
    """The Hugging Face ``model_type`` that holds ``cfg``'s model: a family of the description whose
    switches it has, ``qwen2`` for biases on q/k/v alone, ``mistral`` for a sliding window, ``llama`` for
    Llama's other switches, else ``gpt_neox``."""
    if not is_llama(cfg):
        return "gpt_neox"
    marked = _marked(cfg)
    if marked is not None:
        return marked
    if cfg.has_qkv_bias and not cfg.use_bias_in_attn_linear:
        return "qwen2"
    return "mistral" if cfg.sliding_window is not None else "llama"


def _family_keys(cfg: NeoXConfig, model_type: str) -> list[tuple[str, Any, Any]]:
    """``(key, ours, needed)`` for the switches the description's families mark and the values the
    chosen family holds (every other family needs a marked switch at its default)."""
    family = HF_FAMILIES[model_type]
    defaults = {f.name: f.default for f in Architecture.switches()}
    wrong = [(k, getattr(cfg, k), v) for k, v in family.holds.items()]
    for other in HF_FAMILIES.values():
        for k in other.marks:
            wrong.append((k, getattr(cfg, k), family.marks.get(k, defaults.get(k))))
    return wrong


def export_architecture(cfg: NeoXConfig) -> str:
    """The architecture class (see :func:`hf_model_type`), or a ZerotopoError naming each key that no
    Hugging Face architecture can express together with the others."""
    model_type = hf_model_type(cfg)
    name = ARCHITECTURES[model_type]
    if model_type != "gpt_neox":
        wrong = [
            ("norm", cfg.norm, "rmsnorm"),
            ("use_bias_in_norms", cfg.use_bias_in_norms, False),
            ("mlp_type", "llama" if cfg.gated_mlp else "regular", "llama"),
            ("activation", cfg.activation, "silu"),
            ("rotary_pct", cfg.rotary_pct, 1.0),
            ("gpt_j_residual", cfg.gpt_j_residual, False),
        ]
        if model_type in ("qwen2", "mistral"):  # no MLP biases; Mistral no attention biases either
            wrong.append(("use_bias_in_mlp", cfg.use_bias_in_mlp, False))
        if model_type == "mistral":
            wrong.append(("qkv_bias", cfg.has_qkv_bias, False))
        elif cfg.qkv_bias is not None and cfg.qkv_bias != cfg.use_bias_in_attn_linear:
            wrong.append(("qkv_bias", cfg.qkv_bias, True))  # an output bias without q/k/v biases
    else:
        wrong = [
            ("use_bias_in_norms", cfg.use_bias_in_norms, True),
            ("use_bias_in_mlp", cfg.use_bias_in_mlp, True),
            ("rope_type", cfg.rope_type, "default"),
            ("sliding_window", cfg.sliding_window, None),
            ("qkv_bias", cfg.has_qkv_bias, cfg.use_bias_in_attn_linear),
        ]
    wrong += _family_keys(cfg, model_type)
    bad = [f"{key}: {ours!r} (needs {want!r})" for key, ours, want in dict.fromkeys(wrong) if ours != want]
    if bad:
        raise ZerotopoError(
            f"this model has no Hugging Face architecture: as the nearest, {name}, it would need "
            f"{'; '.join(bad)}. transformers' GPTNeoXForCausalLM always has MLP and LayerNorm biases and "
            "plain rotary over all positions; LlamaForCausalLM (and Qwen2, Mistral, OLMo-2) needs RMSNorm, a gated "
            "SiLU MLP, full rotary and a sequential residual; Qwen2 biases q/k/v only, Mistral nothing. "
            "Train with those keys to export, or keep the zerotopo checkpoint"
        )
    return name


def hf_segments(cfg: NeoXConfig, name: str, rows: int) -> list[Segment]:
    """Where the ``rows`` rows of zerotopo parameter ``name`` come from in the Hugging Face state dict of
    the architecture :func:`hf_model_type` picks (the description's names)."""
    return cfg.hf_segments(hf_model_type(cfg), name, rows)


def hf_shapes(cfg: NeoXConfig, shapes: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The Hugging Face tensors (name -> shape) that zerotopo parameters of ``shapes`` become."""
    return cfg.hf_shapes(hf_model_type(cfg), shapes)


def split_to_hf(cfg: NeoXConfig, name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
    """A zerotopo parameter as its Hugging Face tensors (rows copied out where the layout interleaves)."""
    parts: dict[str, list[tuple[int, torch.Tensor]]] = {}
    at = 0
    for hf, row0, rows in hf_segments(cfg, name, tensor.shape[0]):
        parts.setdefault(hf, []).append((row0, tensor[at : at + rows]))
        at += rows
    return {
        hf: ts[0][1] if len(ts) == 1 else torch.cat([t for _, t in sorted(ts, key=lambda x: x[0])])
        for hf, ts in parts.items()
    }


def join_from_hf(cfg: NeoXConfig, name: str, rows: int, get) -> torch.Tensor:
    """A zerotopo parameter of ``rows`` rows assembled from Hugging Face tensors (``get(hf_name)``)."""
    return torch.cat([get(hf)[row0 : row0 + n] for hf, row0, n in hf_segments(cfg, name, rows)])


def to_hf_state_dict(model: GPTNeoX) -> dict[str, torch.Tensor]:
    """The model's parameters under Hugging Face key names (detached; renamed tensors share storage).

    With tied embeddings the output projection is left out, as Hugging Face does when
    ``tie_word_embeddings`` is set (and because safetensors refuses two names for one storage).
    """
    sd = {}
    for name, tensor in model.state_dict().items():
        if name == "head.embed_out.weight" and model.config.tie_embeddings:
            continue
        sd.update(split_to_hf(model.config, name, tensor.detach()))
    return sd


def load_hf_state_dict(model: GPTNeoX, sd: dict[str, torch.Tensor], *, source: str = "state dict") -> None:
    """Copy a Hugging Face state dict (of the architecture :func:`is_llama` picks) into ``model``; shapes
    must match exactly. Hugging Face's non-parameter buffers are ignored: they are functions of the config."""
    cfg = model.config
    own = {
        n: t
        for n, t in model.state_dict().items()
        if not (cfg.tie_embeddings and n == "head.embed_out.weight")
    }
    expected = hf_shapes(cfg, {n: t.shape for n, t in own.items()})
    unexpected = [k for k in sd if k not in expected and not k.endswith(IGNORABLE)]
    missing = [k for k in expected if k not in sd]
    if missing or unexpected:
        raise ZerotopoError(
            f"{source} does not match this model: missing {missing[:5]}"
            f"{' ...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
            f"{' ...' if len(unexpected) > 5 else ''}; check that the config (layers, tied embeddings, "
            "biases, key/value heads) is the one the checkpoint was trained with"
        )
    for hf_key, shape in expected.items():
        if tuple(sd[hf_key].shape) != shape:
            raise ZerotopoError(
                f"{source}: {hf_key} has shape {tuple(sd[hf_key].shape)}, the model expects {shape}; "
                "the config's hidden_size, vocabulary, heads or intermediate_size differ from the checkpoint's"
            )
    with torch.no_grad():
        for name, dst in own.items():
            dst.copy_(join_from_hf(cfg, name, dst.shape[0], sd.__getitem__))


def save_safetensors(model: GPTNeoX, path: str | os.PathLike) -> None:
    """Write the model as a Hugging Face-style ``model.safetensors`` file."""
    from safetensors.torch import save_file

    sd = {k: v.contiguous() for k, v in to_hf_state_dict(model).items()}
    save_file(sd, os.fspath(path), metadata={"format": "pt"})


def load_safetensors(model: GPTNeoX, path: str | os.PathLike) -> None:
    """Load a Hugging Face-style ``.safetensors`` file written by :func:`save_safetensors` or HF."""
    from safetensors.torch import load_file

    path = os.fspath(path)
    if not os.path.exists(path):
        raise ZerotopoError(f"checkpoint {path} does not exist; give the path of a .safetensors file")
    load_hf_state_dict(model, load_file(path), source=path)


def hf_config_dict(cfg: NeoXConfig) -> dict[str, Any]:
    """The ``config.json`` fields ``GPTNeoXForCausalLM`` or ``LlamaForCausalLM`` needs to rebuild this
    model (see :func:`export_architecture` for the models neither can hold exactly)."""
    if is_llama(cfg):
        return _llama_config_dict(cfg)
    return {
        "architectures": ["GPTNeoXForCausalLM"],
        "model_type": "gpt_neox",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "intermediate_size": cfg.ffn_size,
        "rotary_pct": cfg.rotary_pct,
        "rotary_emb_base": cfg.rotary_emb_base,
        "max_position_embeddings": cfg.max_position_embeddings,
        "use_parallel_residual": cfg.gpt_j_residual,
        "layer_norm_eps": cfg.layernorm_epsilon,
        "hidden_act": "gelu_new" if cfg.gelu_approximate else "gelu",
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": cfg.use_bias_in_attn_linear,
        "initializer_range": cfg.init_std,
        "torch_dtype": "float32",
    }


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


def _llama_config_dict(cfg: NeoXConfig) -> dict[str, Any]:
    model_type = hf_model_type(cfg)
    out = _llama_family_dict(cfg)
    out.update(architectures=[ARCHITECTURES[model_type]], model_type=model_type)
    if cfg.rope_type != "default":
        out["rope_scaling"] = out["rope_parameters"]  # the key transformers <5 reads
    if model_type == "mistral":
        out["sliding_window"] = cfg.sliding_window
    if model_type in ("qwen2", "mistral"):  # their biases are fixed by the architecture
        del out["attention_bias"], out["mlp_bias"]
    for key in HF_FAMILIES[model_type].config_drop:
        out.pop(key, None)
    if model_type == "qwen2":
        window = cfg.sliding_window
        out.update(use_sliding_window=window is not None, sliding_window=window, max_window_layers=0)
        if window is None:
            out["max_window_layers"] = cfg.num_layers
    return out


def _llama_family_dict(cfg: NeoXConfig) -> dict[str, Any]:
    return {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.ffn_size,
        "hidden_act": cfg.activation,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_epsilon,
        "rope_theta": float(cfg.rotary_emb_base),
        "rope_parameters": rope_parameters(cfg),
        "attention_bias": cfg.use_bias_in_attn_linear,
        "mlp_bias": cfg.use_bias_in_mlp,
        "tie_word_embeddings": cfg.tie_embeddings,
        "initializer_range": cfg.init_std,
        "torch_dtype": "float32",
    }


def save_pretrained(model: GPTNeoX, directory: str | os.PathLike) -> None:
    """A directory ``from_pretrained`` opens: ``config.json`` and ``model.safetensors``."""
    export_architecture(model.config)
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    config = hf_config_dict(model.config)
    config["torch_dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
    with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    save_safetensors(model, os.path.join(directory, "model.safetensors"))
