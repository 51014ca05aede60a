"""The one architecture description: the module registers what it describes, the cost model counts the
same parameters, and its Hugging Face and GPT-NeoX names map both ways."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch

from zerotopo.models.config import NeoXConfig
from zerotopo.models.neox import GPTNeoX
from zerotopo.placement.architecture import Architecture, from_neox, neox_name
from zerotopo.placement.shape import ModelShape

LLAMA = dict(
    norm="rmsnorm", use_bias_in_norms=False, use_bias_in_attn_linear=False, use_bias_in_mlp=False,
    activation="silu", gated_mlp=True, rotary_pct=1.0, gpt_j_residual=False,
)  # fmt: skip
CONFIGS = {
    "neox": dict(),
    "neox-tied-unbiased": dict(tie_embeddings=True, use_bias_in_norms=False, use_bias_in_mlp=False),
    "llama-gqa": dict(LLAMA, num_kv_heads=2, intermediate_size=48),
    "llama-mha": dict(LLAMA),
    "qwen2": dict(LLAMA, num_kv_heads=2, qkv_bias=True),
    "olmo2": dict(LLAMA, num_kv_heads=2, qk_norm=True, post_norm=True),
    "olmo2-mha": dict(LLAMA, qk_norm=True, post_norm=True),
}


def config(name: str) -> NeoXConfig:
    return NeoXConfig(vocab_size=96, hidden_size=32, num_layers=2, num_attention_heads=4, **CONFIGS[name])


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_module_registers_what_the_description_lists(name):
    cfg = config(name)
    with torch.device("meta"):
        model = GPTNeoX(cfg)
    registered = {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert list(registered.items()) == list(cfg.model_params().items())
    shape = cfg.shape(16)
    assert shape.param_count() == sum(p.numel() for p in model.parameters())


def test_model_shape_and_config_spell_each_switch_once():
    """``ModelShape`` and ``NeoXConfig`` take the architecture's fields under the same names (no
    ``norm_bias`` beside ``use_bias_in_norms``), and a config's shape carries every one of them."""
    cfg = config("qwen2")
    shape = cfg.shape(16)
    for f in fields(Architecture):
        if f.name not in ("intermediate_size", "num_kv_heads", "qkv_bias"):
            assert getattr(shape, f.name) == getattr(cfg, f.name), f.name
    assert (shape.ffn_size, shape.kv_heads, shape.has_qkv_bias) == (cfg.ffn_size, cfg.kv_heads, True)
    with pytest.raises(TypeError):
        ModelShape(
            num_layers=1, hidden_size=8, num_attention_heads=2, seq_length=4, vocab_size=8, norm_bias=1
        )


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_parameter_round_trips_through_its_neox_name(name):
    cfg = config(name)
    names = list(cfg.model_params())
    stored = [neox_name(n, cfg.num_layers) for n in names]
    assert len(set(stored)) == len(names)
    assert [from_neox(i, key, cfg.num_layers) for i, key in stored] == names
    assert neox_name("embed_in.weight", 2) == (0, "word_embeddings.weight")
    assert neox_name("layers.1.attention.dense.weight", 2) == (3, "attention.dense.weight")
    assert neox_name("head.embed_out.weight", 2) == (6, "final_linear.weight")


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_hugging_face_names_cover_every_row_once(name):
    """Each parameter's rows land on Hugging Face tensors without overlap or gap."""
    from zerotopo.models.hf import hf_model_type

    cfg = config(name)
    family = hf_model_type(cfg)
    covered: dict[str, list[tuple[int, int]]] = {}
    for n, shape in cfg.model_params().items():
        for hf, row0, rows in cfg.hf_segments(family, n, shape[0]):
            covered.setdefault(hf, []).append((row0, rows))
    for hf, runs in covered.items():
        runs.sort()
        assert runs[0][0] == 0 and all(a + r == b for (a, r), (b, _) in zip(runs, runs[1:])), hf
