"""The config tree and its one validator: a config built in code and one read from NeoX YAML files are
validated by the same call; the NeoX key table covers the tree; no other module reads a NeoX name."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from zerotopo.config.neox import KEYS, load_neox_config
from zerotopo.config.tree import (
    SECTIONS,
    BatchConfig,
    DataConfig,
    FP16Config,
    ModelConfig,
    OptimConfig,
    OptimizerConfig,
    PrecisionConfig,
    TrainConfig,
    field_at,
)
from zerotopo.config.validate import validate
from zerotopo.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yml"
    path.write_text(text)
    return path


def test_every_default_passes_its_check():
    # validate() skips a field holding its default: that is sound only while every default is valid
    for cls in (TrainConfig, *SECTIONS.values(), FP16Config):
        for f in dataclasses.fields(cls):
            check = f.metadata.get("check")
            if check is not None:
                assert check(f.default) == f.default, f"{cls.__name__}.{f.name}"


def test_the_key_table_places_every_field_once():
    paths = list(KEYS.values())
    assert len(paths) == len(set(paths))
    fields = {
        f"{name}.{f.name}"
        for name, cls in SECTIONS.items()
        for f in dataclasses.fields(cls)
        if f.name != "origin"
    }
    fields |= {
        f.name for f in dataclasses.fields(TrainConfig) if f.name not in SECTIONS and f.name != "origin"
    }
    assert set(paths) == fields
    for path in paths:
        assert field_at(path).name == path.rpartition(".")[2]


def test_a_config_built_in_code_is_normalized():
    config = validate(
        TrainConfig(
            model=ModelConfig(num_layers="6", norm="RMSNorm"),
            optim=OptimConfig(
                optimizer=OptimizerConfig(type="adamw", lr="6e-4", betas=[0.9, 0.95]), min_lr=0
            ),
            data=DataConfig(split="98,2,0"),
            seed="7",
        )
    )
    assert (config.model.num_layers, config.model.norm, config.seed) == (6, "rmsnorm", 7)
    assert config.optim.optimizer == OptimizerConfig(type="AdamW", lr=6e-4, betas=(0.9, 0.95))
    assert config.data.split == (0.98, 0.02, 0.0)
    assert validate(config) == config  # checking a checked config changes nothing


@pytest.mark.parametrize(
    "config, key, message",
    [
        (
            TrainConfig(model=ModelConfig(num_layers=0)),
            "model.num_layers",
            "expected an integer in [1, 10000]",
        ),
        (
            TrainConfig(model=ModelConfig(hidden_size=130)),
            "model.hidden_size",
            "not a multiple of num_attention_heads 4",
        ),
        (
            TrainConfig(precision=PrecisionConfig(fp16=FP16Config(hysteresis=0))),
            "precision.fp16.hysteresis",
            "[1",
        ),
        (
            TrainConfig(precision=PrecisionConfig(fp16=FP16Config(enabled=True), bf16=True)),
            "precision.dtype",
            "conflicts with enabled blocks",
        ),
        (
            TrainConfig(optim=OptimConfig(optimizer=OptimizerConfig(type="SGD", betas=(0.8, 0.9)))),
            "optim.optimizer.betas",
            "SGD takes no 'betas'",
        ),
        (
            TrainConfig(optim=OptimConfig(optimizer=OptimizerConfig(type="LBFGS"))),
            "optim.optimizer.type",
            "LBFGS",
        ),
        (
            TrainConfig(data=DataConfig(valid_data_paths=("v",))),
            "data.train_data_paths",
            "without train_data_paths",
        ),
        (TrainConfig(seed=-1), "seed", "expected an integer"),
    ],
)
def test_a_config_built_in_code_is_refused_naming_the_field(config, key, message):
    with pytest.raises(ConfigError) as err:
        validate(config)
    assert err.value.key == key and err.value.source is None
    assert message in str(err.value)


def test_the_reader_and_code_share_the_validator(tmp_path):
    # the same bad value: read from a file, the error names the NeoX key and the file
    path = _write(tmp_path, "train_micro_batch_size_per_gpu: 0\n")
    with pytest.raises(ConfigError) as from_file:
        load_neox_config([path])
    with pytest.raises(ConfigError) as from_code:
        validate(TrainConfig(batch=BatchConfig(micro_batch_size=0)))
    assert (from_file.value.key, from_file.value.source) == ("train_micro_batch_size_per_gpu", str(path))
    assert from_code.value.key == "batch.micro_batch_size"
    assert str(from_file.value).split(": ", 2)[2] == str(from_code.value).split(": ", 1)[1]


def test_a_read_config_records_where_each_key_came_from(tmp_path):
    path = _write(tmp_path, "train_batch_size: 64\nbf16: {enabled: true}\n")
    config = load_neox_config([path], {"seq_length": 64})
    assert config.batch.where("global_batch_size") == {"source": str(path), "key": "train_batch_size"}
    assert config.precision.where("bf16") == {"source": str(path), "key": "bf16.enabled"}
    assert config.model.where("seq_length") == {"source": "--set", "key": "seq_length"}
    assert config.model.where("num_layers") == {"source": None, "key": "num_layers"}
    assert config.model.is_given("seq_length") and not config.model.is_given("num_layers")
    assert config.sources == {"train_batch_size": str(path), "bf16": str(path), "seq_length": "--set"}
    assert validate(config) == config


# Key names of GPT-NeoX and DeepSpeed that the tree spells otherwise: only the compatibility module
# (and the messages that quote a user's key) may use them.
# (``precision`` is also the name of a section.)
_RENAMED = sorted(
    k for k, path in KEYS.items() if "." not in k and path.rpartition(".")[2] != k and k not in SECTIONS
)


def test_no_module_reads_a_neox_name_as_a_config_field():
    assert "train_micro_batch_size_per_gpu" in _RENAMED and "make_vocab_size_divisible_by" in _RENAMED
    attribute = re.compile(r"\.(" + "|".join(_RENAMED) + r")\b")
    readers = [
        p
        for folder in ("zerotopo", "zerotopo_lab")
        for p in sorted((ROOT / folder).rglob("*.py"))
        if p.name not in ("neox.py", "neox_keys.py", "neox_defaults.py") or p.parent.name != "config"
    ]
    found = [
        f"{p.relative_to(ROOT)}: {m.group(0)}" for p in readers for m in attribute.finditer(p.read_text())
    ]
    assert found == []


def test_config_keys_and_the_reference_show_each_keys_field():
    from zerotopo.config.neox_keys import keys_table
    from zerotopo.config.reference import render

    table, doc = keys_table(), render()
    assert re.search(r"\n  train_micro_batch_size_per_gpu +batch\.micro_batch_size\n", table)
    assert "| `train_micro_batch_size_per_gpu` | `batch.micro_batch_size` | — | Samples per rank" in doc
    assert "| `bf16.enabled` | `precision.bf16` | `False` |" in doc
