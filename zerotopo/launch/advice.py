"""Known-bad launch settings, found from the rank's environment before they cost a run.

Each check names the variable, what was found, why it hurts and what to set instead. Sources: the OLCF
Frontier User Guide and its "PyTorch on Frontier" page (srun over torchrun, RCCL plugin variables,
node-local MIOpen cache), AMD's RCCL usage tips (HIP hardware queues), NVIDIA's NCCL documentation.
"""

from __future__ import annotations

from collections.abc import Mapping

from zerotopo.launch.devices import visible_devices
from zerotopo.launch.discovery import RankInfo

# Variables the aws-ofi-rccl / aws-ofi-nccl plugin needs on HPE Slingshot (CXI) to be fast and not hang.
SLINGSHOT_VARS = ("NCCL_NET_GDR_LEVEL", "FI_MR_CACHE_MONITOR", "FI_CXI_DEFAULT_CQ_SIZE", "NCCL_SOCKET_IFNAME")


def is_slingshot_system(environ: Mapping[str, str], hostname: str) -> bool:
    """Frontier-style HPE Cray EX machine, told by its host names or Lmod's system name."""
    names = (hostname, environ.get("HOSTNAME", ""), environ.get("LMOD_SYSTEM_NAME", ""))
    return any(n.lower().startswith(("frontier", "crusher")) for n in names) or "SLINGSHOT_VNIS" in environ


def warnings_for(info: RankInfo, environ: Mapping[str, str]) -> list[str]:
    """Human-readable warnings about settings known to slow down or break a run; empty when none apply."""
    out: list[str] = []
    slingshot = is_slingshot_system(environ, info.hostname)
    if info.launcher == "torchrun" and slingshot:
        out.append(
            "torchrun on a Frontier-style system: OLCF advises srun (torchrun start-up was measured over an "
            "order of magnitude slower, and srun torchrun makes two task managers clash). Use "
            "launch/frontier.sbatch."
        )
    if info.device_kind == "rocm" and not environ.get("GPU_MAX_HW_QUEUES"):
        out.append(
            "GPU_MAX_HW_QUEUES is unset: HIP maps streams onto 4 hardware queues by default, so the extra "
            "communication streams can share a queue with compute and run serialized. Set it explicitly "
            "(launch/frontier.sbatch sets it) and measure."
        )
    if info.device_kind == "rocm" and not environ.get("MIOPEN_USER_DB_PATH"):
        out.append(
            "MIOPEN_USER_DB_PATH is unset: MIOpen's database in $HOME is shared by every rank and fails with "
            "disk I/O errors (OLCF); point it and MIOPEN_CUSTOM_CACHE_DIR at node-local /tmp."
        )
    if slingshot and info.backend == "nccl":
        missing = [v for v in SLINGSHOT_VARS if not environ.get(v)]
        if missing:
            out.append(
                f"{', '.join(missing)} unset on a Slingshot system: RCCL falls back to TCP sockets or stalls "
                "without the libfabric settings OLCF documents for the aws-ofi-rccl plugin; see "
                "launch/frontier.sbatch."
            )
    if info.device_kind == "cuda" and environ.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1":
        out.append(
            "CUDA_DEVICE_MAX_CONNECTIONS=1 (a tensor-parallel setting) serializes every stream onto one "
            "hardware queue, so prefetched all-gathers cannot overlap compute; unset it for sharded data "
            "parallelism."
        )
    found = visible_devices(environ)
    if info.device_kind != "cpu" and found is not None:
        var, entries = found
        if environ.get("SLURM_GPUS_PER_TASK") == "1" and len(entries) > 1:
            out.append(
                f"{var}={','.join(entries)} shows {len(entries)} devices although --gpus-per-task=1: the "
                "binding did not apply (was --gpu-bind given?), so ranks may share a device; check "
                "zerotopo env on every rank."
            )
        elif len(entries) > 1 and len(entries) < info.local_world_size:
            out.append(
                f"{var} shows {len(entries)} devices for {info.local_world_size} ranks on this node: ranks "
                "would share devices. Launch one rank per device."
            )
    if info.local_world_size > 1 and not environ.get("OMP_NUM_THREADS"):
        out.append(
            f"OMP_NUM_THREADS is unset with {info.local_world_size} ranks on this node: every rank starts one "
            "thread per core and they oversubscribe the CPU; set it to the cores per task (srun -c)."
        )
    return out


def topology_mismatch_advice(info: RankInfo, topology) -> str:
    """What to launch or pass when the job's ranks do not fill ``topology`` (one sentence)."""
    dpn = topology.devices_per_node
    world = info.world_size
    if world % dpn:
        return (
            f"launch a multiple of {dpn} ranks (topology {topology.name!r} has {dpn} devices per node) or pick a "
            "topology whose node matches"
        )
    nodes = world // dpn
    per_node = info.tasks_per_node[0] if info.tasks_per_node else info.local_world_size
    if per_node != dpn and info.num_nodes > 1:
        # Ranks on several real hosts: the machine's topology is wanted, not emulated nodes.
        return topology_choice_advice(info, per_node)
    if per_node != dpn:
        # All ranks on fewer hosts than the topology has nodes: group them into emulated nodes.
        return (
            f"to run these {world} ranks ({per_node} per host) as {nodes} nodes of {dpn} devices, pass "
            f"--emulated-nodes {nodes}; or launch {dpn} tasks per node on {nodes} nodes"
        )
    return f"pass --nodes {nodes} (the launcher's {info.num_nodes} nodes), or drop --nodes"


def topology_choice_advice(info: RankInfo, per_node: int) -> str:
    """Name the ``--topology`` for a job of ``info.num_nodes`` hosts with ``per_node`` ranks each."""
    from zerotopo.placement.topology import builtin_topologies, load_topology

    fits = [n for n in builtin_topologies() if load_topology(n).devices_per_node == per_node]
    gpus = [n for n in fits if not n.startswith("emulated")]
    names = ["frontier"] if "frontier" in gpus and info.device_kind == "rocm" else gpus or fits
    if len(names) == 1:
        return f"pass --topology {names[0]} (a node of {per_node} devices, {info.num_nodes} nodes)"
    listed = ", ".join(names) if names else "a topology YAML file"
    return f"pass --topology with a node of {per_node} devices ({listed}) for these {info.num_nodes} nodes"


def recognised_topology(info: RankInfo, environ: Mapping[str, str]) -> str | None:
    """The built-in topology this rank is unmistakably on, else None: a Frontier node is a Slingshot
    (HPE Cray EX) system whose ranks drive ROCm devices, 8 per node (one per MI250X GCD)."""
    per_node = info.tasks_per_node[0] if info.tasks_per_node else info.local_world_size
    frontier = is_slingshot_system(environ, info.hostname) and info.device_kind == "rocm" and per_node == 8
    return "frontier" if frontier else None
