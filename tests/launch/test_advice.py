"""Warnings about known-bad launch settings, and the ``zerotopo env`` command."""

from __future__ import annotations

import json
import os

import pytest
from test_discovery import FRONTIER_RANK9

from zerotopo.cli.main import main
from zerotopo.launch import discover, init_distributed, warnings_for

# What launch/frontier.sbatch exports: no warning may apply to it.
FRONTIER_GOOD = {
    **FRONTIER_RANK9,
    "OMP_NUM_THREADS": "7",
    "GPU_MAX_HW_QUEUES": "8",
    "MIOPEN_USER_DB_PATH": "/tmp/u-miopen-1843217",
    "NCCL_NET_GDR_LEVEL": "PHB",
    "NCCL_SOCKET_IFNAME": "hsn0,hsn1,hsn2,hsn3",
    "FI_MR_CACHE_MONITOR": "kdreg2",
    "FI_CXI_DEFAULT_CQ_SIZE": "131072",
}


def warnings(env: dict[str, str], kind: str = "rocm") -> list[str]:
    return warnings_for(discover(env, device_kind=kind), env)


def test_good_frontier_settings_have_no_warning():
    assert warnings(FRONTIER_GOOD) == []


@pytest.mark.parametrize(
    ("drop", "message"),
    [
        ("GPU_MAX_HW_QUEUES", "GPU_MAX_HW_QUEUES is unset"),
        ("MIOPEN_USER_DB_PATH", "MIOPEN_USER_DB_PATH is unset"),
        ("FI_MR_CACHE_MONITOR", "FI_MR_CACHE_MONITOR unset on a Slingshot system"),
        ("NCCL_NET_GDR_LEVEL", "NCCL_NET_GDR_LEVEL unset on a Slingshot system"),
        ("OMP_NUM_THREADS", "OMP_NUM_THREADS is unset with 8 ranks on this node"),
    ],
)
def test_missing_setting_warns(drop, message):
    env = {k: v for k, v in FRONTIER_GOOD.items() if k != drop}
    found = warnings(env)
    assert len(found) == 1 and message in found[0], found


def test_torchrun_on_frontier_warns():
    env = {
        **{k: v for k, v in FRONTIER_GOOD.items() if not k.startswith("SLURM_")},
        "RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "8",
        "MASTER_ADDR": "frontier08812",
        "MASTER_PORT": "3442",
        "ROCR_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
    }
    found = warnings(env)
    assert len(found) == 1 and "OLCF advises srun" in found[0], found
    # The same environment off Frontier is fine.
    off = {k: v for k, v in env.items() if k not in ("HOSTNAME", "LMOD_SYSTEM_NAME", "SLURMD_NODENAME")}
    assert warnings_for(discover(off, device_kind="rocm", hostname="node7"), off) == []


def test_binding_not_applied_warns():
    env = {**FRONTIER_GOOD, "ROCR_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    found = warnings(env)
    assert len(found) == 1 and "although --gpus-per-task=1" in found[0], found


def test_shared_devices_warn():
    env = {
        "RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "h",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "OMP_NUM_THREADS": "4",
    }
    found = warnings(env, "cuda")
    assert len(found) == 1 and "2 devices for 4 ranks" in found[0], found


def test_cuda_device_max_connections_warns():
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    found = warnings(env, "cuda")
    assert len(found) == 1 and "CUDA_DEVICE_MAX_CONNECTIONS=1" in found[0]
    assert warnings({"CUDA_DEVICE_MAX_CONNECTIONS": "8"}, "cuda") == []


# -- zerotopo env -----------------------------------------------------------------------------------
SPAWNED = {
    "RANK": "6",
    "LOCAL_RANK": "2",
    "WORLD_SIZE": "8",
    "LOCAL_WORLD_SIZE": "4",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "1234",
    "ZEROTOPO_EMULATED_NODE": "1",
    "OMP_NUM_THREADS": "1",
}


def set_env(monkeypatch, env: dict[str, str]) -> None:
    for name in list(os.environ):
        if name.startswith(
            ("SLURM_", "OMPI_", "PMI", "RANK", "LOCAL_", "WORLD_", "MASTER_", "ZEROTOPO_", "GROUP_")
        ):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def test_env_json(monkeypatch, capsys):
    set_env(monkeypatch, SPAWNED)
    assert main(["env", "--json", "--check", "--topology", "emulated"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["rank"], report["node"], report["local_rank"], report["topological_index"]) == (6, 1, 2, 6)
    assert (report["launcher"], report["backend"], report["errors"], report["warnings"]) == (
        "local",
        "gloo",
        [],
        [],
    )


def test_env_text_and_check_failures(monkeypatch, capsys):
    set_env(monkeypatch, {k: v for k, v in SPAWNED.items() if k != "OMP_NUM_THREADS"})
    assert main(["env"]) == 0  # warnings alone do not fail without --check
    out = capsys.readouterr()
    assert "rank 6/8  local 2/4  node 1/2" in out.out and "OMP_NUM_THREADS is unset" in out.err
    assert main(["env", "--check"]) == 1
    # Topology mismatch: 4 ranks per node against Frontier's 8 devices.
    set_env(monkeypatch, SPAWNED)
    assert main(["env", "--check", "--topology", "frontier"]) == 1
    assert "has 8 devices per node" in capsys.readouterr().err
    # A broken environment: --check reports it (status 1), plain env lets the CLI print it (status 2).
    set_env(monkeypatch, {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    assert main(["env", "--check"]) == 1
    assert "without MASTER_ADDR" in capsys.readouterr().err
    assert main(["env"]) == 2


def test_init_distributed_single_process(monkeypatch):
    import torch.distributed as dist

    from zerotopo.launch.spawn import free_port

    info = discover({"MASTER_PORT": str(free_port())}, device_kind="cpu")
    device = init_distributed(info, timeout_s=30)
    try:
        assert str(device) == "cpu" and dist.get_world_size() == 1 and dist.get_backend() == "gloo"
        assert init_distributed(info) == device  # an existing group that agrees is reused
    finally:
        dist.destroy_process_group()
