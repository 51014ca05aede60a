"""Process groups per degree: the mesh every collective of a plan runs on.

:func:`build_mesh` is called once by every rank after ``torch.distributed`` is initialised. It gathers
each rank's topological index and host, checks them against the topology (one clear
:class:`~zerotopo.errors.LaunchError` on every rank instead of a hang or silently wrong groups), then
creates one process group per distinct member set over every group kind of the plan
(:func:`zerotopo.placement.layout.groups`), never one per module.

[Note: group order] A :class:`GroupHandle` lists its ranks by topological index, and ``position`` is the
place in that order; the layout's chunk arithmetic is written in positions. ``torch.distributed`` numbers
a group's members by sorted global rank unless the group is created with ``sort_ranks=False``, and the
launcher's rank order is often not topological (Frontier's ``--gpu-bind=closest``). So every group is
created with its members in topological order (``new_group(ranks, sort_ranks=False)``): the rank inside
the process group *is* the position, and no collective permutes, stages or builds an index tensor. On a
torch without ``sort_ranks`` the groups are sorted and :attr:`GroupHandle.pg_order` says so; the
collectives then permute with index tensors made once per group and device (:meth:`GroupHandle.index`).
The whole job gets such a group too (``world``) when the launcher's order is not topological.

[Note: group creation at scale] Each rank creates only the groups it belongs to, one
``new_group(..., use_local_synchronization=True)`` per distinct member set (at most one per kind), so
start-up costs O(kinds) group creations per rank and O(world) arithmetic, not a ``new_group`` call for
every member set of the job on every rank. torch names such groups by a hash of their members and of how
many groups the process already has; the start-up exchange checks that count agrees on every rank and
falls back to creating every group on every rank (torch's classic protocol) when it does not.

[Note: DeviceMesh] The groups are torch's own process groups, and :attr:`Mesh.device_mesh` hands the
same objects to torch as a ``torch.distributed.device_mesh.DeviceMesh`` laid out in topological order
(dims ``optim_replicas``, ``optim_scatter``, ``grads``: the grid the gradient path runs on, built with
``DeviceMesh.from_group`` over the groups made here; :meth:`Mesh.device_mesh_of` gives any one kind as a
1-D mesh), so DTensor, ``fully_shard`` and torch's tooling see the engine's groups, coordinates equal to
positions. The groups are not created by ``DeviceMesh`` itself (``init_device_mesh``) because that gives
up both notes above: (1) it creates each dim's groups with ``new_group(ranks)``, whose default numbers
members by sorted global rank, so under a non-topological launch order the rank inside a group is not
the position (checked on 4 gloo ranks with mesh ``[[2, 0], [3, 1]]``: rank 2, position 0 of its ``shard``
group, is group rank 1), and every collective would permute through index tensors; (2) on gloo, and on
NCCL without an eagerly bound device, every rank calls ``new_group`` for every subgroup of every dim
(``split_group`` is taken only for an eagerly initialised NCCL group), O(world) calls per rank instead of
one per kind. What this module adds to torch is the mapping from kinds to member sets (:func:`plan_groups`,
pure) and the creation of each set once.
"""

from __future__ import annotations

import inspect
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
import torch.distributed as dist

from zerotopo.comm.context import CommContext
from zerotopo.errors import LaunchError
from zerotopo.placement import layout
from zerotopo.placement.plan import Degrees, Plan
from zerotopo.placement.topology import Topology

#: Kinds beyond the layout's: the whole job, and the two hops of the hierarchical int4 reduce-scatter.
EXTRA_KINDS = ("world", "grads_intra", "grads_inter")
#: Every kind a mesh answers for, in the (fixed) order groups are created on every rank.
MESH_KINDS = tuple(dict.fromkeys((*layout.GROUP_KINDS, "optim", *EXTRA_KINDS)))


@dataclass(frozen=True)
class GroupHandle:
    """This rank's group of one kind: its members by topological index and the process group."""

    kind: str
    """A layout group kind, or ``world``, ``grads_intra``, ``grads_inter``."""
    ranks: tuple[int, ...]
    """Global ranks of the group, ordered by topological index."""
    position: int
    """This rank's index in ``ranks``."""
    tier: str | None
    """Outermost tier the group crosses (None for a single rank)."""
    pg: Any = field(default=None, compare=False, repr=False)
    """The ``torch.distributed`` process group; None when the group is this rank alone."""
    pg_order: tuple[int, ...] | None = field(default=None, compare=False, repr=False)
    """Global ranks in the order ``pg`` numbers them; None: sorted by global rank (torch's default)."""
    _indices: dict = field(default_factory=dict, compare=False, repr=False)
    comm: CommContext = field(default_factory=CommContext, compare=False, repr=False)
    """The collectives' context (shared by every group of one mesh)."""

    @property
    def size(self) -> int:
        return len(self.ranks)

    @cached_property
    def pg_ranks(self) -> tuple[int, ...]:
        """For each position, the member's rank inside ``pg``."""
        order = self.pg_order if self.pg_order is not None else tuple(sorted(self.ranks))
        where = {r: i for i, r in enumerate(order)}
        return tuple(where[r] for r in self.ranks)

    @cached_property
    def in_order(self) -> bool:
        """Whether ``pg`` numbers the members by position (no collective on it permutes anything)."""
        return self.pg_ranks == tuple(range(self.size))

    @cached_property
    def position_of_pg_rank(self) -> tuple[int, ...]:
        """Inverse of :attr:`pg_ranks`: the position of each rank of ``pg``."""
        inv = [0] * self.size
        for pos, j in enumerate(self.pg_ranks):
            inv[j] = pos
        return tuple(inv)

    def index(self, values: tuple[int, ...], device: torch.device) -> torch.Tensor:
        """An index tensor of ``values`` on ``device``, made once per group and reused by every call
        (a tensor built from a list on every call would be a host-to-device copy that syncs the host)."""
        key = (tuple(values), str(device))
        t = self._indices.get(key)
        if t is None:
            t = self._indices[key] = torch.tensor(key[0], dtype=torch.long, device=device)
        return t


@dataclass(frozen=True)
class RankPlacement:
    """What one rank reports at start-up."""

    rank: int
    topo_index: int
    hostname: str
    node: int
    local_index: int
    pg_count: int | None = None


def backend_label(backend: str) -> str:
    """The backend as a person knows it: RCCL is torch's ``nccl`` on a ROCm build."""
    if backend == "nccl" and getattr(torch.version, "hip", None):
        return "rccl"
    return backend


def default_device() -> torch.device:
    """The device of this rank: the local rank's accelerator, or the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    # One visible device per task (srun --gpus-per-task=1) is cuda:0 whatever its physical id.
    local = int(os.environ.get("LOCAL_RANK", "0"))
    return torch.device("cuda", local % count if count else 0)


def this_hostname() -> str:
    """The host this rank runs on; ``ZEROTOPO_EMULATED_NODE`` names an emulated node instead."""
    return os.environ.get("ZEROTOPO_EMULATED_NODE") or socket.gethostname()


class Mesh:
    """Every process group a plan needs, created once; look groups up by kind with :meth:`group`."""

    def __init__(
        self,
        topology: Topology,
        plan: Plan,
        degrees: Degrees,
        *,
        rank: int,
        topo_index: int,
        rank_of_index: tuple[int, ...],
        device: torch.device,
        backend: str,
        handles: dict[str, GroupHandle],
    ):
        self.topology = topology
        self.plan = plan
        self.degrees = degrees
        self.rank = rank
        self.world_size = len(rank_of_index)
        self.topo_index = topo_index
        self.rank_of_index = rank_of_index
        self.device = device
        self.backend = backend
        self._handles = handles
        self.comm: CommContext = next((h.comm for h in handles.values()), None) or CommContext()
        """The collectives' context of this mesh's groups (see :class:`~zerotopo.comm.context.CommContext`)."""

    def group(self, kind: str) -> GroupHandle:
        """This rank's group of ``kind`` (see :data:`MESH_KINDS`)."""
        if kind not in self._handles:
            if kind == "secondary":
                raise ValueError(f"plan {self.plan.name!r} has no secondary partition, so no secondary group")
            raise ValueError(f"unknown group kind {kind!r}; kinds are {', '.join(self._handles)}")
        return self._handles[kind]

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self._handles)

    #: The dims of :attr:`device_mesh`, outermost first: optimizer replicas x gradient groups inside an
    #: optimizer group x ranks of a gradient group (``world/o x o/g x g`` in topological order).
    DEVICE_MESH_DIMS = ("optim_replicas", "optim_scatter", "grads")

    @cached_property
    def device_mesh(self) -> Any:
        """This job as a ``DeviceMesh`` over the engine's own process groups (see [Note: DeviceMesh]).

        Dims of size 1 are left out (a plan whose optimizer states span the job has no
        ``optim_replicas``); None on a single rank. Rank ``mesh[i, j, k]`` is topological index
        ``i·o + j·g + k``, and a rank's coordinate along each dim is its position in that kind's group."""
        dims = [k for k in self.DEVICE_MESH_DIMS if self._handles[k].size > 1]
        if not dims:
            return None
        d = self.degrees
        sizes = {"optim_replicas": d.world // d.optim, "optim_scatter": d.optim // d.grads, "grads": d.grads}
        grid = torch.tensor(self.rank_of_index, dtype=torch.int).view(
            *(sizes[k] for k in self.DEVICE_MESH_DIMS)
        )
        grid = grid.view(*(sizes[k] for k in dims))
        return self._from_groups(dims, grid)

    def device_mesh_of(self, kind: str) -> Any:
        """This rank's group of ``kind`` as a 1-D ``DeviceMesh`` (its members in topological order); None
        when the group is this rank alone."""
        h = self.group(kind)
        if h.size == 1:
            return None
        return self._from_groups([kind], torch.tensor(h.ranks, dtype=torch.int))

    def _from_groups(self, kinds: list[str], grid: torch.Tensor) -> Any:
        from torch.distributed.device_mesh import DeviceMesh

        handles = [self._handles[k] for k in kinds]
        unordered = [h.kind for h in handles if not h.in_order]
        if unordered:
            # DeviceMesh reads a rank's coordinate from the process group, which must number by position.
            raise LaunchError(
                f"the {', '.join(unordered)} process groups number their members by sorted rank (this torch "
                f"{torch.__version__} has no new_group(sort_ranks=False)), so a DeviceMesh over them would "
                "disagree with the topological positions; use a torch whose new_group takes sort_ranks, or "
                "launch ranks in topological order (rank = topological index)"
            )
        pgs = [h.pg for h in handles]
        return DeviceMesh.from_group(
            pgs if len(pgs) > 1 else pgs[0], self.device.type, grid, mesh_dim_names=tuple(kinds)
        )

    def describe(self) -> str:
        """One line per kind: size, tier crossed and members (global ranks, topological order)."""
        lines = [
            f"mesh: rank {self.rank} of {self.world_size}, topological index {self.topo_index}, "
            f"{backend_label(self.backend)} on {self.device}, plan {self.plan.name} "
            f"({self.plan.label(self.topology)})"
        ]
        for kind, h in self._handles.items():
            members = ",".join(map(str, h.ranks))
            lines.append(f"  {kind:<15} size {h.size:>4}  tier {h.tier or 'local':<10} ranks [{members}]")
        return "\n".join(lines)


def _index_groups(topology: Topology, degrees: Degrees, kind: str) -> list[list[int]]:
    """Every group of ``kind`` as lists of topological indices (each ordered by index)."""
    world = degrees.world
    if kind == "world":
        return [list(range(world))]
    if kind in ("grads_intra", "grads_inter"):
        dpn = topology.devices_per_node
        out: list[list[int]] = []
        for members in layout.groups(degrees, "grads"):
            # Hop groups of the hierarchical reduce-scatter: a grads group cut by node, or by the
            # position inside the node. The node size is the topology's, never the visible devices'.
            key = (lambda t: t // dpn) if kind == "grads_intra" else (lambda t: t % dpn)
            buckets: dict[int, list[int]] = {}
            for t in members:
                buckets.setdefault(key(t), []).append(t)
            out.extend(buckets.values())
        return out
    return layout.groups(degrees, kind)


def _sort_ranks_supported() -> bool:
    try:
        return "sort_ranks" in inspect.signature(dist.new_group).parameters
    except (TypeError, ValueError):
        return False


def new_group_in_order(ranks: tuple[int, ...], *, local: bool) -> tuple[Any, tuple[int, ...]]:
    """A process group of ``ranks`` numbered in the given order where torch allows it.

    Returns ``(pg, pg_order)``: the global ranks in the order ``pg`` numbers them. ``local``: only the
    members call this (``use_local_synchronization``); otherwise every rank of the job must call it.
    """
    kwargs: dict[str, Any] = {"use_local_synchronization": True} if local else {}
    if _sort_ranks_supported():
        return dist.new_group(list(ranks), sort_ranks=False, **kwargs), tuple(ranks)
    order = tuple(sorted(ranks))
    return dist.new_group(list(order), **kwargs), order


def _pg_count() -> int | None:
    """How many process groups this process has (torch hashes it into locally created groups' names)."""
    try:
        return len(dist.distributed_c10d._world.pg_names)
    except AttributeError:
        return None


def plan_groups(
    topology: Topology, degrees: Degrees, rank_of_index: tuple[int, ...], topo_index: int
) -> dict[str, tuple[list[int], tuple[int, ...]]]:
    """This rank's group of every kind: ``kind -> (topological indices, global ranks)``, both in
    topological order. One pass over each kind's groups; pure, so it is tested at thousands of ranks."""
    out: dict[str, tuple[list[int], tuple[int, ...]]] = {}
    for kind in MESH_KINDS:
        if kind == "secondary" and degrees.secondary is None:
            continue
        for members in _index_groups(topology, degrees, kind):
            if members[0] <= topo_index <= members[-1] and topo_index in members:
                out[kind] = (members, tuple(rank_of_index[t] for t in members))
                break
    return out


def _placements(infos: Iterable[RankPlacement], topology: Topology) -> tuple[int, ...]:
    """Check the gathered placements; return topological index -> global rank."""
    infos = sorted(infos, key=lambda p: p.rank)
    world = len(infos)
    seen: dict[int, list[int]] = {}
    for p in infos:
        seen.setdefault(p.topo_index, []).append(p.rank)
    bad = {t: r for t, r in seen.items() if len(r) > 1 or not 0 <= t < world}
    missing = sorted(set(range(world)) - set(seen))
    if bad or missing:
        detail = "; ".join(f"index {t} claimed by ranks {r}" for t, r in sorted(bad.items()))
        raise LaunchError(
            f"topological indices of the {world} ranks are not a permutation of 0..{world - 1}: "
            f"{detail or ''}{'; ' if detail and missing else ''}"
            f"{'no rank has index ' + str(missing) if missing else ''}. Every rank must pass its own "
            f"index (zerotopo.launch.discovery.topological_index); check the node ids and the device "
            f"binding of the launcher (topology {topology.name!r}, {topology.devices_per_node} per node)."
        )
    rank_of_index = [0] * world
    for p in infos:
        rank_of_index[p.topo_index] = p.rank
    return tuple(rank_of_index)


def _check_hosts(infos: list[RankPlacement], topology: Topology) -> None:
    """Ranks the topology puts on one node must share a host, and different nodes different hosts."""
    by_node: dict[int, dict[str, list[int]]] = {}
    for p in infos:
        by_node.setdefault(p.node, {}).setdefault(p.hostname, []).append(p.rank)
    problems = []
    for node, hosts in sorted(by_node.items()):
        if len(hosts) > 1:
            parts = ", ".join(f"ranks {r} on {h!r}" for h, r in sorted(hosts.items()))
            problems.append(f"topology node {node} spans several hosts ({parts})")
    owner: dict[str, int] = {}
    for node, hosts in sorted(by_node.items()):
        for h, ranks in hosts.items():
            if h in owner and owner[h] != node:
                problems.append(
                    f"host {h!r} holds ranks of topology nodes {owner[h]} and {node} (ranks {ranks} ...)"
                )
            owner.setdefault(h, node)
    if problems:
        raise LaunchError(
            "the topology does not match where the ranks run: "
            + "; ".join(problems)
            + f". Topology {topology.name!r} puts {topology.devices_per_node} ranks on each of "
            f"{topology.nodes} nodes; launch that many tasks per node (srun --ntasks-per-node="
            f"{topology.devices_per_node}), fix the device binding, or pick the topology of this machine."
        )


def _create_groups(
    topology: Topology,
    degrees: Degrees,
    rank_of_index: tuple[int, ...],
    mine: dict[str, tuple[list[int], tuple[int, ...]]],
    *,
    local: bool,
) -> dict[tuple[int, ...], tuple[Any, tuple[int, ...]]]:
    """``member ranks -> (process group, pg_order)`` for every set of ``mine`` with more than one rank.

    [Note: group creation at scale] (module docstring): one group per distinct member set this rank
    belongs to, created by its members only (``local``), in the fixed kind order; identical member sets (a
    plan's params and grads groups are often the same ranks) share one group."""
    pgs: dict[tuple[int, ...], tuple[Any, tuple[int, ...]]] = {}
    if rank_of_index == tuple(range(len(rank_of_index))):
        pgs[rank_of_index] = (dist.group.WORLD, rank_of_index)
    if local:
        for _, ranks in mine.values():
            if len(ranks) > 1 and ranks not in pgs:
                pgs[ranks] = new_group_in_order(ranks, local=True)
        return pgs
    # torch's classic protocol: every rank creates every group, in the same order.
    for kind in mine:
        for members in _index_groups(topology, degrees, kind):
            ranks = tuple(rank_of_index[t] for t in members)
            if len(ranks) > 1 and ranks not in pgs:
                pgs[ranks] = new_group_in_order(ranks, local=False)
    return pgs


def build_mesh(
    topology: Topology,
    plan: Plan,
    *,
    topo_index: int,
    device: torch.device | None = None,
    check: bool = True,
    hostname: str | None = None,
) -> Mesh:
    """Create every process group of ``plan`` on ``topology`` (collective: every rank calls it).

    ``topo_index`` is this rank's topological index; ``hostname`` overrides the host this rank reports
    (default: ``ZEROTOPO_EMULATED_NODE`` or the real host name); ``check=False`` skips the host check
    (the world size and index checks always run: groups cannot be built without them).
    """
    if not dist.is_initialized():
        raise LaunchError(
            "torch.distributed is not initialised; call zerotopo.launch.discovery.init_distributed "
            "(or dist.init_process_group) on every rank before building the mesh"
        )
    degrees = plan.degrees(topology)
    rank, world = dist.get_rank(), dist.get_world_size()
    # Every rank sees the same world size, so this raises on all of them before any collective.
    if world != topology.world_size:
        raise LaunchError(
            f"the job has {world} ranks but topology {topology.name!r} has {topology.nodes} nodes x "
            f"{topology.devices_per_node} devices = {topology.world_size}; launch "
            f"{topology.world_size} ranks or give the topology the job's node count (--nodes)"
        )
    backend = str(dist.get_backend())
    if device is None:
        device = default_device() if backend != "gloo" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dpn = topology.devices_per_node
    me = RankPlacement(
        rank, int(topo_index), hostname or this_hostname(), topo_index // dpn, topo_index % dpn, _pg_count()
    )
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, me)
    infos = sorted(gathered, key=lambda p: p.rank)
    rank_of_index = _placements(infos, topology)
    if check:
        _check_hosts(infos, topology)

    mine = plan_groups(topology, degrees, rank_of_index, int(topo_index))
    counts = {getattr(p, "pg_count", None) for p in infos}
    local = len(counts) == 1 and None not in counts
    pgs = _create_groups(topology, degrees, rank_of_index, mine, local=local)
    handles: dict[str, GroupHandle] = {}
    comm = CommContext()
    for kind, (members, ranks) in mine.items():
        pg, order = pgs[ranks] if len(ranks) > 1 else (None, ranks)
        handles[kind] = GroupHandle(
            kind=kind,
            ranks=ranks,
            position=members.index(topo_index),
            tier=topology.tier_of_group(members),
            pg=pg,
            pg_order=order,
            comm=comm,
        )
    return Mesh(
        topology,
        plan,
        degrees,
        rank=rank,
        topo_index=int(topo_index),
        rank_of_index=rank_of_index,
        device=device,
        backend=backend,
        handles=handles,
    )
