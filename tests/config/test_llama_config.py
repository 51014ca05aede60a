"""GPT-NeoX's llama configs as NeoX means them: every architecture key honoured (none reported as ignored),
and a value zerotopo cannot honour refused before any rank starts, naming the key and the values it takes."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from zerotopo.cli.main import main
from zerotopo.config.neox import load_neox_config
from zerotopo.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "tests" / "fixtures" / "neox" / "llama"
NEOX_LLAMA = [str(LLAMA / "7B.yml"), str(LLAMA / "train_config.yml")]
LLAMA_7B_PARAMS = 6_738_415_616


def test_neox_llama_7b_reads_with_every_key_honoured():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an "unknown config keys ignored" warning fails the test
        args = load_neox_config(NEOX_LLAMA)
    cfg = args.model.model_config(32000)
    assert (cfg.norm, cfg.rms_norm_epsilon, cfg.use_bias_in_norms) == ("rmsnorm", 1e-6, False)
    assert (cfg.gated_mlp, cfg.activation, cfg.ffn_size, cfg.use_bias_in_mlp) == (True, "silu", 11008, False)
    assert (cfg.rotary_pct, cfg.gpt_j_residual, cfg.tie_embeddings, cfg.use_bias_in_attn_linear) == (
        1.0,
        False,
        False,
        False,
    )
    assert cfg.vocab_size == 32000  # make_vocab_size_divisible_by: 1
    assert args.model.model_shape(32000).param_count() == LLAMA_7B_PARAMS


def test_neox_llama_7b_plans_for_frontier_with_llama_7b_parameters(capsys):
    code = main(
        ["plan", "--model", *NEOX_LLAMA, "--topology", "frontier", "--nodes", "2", "--vocab-size", "32000",
         "--plans", "zero3"]
    )  # fmt: skip
    assert code == 0
    assert "train_config: 6.74B parameters on frontier x 2 nodes" in capsys.readouterr().out


def test_shipped_llama_7b_config_plans_on_the_a800_cluster(capsys):
    code = main(
        ["plan", "--model", "configs/llama-7b.yml", "--topology", "a800", "--nodes", "2", "--vocab-size",
         "32000", "--plans", "zero1,zero3"]
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "llama-7b: 6.74B parameters on a800 x 2 nodes" in out


def test_swiglu_form_and_grouped_query_heads(tmp_path):
    f = tmp_path / "m.yml"
    f.write_text(
        "hidden_size: 4096\nnum_attention_heads: 32\nnum_kv_heads: 8\nactivation: swiglu\n"
        "intermediate_size: 32768\nmlp_multiple_of: 256\nuse_bias_in_mlp: false\n"
    )
    cfg = load_neox_config([f]).model.model_config(32000)
    assert (cfg.gated_mlp, cfg.activation, cfg.ffn_size, cfg.kv_heads) == (True, "silu", 11008, 8)
    f.write_text("mlp_type: llama\nactivation: silu\nuse_bias_in_mlp: true\n")
    assert load_neox_config([f]).model.model_config(300).use_bias_in_mlp  # an explicit key wins


@pytest.mark.parametrize(
    "text, key, says",
    [
        ("norm: batchnorm", "norm", "layernorm, rmsnorm"),
        ("activation: relu", "activation", "gelu, silu, swiglu"),
        ("mlp_type: moe", "mlp_type", "regular, llama"),
        ("num_kv_heads: 3", "num_kv_heads", "divisor of the head count"),
        ("mlp_type: llama\nactivation: swiglu", "activation", "gate twice"),
        ("activation: silu\nbias_gelu_fusion: true", "bias_gelu_fusion", "only with activation gelu"),
    ],
)
def test_architecture_values_zerotopo_cannot_honour_are_refused(tmp_path, text, key, says):
    f = tmp_path / "bad.yml"
    f.write_text("hidden_size: 64\nnum_attention_heads: 4\n" + text + "\n")
    with pytest.raises(ConfigError) as err:
        load_neox_config([f])
    assert err.value.key == key and says in str(err.value)


def test_tied_embeddings_pass_the_preflight(tmp_path):
    """no_weight_tying: false trains (it was refused before the engine shared a parameter between units):
    the preflight sizes the model with one embedding matrix."""
    from zerotopo.trainer.entry import preflight
    from zerotopo.trainer.job import TrainJob

    f = tmp_path / "tied.yml"
    f.write_text(
        "num_layers: 1\nhidden_size: 32\nnum_attention_heads: 2\nseq_length: 16\nno_weight_tying: false\n"
        "tokenizer_type: ByteTokenizer\ntrain_micro_batch_size_per_gpu: 1\ntrain_iters: 1\n"
    )
    args, _ = preflight(TrainJob(configs=(str(f),), topology="emulated", nodes=1))
    cfg = args.model.model_config(args.model.padded_vocab(256))
    assert cfg.tie_embeddings and "head.embed_out.weight" not in [
        p.name for p in cfg.shape(16).head_unit().params
    ]
