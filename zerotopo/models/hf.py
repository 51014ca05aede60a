"""Hugging Face ``GPTNeoXForCausalLM`` state dicts and config, and safetensors files, for :class:`GPTNeoX`.

zerotopo's parameter names differ from Hugging Face's only by prefix (the head is a module here), and the
fused QKV layout is the same (see [Note: NeoX layout] in ``neox.py``), so conversion is a renaming.
``transformers`` is not needed: the files written here open with ``GPTNeoXForCausalLM.from_pretrained``
once ``hf_config_dict`` is saved as ``config.json`` beside them.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from zerotopo.errors import ZerotopoError
from zerotopo.models.neox import GPTNeoX, NeoXConfig

# zerotopo name -> Hugging Face name; layer keys are matched by their suffix after "layers.{i}."
_TOP_LEVEL = {
    "embed_in.weight": "gpt_neox.embed_in.weight",
    "head.final_layer_norm.weight": "gpt_neox.final_layer_norm.weight",
    "head.final_layer_norm.bias": "gpt_neox.final_layer_norm.bias",
    "head.embed_out.weight": "embed_out.weight",
}


def _hf_name(name: str) -> str:
    if name in _TOP_LEVEL:
        return _TOP_LEVEL[name]
    if name.startswith("layers."):
        return "gpt_neox." + name
    raise KeyError(f"parameter {name!r} has no Hugging Face GPT-NeoX name")


def to_hf_state_dict(model: GPTNeoX) -> dict[str, torch.Tensor]:
    """The model's parameters under ``GPTNeoXForCausalLM`` key names (detached, same storage).

    With tied embeddings ``embed_out.weight`` is left out, as Hugging Face does when
    ``tie_word_embeddings`` is set (and because safetensors refuses two names for one storage).
    """
    sd = {}
    for name, tensor in model.state_dict().items():
        if name == "head.embed_out.weight" and model.config.tie_embeddings:
            continue
        sd[_hf_name(name)] = tensor.detach()
    return sd


def load_hf_state_dict(model: GPTNeoX, sd: dict[str, torch.Tensor], *, source: str = "state dict") -> None:
    """Copy a ``GPTNeoXForCausalLM``-style state dict into ``model`` (shapes must match exactly).

    Hugging Face's non-parameter buffers (``attention.bias``, ``masked_bias``, ``rotary_emb.inv_freq``)
    are ignored: they are functions of the config.
    """
    expected = {_hf_name(n): n for n in model.state_dict()}
    ignorable = (".attention.bias", ".attention.masked_bias", ".inv_freq")
    unexpected = [k for k in sd if k not in expected and not k.endswith(ignorable)]
    tied = model.config.tie_embeddings
    missing = [k for k in expected if k not in sd and not (tied and k == "embed_out.weight")]
    if missing or unexpected:
        raise ZerotopoError(
            f"{source} does not match this GPT-NeoX model: missing {missing[:5]}"
            f"{' ...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
            f"{' ...' if len(unexpected) > 5 else ''}; check that the config (layers, tied embeddings, "
            "biases) is the one the checkpoint was trained with"
        )
    own = model.state_dict()
    with torch.no_grad():
        for hf_key, name in expected.items():
            if hf_key not in sd:
                continue  # the tied output projection, already loaded through embed_in
            src, dst = sd[hf_key], own[name]
            if tuple(src.shape) != tuple(dst.shape):
                raise ZerotopoError(
                    f"{source}: {hf_key} has shape {tuple(src.shape)}, the model expects {tuple(dst.shape)}; "
                    "the config's hidden_size, vocabulary or intermediate_size differ from the checkpoint's"
                )
            dst.copy_(src)


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
    """The ``config.json`` fields ``GPTNeoXForCausalLM`` needs to rebuild this model."""
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


def save_pretrained(model: GPTNeoX, directory: str | os.PathLike) -> None:
    """A directory ``GPTNeoXForCausalLM.from_pretrained`` opens: ``config.json`` and ``model.safetensors``."""
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    config = hf_config_dict(model.config)
    config["torch_dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
    with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    save_safetensors(model, os.path.join(directory, "model.safetensors"))
