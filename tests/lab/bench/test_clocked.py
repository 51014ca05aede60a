"""``--regime device-clock``'s derivation with a stand-in arithmetic rate (no ranks): D, the links,
the curve replay at the emulated node count, and the machine the predictions are priced on."""

from __future__ import annotations

from dataclasses import replace

import pytest

from zerotopo.cost.planner import CostOptions, estimate
from zerotopo.placement.plan import get_preset
from zerotopo.placement.topology import load_topology
from zerotopo_lab.bench import clock as C
from zerotopo_lab.bench.clocked import cost_topology, derive
from zerotopo_lab.bench.compare import CompareOptions, model_config
from zerotopo_lab.bench.regime import FASTEST_MBIT
from zerotopo_lab.bench.replay import schedule_wait


def _derive(nodes: int = 4, curves: str | None = None, flops: float = 2e9, target_buckets: bool = False):
    opts = CompareOptions(regime="device-clock", model="wide", batch=1, seq=64, micro_batches=2, vocab=512,
                          nodes=nodes, curves=curves, target_buckets=target_buckets)  # fmt: skip
    topo = load_topology(opts.topology, nodes=nodes)
    cfg, seq = model_config(opts)
    return derive(opts, topo, cfg, seq, lambda *a: flops), topo, cfg, seq


def test_d_makes_the_arithmetic_a_tenth_of_the_waited_time():
    (opts, s), topo, cfg, seq = _derive(flops=2e9)
    assert s.arithmetic_s == pytest.approx(cfg.shape(seq).step_flops(2) / 2e9)
    assert C.arithmetic_fraction(s.arithmetic_s, s.clock.dilation * s.device_s) == pytest.approx(0.1)
    assert s.clock.step_wait(cfg.num_layers, 2) == pytest.approx(s.clock.dilation * s.device_s)
    (_, slower), *_ = _derive(flops=1e9)  # half the rate: twice the dilation
    assert slower.clock.dilation == pytest.approx(2 * s.clock.dilation)
    assert s.to_dict()["workload"].startswith("2 micro-batches x 4 sequences per rank on 16 ranks (4 nodes)")


def test_the_share_halves_beyond_16_ranks_falls_beyond_64_and_the_option_sets_it():
    shares = [C.arithmetic_share(n) for n in (1, 8, 16, 17, 32, 64, 128, 256)]
    assert shares == pytest.approx([0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.0125])
    with pytest.raises(ValueError, match="at least one rank"):
        C.arithmetic_share(0)

    def fraction(s):
        return C.arithmetic_fraction(s.arithmetic_s, s.clock.dilation * s.device_s)

    (_, s16), *_ = _derive(nodes=16)  # 64 ranks: half the share, so twice the D of the same arithmetic
    assert (s16.share, fraction(s16)) == pytest.approx((0.05, 0.05))
    assert s16.to_dict()["arithmetic_share"] == pytest.approx(0.05)
    opts = CompareOptions(regime="device-clock", model="wide", batch=1, seq=64, micro_batches=2, vocab=512,
                          nodes=16, arithmetic_share=0.1)  # fmt: skip
    topo = load_topology(opts.topology, nodes=16)
    cfg, seq = model_config(opts)
    _, given = derive(opts, topo, cfg, seq, lambda *a: 2e9)
    assert fraction(given) == pytest.approx(0.1)
    assert s16.clock.dilation == pytest.approx(2 * given.clock.dilation)


def test_a_given_dilation_stands_whatever_the_arithmetic_rate():
    def given(flops, D):
        opts = CompareOptions(regime="device-clock", model="wide", batch=1, seq=64, micro_batches=2, vocab=512,
                              nodes=4, dilation=D)  # fmt: skip
        topo = load_topology(opts.topology, nodes=4)
        cfg, seq = model_config(opts)
        return derive(opts, topo, cfg, seq, lambda *a: flops)

    (fast_opts, fast), (_, slow) = given(4e9, 7.25), given(1e9, 7.25)
    # the rate moves the arithmetic's share, not D, the waits or the links: two runs are one quantity
    assert fast.clock.dilation == slow.clock.dilation == 7.25
    assert fast.rates_mbit == slow.rates_mbit and fast.delays_ms == slow.delays_ms
    assert fast_opts.device_clock.dilation == 7.25
    assert slow.arithmetic_s == pytest.approx(4 * fast.arithmetic_s)
    d = slow.to_dict()
    assert d["dilation_given"] is True and d["arithmetic_share"] is None
    assert d["predicted_arithmetic_fraction"] == pytest.approx(
        C.arithmetic_fraction(slow.arithmetic_s, 7.25 * slow.device_s)
    )
    (_, planned), *_ = _derive()
    assert planned.to_dict()["dilation_given"] is False


def test_the_links_run_at_the_targets_rate_times_k_over_d():
    (opts, s), topo, *_ = _derive()
    k, D = s.clock.scale, s.clock.dilation
    assert opts.network_mbit == pytest.approx(12.5 * 8000 * k / D)
    assert opts.rates["package"] == pytest.approx(200 * 8000 * k / D)
    assert opts.delays_ms["network"] == pytest.approx(10.0 * D / 1000)
    assert opts.node_uplink and opts.device_clock is s.clock and opts.replay is None


def test_the_curves_replay_at_the_emulated_count_on_fast_links():
    (opts, s), topo, cfg, seq = _derive(nodes=8, curves="frontier-48")
    assert opts.replay.nodes == 8 and opts.replay.scale == pytest.approx(s.clock.dilation)
    assert opts.network_mbit == FASTEST_MBIT and opts.rates == {} and opts.delays_ms == {}
    machine = cost_topology(s, cfg, seq, 1, 2, False, fast_links=True)
    shape = cfg.shape(seq)
    est = estimate(
        get_preset("zero3"),
        shape,
        machine,
        CostOptions(micro_batch=1, grad_accum=2, efficiency=1.0, checkpoint_activations=False),
    )
    at8 = schedule_wait(est.schedule, opts.replay)
    at48 = schedule_wait(est.schedule, replace(opts.replay, nodes=None))
    assert at8 > 0 and at8 != at48  # read at 8 nodes' span, not the curves' 48


def test_the_predictions_take_the_clocks_compute_time():
    (opts, s), topo, cfg, seq = _derive()
    machine = cost_topology(s, cfg, seq, 1, 2, False)
    est = estimate(
        get_preset("zero3"),
        cfg.shape(seq),
        machine,
        CostOptions(micro_batch=1, grad_accum=2, efficiency=1.0, checkpoint_activations=False),
    )
    assert est.time.compute_s == pytest.approx(s.clock.step_wait(cfg.num_layers, 2), rel=1e-6)


def test_deepspeeds_buckets_scale_by_k_only_when_asked():
    from zerotopo_lab.bench.compare import framework_cost
    from zerotopo_lab.bench.regime import DEEPSPEED_BUCKETS

    (default, _), *_ = _derive()
    assert default.deepspeed_buckets is None  # DeepSpeed's own defaults, persistence 0
    (opts, s), topo, cfg, seq = _derive(target_buckets=True)
    k = s.clock.scale
    assert opts.deepspeed_buckets == {n: max(1, round(v * k)) for n, v in DEEPSPEED_BUCKETS.items()}
    # a bench layer is the same part of the prefetch bucket as a NeoX-20B layer of DeepSpeed's default
    layer = cfg.shape(seq).layer_params()
    assert layer / opts.deepspeed_buckets["prefetch"] == pytest.approx(
        layer / k / DEEPSPEED_BUCKETS["prefetch"], rel=1e-3
    )
    # and the prediction prices DeepSpeed's schedule with them: more, smaller gathers than the defaults'
    machine = cost_topology(s, cfg, seq, 1, 2, False)
    cost = CostOptions(micro_batch=1, grad_accum=2, efficiency=1.0, checkpoint_activations=False)

    def gathers(buckets):
        plan, sched = framework_cost("deepspeed-zero3", buckets, gloo_reduce=True)
        assert sched.prefetch_bucket_elems == (buckets or {}).get("prefetch", sched.prefetch_bucket_elems)
        est = estimate(plan, cfg.shape(seq), machine, cost, schedule=sched)
        return sum(c.count for c in est.schedule.collectives() if c.op.startswith("all_gather"))

    assert gathers(opts.deepspeed_buckets) > gathers(None)


def _args(*argv: str):
    import argparse

    from zerotopo_lab.bench.compare import add_arguments, options_from_args

    p = argparse.ArgumentParser()
    add_arguments(p)
    return options_from_args(p.parse_args(list(argv)))


def test_the_command_line_of_the_clock():
    from zerotopo.errors import ConfigError

    opts = _args("--regime", "device-clock", "--nodes", "4")
    assert (opts.regime, opts.nodes, opts.batch, opts.seq, opts.micro_batches, opts.model) == (
        "device-clock", 4, 1, 64, 1, "wide")  # fmt: skip
    assert _args("--regime", "device-clock", "--micro-batches", "3", "--batch", "2").micro_batches == 3
    with pytest.raises(ConfigError, match="--network-mbit"):
        _args("--regime", "device-clock", "--network-mbit", "5")
    with pytest.raises(ConfigError, match="--shape"):
        _args("--regime", "device-clock", "--shape", "node=5")
    with pytest.raises(ConfigError, match="--nodes"):
        _args("--regime", "device-clock", "--nodes", "65")
    assert _args("--regime", "comm-bound").seq is None  # the other regimes keep the model's
    assert _args("--regime", "device-clock").arithmetic_share is None  # the ranks' default
    assert _args("--regime", "device-clock", "--arithmetic-share", "0.02").arithmetic_share == 0.02
    for bad in ("0", "1.5"):
        with pytest.raises(ConfigError, match=r"--arithmetic-share.*\(0, 1\]"):
            _args("--regime", "device-clock", "--arithmetic-share", bad)
    with pytest.raises(ConfigError, match="only --regime device-clock"):
        _args("--regime", "comm-bound", "--arithmetic-share", "0.05")
    assert _args("--regime", "device-clock", "--dilation", "12.5").dilation == 12.5
    assert _args("--regime", "device-clock").dilation is None  # planned
    with pytest.raises(ConfigError, match="--dilation.*only --regime device-clock runs on a dilated clock"):
        _args("--regime", "frontier-20b", "--dilation", "12.5")
    with pytest.raises(ConfigError, match="--dilation.*at least 1, got nan"):
        _args("--regime", "device-clock", "--dilation", "nan")
    assert not _args("--regime", "device-clock").target_buckets
    assert _args("--regime", "device-clock", "--deepspeed-buckets", "target").target_buckets
    with pytest.raises(ConfigError, match="--deepspeed-buckets.*layer ratio"):
        _args("--regime", "frontier-20b", "--deepspeed-buckets", "target")


def test_the_planned_rate_reads_processor_time_not_the_wait_for_a_core():
    from zerotopo_lab.bench.clocked import planned_rate

    # 8 ranks on 2 cores: a step of 0.5 processor seconds is 2 s of a quiet machine's wall time per rank
    runs = [{"cpu_s": [0.6, 0.5, 0.7], "step_times_s": [9.0, 8.0, 30.0]} for _ in range(8)]
    assert planned_rate(runs, 1e9, cores=2) == pytest.approx(1e9 / 2.0)
    # the wall time a loaded machine stretches does not move it; a faster rank's best step does not either
    runs[0] = {"cpu_s": [0.1], "step_times_s": [90.0]}
    assert planned_rate(runs, 1e9, cores=2) == pytest.approx(1e9 / 2.0)
    assert planned_rate(runs[:1], 1e9, cores=2) == pytest.approx(1e9 / 0.1)  # fewer ranks than cores
    with pytest.raises(ValueError, match="no processor time"):
        planned_rate([{"step_times_s": [1.0]}], 1e9, cores=2)
