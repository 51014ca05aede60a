"""Which accelerator a rank drives: the device kind of this machine and the physical device id.

With ``srun --gpus-per-task=1`` every rank sees exactly one device, always numbered 0 inside the process;
the physical id (the GCD or GPU number on the node) is only visible in the environment Slurm or the user
set. That physical id, not the local rank, says where the rank sits in the node's topology.
"""

from __future__ import annotations

from collections.abc import Mapping

from zerotopo.errors import LaunchError

# Most specific first: on ROCm, ROCR_VISIBLE_DEVICES filters at the runtime level and holds physical ids;
# HIP_/CUDA_VISIBLE_DEVICES set on top of it would index into what ROCr already exposes.
VISIBLE_DEVICE_VARS = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
# Set by Slurm's gres plugin for the step, whatever the vendor.
SLURM_DEVICE_VARS = ("SLURM_STEP_GPUS", "GPU_DEVICE_ORDINAL")


def detect_device_kind() -> str:
    """``'cuda'``, ``'rocm'`` or ``'cpu'`` for this process, from torch (ROCm builds set ``torch.version.hip``)."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    return "rocm" if getattr(torch.version, "hip", None) else "cuda"


def backend_for(device_kind: str) -> str:
    """The torch.distributed backend: ``nccl`` on GPUs (RCCL is torch's nccl backend on ROCm), else gloo."""
    return "nccl" if device_kind in ("cuda", "rocm") else "gloo"


#: Most entries a device list may have (no node has more devices).
MAX_VISIBLE = 4096


def _check_entry(var: str, value: str, entry: str) -> None:
    """An entry is a device number (``-1`` hides every device) or a ``GPU-``/``MIG-`` UUID."""
    if entry.isascii() and entry.isdigit() and len(entry) <= 5:
        return
    if entry == "-1" or (entry.isascii() and entry.startswith(("GPU-", "MIG-")) and len(entry) <= 100):
        return
    shown = value if len(value) <= 60 else value[:57] + "..."
    raise LaunchError(
        f"{var}={shown!r}: entry {entry[:20]!r} is neither a device number nor a GPU-/MIG- UUID; "
        "expected a comma-separated list like '0,1' (check the variable or unset it)."
    )


def visible_devices(environ: Mapping[str, str]) -> tuple[str, list[str]] | None:
    """The first device-list variable that is set, and its entries: ``('ROCR_VISIBLE_DEVICES', ['4'])``.
    Raises :class:`LaunchError` when the list is not one of device numbers or UUIDs."""
    for var in VISIBLE_DEVICE_VARS + SLURM_DEVICE_VARS:
        value = environ.get(var)
        if value is None or not value.strip():
            continue
        entries = value.split(",")
        if len(entries) > MAX_VISIBLE:
            raise LaunchError(
                f"{var} lists {len(entries)} devices, more than {MAX_VISIBLE}; check the variable."
            )
        entries = [item.strip() for item in entries if item.strip()]
        for entry in entries:
            _check_entry(var, value, entry)
        return var, entries
    return None


def physical_device(environ: Mapping[str, str], local_rank: int, device_kind: str) -> int | None:
    """The physical device id this rank drives, or None when it cannot be told (CPU, UUIDs, no variable).

    One visible device means the launcher bound it to this rank (``--gpus-per-task=1``): that id. Several
    mean the rank picks by local rank, torchrun style: the local-rank-th entry.
    """
    found = visible_devices(environ)  # a garbage list is an error even on a CPU
    if device_kind == "cpu":
        return None
    if found is None:
        return None
    _, entries = found
    if len(entries) == 1:
        entry = entries[0]
    elif local_rank < len(entries):
        entry = entries[local_rank]
    else:
        return None
    # GPU-<uuid> / MIG-<uuid> entries (and -1, no device) carry no position in the node.
    return int(entry) if entry.isdigit() else None


def is_gpu_topology(topology) -> bool:
    """Whether ``topology`` describes GPU ranks: the CPU topologies (``emulated*``) reduce on the host."""
    return not getattr(topology.device, "host_reduce", False)


def hidden_by(environ: Mapping[str, str], devices_per_node: int | None = None) -> tuple[str, str, str] | None:
    """The first device-list variable that hides every device: ``(variable, value, why)``, else None.

    A list hides every device when it is empty, when its first entry is ``-1`` (it hides that entry and
    all after it), or when its first entry is a device number the node does not have (``devices_per_node``
    of them): the CUDA and HIP runtimes stop reading a list at its first invalid entry, so nothing is
    visible."""
    for var in VISIBLE_DEVICE_VARS:
        value = environ.get(var)
        if value is None:
            continue
        entries = [e.strip() for e in value.split(",")]
        if not any(entries):
            return var, value, "hides every device"
        first = entries[0]
        if first == "-1":
            return var, value, "hides every device"
        if devices_per_node and first.isascii() and first.isdigit() and int(first) >= devices_per_node:
            return (
                var,
                value,
                f"hides every device (device {first} is not one of the node's {devices_per_node})",
            )
    return None


def check_device_list(environ: Mapping[str, str], topology, device_count: int | None = None) -> None:
    """On a GPU topology, a device list that hides every device (see :func:`hidden_by`) is an error before
    any rank starts: such a rank would fall back to the CPU and gloo while its peers use the GPU, and wait
    for them until the rendezvous times out. ``device_count``: the devices this rank sees (a launched
    rank's check); none while a device-list variable is set is the same error, naming the variable."""
    if not is_gpu_topology(topology):
        return
    found = hidden_by(environ, topology.devices_per_node)
    if found is None and device_count == 0:
        found = next(
            ((v, environ[v], "leaves this rank no device") for v in VISIBLE_DEVICE_VARS if v in environ), None
        )
    if found is None:
        return
    var, value, why = found
    shown = value if len(value) <= 60 else value[:57] + "..."
    raise LaunchError(
        f"{var}={shown!r} {why}, but topology {topology.name!r} runs one rank per "
        f"{topology.device.name}; unset {var} or list the devices (e.g. 0,1,2,3), or pick a CPU "
        "topology (emulated)."
    )


def agree_on_device_kind(store, rank: int, world: int, kind: str, timeout_s: float = 600.0) -> None:
    """Collective over the rendezvous store, before the process group exists: every rank publishes its
    device kind, rank 0 compares them and publishes the verdict, and every rank raises the same
    :class:`LaunchError` naming the first rank that differs (instead of mixing nccl and gloo ranks, which
    hang until the timeout)."""
    import datetime

    store.set_timeout(datetime.timedelta(seconds=timeout_s))
    store.set(f"zerotopo/device_kind/{rank}", kind)
    if rank == 0:
        kinds = [store.get(f"zerotopo/device_kind/{r}").decode() for r in range(world)]
        odd = next((r for r, k in enumerate(kinds) if k != kinds[0]), None)
        verdict = (
            "" if odd is None else f"rank {odd} found device kind {kinds[odd]!r}, rank 0 found {kinds[0]!r}"
        )
        store.set("zerotopo/device_kind/verdict", verdict)
    verdict = store.get("zerotopo/device_kind/verdict").decode()
    if verdict:
        raise LaunchError(
            f"the ranks see different devices: {verdict}; every rank must see its GPU (check "
            f"{'/'.join(VISIBLE_DEVICE_VARS)} and the GPU binding of the launcher on that rank's node)."
        )
