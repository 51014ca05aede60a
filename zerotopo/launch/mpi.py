"""Rank discovery under ``mpiexec``/``mpirun``: rank, size, node and rendezvous address from mpi4py.

MPI launchers do not agree on environment variables (Open MPI, MPICH's hydra, Cray PALS and PMIx all
differ), so the numbers come from MPI itself. mpi4py stays optional: it is imported here only, when an
MPI launch was detected or asked for.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from zerotopo.errors import LaunchError
from zerotopo.launch.discovery import RankPlace

INSTALL_HINT = "pip install mpi4py mpich (or build mpi4py against your site MPI, e.g. cray-mpich)"


@dataclass(frozen=True)
class MpiWorld(RankPlace):
    """What MPI says about this process and its job."""

    tasks_per_node: tuple[int, ...]


def import_mpi() -> Any:
    """``mpi4py.MPI``, or a :class:`LaunchError` that says how to install it."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise LaunchError(
            f"an MPI launch was detected (or --launcher mpi given) but mpi4py cannot be imported ({exc}); "
            f"{INSTALL_HINT}."
        ) from None
    return MPI


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _rendezvous_address(environ: Mapping[str, str], multi_node: bool) -> str:
    """Rank 0's address as the other ranks should dial it."""
    if environ.get("MASTER_ADDR"):
        return environ["MASTER_ADDR"]
    host = socket.gethostname()
    try:
        addr = socket.gethostbyname(host)
    except OSError:
        return host
    # Debian maps the host name to 127.0.1.1: fine on one node, unreachable from the others.
    return host if multi_node and addr.startswith("127.") else addr


def world_from_comm(comm: Any, mpi: Any, environ: Mapping[str, str]) -> MpiWorld:
    """Work out the layout with collectives on ``comm`` (``mpi`` is the ``mpi4py.MPI`` module)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    # Ranks sharing memory are one node; key=rank keeps the world order inside it.
    node_comm = comm.Split_type(mpi.COMM_TYPE_SHARED, key=rank)
    local_rank, local_size = node_comm.Get_rank(), node_comm.Get_size()
    # Node ids: number the nodes' first ranks in world order (rank 0's node is node 0).
    leaders = comm.Split(0 if local_rank == 0 else mpi.UNDEFINED, key=rank)
    node_id = leaders.Get_rank() if local_rank == 0 else None
    if leaders != mpi.COMM_NULL:
        leaders.Free()
    node_id = node_comm.bcast(node_id, root=0)
    node_comm.Free()
    sizes = comm.allgather((node_id, local_size) if local_rank == 0 else None)
    tasks = tuple(n for _, n in sorted(s for s in sizes if s is not None))
    if rank == 0:
        port = int(environ["MASTER_PORT"]) if environ.get("MASTER_PORT", "").isdigit() else _free_port()
        rendezvous = (_rendezvous_address(environ, len(tasks) > 1), port)
    else:
        rendezvous = None
    master_addr, master_port = comm.bcast(rendezvous, root=0)
    return MpiWorld(
        rank=rank,
        world_size=size,
        local_rank=local_rank,
        local_world_size=local_size,
        node_id=node_id,
        num_nodes=len(tasks),
        master_addr=master_addr,
        master_port=master_port,
        tasks_per_node=tasks,
    )


def query_mpi_world(environ: Mapping[str, str]) -> MpiWorld:
    """Initialise MPI (through mpi4py) and return this process's :class:`MpiWorld`."""
    mpi = import_mpi()
    return world_from_comm(mpi.COMM_WORLD, mpi, environ)
