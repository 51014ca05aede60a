"""``zerotopo plan --optimizer adamw,muon``: each ranked plan under each optimizer, side by side.

AdamW keeps 12 bytes of optimizer state per parameter. Muon (with an AdamW aux,
:mod:`zerotopo.engine.muon`) keeps 16 on the element chunks and the busiest owner's whole matrices (fp32
master and momentum) beside them, and adds, per step, the Newton-Schulz FLOPs of the busiest owner of the
``optim`` group and the two fp32 all-to-alls of its exchange (:mod:`zerotopo.cost.muon`); both are
added to the step time, not overlapped with anything. The ranking itself prices the first optimizer
listed (``CostOptions.muon``), so the plans are those the search found for it.
"""

from __future__ import annotations

from zerotopo.cli.plan import columns
from zerotopo.cost.memory import GIB
from zerotopo.cost.muon import muon_cost
from zerotopo.cost.planner import CostOptions, PlanEstimate
from zerotopo.errors import ConfigError
from zerotopo.placement.shape import ModelShape
from zerotopo.placement.topology import Topology

KINDS = ("adamw", "muon")
ADAMW_BYTES = 12


def parse_kinds(text: str) -> tuple[str, ...]:
    """``adamw,muon`` -> ``("adamw", "muon")``; a ConfigError naming an unknown one."""
    kinds = tuple(k.strip().lower() for k in text.split(",") if k.strip())
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ConfigError(
            f"expected a comma-separated list of {', '.join(KINDS)}, found {text!r}", source="--optimizer"
        )
    return kinds


def optimizer_table(
    est: list[PlanEstimate], topo: Topology, shape: ModelShape, options: CostOptions, kinds: tuple[str, ...]
) -> str:
    """One row per plan and optimizer: optimizer and total memory, fit, step time, and Muon's parts."""
    limit = options.memory_limit_bytes or topo.device.memory_gib * GIB
    rate = options.achieved_tflops
    rows = [
        [
            "plan",
            "optimizer",
            "optim GiB",
            "total GiB",
            "fits",
            "step s",
            "NS s",
            "NS imbal",
            "exch GB",
            "exch s",
            "exch tier",
        ]
    ]
    for e in est:
        chunks = e.memory.optim - (e.muon.owned_bytes if e.muon is not None else 0)
        per_param = chunks / options.state_bytes_per_param if options.state_bytes_per_param else 0
        # the ranking's step without the optimizer it priced (Muon's part is added back below)
        base = e.time.step_time_s - (e.muon.seconds if e.muon is not None else 0.0)
        for kind in kinds:
            if kind == "muon":
                c = e.muon or muon_cost(
                    shape, e.degrees, topo, efficiency=options.efficiency, achieved_tflops=rate
                )
                optim, extra = per_param * c.state_bytes_per_param + c.owned_bytes, c.seconds
                muon = [f"{c.ns_s:.3f}", f"{c.flops_imbalance:.2f}", f"{c.exchange_bytes / 1e9:.2f}",
                        f"{c.exchange_s:.3f}", c.exchange_tier or "-"]  # fmt: skip
            else:
                optim, extra, muon = per_param * ADAMW_BYTES, 0.0, ["-"] * 5
            total = e.memory.total - e.memory.optim + optim
            rows.append(
                [e.name, "Muon" if kind == "muon" else "AdamW", f"{optim / GIB:.2f}", f"{total / GIB:.2f}",
                 "yes" if total <= limit else "NO", f"{base + extra:.3f}", *muon]
            )  # fmt: skip
    return columns(
        [
            "optimizers side by side: optimizer state per device (AdamW 12 B/param; Muon + AdamW aux 16 on the "
            "chunks and the busiest owner's whole matrices, fp32 master and momentum), the step with Muon's "
            "Newton-Schulz on the busiest owner (bf16, 5 steps) and its exchange (two fp32 all-to-alls in the "
            "optim group, each pair exactly its pieces) added",
        ],
        rows,
    )
