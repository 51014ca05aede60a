"""The head-to-head benchmark: zerotopo's plans against DeepSpeed ZeRO-3 / hpZ and PyTorch FSDP2.

``zerotopo bench compare`` (:mod:`zerotopo_lab.bench.compare`) trains one model on one (emulated) cluster
under every row, from the same initial weights on the same data, and reports step time, tokens/s, the
cost model's prediction, the bytes that really crossed each shaped tier, peak memory per rank and the
final loss. :mod:`zerotopo_lab.bench.rows` builds each row's model and step; :mod:`zerotopo_lab.bench.measure`
holds the probes (timing, memory high-water mark, per-tier link counters).
"""

FRAMEWORK_ROWS = ("deepspeed-zero3", "deepspeed-hpz", "fsdp2-hsdp", "fsdp2-hpz")
"""Rows that run another framework (:mod:`zerotopo_lab.bench.rows`)."""
FLOOR_ROW = "no-comm"
"""Every rank steps its own unsharded replica, no communication at all: the compute floor of a step on
these ranks (its loss is not comparable: nothing is averaged)."""
PRECISIONS = {"fp32": 4, "bf16": 2}
"""``bench compare --dtype``: bytes per element of the weights, the gathered weights and the reduced
gradients (master weights and optimizer states are fp32 in both; :mod:`zerotopo_lab.bench.precision`)."""


def wire_bytes(name: str) -> dict[str, int]:
    """The cost model's widths (:class:`zerotopo.cost.planner.CostOptions` fields) for rows run in
    ``name``: weights and each micro-batch's gradient reduction at its width, the accumulated gradient
    shard fp32 either way (the rows' ``reduce_dtype``, DeepSpeed's and FSDP2's bf16 modes)."""
    width = PRECISIONS[name]
    return {"param_bytes": width, "reduce_bytes": width, "grad_bytes": 4}
