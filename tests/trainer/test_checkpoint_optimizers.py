"""Checkpoints of an optimizer other than AdamW (RMSprop with momentum and centering: three per-element
states): saved as ``<state>/<parameter>``, resumed bit for bit, resharded to another world size, verified
and exported with its own states; resuming it with another type is refused naming both, and a
weights-only load starts any type afresh from its weights."""

from __future__ import annotations

import json

import pytest
import torch

from tests.trainer.ckpt_workers import cfg as tiny_cfg
from tests.trainer.ckpt_workers import checkpoint_worker
from tests.trainer.test_checkpoint_reshard import all_tensors
from zerotopo.checkpoint.store import preflight_load, read_tensors, verify_checkpoint
from zerotopo.errors import ZerotopoError
from zerotopo.launch.spawn import spawn
from zerotopo.trainer.export_state import export_dcp, optimizer_kinds, read_state

pytestmark = pytest.mark.slow

RMSPROP = ("RMSprop", {"momentum": 0.5, "centered": True})
STATES = ["square_avg", "momentum_buffer", "grad_avg"]


def _run(out, world: int, steps: int, load_from=None) -> None:
    spawn(
        checkpoint_worker, world, args=(str(out), "zero3", world // 2, steps, load_from, False, None, RMSPROP),
        ranks_per_node=2, timeout_s=900,
    )  # fmt: skip


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("optimizers")
    _run(root / "straight", 4, 3)  # three steps without a break
    _run(root / "first", 4, 2)  # two steps, saved ...
    _run(root / "resumed", 4, 3, str(root / "first" / "step_2"))  # ... loaded and trained one more
    _run(root / "two-ranks", 2, 2, str(root / "first" / "step_2"))  # ... loaded on 2 ranks and saved
    return root


def test_states_are_stored_per_parameter_and_recorded(saved, tmp_path):
    step = saved / "first" / "step_2"
    keys = {k.split("/", 1)[0] for k in all_tensors(step)}
    assert keys == {"param", *STATES}
    manifest = json.loads((step / "checkpoint.json").read_text())
    assert manifest["optimizer"] == {"type": "RMSprop", "states": STATES, "scalars": {}}
    assert verify_checkpoint(step).pieces > 0
    assert optimizer_kinds(step) == ("param", *STATES)
    state = read_state(step, kinds=optimizer_kinds(step))
    assert "square_avg/layers.0.attention.query_key_value.weight" in state
    assert state["square_avg/layers.0.attention.query_key_value.weight"].min() >= 0
    assert state["momentum_buffer/layers.0.attention.query_key_value.weight"].abs().sum() > 0  # trained
    # zerotopo export --format dcp --optimizer: the optimizer's own states
    from torch.distributed.checkpoint import FileSystemReader

    out = export_dcp(step, tmp_path / "dcp", optimizer=True)
    exported = FileSystemReader(str(out)).read_metadata().state_dict_metadata
    assert {k.split("/", 1)[0] for k in exported if "/" in k} == set(STATES)
    assert "layers.0.attention.query_key_value.weight" in exported


def test_resume_continues_bit_for_bit(saved):
    a, b = all_tensors(saved / "straight" / "step_3"), all_tensors(saved / "resumed" / "step_3")
    assert sorted(a) == sorted(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_reshards_to_another_world_size(saved):
    a, b = all_tensors(saved / "first" / "step_2"), all_tensors(saved / "two-ranks" / "step_2")
    assert sorted(a) == sorted(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_resuming_with_another_type_is_refused_naming_both(saved):
    step = saved / "first" / "step_2"
    with pytest.raises(ZerotopoError, match="optimizer state of RMSprop, this run's optimizer is AdamW"):
        preflight_load(step, tiny_cfg(), ("AdamW", ("exp_avg", "exp_avg_sq")))
    with pytest.raises(ZerotopoError, match="holds RMSprop state square_avg, momentum_buffer, grad_avg"):
        preflight_load(step, tiny_cfg(), ("RMSprop", ("square_avg",)))
    assert preflight_load(step, tiny_cfg(), ("RMSprop", tuple(STATES))).step == 2
    assert preflight_load(step, tiny_cfg(), None).step == 2  # weights only: any optimizer


def _weights_only_worker(rank: int, world: int, step_dir: str) -> dict:
    from zerotopo.checkpoint.store import load_checkpoint
    from zerotopo.comm.mesh import build_mesh
    from zerotopo.engine import ShardedOptimizer, parallelize
    from zerotopo.models.neox import GPTNeoX
    from zerotopo.placement.plan import load_plan
    from zerotopo.placement.topology import load_topology

    mesh = build_mesh(load_topology("emulated-4node", nodes=1), load_plan("zero3"), topo_index=rank)
    model = parallelize(GPTNeoX(tiny_cfg()), mesh=mesh)
    opt = ShardedOptimizer(model, torch.optim.SGD, lr=1e-2)
    state = load_checkpoint(step_dir, model, opt, cfg=tiny_cfg(), weights_only=True)
    out = {"step": state.step, "steps": opt.step_count, "states": list(opt.states)}
    params = model.full_state_dict()  # collective: every rank takes part
    out["params"] = params if rank == 0 else None
    model.close()
    return out


def test_weights_only_load_starts_another_type_afresh(saved):
    step = saved / "first" / "step_2"
    res = spawn(_weights_only_worker, 2, args=(str(step),), ranks_per_node=2, timeout_s=900)
    assert res[0]["step"] == 2 and res[0]["steps"] == 0 and res[0]["states"] == []
    params = res[0]["params"]
    stored = read_tensors(step, {f"param/{n}": (t.numel(),) for n, t in params.items()})
    for n, t in params.items():
        assert torch.equal(t.reshape(-1), stored[f"param/{n}"]), n


@pytest.mark.parametrize(
    "entry, fragment",
    [
        ({"type": "LBFGS", "states": []}, "optimizer type 'LBFGS': LBFGS keeps whole-model history"),
        ({"type": "RMSprop", "states": ["exp_avg"]}, "RMSprop keeps some of grad_avg, momentum_buffer"),
        ({"type": "NAdam", "states": [], "scalars": {"mu_product": "x"}}, "are not NAdam's"),
        ("AdamW", '"optimizer" must be an object'),
    ],
)
def test_damaged_optimizer_entry_is_refused(saved, tmp_path, entry, fragment):
    import shutil

    step = tmp_path / "step_2"
    shutil.copytree(saved / "first" / "step_2", step)
    manifest = json.loads((step / "checkpoint.json").read_text())
    manifest["optimizer"] = entry
    (step / "checkpoint.json").write_text(json.dumps(manifest))
    with pytest.raises(ZerotopoError, match="the manifest is damaged|cannot run on flat shards") as exc:
        preflight_load(step, tiny_cfg(), None)
    assert fragment in str(exc.value)


def test_train_cli_resumes_only_with_the_writers_type_and_finetunes_into_another(tmp_path):
    """``zerotopo train``: resuming an AdamW checkpoint with ``optimizer.type=SGD`` stops before any rank
    starts, naming both; ``finetune=true`` starts SGD from its weights, and SGD's checkpoint records it."""
    from tests.trainer.test_neox_import import MODEL, TOPOLOGY, _run

    (tmp_path / "model.yml").write_text(MODEL)
    (tmp_path / "two.yaml").write_text(TOPOLOGY)
    argv = ["train", "model.yml", "--topology", "two.yaml", "--no-progress"]

    def train(*sets: str, run: str, ok: bool = True):
        return _run([*argv, "--run-dir", run, *(a for s in sets for a in ("--set", s))], tmp_path, ok=ok)

    train("save=ckpt", "train_iters=1", run="r1")
    sgd = ("optimizer.type=sgd", "optimizer.params.momentum=0.9")
    refused = train("load=ckpt", "save=ckpt", "train_iters=2", *sgd, run="r1", ok=False)
    said = refused.stdout + refused.stderr
    assert "holds the optimizer state of AdamW, this run's optimizer is SGD" in said
    assert "set finetune: true" in said and not (tmp_path / "ckpt" / "step_2").exists()
    tuned = train("load=ckpt", "save=tuned", "finetune=true", "train_iters=1", *sgd, run="r2")
    assert "finetune: weights of step 1" in tuned.stdout + tuned.stderr
    manifest = json.loads((tmp_path / "tuned" / "step_1" / "checkpoint.json").read_text())
    assert manifest["optimizer"] == {"type": "SGD", "states": ["momentum_buffer"], "scalars": {}}
    keys = {k.split("/", 1)[0] for k in all_tensors(tmp_path / "tuned" / "step_1")}
    assert keys == {"param", "momentum_buffer"}
