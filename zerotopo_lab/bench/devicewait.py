"""The device clock's waits inside a rank (:mod:`zerotopo_lab.bench.clock` says how long each is).

[Note: one place for the waits] Every row of ``bench compare`` / ``bench scale`` builds its model with
:func:`zerotopo_lab.bench.rows.build_model`, and every framework steps a torch optimizer and (the engine)
runs the block quantizer through :mod:`zerotopo.comm.quant`. So the waits hook those three places and
no framework's code: each unit module of the model (embedding, layers, head), torch's global optimizer
step hooks, and the quantizer's kernel dispatch. zerotopo's plans, DeepSpeed and FSDP2 pay the same
device time for the same work.

[Note: how a wait is done] A wait is ``time.sleep`` of the device time *less the real arithmetic* the
rank just did for that kernel, measured as this thread's processor time (``time.thread_time``): a
device computes while its host and the other ranks go on, and a sleep frees the core for the other
ranks, as a device would; time a rank spends blocked on a collective is not processor time, so it
never shortens a wait (a unit waits for its gather, then computes, as a device stream does). A
quantizer pass inside a unit's window is charged once, as its own kernel.

A unit's forward wait runs after its forward (a forward hook); its backward is bracketed by two
identity autograd functions, on the unit's output (its backward starts the unit's backward) and on its
input (its backward runs once the unit's input gradient exists, the end of the unit's backward), where
the remainder is waited; a unit whose input needs no gradient (the embedding) waits at the start.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from zerotopo.placement import volume
from zerotopo_lab.bench.clock import DeviceClock


@dataclass
class Waited:
    """Running totals of one rank: seconds waited and seconds of real arithmetic, by kind."""

    waited_s: dict[str, float] = field(default_factory=dict)
    arithmetic_s: dict[str, float] = field(default_factory=dict)
    nested_s: float = 0.0
    """Processor seconds of quantizer passes so far (a unit's window leaves them out)."""
    device_s: float = 0.0
    """Device seconds charged so far (dilated), every kind."""
    overshoot_s: float = 0.0
    """Seconds the sleeps lasted beyond what they asked for (the scheduler's wake-up latency)."""

    def add(self, kind: str, device_s: float, arithmetic_s: float) -> None:
        """Wait what ``device_s`` leaves after ``arithmetic_s`` and record both."""
        rest = device_s - arithmetic_s
        if rest > 0:
            t0 = time.perf_counter()
            time.sleep(rest)
            self.overshoot_s += max(0.0, time.perf_counter() - t0 - rest)
        self.waited_s[kind] = self.waited_s.get(kind, 0.0) + max(0.0, rest)
        self.arithmetic_s[kind] = self.arithmetic_s.get(kind, 0.0) + arithmetic_s
        self.device_s += device_s

    def totals(self) -> tuple[float, float]:
        """(seconds waited, seconds of arithmetic) over every kind."""
        return sum(self.waited_s.values()), sum(self.arithmetic_s.values())

    def figures(self) -> dict[str, float]:
        """The running totals a report reads: seconds slept, of arithmetic, of device time charged and
        of sleep overshoot."""
        slept, work = self.totals()
        return {"waited": slept, "arithmetic": work, "device": self.device_s, "overshoot": self.overshoot_s}


class _Mark(torch.autograd.Function):
    """Identity whose backward calls ``fn`` (the device clock's backward bracket). Its output is a copy,
    not a view: a unit's output that is a view of another tensor loses a wrapping framework's
    pre-backward hook to any in-place op on it (FSDP2 warns of exactly that)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, fn: Any) -> torch.Tensor:
        ctx.fn = fn
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.fn()
        return grad, None


def unit_kinds(model: Any) -> list[tuple[str, torch.nn.Module]]:
    """(kind, module) of each unit of a :class:`zerotopo.models.neox.GPTNeoX`."""
    return [("embedding", model.embed_in)] + [("layer", m) for m in model.layers] + [("head", model.head)]


def install_units(model: Any, clock: DeviceClock, waited: Waited) -> list[Any]:
    """Hook every unit of ``model`` to wait its forward and backward device time; returns the hook
    handles."""
    handles = []
    for kind, module in unit_kinds(model):
        handles += _hook_unit(module, kind, clock, waited)
    return handles


def _hook_unit(module: torch.nn.Module, kind: str, clock: DeviceClock, waited: Waited) -> list[Any]:
    forward_s, backward_s = clock.forward_wait(kind), clock.backward_wait(kind)
    mark: dict[str, float] = {}

    def cpu() -> float:
        return time.thread_time() - waited.nested_s

    def backward_start() -> None:
        mark["backward"] = cpu()

    def backward_end() -> None:
        waited.add(f"{kind} backward", backward_s, max(0.0, cpu() - mark.pop("backward", cpu())))

    def pre(mod: Any, args: tuple) -> tuple | None:
        mark["forward"] = cpu()
        x = args[0] if args else None
        if torch.is_grad_enabled() and isinstance(x, torch.Tensor) and x.requires_grad:
            return (_Mark.apply(x, backward_end), *args[1:])
        return None

    def post(mod: Any, args: tuple, out: Any) -> Any:
        waited.add(f"{kind} forward", forward_s, max(0.0, cpu() - mark.pop("forward", cpu())))
        if not (torch.is_grad_enabled() and isinstance(out, torch.Tensor) and out.requires_grad):
            return None
        x = args[0] if args else None
        ends_here = isinstance(x, torch.Tensor) and x.requires_grad
        # without an input gradient there is no end to bracket: the whole backward is waited first
        return _Mark.apply(
            out, backward_start if ends_here else lambda: waited.add(f"{kind} backward", backward_s, 0.0)
        )

    return [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]


def install_optimizer(clock: DeviceClock, waited: Waited) -> list[Any]:
    """Every torch optimizer step in this process waits its shard's device time (torch's global step
    hooks: the engine's per-unit optimizers, DeepSpeed's and FSDP2's AdamW)."""
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    started: dict[int, float] = {}

    def pre(opt: Any, args: Any, kwargs: Any) -> None:
        started[id(opt)] = time.thread_time()

    def post(opt: Any, args: Any, kwargs: Any) -> None:
        numel = sum(p.numel() for g in opt.param_groups for p in g["params"] if p.grad is not None)
        spent = time.thread_time() - started.pop(id(opt), time.thread_time())
        waited.add("optimizer", clock.optimizer_wait(numel), spent)

    return [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]


def pass_bytes(name: str, args: tuple) -> float:
    """Device-memory bytes of one quantizer kernel call (:mod:`zerotopo.comm.quant`'s dispatch names and
    arguments), the Triton kernels' traffic: quantize reads the values and writes codes and scales;
    dequantize reads them and writes the values; the int4 dequantize-and-sum writes one fp32 row."""
    if name == "quantize":
        x2, bits, block = args[0], args[1], args[2]
        n = x2.numel()
        payload = (volume.int8_payload if bits == 8 else volume.int4_payload)(n, block)
        return volume.quantize_traffic(n, payload, x2.element_size())
    if name in ("dequantize", "dequantize_into", "dequantize_reduce"):
        first = 1 if name == "dequantize_into" else 0
        data, scales, rows, n = args[first : first + 4]
        payload = data.numel() * data.element_size() + scales.numel() * scales.element_size()
        if name == "dequantize_reduce":
            return volume.dequantize_reduce_traffic(rows * n, rows, payload)
        width = (
            args[0].element_size()
            if name == "dequantize_into"
            else torch.empty((), dtype=args[-1]).element_size()
        )
        return volume.dequantize_traffic(rows * n, payload, width)
    return 0.0


def install_quantizer(clock: DeviceClock, waited: Waited) -> Any:
    """Every quantize and dequantize kernel this process runs waits its bytes moved at the device's
    HBM bandwidth (dilated); returns a function that undoes it."""
    from zerotopo.comm import quant

    original = quant._run

    def run(name: str, reference: Any, device: Any, kernels: Any) -> Any:
        fn = original(name, reference, device, kernels)

        def timed(*args: Any) -> Any:
            t0 = time.thread_time()
            out = fn(*args)
            spent = time.thread_time() - t0
            waited.nested_s += spent
            waited.add("quantizer", clock.memory_wait(pass_bytes(name, args)), spent)
            return out

        return timed

    quant._run = run

    def undo() -> None:
        quant._run = original

    return undo


def install(clock: DeviceClock, waited: Waited | None = None) -> Waited:
    """The optimizer and quantizer waits of this process (units are hooked per model,
    :func:`install_units`); returns the running totals."""
    waited = waited or Waited()
    install_optimizer(clock, waited)
    install_quantizer(clock, waited)
    return waited
