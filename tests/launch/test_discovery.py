"""Rank discovery on recorded launcher environments: Frontier srun, DGX srun, torchrun, MPI, local."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys

import pytest

from tests.proc import launcher_free_env
from zerotopo.errors import LaunchError
from zerotopo.launch import discovery, mpi
from zerotopo.launch.discovery import check_against_topology, discover, topological_index
from zerotopo.placement.topology import load_topology

FRONTIER_CLOSEST = (4, 5, 2, 3, 6, 7, 0, 1)

# One rank's environment as srun sets it on Frontier (trimmed to what discovery may read), for
# `srun -N2 -n16 -c7 --gpus-per-task=1 --gpu-bind=closest` in job 1843217: rank 9 = node 1, local rank 1.
FRONTIER_RANK9 = {
    "SLURM_JOB_ID": "1843217",
    "SLURM_JOBID": "1843217",
    "SLURM_STEP_ID": "0",
    "SLURM_STEPID": "0",
    "SLURM_PROCID": "9",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "16",
    "SLURM_NPROCS": "16",
    "SLURM_NNODES": "2",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "16",
    "SLURM_TASKS_PER_NODE": "8(x2)",
    "SLURM_STEP_TASKS_PER_NODE": "8(x2)",
    "SLURM_JOB_NODELIST": "frontier[08812-08813]",
    "SLURM_NODELIST": "frontier[08812-08813]",
    "SLURM_STEP_NODELIST": "frontier[08812-08813]",
    "SLURM_CPUS_PER_TASK": "7",
    "SLURM_GPUS_PER_TASK": "1",
    "SLURM_CPU_BIND": "quiet,mask_cpu:0x000000000000FE00",
    "ROCR_VISIBLE_DEVICES": "5",
    "SLURMD_NODENAME": "frontier08813",
    "HOSTNAME": "frontier08813",
    "LMOD_SYSTEM_NAME": "frontier",
}


def frontier_env(nodes: int, rank: int, nodelist: str, job: int = 1843217) -> dict[str, str]:
    """What srun sets for ``rank`` of an N-node Frontier job with 8 tasks per node, closest binding."""
    node, local = divmod(rank, 8)
    return {
        "SLURM_JOB_ID": str(job),
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(local),
        "SLURM_NODEID": str(node),
        "SLURM_NTASKS": str(8 * nodes),
        "SLURM_NNODES": str(nodes),
        "SLURM_TASKS_PER_NODE": f"8(x{nodes})",
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_GPUS_PER_TASK": "1",
        "ROCR_VISIBLE_DEVICES": str(FRONTIER_CLOSEST[local]),
    }


def test_recorded_frontier_rank():
    info = discover(FRONTIER_RANK9, device_kind="rocm")
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (9, 16, 1, 8)
    assert (info.node_id, info.num_nodes, info.launcher) == (1, 2, "slurm")
    assert info.master_addr == "frontier08812"
    assert info.master_port == 20000 + 1843217 % 10000
    assert info.physical_device == 5
    assert (info.backend, info.device_kind, info.hostname) == ("nccl", "rocm", "frontier08813")
    topo = load_topology("frontier", nodes=2)
    check_against_topology(info, topo)
    assert topological_index(info, topo) == 8 + 5


@pytest.mark.parametrize(
    ("nodes", "nodelist", "first"),
    [
        (2, "frontier[00012-00013]", "frontier00012"),
        (16, "frontier[01234-01241,02000-02007]", "frontier01234"),
    ],
)
def test_frontier_closest_binding_layout(nodes, nodelist, first):
    topo = load_topology("frontier", nodes=nodes)
    infos = [discover(frontier_env(nodes, r, nodelist), device_kind="rocm") for r in range(8 * nodes)]
    index = [topological_index(i, topo) for i in infos]
    assert sorted(index) == list(range(8 * nodes))
    assert {i.master_addr for i in infos} == {first}
    for info, t in zip(infos, index):
        check_against_topology(info, topo)
        assert info.physical_device == FRONTIER_CLOSEST[info.local_rank]
        assert t == info.node_id * 8 + FRONTIER_CLOSEST[info.local_rank]
    # Local ranks 0 and 1 drive GCDs 4 and 5: both dies of package 2, so topological indices 4 and 5.
    assert index[:8] == [4, 5, 2, 3, 6, 7, 0, 1]
    # Without the physical id (environment lost) the rank order is used, which is not the GCD order.
    lost = discover(
        {k: v for k, v in frontier_env(nodes, 0, nodelist).items() if k != "ROCR_VISIBLE_DEVICES"},
        device_kind="rocm",
    )
    assert lost.physical_device is None and topological_index(lost, topo) == 0


@pytest.mark.parametrize("visible", ["per-task", "all"])
def test_dgx_layout(visible):
    """DGX H100, 2 nodes: CUDA_VISIBLE_DEVICES bound per task, or all 8 visible and picked by local rank."""
    topo = load_topology("dgx-h100", nodes=2)
    seen = []
    for rank in range(16):
        node, local = divmod(rank, 8)
        env = {
            "SLURM_JOB_ID": "77",
            "SLURM_STEP_ID": "3",
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(local),
            "SLURM_NODEID": str(node),
            "SLURM_NTASKS": "16",
            "SLURM_NNODES": "2",
            "SLURM_NTASKS_PER_NODE": "8",
            "SLURM_NODELIST": "dgx-a[07,11]",
            "CUDA_VISIBLE_DEVICES": str(local) if visible == "per-task" else "0,1,2,3,4,5,6,7",
            "MASTER_PORT": "6000",
        }
        info = discover(env, device_kind="cuda")
        assert (info.physical_device, info.backend, info.master_addr) == (local, "nccl", "dgx-a07")
        assert info.master_port == 6000
        seen.append(topological_index(info, topo))
    assert seen == list(range(16))


def test_torchrun():
    env = {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "10.0.0.3",
        "MASTER_PORT": "29400",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
    }
    info = discover(env, device_kind="cuda")
    assert (info.launcher, info.rank, info.local_rank, info.node_id, info.num_nodes) == (
        "torchrun",
        5,
        1,
        1,
        2,
    )
    assert (info.master_addr, info.master_port, info.physical_device) == ("10.0.0.3", 29400, 1)
    # Node id falls back to rank // LOCAL_WORLD_SIZE without GROUP_RANK.
    del env["GROUP_RANK"]
    assert discover(env, device_kind="cpu").node_id == 1


def test_spawned_rank_is_local_launcher():
    env = {
        "RANK": "6",
        "LOCAL_RANK": "2",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1234",
        "ZEROTOPO_EMULATED_NODE": "1",
    }
    info = discover(env, device_kind="cpu")
    assert (info.launcher, info.node_id, info.local_rank, info.physical_device, info.backend) == (
        "local",
        1,
        2,
        None,
        "gloo",
    )
    assert topological_index(info, load_topology("emulated")) == 6


def test_emulated_nodes_override_slurm():
    base = {
        "SLURM_JOB_ID": "5",
        "SLURM_STEP_ID": "0",
        "SLURM_NTASKS": "8",
        "SLURM_NNODES": "1",
        "SLURM_TASKS_PER_NODE": "8",
        "SLURM_NODEID": "0",
        "SLURM_NODELIST": "vm",
        "ZEROTOPO_EMULATED_NODES": "2",
    }
    infos = [
        discover({**base, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)}, device_kind="cpu")
        for r in range(8)
    ]
    assert [i.node_id for i in infos] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [i.local_rank for i in infos] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert {(i.num_nodes, i.local_world_size, i.tasks_per_node) for i in infos} == {(2, 4, (4, 4))}
    topo = load_topology("emulated")
    assert [topological_index(i, topo) for i in infos] == list(range(8))
    with pytest.raises(LaunchError, match="ZEROTOPO_EMULATED_NODES='3'"):
        discover(
            {**base, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "ZEROTOPO_EMULATED_NODES": "3"},
            device_kind="cpu",
        )


def test_precedence():
    slurm = frontier_env(2, 3, "frontier[00012-00013]")
    torchrun = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    pmix = {"PMIX_RANK": "3", "PMI_SIZE": "16"}
    assert discover({**slurm, **pmix}, device_kind="cpu").launcher == "slurm"  # srun --mpi=pmix
    assert discover({**slurm, **torchrun}, device_kind="cpu").launcher == "torchrun"
    assert discover({**slurm, **torchrun}, prefer="slurm", device_kind="cpu").rank == 3
    # The batch script itself (no step id) is not a launched rank.
    no_step = {k: v for k, v in slurm.items() if k != "SLURM_STEP_ID"}
    assert discover(no_step, device_kind="cpu").launcher == "local"


def test_mpi_presence_uses_mpi4py(monkeypatch):
    seen = {}

    def fake_world(environ):
        seen["env"] = dict(environ)
        return mpi.MpiWorld(
            rank=5,
            world_size=8,
            local_rank=1,
            local_world_size=4,
            node_id=1,
            num_nodes=2,
            master_addr="10.1.1.1",
            master_port=41000,
            tasks_per_node=(4, 4),
        )

    monkeypatch.setattr(mpi, "query_mpi_world", fake_world)
    for markers in ({"PMI_RANK": "5", "PMI_SIZE": "8"}, {"OMPI_COMM_WORLD_RANK": "5"}, {"PMIX_RANK": "5"}):
        info = discover(markers, device_kind="cpu")
        assert (info.launcher, info.rank, info.node_id, info.local_rank) == ("mpi", 5, 1, 1)
        assert (info.master_addr, info.master_port, info.tasks_per_node) == ("10.1.1.1", 41000, (4, 4))
        assert seen["env"] == markers


def test_mpi_missing_says_how_to_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_mpi4py(name, *args, **kwargs):
        if name.startswith("mpi4py"):
            raise ImportError("No module named 'mpi4py'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mpi4py)
    with pytest.raises(
        LaunchError, match=r"pip install mpi4py mpich \(or build mpi4py against your site MPI"
    ):
        discover({"PMI_RANK": "0", "PMI_SIZE": "2"}, device_kind="cpu")


def test_local_single_process():
    info = discover({}, device_kind="cpu")
    assert (info.launcher, info.rank, info.world_size, info.master_addr) == ("local", 0, 1, "127.0.0.1")


SLURM_OK = frontier_env(2, 9, "frontier[00012-00013]")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"SLURM_PROCID": "16"},
            r"rank 16 is not below the world size 16 \(SLURM_PROCID=16, SLURM_NTASKS=16",
        ),
        ({"SLURM_LOCALID": "8"}, r"SLURM_LOCALID=8 is not below the 8 tasks of node 1"),
        ({"SLURM_NTASKS": "15"}, r"SLURM_NTASKS=15 differs from the sum of tasks per node 16"),
        ({"SLURM_TASKS_PER_NODE": "8(x3)"}, r"tasks for 3 nodes but the step has 2"),
        ({"SLURM_TASKS_PER_NODE": "8(x)"}, r"SLURM_TASKS_PER_NODE='8\(x\)' is not a per-node task count"),
        ({"SLURM_NODEID": "2"}, r"SLURM_NODEID=2 is not below the node count 2"),
        (
            {"SLURM_JOB_NODELIST": "frontier[00012-"},
            r"SLURM_JOB_NODELIST='frontier\[00012-' is not a Slurm host",
        ),
        ({"SLURM_JOB_NODELIST": None}, r"none of SLURM_STEP_NODELIST, SLURM_NODELIST, SLURM_JOB_NODELIST"),
        ({"SLURM_LOCALID": None}, r"SLURM_LOCALID is not set"),
        ({"SLURM_PROCID": "nine"}, r"SLURM_PROCID='nine' is not an integer"),
        ({"SLURM_PROCID": "--5"}, r"SLURM_PROCID='--5' is not an integer"),
        ({"SLURM_NODEID": "-1"}, r"SLURM_NODEID=-1 is negative \(srun launch\)"),
        ({"SLURM_NTASKS": "1" * 13}, r"SLURM_NTASKS=1111111111111 is above 999999999999"),
    ],
)
def test_slurm_errors(changes, message):
    env = {**SLURM_OK, **changes}
    env = {k: v for k, v in env.items() if v is not None}
    with pytest.raises(LaunchError, match=message):
        discover(env, device_kind="rocm")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"},
            r"torchrun launch \(RANK='1'\) without MASTER_ADDR",
        ),
        (
            {"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "h"},
            "rank 2 is not below the world",
        ),
        (
            {"RANK": "1", "WORLD_SIZE": "6", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "h"},
            "WORLD_SIZE=6 is not a multiple of LOCAL_WORLD_SIZE=4",
        ),
        (
            {"RANK": "1", "WORLD_SIZE": "8", "LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "h"},
            "local rank 5 is not below the 4 ranks of its node",
        ),
    ],
)
def test_torchrun_errors(env, message):
    with pytest.raises(LaunchError, match=message):
        discover(env, device_kind="cpu")


def test_unknown_launcher():
    with pytest.raises(LaunchError, match="launcher 'pbs' is unknown"):
        discover({}, prefer="pbs", device_kind="cpu")


def test_topology_mismatch_errors():
    topo = load_topology("frontier", nodes=2)
    ragged = {**SLURM_OK, "SLURM_NTASKS": "12", "SLURM_TASKS_PER_NODE": "8,4", "SLURM_PROCID": "9"}
    with pytest.raises(LaunchError, match=r"tasks per node \[8, 4\] are not uniform"):
        check_against_topology(discover(ragged, device_kind="rocm"), topo)
    four = {
        **SLURM_OK,
        "SLURM_NTASKS": "8",
        "SLURM_TASKS_PER_NODE": "4(x2)",
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
    }
    with pytest.raises(LaunchError, match="4 ranks per node .* has 8 devices per node"):
        check_against_topology(discover(four, device_kind="rocm"), topo)
    with pytest.raises(LaunchError, match="runs on 2 nodes but the topology was built for 4"):
        check_against_topology(discover(SLURM_OK, device_kind="rocm"), load_topology("frontier", nodes=4))


def test_port_from_job_id():
    assert discovery.slurm_port({"SLURM_JOB_ID": "123456"}) == 20000 + 123456 % 10000
    assert discovery.slurm_port({"SLURM_JOB_ID": "123456", "MASTER_PORT": "3442"}) == 3442
    assert 20000 <= discovery.slurm_port({"SLURM_JOB_ID": "99999999"}) < 32768


@pytest.mark.parametrize(
    ("env", "local_rank", "kind", "device"),
    [
        ({"ROCR_VISIBLE_DEVICES": "6"}, 4, "rocm", 6),
        ({"ROCR_VISIBLE_DEVICES": "6", "HIP_VISIBLE_DEVICES": "0"}, 4, "rocm", 6),  # ROCr holds physical ids
        ({"HIP_VISIBLE_DEVICES": "0,1,2,3"}, 2, "rocm", 2),
        ({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, 1, "cuda", 5),
        ({"CUDA_VISIBLE_DEVICES": "GPU-8f1c2a"}, 0, "cuda", None),  # UUIDs carry no position
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, 3, "cuda", None),  # fewer devices than local ranks
        ({"SLURM_STEP_GPUS": "3"}, 0, "cuda", 3),
        ({"GPU_DEVICE_ORDINAL": "0,1,2,3,4,5,6,7"}, 7, "rocm", 7),
        ({"ROCR_VISIBLE_DEVICES": "6"}, 0, "cpu", None),  # no accelerator in this process
        ({}, 0, "cuda", None),
    ],
)
def test_physical_device(env, local_rank, kind, device):
    from zerotopo.launch.devices import backend_for, physical_device

    assert physical_device(env, local_rank, kind) == device
    assert backend_for(kind) == ("gloo" if kind == "cpu" else "nccl")


_ONE_RANK = """
import sys, torch.distributed as dist
from zerotopo.launch.discovery import discover, init_distributed
info = discover({})
init_distributed(info, timeout_s=30)
print(info.launcher, info.world_size, info.master_port, dist.get_world_size())
"""


def test_two_single_process_jobs_at_once_each_get_a_free_port():
    assert discover({}).master_port == 0  # the store binds any free port
    env = launcher_free_env()
    # the port a fixed default would take is held, and two jobs start together
    with socket.socket() as held:
        with contextlib.suppress(OSError):  # already held by someone else: as good
            held.bind(("127.0.0.1", discovery.DEFAULT_PORT))
            held.listen(1)
        jobs = [
            subprocess.Popen([sys.executable, "-c", _ONE_RANK], env=env, stdout=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        outs = [p.communicate(timeout=120)[0] for p in jobs]
    assert [p.returncode for p in jobs] == [0, 0]
    assert outs == ["local 1 0 1\n"] * 2
    explicit = discover({"MASTER_PORT": "3442"})
    assert explicit.master_port == 3442
