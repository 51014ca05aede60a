"""NeoX config reader: merging, key spelling, duplicates, unknown keys, value checks, batch sizes."""

from __future__ import annotations

import glob
import os
import warnings

import pytest
import yaml

from zerotopo.config import TrainConfig, load_neox_config
from zerotopo.config.neox import to_neox_dict
from zerotopo.config.tree import derive_batch_sizes
from zerotopo.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def load(*paths, overrides=None) -> TrainConfig:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an unexpected unknown-key warning fails the test
        return load_neox_config(paths, overrides)


def test_merge_two_files(tmp_path):
    a = write(tmp_path, "model.yml", "num-layers: 6\nhidden_size: 64\nnum_attention_heads: 2\n")
    b = write(
        tmp_path, "train.yml", "{ 'train-iters': 10, 'optimizer': {'type': 'Adam', 'params': {'lr': 6e-4}}, }"
    )
    args = load(a, b)
    assert (args.model.num_layers, args.model.hidden_size, args.train_iters) == (6, 64, 10)
    assert args.optim.optimizer.type == "Adam" and args.optim.lr == pytest.approx(
        6e-4
    )  # "6e-4" is a string to YAML
    assert args.sources["num_layers"] == a and args.sources["optimizer"] == b


def test_neox_json_style_file(tmp_path):
    text = '{\n  # comment\n  "num-layers": 2,\n  "gpt_j_residual": True,\n  "fp16": {"fp16": true, "enabled": true},\n}\n'
    args = load(write(tmp_path, "neox.yml", text))
    assert args.model.gpt_j_residual is True and args.precision.resolved == "fp16"


def test_duplicate_across_files_names_both(tmp_path):
    a = write(tmp_path, "a.yml", "seq_length: 64\n")
    b = write(tmp_path, "b.yml", "seq-length: 128\n")
    with pytest.raises(ConfigError) as exc:
        load(a, b)
    assert "a.yml" in str(exc.value) and "b.yml" in str(exc.value) and exc.value.key == "seq_length"


def test_duplicate_in_one_file(tmp_path):
    with pytest.raises(ConfigError, match="appears twice.*lines 1 and 2"):
        load(write(tmp_path, "a.yml", "num_layers: 2\nnum-layers: 3\n"))


def test_overrides_win_without_duplicate(tmp_path):
    a = write(tmp_path, "a.yml", "num_layers: 2\noptimizer: {type: Adam, params: {lr: 0.1, eps: 1.0e-6}}\n")
    args = load(a, overrides={"num-layers": "8", "optimizer.params.lr": "3e-4", "gpt_j_residual": "true"})
    assert args.model.num_layers == 8 and args.model.gpt_j_residual is True
    assert args.optim.lr == pytest.approx(3e-4) and args.optim.optimizer.eps == pytest.approx(1e-6)
    assert args.sources["num_layers"] == "--set"


def test_unknown_keys_one_error(tmp_path):
    # Unknown keys used to be dropped with one warning; now they are one error naming every one of them.
    a = write(
        tmp_path,
        "a.yml",
        "num_layers: 2\nfoo_bar: 1\nwarp-drive: true\ndata-impl: mmap\nfp16: {enabled: true, wat: 1}\n",
    )
    with pytest.raises(ConfigError) as record:
        load_neox_config([a])
    message = str(record.value)
    assert "foo_bar" in message and "warp_drive" in message and "fp16.wat" in message
    assert "data_impl" not in message  # a NeoX key with no effect here is accepted quietly


def test_pipeline_parallel_refused_unless_the_global_batch_is_fixed(tmp_path):
    # NeoX's 20B.yml: 4 pipeline stages x 2 tensor-parallel; micro x accumulation is per NeoX replica.
    path = write(
        tmp_path,
        "a.yml",
        "pipe-parallel-size: 4\nmodel-parallel-size: 2\ntrain_micro_batch_size_per_gpu: 4\n"
        "gradient_accumulation_steps: 32\n",
    )
    args = load_neox_config([path])
    with pytest.raises(ConfigError, match=r"4 x 32 x 2 samples per step.*set both to 1"):
        args.batch.batch_sizes(16)
    fixed = load_neox_config(
        [
            write(
                tmp_path,
                "b.yml",
                "pipe_parallel_size: 4\ntrain_micro_batch_size_per_gpu: 4\ntrain_batch_size: 1024\n",
            )
        ]
    )
    with pytest.warns(UserWarning, match="global batch is train_batch_size = 1024"):
        assert fixed.batch.batch_sizes(16) == (4, 16, 1024)


@pytest.mark.parametrize(
    "text, key, fragment",
    [
        ("num_layers: 0\n", "num_layers", "[1, 10000]"),
        ("num_layers: two\n", "num_layers", "integer"),
        ("rotary_pct: 1.5\n", "rotary_pct", "[0.0, 1.0]"),
        ("lr_decay_style: exponential\n", "lr_decay_style", "constant, linear, cosine"),
        ("gpt_j_residual: maybe\n", "gpt_j_residual", "true or false"),
        ("hidden_dropout: 0.1\n", "hidden_dropout", "dropout is not implemented"),
        ("optimizer: {type: LBFGS}\n", "optimizer.type", "Adam, AdamW"),
        ("optimizer: {params: {betas: [0.9]}}\n", "optimizer.params.betas", "two numbers"),
        ("split: 'a,b'\n", "split", "969,30,1"),
        ("hidden_size: 100\nnum_attention_heads: 3\n", "hidden_size", "multiple"),
        ("seq_length: 256\nmax_position_embeddings: 128\n", "max_position_embeddings", "at least"),
        ("precision: bf16\nfp16: {enabled: true}\n", "precision", "conflicts"),
        ("min_lr: 1.0\n", "min_lr", "above"),
    ],
)
def test_bad_values(tmp_path, text, key, fragment):
    path = write(tmp_path, "bad.yml", text)
    with pytest.raises(ConfigError) as exc:
        load(path)
    assert exc.value.key == key and exc.value.source == path
    assert fragment in str(exc.value)


def test_bad_value_names_value(tmp_path):
    with pytest.raises(ConfigError, match=r"num_layers: -3: expected"):
        load(write(tmp_path, "a.yml", "num_layers: -3\n"))


def test_missing_file_and_not_mapping(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load(str(tmp_path / "nope.yml"))
    with pytest.raises(ConfigError, match="mapping"):
        load(write(tmp_path, "list.yml", "- 1\n- 2\n"))
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(write(tmp_path, "broken.yml", "a: [1, 2\n"))


@pytest.mark.parametrize(
    "micro, accum, global_, world, want",
    [
        (4, 2, None, 8, (4, 2, 64)),
        (4, None, None, 8, (4, 1, 32)),
        (4, None, 64, 8, (4, 2, 64)),
        (None, 2, 64, 8, (4, 2, 64)),
        (None, None, 64, 8, (8, 1, 64)),
        (4, 2, 64, 8, (4, 2, 64)),
    ],
)
def test_batch_sizes(micro, accum, global_, world, want):
    assert derive_batch_sizes(micro, accum, global_, world) == want


@pytest.mark.parametrize(
    "micro, accum, global_", [(4, 2, 60), (None, 3, 64), (None, None, None), (None, 2, None)]
)
def test_batch_size_errors(micro, accum, global_):
    with pytest.raises(ConfigError, match="data-parallel ranks|train_micro_batch_size_per_gpu"):
        derive_batch_sizes(micro, accum, global_, 8)


def test_model_config_and_vocab_padding(tmp_path):
    args = load(write(tmp_path, "a.yml", "no_weight_tying: false\nbias_gelu_fusion: true\nseq_length: 64\n"))
    assert args.model.padded_vocab(257) == 384 and args.model.padded_vocab(256) == 256
    cfg = args.model.model_config(257)
    assert cfg.vocab_size == 384 and cfg.tie_embeddings and cfg.gelu_approximate
    assert cfg.max_position_embeddings == 64
    shape = args.model.model_shape(257)
    assert shape.seq_length == 64 and shape.tie_embeddings and shape.vocab_size == 384


def test_to_dict_dumps_and_reloads(tmp_path):
    args = load(os.path.join(ROOT, "configs", "neox-20b.yml"))
    d = to_neox_dict(args)
    text = yaml.safe_dump(d)
    path = write(tmp_path, "dumped.yml", text)
    again = load(path)
    assert again == args


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "configs", "*.yml"))))
def test_shipped_configs_load(path):
    args = load(path)
    assert args.sharding.topology and args.sharding.plan == "zerotopo" and args.train_iters
    micro, accum, global_ = args.batch.batch_sizes(8)
    assert global_ == micro * accum * 8
    args.model.model_shape(50277)


def test_hf_tokenizer_without_vocab_file_plans_and_is_refused_when_built(tmp_path):
    # planning needs no tokenizer file (GPT-NeoX's pythia configs leave vocab_file to local_setup.yml);
    # building the tokenizer, which train's pre-flight does before any rank starts, refuses it
    from zerotopo.data.tokenizers import build_tokenizer

    args = load_neox_config([write(tmp_path, "hf.yml", "tokenizer_type: HFTokenizer\n")])
    with pytest.raises(ConfigError, match="HFTokenizer needs vocab_file"):
        build_tokenizer(
            args.data.tokenizer_type, args.data.vocab_file, args.data.merge_file, args.data.eod_token
        )
