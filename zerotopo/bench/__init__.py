"""The head-to-head benchmark: zerotopo's plans against DeepSpeed ZeRO-3 / hpZ and PyTorch FSDP2.

``zerotopo bench compare`` (:mod:`zerotopo.bench.compare`) trains one model on one (emulated) cluster
under every row, from the same initial weights on the same data, and reports step time, tokens/s, the
cost model's prediction, the bytes that really crossed each shaped tier, peak memory per rank and the
final loss. :mod:`zerotopo.bench.rows` builds each row's model and step; :mod:`zerotopo.bench.measure`
holds the probes (timing, memory high-water mark, per-tier link counters).
"""

FRAMEWORK_ROWS = ("deepspeed-zero3", "deepspeed-hpz", "fsdp2-hsdp", "fsdp2-hpz")
"""Rows that run another framework (:mod:`zerotopo.bench.rows`)."""
FLOOR_ROW = "no-comm"
"""Every rank steps its own unsharded replica, no communication at all: the compute floor of a step on
these ranks (its loss is not comparable: nothing is averaged)."""
