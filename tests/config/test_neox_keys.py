"""Every GPT-NeoX key is honoured, refused before any rank starts (naming the key, its value and the
fix), or listed as accepted without effect in one table that ``zerotopo config keys`` prints."""

from __future__ import annotations

import pytest

from zerotopo.cli.main import main
from zerotopo.config.neox import KEYS, load_neox_config
from zerotopo.config.neox_keys import NO_EFFECT_KEYS, REFUSED_UNLESS_DEFAULT
from zerotopo.errors import ConfigError


def _cfg(tmp_path, text: str):
    path = tmp_path / "c.yml"
    path.write_text(text)
    return path


def test_an_unknown_key_stops_train_before_any_rank_naming_it(tmp_path, capsys):
    path = _cfg(tmp_path, "num_layerz: 3\n")
    code = main(["train", "tiny", str(path), "--no-progress", "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "num_layerz (did you mean num_layers?)" in err and "zerotopo config keys" in err
    assert not (tmp_path / "run").exists()  # stopped before the run directory and the ranks


def test_a_refused_key_names_its_value_and_the_fix(tmp_path):
    with pytest.raises(ConfigError, match=r"use_bnb_optimizer.*True is not implemented.*8-bit Adam"):
        load_neox_config([_cfg(tmp_path, "use_bnb_optimizer: true\n")])
    with pytest.raises(ConfigError, match="weight_by_num_documents.*train_data_weights"):
        load_neox_config([_cfg(tmp_path, "weight-by-num-documents: true\n")])


def test_defaults_of_refused_keys_and_no_effect_keys_load_without_a_warning(tmp_path, recwarn):
    text = "fp32_allreduce: false\npack_impl: packed\nhostfile: /job/hostfile\nmaster_port: 29500\n"
    load_neox_config([_cfg(tmp_path, text)])
    assert not [w for w in recwarn if "config" in str(w.message)]


def test_the_tables_do_not_overlap_the_honoured_fields():
    fields = set(KEYS)
    assert not set(NO_EFFECT_KEYS) & fields
    assert not set(REFUSED_UNLESS_DEFAULT) & fields
    assert not set(NO_EFFECT_KEYS) & set(REFUSED_UNLESS_DEFAULT)


def test_config_keys_command_prints_the_tables(capsys):
    assert main(["config", "keys"]) == 0
    out = capsys.readouterr().out
    assert "Accepted without effect" in out and "hostfile" in out and "launcher host list" in out
    assert "Refused unless NeoX's default" in out and "use_bnb_optimizer" in out
    assert "Defaults that differ from GPT-NeoX's" in out and "pos_emb" in out
    assert "override_lr_scheduler" in out and "fp32_allreduce" in out
    # each honoured key once (optimizer and fp16 were listed twice)
    honoured = out.split("Honoured (see docs/configs.md):\n")[1].split("\n")[0].split(", ")
    assert honoured.count("optimizer") == 1 and honoured.count("fp16") == 1
    assert len(honoured) == len(set(honoured))
    assert "train_data_paths" in out and "eod_mask_loss" in out and "finetune" in out


def test_fp32_allreduce_true_reduces_gradients_in_fp32(tmp_path):
    args = load_neox_config([_cfg(tmp_path, "precision: bf16\nfp32_allreduce: true\n")])
    assert (args.precision.grad_accum_dtype, args.precision.grad_dtype) == ("fp32", "fp32")
    with pytest.raises(ConfigError, match="fp32_allreduce: true asks for fp32.*bf16"):
        load_neox_config(
            [_cfg(tmp_path, "precision: bf16\nfp32_allreduce: true\ndata_types: {grad_accum_dtype: bf16}\n")]
        )


def test_moe_transformer_engine_and_generation_keys_are_refused_or_accepted_with_reasons(tmp_path):
    with pytest.raises(ConfigError, match="moe_num_experts.*mixture of experts is not implemented"):
        load_neox_config([_cfg(tmp_path, "moe_num_experts: 8\n")])
    with pytest.raises(ConfigError, match="te_mha.*Transformer Engine"):
        load_neox_config([_cfg(tmp_path, "te_mha: true\n")])
    with pytest.raises(ConfigError, match="fp16.type.*bfloat16 trains bf16 in older GPT-NeoX"):
        load_neox_config([_cfg(tmp_path, "fp16: {enabled: true, type: bfloat16}\n")])
    with pytest.raises(ConfigError, match="sliding_window_width.*shorter than seq_length 256"):
        load_neox_config([_cfg(tmp_path, "seq_length: 256\nsliding_window_width: 128\n")])
    with pytest.warns(UserWarning, match="covers the whole sequence"):
        load_neox_config([_cfg(tmp_path, "seq_length: 128\nsliding_window_width: 128\n")])
    with pytest.raises(ConfigError, match="deepspeed_extra_args.*bf16.*logging"):
        load_neox_config([_cfg(tmp_path, "deepspeed_extra_args: {bf16: {enabled: true}}\n")])
    text = "temperature: 0.5\nuse_comet: true\nglobal_num_gpus: 1\ndeepspeed_extra_args: {comms_logger: {}}\n"
    load_neox_config([_cfg(tmp_path, text)])


def test_data_keys_are_checked_together(tmp_path):
    with pytest.raises(ConfigError, match="data_path and train_data_paths are both set"):
        load_neox_config([_cfg(tmp_path, "data_path: a\ntrain_data_paths: [b]\n")])
    with pytest.raises(ConfigError, match="1 weights for 2 train_data_paths"):
        load_neox_config([_cfg(tmp_path, "train_data_paths: [a, b]\ntrain_data_weights: [1.0]\n")])
    args = load_neox_config([_cfg(tmp_path, "train-data-paths: [a, b]\ntrain-data-weights: [3, 1]\n")])
    assert args.data.train_data_paths == ("a", "b") and args.data.train_data_weights == (3.0, 1.0)


def test_a_missing_weighted_path_is_named_with_a_gpt2_tokenizer(tmp_path, capsys):
    # NeoX's default tokenizer and weighted paths: the error names the missing path, not the bundled corpus.
    text = (
        f"train_data_paths: [{tmp_path}/pile_a_text_document]\n"
        f"valid_data_paths: [{tmp_path}/pile_b_text_document]\n"
    )
    argv = ["train", "tiny", str(_cfg(tmp_path, text)), "--set", "tokenizer_type=GPT2BPETokenizer"]
    code = main([*argv, "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert "pile_a_text_document.bin" in err and "train_data_paths" in err, err
    assert "bundled" not in err and "corpus" not in err
