"""Checked checkpoint bytes: every stored piece carries a checksum, and each corruption a long run can
meet on disk (a flipped exponent bit, NaNs, swapped Adam moments, an int64 blob in a float32 slot, a blob
1,000 elements too long, a shard linked out of its directory) stops ``zerotopo ckpt verify`` and a load
with one clean error naming the file."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.trainer.ckpt_workers import checkpoint_worker
from zerotopo.checkpoint.dcpio import METADATA_FILE, piece_checksum
from zerotopo.checkpoint.store import read_tensors, verify_checkpoint
from zerotopo.cli.main import main
from zerotopo.errors import ZerotopoError
from zerotopo.launch.spawn import spawn

pytestmark = pytest.mark.slow

PIECE = "param/layers.0.attention.query_key_value.weight"


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("integrity")
    spawn(checkpoint_worker, 2, args=(str(root / "save"), "zero3", 1, 1), ranks_per_node=2, timeout_s=900)
    return root / "save" / "step_1"


@pytest.fixture
def ckpt(written, tmp_path) -> Path:
    copy = tmp_path / "step_1"
    shutil.copytree(written, copy)
    return copy


def _entries(step: Path) -> tuple[dict, list[dict]]:
    md = json.loads((step / METADATA_FILE).read_text())
    return md, md["storage"]


def _entry(step: Path, fqn: str) -> dict:
    return next(e for e in _entries(step)[1] if e["fqn"] == fqn)


def _write_md(step: Path, md: dict) -> None:
    (step / METADATA_FILE).write_text(json.dumps(md))


def _values_span(step: Path, e: dict) -> tuple[Path, int, torch.Tensor]:
    """The data file of entry ``e``, the byte position of its tensor's values in it, and the values."""
    path = step / e["file"]
    raw = path.read_bytes()[e["byte_offset"] : e["byte_offset"] + e["length"]]
    t = torch.load(io.BytesIO(raw), weights_only=True)
    at = raw.find(t.numpy().tobytes())
    assert at > 0
    return path, e["byte_offset"] + at, t


def _patch(path: Path, at: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data)


def _append_blob(step: Path, fqn: str, t: torch.Tensor, *, fix_checksum: bool) -> Path:
    """Store ``t`` at the end of ``fqn``'s data file and point the metadata at it (with a matching
    checksum when ``fix_checksum``: what a writer with a bug, not a damaged disk, would leave)."""
    md, storage = _entries(step)
    e = next(x for x in storage if x["fqn"] == fqn)
    path = step / e["file"]
    buf = io.BytesIO()
    torch.save(t, buf)
    blob = buf.getvalue()
    e["byte_offset"], e["length"] = path.stat().st_size, len(blob)
    with open(path, "ab") as f:
        f.write(blob)
    if fix_checksum:
        e["crc32c"] = piece_checksum(fqn, e["offset"], blob)
    _write_md(step, md)
    return path


def _flip_exponent(step: Path) -> Path:
    path, at, _ = _values_span(step, _entry(step, PIECE))
    data = bytearray(path.read_bytes()[at : at + 4])
    data[3] ^= 0x40  # bit 30: the top exponent bit of a little-endian float32
    _patch(path, at, bytes(data))
    return path


def _nans(step: Path) -> Path:
    path, at, t = _values_span(step, _entry(step, PIECE))
    n = min(6144, t.numel())
    _patch(path, at, torch.full((n,), float("nan")).numpy().tobytes())
    return path


def _swap_moments(step: Path) -> Path:
    md, storage = _entries(step)
    name = PIECE.removeprefix("param/")
    a = next(x for x in storage if x["fqn"] == f"exp_avg/{name}")
    b = next(x for x in storage if x["fqn"] == f"exp_avg_sq/{name}")
    for k in ("file", "byte_offset", "length", "crc32c"):
        a[k], b[k] = b[k], a[k]
    _write_md(step, md)
    return step / a["file"]


def _int64(fix: bool):
    def corrupt(step: Path) -> Path:
        _, _, t = _values_span(step, _entry(step, PIECE))
        return _append_blob(step, PIECE, torch.arange(t.numel(), dtype=torch.int64), fix_checksum=fix)

    return corrupt


def _too_long(fix: bool):
    def corrupt(step: Path) -> Path:
        _, _, t = _values_span(step, _entry(step, PIECE))
        return _append_blob(step, PIECE, torch.cat([t, torch.zeros(1000)]), fix_checksum=fix)

    return corrupt


CORRUPTIONS = {
    "flipped-exponent-bit": (_flip_exponent, "checksum does not match"),
    "nans": (_nans, "checksum does not match"),
    "swapped-adam-moments": (_swap_moments, "checksum does not match"),
    "int64-blob": (_int64(False), "checksum does not match"),
    "int64-blob-consistent-checksum": (_int64(True), "holds int64, the metadata says float32"),
    "1000-elements-too-long": (_too_long(False), "checksum does not match"),
    "1000-elements-too-long-consistent-checksum": (_too_long(True), "elements"),
}


def test_a_clean_checkpoint_verifies(written, capsys):
    assert main(["ckpt", "verify", str(written.parent)]) == 0
    out = capsys.readouterr().out
    assert "OK, step 1" in out and "pieces" in out and "no checksum" not in out
    report = verify_checkpoint(written)
    assert report.unchecked == 0 and report.files == 2


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_each_corruption_is_one_clean_error_naming_the_file(ckpt, name, capsys):
    corrupt, expected = CORRUPTIONS[name]
    damaged = corrupt(ckpt)
    assert main(["ckpt", "verify", str(ckpt)]) == 2
    err = capsys.readouterr().err
    assert f"zerotopo ckpt: error: {damaged}" in err and expected in err, err
    assert "Traceback" not in err
    # The load path reads through the same checks (here in one process, as export-hf does).
    with pytest.raises(ZerotopoError, match=expected) as info:
        name = PIECE.removeprefix("param/")
        read_tensors(ckpt, {f"{k}/{name}": (_entry_size(ckpt),) for k in ("param", "exp_avg", "exp_avg_sq")})
    assert str(damaged) in str(info.value)


def _entry_size(step: Path) -> int:
    md, _ = _entries(step)
    return md["tensors"][PIECE]["size"][0]


def test_swapped_moments_with_their_checksums_recomputed_are_still_refused(ckpt):
    """Adam's second moment is never negative: moments swapped by a writer (checksums consistent) are
    caught by their values."""
    md, storage = _entries(ckpt)
    name = PIECE.removeprefix("param/")
    a = next(x for x in storage if x["fqn"] == f"exp_avg/{name}")
    b = next(x for x in storage if x["fqn"] == f"exp_avg_sq/{name}")
    for k in ("file", "byte_offset", "length"):
        a[k], b[k] = b[k], a[k]
    for e in (a, b):
        raw = (ckpt / e["file"]).read_bytes()[e["byte_offset"] : e["byte_offset"] + e["length"]]
        e["crc32c"] = piece_checksum(e["fqn"], e["offset"], raw)
    _write_md(ckpt, md)
    with pytest.raises(ZerotopoError, match="negative values, impossible for Adam's second moment"):
        verify_checkpoint(ckpt)


def test_a_shard_linked_out_of_its_directory_is_refused(ckpt, tmp_path):
    outside = tmp_path / "elsewhere.distcp"
    shard = ckpt / "__1_0.distcp"
    shutil.move(shard, outside)
    shard.symlink_to(outside)
    with pytest.raises(ZerotopoError, match="is a symbolic link") as info:
        verify_checkpoint(ckpt)
    assert str(shard) in str(info.value)


def test_an_unbounded_model_config_is_refused_before_building_anything(ckpt):
    manifest = json.loads((ckpt / "checkpoint.json").read_text())
    for key, value in (("num_layers", 10**8), ("num_attention_heads", 0)):
        bad = json.loads(json.dumps(manifest))
        bad["model"][key] = value
        (ckpt / "checkpoint.json").write_text(json.dumps(bad))
        with pytest.raises(ZerotopoError, match=f"the model's {key} is {value}"):
            verify_checkpoint(ckpt)


def test_a_wrong_size_rng_state_is_refused(ckpt):
    md, _ = _entries(ckpt)
    md["tensors"]["rng/0/torch"]["size"] = [17]
    md["tensors"]["rng/0/torch"]["chunks"] = [{"offsets": [0], "sizes": [17]}]
    _write_md(ckpt, md)
    with pytest.raises(ZerotopoError, match="rng/0/torch is torch.uint8 of shape"):
        verify_checkpoint(ckpt)


def test_no_checkpoint_is_written_from_non_finite_state(tmp_path):
    from tests.trainer.ckpt_workers import nonfinite_save_worker

    save = tmp_path / "save"
    (save / "step_0").mkdir(parents=True)  # an earlier good checkpoint, which latest names
    (save / "step_0" / "checkpoint.json").write_text("{}")
    (save / "latest").write_text("step_0\n")
    out = spawn(nonfinite_save_worker, 2, args=(str(save),), ranks_per_node=2, timeout_s=900)
    assert out[0] == out[1] and out[0].startswith(
        "NonFiniteError: step 1: 1 optimizer-state values are NaN"
    ), out
    assert f"the previous checkpoint is kept ({save / 'step_0'})" in out[0]
    assert sorted(p.name for p in save.iterdir()) == ["latest", "step_0"]  # nothing written, not even a temp
    assert (save / "latest").read_text() == "step_0\n"


def test_export_copies_only_regular_files_from_inside_the_checkpoint(ckpt, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("not for publishing")
    manifest = json.loads((ckpt / "checkpoint.json").read_text())
    manifest["tokenizer"] = {"type": "HFTokenizer", "eod": 0, "files": ["tokenizer.json"]}
    (ckpt / "checkpoint.json").write_text(json.dumps(manifest))
    (ckpt / "tokenizer.json").symlink_to(secret)
    out = tmp_path / "hf"
    assert main(["export-hf", str(ckpt), str(out)]) == 2
    assert not out.exists() or not any(out.iterdir())
