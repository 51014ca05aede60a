"""New checkpointed state is one registration: a component registered beside the standard set (no change
to zerotopo.checkpoint) is saved, verified, and restored on resume; and the checkpointer refuses what would
make two components' state collide."""

from __future__ import annotations

import json

import pytest
import torch

from tests.trainer.component_workers import component_worker
from zerotopo.checkpoint.components import Checkpointer, Record
from zerotopo.checkpoint.store import read_tensors, verify_checkpoint
from zerotopo.launch.spawn import spawn


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("components")
    straight = spawn(component_worker, 2, args=(str(root / "straight"), 3), ranks_per_node=2, timeout_s=900)
    spawn(component_worker, 2, args=(str(root / "first"), 2), ranks_per_node=2, timeout_s=900)
    resumed = spawn(
        component_worker, 2, args=(str(root / "resumed"), 3, str(root / "first")), ranks_per_node=2,
        timeout_s=900,
    )  # fmt: skip
    return root, straight, resumed


@pytest.mark.slow
def test_a_registered_component_is_saved_and_verified(runs):
    root, straight, _ = runs
    step = root / "first" / "step_2"
    manifest = json.loads((step / "checkpoint.json").read_text())
    assert manifest["loss_count"] == 2
    assert manifest["components"]["losses"] == ["losses"]
    assert manifest["components"]["model"] == ["param"] and manifest["components"]["rng"] == ["rng"]
    report = verify_checkpoint(step)  # ckpt verify: its tensor is accepted and its checksum read
    stored = read_tensors(step, {"losses/history": (8,)})["losses/history"]
    assert stored[:2].tolist() == straight[0]["history"][:2] and stored[2:].abs().sum() == 0
    assert report.pieces > 0


@pytest.mark.slow
def test_a_registered_component_is_restored_on_resume(runs):
    root, straight, resumed = runs
    for rank in resumed:
        assert rank["loaded_from_checkpoint"]
        assert rank["loaded"] == {"count": 2, "history": straight[0]["history"][:2]}
    # the rest of the run is the straight run's, bit for bit, and so is what the component saved
    assert resumed[0]["history"] == straight[0]["history"]
    a = read_tensors(root / "straight" / "step_3", {"losses/history": (8,)})
    b = read_tensors(root / "resumed" / "step_3", {"losses/history": (8,)})
    assert torch.equal(a["losses/history"], b["losses/history"])


def test_two_components_saving_one_key_are_refused(tmp_path):
    checkpointer = Checkpointer([Record("a", {"seed": 1}), Record("b", {"seed": 2})])
    with pytest.raises(ValueError, match="'a' and 'b' both save 'seed'"):
        checkpointer.snapshot(tmp_path, step=1)


def test_a_component_may_not_take_the_checkpointers_own_keys(tmp_path):
    with pytest.raises(ValueError, match="'the checkpointer' and 'a' both save 'step'"):
        Checkpointer([Record("a", {"step": 3})]).snapshot(tmp_path, step=1)


def test_registration_refuses_a_second_name_and_a_non_component():
    checkpointer = Checkpointer([Record("a", {})])
    with pytest.raises(ValueError, match="named 'a' is already registered"):
        checkpointer.register(Record("a", {}))
    with pytest.raises(ValueError, match="needs a name, state_dict"):
        checkpointer.register(object())


def test_a_snapshot_records_json_in_the_manifest_and_tensors_in_the_shards(tmp_path):
    checkpointer = Checkpointer([Record("a", {"x": 1, "t/v": torch.ones(2)})])
    pending = checkpointer.snapshot(tmp_path, step=5)
    assert pending.manifest["x"] == 1 and pending.manifest["step"] == 5
    assert pending.manifest["components"] == {"a": ["t"]}
    assert list(pending.state) == ["t/v"] and pending.nbytes == 8
