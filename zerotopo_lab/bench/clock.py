"""The emulated device clock: a rank's compute costs the target device's time, dilated by one factor D.

On CPU ranks sharing two cores, the ranks' arithmetic is the benchmark's noise, and it is not what a
GPU's step spends its time on. Under the device clock each rank still runs the real arithmetic of a
small model, but every kernel a device would run *waits* the target device's time for it, times one
dilation factor ``D`` (:mod:`zerotopo_lab.bench.devicewait` installs the waits):

- a unit's forward (embedding, each layer, the head) waits ``F·T / (peak × efficiency)``, the target
  unit's FLOPs per token ``F`` over ``T`` tokens per micro-batch of the target's; its backward twice
  that, plus one forward more when activations are recomputed; the embedding, which computes nothing,
  its rows' bytes moved at the device's HBM bandwidth;
- an optimizer step waits its shard's bytes moved (:func:`zerotopo.cost.time.optimizer_bytes` per
  element) at the HBM bandwidth;
- a quantize or dequantize pass waits its bytes moved (the Triton kernels' traffic,
  :mod:`zerotopo.placement.volume`) at the HBM bandwidth.

The bench model's units are the target's scaled by one factor ``k`` in bytes (``k`` = bench layer
elements over target layer elements; the vocabulary is derived so the embedding keeps the target's
proportion), so a bench element stands for ``1/k`` target elements wherever the waits count elements, and
a link shaped at the target tier's bandwidth × ``k / D`` (latency × ``D``) carries a bench collective in
``D`` times the target's time. ``D`` is chosen so the real arithmetic is at most a given fraction of the
time waited (:func:`dilation`); the report prints both.

Everything here is arithmetic on frozen values, unit-tested in milliseconds; the waits themselves are
:mod:`zerotopo_lab.bench.devicewait`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

TARGET_DEVICE = "frontier"
"""The topology whose device (an MI250X GCD) and per-device tier figures the clock emulates."""
EFFICIENCY = 0.5
"""Fraction of the device's peak a unit's matrix multiplies reach (the planner's default)."""
ARITHMETIC_SHARE = 0.1
"""The most of a step's waited time the real arithmetic may take (:func:`dilation`), up to
:data:`HALF_SHARE_RANKS` ranks (:func:`arithmetic_share`)."""
HALF_SHARE_RANKS = 16
"""Ranks beyond which the share is half :data:`ARITHMETIC_SHARE` (:func:`arithmetic_share`)."""
SHARE_RANKS = 64
"""Ranks beyond which the half share falls in proportion (:func:`arithmetic_share`)."""
OPTIMIZER_PARAM_BYTES = 2
"""Width of the parameters an optimizer step writes back (bf16 working weights)."""


@dataclass(frozen=True)
class DeviceClock:
    """What a rank needs to wait its device time; picklable (the ranks receive it)."""

    dilation: float
    """D: every device time and every link time is multiplied by it."""
    scale: float
    """k: bench elements per target element (bench layer over target layer)."""
    forward_s: dict[str, float]
    """Target seconds of one micro-batch's forward of a unit, by kind (``embedding``, ``layer``,
    ``head``), undilated."""
    recompute: bool = False
    """Activations are recomputed: a layer's backward also runs its forward again."""
    hbm_gbps: float = 1600.0
    """The target device's memory bandwidth, GB/s (optimizer step and quantizer passes)."""
    optimizer_bytes_per_element: int = 4 + 8 + 16 + 12 + OPTIMIZER_PARAM_BYTES
    """Device-memory bytes an optimizer step moves per element of its shard."""

    def forward_wait(self, kind: str) -> float:
        """Seconds a bench unit of ``kind`` waits for its forward (dilated)."""
        return self.dilation * self.forward_s[kind]

    def backward_wait(self, kind: str) -> float:
        """Seconds a bench unit of ``kind`` waits for its backward: twice its forward, and the forward
        again when a layer's activations are recomputed (dilated)."""
        again = 1.0 if self.recompute and kind == "layer" else 0.0
        return self.dilation * self.forward_s[kind] * (2.0 + again)

    def optimizer_wait(self, numel: int) -> float:
        """Seconds an optimizer step over ``numel`` bench elements waits (dilated)."""
        return self.dilation * numel / self.scale * self.optimizer_bytes_per_element / (self.hbm_gbps * 1e9)

    def memory_wait(self, nbytes: float) -> float:
        """Seconds a kernel moving ``nbytes`` bench bytes through device memory waits (dilated)."""
        return self.dilation * nbytes / self.scale / (self.hbm_gbps * 1e9)

    def step_wait(self, layers: int, micro_batches: int) -> float:
        """Device seconds of one step's units (embedding, ``layers`` layers, head) over ``micro_batches``
        micro-batches, without the optimizer and quantizer (dilated)."""
        kinds = ["embedding"] + ["layer"] * layers + ["head"]
        return micro_batches * sum(self.forward_wait(k) + self.backward_wait(k) for k in kinds)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dilation": self.dilation,
            "scale": self.scale,
            "forward_s": dict(self.forward_s),
            "recompute": self.recompute,
            "hbm_gbps": self.hbm_gbps,
        }


def unit_forward_times(
    target: Any, tokens: int, peak_tflops: float, hbm_gbps: float, efficiency: float = EFFICIENCY
) -> dict[str, float]:
    """Target seconds of one forward of each unit kind over ``tokens`` tokens on a device of
    ``peak_tflops`` at ``efficiency`` (``target``: a :class:`zerotopo.placement.shape.ModelShape`);
    the embedding, which has no FLOPs, reads its rows and writes them out (bf16) at ``hbm_gbps``."""
    if peak_tflops <= 0 or efficiency <= 0 or tokens <= 0:
        raise ValueError(
            f"unit_forward_times needs peak_tflops, efficiency and tokens > 0, got {peak_tflops}, "
            f"{efficiency}, {tokens}"
        )
    rate = peak_tflops * 1e12 * efficiency
    layer = target.layer_unit().flops_per_token * tokens / rate
    head = target.head_unit().flops_per_token * tokens / rate
    embedding = 2 * tokens * target.hidden_size * 2 / (hbm_gbps * 1e9) if hbm_gbps > 0 else 0.0
    return {"embedding": embedding, "layer": layer, "head": head}


def dilation(arithmetic_s: float, device_s: float, share: float = ARITHMETIC_SHARE) -> float:
    """D such that ``arithmetic_s`` (the real arithmetic of one step on a rank) is ``share`` of the
    dilated device time ``D × device_s``; at least 1 (the clock never runs faster than the device)."""
    if device_s <= 0 or not 0 < share <= 1:
        raise ValueError(f"dilation needs device_s > 0 and 0 < share <= 1, got {device_s}, {share}")
    return max(1.0, arithmetic_s / (share * device_s))


def arithmetic_share(ranks: int) -> float:
    """The arithmetic share D is planned for on ``ranks`` ranks: :data:`ARITHMETIC_SHARE` (0.1) up to
    :data:`HALF_SHARE_RANKS` (16), half of it up to :data:`SHARE_RANKS` (64), then that half times
    ``SHARE_RANKS / ranks`` (0.025 at 128 ranks).

    [Note: the share falls with ranks] A collective's hops on CPU ranks each need the receiving rank's
    transport thread on a core, and that wait is real time that D does not stretch: a ring over every
    rank has one hop per rank, and the threads that wait for the cores grow with the ranks too. Measured
    on the 2-core VM (docs/bench.md, "The share at 16 nodes" and "8 nodes again at an arithmetic share of
    0.05"): at 8 and 16 ranks a share of 0.1 held the engine rows' predictions within 10% with the links
    shaped (``--curves off``) and with the Frontier curves paced; at 32 ranks it held them with the curves
    off but not paced (the pick at 0.89 of its median, mics the fastest row), where 0.05 held them
    (0.96-1.07); at 64 ranks zero3 and DeepSpeed ZeRO-3 ran at 0.85 of their predictions with 0.1 and
    within 10% with 0.05, the transport threads' wait for a core being the rest of the step. Beyond 64
    ranks nothing has run; the share keeps falling in proportion so that wait stays a bounded part of
    the dilated step. ``--arithmetic-share`` sets it outright."""
    if ranks < 1:
        raise ValueError(f"arithmetic_share needs at least one rank, got {ranks}")
    if ranks <= HALF_SHARE_RANKS:
        return ARITHMETIC_SHARE
    return ARITHMETIC_SHARE / 2 * min(1.0, SHARE_RANKS / ranks)


def arithmetic_fraction(arithmetic_s: float, waited_s: float) -> float:
    """The real arithmetic's share of the time waited (what the report prints)."""
    return arithmetic_s / waited_s if waited_s > 0 else float("inf")


def target_topology(emulated: Any, device_topology: Any, nodes: int) -> Any:
    """The machine the clock emulates: ``emulated``'s tree (its tiers' names and fan-outs, so the same
    shard groups) at ``nodes`` nodes, each device and each tier with ``device_topology``'s device and
    per-device figures (a tier it lacks by name: its network's share per device), the network's
    injection the per-device share times the emulated node's devices."""
    per_device_net = device_topology.network.injection_gbps / device_topology.devices_per_node
    known = {t.name: t for t in device_topology.tiers}
    tiers = tuple(
        replace(t, bandwidth_gbps=known[t.name].bandwidth_gbps, latency_us=known[t.name].latency_us)
        if t.name in known
        else replace(t, bandwidth_gbps=per_device_net, latency_us=device_topology.network.latency_us)
        for t in emulated.tiers
    )
    network = replace(
        emulated.network,
        injection_gbps=per_device_net * emulated.devices_per_node,
        latency_us=device_topology.network.latency_us,
    )
    return replace(emulated, device=device_topology.device, tiers=tiers, network=network, nodes=nodes)


def link_rates_mbit(target: Any, scale: float, dilation_: float) -> dict[str, float]:
    """Mbit/s per rank of each tier's shaped link: the target tier's per-device bandwidth × ``k / D``
    (the network: its injection per device), so a bench message of ``k`` times the target's bytes takes
    ``D`` times the target's time."""
    out = {t.name: t.bandwidth_gbps * 8000 * scale / dilation_ for t in target.tiers}
    out[target.network.name] = (
        target.network.injection_gbps / target.devices_per_node * 8000 * scale / dilation_
    )
    return out


def link_delays_ms(target: Any, dilation_: float) -> dict[str, float]:
    """One-way delay of each tier's shaped link, ms: the target tier's latency × ``D``."""
    out = {t.name: t.latency_us * dilation_ / 1000 for t in target.tiers}
    out[target.network.name] = target.network.latency_us * dilation_ / 1000
    return out


def roofline_rates(hbm_gbps: float, block: int = 256) -> tuple[tuple[str, str, str, float], ...]:
    """The quantizer's rates by input dtype, code and pass (:mod:`zerotopo.cost.quantrates`, G values
    per second) of kernels that move their bytes at ``hbm_gbps``: a quantize pass reads the value and
    writes its code and its share of a block's fp32 scale, a dequantize pass the reverse (the int4
    dequantize-and-sum: the codes and scales read, its sums' writes left out). What the device clock's
    waits charge each pass (:func:`zerotopo_lab.bench.devicewait.pass_bytes`), so the cost model prices the
    bench's bf16 and fp32 kernels as the clock waits them."""
    from zerotopo.cost.quantrates import VALUE_DTYPES

    rows = []
    for dtype, width in VALUE_DTYPES.items():
        for code, code_bytes in (("int8", 1.0), ("int4", 0.5)):
            payload = code_bytes + 4 / block
            rows.append((dtype, code, "quantize", hbm_gbps / (width + payload)))
            rows.append((dtype, code, "dequantize", hbm_gbps / (payload + (width if code == "int8" else 0))))
    return tuple(rows)


def emulated_device(
    target: Any, clock: DeviceClock, bench_step_flops: float, layers: int, micro_batches: int
) -> Any:
    """``target`` as the cost model prices the bench on the clock (at efficiency 1): tiers and network at
    ``k / D`` of the target's bandwidth and ``D`` times its latency; HBM at ``k / D`` of the target's
    (the optimizer step then takes the clock's wait) and the quantizer's passes at
    :func:`roofline_rates` of it, by input dtype as the clock waits them; and a peak at which
    the bench model's ``bench_step_flops`` (one step, recomputation included) take the clock's device
    time of the step's units (:meth:`DeviceClock.step_wait` of ``layers`` layers, ``micro_batches``)."""
    k, D = clock.scale, clock.dilation
    tiers = tuple(replace(t, bandwidth_gbps=t.bandwidth_gbps * k / D, latency_us=t.latency_us * D)
                  for t in target.tiers)  # fmt: skip
    network = replace(target.network, injection_gbps=target.network.injection_gbps * k / D,
                      latency_us=target.network.latency_us * D)  # fmt: skip
    peak = bench_step_flops / clock.step_wait(layers, micro_batches) / 1e12
    hbm = clock.hbm_gbps * k / D
    device = replace(target.device, peak_tflops=peak, memory_bandwidth_gbps=hbm, quant_gbps=0.0,
                     quant_rates=roofline_rates(hbm))  # fmt: skip
    return replace(target, tiers=tiers, network=network, device=device)
