"""GPT-NeoX's published configs as written (tests/fixtures/neox: their keys and values, each file naming
its source): each parses and plans for Frontier, or is refused for a reason `zerotopo config keys` lists;
representative ones train on 8 ranks shrunk with ``--set`` only."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from zerotopo.cli.main import main
from zerotopo.config.neox import load_neox_config
from zerotopo.config.neox_keys import keys_table
from zerotopo.errors import ConfigError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "neox"
PUBLISHED = FIXTURES / "published"
LLAMA = [FIXTURES / "llama" / "7B.yml", FIXTURES / "llama" / "train_config.yml"]

# file -> None (parses) or the key it is refused for, which `zerotopo config keys` must list
EXPECTED = {
    "pythia/14M.yml": None,
    "pythia/160M.yml": None,
    "pythia/1B.yml": "fp16.type",
    "llama2/7B.yml": None,
    "mistral/7B.yml": "sliding_window_width",
    "125M-dmoe.yml": "moe_num_experts",
    "1-3B-transformer-engine.yml": "te_",
    "20B.yml": None,
    "19M.yml": None,
    "bf16_125M.yml": None,
    "sparse.yml": "attention_config",
}


def _files(name: str) -> list[Path]:
    return [PUBLISHED / name]


def test_every_fixture_names_its_published_source():
    for path in [*PUBLISHED.rglob("*.yml"), *LLAMA]:
        head = path.read_text().splitlines()[0]
        assert head.startswith("# The keys and values of GPT-NeoX's configs/"), path
        assert "Apache-2.0" in path.read_text().splitlines()[1], path


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_published_config_parses_or_is_refused_for_a_listed_reason(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if EXPECTED[name] is None:
            load_neox_config(_files(name))
            return
        with pytest.raises(ConfigError) as exc:
            load_neox_config(_files(name))
    key = exc.value.key or ""
    assert key.startswith(EXPECTED[name]), str(exc.value)
    assert key in keys_table(), f"{key} is refused but not listed by `zerotopo config keys`"


def test_llama_7b_with_its_train_config_reads_as_published():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing reported as ignored
        args = load_neox_config(LLAMA)
    assert (
        args.optim.override_lr_scheduler
        and args.checkpoint.finetune
        and args.model.init_method == "small_init"
    )
    assert (args.optim.lr, args.optim.min_lr, args.model.mlp_multiple_of) == (0.0002, 2e-05, 256)
    assert args.model.model_config(32000).ffn_size == 11008


@pytest.mark.parametrize("name", sorted(n for n, why in EXPECTED.items() if why is None))
def test_published_config_plans_for_frontier(name, capsys):
    code = main(["plan", "--topology", "frontier", "--nodes", "48", "--plans", "presets", "--model",
                 *map(str, _files(name))])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "parameters on frontier x 48 nodes" in out


def test_a_refused_config_stops_before_any_rank_starts(capsys):
    code = main(["train", str(PUBLISHED / "125M-dmoe.yml"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "moe_num_experts: 8 is not implemented" in err and "mixture of experts" in err


SHRINK = {
    "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32,
    "max_position_embeddings": 32, "train_micro_batch_size_per_gpu": 2, "train_iters": 2, "lr_decay_iters": 2,
    "eval_iters": 0, "log_interval": 1, "tokenizer_type": "ByteTokenizer", "vocab_file": None,
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, extra",
    [
        ("pythia/14M.yml", {"train_data_paths": None, "valid_data_paths": None, "test_data_paths": None}),
        ("mistral/7B.yml", {"num_kv_heads": 2, "intermediate_size": 256}),
    ],
)
def test_published_config_trains_on_8_ranks_shrunk_with_set_only(name, extra, tmp_path, capfd):
    """pythia/14M as published (fp16, parallel residual, a quarter rotary, flash attention) and mistral/7B
    (grouped-query attention, its sliding window covering the shrunk sequence), on the bundled corpus."""
    sets = {**SHRINK, **extra, "save": str(tmp_path / "save")}
    argv = ["train", str(PUBLISHED / name), "--no-progress", "--run-dir", str(tmp_path / "run")]
    code = main(argv + [a for k, v in sets.items() for a in ("--set", f"{k}={json.dumps(v)}")])
    out, err = capfd.readouterr()
    assert code == 0, (out + err)[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["world_size"] == 8 and summary["steps"] == 2
    assert 0 < summary["final_loss"] < 10
