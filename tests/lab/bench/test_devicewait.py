"""The device clock's waits in one process: each unit's forward and backward, the optimizer step and the
quantizer's passes wait their device time, less the arithmetic they did."""

from __future__ import annotations

import threading
import time

import pytest
import torch
import torch.nn.functional as F

from zerotopo.models.config import NeoXConfig
from zerotopo.placement import volume
from zerotopo_lab.bench.clock import DeviceClock
from zerotopo_lab.bench.devicewait import (
    Waited,
    install_optimizer,
    install_quantizer,
    install_units,
    pass_bytes,
)
from zerotopo_lab.bench.rows import build_model

CFG = NeoXConfig(
    vocab_size=64, hidden_size=16, num_layers=2, num_attention_heads=2, max_position_embeddings=8
)
FORWARD = {"embedding": 0.01, "layer": 0.03, "head": 0.02}


def _step(model, optim=None) -> None:
    x = torch.randint(0, 64, (1, 8))
    F.cross_entropy(model(x).reshape(-1, 64), x.reshape(-1)).backward()
    if optim is not None:
        optim.step()


def _paid(waited: Waited, kind: str, device_s: float) -> None:
    """A kind was charged its device time, and every second charged was paid: slept, or taken by the
    thread's own activity (what is left of that activity is credit for later waits)."""
    assert waited.charged_s[kind] == pytest.approx(device_s, rel=1e-9)
    slept, work = waited.totals()
    assert slept + work == pytest.approx(waited.device_s + waited.credit_s(), rel=1e-6, abs=1e-9)


def test_every_unit_waits_its_forward_and_backward():
    clock = DeviceClock(dilation=1.0, scale=1.0, forward_s=FORWARD)
    waited = Waited()
    model = build_model(CFG)
    _step(model)  # warm: the first step's start-up work is not a unit's arithmetic
    handles = install_units(model, clock, waited)
    t0 = time.perf_counter()
    _step(model)
    wall = time.perf_counter() - t0
    assert set(waited.waited_s) == {f"{k} {p}" for k in FORWARD for p in ("forward", "backward")}
    assert wall >= 0.9 * sum(waited.waited_s.values())  # the waits are slept
    # one micro-batch: each unit's forward once, its backward (twice the forward) once; two layers
    for kind, t in FORWARD.items():
        n = 2 if kind == "layer" else 1
        _paid(waited, f"{kind} forward", n * t)
        _paid(waited, f"{kind} backward", n * 2 * t)
    x = torch.randint(0, 64, (1, 8))
    assert model.head(model.layers[0](model.embed_in(x)))._base is None  # no unit output is a view
    for h in handles:
        h.remove()
    before = dict(waited.waited_s)
    _step(model)
    assert waited.waited_s == before  # removed: nothing waits


def test_a_recomputed_layer_waits_its_forward_again():
    cfg = NeoXConfig(**{**CFG.__dict__, "checkpoint_activations": True})
    clock = DeviceClock(dilation=1.0, scale=1.0, forward_s=FORWARD, recompute=True)
    waited = Waited()
    model = build_model(cfg)
    _step(model)
    install_units(model, clock, waited)
    _step(model)
    # two layers, each its forward again in its backward (2 x 2 without recompute)
    _paid(waited, "layer backward", 2 * 3 * FORWARD["layer"])


def test_the_optimizer_step_waits_its_shards_bytes():
    clock = DeviceClock(dilation=2.0, scale=0.5, forward_s=FORWARD, hbm_gbps=0.01)
    waited = Waited()
    model = build_model(CFG)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    handles = install_optimizer(clock, waited)
    try:
        _step(model, optim)
    finally:
        for h in handles:
            h.remove()
    _paid(waited, "optimizer", clock.optimizer_wait(sum(p.numel() for p in model.parameters())))


def test_quantizer_passes_wait_their_bytes_moved():
    from zerotopo.comm.quant import dequantize, quantize_int8

    clock = DeviceClock(dilation=1.0, scale=1.0, forward_s=FORWARD, hbm_gbps=1e-3)
    waited = Waited()
    undo = install_quantizer(clock, waited)
    try:
        x = torch.randn(4096)
        dequantize(quantize_int8(x, 256))
    finally:
        undo()
    payload = volume.int8_payload(4096, 256)
    moved = volume.quantize_traffic(4096, payload, 4) + volume.dequantize_traffic(4096, payload, 4)
    _paid(waited, "quantizer", moved / 1e6)


def test_pass_bytes_reads_the_kernels_arguments():
    from zerotopo.comm.quant import quantize_rows

    rows = torch.randn(8, 512, dtype=torch.bfloat16)
    q = quantize_rows(rows, 4, 256)
    p4 = volume.int4_payload(8 * 512, 256)
    assert pass_bytes("quantize", (rows, 4, 256)) == volume.quantize_traffic(8 * 512, p4, 2)
    args = (q.data, q.scales, 8, 512, 4, 256)
    assert pass_bytes("dequantize_reduce", args) == volume.dequantize_reduce_traffic(8 * 512, 8, p4)
    assert pass_bytes("dequantize", (*args, torch.bfloat16)) == volume.dequantize_traffic(8 * 512, p4, 2)


def _busy(seconds: float) -> None:
    deadline = time.thread_time() + seconds
    while time.thread_time() < deadline:
        pass


def test_host_work_between_kernels_hides_under_the_next_kernels_device_time():
    waited = Waited()
    waited.charge("embedding forward", 0.0)  # opens this thread's balance
    t0 = time.perf_counter()
    _busy(0.02)  # the host's own work: a device would run its kernel meanwhile
    waited.charge("layer forward", 0.3)
    wall = time.perf_counter() - t0
    active = waited.arithmetic_s["layer forward"]  # its processor time and its wait for a core
    assert active >= 0.02
    assert waited.waited_s["layer forward"] == pytest.approx(max(0.0, 0.3 - active))
    assert 0.3 * 0.98 <= wall < max(0.3, active) + 0.1  # the device's time, not the host's plus it


def test_activity_beyond_a_kernels_device_time_is_taken_by_the_next_waits():
    # a CPU quantizer pass is several times its device kernel: the excess is credited, so the step
    # still lasts its device time
    waited = Waited()
    waited.charge("embedding forward", 0.0)
    t0 = time.perf_counter()
    _busy(0.03)
    waited.charge("quantizer", 0.01)
    excess = waited.arithmetic_s["quantizer"] - 0.01
    assert waited.waited_s["quantizer"] == 0.0 and waited.credit_s() == pytest.approx(excess)
    waited.charge("layer forward", 0.3)
    wall = time.perf_counter() - t0
    assert waited.waited_s["layer forward"] <= 0.3 - excess + 1e-9
    active = sum(waited.arithmetic_s.values())
    assert 0.31 * 0.98 <= wall < max(0.31, active) + 0.1  # not the excess plus the device time
    assert waited.device_s == pytest.approx(0.31)


def test_blocked_time_does_not_shorten_a_wait():
    # a rank blocked on a collective is not computing: its kernel waits its whole device time after
    waited = Waited()
    waited.charge("embedding forward", 0.0)
    threading.Event().wait(0.1)  # blocked, as on a collective's wait
    t0 = time.perf_counter()
    waited.charge("layer forward", 0.2)
    assert time.perf_counter() - t0 >= 0.2 - waited.arithmetic_s["layer forward"] - 1e-3
    assert waited.arithmetic_s["layer forward"] < 0.05


def test_a_threads_balance_is_its_own_and_restart_drops_it():
    waited = Waited()
    waited.charge("embedding forward", 0.0)
    _busy(0.03)
    waited.charge("quantizer", 0.0)  # this thread's credit: 0.03 s and more
    mine = waited.credit_s()
    assert mine >= 0.03

    def other() -> None:  # the engine's step-end reductions run on a worker thread on CPU
        waited.charge("quantizer", 0.0)
        waited.charge("optimizer", 0.2)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    # the worker's wait took nothing of this thread's credit
    assert waited.waited_s["optimizer"] + waited.arithmetic_s["optimizer"] == pytest.approx(0.2)
    assert waited.credit_s() == pytest.approx(mine)
    waited.restart()
    assert waited.credit_s() == 0.0
    waited.charge("embedding forward", 0.0)
    waited.charge("layer forward", 0.2)
    assert waited.waited_s["layer forward"] + waited.arithmetic_s["layer forward"] == pytest.approx(0.2)
