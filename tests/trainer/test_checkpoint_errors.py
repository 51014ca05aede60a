"""Bad checkpoints are refused before any rank trains, with the file and the defect named; nothing in a
checkpoint directory is ever unpickled; nothing is overwritten."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from dataclasses import replace

import pytest
import torch

from tests.trainer.ckpt_workers import cfg as tiny_cfg
from tests.trainer.ckpt_workers import checkpoint_worker
from zerotopo.checkpoint.store import find_checkpoint, preflight_load, read_tensors
from zerotopo.errors import ZerotopoError
from zerotopo.launch.spawn import spawn

pytestmark = pytest.mark.slow  # a module fixture trains and saves a checkpoint on spawned ranks


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    root = tmp_path_factory.mktemp("good")
    spawn(checkpoint_worker, 2, args=(str(root / "save"), "zero3", 1, 1), ranks_per_node=2, timeout_s=900)
    return root / "save"


@pytest.fixture
def ckpt(good, tmp_path):
    """A fresh copy of a good 2-rank checkpoint: ``save/`` with ``latest`` and ``step_1/``."""
    dst = tmp_path / "save"
    shutil.copytree(good, dst)
    return dst


def refused(path, match, cfg=None):
    with pytest.raises(ZerotopoError, match=match) as info:
        preflight_load(path, cfg or tiny_cfg())
    return str(info.value)


def test_good_checkpoint_passes(ckpt):
    assert preflight_load(ckpt, tiny_cfg()).step == 1
    assert find_checkpoint(ckpt) == ckpt / "step_1"
    assert preflight_load(ckpt / "step_1", tiny_cfg()).step == 1


def test_empty_or_missing_directory_means_no_checkpoint(tmp_path):
    assert find_checkpoint(tmp_path / "nothing") is None
    assert find_checkpoint(tmp_path) is None


def test_missing_shard(ckpt):
    (ckpt / "step_1" / "__1_0.distcp").unlink()
    msg = refused(ckpt, "__1_0.distcp is missing")
    assert "earlier checkpoint" in msg


def test_truncated_shard(ckpt):
    f = ckpt / "step_1" / "__0_0.distcp"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    refused(ckpt, "__0_0.distcp is truncated")


def test_another_model(ckpt):
    msg = refused(ckpt, "holds another model", replace(tiny_cfg(), num_layers=3))
    assert "num_layers: checkpoint 2, this run 3" in msg
    refused(ckpt, "hidden_size: checkpoint 16, this run 32", replace(tiny_cfg(), hidden_size=32))
    refused(ckpt, "gpt_j_residual", replace(tiny_cfg(), gpt_j_residual=False))


def _edit_metadata(ckpt, fn):
    path = ckpt / "step_1" / "dcp_metadata.json"
    md = json.loads(path.read_text())
    fn(md)
    path.write_text(json.dumps(md))


def test_extra_tensor(ckpt):
    def add(md):
        md["tensors"]["evil/extra"] = md["tensors"]["param/embed_in.weight"]
        md["storage"].append({**md["storage"][0], "fqn": "evil/extra"})

    _edit_metadata(ckpt, add)
    refused(ckpt, "unexpected tensor 'evil/extra'")


def test_wrong_shape_in_metadata(ckpt):
    def grow(md):
        md["tensors"]["param/embed_in.weight"]["size"] = [99999]

    _edit_metadata(ckpt, grow)
    refused(ckpt, r"param/embed_in.weight has shape \(99999,\)")


def test_gap_between_shards(ckpt):
    def drop(md):
        md["tensors"]["exp_avg/embed_in.weight"]["chunks"].pop()

    _edit_metadata(ckpt, drop)
    refused(ckpt, "exp_avg/embed_in.weight")


def test_file_outside_the_checkpoint(ckpt):
    def escape(md):
        md["storage"][0]["file"] = "../../etc/passwd.distcp"

    _edit_metadata(ckpt, escape)
    refused(ckpt, "data files are plain")


@pytest.mark.parametrize("name", ["checkpoint.json", "dcp_metadata.json"])
def test_garbage_state_files(ckpt, name):
    (ckpt / "step_1" / name).write_bytes(b"\x00\xff garbage")
    refused(ckpt, f"{name}: not valid JSON")


def test_missing_manifest_named_by_latest(ckpt):
    (ckpt / "step_1" / "checkpoint.json").unlink()
    refused(ckpt, "latest names step_1, but .* is not a complete checkpoint")


def test_incomplete_step_directory_named_directly(ckpt):
    (ckpt / "step_1" / "checkpoint.json").unlink()
    refused(ckpt / "step_1", "step_1 is not a complete checkpoint")


def test_missing_metadata(ckpt):
    (ckpt / "step_1" / "dcp_metadata.json").unlink()
    refused(ckpt, "dcp_metadata.json is missing")


@pytest.mark.parametrize(
    "content,match",
    [
        ("step_99\n", "latest names step_99, but"),
        ("step_-3\n", "negative step"),
        ("../../etc\n", "should name a step directory"),
        (b"\x89PNG\xff\xfe", "not text"),
    ],
)
def test_bad_latest(ckpt, content, match):
    latest = ckpt / "latest"
    latest.write_bytes(content if isinstance(content, bytes) else content.encode())
    refused(ckpt, match)


def test_negative_step_in_manifest(ckpt):
    path = ckpt / "step_1" / "checkpoint.json"
    m = json.loads(path.read_text())
    m["step"] = -1
    path.write_text(json.dumps(m))
    refused(ckpt, "'step' is -1; it cannot be negative")


def test_pickle_where_metadata_is_expected_runs_nothing(ckpt, tmp_path):
    marker = tmp_path / "pwned"
    for name in ("dcp_metadata.json", "checkpoint.json"):
        with open(ckpt / "step_1" / name, "wb") as f:
            pickle.dump({"x": _Payload(str(marker))}, f)
        refused(ckpt, "not valid JSON")
        assert not marker.exists()


def test_pickled_data_file_runs_nothing(ckpt, tmp_path):
    """A hostile pickle in place of a shard (same length, so the pre-flight's size check passes) is
    refused when read, with the file named."""
    marker = tmp_path / "pwned"
    f = ckpt / "step_1" / "__0_0.distcp"
    size = f.stat().st_size
    blob = pickle.dumps({"x": _Payload(str(marker))})
    f.write_bytes(blob + b"\0" * (size - len(blob)))
    # DCP's own .metadata pickle is never read either
    with open(ckpt / "step_1" / ".metadata", "wb") as g:
        pickle.dump(_Payload(str(marker)), g)
    with pytest.raises(ZerotopoError, match="__0_0.distcp"):
        read_tensors(ckpt / "step_1", {"param/embed_in.weight": (64 * 16,)})
    assert not marker.exists()


def test_cli_refuses_before_training_and_overwrites_nothing(ckpt, tmp_path, capsys):
    from zerotopo.cli.main import main

    (ckpt / "step_1" / "__1_0.distcp").unlink()
    before = {p: p.stat().st_mtime_ns for p in ckpt.rglob("*")}
    code = main(
        ["train", "--set", f"load={ckpt}", "--set", f"save={ckpt}", "--set", "train_iters=2",
         "--run-dir", str(tmp_path / "run"), "--no-progress"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    # the tiny default config is another model than this checkpoint's: the first defect found is named
    assert "__1_0.distcp is missing" in err or "holds another model" in err
    assert "Traceback" not in err
    assert {p: p.stat().st_mtime_ns for p in ckpt.rglob("*")} == before
    assert not (tmp_path / "run").exists()


def test_read_tensors_assembles_whole_parameters(good):
    t = read_tensors(good / "step_1", {"param/embed_in.weight": (64 * 16,)})["param/embed_in.weight"]
    assert t.shape == (1024,) and torch.isfinite(t).all() and t.abs().sum() > 0
