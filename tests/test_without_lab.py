"""``pip install zerotopo`` without extras trains and plans: the lab (``zerotopo_lab``) and its
dependencies (DeepSpeed, matplotlib) are optional, and the command says how to get them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INSTALL = "pip install 'zerotopo[lab]'"

#: Installed first in every process (the ranks too): the lab and its dependencies cannot be imported.
BLOCKER = """
import sys
from importlib.abc import MetaPathFinder

class _Hidden(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("zerotopo_lab", "matplotlib", "deepspeed"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _Hidden())
"""


def test_the_install_metadata_keeps_the_lab_and_its_dependencies_optional():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(meta["dependencies"])
    assert "matplotlib" not in core and "deepspeed" not in core
    lab = " ".join(meta["optional-dependencies"]["lab"])
    assert "matplotlib" in lab and "deepspeed" in lab
    assert meta["entry-points"]["zerotopo.lab"] == {"commands": "zerotopo_lab.cli"}
    from zerotopo.cli import lab as loader

    assert loader.GROUP == "zerotopo.lab" and loader.HOOKS == "zerotopo_lab.cli" and loader.INSTALL == INSTALL


def _run(args: list[str], cwd: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    env.setdefault("ZEROTOPO_CACHE", str(tmp_path / "cache"))
    return subprocess.run(
        [sys.executable, "-m", "zerotopo", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.slow
def test_plan_without_the_lab_plans_zerotopos_plans_and_names_the_lab(tmp_path):
    base = ["plan", "--model", "neox-20b", "--topology", "frontier", "--nodes", "2"]
    ok = _run([*base, "--plans", "presets"], tmp_path, tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "zero3" in ok.stdout and "recommended:" in ok.stdout and "deepspeed" not in ok.stdout
    named = _run([*base, "--plans", "zero3,deepspeed-zero3"], tmp_path, tmp_path)
    assert named.returncode == 2 and INSTALL in named.stderr, named.stderr
    papers = _run(["plan", "--validate", "papers"], tmp_path, tmp_path)
    assert papers.returncode == 2 and INSTALL in papers.stderr, papers.stderr
    bench = _run(["bench", "compare", "--model", "tiny"], tmp_path, tmp_path)
    assert bench.returncode == 2 and INSTALL in bench.stderr, bench.stderr


@pytest.mark.slow
def test_training_needs_neither_the_lab_nor_matplotlib_nor_deepspeed(tmp_path):
    run = _run(
        ["train", "--topology", "emulated", "--nodes", "1", "--set", "train_iters=2", "--set", "eval_iters=1",
         "--no-progress", "--run-dir", "run"],
        tmp_path,
        tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    lines = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    assert len([line for line in lines if line.startswith("train,")]) == 2
    assert not (tmp_path / "run" / "loss.png").exists()  # no matplotlib: the numbers only
