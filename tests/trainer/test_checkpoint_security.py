"""A checkpoint file is data: loading a hostile pickle runs nothing and fails with the file named."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from zerotopo.errors import ZerotopoError
from zerotopo.trainer.checkpoint import load_tensor_file


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_hostile_pickle_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    shard = tmp_path / "optim_rank0.pt"
    with open(shard, "wb") as f:
        pickle.dump({"units": _Payload(str(marker))}, f)
    with pytest.raises(ZerotopoError, match="optim_rank0.pt"):
        load_tensor_file(shard)
    assert not marker.exists()


def test_hostile_torch_save_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    shard = tmp_path / "optim_rank0.pt"
    torch.save({"step": 1, "evil": _Payload(str(marker))}, shard)
    with pytest.raises(ZerotopoError, match="never runs code"):
        load_tensor_file(shard)
    assert not marker.exists()


def test_plain_state_loads(tmp_path):
    shard = tmp_path / "optim_rank0.pt"
    state = {
        "step": 3,
        "param_groups": [{"lr": 0.1, "betas": (0.9, 0.95)}],
        "units": {"u": {"range": (0, 4), "master": torch.ones(4)}},
    }
    torch.save(state, shard)
    got = load_tensor_file(shard)
    assert got["step"] == 3 and torch.equal(got["units"]["u"]["master"], torch.ones(4))
