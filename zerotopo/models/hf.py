"""Hugging Face ``GPTNeoXForCausalLM``, ``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``MistralForCausalLM``
and ``Olmo2ForCausalLM`` state dicts, configs and safetensors files.

Every tensor name comes from the architecture's description
(:data:`zerotopo.placement.hf_families.HF_FAMILIES`); the ``config.json`` is read and written by the one
adapter that reads the same entries (:mod:`zerotopo.models.hf_config`, whose :func:`hf_model_type`,
:func:`hf_config_dict` and :func:`export_architecture` are importable from here). A model with NeoX's
own architecture (LayerNorm, GELU MLP, one key/value head per query head) is a ``GPTNeoXForCausalLM``:
the names differ only by prefix and the fused QKV layout is the same (the description's [Note: NeoX
layout]), so conversion is a renaming. A Llama-architecture model (RMSNorm without biases, gated MLP,
full rotary, sequential residual; any number of key/value heads) is a ``LlamaForCausalLM``: the fused
``query_key_value`` rows are cut into ``q_proj``/``k_proj``/``v_proj`` (per head when there are as many
key/value heads as query heads, in three blocks otherwise) and the MLP's ``w1``/``w3``/``w2`` are
``gate_proj``/``up_proj``/``down_proj``; Llama's rotary is the same non-interleaved ``rotate_half`` form.
Qwen2 (biases on q/k/v only), Mistral (a sliding window) and OLMo-2 (QK-norm, norms after attention and
MLP) name their tensors as Llama does. Anything else has no Hugging Face architecture that holds it, and
:func:`export_architecture` says which key prevents each.

``transformers`` is not needed: the files written here open with ``from_pretrained`` once
``hf_config_dict`` is saved as ``config.json`` beside them.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from zerotopo.errors import ZerotopoError
from zerotopo.models.hf_config import export_architecture as export_architecture
from zerotopo.models.hf_config import hf_config_dict as hf_config_dict
from zerotopo.models.hf_config import hf_model_type as hf_model_type
from zerotopo.models.hf_config import rope_parameters as rope_parameters
from zerotopo.models.neox import GPTNeoX, NeoXConfig
from zerotopo.placement.hf_families import HF_FAMILIES

# Hugging Face's non-parameter buffers: functions of the config, never loaded
IGNORABLE = (".attention.bias", ".attention.masked_bias", ".inv_freq")

Segment = tuple[str, int, int]
"""``(hf_name, first_row, rows)``: a run of rows of a Hugging Face tensor inside a zerotopo parameter."""


def is_llama(cfg: NeoXConfig) -> bool:
    """Whether the model is written with Llama's tensor names (``LlamaForCausalLM``, and the families that
    name their tensors as Llama does; see :func:`hf_model_type`)."""
    return HF_FAMILIES[hf_model_type(cfg)].split_qkv is not None


#: Hugging Face ``model_type`` -> architecture class, for the model types zerotopo writes.
ARCHITECTURES = {model_type: family.architecture for model_type, family in HF_FAMILIES.items()}


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
