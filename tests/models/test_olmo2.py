"""OLMo-2 (QK-norm over the whole query and key projections, norms after attention and MLP) from Hugging
Face: a tiny random ``Olmo2ForCausalLM`` is read into zerotopo's model with transformers' logits, written
back so that transformers reads the same model, and refused for export where a switch is half set."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from tests.models.test_hf_families import IDS, SMALL, load_ours
from zerotopo.checkpoint.hf import hf_to_neox_config, read_hf_config
from zerotopo.config.neox import load_neox_config
from zerotopo.errors import ZerotopoError
from zerotopo.models.hf import export_architecture, save_pretrained

transformers = pytest.importorskip("transformers")


def save_random(directory, **kw):
    """A random ``Olmo2ForCausalLM`` (every weight, norms included, drawn wide enough to matter), saved."""
    config = transformers.Olmo2Config(**{**SMALL, "max_position_embeddings": 64, **kw})
    torch.manual_seed(3)
    model = transformers.Olmo2ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.1)
    model.eval()
    model.save_pretrained(directory)
    return model


@pytest.mark.parametrize("kv_heads", [2, 4])  # blocks [q | k | v], and per-head q|k|v
def test_imported_olmo2_logits_match_transformers(tmp_path, kv_heads):
    hf = save_random(tmp_path, num_key_value_heads=kv_heads)
    ours = load_ours(tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(ours(IDS), hf(IDS).logits, rtol=0, atol=1e-5)


def test_olmo2_imports_as_qk_norm_and_post_norm(tmp_path):
    hf = save_random(tmp_path)
    cfg = load_ours(tmp_path).config
    assert cfg.qk_norm and cfg.post_norm and cfg.norm == "rmsnorm" and not cfg.use_bias_in_mlp
    shapes = dict(cfg.model_params())
    assert shapes["layers.0.attention.q_norm.weight"] == (32,)  # heads · head_dim
    assert shapes["layers.0.attention.k_norm.weight"] == (16,)  # kv_heads · head_dim
    # the cost model counts what transformers holds
    assert cfg.shape(64).param_count() == sum(p.numel() for p in hf.parameters())


def test_the_qk_norm_matters(tmp_path):
    """Scaling the query norm's weight changes the logits (the norm is applied, not just loaded)."""
    save_random(tmp_path)
    ours = load_ours(tmp_path)
    with torch.no_grad():
        a = ours(IDS)
        ours.layers[0].attention.q_norm.weight.mul_(2.0)
        assert (ours(IDS) - a).abs().max() > 1e-3


@pytest.mark.parametrize("kv_heads", [2, 4])
def test_written_back_transformers_reads_the_same_olmo2(tmp_path, kv_heads):
    save_random(tmp_path / "in", num_key_value_heads=kv_heads)
    ours = load_ours(tmp_path / "in")
    save_pretrained(ours, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == "olmo2" and config["architectures"] == ["Olmo2ForCausalLM"]
    assert "mlp_bias" not in config
    back = transformers.Olmo2ForCausalLM.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        torch.testing.assert_close(back(IDS).logits, ours(IDS), rtol=0, atol=1e-5)
    assert hf_to_neox_config(config) == ours.config  # and zerotopo reads its own export as it was


def test_export_refuses_a_half_set_olmo2_or_qk_norm_elsewhere():
    olmo2 = hf_to_neox_config({"model_type": "olmo2", **SMALL, "max_position_embeddings": 64})
    assert export_architecture(olmo2) == "Olmo2ForCausalLM"
    with pytest.raises(ZerotopoError, match="post_norm: False \\(needs True\\)"):
        export_architecture(replace(olmo2, post_norm=False))
    with pytest.raises(ZerotopoError, match="use_bias_in_mlp: True"):
        export_architecture(replace(olmo2, use_bias_in_mlp=True))
    neox = hf_to_neox_config({"model_type": "gpt_neox", **SMALL})
    with pytest.raises(ZerotopoError, match="qk_norm: True \\(needs False\\)"):
        export_architecture(replace(neox, qk_norm=True))


def test_runs_saved_before_qk_norm_keep_their_identity():
    from dataclasses import asdict

    from zerotopo.models.config import NeoXConfig, model_identity

    cfg = NeoXConfig(vocab_size=64, hidden_size=16, num_layers=2, num_attention_heads=2)
    assert "qk_norm" not in model_identity(cfg) and "post_norm" not in model_identity(cfg)
    assert set(asdict(cfg)) - set(model_identity(cfg)) >= {"qk_norm", "post_norm"}
    assert model_identity(replace(cfg, qk_norm=True))["qk_norm"] is True


def test_neox_yaml_keys_select_olmo2(tmp_path):
    path = tmp_path / "olmo2.yml"
    path.write_text(
        "num_layers: 2\nhidden_size: 32\nnum_attention_heads: 4\nnum_kv_heads: 2\nnorm: rmsnorm\n"
        "use_bias_in_norms: false\nuse_bias_in_attn_linear: false\nmlp_type: llama\nactivation: silu\n"
        "intermediate_size: 48\nrotary_pct: 1.0\nqk_norm: true\npost_norm: true\nseq_length: 64\n"
    )
    cfg = load_neox_config([path]).model.model_config(96)
    assert cfg.qk_norm and cfg.post_norm
    assert export_architecture(cfg) == "Olmo2ForCausalLM"


def test_a_config_asking_for_qk_norm_refuses_a_llama_directory(tmp_path):
    """``qk_norm: true`` in the run's config and a Hugging Face Llama directory disagree: refused by name."""
    from zerotopo.checkpoint.hf import merge_hf_config

    transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL)).save_pretrained(tmp_path)
    llama = hf_to_neox_config(read_hf_config(tmp_path))

    class Args:
        sources = {"qk_norm": "run.yml"}
        seq_length = 64

    with pytest.raises(ZerotopoError, match="qk_norm: True in run.yml"):
        merge_hf_config(tmp_path, Args(), replace(llama, qk_norm=True))
    assert merge_hf_config(tmp_path, Args(), llama) == llama


def test_a_manifest_written_before_the_switches_reads_as_the_same_model():
    """A checkpoint's model config saved before ``qk_norm``/``post_norm`` existed (no such keys) reads
    as the model it was: both off, equal to today's config of the same run."""
    from dataclasses import asdict
    from pathlib import Path

    from zerotopo.checkpoint.store import _model_config
    from zerotopo.models.config import NeoXConfig

    cfg = NeoXConfig(vocab_size=64, hidden_size=16, num_layers=2, num_attention_heads=2)
    old = {k: v for k, v in asdict(cfg).items() if k not in ("qk_norm", "post_norm")}
    assert _model_config(old, Path("checkpoint.json")) == cfg
