"""Memory per device against Xu et al. Tables V-VI and Lins (Chen et al.) §IV-D, worked by hand."""

from __future__ import annotations

import pytest

from zerotopo.cost.memory import GIB, activation_bytes, memory_per_device
from zerotopo.placement.layout import padded_numel
from zerotopo.placement.plan import Plan, enumerate_plans, get_preset
from zerotopo.placement.shape import ModelShape
from zerotopo.placement.topology import load_topology

PSI = 1_000_003  # a parameter count that divides by nothing useful: the exact fractions must carry it
HUGE_BLOCK = 2**40  # one scale per 2^40 values: the papers neglect the scales


def _mem(plan, topo, **kw):
    kw.setdefault("padded", False)
    return memory_per_device([PSI], topo, get_preset(plan) if isinstance(plan, str) else plan, **kw)


@pytest.mark.parametrize("nodes", [2, 4, 48])
def test_table_v_weight_shards(nodes):
    t = load_topology("frontier", nodes=nodes)
    W, P = t.world_size, 8  # N_w x P_w = W; P = GCDs per node
    # ZeRO-3: 2ψ/(N_w·P_w)
    m = _mem("zero3", t)
    assert m.params == pytest.approx(2 * PSI / W) and m.secondary == 0
    # ZeRO++: 2ψ/(N_w·P_w) + 2ψ/P (the hpZ copy in fp16 over the node)
    m = _mem("zeropp", t)
    assert m.params + m.secondary == pytest.approx(2 * PSI / W + 2 * PSI / P)
    # Ours, Sec-Degree=8: 2ψ/2 + ψ/8 (int8 secondary; scales neglected with a huge block)
    zt = Plan(
        "zt",
        params="package",
        grads="node",
        optim="world",
        secondary="node",
        secondary_dtype="int8",
        quant_block=HUGE_BLOCK,
    )
    m = _mem(zt, t)
    assert m.params + m.secondary == pytest.approx(2 * PSI / 2 + PSI / 8, rel=1e-9)
    # ... with the default 256-value blocks the scales add 4 bytes per 256 values: ψ/8 · (1 + 1/64)
    assert _mem("zerotopo", t).secondary == pytest.approx(PSI / 8 * (1 + 4 / 256))
    # Ours, Sec-Degree=2: 2ψ/2 + ψ/2
    zt2 = Plan(
        "zt2",
        params="package",
        grads="node",
        optim="world",
        secondary="package",
        secondary_dtype="int8",
        quant_block=HUGE_BLOCK,
    )
    m = _mem(zt2, t)
    assert m.params + m.secondary == pytest.approx(2 * PSI / 2 + PSI / 2, rel=1e-9)
    # "each GCD hosts 1.5ψ bytes of weight memory" (§V-A), independent of the node count
    assert m.params + m.secondary == pytest.approx(1.5 * PSI, rel=1e-9)


@pytest.mark.parametrize("nodes", [2, 48])
def test_table_vi_gradient_shards_with_fp16_gradients(nodes):
    t = load_topology("frontier", nodes=nodes)
    W = t.world_size
    for plan in ("zero3", "zeropp"):  # 2ψ/(N_g·P_g)
        assert _mem(plan, t, grad_bytes=2).grads == pytest.approx(2 * PSI / W)
    # ours: 2ψ/8 = ψ/4 "for FP16", fixed whatever the node count
    assert _mem("zerotopo", t, grad_bytes=2).grads == pytest.approx(PSI / 4)
    # the engine keeps fp32 gradient shards: twice that by default
    assert _mem("zerotopo", t).grads == pytest.approx(PSI / 2)


def test_lins_model_state_formula_for_every_nested_triple():
    # Lins (Chen et al.) §IV-D: D_modelstate = 2Φ/s_p + 2Φ/s_g + 12Φ/s_os (fp16 params and grads, Adam in fp32)
    t = load_topology("frontier", nodes=2)
    for plan in enumerate_plans(t, quantized=False, secondary=False):
        d = plan.degrees(t)
        m = _mem(plan, t, grad_bytes=2)
        expected = 2 * PSI / d.params + 2 * PSI / d.grads + 12 * PSI / d.optim
        assert m.model_states == pytest.approx(expected, rel=1e-12), plan.name


def test_padded_buffers_are_whole_bytes_and_cover_the_exact_figures():
    t = load_topology("frontier", nodes=2)
    units = [50_000, 12_345, 777]
    for name in ("zero3", "zeropp", "zerotopo", "mics", "ddp"):
        plan = get_preset(name)
        d = plan.degrees(t)
        exact = memory_per_device(units, t, plan, padded=False)
        padded = memory_per_device(units, t, plan)
        assert all(isinstance(x, int) for x in (padded.params, padded.grads, padded.optim, padded.secondary))
        assert padded.params == sum(padded_numel(n, d) // d.params * 2 for n in units)
        assert padded.optim == sum(padded_numel(n, d) // d.optim * 12 for n in units)
        assert padded.model_states >= exact.model_states


def test_buffers_prefetch_and_activations():
    t = load_topology("frontier", nodes=1)
    units = [800, 1600, 400]
    zero3 = get_preset("zero3")
    # gathered weights of the unit in use and one prefetched at 2 bytes, plus the full unit gradient as
    # autograd's .grad (2 bytes) and as the flat fp32 reduce-scatter input (4 bytes)
    assert memory_per_device(units, t, zero3).buffers == 1600 * 2 * 2 + 1600 * (2 + 4)
    deeper = Plan("z", params="world", grads="world", optim="world", prefetch=3)
    assert memory_per_device(units, t, deeper).buffers == 1600 * 4 * 2 + 1600 * (2 + 4)
    # ddp gathers nothing: only the full gradient is a temporary
    assert memory_per_device(units, t, get_preset("ddp")).buffers == 1600 * (2 + 4)
    # the step copies the gradient chunks to fp32 only where they are not already fp32 slices
    assert memory_per_device(units, t, zero3).step_buffers == 0
    half = Plan("h", params="world", grads="world", optim="world", grad_dtype="param")
    assert (
        memory_per_device(units, t, half).step_buffers
        == sum(padded_numel(n, half.degrees(t)) for n in units) // 8 * 4
    )
    shape = ModelShape(num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=128)
    # no recompute: 34·s·b·h bytes per layer at 16 bits (flash attention: no s² term), all layers kept
    full = activation_bytes(shape, 2, checkpoint_activations=False)
    assert full == 34 * 32 * 2 * 64 * 4
    # recompute: one layer's activations plus each layer's 16-bit input
    assert activation_bytes(shape, 2, checkpoint_activations=True) == 34 * 32 * 2 * 64 + 4 * 32 * 2 * 64 * 2
    m = memory_per_device(
        shape.unit_params(), t, zero3, shape=shape, micro_batch=2, checkpoint_activations=False
    )
    assert m.activations == full and m.total == pytest.approx(m.model_states + m.buffers + full)
    assert m.total == m.model_states + max(m.buffers + m.activations, m.step_buffers)


def test_which_plans_fit_neox_20b_on_48_frontier_nodes():
    # GPT-NeoX-20B: 44 layers x 6144, vocabulary 50432, micro-batch 4, activation checkpointing (as its
    # config); 384 GCDs of 64 GiB.
    shape = ModelShape(
        num_layers=44, hidden_size=6144, num_attention_heads=64, seq_length=2048, vocab_size=50432
    )
    t = load_topology("frontier", nodes=48)
    psi = shape.param_count()
    assert psi == pytest.approx(20.55e9, rel=1e-3)
    total = {
        name: memory_per_device(shape.unit_params(), t, get_preset(name), shape=shape, micro_batch=4).total
        / GIB
        for name in ("ddp", "zero1", "zero2", "zero3", "zeropp", "mics", "zerotopo", "zerotopo-pkg")
    }
    limit = t.device.memory_gib
    # ddp: 18 bytes per parameter (2 + 4 + 12) = 344 GiB; zero1: 2 + 4 bytes per parameter = 115 GiB
    assert total["ddp"] > 5 * limit and total["zero1"] > limit
    # zero2 keeps the fp16 weights whole: 2ψ = 38.3 GiB, which still fits a 64 GiB GCD at micro-batch 4
    assert 2 * psi / GIB == pytest.approx(38.28, abs=0.01) and total["zero2"] < limit
    for name in ("zero3", "zeropp", "mics", "zerotopo", "zerotopo-pkg"):
        assert total[name] < limit, name
    # zerotopo: 2ψ/2 + ψ/8·(1+1/64) + 4ψ/8 + 12ψ/384 ≈ 19.1 + 2.4 + 9.6 + 0.6 GiB of model states
    zt = memory_per_device(shape.unit_params(), t, get_preset("zerotopo"))
    assert zt.model_states / GIB == pytest.approx(
        (psi + psi / 8 * (1 + 1 / 64) + psi / 2 + psi / 32) / GIB, rel=1e-4
    )
    # at micro-batch 16 without recompute the activations (34·s·b·h·L bytes = 263 GiB) fit nowhere
    big = memory_per_device(
        shape.unit_params(), t, get_preset("zero3"), shape=shape, micro_batch=16, checkpoint_activations=False
    )
    assert big.total / GIB > limit
