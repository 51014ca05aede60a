"""The DeepSpeed cost presets: DeepSpeed's own schedule (per-module gathers, prefetch and reduce buckets
at its defaults, fp16 gradients) on the zero3/zeropp placements."""

from __future__ import annotations

import pytest

from zerotopo.config.model_files import load_model
from zerotopo.cost.planner import CostOptions
from zerotopo.placement.plan import get_preset
from zerotopo.placement.shape import ModelShape
from zerotopo.placement.topology import load_topology
from zerotopo_lab.deepspeed_schedule import module_units
from zerotopo_lab.presets import COST_PRESETS, DS_PREFETCH_BUCKET, DS_REDUCE_BUCKET, plan_candidates, resolve


def test_deepspeed_defaults_are_deepspeeds():
    cfg = pytest.importorskip("deepspeed.runtime.zero.config")
    z = cfg.DeepSpeedZeroConfig()
    assert z.reduce_bucket_size == DS_REDUCE_BUCKET and z.prefetch_bucket_size == DS_PREFETCH_BUCKET
    assert z.allgather_bucket_size == 500_000_000 and z.param_persistence_threshold == 100_000
    # ZeRO-1/2 all-reduce each gradient bucket whole (deepspeed-zero1's replica all-reduce)
    assert z.use_multi_rank_bucket_allreduce is True


def test_deepspeed_zero3_schedule_for_neox_20b_on_48_nodes():
    shape, _ = load_model(["neox-20b"], None)
    topo = load_topology("frontier", nodes=48)
    (e,) = plan_candidates(
        shape, topo, plans=["deepspeed-zero3"], options=CostOptions(micro_batch=4, fp16=True)
    )
    plan, sched = resolve("deepspeed-zero3")
    assert e.plan == plan and plan.grad_dtype == "param" and e.degrees == get_preset("zero3").degrees(topo)
    units = e.schedule.units
    h, L = shape.hidden_size, shape.num_layers
    # one gather per weight matrix: 4 per layer, the embedding and the head; biases and LayerNorms stay
    assert len(units) == 4 * L + 2
    fwd = [c for u in units for c in u.forward]
    assert (
        len(fwd) == 4 * L + 2
        and {c.group_size for c in fwd} == {384}
        and {c.tier for c in fwd} == {"network"}
    )
    qkv = units[1].forward[0]
    assert units[1].unit.name == "layer.qkv" and units[1].unit.gathered == 3 * h * h
    assert qkv.message_bytes == pytest.approx(3 * h * h * 2, rel=1e-4)  # 226 MB of fp16
    assert units[2].forward[0].message_bytes == pytest.approx(h * h * 2, rel=1e-4)  # 75 MB: the slow band
    # every module is over half the 5e7 prefetch bucket: one module in flight ahead
    assert {u.prefetch for u in units[:-1]} == {1} and units[-1].prefetch == 0
    # fp16 gradients reduced in buckets of at most 5e8 elements, every parameter once per micro-batch
    red = [c for u in units for c in u.reduce]
    assert all(c.message_bytes <= DS_REDUCE_BUCKET * 2 for c in red) and {c.dtype for c in red} == {"bf16"}
    assert sum(c.message_bytes for c in red) == pytest.approx(2 * shape.param_count(), rel=1e-3)
    assert len(red) == pytest.approx(2 * shape.param_count() / (DS_REDUCE_BUCKET * 2), rel=0.25)


def test_deepspeed_zeropp_schedule():
    shape, _ = load_model(["neox-20b"], None)
    topo = load_topology("frontier", nodes=48)
    (e,) = plan_candidates(
        shape, topo, plans=["deepspeed-zeropp"], options=CostOptions(micro_batch=4, fp16=True)
    )
    units = e.schedule.units
    fwd = {(c.op, c.group, c.tier) for u in units for c in u.forward}
    bwd = {(c.op, c.group, c.tier, c.dtype) for u in units for c in u.backward}
    red = {(c.op, c.group, c.tier) for u in units for c in u.reduce}
    assert fwd == {("all_gather_int8", "params", "network")}
    assert bwd == {("all_gather", "secondary", "node", "bf16")}  # the fp16 hpZ copy per node
    assert red == {
        ("reduce_scatter_int4", "grads_intra", "node"),
        ("reduce_scatter_int4", "grads_inter", "network"),
    }


def test_prefetch_bucket_reaches_further_for_small_modules():
    shape = ModelShape(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=16, vocab_size=128)
    units = module_units(shape, 0)
    plan, sched = COST_PRESETS["deepspeed-zero3"]
    topo = load_topology("emulated")
    (e,) = plan_candidates(shape, topo, plans=["deepspeed-zero3"], micro_batch=1)
    # all of this model fits in one 5e7-element prefetch bucket: every remaining unit is in flight
    assert [u.prefetch for u in e.schedule.units] == [len(units) - 1 - i for i in range(len(units))]
    # one reduce bucket: the whole model's gradients after the last backward unit
    assert [bool(u.reduce) for u in e.schedule.units] == [True] + [False] * (len(units) - 1)


LLAMA_7B = ModelShape(
    num_layers=32, hidden_size=4096, num_attention_heads=32, seq_length=4096, vocab_size=32000
)


def test_deepspeed_zero1_schedule():
    # DeepSpeed ZeRO-1 with overlap_comm on 128 A800 nodes: no gathers in the micro-batches; at the
    # boundary each 5e8-element reduce bucket is all-reduced over the job in the backward; the updated
    # partitions come back at the step end in 5e8-element all-gathers
    topo = load_topology("a800", nodes=128)
    (e,) = plan_candidates(LLAMA_7B, topo, plans=["deepspeed-zero1"], micro_batch=1, grad_accum=2)
    units = e.schedule.units
    assert not any(u.forward or u.backward or u.reduce for u in units)
    last = [c for u in units for c in u.last_reduce]
    n = sum(c.message_bytes for c in last) / 2  # bf16 gradients
    assert n == pytest.approx(LLAMA_7B.param_count(), rel=1e-3)
    assert {(c.op, c.group, c.group_size, c.tier, c.dtype) for c in last} == {
        ("all_reduce", "grad_replicas", 1024, "network", "bf16")
    }
    # a gradient that would overflow a bucket reduces it first: a few more calls than full buckets
    least = -(-LLAMA_7B.param_count() // DS_REDUCE_BUCKET)
    assert least <= len(last) <= least + 2
    assert all(c.message_bytes <= DS_REDUCE_BUCKET * 2 for c in last)
    gathers = [c for c in e.schedule.step_end if c.phase == "param_gather"]
    assert len(gathers) == -(-n // 500_000_000) and not any(c.overlappable for c in gathers)
    assert sum(c.message_bytes for c in gathers) == pytest.approx(2 * n, rel=1e-3)
    # the ledger view counts each bucket once per step
    comm: dict[tuple[str, str], int] = {}
    for c in e.comm:
        comm[(c.phase, c.op)] = comm.get((c.phase, c.op), 0) + c.count
    assert comm[("replica_reduce", "all_reduce")] == len(last)
    assert comm[("param_gather", "all_gather")] == len(gathers)


def test_deepspeed_mics_schedule():
    # DeepSpeed MiCS: stage-3 gathers inside the node; each reduce bucket reduce-scattered in the node
    # every micro-batch and, in the last one, its shard all-reduced across the 128 replicas right after
    topo = load_topology("a800", nodes=128)
    (e,) = plan_candidates(LLAMA_7B, topo, plans=["deepspeed-mics"], micro_batch=1, grad_accum=2)
    units = e.schedule.units
    assert {(c.op, c.tier) for u in units for c in u.forward} == {("all_gather", "node")}
    for u in units:
        assert bool(u.reduce) == bool(u.last_reduce)  # the bucket's replica reduction follows it
    last = [c for u in units for c in u.last_reduce]
    assert {(c.op, c.group_size, c.tier, c.ranks_per_node) for c in last} == {
        ("all_reduce", 128, "network", 1)
    }
    assert sum(c.message_bytes for c in last) / 2 == pytest.approx(LLAMA_7B.param_count() / 8, rel=1e-3)
    assert not [c for c in e.schedule.step_end if c.phase == "replica_reduce"]


def test_the_recommendation_is_a_plan_the_engine_runs():
    # DeepSpeed's MiCS schedule is priced a little faster than the engine's mics here; the recommendation
    # still names a plan zerotopo runs, and compares it with the DeepSpeed preset
    from zerotopo.cost.planner import recommendation

    topo = load_topology("a800", nodes=128)
    opts = CostOptions(micro_batch=1, grad_accum=1)
    est = plan_candidates(LLAMA_7B, topo, plans=["deepspeed-mics", "mics"], options=opts)
    assert est[0].name == "deepspeed-mics"
    line = recommendation(est, LLAMA_7B, topo, opts, others=COST_PRESETS).splitlines()[0]
    assert line.startswith("recommended: mics (p=8 g=8 o=8)") and "the throughput of deepspeed-mics" in line
    # with only cost presets to choose from, the fastest of them
    only = plan_candidates(LLAMA_7B, topo, plans=["deepspeed-mics", "deepspeed-zero1"], options=opts)
    assert recommendation(only, LLAMA_7B, topo, opts, others=COST_PRESETS).startswith(
        "recommended: deepspeed-mics"
    )


def test_deepspeed_keeps_the_hpz_copy_in_the_parameters_dtype():
    # with fp32 parameters DeepSpeed's hpZ copy is fp32 (4 bytes a value); the engine's bf16 secondary is 2
    from dataclasses import replace

    from zerotopo.cost.planner import estimate
    from zerotopo_lab.bench.compare import framework_cost

    topo = load_topology("emulated-frontier")
    plan, sched = framework_cost("deepspeed-hpz")
    assert not plan.quantize_weights and not plan.quantize_grads and sched.secondary_param_dtype
    opts = CostOptions(micro_batch=1, param_bytes=4, checkpoint_activations=False)
    shape = ModelShape(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=16, vocab_size=128)

    def backward(s):
        cs = [c for u in estimate(plan, shape, topo, opts, schedule=s).schedule.units for c in u.backward]
        return {c.dtype for c in cs}, sum(c.bytes_sent for c in cs)

    # the row gathers nothing in the backward (its link counters: ZeRO-3's bytes); where the copy is read
    assert backward(sched) == (set(), 0) and not sched.backward_gather
    (ds_dtype, ds_bytes), (eng_dtype, eng_bytes) = (
        backward(replace(sched, backward_gather=True)),
        backward(replace(sched, backward_gather=True, secondary_param_dtype=False)),
    )
    assert ds_dtype == {"fp32"} and eng_dtype == {"bf16"} and ds_bytes == 2 * eng_bytes


def test_deepspeed_rows_on_gloo_reduce_gradients_as_all_reduces():
    # gloo runs torch's reduce_scatter_tensor as a full all-reduce (what DeepSpeed calls on CPU ranks):
    # the bench's DeepSpeed rows are priced so, twice the reduce-scatter's bytes; the engine's are not
    from dataclasses import replace

    from zerotopo.cost.planner import estimate
    from zerotopo_lab.bench.compare import framework_cost

    topo = load_topology("emulated-frontier")
    plan, sched = framework_cost("deepspeed-zero3")
    assert sched.reduce_scatter_all_reduce
    # under --curves the replay waits the target's (RCCL's) reduce-scatter: priced as one
    assert not framework_cost("deepspeed-zero3", gloo_reduce=False)[1].reduce_scatter_all_reduce
    opts = CostOptions(micro_batch=1, checkpoint_activations=False)
    shape = ModelShape(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=16, vocab_size=128)

    def reductions(s):
        est = estimate(plan, shape, topo, opts, schedule=s)
        cs = [c for u in est.schedule.units for c in u.reduce]
        return {c.op for c in cs}, sum(c.bytes_sent for c in cs), sum(c.latency_steps for c in cs), est

    (ops, nbytes, steps, est), (ops_rs, nbytes_rs, steps_rs, est_rs) = (
        reductions(sched),
        reductions(replace(sched, reduce_scatter_all_reduce=False)),
    )
    assert ops == {"all_reduce"} and ops_rs == {"reduce_scatter"}
    assert nbytes == 2 * nbytes_rs > 0 and steps == 2 * steps_rs
    assert est.time.step_time_s > est_rs.time.step_time_s
    # the engine's plans keep their reduce-scatter (its own ring on gloo)
    engine = estimate(get_preset("zero3"), shape, topo, opts)
    assert {c.op for u in engine.schedule.units for c in u.reduce} == {"reduce_scatter"}


def test_the_bench_prices_deepspeed_zero3_without_backward_gathers():
    # DeepSpeed's coordinator keeps what its prefetcher fetched until the parameter's last use, so on the
    # bench it gathers every parameter once, in the forward: its rows are priced so (hpZ's too: its link
    # counters show ZeRO-3's bytes, no backward gather from the secondary copy); the 20B presets keep it
    from dataclasses import replace

    from zerotopo.cost.planner import estimate
    from zerotopo_lab.bench.compare import framework_cost

    topo = load_topology("emulated-frontier")
    opts = CostOptions(micro_batch=1, checkpoint_activations=False)
    shape = ModelShape(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=16, vocab_size=128)
    plan, sched = framework_cost("deepspeed-zero3")
    assert not sched.backward_gather and resolve("deepspeed-zero3")[1].backward_gather
    assert not framework_cost("deepspeed-hpz")[1].backward_gather
    assert resolve("deepspeed-zeropp")[1].backward_gather

    def gathers(s):
        est = estimate(plan, shape, topo, opts, schedule=s)
        units = est.schedule.units
        return [c for u in units for c in u.forward], [c for u in units for c in u.backward], est

    (fwd, bwd, est), (fwd_re, bwd_re, est_re) = gathers(sched), gathers(replace(sched, backward_gather=True))
    assert bwd == [] and len(bwd_re) == len(est_re.schedule.units) - 1 > 0  # the last unit keeps its weights
    assert fwd == fwd_re  # the forward's gathers and the reductions are the same
    assert [c for u in est.schedule.units for c in u.reduce] == [
        c for u in est_re.schedule.units for c in u.reduce
    ]
    assert est.time.step_time_s < est_re.time.step_time_s
    # what it does not gather again it holds: every unit's gathered weights at the peak, where the
    # backward gather holds the unit in use and those prefetched
    param_bytes = opts.param_bytes
    full = sum(u.unit.numel for u in est.schedule.units) * param_bytes
    assert est.memory.buffers - est_re.memory.buffers > 0
    assert est.memory.buffers >= full
    assert est_re.memory.buffers < full
