"""The Llama-family switches of the NeoX model, each against transformers' Llama modules, and the unit
description that every counter (engine, memory check, MFU, cost model) reads."""

from __future__ import annotations

import json

import pytest
import torch

from zerotopo.checkpoint.hf import hf_to_neox_config
from zerotopo.errors import ZerotopoError
from zerotopo.models.config import NeoXConfig, mlp_width
from zerotopo.models.hf import export_architecture, load_hf_state_dict, save_pretrained, to_hf_state_dict
from zerotopo.models.neox import GatedMLP, GPTNeoX, RMSNorm
from zerotopo.placement.shape import ModelShape

transformers = pytest.importorskip("transformers")


def llama_cfg(**kw) -> NeoXConfig:
    base = dict(
        vocab_size=96, hidden_size=32, num_layers=2, num_attention_heads=4, intermediate_size=40,
        max_position_embeddings=64, rotary_pct=1.0, gpt_j_residual=False, norm="rmsnorm",
        rms_norm_epsilon=1e-6, use_bias_in_norms=False, use_bias_in_attn_linear=False, use_bias_in_mlp=False,
        activation="silu", gated_mlp=True,
    )  # fmt: skip
    base.update(kw)
    return NeoXConfig(**base)


def hf_llama(kv: int, **kw):
    cfg = transformers.LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=kv, max_position_embeddings=64, rms_norm_eps=1e-6, **kw,
    )  # fmt: skip
    torch.manual_seed(kv)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # transformers' init leaves norms at one and biases at zero: randomize all
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model


# -- the unit description --------------------------------------------------------------------------------

DESCRIBED = {
    "neox": dict(vocab_size=50, hidden_size=16, num_layers=2, num_attention_heads=2),
    "neox-bias-free": dict(
        vocab_size=50, hidden_size=16, num_layers=2, num_attention_heads=2, use_bias_in_attn_linear=False,
        use_bias_in_mlp=False, use_bias_in_norms=False,
    ),
    "neox-gqa-tied": dict(
        vocab_size=50, hidden_size=32, num_layers=1, num_attention_heads=4, num_kv_heads=2, tie_embeddings=True
    ),
    "llama-gqa": dict(
        vocab_size=96, hidden_size=32, num_layers=2, num_attention_heads=4, num_kv_heads=2, intermediate_size=40,
        norm="rmsnorm", use_bias_in_norms=False, use_bias_in_attn_linear=False, use_bias_in_mlp=False,
        activation="silu", gated_mlp=True,
    ),
    "llama-mqa-biases": dict(
        vocab_size=96, hidden_size=32, num_layers=1, num_attention_heads=4, num_kv_heads=1, intermediate_size=40,
        norm="rmsnorm", activation="silu", gated_mlp=True,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(DESCRIBED))
def test_unit_description_is_what_the_engine_flattens(name):
    """Each unit of the description lists exactly the parameters (names, shapes, order) that the engine
    flattens from the model's units, so GQA, SwiGLU and bias flags are counted as the model has them."""
    cfg = NeoXConfig(**DESCRIBED[name])
    with torch.device("meta"):
        model = GPTNeoX(cfg)
    units = cfg.shape(8).units()
    modules = model.unit_modules()
    assert [u.name for u in units] == ["embedding"] + ["layer"] * cfg.num_layers + ["head"]
    seen: set[int] = set()
    for spec, module in zip(units, modules):
        # a tied output projection belongs to the embedding's unit (named once, as the engine assigns it)
        own = [(n, tuple(p.shape)) for n, p in module.named_parameters() if id(p) not in seen]
        seen |= {id(p) for p in module.parameters()}
        assert [(p.name, p.shape) for p in spec.params] == own
    assert cfg.shape(8).param_count() == model.num_parameters()


def test_neox_counts_and_flops_are_neox_formula():
    s = ModelShape(num_layers=44, hidden_size=6144, num_attention_heads=64, seq_length=2048, vocab_size=50432)
    h, L, V, sq, B = 6144, 44, 50432, 2048, 4
    assert s.layer_params() == 12 * h * h + 13 * h
    assert s.forward_flops(B) == pytest.approx(
        24.0 * B * sq * L * h * h * (1 + sq / (6 * h) + V / (16 * L * h))
    )


def test_llama_7b_parameter_count_and_flops():
    cfg = llama_cfg(
        vocab_size=32000, hidden_size=4096, num_layers=32, num_attention_heads=32, intermediate_size=11008
    )
    shape = cfg.shape(2048)
    assert shape.param_count() == 6_738_415_616  # LLaMA-7B as Meta and Hugging Face count it
    assert shape.layer_params() == 4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096
    # forward FLOPs per token: 2 per weight-matrix element, attention 4·s·h, logits 1.5·V·h
    per_token = 32 * (2 * (4 * 4096**2 + 3 * 4096 * 11008) + 4 * 2048 * 4096) + 1.5 * 32000 * 4096
    assert shape.forward_flops(1) == pytest.approx(2048 * per_token, rel=1e-12)
    gqa = llama_cfg(vocab_size=32000, hidden_size=4096, num_layers=32, num_attention_heads=32,
                    intermediate_size=11008, num_kv_heads=8).shape(2048)  # fmt: skip
    assert shape.layer_params() - gqa.layer_params() == 2 * (32 - 8) * 128 * 4096  # smaller K and V


def test_mlp_width_as_neox_derives_it():
    assert mlp_width(4096, None, None, "llama") == 11008  # LLaMAParallelMLP: 8h/3 up to a multiple of 256
    assert mlp_width(4096, None, 256, "llama") == 11008
    assert mlp_width(5120, None, 256, "llama") == 13824  # LLaMA-13B
    assert mlp_width(4096, 14336, 256, "llama") == 14336  # Mistral: intermediate_size as given
    assert mlp_width(4096, 32768, 256, "gated") == 11008  # NeoX's activation: swiglu form
    assert mlp_width(64, None, None, "regular") == 256 and mlp_width(64, 100, 64, "regular") == 128


# -- each switch against transformers' Llama modules -----------------------------------------------------


def test_rmsnorm_matches_llama_rmsnorm():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    ref = LlamaRMSNorm(32, eps=1e-5)
    ours = RMSNorm(32, eps=1e-5, bias=False)
    torch.manual_seed(0)
    with torch.no_grad():
        ref.weight.normal_()
        ours.weight.copy_(ref.weight)
    x = torch.randn(3, 5, 32) * 4
    assert torch.equal(ours(x), ref(x))
    assert torch.equal(ours(x.bfloat16()), ref(x.bfloat16()))


def test_gated_mlp_matches_llama_mlp():
    from transformers.models.llama.modeling_llama import LlamaMLP

    hc = transformers.LlamaConfig(hidden_size=32, intermediate_size=40, hidden_act="silu")
    ref = LlamaMLP(hc)
    ours = GatedMLP(llama_cfg())
    with torch.no_grad():
        ours.w1.weight.copy_(ref.gate_proj.weight)
        ours.w3.weight.copy_(ref.up_proj.weight)
        ours.w2.weight.copy_(ref.down_proj.weight)
    x = torch.randn(2, 7, 32)
    assert torch.equal(ours(x), ref(x))


@pytest.mark.parametrize("kv", [4, 2, 1])  # multi-head, grouped-query, multi-query
def test_llama_logits_from_transformers(kv):
    """transformers -> zerotopo: a random LlamaForCausalLM's weights give the same logits here."""
    ref = hf_llama(kv)
    cfg = hf_to_neox_config(ref.config.to_dict())
    assert (cfg.kv_heads, cfg.gated_mlp, cfg.norm, cfg.rotary_pct) == (kv, True, "rmsnorm", 1.0)
    model = GPTNeoX(cfg).eval()
    load_hf_state_dict(model, ref.state_dict())
    ids = torch.randint(0, 96, (2, 19))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), ref(ids).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kv", [4, 2])
def test_llama_logits_into_transformers(tmp_path, kv):
    """zerotopo -> transformers: save_pretrained writes a LlamaForCausalLM directory with the same logits."""
    torch.manual_seed(3)
    model = GPTNeoX(llama_cfg(num_kv_heads=kv, use_bias_in_attn_linear=True, init_std=0.2)).eval()
    save_pretrained(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    ref = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    assert set(ref.state_dict()) == set(to_hf_state_dict(model))
    ids = torch.randint(0, 96, (2, 19))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), ref(ids).logits, rtol=0, atol=1e-5)


def test_mistral_reads_with_and_without_sliding_window():
    raw = transformers.MistralConfig(
        vocab_size=96, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, sliding_window=None,
    ).to_dict()  # fmt: skip
    assert hf_to_neox_config(raw).kv_heads == 2 and hf_to_neox_config(raw).sliding_window is None
    assert hf_to_neox_config({**raw, "sliding_window": 16}).sliding_window == 16
    with pytest.raises(ZerotopoError, match="llama3 rope scaling needs 'factor'"):
        hf_to_neox_config({**raw, "model_type": "llama", "rope_parameters": {"rope_type": "llama3"}})
    with pytest.raises(ZerotopoError, match="rope_type 'yarn'"):
        hf_to_neox_config({**raw, "model_type": "llama", "rope_parameters": {"rope_type": "yarn"}})


def test_export_refuses_what_no_architecture_holds():
    gelu_no_mlp_bias = NeoXConfig(
        vocab_size=50, hidden_size=16, num_layers=1, num_attention_heads=2, use_bias_in_mlp=False
    )
    with pytest.raises(ZerotopoError, match="use_bias_in_mlp: False .needs True."):
        export_architecture(gelu_no_mlp_bias)
    with pytest.raises(ZerotopoError, match="rotary_pct: 0.25 .needs 1.0."):
        export_architecture(llama_cfg(rotary_pct=0.25))
    assert export_architecture(llama_cfg()) == "LlamaForCausalLM"
    assert export_architecture(
        NeoXConfig(vocab_size=50, hidden_size=16, num_layers=1, num_attention_heads=2)
    ) == ("GPTNeoXForCausalLM")


@pytest.mark.parametrize("kv", [4, 2])
def test_sharded_import_reads_any_slice_of_the_fused_projection(tmp_path, kv):
    """Each rank reads only its elements of each parameter: any range of the fused QKV (rows interleaved
    per head, or in blocks under GQA) comes out of the q/k/v tensors of a sharded directory exactly."""
    from zerotopo.checkpoint.hf import HFWeights

    ref = hf_llama(kv)
    ref.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    cfg = hf_to_neox_config(ref.config.to_dict())
    model = GPTNeoX(cfg)
    load_hf_state_dict(model, ref.state_dict())
    weights = HFWeights(tmp_path)
    gen = torch.Generator().manual_seed(kv)
    for name, p in model.named_parameters():
        flat = p.detach().reshape(-1)
        for _ in range(3):
            a, b = sorted(torch.randint(0, flat.numel() + 1, (2,), generator=gen).tolist())
            assert torch.equal(weights.read_param_flat(cfg, name, p.shape, a, b), flat[a:b]), (name, a, b)
