"""``--emulated-nodes N`` under an external launcher, and the advice of the topology-mismatch error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from zerotopo.launch.advice import topology_mismatch_advice
from zerotopo.launch.discovery import RankInfo
from zerotopo.placement.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]


def info(world: int, per_node: int, nodes: int) -> RankInfo:
    return RankInfo(
        rank=0,
        world_size=world,
        local_rank=0,
        local_world_size=per_node,
        node_id=0,
        num_nodes=nodes,
        master_addr="127.0.0.1",
        master_port=1,
        launcher="torchrun",
        hostname="h",
        physical_device=None,
        backend="gloo",
        device_kind="cpu",
        tasks_per_node=(per_node,) * nodes,
    )


def test_advice_names_what_works():
    emulated = load_topology("emulated")  # 2 nodes x 4 devices
    # srun -N1 -n8 on one host: 8 ranks per host, the topology wants 4 per node
    assert "--emulated-nodes 2" in topology_mismatch_advice(info(8, 8, 1), emulated.with_nodes(1))
    # one node of 4 with --nodes 2 given: drop it
    assert "--nodes 1" in topology_mismatch_advice(info(4, 4, 1), emulated)
    assert "multiple of 4" in topology_mismatch_advice(info(6, 6, 1), emulated)


def _torchrun(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
    cmd += ["-m", "zerotopo", "train", "tiny", "--topology", "emulated-4node", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("ZEROTOPO_EMULATED_NODES", None)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_torchrun_mismatch_suggests_the_flag_and_the_flag_works(tmp_path):
    # 4 torchrun ranks on one host; emulated-4node has 2 devices per node.
    sets = ["--set", "train_iters=2", "--set", "eval_iters=0", "--set", "train_micro_batch_size_per_gpu=2"]
    proc = _torchrun([*sets, "--run-dir", "bad"], tmp_path)
    assert proc.returncode != 0
    assert "--emulated-nodes 2" in proc.stderr + proc.stdout
    proc = _torchrun([*sets, "--emulated-nodes", "2", "--run-dir", "run"], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "on emulated-4node x2 nodes = 4 ranks" in proc.stdout
    assert (tmp_path / "run" / "metrics.csv").exists()


def test_flag_is_refused_for_local_runs(capsys):
    from zerotopo.cli.main import main

    assert main(["train", "--emulated-nodes", "2", "--launcher", "local", "--no-progress"]) == 2
    assert "use --nodes" in capsys.readouterr().err
