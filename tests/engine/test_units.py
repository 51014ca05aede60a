"""Single-process pieces of the engine: unit discovery, tied weights, flat buffers, the emulated copy
engine and the sanitizer."""

from __future__ import annotations

import time

import pytest
import torch

from tests.engine.cases import TinyLM
from zerotopo.engine.streams import CopyEngine, OrderingError, Ready, Sanitizer, emulated_delay_s
from zerotopo.engine.units import FlatUnit, UnitState, assign_params, collect_units
from zerotopo.errors import ZerotopoError
from zerotopo.models.neox import GPTNeoX, NeoXConfig
from zerotopo.plan import Degrees


def test_default_units_are_list_children_and_top_level_modules():
    model = TinyLM(layers=2, unused=True)
    names = [n for n, _ in collect_units(model, None)]
    assert names == ["embed", "blocks.0", "blocks.1", "head", "spare"]
    pairs, stray = assign_params(model, collect_units(model, None))
    assert not stray
    assert sum(len(p) for _, _, p in pairs) == len(list(model.parameters()))


def test_stray_parameters_go_to_the_root():
    model = TinyLM(layers=1)
    model.temperature = torch.nn.Parameter(torch.ones(()))
    _, stray = assign_params(model, collect_units(model, None))
    assert [n for n, _ in stray] == ["temperature"]


def test_tied_weights_are_rejected_naming_both_modules():
    cfg = NeoXConfig(vocab_size=32, hidden_size=16, num_layers=1, num_attention_heads=2, tie_embeddings=True)
    model = GPTNeoX(cfg)
    with pytest.raises(ZerotopoError, match=r"head\.embed_out\.weight.*'embed_in'"):
        assign_params(model, collect_units(model, None))


def _unit(t: int, d: Degrees, dtype=torch.float32) -> tuple[FlatUnit, torch.nn.Module]:
    torch.manual_seed(0)
    mod = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.LayerNorm(3))
    params = list(mod.named_parameters())
    u = FlatUnit(
        "u", mod, params, index=0, degrees=d, topo_index=t, param_dtype=dtype, device=torch.device("cpu")
    )
    return u, mod


def test_flat_unit_views_padding_and_free():
    d = Degrees(params=2, grads=4, optim=8, world=8)
    want = [p.detach().clone() for p in _unit(0, d)[1].parameters()]
    u, mod = _unit(5, d)
    assert u.numel == 5 * 3 + 3 + 3 + 3 and u.padded % 16 == 0 and u.padded >= u.numel
    for p, w in zip(mod.parameters(), want):
        assert p.data.data_ptr() >= u.full.data_ptr() and torch.equal(p.data, w)
    assert u.param_shard.numel() == u.padded // 2
    u.free_full()
    assert u.state is UnitState.SHARDED and not u.is_allocated()
    u.alloc_full()
    assert u.is_allocated()
    # masks: weight decays (ndim 2), biases and norm weights do not
    decay, trainable = u.masks()
    assert decay.numel() == u.padded // 8 and trainable.numel() == u.padded // 8


def test_flat_unit_keeps_fp32_master_of_bf16_params():
    d = Degrees(params=1, grads=1, optim=1, world=1)
    u, mod = _unit(0, d, dtype=torch.bfloat16)
    assert u.full.dtype == torch.bfloat16 and u.initial_master.dtype == torch.float32
    assert not torch.equal(u.initial_master[: u.numel], u.full[: u.numel].float())  # not rounded


def test_copy_engine_lands_late_and_in_parallel():
    engine = CopyEngine(delay_s=0.05)
    try:
        dst = [torch.full((4,), float("nan")) for _ in range(3)]
        t0 = time.monotonic()
        events = [engine.submit(lambda d=d: d.fill_(1.0)) for d in dst]
        assert not any(e.query() for e in events) and all(torch.isnan(d).all() for d in dst)
        for e in events:
            e.synchronize()
        elapsed = time.monotonic() - t0
        assert all(torch.equal(d, torch.ones(4)) for d in dst)
        assert 0.045 <= elapsed < 0.14  # a latency, not three serial delays
    finally:
        engine.close()


def test_copy_engine_reports_failures_to_the_waiter():
    engine = CopyEngine()
    try:
        ev = engine.submit(lambda: (_ for _ in ()).throw(RuntimeError("boom")))
        with pytest.raises(RuntimeError, match="boom"):
            ev.synchronize()
    finally:
        engine.close()


def test_sanitizer_requires_the_wait():
    engine = CopyEngine(delay_s=0.02)
    try:
        ready = Ready(torch.zeros(2), engine.submit(lambda: None), "secondary partition of blocks.0")
        san = Sanitizer(True)
        with pytest.raises(OrderingError, match="blocks.1.*secondary partition of blocks.0"):
            san.check(ready, unit="blocks.1", op="backward all-gather")
        ready.wait()
        san.check(ready, unit="blocks.1", op="backward all-gather")
        Sanitizer(False).check(Ready(torch.zeros(1), None), unit="x", op="y")  # off: no check
    finally:
        engine.close()


def test_emulated_delay_from_env(monkeypatch):
    monkeypatch.setenv("ZEROTOPO_EMULATED_COPY_DELAY_MS", "25")
    assert emulated_delay_s(None) == 0.025
    assert emulated_delay_s(10) == 0.01
    with pytest.raises(ZerotopoError):
        emulated_delay_s(-1)


def test_parameter_names_follow_the_root_module_with_custom_units():
    model = TinyLM(layers=2)
    units = [("first", model.embed), ("body", model.blocks), ("last", model.head)]
    pairs, stray = assign_params(model, units)
    names = [n for _, _, params in pairs for n, _ in params]
    assert names == [n for n, _ in model.named_parameters()] and not stray


def test_container_units_are_rejected():
    model = TinyLM(layers=2)
    with pytest.raises(ZerotopoError, match="'body' is a ModuleList"):
        collect_units(model, [("body", model.blocks)])


def test_loss_scaler_hysteresis_window_and_floor():
    """DeepSpeed's dynamic scaling: ``hysteresis`` overflows before halving, doubling every window."""
    from zerotopo.engine.optim import LossScaler

    s = LossScaler(2.0**12, growth_interval=3, hysteresis=2, min_scale=1024.0)
    s.update(True)  # first overflow is absorbed by the hysteresis
    assert s.scale == 2.0**12
    s.update(True)
    assert s.scale == 2.0**11
    s.update(True)
    assert s.scale == 1024.0  # floor
    s.update(True)
    assert s.scale == 1024.0
    for _ in range(3):
        s.update(False)
    assert s.scale == 2048.0 and s.hysteresis_left == 2


def test_fp16_block_reaches_the_scaler():
    from zerotopo.config.neox import FP16Args
    from zerotopo.engine.optim import make_scaler

    block = FP16Args(
        enabled=True, initial_scale_power=12, loss_scale_window=500, hysteresis=3, min_loss_scale=4
    )
    s = make_scaler("dynamic", torch.float16, **block.scaler_options())
    assert (s.scale, s.growth_interval, s.hysteresis, s.min_scale) == (4096.0, 500, 3, 4.0)
