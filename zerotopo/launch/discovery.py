"""Rank discovery: who am I, in which job, launched by what (srun, mpiexec, torchrun, or nothing).

:func:`discover` reads only the environment mapping it is given, so recorded environments from real
clusters are unit tests. Launchers, in the order they win when several leave variables behind:

1. ``prefer=`` given explicitly (``--launcher`` on the command line);
2. torchrun: ``RANK`` and ``MASTER_ADDR`` (also what :func:`zerotopo.launch.spawn.spawn` sets; with
   ``ZEROTOPO_EMULATED_NODE`` it reports itself as the local launcher);
3. Slurm inside a job step: ``SLURM_PROCID`` with ``SLURM_STEP_ID`` (``srun --mpi=pmix`` sets PMIx
   variables too; Slurm's own are complete, so Slurm wins);
4. ``RANK`` and ``WORLD_SIZE`` without ``MASTER_ADDR``: an incomplete torchrun-style launch (an error);
5. MPI: ``OMPI_COMM_WORLD_*``, ``PMI_RANK``/``PMI_SIZE`` or ``PMIX_RANK`` present; the numbers then come
   from mpi4py (:mod:`zerotopo.launch.mpi`), which is imported only on this path;
6. local: a single process.

``ZEROTOPO_EMULATED_NODES=N`` regroups the ranks of any launcher into N emulated nodes of consecutive
ranks, so one ``srun -n8`` on one machine behaves like 2 nodes of 4 ranks.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from zerotopo.errors import LaunchError
from zerotopo.launch.devices import agree_on_device_kind, backend_for, detect_device_kind, physical_device
from zerotopo.launch.hostlist import count_hosts, first_host, parse_tasks_per_node
from zerotopo.placement import numbers

LAUNCHERS = ("slurm", "mpi", "torchrun", "local")
MPI_MARKERS = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "PMIX_RANK")
DEFAULT_PORT = 29500
#: Largest world size believed (a launcher variable above it is garbage).
MAX_WORLD = 1 << 24
#: Largest number read from a launcher variable (twelve digits: anything longer is not a rank or a port).
MAX_ENV_INT = 10**12 - 1


@dataclass(frozen=True)
class RankPlace:
    """Where this process sits in the job and where the ranks meet, as any launcher gives it."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_id: int
    num_nodes: int
    master_addr: str
    master_port: int


@dataclass(frozen=True)
class RankInfo(RankPlace):
    """Where this process sits in the job, as the launcher (and the emulation override) describe it."""

    launcher: str
    """'slurm' | 'mpi' | 'torchrun' | 'local'."""
    hostname: str
    physical_device: int | None
    """Physical GCD/GPU id on the node (from ROCR/HIP/CUDA_VISIBLE_DEVICES or Slurm's gres), None on CPU."""
    backend: str
    """'nccl' on CUDA and ROCm (RCCL), 'gloo' on CPU."""
    device_kind: str
    """'cuda' | 'rocm' | 'cpu'."""
    tasks_per_node: tuple[int, ...] = ()
    """Ranks on every node in node order, when the launcher says; empty when unknown."""


def _int(environ: Mapping[str, str], name: str, launcher: str) -> int:
    value = environ.get(name)
    if value is None:
        raise LaunchError(
            f"{launcher} launch detected but {name} is not set; the launcher's environment is incomplete. "
            f"Launch every rank through {launcher} (or pass --launcher to pick another)."
        )
    fix = f"({launcher} launch); check the variable or unset it."
    return numbers.number(
        value,
        name,
        integer=True,
        strings=True,
        minimum=0,
        maximum=MAX_ENV_INT,
        messages={
            "type": f"{{what}}={{found}} is not an integer {fix}",
            "low": f"{{what}}={{found}} is negative {fix}",
            "high": f"{{what}}={{found}} is above {MAX_ENV_INT} {fix}",
        },
        error=LaunchError,
    )


def _port(environ: Mapping[str, str], name: str, launcher: str) -> int:
    port = _int(environ, name, launcher)
    if not 1 <= port <= 65535:
        raise LaunchError(f"{name}={port} is not a TCP port (1-65535); pick a free port or unset it.")
    return port


def _first(environ: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    for name in names:
        if environ.get(name):
            return name, environ[name]
    return None


def detect_launcher(environ: Mapping[str, str]) -> str:
    """Which launcher started this process, by the precedence in the module docstring."""
    if "RANK" in environ and "MASTER_ADDR" in environ:
        return "local" if "ZEROTOPO_EMULATED_NODE" in environ else "torchrun"
    if "SLURM_PROCID" in environ and ("SLURM_STEP_ID" in environ or "SLURM_STEPID" in environ):
        return "slurm"
    if "RANK" in environ and "WORLD_SIZE" in environ:
        return "torchrun"  # incomplete: _from_torchrun names the missing MASTER_ADDR
    if any(name in environ for name in MPI_MARKERS):
        return "mpi"
    return "local"


def _from_slurm(environ: Mapping[str, str]) -> dict[str, Any]:
    rank = _int(environ, "SLURM_PROCID", "srun")
    world = (
        _int(environ, "SLURM_NTASKS", "srun")
        if "SLURM_NTASKS" in environ
        else _int(environ, "SLURM_NPROCS", "srun")
    )
    local_rank = _int(environ, "SLURM_LOCALID", "srun")
    node_id = _int(environ, "SLURM_NODEID", "srun")
    nnodes_var = _first(environ, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
    num_nodes = _int(environ, nnodes_var[0], "srun") if nnodes_var else None
    if not 1 <= world <= MAX_WORLD:
        raise LaunchError(
            f"SLURM_NTASKS={world} is not in 1..{MAX_WORLD}; check the variable or launch with srun."
        )
    if num_nodes is not None and not 1 <= num_nodes <= world:
        raise LaunchError(
            f"{nnodes_var[0]}={num_nodes} is not in 1..{world} (the task count); check the variable or launch with srun."
        )
    tasks, tpn_var = _slurm_tasks(environ, world, num_nodes)
    if num_nodes is None:
        num_nodes = len(tasks)
    found = (
        f"SLURM_PROCID={rank}, SLURM_NTASKS={world}, SLURM_LOCALID={local_rank}, SLURM_NODEID={node_id}, "
        f"nodes={num_nodes}" + (f", {tpn_var[0]}={tpn_var[1]!r}" if tpn_var else "")
    )
    _check_slurm_tasks(tasks, world, num_nodes, node_id, local_rank, found)
    return {
        "rank": rank,
        "world_size": world,
        "local_rank": local_rank,
        "local_world_size": tasks[node_id],
        "node_id": node_id,
        "num_nodes": num_nodes,
        "master_addr": environ.get("MASTER_ADDR") or _slurm_master(environ, num_nodes, found),
        "master_port": slurm_port(environ),
        "tasks_per_node": tuple(tasks),
        "found": found,
    }


def _slurm_tasks(
    environ: Mapping[str, str], world: int, num_nodes: int | None
) -> tuple[list[int], tuple[str, str] | None]:
    """Tasks per node of the step, and the variable that gave them (None: spread evenly)."""
    # The step's own counts first: a step may use fewer nodes or tasks than the job it runs in.
    tpn_var = _first(environ, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    if tpn_var is not None:
        return parse_tasks_per_node(tpn_var[1], variable=tpn_var[0]), tpn_var
    if environ.get("SLURM_NTASKS_PER_NODE"):
        per = _int(environ, "SLURM_NTASKS_PER_NODE", "srun")
        if not 1 <= per <= world:
            raise LaunchError(f"SLURM_NTASKS_PER_NODE={per} is not in 1..{world} (the task count).")
        return [per] * (num_nodes or max(world // per, 1)), (
            "SLURM_NTASKS_PER_NODE",
            environ["SLURM_NTASKS_PER_NODE"],
        )
    return [world // (num_nodes or 1)] * (num_nodes or 1), None


def _check_slurm_tasks(
    tasks: list[int], world: int, num_nodes: int, node_id: int, local_rank: int, found: str
) -> None:
    """The tasks per node agree with the task and node counts, and this rank is among them."""
    if len(tasks) != num_nodes:
        raise LaunchError(f"Slurm gives tasks for {len(tasks)} nodes but the step has {num_nodes} ({found}).")
    if sum(tasks) != world:
        raise LaunchError(
            f"SLURM_NTASKS={world} differs from the sum of tasks per node {sum(tasks)} ({found}); "
            "the environment mixes a job's and a step's variables. Launch with srun inside the allocation."
        )
    if num_nodes < 1 or num_nodes > MAX_WORLD:
        raise LaunchError(f"the node count {num_nodes} is not in 1..{MAX_WORLD} ({found}).")
    if node_id >= num_nodes:
        raise LaunchError(f"SLURM_NODEID={node_id} is not below the node count {num_nodes} ({found}).")
    if local_rank >= tasks[node_id]:
        raise LaunchError(
            f"SLURM_LOCALID={local_rank} is not below the {tasks[node_id]} tasks of node {node_id} ({found})."
        )


def _slurm_master(environ: Mapping[str, str], num_nodes: int, found: str) -> str:
    """The step's first node, from the step's node list first: the job's first node need not run it."""
    nodelist = _first(environ, "SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST")
    if nodelist is None:
        raise LaunchError(
            f"srun launch without a node list: none of SLURM_STEP_NODELIST, SLURM_NODELIST, "
            f"SLURM_JOB_NODELIST is set ({found}). Set MASTER_ADDR to the first node's address."
        )
    master_addr = first_host(nodelist[1], variable=nodelist[0])
    hosts = count_hosts(nodelist[1], variable=nodelist[0])
    # The step's list names exactly its nodes; the job's may name more (a step can use fewer).
    if hosts < num_nodes or (nodelist[0] == "SLURM_STEP_NODELIST" and hosts != num_nodes):
        shown = nodelist[1] if len(nodelist[1]) <= 60 else nodelist[1][:57] + "..."
        raise LaunchError(
            f"{nodelist[0]}={shown!r} names {hosts} hosts, but the step runs on {num_nodes} nodes ({found}); "
            "the environment mixes jobs or was edited: launch with srun inside the allocation."
        )
    return master_addr


def slurm_port(environ: Mapping[str, str]) -> int:
    """``MASTER_PORT`` if set, else a port derived from the job id, so all ranks agree without talking."""
    if environ.get("MASTER_PORT"):
        return _port(environ, "MASTER_PORT", "srun")
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if job is None or not job.isdigit():
        return DEFAULT_PORT
    # Below Linux's ephemeral ports (32768+), so no outgoing connection already holds it.
    return 20000 + int(job) % 10000


def _from_torchrun(environ: Mapping[str, str]) -> dict[str, Any]:
    if not environ.get("MASTER_ADDR"):
        raise LaunchError(
            f"torchrun launch (RANK={environ.get('RANK')!r}) without MASTER_ADDR; set MASTER_ADDR and "
            "MASTER_PORT to rank 0's host and a free port, or launch with torchrun."
        )
    rank = _int(environ, "RANK", "torchrun")
    world = _int(environ, "WORLD_SIZE", "torchrun")
    local_rank = _int(environ, "LOCAL_RANK", "torchrun")
    local_world = _int(environ, "LOCAL_WORLD_SIZE", "torchrun") if "LOCAL_WORLD_SIZE" in environ else world
    if not 1 <= world <= MAX_WORLD:
        raise LaunchError(
            f"WORLD_SIZE={world} is not in 1..{MAX_WORLD}; check the variable or launch with torchrun."
        )
    if local_world <= 0 or world % local_world:
        raise LaunchError(
            f"WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={local_world}; every node must run "
            "the same number of ranks (torchrun --nproc-per-node)."
        )
    if "ZEROTOPO_EMULATED_NODE" in environ:
        node_id = _int(environ, "ZEROTOPO_EMULATED_NODE", "zerotopo.launch.spawn")
    elif "GROUP_RANK" in environ:
        node_id = _int(environ, "GROUP_RANK", "torchrun")
    else:
        node_id = rank // local_world
    num_nodes = world // local_world
    return {
        "rank": rank,
        "world_size": world,
        "local_rank": local_rank,
        "local_world_size": local_world,
        "node_id": node_id,
        "num_nodes": num_nodes,
        "master_addr": environ["MASTER_ADDR"],
        "master_port": _port(environ, "MASTER_PORT", "torchrun")
        if environ.get("MASTER_PORT")
        else DEFAULT_PORT,
        "tasks_per_node": (local_world,) * num_nodes,
        "found": (
            f"RANK={rank}, WORLD_SIZE={world}, LOCAL_RANK={local_rank}, LOCAL_WORLD_SIZE={local_world}, "
            f"node={node_id}"
        ),
    }


def _from_mpi(environ: Mapping[str, str]) -> dict[str, Any]:
    from zerotopo.launch import mpi

    world = mpi.query_mpi_world(environ)
    return {
        **asdict(world),
        "found": f"MPI rank {world.rank} of {world.world_size}, local rank {world.local_rank}, node {world.node_id}",
    }


def _local(environ: Mapping[str, str]) -> dict[str, Any]:
    if "RANK" in environ and "MASTER_ADDR" in environ:
        # A rank of the local emulated cluster (zerotopo.launch.spawn): torchrun's variables, set by us.
        return _from_torchrun(environ)
    # A world of one: nobody else joins its store, which binds any free port (0), so two single-process
    # jobs on one machine never contend for a fixed one. MASTER_PORT, when set, is still honoured.
    port = _port(environ, "MASTER_PORT", "local") if environ.get("MASTER_PORT") else 0
    return {
        "rank": 0,
        "world_size": 1,
        "local_rank": 0,
        "local_world_size": 1,
        "node_id": 0,
        "num_nodes": 1,
        "master_addr": environ.get("MASTER_ADDR") or "127.0.0.1",
        "master_port": port,
        "tasks_per_node": (1,),
        "found": "single process",
    }


def _emulate_nodes(fields: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """Apply ``ZEROTOPO_EMULATED_NODES=N``: consecutive ranks form N equal nodes."""
    value = environ.get("ZEROTOPO_EMULATED_NODES")
    if not value:
        return fields
    world = fields["world_size"]
    if not value.isdigit() or int(value) <= 0 or world % int(value):
        raise LaunchError(
            f"ZEROTOPO_EMULATED_NODES={value!r} must be a positive divisor of the world size {world} "
            f"({fields['found']})."
        )
    nodes = int(value)
    per_node = world // nodes
    return {
        **fields,
        "node_id": fields["rank"] // per_node,
        "local_rank": fields["rank"] % per_node,
        "local_world_size": per_node,
        "num_nodes": nodes,
        "tasks_per_node": (per_node,) * nodes,
    }


_READERS = {"slurm": _from_slurm, "torchrun": _from_torchrun, "mpi": _from_mpi, "local": _local}


def discover(
    environ: Mapping[str, str] | None = None,
    *,
    prefer: str | None = None,
    device_kind: str | None = None,
    hostname: str | None = None,
) -> RankInfo:
    """Read this rank's place in the job from ``environ`` (default ``os.environ``).

    ``prefer`` forces a launcher ('slurm', 'mpi', 'torchrun', 'local'; None or 'auto' detects).
    ``device_kind`` ('cuda', 'rocm', 'cpu') defaults to what torch sees; ``hostname`` to this host's.
    Raises :class:`LaunchError` when the environment is incomplete or inconsistent.
    """
    env: Mapping[str, str] = os.environ if environ is None else environ
    if prefer in (None, "auto"):
        launcher = detect_launcher(env)
    elif prefer in LAUNCHERS:
        launcher = prefer
    else:
        raise LaunchError(f"launcher {prefer!r} is unknown; expected one of auto, {', '.join(LAUNCHERS)}.")
    fields = _emulate_nodes(_READERS[launcher](env), env)
    found = fields.pop("found")
    if not 1 <= fields["world_size"] <= MAX_WORLD:
        raise LaunchError(f"world size {fields['world_size']} is not in 1..{MAX_WORLD} ({found}).")
    if not 0 <= fields["rank"] < fields["world_size"]:
        raise LaunchError(
            f"rank {fields['rank']} is not below the world size {fields['world_size']} ({found})."
        )
    if not 0 <= fields["local_rank"] < fields["local_world_size"]:
        raise LaunchError(
            f"local rank {fields['local_rank']} is not below the {fields['local_world_size']} ranks of its "
            f"node ({found})."
        )
    if (
        not 1 <= fields["num_nodes"] <= fields["world_size"]
        or not 0 <= fields["node_id"] < fields["num_nodes"]
    ):
        raise LaunchError(
            f"node {fields['node_id']} of {fields['num_nodes']} does not fit a job of {fields['world_size']} "
            f"ranks ({found})."
        )
    kind = device_kind or detect_device_kind()
    return RankInfo(
        **fields,
        launcher=launcher,
        hostname=hostname or env.get("SLURMD_NODENAME") or socket.gethostname(),
        physical_device=physical_device(env, fields["local_rank"], kind),
        backend=backend_for(kind),
        device_kind=kind,
    )


def check_against_topology(info: RankInfo, topology: Any) -> None:
    """Raise :class:`LaunchError` when the job's layout cannot map onto ``topology``.

    The topology assumes the same number of ranks on every node, ``devices_per_node`` of them.
    """
    dpn = topology.devices_per_node
    tasks = info.tasks_per_node or (info.local_world_size,) * info.num_nodes
    if len(set(tasks)) > 1:
        raise LaunchError(
            f"tasks per node {list(tasks)} are not uniform, but topology {getattr(topology, 'name', '?')!r} "
            f"needs {dpn} ranks on every node; launch with srun -N {info.num_nodes} -n "
            f"{info.num_nodes * dpn} --ntasks-per-node={dpn}."
        )
    if tasks[0] != dpn:
        raise LaunchError(
            f"{tasks[0]} ranks per node (local world size), but topology {getattr(topology, 'name', '?')!r} "
            f"has {dpn} devices per node; launch {dpn} tasks per node or pick the matching topology."
        )
    nodes = getattr(topology, "nodes", None)
    if nodes is not None and info.num_nodes != nodes:
        raise LaunchError(
            f"the job runs on {info.num_nodes} nodes but the topology was built for {nodes}; pass "
            f"--nodes {info.num_nodes} (or launch on {nodes} nodes)."
        )


def topological_index(info: RankInfo, topology: Any) -> int:
    """This rank's topological index: die fastest, then package, then node.

    Within a node the position is the physical device id when it is known and the topology defines a
    device order (GCD k of a Frontier node sits at position k: dies of a package are k and k+1);
    otherwise the local rank. Nodes follow each other: ``node_id * devices_per_node + position``.

    Why local rank and position differ on Frontier: ``srun --gpus-per-task=1 --gpu-bind=closest`` gives
    each task the GCD attached to the L3 region of the cores it was bound to. Slurm hands out cores in
    order 0-7, 8-15, ..., and the OLCF Frontier User Guide lists those regions as attached to GCDs
    4, 5, 2, 3, 6, 7, 0, 1. So local ranks 0..7 drive GCDs 4,5,2,3,6,7,0,1: local ranks 0 and 1 share
    package 2, not package 0. Consecutive local ranks happen to stay package-mates under this binding,
    but not under others (``--gpu-bind=map_gpu:...``, fewer tasks per node), and the mesh's start-up
    check compares positions with the topology, so the physical id is what counts.
    """
    known = info.physical_device is not None and getattr(topology, "device_order", None) is not None
    position = info.physical_device if known else info.local_rank
    # Pass the position explicitly: the topology's own fallback (device_order[local_rank]) assumes the
    # closest binding, which is wrong when all devices are visible and rank k drives device k (torchrun).
    method = getattr(topology, "topological_index", None)
    if callable(method):
        return int(method(info.node_id, info.local_rank, physical_device=position))
    return info.node_id * int(topology.devices_per_node) + position


def init_distributed(info: RankInfo, *, timeout_s: float = 1800.0) -> Any:
    """Bind this rank's device and join the process group; returns the ``torch.device`` to compute on.

    With one visible device (``--gpus-per-task=1``) the device is ``cuda:0`` whatever its physical id;
    with several, the local-rank-th. Reuses an existing process group (for instance one made by
    :func:`zerotopo.launch.spawn.spawn`) when its rank and size agree with ``info``. Under
    ``ZEROTOPO_EMULATED_NODES`` it exports ``ZEROTOPO_EMULATED_NODE`` (this rank's node), which the mesh
    reports as the rank's host.
    """
    import datetime

    import torch
    import torch.distributed as dist

    if os.environ.get("ZEROTOPO_EMULATED_NODES") and "ZEROTOPO_EMULATED_NODE" not in os.environ:
        # Ranks of one emulated node must look like one host to the mesh's start-up check, and ranks of
        # different emulated nodes like different hosts, although they all run here.
        os.environ["ZEROTOPO_EMULATED_NODE"] = str(info.node_id)
    if info.device_kind in ("cuda", "rocm"):
        index = 0 if torch.cuda.device_count() == 1 else info.local_rank
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
    else:
        device = torch.device("cpu")
    if dist.is_initialized():
        if (dist.get_rank(), dist.get_world_size()) != (info.rank, info.world_size):
            raise LaunchError(
                f"a process group already exists as rank {dist.get_rank()} of {dist.get_world_size()}, but "
                f"discovery found rank {info.rank} of {info.world_size} ({info.launcher})."
            )
        return device
    store = dist.TCPStore(
        info.master_addr,
        int(info.master_port),
        info.world_size,
        is_master=info.rank == 0,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    agree_on_device_kind(store, info.rank, info.world_size, info.device_kind, timeout_s)
    dist.init_process_group(
        info.backend,
        store=store,
        rank=info.rank,
        world_size=info.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return device
