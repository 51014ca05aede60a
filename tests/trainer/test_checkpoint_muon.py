"""Checkpoints of Muon (zerotopo/engine/muon.py): its momentum and the aux AdamW's moments are stored per
parameter like any optimizer's states, so a run resumes bit for bit, reshards from 8 ranks (zero3: one
optimizer group of 8 owners) to 4 ranks under mics (two groups of 2: every matrix changes owner), is
verified and exported; resuming with another type is refused before any rank starts, and ``finetune:
true`` starts Muon from an AdamW checkpoint's weights."""

from __future__ import annotations

import json

import pytest
import torch

from tests.trainer.ckpt_workers import cfg as tiny_cfg
from tests.trainer.ckpt_workers import checkpoint_worker
from tests.trainer.test_checkpoint_reshard import all_tensors
from zerotopo.checkpoint.store import preflight_load, verify_checkpoint
from zerotopo.errors import ZerotopoError
from zerotopo.launch.spawn import spawn
from zerotopo.trainer.export_state import export_dcp, optimizer_kinds, read_state

pytestmark = pytest.mark.slow

MUON = ("Muon", {"momentum": 0.9, "aux": {"type": "AdamW", "lr": 3e-3}})
STATES = ["exp_avg", "exp_avg_sq", "momentum_buffer"]
QKV = "layers.0.attention.query_key_value.weight"


def _run(out, world: int, steps: int, load_from=None, plan: str = "zero3") -> None:
    spawn(
        checkpoint_worker, world, args=(str(out), plan, world // 2, steps, load_from, False, None, MUON),
        ranks_per_node=2, timeout_s=900,
    )  # fmt: skip


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("muon")
    _run(root / "straight", 8, 3)  # three steps without a break
    _run(root / "first", 8, 2)  # two steps, saved ...
    _run(root / "resumed", 8, 3, str(root / "first" / "step_2"))  # ... loaded and trained one more
    _run(root / "four-ranks", 4, 2, str(root / "first" / "step_2"), plan="mics")  # ... on 4 ranks, saved
    return root


def test_states_are_stored_per_parameter_and_recorded(saved, tmp_path):
    step = saved / "first" / "step_2"
    assert {k.split("/", 1)[0] for k in all_tensors(step)} == {"param", *STATES}
    manifest = json.loads((step / "checkpoint.json").read_text())
    assert manifest["optimizer"] == {"type": "Muon", "states": STATES, "scalars": {}}
    assert verify_checkpoint(step).pieces > 0
    assert optimizer_kinds(step) == ("param", *STATES)
    state = read_state(step, kinds=optimizer_kinds(step))
    # the fused QKV matrix carries Muon's momentum, the embedding AdamW's moments; each state is kept
    # (at its initial zero) where the other optimizer runs
    assert state[f"momentum_buffer/{QKV}"].abs().sum() > 0 and state[f"exp_avg/{QKV}"].abs().sum() == 0
    assert state["exp_avg/embed_in.weight"].abs().sum() > 0
    assert state["momentum_buffer/embed_in.weight"].abs().sum() == 0
    out = export_dcp(step, tmp_path / "dcp", optimizer=True)
    from torch.distributed.checkpoint import FileSystemReader

    exported = FileSystemReader(str(out)).read_metadata().state_dict_metadata
    assert {k.split("/", 1)[0] for k in exported if "/" in k} == set(STATES)


def test_resume_continues_bit_for_bit(saved):
    a, b = all_tensors(saved / "straight" / "step_3"), all_tensors(saved / "resumed" / "step_3")
    assert sorted(a) == sorted(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_reshards_from_8_ranks_to_4_with_other_owners(saved):
    a, b = all_tensors(saved / "first" / "step_2"), all_tensors(saved / "four-ranks" / "step_2")
    assert sorted(a) == sorted(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert json.loads((saved / "four-ranks" / "step_2" / "checkpoint.json").read_text())["world_size"] == 4


def test_resuming_with_another_type_is_refused_naming_both(saved):
    step = saved / "first" / "step_2"
    with pytest.raises(ZerotopoError, match="optimizer state of Muon, this run's optimizer is AdamW"):
        preflight_load(step, tiny_cfg(), ("AdamW", ("exp_avg", "exp_avg_sq")))
    with pytest.raises(ZerotopoError, match="holds Muon state exp_avg, exp_avg_sq, momentum_buffer"):
        preflight_load(step, tiny_cfg(), ("Muon", ("momentum_buffer",)))  # another aux type
    assert preflight_load(step, tiny_cfg(), ("Muon", tuple(STATES))).step == 2


def test_train_cli_refuses_adamw_as_muon_and_finetunes_into_muon(tmp_path):
    """``zerotopo train``: an AdamW checkpoint resumed with ``optimizer.type=muon`` stops before any rank
    starts; ``finetune=true`` starts Muon from its weights, prints the split, and records Muon."""
    from tests.trainer.test_neox_import import MODEL, TOPOLOGY, _run

    (tmp_path / "model.yml").write_text(MODEL)
    (tmp_path / "two.yaml").write_text(TOPOLOGY)
    argv = ["train", "model.yml", "--topology", "two.yaml", "--no-progress"]

    def train(*sets: str, run: str, ok: bool = True):
        return _run([*argv, "--run-dir", run, *(a for s in sets for a in ("--set", s))], tmp_path, ok=ok)

    train("save=ckpt", "train_iters=1", run="r1")
    muon = ("optimizer.type=muon", "optimizer.params.lr=0.02", "optimizer.params.aux.lr=0.001")
    refused = train("load=ckpt", "save=ckpt", "train_iters=2", *muon, run="r1", ok=False)
    said = refused.stdout + refused.stderr
    assert "holds the optimizer state of AdamW, this run's optimizer is Muon" in said
    assert not (tmp_path / "ckpt" / "step_2").exists()
    tuned = train("load=ckpt", "save=tuned", "finetune=true", "train_iters=1", *muon, run="r2")
    said = tuned.stdout + tuned.stderr
    assert "finetune: weights of step 1" in said
    assert "optimizer Muon (lr 0.02" in said and "AdamW (lr 0.001" in said
    manifest = json.loads((tmp_path / "tuned" / "step_1" / "checkpoint.json").read_text())
    assert manifest["optimizer"] == {"type": "Muon", "states": STATES, "scalars": {}}
