"""Real launchers on this machine: srun on a local Slurm, mpiexec from mpich, against the local run.

Each launch starts 8 Python processes on a small runner, so every test packs several checks into one
launch. The emulated 2-node layout comes from ``ZEROTOPO_EMULATED_NODES=2`` (tasks map onto nodes by
rank, 4 per node).
"""

from __future__ import annotations

import csv
import importlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
REPO = HERE.parent.parent
RANK_ENV = {"ZEROTOPO_EMULATED_NODES": "2", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def json_objects(text: str) -> list[dict]:
    """Every JSON object in ``text``: ranks' lines may interleave without newlines under mpiexec."""
    decoder = json.JSONDecoder()
    out, pos = [], 0
    while (start := text.find("{", pos)) != -1:
        try:
            obj, pos = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            pos = start + 1
            continue
        out.append(obj)
    return out


def check_env_reports(reports: list[dict], launcher: str) -> None:
    assert sorted(r["rank"] for r in reports) == list(range(8)), reports
    by_rank = sorted(reports, key=lambda r: r["rank"])
    assert {r["launcher"] for r in reports} == {launcher}
    assert [r["node"] for r in by_rank] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [r["local_rank"] for r in by_rank] == [0, 1, 2, 3] * 2
    assert [r["topological_index"] for r in by_rank] == list(range(8))
    assert {(r["world_size"], r["num_nodes"], r["local_world_size"]) for r in reports} == {(8, 2, 4)}
    assert len({r["master"] for r in reports}) == 1
    assert all(r["errors"] == [] and r["warnings"] == [] for r in reports), reports


def check_allreduce(reports: list[dict], launcher: str) -> None:
    assert sorted(r["rank"] for r in reports) == list(range(8)), reports
    assert {r["launcher"] for r in reports} == {launcher}
    assert {r["sum"] for r in reports} == {36.0}  # 1 + 2 + ... + 8
    expected = [[rank, rank // 4, rank] for rank in range(8)]
    assert all(r["all"] == expected for r in reports)
    assert all(r["mesh_rank_of_index"] == list(range(8)) for r in reports)


def run_env_cli(prefix: list[str], env: dict[str, str] | None = None, **kw) -> list[dict]:
    cmd = [
        *prefix,
        sys.executable,
        "-m",
        "zerotopo.cli.main",
        "env",
        "--json",
        "--check",
        "--topology",
        "emulated",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, **kw)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json_objects(proc.stdout)


# -- Slurm ------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.slurm
def test_srun_discovery(local_slurm):
    # Plain srun -N1 -n8: one node, ranks in order, the rendezvous on this host at the job's port.
    script = (
        "import json; from zerotopo.launch import discover; i = discover(device_kind='cpu'); "
        "print(json.dumps([i.rank, i.local_rank, i.node_id, i.num_nodes, i.world_size, i.master_addr, "
        "i.master_port, i.launcher, i.tasks_per_node]))"
    )
    proc = local_slurm.srun(["-N1", "-n8", sys.executable, "-c", script], env={"PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stdout + proc.stderr + local_slurm.logs()
    rows = sorted(json.loads(line) for line in proc.stdout.splitlines())
    host = socket.gethostname().split(".")[0]
    assert [r[:5] for r in rows] == [[r, r, 0, 1, 8] for r in range(8)]
    assert {(r[5], r[6], r[7], tuple(r[8])) for r in rows} == {(host, rows[0][6], "slurm", (8,))}
    assert 20000 <= rows[0][6] < 30000

    # With ZEROTOPO_EMULATED_NODES=2 the same srun is 2 nodes x 4, checked by `zerotopo env --check`.
    proc = local_slurm.srun(
        [
            "-N1",
            "-n8",
            sys.executable,
            "-m",
            "zerotopo.cli.main",
            "env",
            "--json",
            "--check",
            "--topology",
            "emulated",
        ],
        env=RANK_ENV,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check_env_reports(json_objects(proc.stdout), "slurm")


@pytest.mark.slow
@pytest.mark.slurm
def test_srun_allreduce(local_slurm):
    proc = local_slurm.srun(["-N1", "-n8", sys.executable, str(HERE / "rank_allreduce.py")], env=RANK_ENV)
    assert proc.returncode == 0, proc.stdout + proc.stderr + local_slurm.logs()
    check_allreduce(json_objects(proc.stdout), "slurm")


# -- MPI --------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.mpi
def test_mpiexec_discovery_and_allreduce(mpiexec):
    env = {**os.environ, **RANK_ENV}
    check_env_reports(run_env_cli([mpiexec, "-n", "8"], env=env), "mpi")
    proc = subprocess.run(
        [mpiexec, "-n", "8", sys.executable, str(HERE / "rank_allreduce.py")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check_allreduce(json_objects(proc.stdout), "mpi")


# -- torchrun -----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_torchrun_allreduce():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "8",
            str(HERE / "rank_allreduce.py"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **RANK_ENV},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check_allreduce(json_objects(proc.stdout), "torchrun")


@pytest.mark.slow
def test_local_ranks_started_inside_a_one_rank_torchrun_job(tmp_path):
    """A job of one rank runs calibrate's ranks locally: they must not take torchrun's agent store
    (TORCHELASTIC_USE_AGENT_STORE) for theirs, where torch's rendezvous waited for 30 minutes."""
    out = tmp_path / "calibration.yaml"
    cmd = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", "-m", "zerotopo.cli.main",
           "calibrate", "--topology", "emulated", "--ranks", "4", "--ops", "all_gather", "--sizes", "64K",
           "--iters", "1", "--warmup", "0", "--no-overlap", "--no-device", "-o", str(out)]  # fmt: skip
    proc = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "all_gather" in out.read_text()


# -- training end to end ----------------------------------------------------------------------------
TINY = REPO / "configs" / "tiny.yml"
TRAIN_ARGS = ["-m", "zerotopo.cli.main", "train", str(TINY), "--set", "train_iters=3"]


def need_trainer() -> None:
    # `zerotopo train` whole: the trainer, the engine its loop imports, and the CLI entry point.
    try:
        for module in ("zerotopo.trainer", "zerotopo.trainer.loop", "zerotopo.cli.train"):
            importlib.import_module(module)
    except ImportError:
        pytest.skip("zerotopo train not available yet")


def losses(run_dir: Path) -> list[tuple[str, int, float]]:
    """(kind, step, loss) of every row of the run's metrics.csv (kind: train/valid when recorded)."""
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    out = [(r.get("kind", "train"), int(r["step"]), float(r["loss"])) for r in rows]
    assert [step for kind, step, _ in out if kind == "train"] == [1, 2, 3], f"{run_dir}/metrics.csv: {out}"
    return out


@pytest.fixture(scope="module")
def local_losses(tmp_path_factory):
    """Losses of the local emulated launch (8 spawned ranks) of the tiny config: the reference."""
    need_trainer()
    run_dir = tmp_path_factory.mktemp("local-run")
    proc = subprocess.run(
        [sys.executable, *TRAIN_ARGS, "--launcher", "local", "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return losses(run_dir)


def assert_same_losses(got: list[tuple[str, int, float]], want: list[tuple[str, int, float]]) -> None:
    assert [row[:2] for row in got] == [row[:2] for row in want]
    assert [row[2] for row in got] == pytest.approx([row[2] for row in want], rel=1e-6, abs=0)


@pytest.mark.slow
@pytest.mark.slurm
def test_srun_train_matches_local(local_slurm, local_losses, tmp_path):
    proc = local_slurm.srun(
        ["-N1", "-n8", sys.executable, *TRAIN_ARGS, "--launcher", "auto", "--run-dir", str(tmp_path)],
        env=RANK_ENV,
        timeout_s=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr + local_slurm.logs()
    assert_same_losses(losses(tmp_path), local_losses)


@pytest.mark.slow
@pytest.mark.mpi
def test_mpiexec_train_matches_local(mpiexec, local_losses, tmp_path):
    proc = subprocess.run(
        [mpiexec, "-n", "8", sys.executable, *TRAIN_ARGS, "--launcher", "auto", "--run-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env={**os.environ, **RANK_ENV},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_same_losses(losses(tmp_path), local_losses)
