"""The frontier-20b regime: derived settings hit the target R by the cost model, the memory cap decides
which rows run, DeepSpeed's buckets scale with the layer, the curve replay's waits."""

from __future__ import annotations

import pytest

from zerotopo.placement.topology import load_topology
from zerotopo_lab.bench import regime as R
from zerotopo_lab.bench.compare import MODELS, CompareOptions, model_config, resolve_rows
from zerotopo_lab.bench.replay import Replay, install, replay_wait, target_group


def _wide():
    return model_config(CompareOptions(model="wide"))


@pytest.mark.parametrize("target_R, flops", [(0.1, 2e9), (0.1, 8e9), (1.1, 2e9), (0.3, 5e8)])
def test_derived_link_rate_gives_the_target_R_by_the_cost_model(target_R, flops):
    cfg, seq = _wide()
    topo = load_topology("emulated-frontier")
    reg = R.derive(target_R, flops, cfg, seq, topo, lambda ckpt: (1e12, 1e9))
    assert reg.tokens_per_micro_batch >= R.MIN_TOKENS and not reg.checkpoint_activations
    # an independent evaluation of the chosen settings: R within 1.5x of the target
    emulated = R.emulated_topology(topo, reg.network_mbit, flops)
    got = R.emulated_R(cfg.shape(seq), emulated, reg.batch, reg.micro_batches, False)
    assert target_R / 1.5 < got < target_R * 1.5
    # a faster machine needs a faster link for the same R
    faster = R.derive(target_R, 2 * flops, cfg, seq, topo, lambda ckpt: (1e12, 1e9))
    assert faster.network_mbit > reg.network_mbit


def test_checkpointing_is_chosen_only_when_zero3_would_not_fit_the_cap():
    cfg, seq = _wide()
    topo = load_topology("emulated-frontier")
    seen = []

    def tight(checkpoint: bool) -> tuple[float, float]:
        seen.append(checkpoint)
        return 1e6, (5e5 if checkpoint else 2e6)  # without checkpointing zero3 needs more than the cap

    assert R.derive(0.1, 2e9, cfg, seq, topo, tight).checkpoint_activations and seen == [False, True]
    assert not R.derive(0.1, 2e9, cfg, seq, topo, lambda c: (1e6, 5e5)).checkpoint_activations


def test_link_rate_search_stays_in_range_when_the_target_is_out_of_reach():
    assert R.link_rate_for(10.0, lambda mbit: 1.0 / mbit) == (1.0, 1.0)
    mbit, got = R.link_rate_for(1e-9, lambda mbit: 1.0 / mbit + 0.5)  # latency bound: 0.5 at best
    assert mbit == 1e5 and got == pytest.approx(0.5, abs=1e-4)
    mbit, got = R.link_rate_for(0.01, lambda mbit: 1.0 / mbit)
    assert mbit == pytest.approx(100, rel=1e-3)


def test_memory_cap_is_proportional_to_a_gcd_and_decides_which_rows_run():
    assert R.memory_cap(1.0, 2.0) == R.GCD_MEMORY_BYTES / 2
    assert R.fits(10.0, 10.0) and not R.fits(10.5, 10.0) and R.fits(None, 1.0) and R.fits(1e12, None)
    cfg, seq = model_config(CompareOptions(model="tiny"))
    shape = cfg.shape(seq)
    topo = load_topology("emulated-frontier")
    rows = ("no-comm", "zero3", "zero1", "planner")
    base = CompareOptions(model="tiny", rows=rows)
    _, free = resolve_rows(base, topo, shape)
    zero1, zero3 = free["zero1"]["predicted_memory_bytes"], free["zero3"]["predicted_memory_bytes"]
    assert zero3 < zero1
    cap = (zero1 + zero3) / 2  # zero3 fits, zero1 (whole parameters on every rank) does not
    specs, meta = resolve_rows(CompareOptions(model="tiny", rows=rows, memory_cap_bytes=cap), topo, shape)
    names = [n for n, _ in specs]
    assert "zero3" in names and "zero1" not in names and meta["zero1"]["does_not_fit"]
    assert "no-comm" in names  # the compute floor is not a plan: it always runs
    assert meta["planner"]["predicted_memory_bytes"] <= cap  # the planner chooses under the cap


def test_deepspeed_buckets_scale_by_the_layer_ratio_to_neox_20b():
    cfg, seq = _wide()
    ratio = R.layer_ratio(cfg.shape(seq))
    h = MODELS["wide"]["hidden"]
    assert ratio == pytest.approx(12 * h * h / (12 * 6144 * 6144), rel=0.05)
    b = R.deepspeed_buckets(ratio)
    assert b["prefetch"] == round(5e7 * ratio) and b["reduce"] == round(5e8 * ratio)
    assert b["persistence"] == round(1e5 * ratio)
    # a bench layer is to the scaled prefetch bucket what a NeoX-20B layer is to the default one
    layer = cfg.shape(seq).layer_params()
    assert layer / b["prefetch"] == pytest.approx(12 * 6144 * 6144 / 5e7, rel=0.05)


def test_replay_maps_bench_groups_to_frontier_groups():
    assert target_group(list(range(8)), 4, 48, 8) == ("network", 48, 8)
    assert target_group([0, 4], 4, 48, 8) == ("network", 48, 2)
    assert target_group([0, 1, 2, 3], 4, 48, 8) == ("node", 1, 8)
    assert target_group([2, 3], 4, 48, 8) == ("package", 1, 4)


def test_replay_wait_is_the_curves_time_for_the_scaled_message():
    from zerotopo.cost.bandwidth import default_table

    table = default_table("frontier")
    r = Replay("frontier-48", layer_ratio=0.01, scale=0.5, bench_per_node=4)
    size = 4e6  # bench bytes -> 400 MB at the target
    busbw = table.busbw("all_gather", size / 0.01, "network", 48, 8)
    n = 48 * 8
    want = (n - 1) / n * (size / 0.01) / (busbw * 1e9) * 0.5
    assert replay_wait(table, "all_gather", size, "network", 48, 8, r) == pytest.approx(want)
    # all-reduce moves twice a reduce-scatter's bytes; no curve (package tier): no wait
    rs = replay_wait(table, "reduce_scatter", size, "network", 48, 8, r)
    assert replay_wait(table, "all_reduce", size, "network", 48, 8, r) == pytest.approx(2 * rs)
    assert replay_wait(table, "all_gather", size, "package", 1, 2, r) == 0.0
    # the slow band: per byte, a mid-size message waits longer than a large one
    mid = replay_wait(table, "all_gather", 64e6 * 0.01, "network", 48, 8, r) / 64e6
    big = replay_wait(table, "all_gather", 1e9 * 0.01, "network", 48, 8, r) / 1e9
    assert mid > big


def _args(*argv: str):
    import argparse

    from zerotopo_lab.bench.compare import DEFAULT_REPEAT, add_arguments, options_from_args

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(list(argv))
    return args, options_from_args(args), DEFAULT_REPEAT


def test_the_cli_defaults_to_frontier_20b_and_keeps_comm_bound_by_name():
    from zerotopo.errors import ConfigError

    args, opts, default_repeat = _args()
    assert opts.regime == "frontier-20b" and opts.model == "wide" and opts.curves is None
    assert args.repeat == default_repeat == 3
    _, old, _ = _args("--regime", "comm-bound")
    assert (old.model, old.batch, old.micro_batches, old.network_mbit) == ("small", 2, 4, 50.0)
    assert not old.node_uplink and old.memory_cap_bytes is None and old.deepspeed_buckets is None
    _, curves, _ = _args("--curves", "frontier-48")
    assert curves.curves == "frontier-48"
    # what the regime derives cannot also be given
    with pytest.raises(ConfigError, match="--regime comm-bound"):
        _args("--batch", "4")


def test_frontier_20b_puts_bf16_on_the_wire_and_comm_bound_keeps_fp32():
    _, derived, _ = _args()
    _, old, _ = _args("--regime", "comm-bound")
    _, chosen, _ = _args("--dtype", "fp32")
    assert (derived.dtype, old.dtype, chosen.dtype) == ("bf16", "fp32", "fp32")


def _replay_rank(rank: int, world: int) -> dict:
    """On 4 ranks (2 emulated nodes): one DeepSpeed-style torch.distributed all-gather and one engine
    all-gather (issued through torch.distributed inside the engine's collective) under the replay."""
    import types

    import torch
    import torch.distributed as dist

    from zerotopo.comm import collectives

    r = Replay("frontier-48", layer_ratio=1e-4, scale=1e-3, bench_per_node=2)
    waited = install(r)
    inp = torch.ones(1000)
    out = torch.empty(world * 1000)
    dist.all_gather_into_tensor(out, inp)
    after_plain = dict(waited)

    def issue():
        return dist.all_gather_into_tensor(out, inp, async_op=True), []

    group = types.SimpleNamespace(pg=None)
    collectives.run_collective("all_gather", group, out, numel=out.numel(), nbytes=0, dtype=out.dtype,
                               ledger=None, tag="", async_op=False, stream=None, issue=issue)  # fmt: skip
    collectives.observe_collectives(None)
    return {"plain": after_plain, "both": dict(waited)}


@pytest.mark.slow
def test_replay_waits_once_for_every_framework_and_the_engine():
    """Every torch.distributed collective waits its curve time, and an engine collective waits once
    (observed by the engine, not again by the wrapped torch.distributed call it makes)."""
    from zerotopo.cost.bandwidth import default_table
    from zerotopo.launch.spawn import spawn

    results = spawn(_replay_rank, 4, ranks_per_node=2, timeout_s=120)
    r = Replay("frontier-48", layer_ratio=1e-4, scale=1e-3, bench_per_node=2)
    # 4,000 fp32 values count as bf16 ones; the group spans both nodes: the target's 48 x 8
    want = replay_wait(default_table("frontier"), "all_gather", 4000 * 2, "network", 48, 8, r)
    assert want > 0
    for res in results:
        assert res["plain"]["all_gather"] == pytest.approx(want)
        assert res["both"]["all_gather"] == pytest.approx(2 * want)


@pytest.mark.parametrize("transport, curve, want", [(0.2, 0.4, 0.4), (0.4, 0.2, 0.4), (0.0, 0.3, 0.3)])
def test_a_replayed_call_takes_its_curve_time_with_the_transport_inside(transport, curve, want):
    """A call paced from its issue takes the longer of its curve's time and its own transport, not
    their sum (the curve's time is the whole collective's at scale)."""
    import time

    from zerotopo_lab.bench.replay import pace

    start = time.perf_counter()
    time.sleep(transport)  # the real message crossing the links
    pace(curve, start)
    took = time.perf_counter() - start
    assert want <= took < want + 0.12  # the sum would be 0.2 s longer (0.3 s: no transport to hide)


def test_the_engine_observers_follow_up_runs_once_the_collective_is_issued():
    """An observer's returned callable runs on the issuing thread after the issue and before
    ``run_collective`` returns, with the transport of an asynchronous collective in flight."""
    import types

    import torch

    from zerotopo.comm import collectives

    events: list[str] = []

    def observer(op, pg, numel, itemsize):
        events.append(f"observe {op} {numel}x{itemsize}")
        return lambda: events.append("issued")

    def issue():
        events.append("issue")
        return None, [lambda: events.append("finish")]

    out = torch.zeros(8)
    previous = collectives.observe_collectives(observer)
    try:
        pending = collectives.run_collective("all_gather", types.SimpleNamespace(pg=None), out, numel=8, nbytes=0,
                                             dtype=out.dtype, issue=issue, async_op=True)  # fmt: skip
        assert events == ["observe all_gather 8x4", "issue", "issued"]
        pending.wait()
        assert events[-1] == "finish"
        collectives.observe_collectives(lambda *a: None)  # an observer that returns nothing still works
        collectives.run_collective("all_gather", types.SimpleNamespace(pg=None), out, numel=8, nbytes=0,
                                   dtype=out.dtype, issue=issue)  # fmt: skip
        assert events[-2:] == ["issue", "finish"]
    finally:
        collectives.observe_collectives(previous)


def test_schedule_wait_prices_each_call_as_the_ranks_wait():
    """The prediction's replay term: every collective of a step schedule at the curve's time, counted
    as often as it runs, fp32 messages as bf16."""
    from zerotopo.cost.bandwidth import default_table
    from zerotopo.placement.schedule import Collective
    from zerotopo_lab.bench.replay import schedule_wait

    c = Collective("forward", "all_gather", "params", 8, "network", 0, 3, "fp32", message_bytes=8_000_000,
                   nodes=2, ranks_per_node=4)  # fmt: skip
    sched = types_schedule([c])
    r = Replay("frontier-48", layer_ratio=0.01, scale=0.5, bench_per_node=4)
    one = replay_wait(default_table("frontier"), "all_gather", 4_000_000, "network", 48, 8, r)
    assert one > 0 and schedule_wait(sched, r) == pytest.approx(3 * one)


def types_schedule(colls):
    import types

    return types.SimpleNamespace(collectives=lambda: colls)


def test_the_bench_embedding_is_to_its_layer_as_the_targets_is():
    cfg, seq = _wide()
    layer = cfg.shape(seq).layer_params()
    vocab = R.derived_vocab(layer, cfg.hidden_size)
    assert vocab % 128 == 0
    # NeoX-20B: a 50,432 x 6,144 embedding beside 453M-parameter layers
    assert vocab * cfg.hidden_size / layer == pytest.approx(0.68, abs=128 * cfg.hidden_size / layer)


def test_under_curves_the_links_run_fastest_and_the_replay_is_scaled_to_the_target_R():
    cfg, seq = _wide()
    topo = load_topology("emulated-frontier")
    cap = lambda ckpt: (1e12, 1e9)  # noqa: E731
    reg = R.derive(0.2, 5e9, cfg, seq, topo, cap, lambda ckpt: 0.5)
    links = R.emulated_R(cfg.shape(seq), R.emulated_topology(topo, R.FASTEST_MBIT, 5e9), reg.batch, 1, False)
    assert reg.network_mbit == R.FASTEST_MBIT
    assert reg.replay_factor == pytest.approx((0.2 - links) / 0.5)
    assert reg.predicted_R == pytest.approx(0.2)
    # without curves nothing is scaled
    assert R.derive(0.2, 5e9, cfg, seq, topo, cap).replay_factor == 1.0


def test_a_layer_is_a_small_share_of_neox_20b_and_most_of_the_bench_model():
    from zerotopo.config.model_files import load_model

    target, _ = load_model(["configs/neox-20b.yml"], None)
    cfg, seq = _wide()
    assert 1 / 46 < R.layer_share(target) < 1 / 44
    assert R.layer_share(cfg.shape(seq)) > 0.9
