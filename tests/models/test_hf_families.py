"""Llama 3.x (tied embeddings, llama3 rope scaling), Qwen2 (biases on q/k/v only) and Mistral (a sliding
window) from Hugging Face: tiny random models saved with ``save_pretrained`` are read into zerotopo's
model with transformers' logits, and written back so that transformers reads the same model."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from zerotopo.checkpoint.hf import hf_to_neox_config, merge_hf_config, read_hf_config
from zerotopo.errors import ZerotopoError
from zerotopo.models.hf import export_architecture, load_safetensors, save_pretrained
from zerotopo.models.neox import GPTNeoX

transformers = pytest.importorskip("transformers")

SMALL = dict(
    vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, rms_norm_eps=1e-6,
)  # fmt: skip
LLAMA3_ROPE = {
    "rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
}  # fmt: skip


def llama32(**kw):
    """Llama-3.2-1B's shape of config in miniature: tied embeddings and llama3 rope scaling (an original
    context of 16 positions, so the 64-position test sequence meets every frequency band)."""
    cfg = dict(SMALL, max_position_embeddings=64, tie_word_embeddings=True, rope_parameters=LLAMA3_ROPE)
    return transformers.LlamaConfig(**{**cfg, **kw}), transformers.LlamaForCausalLM


def qwen2(**kw):
    cfg = dict(SMALL, max_position_embeddings=64, tie_word_embeddings=True)
    return transformers.Qwen2Config(**{**cfg, **kw}), transformers.Qwen2ForCausalLM


def mistral(**kw):
    cfg = dict(SMALL, max_position_embeddings=64, sliding_window=8, tie_word_embeddings=False)
    return transformers.MistralConfig(**{**cfg, **kw}), transformers.MistralForCausalLM


FAMILIES = {"llama3.2": llama32, "qwen2": qwen2, "mistral": mistral}


def save_random(directory, family, **kw):
    """A random transformers model of ``family`` (weights wide enough that every term matters), saved."""
    config, cls = FAMILIES[family](**kw)
    torch.manual_seed(3)
    model = cls(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.1)
    model.eval()
    model.save_pretrained(directory)
    return model


def load_ours(directory) -> GPTNeoX:
    cfg = hf_to_neox_config(read_hf_config(directory))
    model = GPTNeoX(cfg)
    load_safetensors(model, directory / "model.safetensors")
    return model.eval()


IDS = torch.randint(0, 96, (2, 64), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_imported_logits_match_transformers(tmp_path, family):
    hf = save_random(tmp_path, family)
    ours = load_ours(tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(ours(IDS), hf(IDS).logits, rtol=0, atol=1e-5)


def test_what_each_family_imports_as(tmp_path):
    cfgs = {}
    for family in FAMILIES:
        save_random(tmp_path / family, family)
        cfgs[family] = load_ours(tmp_path / family).config
    llama, qwen, mis = cfgs["llama3.2"], cfgs["qwen2"], cfgs["mistral"]
    assert llama.tie_embeddings and llama.rope_type == "llama3" and llama.rope_factor == 32.0
    assert llama.rope_original_max_position == 16 and llama.rotary_emb_base == 500000
    assert qwen.has_qkv_bias and not qwen.use_bias_in_attn_linear and not qwen.use_bias_in_mlp
    assert qwen.sliding_window is None and mis.sliding_window == 8 and not mis.has_qkv_bias
    names = [n for n, _ in GPTNeoX(qwen).named_parameters()]
    assert "layers.0.attention.query_key_value.bias" in names
    assert "layers.0.attention.dense.bias" not in names and "head.embed_out.weight" not in names


def test_the_sliding_window_matters_where_the_sequence_exceeds_it(tmp_path):
    """The same Mistral weights with the window off give other logits past the window, equal ones inside."""
    save_random(tmp_path, "mistral")
    ours = load_ours(tmp_path)
    full = GPTNeoX(hf_to_neox_config({**read_hf_config(tmp_path), "sliding_window": None}))
    full.load_state_dict(ours.state_dict())
    with torch.no_grad():
        a, b = ours(IDS), full.eval()(IDS)
    torch.testing.assert_close(a[:, :8], b[:, :8], rtol=0, atol=1e-6)
    assert (a[:, 8:] - b[:, 8:]).abs().max() > 1e-3


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_written_back_transformers_reads_the_same_model(tmp_path, family):
    save_random(tmp_path / "in", family)
    ours = load_ours(tmp_path / "in")
    save_pretrained(ours, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    want = {"llama3.2": "llama", "qwen2": "qwen2", "mistral": "mistral"}[family]
    assert config["model_type"] == want
    cls = FAMILIES[family]()[1]
    back = cls.from_pretrained(tmp_path / "out").eval()
    assert back.config.tie_word_embeddings == ours.config.tie_embeddings
    with torch.no_grad():
        torch.testing.assert_close(back(IDS).logits, ours(IDS), rtol=0, atol=1e-5)
    assert hf_to_neox_config(config) == ours.config  # and zerotopo reads its own export as it was


class _Args:
    sources: dict = {}

    def __init__(self, seq_length):
        self.seq_length = seq_length


def test_a_window_the_sequence_never_exceeds_is_accepted_with_a_notice(tmp_path):
    save_random(tmp_path, "mistral", sliding_window=4096)
    run = hf_to_neox_config(read_hf_config(tmp_path))
    seen: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: seen.append(record.getMessage())
    logger = logging.getLogger("zerotopo.train")
    level = logger.level
    logger.addHandler(handler)  # on the logger itself: other tests may stop its propagation
    logger.setLevel(logging.INFO)
    try:
        merged = merge_hf_config(tmp_path, _Args(64), run)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert merged.sliding_window == 4096
    assert any("sliding_window 4096 >= seq_length 64" in m for m in seen), seen


@pytest.mark.parametrize(
    "change,says",
    [
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "rope_type 'yarn'"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}}, "needs 'low_freq_factor'"),
        ({"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1}, "sliding window on 1 of 2"),
        ({"model_type": "mistral", "sliding_window": 0}, "sliding_window 0"),
    ],
)  # fmt: skip
def test_unsupported_settings_are_refused_naming_them(change, says):
    raw = {"model_type": "qwen2", **SMALL, "max_position_embeddings": 64}
    raw.update(change)
    with pytest.raises(ZerotopoError, match=says):
        hf_to_neox_config(raw)


def test_export_refuses_what_no_architecture_holds():
    from dataclasses import replace

    base = hf_to_neox_config({"model_type": "qwen2", **SMALL, "max_position_embeddings": 64})
    assert export_architecture(base) == "Qwen2ForCausalLM"
    with pytest.raises(ZerotopoError, match="use_bias_in_mlp: True"):
        export_architecture(replace(base, use_bias_in_mlp=True))
    neox = hf_to_neox_config({"model_type": "gpt_neox", **SMALL})
    with pytest.raises(ZerotopoError, match="sliding_window: 8"):
        export_architecture(replace(neox, sliding_window=8))


def test_runs_saved_before_the_new_fields_keep_their_identity():
    """A model that uses none of the new switches has the run identity (and checkpoint compatibility) it
    had before they existed, so its checkpoints resume; one that uses them differs."""
    from dataclasses import asdict, replace

    from zerotopo.models.config import LATER_FIELDS, NeoXConfig, model_identity

    cfg = NeoXConfig(vocab_size=64, hidden_size=16, num_layers=2, num_attention_heads=2)
    before = {k: v for k, v in asdict(cfg).items() if k != "checkpoint_activations" and k not in LATER_FIELDS}
    assert model_identity(cfg) == before
    assert model_identity(replace(cfg, sliding_window=8))["sliding_window"] == 8
