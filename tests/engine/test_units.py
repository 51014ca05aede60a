"""Single-process pieces of the engine: unit discovery, tied weights, flat buffers, the emulated copy
engine and the sanitizer."""

from __future__ import annotations

import time

import pytest
import torch

from tests.engine.cases import TinyLM
from tests.engine.shard_steps import grads, one_unit, step_both
from zerotopo.engine.streams import CopyEngine, OrderingError, Ready, Sanitizer, emulated_delay_s
from zerotopo.engine.units import FlatUnit, UnitState, assign_params, collect_units, unit_borrows
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


def test_tied_weights_belong_to_the_first_unit_and_are_borrowed_by_the_other():
    cfg = NeoXConfig(vocab_size=32, hidden_size=16, num_layers=1, num_attention_heads=2, tie_embeddings=True)
    model = GPTNeoX(cfg)
    pairs, stray = assign_params(model, collect_units(model, None))
    owned = {u: [n for n, _ in params] for u, _, params in pairs}
    assert owned["embed_in"] == ["embed_in.weight"] and not stray
    assert owned["head"] == ["head.final_layer_norm.weight", "head.final_layer_norm.bias"]
    assert unit_borrows(pairs) == {"head": ["embed_in"]}


def test_a_unit_that_only_reuses_tied_weights_is_refused_naming_both():
    model = TinyLM(layers=1)
    model.head = torch.nn.Linear(12, 37, bias=False)
    model.head.weight = model.embed.weight
    pairs, _ = assign_params(model, collect_units(model, None))
    with pytest.raises(ZerotopoError, match=r"unit 'head' has no parameters of its own.*embed"):
        unit_borrows(pairs)


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
    from zerotopo.config.tree import FP16Config
    from zerotopo.engine.optim import make_scaler

    block = FP16Config(
        enabled=True, initial_scale_power=12, loss_scale_window=500, hysteresis=3, min_loss_scale=4
    )
    s = make_scaler("dynamic", torch.float16, **block.scaler_options())
    assert (s.scale, s.growth_interval, s.hysteresis, s.min_scale) == (4096.0, 500, 3, 4.0)


def _bare_adamw(fused: bool, frozen: bool):
    """A ShardedOptimizer running AdamW over one unit's optimizer chunk (world 1), without a mesh: the
    update rules only. Returns it and the unit's module (a Linear, decayed, and a LayerNorm, not decayed)."""
    from zerotopo.engine.optim import ShardedOptimizer

    u, mod = one_unit(frozen)
    opt = object.__new__(ShardedOptimizer)
    opt.param_groups = [{"lr": 3e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1, "params": []}]
    opt.master = [u.initial_master]
    opt.states = {n: [torch.zeros_like(u.initial_master)] for n in ("exp_avg", "exp_avg_sq")}
    opt.frozen_runs = [u.runs(lambda s: not s.trainable)]
    opt.fused = fused
    opt._host_steps = 0
    opt.pieces = [[]]
    opt.optims = [opt._torch_optimizer(0, u)]
    return opt, u, mod


@pytest.mark.parametrize("frozen", [False, True])
@pytest.mark.parametrize("fused", [False, True])
def test_shard_update_is_torch_adamw_with_decay_groups_and_frozen_parameters(fused, frozen):
    """The update on the flat master chunk equals torch's AdamW on the module's own parameters (decay
    for matrices, none for biases and norms); a frozen parameter never moves and keeps no moments."""
    opt, u, mod = _bare_adamw(fused, frozen)
    ref_params = [p.detach().clone() for p in mod.parameters()]
    trainable = [p.requires_grad for p in mod.parameters()]
    decay = [r for r, t, p in zip(ref_params, trainable, mod.parameters()) if t and p.ndim >= 2]
    no_decay = [r for r, t, p in zip(ref_params, trainable, mod.parameters()) if t and p.ndim < 2]
    ref = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=3e-3, betas=(0.9, 0.95), eps=1e-8, foreach=False,
    )  # fmt: skip
    step_both(opt, u, ref, ref_params, range(1, 4))
    for s, r, t, p in zip(u.slots, ref_params, trainable, mod.parameters()):
        got = opt.master[0][s.offset : s.offset + s.numel].view(s.shape)
        if t:
            torch.testing.assert_close(got, r, rtol=1e-6, atol=1e-7)
        else:
            assert torch.equal(got, p.detach())
            assert not opt.exp_avg[0][s.offset : s.offset + s.numel].any()
    assert not opt.master[0][u.numel :].any()  # the padding stays zero


def test_fused_update_skips_on_found_inf_bit_for_bit():
    """The fp16 step on a device passes the overflow flag to torch's fused AdamW as ``found_inf``: a
    flagged step leaves master, moments and torch's step count bit for bit unchanged; an unflagged one
    is the foreach update."""
    fused, _, _ = _bare_adamw(True, True)
    plain, u, _ = _bare_adamw(False, True)
    for step in range(1, 3):
        for o in (fused, plain):
            o._host_steps += 1
            o._apply(0, grads(u, step), torch.zeros(()) if o is fused else None)
    for a, b in zip(
        (fused.master, fused.exp_avg, fused.exp_avg_sq), (plain.master, plain.exp_avg, plain.exp_avg_sq)
    ):
        torch.testing.assert_close(a[0], b[0], rtol=1e-6, atol=1e-7)
    state = [t[0].clone() for t in (fused.master, fused.exp_avg, fused.exp_avg_sq)]
    steps = [st["step"].clone() for st in fused.optims[0].state.values()]
    fused._apply(0, torch.zeros(u.padded), torch.ones(()))  # an overflow: grads zeroed, flag set
    assert all(torch.equal(a, t[0]) for a, t in zip(state, (fused.master, fused.exp_avg, fused.exp_avg_sq)))
    assert [st["step"] for st in fused.optims[0].state.values()] == steps == [torch.tensor(2.0)] * len(steps)


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


def test_parallelize_refuses_bad_dtypes_and_a_second_wrap_before_building_anything():
    from types import SimpleNamespace

    from zerotopo.engine import MixedPrecision, parallelize
    from zerotopo.errors import ZerotopoError

    mesh = SimpleNamespace(plan=SimpleNamespace(grad_dtype=None))  # nothing past the checks is reached
    module = torch.nn.Linear(4, 4)
    with pytest.raises(ZerotopoError, match="param_dtype and reduce_dtype must be"):
        parallelize(module, mesh=mesh, mp_policy=MixedPrecision(param_dtype=torch.float64))
    module._zerotopo = SimpleNamespace()  # what parallelize attaches
    with pytest.raises(ZerotopoError, match="already parallelized"):
        parallelize(module, mesh=mesh)
