"""The device clock's waits in one process: each unit's forward and backward, the optimizer step and the
quantizer's passes wait their device time, less the arithmetic they did."""

from __future__ import annotations

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
    """A kind's device time was paid: slept what the arithmetic left of it (nothing when the arithmetic
    took longer, as under a loaded machine)."""
    slept, work = waited.waited_s[kind], waited.arithmetic_s[kind]
    assert slept + work == pytest.approx(max(device_s, work), rel=1e-6, abs=1e-9)


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
        waited.waited_s[f"{kind} forward"] /= n
        waited.arithmetic_s[f"{kind} forward"] /= n
        _paid(waited, f"{kind} forward", t)
    head_and_embedding = ("embedding backward", "head backward")
    for kind in head_and_embedding:
        _paid(waited, kind, 2 * FORWARD[kind.split()[0]])
    assert waited.waited_s["layer backward"] + waited.arithmetic_s["layer backward"] >= 2 * 2 * FORWARD[
        "layer"
    ] * (1 - 1e-6)
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
    layer = waited.arithmetic_s["layer backward"] + waited.waited_s["layer backward"]
    # two layers, each its forward again (2 x 2 without recompute); the split between waited and arithmetic
    # time depends on this machine's load, their sum does not fall below the device time
    assert layer >= 2 * 3 * FORWARD["layer"] * (1 - 1e-6)


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
    assert waited.nested_s == pytest.approx(waited.arithmetic_s["quantizer"])


def test_pass_bytes_reads_the_kernels_arguments():
    from zerotopo.comm.quant import quantize_rows

    rows = torch.randn(8, 512, dtype=torch.bfloat16)
    q = quantize_rows(rows, 4, 256)
    p4 = volume.int4_payload(8 * 512, 256)
    assert pass_bytes("quantize", (rows, 4, 256)) == volume.quantize_traffic(8 * 512, p4, 2)
    args = (q.data, q.scales, 8, 512, 4, 256)
    assert pass_bytes("dequantize_reduce", args) == volume.dequantize_reduce_traffic(8 * 512, 8, p4)
    assert pass_bytes("dequantize", (*args, torch.bfloat16)) == volume.dequantize_traffic(8 * 512, p4, 2)


def test_the_totals_split_device_time_into_sleep_and_arithmetic():
    waited = Waited()
    waited.add("layer forward", 0.02, 0.005)
    waited.add("quantizer", 0.001, 0.004)  # arithmetic beyond its device time: nothing to sleep
    f = waited.figures()
    assert f["device"] == pytest.approx(0.021)
    assert f["waited"] == pytest.approx(0.015)
    assert f["arithmetic"] == pytest.approx(0.009)
    assert 0.0 <= f["overshoot"] < 0.015
