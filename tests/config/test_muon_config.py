"""The ``optimizer: {type: Muon, params: {..., aux: {...}}}`` block (zerotopo/config/muon.py): checked
against torch's ``Muon`` and the aux type, written back as read, and its states and bytes."""

from __future__ import annotations

import inspect

import pytest
import torch

from zerotopo.config.muon import MUON, MUON_DEFAULTS, split_hyperparameters
from zerotopo.config.neox import load_neox_config, to_neox_dict
from zerotopo.errors import ConfigError


def _load(tmp_path, text: str):
    path = tmp_path / "c.yml"
    path.write_text(text)
    return load_neox_config([str(path)])


def test_defaults_are_torchs():
    sig = inspect.signature(torch.optim.Muon.__init__).parameters
    assert set(MUON.params) - {"aux"} <= set(sig)
    for key, value in MUON_DEFAULTS.items():
        assert sig[key].default == value, key


def test_block_reads_muon_and_its_aux(tmp_path):
    args = _load(
        tmp_path,
        "optimizer: {type: muon, params: {lr: 0.02, weight_decay: 0.01, adjust_lr_fn: match_rms_adamw,"
        " aux: {type: adam, lr: 6.0e-4, betas: [0.9, 0.99]}}}\n",
    )
    assert args.optim.optimizer.type == "Muon" and args.optim.lr == pytest.approx(0.02)
    hyper = args.optim.optimizer.hyperparameters()
    assert hyper["aux"] == {"type": "AdamW", "lr": 6e-4, "betas": (0.9, 0.99)}
    assert args.optim.optimizer.state_names() == ("exp_avg", "exp_avg_sq", "momentum_buffer")
    assert args.optim.optimizer.bytes_per_param() == 16
    again = _load(tmp_path, "optimizer: " + repr(to_neox_dict(args)["optimizer"]).replace("'", '"') + "\n")
    assert again.optim.optimizer == args.optim.optimizer  # the run's config.yml round trip
    muon, kind, aux, aux_lr, aux_wd = split_hyperparameters(hyper, lr=0.02, weight_decay=0.01)
    assert (kind, aux_lr, aux_wd, muon["nesterov"], muon["ns_steps"]) == ("AdamW", 6e-4, 0.01, True, 5)
    sgd = _load(tmp_path, "optimizer: {type: Muon, params: {aux: {type: SGD, momentum: 0.9}}}\n")
    assert sgd.optim.optimizer.state_names() == ("momentum_buffer",)  # SGD's and Muon's: one buffer


@pytest.mark.parametrize(
    "params, fragment",
    [
        ("{betas: [0.9, 0.95]}", "Muon takes no 'betas'"),
        ("{adjust_lr_fn: wild}", "expected one of original, match_rms_adamw"),
        ("{ns_steps: 100}", "ns_steps"),
        ("{aux: {type: Muon}}", "the aux optimizer must be elementwise"),
        ("{aux: {type: LBFGS}}", "cannot run on flat shards"),
        ("{aux: {type: SGD, betas: [0.9, 0.9]}}", "aux.betas: SGD takes no 'betas'"),
    ],
)
def test_bad_blocks_are_refused_naming_the_key(tmp_path, params, fragment):
    with pytest.raises(ConfigError, match="optimizer.params") as exc:
        _load(tmp_path, f"optimizer: {{type: Muon, params: {params}}}\n")
    assert fragment in str(exc.value)
