"""A normal (non-editable) install works from any directory: the wheel carries the built-in topologies
and configs, ``python -m zerotopo`` and the ``zerotopo`` script run, and a short training run completes
in an empty directory."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(cmd, cwd, env, timeout=600):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # No build isolation: the build needs only the setuptools already installed (no network).
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(ROOT),
        ],
        cwd=out,
        env=os.environ.copy(),
    )
    (whl,) = out.glob("zerotopo-*.whl")
    return whl


@pytest.mark.slow
def test_wheel_carries_the_builtin_files(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in sorted((ROOT / "topologies").rglob("*.yaml")):
        assert f"zerotopo/builtin/topologies/{path.relative_to(ROOT / 'topologies').as_posix()}" in names
    for path in sorted((ROOT / "configs").glob("*.yml")):
        assert f"zerotopo/builtin/configs/{path.name}" in names
    assert "zerotopo/__main__.py" in names


@pytest.mark.slow
def test_installed_wheel_runs_topo_plan_and_train_from_an_empty_directory(wheel, tmp_path):
    venv = tmp_path / "venv"
    # torch and the other dependencies come from the system site-packages; nothing is downloaded.
    _run(
        [sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
        cwd=tmp_path,
        env=os.environ.copy(),
    )
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["ZEROTOPO_CACHE"] = os.environ.get("ZEROTOPO_CACHE", str(tmp_path / "cache"))
    _run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], cwd=tmp_path, env=env
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    # The installed copy is imported, not the checkout.
    where = _run([str(py), "-c", "import zerotopo; print(zerotopo.__file__)"], cwd=empty, env=env)
    assert str(venv) in where
    out = _run([str(venv / "bin" / "zerotopo"), "topo", "show", "frontier"], cwd=empty, env=env)
    assert "AMD MI250X" in out
    out = _run(
        [str(py), "-m", "zerotopo", "plan", "--model", "neox-20b", "--topology", "frontier", "--nodes", "2"],
        cwd=empty,
        env=env,
    )
    assert "zero3" in out
    _run(
        [
            str(py), "-m", "zerotopo", "train", "--set", "train_iters=2", "--set", "eval_iters=1",
            "--no-progress", "--run-dir", "run",
        ],
        cwd=empty,
        env=env,
    )  # fmt: skip
    run = empty / "run"
    lines = (run / "metrics.csv").read_text().splitlines()
    assert len([line for line in lines if line.startswith("train,")]) == 2
    assert (run / "loss.png").stat().st_size > 1000
    assert (run / "config.yml").exists() and (run / "summary.json").exists()
