"""The one Hugging Face adapter, both directions, for every family of the description: a tiny random
transformers model is read into zerotopo's model with transformers' logits, written back so that
transformers reads the same model, and read back by zerotopo as the config it was; a family that differs
from Llama only in fixed switches is one table entry."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from tests.models.test_hf_families import IDS, SMALL, load_ours
from zerotopo.checkpoint.hf import hf_to_neox_config
from zerotopo.errors import ZerotopoError
from zerotopo.models.hf import export_architecture, save_pretrained
from zerotopo.placement.hf_families import HF_FAMILIES, refine

transformers = pytest.importorskip("transformers")

NEOX = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4)
LLAMA = dict(SMALL, max_position_embeddings=64)

# name: (config class, model class, its keys, the model_type zerotopo writes it as)
CASES = {
    "gpt_neox-parallel": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(NEOX), "gpt_neox"),
    "gpt_neox-sequential-tied-tanh": (
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        dict(
            NEOX, use_parallel_residual=False, tie_word_embeddings=True, hidden_act="gelu_new", rotary_pct=0.5
        ),
        "gpt_neox",
    ),
    "llama-default-rope": ("LlamaConfig", "LlamaForCausalLM", dict(LLAMA, num_key_value_heads=4), "llama"),
    "llama-biases": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(LLAMA, attention_bias=True, mlp_bias=True),
        "llama",
    ),
    "llama-gelu": ("LlamaConfig", "LlamaForCausalLM", dict(LLAMA, hidden_act="gelu"), "llama"),
    "llama-gelu-tanh": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(LLAMA, hidden_act="gelu_pytorch_tanh"),
        "llama",
    ),
    "qwen2-window-everywhere": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(LLAMA, use_sliding_window=True, sliding_window=8, max_window_layers=0),
        "qwen2",
    ),
    "mistral-mha": (
        "MistralConfig",
        "MistralForCausalLM",
        dict(LLAMA, num_key_value_heads=4, sliding_window=8),
        "mistral",
    ),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(LLAMA), "olmo2"),
}


def save_random(directory, config_cls: str, model_cls: str, keys: dict):
    """A random transformers model (every weight drawn wide enough to matter, norms around one), saved."""
    config = getattr(transformers, config_cls)(**keys)
    torch.manual_seed(5)
    model = getattr(transformers, model_cls)(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if "norm" in name and p.dim() == 1 and not name.endswith("bias") else 0.0, 0.1)
    model.eval()
    model.save_pretrained(directory)
    return model


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_family_round_trips_through_transformers(tmp_path, case):
    config_cls, model_cls, keys, model_type = CASES[case]
    hf = save_random(tmp_path / "in", config_cls, model_cls, keys)
    ours = load_ours(tmp_path / "in")
    with torch.no_grad():
        torch.testing.assert_close(ours(IDS), hf(IDS).logits, rtol=0, atol=1e-5)
    save_pretrained(ours, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == model_type and config["architectures"] == [model_cls]
    back = getattr(transformers, model_cls).from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        torch.testing.assert_close(back(IDS).logits, ours(IDS), rtol=0, atol=1e-5)
    assert hf_to_neox_config(config) == ours.config  # and zerotopo reads its own export as it was


def test_a_family_that_fixes_llama_switches_is_one_table_entry(tmp_path, monkeypatch):
    """A made-up ``model_type`` that is Llama with biases on attention and none on the MLP, fixed (its
    config.json has no ``attention_bias``/``mlp_bias``): one entry of the table, and the adapter reads,
    recognizes and writes it. transformers checks the weights as the Llama they are."""
    entry = refine(
        "llama",
        "BiasLlama",
        "BiasLlamaForCausalLM",
        marks=({"use_bias_in_attn_linear": True, "use_bias_in_mlp": False},),
        fixes={"use_bias_in_attn_linear": True, "use_bias_in_mlp": False},
    )
    monkeypatch.setitem(HF_FAMILIES, "biasllama", entry)
    hf = save_random(tmp_path / "in", "LlamaConfig", "LlamaForCausalLM", dict(LLAMA, attention_bias=True))
    path = tmp_path / "in" / "config.json"
    raw = json.loads(path.read_text())
    for key in ("attention_bias", "mlp_bias"):
        del raw[key]
    path.write_text(json.dumps({**raw, "model_type": "biasllama", "architectures": ["BiasLlamaForCausalLM"]}))

    ours = load_ours(tmp_path / "in")
    cfg = ours.config
    assert cfg.use_bias_in_attn_linear and cfg.has_qkv_bias and not cfg.use_bias_in_mlp
    with torch.no_grad():
        torch.testing.assert_close(ours(IDS), hf(IDS).logits, rtol=0, atol=1e-5)

    assert export_architecture(cfg) == "BiasLlamaForCausalLM"
    save_pretrained(ours, tmp_path / "out")
    out = tmp_path / "out" / "config.json"
    config = json.loads(out.read_text())
    assert config["model_type"] == "biasllama" and "attention_bias" not in config and "mlp_bias" not in config
    assert hf_to_neox_config(config) == cfg
    as_llama = {
        **config,
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": True,
    }
    out.write_text(json.dumps(as_llama))
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        torch.testing.assert_close(back(IDS).logits, ours(IDS), rtol=0, atol=1e-5)
    assert export_architecture(replace(cfg, use_bias_in_mlp=True)) == "LlamaForCausalLM"  # unmarked: Llama


def test_export_refuses_what_the_family_cannot_hold():
    """Each family's fixed values are required on export, so nothing is written that its class would
    load without some of the weights or with another activation."""
    neox = hf_to_neox_config({"model_type": "gpt_neox", **NEOX})
    with pytest.raises(ZerotopoError, match="activation: 'silu' \\(needs 'gelu'\\)"):
        export_architecture(replace(neox, activation="silu"))
    olmo2 = hf_to_neox_config({"model_type": "olmo2", **LLAMA})
    with pytest.raises(ZerotopoError, match="qkv_bias: True \\(needs False\\)"):
        export_architecture(replace(olmo2, qkv_bias=True))
    mistral = hf_to_neox_config({"model_type": "mistral", **LLAMA, "sliding_window": 8})
    with pytest.raises(ZerotopoError, match="use_bias_in_attn_linear: True \\(needs False\\)"):
        export_architecture(replace(mistral, use_bias_in_attn_linear=True, qkv_bias=False))


def test_an_unknown_model_type_is_refused_naming_it():
    with pytest.raises(ZerotopoError, match="model_type is 'gptj'; zerotopo reads gpt_neox, llama"):
        hf_to_neox_config({"model_type": "gptj", **NEOX})
