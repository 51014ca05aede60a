"""What Muon adds to a plan's step (see [Note: Muon with owner-held state] in ``zerotopo/engine/muon.py``):
the Newton-Schulz FLOPs on the busiest owner of the ``optim`` group, its imbalance, the two fp32
all-to-alls that carry each matrix's gradient pieces to its owner and its updated weights back, and the
optimizer state bytes.

The engine keeps the fp32 master and every state on the element shards, each laid out over the whole
chunk (``4 × (1 + states)`` bytes per element: 16 with an AdamW aux, against AdamW's 12), and each owner
holds its matrices' fp32 master and momentum whole besides (8 bytes per owned element, the busiest owner
priced). The parameter all-gather and the gradient reduce-scatter move the same bytes as under AdamW;
the exchange is the extra traffic.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from zerotopo.cost.time import StepTime
from zerotopo.placement.layout import group_of, optim_range, padded_numel
from zerotopo.placement.matrices import Matrix, assign_owners, exchange
from zerotopo.placement.plan import Degrees
from zerotopo.placement.schedule import group_tier
from zerotopo.placement.shape import ModelShape
from zerotopo.placement.topology import Topology

#: Newton-Schulz runs in bf16 (torch's ``Muon``): priced at the device's peak × this efficiency unless a
#: measured rate is given.
NS_EFFICIENCY = 0.5


@dataclass(frozen=True)
class MuonPricing:
    """What the planner prices a Muon run by (``CostOptions.muon``): torch's ``Muon`` with ``ns_steps``
    Newton-Schulz iterations on the matrices and an elementwise aux keeping ``aux_states`` fp32 states
    per element (AdamW: 2) on the rest."""

    ns_steps: int = 5
    aux_states: int = 2

    def __post_init__(self) -> None:
        if self.ns_steps < 1 or self.aux_states < 0:
            raise ValueError(
                f"MuonPricing: ns_steps must be at least 1 and aux_states at least 0, got {self.ns_steps} "
                f"and {self.aux_states}"
            )

    @property
    def state_bytes_per_param(self) -> int:
        """The fp32 master, the aux's states and Muon's momentum, each over the whole chunk (the owners'
        whole matrices come on top: :attr:`MuonCost.owned_bytes`)."""
        return 4 * (1 + self.aux_states + 1)


def _ns_rate(topology: Topology, efficiency: float, achieved_tflops: float | None) -> float:
    """FLOP/s of the owners' bf16 Newton-Schulz: a measured rate, else the device's peak × ``efficiency``."""
    return (achieved_tflops or topology.device.peak_tflops * efficiency) * 1e12


def model_matrices(shape: ModelShape) -> list[Matrix]:
    """The 2-D weights Muon updates, as the engine chooses them (every unit but the first and the last:
    the layers), at their offsets in the units' flat buffers."""
    out = []
    units = shape.units()
    for u, unit in enumerate(units[1:-1], start=1):
        off = 0
        for p in unit.params:
            if len(p.shape) == 2:
                out.append(Matrix(p.name, u, off, *p.shape))
            off += p.numel
    return out


@dataclass(frozen=True)
class MuonCost:
    """Muon's share of one step on one rank of a plan."""

    matrices: int
    ns_flops: int
    """Newton-Schulz FLOPs of the busiest owner per step."""
    flops_imbalance: float
    """Busiest owner over the mean (the step waits for the busiest)."""
    exchange_bytes: int
    """Bytes the busiest position sends per step in the two all-to-alls (fp32 both ways, each pair exactly
    its pieces: :meth:`~zerotopo.placement.matrices.Exchange.step_bytes`)."""
    exchange_tier: str | None
    """The outermost tier the ``optim`` group crosses (None: one position, no exchange)."""
    ns_s: float
    exchange_s: float
    state_bytes_per_param: int
    """On the element chunks, per parameter of the chunk."""
    owned_bytes: int = 0
    """The busiest owner's whole matrices: fp32 master and momentum (8 bytes per element)."""

    @property
    def seconds(self) -> float:
        """Added to the step: the exchange and the owner's Newton-Schulz run one after the other."""
        return self.ns_s + self.exchange_s


def muon_cost(
    shape: ModelShape,
    d: Degrees,
    topology: Topology,
    *,
    ns_steps: int = 5,
    aux_states: int = 2,
    efficiency: float = NS_EFFICIENCY,
    achieved_tflops: float | None = None,
) -> MuonCost:
    """Muon's cost under degrees ``d`` for rank 0's ``optim`` group (every group is alike):
    ``aux_states`` per-element states of the aux type (AdamW 2), ``achieved_tflops`` a measured bf16 rate
    (else the device's peak × ``efficiency``). The exchange is priced at the crossed tier's per-device
    bandwidth, not overlapped with anything."""
    mats = model_matrices(shape)
    own = assign_owners(mats, d.optim, steps=ns_steps)
    members = group_of(0, d, "optim")
    numels = [padded_numel(u.numel, d) for u in shape.units()]
    ranges = [[optim_range(t, d, n) for n in numels] for t in members]
    ex = exchange(mats, own.owners, ranges)
    tier = group_tier(topology, d, "optim")
    nbytes = max(ex.step_bytes(q) for q in range(d.optim)) if d.optim > 1 else 0
    rate = _ns_rate(topology, efficiency, achieved_tflops)
    busiest = max(own.flops) if own.flops else 0
    link = topology.bandwidth_gbps(tier) * 1e9 if tier is not None else 0.0
    return MuonCost(
        matrices=len(mats),
        ns_flops=busiest,
        flops_imbalance=own.flops_imbalance,
        exchange_bytes=nbytes,
        exchange_tier=tier,
        ns_s=busiest / rate,
        exchange_s=nbytes / link if link else 0.0,
        state_bytes_per_param=4 * (1 + aux_states + 1),
        owned_bytes=max(own.state_bytes(q) for q in range(d.optim)) if mats else 0,
    )


def ns_seconds_lower_bound(
    shape: ModelShape,
    d: Degrees,
    topology: Topology,
    *,
    ns_steps: int = 5,
    efficiency: float = NS_EFFICIENCY,
    achieved_tflops: float | None = None,
) -> float:
    """A lower bound on :func:`muon_cost`'s ``seconds`` without assigning owners: the busiest owner does
    at least the mean of the group's Newton-Schulz FLOPs, and the exchange takes at least no time."""
    total = sum(m.ns_flops(ns_steps) for m in model_matrices(shape))
    return total / d.optim / _ns_rate(topology, efficiency, achieved_tflops)


def with_muon(t: StepTime, c: MuonCost) -> StepTime:
    """``t`` with Muon's step added after it, overlapped with nothing: the busiest owner's Newton-Schulz
    joins the optimizer step, the exchange the communication the compute does not hide; the rates
    shrink by the same factor as the step grows."""
    step = t.step_time_s + c.seconds
    slower = t.step_time_s / step if step > 0 else 1.0
    return replace(
        t,
        step_time_s=step,
        comm_s=t.comm_s + c.exchange_s,
        exposed_comm_s=t.exposed_comm_s + c.exchange_s,
        optimizer_s=t.optimizer_s + c.ns_s,
        tokens_per_s=t.tokens_per_s * slower,
        tflops_per_device=t.tflops_per_device * slower,
        mfu=t.mfu * slower,
    )
