"""Hugging Face GPTNeoXForCausalLM key names, safetensors round-trip and config.json fields."""

from __future__ import annotations

import pytest
import torch

from zerotopo.errors import ZerotopoError
from zerotopo.models.hf import (
    hf_config_dict,
    load_hf_state_dict,
    load_safetensors,
    save_pretrained,
    save_safetensors,
    to_hf_state_dict,
)
from zerotopo.models.neox import GPTNeoX, NeoXConfig


def cfg(**kw) -> NeoXConfig:
    base = dict(vocab_size=50, hidden_size=16, num_layers=2, num_attention_heads=2)
    base.update(kw)
    return NeoXConfig(**base)


def hf_keys(num_layers: int, tied: bool = False) -> set[str]:
    """The parameter names transformers' GPTNeoXForCausalLM uses, written out by hand."""
    keys = {"gpt_neox.embed_in.weight", "gpt_neox.final_layer_norm.weight", "gpt_neox.final_layer_norm.bias"}
    if not tied:
        keys.add("embed_out.weight")
    for i in range(num_layers):
        p = f"gpt_neox.layers.{i}."
        for mod in (
            "input_layernorm",
            "post_attention_layernorm",
            "attention.query_key_value",
            "attention.dense",
            "mlp.dense_h_to_4h",
            "mlp.dense_4h_to_h",
        ):
            keys |= {p + mod + ".weight", p + mod + ".bias"}
    return keys


def test_key_names_and_shapes():
    torch.manual_seed(0)
    sd = to_hf_state_dict(GPTNeoX(cfg()))
    assert set(sd) == hf_keys(2)
    assert sd["gpt_neox.layers.0.attention.query_key_value.weight"].shape == (48, 16)
    assert sd["gpt_neox.layers.1.mlp.dense_h_to_4h.weight"].shape == (64, 16)
    assert sd["embed_out.weight"].shape == (50, 16)
    assert set(to_hf_state_dict(GPTNeoX(cfg(tie_embeddings=True)))) == hf_keys(2, tied=True)


def test_load_hand_built_hf_state_dict():
    """A state dict built from HF names (plus HF's non-parameter buffers) loads into the right modules."""
    model = GPTNeoX(cfg())
    sd = {k: torch.full_like(v, float(i)) for i, (k, v) in enumerate(sorted(to_hf_state_dict(model).items()))}
    sd["gpt_neox.layers.0.attention.bias"] = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    sd["gpt_neox.layers.0.attention.rotary_emb.inv_freq"] = torch.ones(2)
    load_hf_state_dict(model, sd)
    index = {k: i for i, k in enumerate(sorted(hf_keys(2)))}
    assert torch.all(model.layers[1].attention.dense.bias == index["gpt_neox.layers.1.attention.dense.bias"])
    assert torch.all(model.head.embed_out.weight == index["embed_out.weight"])
    assert torch.all(model.head.final_layer_norm.bias == index["gpt_neox.final_layer_norm.bias"])


@pytest.mark.parametrize("tied", [False, True])
def test_safetensors_round_trip(tmp_path, tied):
    torch.manual_seed(0)
    src = GPTNeoX(cfg(tie_embeddings=tied))
    torch.manual_seed(1)
    dst = GPTNeoX(cfg(tie_embeddings=tied))
    ids = torch.randint(0, 50, (2, 5))
    assert not torch.allclose(src(ids), dst(ids))
    save_safetensors(src, tmp_path / "model.safetensors")
    load_safetensors(dst, tmp_path / "model.safetensors")
    torch.testing.assert_close(src(ids), dst(ids), rtol=0, atol=0)


def test_mismatch_errors(tmp_path):
    sd = to_hf_state_dict(GPTNeoX(cfg(num_layers=3)))
    with pytest.raises(ZerotopoError, match="unexpected"):
        load_hf_state_dict(GPTNeoX(cfg()), sd)
    sd = to_hf_state_dict(GPTNeoX(cfg(vocab_size=60)))
    with pytest.raises(ZerotopoError, match="shape"):
        load_hf_state_dict(GPTNeoX(cfg()), sd)
    with pytest.raises(ZerotopoError, match="does not exist"):
        load_safetensors(GPTNeoX(cfg()), tmp_path / "nope.safetensors")


def test_hf_config_dict():
    d = hf_config_dict(cfg(gelu_approximate=True, gpt_j_residual=False))
    assert d["architectures"] == ["GPTNeoXForCausalLM"]
    assert d["num_hidden_layers"] == 2 and d["intermediate_size"] == 64
    assert d["hidden_act"] == "gelu_new" and d["use_parallel_residual"] is False
    assert d["tie_word_embeddings"] is False and d["rotary_pct"] == 0.25


def test_save_pretrained_directory(tmp_path):
    import json

    torch.manual_seed(0)
    model = GPTNeoX(cfg()).to(torch.bfloat16)
    save_pretrained(model, tmp_path / "export")
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16" and config["hidden_size"] == 16
    fresh = GPTNeoX(cfg()).to(torch.bfloat16)
    load_safetensors(fresh, tmp_path / "export" / "model.safetensors")
    ids = torch.randint(0, 50, (1, 4))
    assert torch.equal(model(ids), fresh(ids))
