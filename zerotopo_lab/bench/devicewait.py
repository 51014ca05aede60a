"""The device clock's waits inside a rank (:mod:`zerotopo_lab.bench.clock` says how long each is).

[Note: one place for the waits] Every row of ``bench compare`` / ``bench scale`` builds its model with
:func:`zerotopo_lab.bench.rows.build_model`, and every framework steps a torch optimizer and (the engine)
runs the block quantizer through :mod:`zerotopo.comm.quant`. So the waits hook those three places and
no framework's code: each unit module of the model (embedding, layers, head), torch's global optimizer
step hooks, and the quantizer's kernel dispatch. zerotopo's plans, DeepSpeed and FSDP2 pay the same
device time for the same work.

[Note: how a wait is done] A device runs its kernels while its host goes on: the host's own work (the
real arithmetic of the small model, the quantizer's passes, the framework's Python between kernels)
hides under the device's time unless it outlasts it. So each thread keeps a balance: at the end of a
kernel it is charged the kernel's device time and credited every second it was *active* since its last
charge (on a core or runnable waiting for one: :mod:`zerotopo_lab.bench.hosttime`), and it sleeps what
the balance owes. Active time beyond the device time (a CPU quantizer pass is several times its device
kernel; ranks that outnumber the cores wait for one) is carried as credit against the thread's next
waits in the step, so a step's wall time is its device time as long as its later waits can take the
host's excess, as a device's would. Time a rank spends blocked on a collective is neither processor
time nor run-queue delay, so it never shortens a wait (a unit waits for its gather, then computes, as
a device stream does), and a sleep frees the core for the other ranks, as a device would.
:meth:`Waited.restart` drops the balance at each step's start: no credit crosses a step's end (a first
step's start-up work would otherwise shorten the next step's waits).

A unit's forward is charged after its forward (a forward hook); its backward when the unit's input
gradient exists (an identity autograd function on its input, whose backward runs then); a unit whose
input needs no gradient (the embedding) is charged when its backward starts (the same function on its
output).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from zerotopo.placement import volume
from zerotopo_lab.bench.clock import DeviceClock
from zerotopo_lab.bench.hosttime import thread_times


@dataclass
class _Balance:
    """One thread's account with its device: its active seconds at its last charge, and the active
    seconds beyond the device time charged so far that no wait has taken yet."""

    mark: float
    credit: float = 0.0


def _active() -> float:
    t = thread_times()
    return t.cpu_s + t.run_delay_s


@dataclass
class Waited:
    """Running totals of one rank: seconds waited and seconds of host activity credited, by kind."""

    waited_s: dict[str, float] = field(default_factory=dict)
    arithmetic_s: dict[str, float] = field(default_factory=dict)
    """Active seconds of the thread credited against each kind's device time (its real arithmetic,
    the host work since the previous charge and its wait for a core)."""
    charged_s: dict[str, float] = field(default_factory=dict)
    """Device seconds charged so far (dilated), by kind."""
    overshoot_s: float = 0.0
    """Seconds the sleeps lasted beyond what they asked for (the scheduler's wake-up latency)."""
    balances: dict[int, _Balance] = field(default_factory=dict)
    """Each thread's balance, by thread id."""

    def restart(self) -> None:
        """Drop every thread's balance: the next charge credits no earlier activity."""
        self.balances.clear()

    def charge(self, kind: str, device_s: float) -> None:
        """Charge the calling thread ``device_s`` of ``kind``, credit its activity since its last charge
        and sleep what the balance owes (see the module note)."""
        now = _active()
        ident = threading.get_ident()
        balance = self.balances.get(ident)
        if balance is None:
            balance = self.balances[ident] = _Balance(now)
        active = now - balance.mark
        balance.mark = now  # a sleep's wake-up delay is active time of the next charge
        rest = device_s - active - balance.credit
        balance.credit = max(0.0, -rest)
        if rest > 0:
            t0 = time.perf_counter()
            time.sleep(rest)
            self.overshoot_s += max(0.0, time.perf_counter() - t0 - rest)
        self.waited_s[kind] = self.waited_s.get(kind, 0.0) + max(0.0, rest)
        self.arithmetic_s[kind] = self.arithmetic_s.get(kind, 0.0) + active
        self.charged_s[kind] = self.charged_s.get(kind, 0.0) + device_s

    @property
    def device_s(self) -> float:
        """Device seconds charged so far, every kind."""
        return sum(self.charged_s.values())

    def credit_s(self) -> float:
        """Active seconds beyond the device time charged that no wait has taken yet, every thread."""
        return sum(b.credit for b in self.balances.values())

    def totals(self) -> tuple[float, float]:
        """(seconds waited, seconds of activity credited) over every kind."""
        return sum(self.waited_s.values()), sum(self.arithmetic_s.values())

    def figures(self) -> dict[str, float]:
        """The running totals a report reads: seconds slept, of activity credited, of device time
        charged and of sleep overshoot."""
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

    def backward_end() -> None:
        waited.charge(f"{kind} backward", backward_s)

    def pre(mod: Any, args: tuple) -> tuple | None:
        x = args[0] if args else None
        if torch.is_grad_enabled() and isinstance(x, torch.Tensor) and x.requires_grad:
            return (_Mark.apply(x, backward_end), *args[1:])
        return None

    def post(mod: Any, args: tuple, out: Any) -> Any:
        waited.charge(f"{kind} forward", forward_s)
        if not (torch.is_grad_enabled() and isinstance(out, torch.Tensor) and out.requires_grad):
            return None
        x = args[0] if args else None
        ends_here = isinstance(x, torch.Tensor) and x.requires_grad
        # without an input gradient there is no end to mark: the backward is charged when it starts
        return _Mark.apply(out, _nothing if ends_here else backward_end)

    return [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]


def _nothing() -> None:
    return None


def install_optimizer(clock: DeviceClock, waited: Waited) -> list[Any]:
    """Every torch optimizer step in this process waits its shard's device time (torch's global step
    hook: the engine's per-unit optimizers, DeepSpeed's and FSDP2's AdamW)."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    def post(opt: Any, args: Any, kwargs: Any) -> None:
        numel = sum(p.numel() for g in opt.param_groups for p in g["params"] if p.grad is not None)
        waited.charge("optimizer", clock.optimizer_wait(numel))

    return [register_optimizer_step_post_hook(post)]


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
            out = fn(*args)
            waited.charge("quantizer", clock.memory_wait(pass_bytes(name, args)))
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
