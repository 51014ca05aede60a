"""The cost model and planner: memory, bytes per tier and step time of a plan, without a process group.

- :mod:`~zerotopo.cost.memory`: bytes per device by state (Xu et al., "Scaling Large Language Model
  Training on Frontier with Low-Bandwidth Partitioning" (arXiv:2501.04266) Tables V-VI; Chen et al., "Lins:
  Reducing Communication Overhead of ZeRO for Efficient LLM Training" (IWQoS 2024,
  doi:10.1109/IWQoS61813.2024.10682856) §IV-D).
- :mod:`~zerotopo.cost.comm`: every collective of a step, its group, tier and bytes (Tables VII-VIII).
- :mod:`~zerotopo.cost.time`: alpha-beta collective times, NeoX compute, overlap.
- :mod:`~zerotopo.cost.calibration`: measured per-tier figures that override a topology's.
- :mod:`~zerotopo.cost.planner`: cost every candidate plan and rank those that fit.
"""

from zerotopo.cost.calibration import apply_calibration, load_calibration
from zerotopo.cost.comm import CollectiveCost, bytes_by_tier, comm_per_step
from zerotopo.cost.memory import MemoryBreakdown, memory_per_device
from zerotopo.cost.planner import CostOptions, PlanEstimate, plan_candidates
from zerotopo.cost.time import OverlapModel, StepTime, step_time

__all__ = [
    "CollectiveCost",
    "CostOptions",
    "MemoryBreakdown",
    "OverlapModel",
    "PlanEstimate",
    "StepTime",
    "apply_calibration",
    "bytes_by_tier",
    "comm_per_step",
    "load_calibration",
    "memory_per_device",
    "plan_candidates",
    "step_time",
]
