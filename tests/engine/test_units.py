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
from zerotopo.placement.plan import Degrees


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
    delay = 0.4  # long against a busy machine's scheduling noise: three serial delays would be 1.2 s
    engine = CopyEngine(delay_s=delay)
    try:
        dst = [torch.full((4,), float("nan")) for _ in range(3)]
        t0 = time.monotonic()
        events = [engine.submit(lambda d=d: d.fill_(1.0)) for d in dst]
        assert not any(e.query() for e in events) and all(torch.isnan(d).all() for d in dst)
        for e in events:
            e.synchronize()
        elapsed = time.monotonic() - t0
        assert all(torch.equal(d, torch.ones(4)) for d in dst)
        assert 0.9 * delay <= elapsed < 3 * delay  # one latency, not three serial delays
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


def _bare_adamw(n: int, seed: int, frozen: bool = False):
    """A ShardedAdamW holding one unit's optimizer state, without a mesh (the update rules only)."""
    from zerotopo.engine.optim import ShardedAdamW

    g = torch.Generator().manual_seed(seed)
    opt = object.__new__(ShardedAdamW)
    opt.master = [torch.randn(n, generator=g)]
    opt.exp_avg = [torch.randn(n, generator=g) * 0.1]
    opt.exp_avg_sq = [torch.rand(n, generator=g) * 0.01]
    opt.decay_runs = [[(k + 1, min(k + 3, n)) for k in range(0, n, 3) if k + 1 < n]]  # i % 3 != 0 decays
    train = torch.ones(n, dtype=torch.bool)
    if frozen:
        train[: n // 4] = False
    opt.trainable = [train]
    opt.all_trainable = [bool(train.all())]
    opt._host_steps = 0
    opt._device_steps = torch.zeros((), dtype=torch.float64)
    return opt


@pytest.mark.parametrize("frozen", [False, True])
def test_device_masked_adamw_matches_host_and_skips_exactly(frozen):
    """The fp16 step's update (step count on the device, every change times ``keep``) equals the host
    update bit for bit when applied, and leaves every state tensor bit for bit unchanged when skipped."""
    group = {"lr": 3e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
    host, dev = _bare_adamw(257, 0, frozen), _bare_adamw(257, 0, frozen)
    for step in range(1, 4):
        grad = torch.randn(257, generator=torch.Generator().manual_seed(step))
        host._host_steps += 1
        host._adamw(0, grad.clone(), group)
        dev._device_steps += 1
        dev._adamw_masked(0, grad.clone(), group, torch.ones(()))
        for a, b in zip(
            (host.master, host.exp_avg, host.exp_avg_sq), (dev.master, dev.exp_avg, dev.exp_avg_sq)
        ):
            assert torch.equal(a[0], b[0]), step
    before = [t[0].clone() for t in (dev.master, dev.exp_avg, dev.exp_avg_sq)]
    dev._adamw_masked(0, torch.zeros(257), group, torch.zeros(()))  # an overflow: grads zeroed, keep 0
    after = [t[0] for t in (dev.master, dev.exp_avg, dev.exp_avg_sq)]
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_loss_scaler_update_takes_a_device_flag():
    """The update reads the flag only as a tensor: the same sequence through tensors and bools."""
    from zerotopo.engine.optim import LossScaler

    a = LossScaler(2.0**8, growth_interval=2, hysteresis=2, min_scale=64.0)
    b = LossScaler(2.0**8, growth_interval=2, hysteresis=2, min_scale=64.0)
    for flag in (True, False, True, True, True, True, False, False, False, False):
        a.update(flag)
        b.update(torch.tensor([1.0 if flag else 0.0]))
        assert a.state_dict() == b.state_dict()
    assert isinstance(b.scale, torch.Tensor) and b.scale.dim() == 0
    sd = b.state_dict()
    c = LossScaler(2.0**8, growth_interval=2, hysteresis=2, min_scale=64.0)
    c.load_state_dict(sd)
    assert c.state_dict() == sd == {"scale": 256.0, "good_steps": 4, "hysteresis_left": 2}


def test_gathered_chunks_are_put_in_place_without_a_second_buffer():
    """The post-step all-gather lands in the parameter shard in group-position order; every permutation
    of the chunks is then applied in place (what a staging copy would have given)."""
    import itertools

    import torch

    from zerotopo.engine.optim import _permute_chunks

    n = 3
    for k in (1, 2, 3, 4):
        for order in itertools.permutations(range(k)):
            old = torch.arange(k * n, dtype=torch.float32)
            buf = old.clone()
            _permute_chunks(buf, list(order), n)
            want = torch.empty_like(old)
            for pos, sub in enumerate(order):
                want[sub * n : (sub + 1) * n] = old[pos * n : (pos + 1) * n]
            assert torch.equal(buf, want), order
