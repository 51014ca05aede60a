"""Sharding plans: validation messages, presets' degrees, YAML and DeepSpeed forms, enumeration."""

from __future__ import annotations

import pytest
import yaml

from zerotopo.errors import ConfigError, PlanError
from zerotopo.placement.plan import (
    PRESETS,
    Degrees,
    Plan,
    divisors,
    enumerate_plans,
    get_preset,
    load_plan,
    plan_from_deepspeed,
    plan_from_mapping,
    validate_degrees,
)
from zerotopo.placement.topology import load_topology


def _deg(plan: str | Plan, topo) -> tuple:
    d = (get_preset(plan) if isinstance(plan, str) else plan).degrees(topo)
    return d.params, d.secondary, d.grads, d.optim


def test_preset_degrees_on_two_frontier_nodes():
    t = load_topology("frontier", nodes=2)  # 16 GCDs: packages of 2, nodes of 8
    expected = {
        "ddp": (1, None, 1, 1),
        "zero1": (1, None, 1, 16),
        "zero2": (1, None, 16, 16),
        "zero3": (16, None, 16, 16),
        "zeropp": (16, 8, 16, 16),
        "mics": (8, None, 8, 8),
        "hsdp": (8, None, 8, 8),
        "zerotopo": (2, 8, 8, 16),
        "zerotopo-pkg": (2, 2, 8, 16),
    }
    assert {name: _deg(name, t) for name in PRESETS} == expected
    assert get_preset("zerotopo").secondary_dtype == "int8" and get_preset("zeropp").secondary_dtype == "bf16"


def test_preset_degrees_on_two_dgx_nodes():
    # one tier inside the node: "inner" is the whole node, so zerotopo keeps weights per node
    t = load_topology("dgx-h100", nodes=2)
    got = {name: _deg(name, t) for name in ("zero3", "zeropp", "mics", "zerotopo", "zerotopo-pkg")}
    assert got == {
        "zero3": (16, None, 16, 16),
        "zeropp": (16, 8, 16, 16),
        "mics": (8, None, 8, 8),
        "zerotopo": (8, 8, 8, 16),
        "zerotopo-pkg": (8, 8, 8, 16),
    }


def test_validation_names_the_rule_and_the_numbers():
    t = load_topology("frontier", nodes=2)
    with pytest.raises(PlanError, match=r"params degree 3 does not divide the world size 16.*1, 2, 4, 8, 16"):
        Plan("bad", params=3, grads=16, optim=16).degrees(t)
    with pytest.raises(PlanError, match=r"nest params \| grads \| optim.*params=4 does not divide grads=2"):
        Plan("bad", params=4, grads=2, optim=16).degrees(t)
    with pytest.raises(PlanError, match=r"grads=8 does not divide optim=4"):
        Plan("bad", params=2, grads=8, optim=4).degrees(t)
    with pytest.raises(PlanError, match=r"secondary degree 32 does not divide the world size 16"):
        Plan("bad", params=16, grads=16, optim=16, secondary=32).degrees(t)
    with pytest.raises(PlanError, match="unknown degree 'rack'"):
        Plan("bad", params="rack").degrees(t)
    with pytest.raises(PlanError, match="sync must be one of event, host"):
        Plan("bad", sync="later").degrees(t)
    # The racy stock hpZ ordering is no plan option: only the engine's test hook reproduces it.
    with pytest.raises(PlanError, match=r"sync must be one of event, host, got 'none' .*unordered_secondary"):
        Plan("bad", sync="none").degrees(t)
    with pytest.raises(PlanError, match="quant_block must be an even integer"):
        Plan("bad", quant_block=3).degrees(t)
    with pytest.raises(PlanError, match="positive integer"):
        validate_degrees(Degrees(params=0, grads=1, optim=1, world=8))


def test_mics_does_not_fit_a_world_smaller_than_a_node():
    t = load_topology("emulated", nodes=1)  # 4 ranks: a node is 4, fine
    assert _deg("mics", t) == (4, None, 4, 4)
    with pytest.raises(PlanError, match="params degree 6 does not divide the world size 4"):
        Plan("x", params=6, grads=6, optim=6).degrees(t)


def test_plans_from_yaml_mapping_and_file(tmp_path):
    p = plan_from_mapping({"preset": "zero3", "secondary": {"degree": "node", "dtype": "int8"}})
    assert (p.name, p.secondary, p.secondary_dtype, p.params) == ("zero3*", "node", "int8", "world")
    p = plan_from_mapping(
        {"name": "mine", "params": "package", "grads": "node", "optim": "world", "prefetch": 2}
    )
    assert _deg(p, load_topology("frontier", nodes=2)) == (2, None, 8, 16) and p.prefetch == 2
    f = tmp_path / "plan.yaml"
    f.write_text(yaml.safe_dump({"plan": {"preset": "zerotopo", "sync": "host"}}))
    assert load_plan(str(f)).sync == "host"
    with pytest.raises(ConfigError, match="unknown key 'shards'"):
        plan_from_mapping({"shards": 2})
    with pytest.raises(ConfigError, match="expected a number or a tier name, found True"):
        plan_from_mapping({"params": True})
    with pytest.raises(ConfigError, match="expected true or false"):
        plan_from_mapping({"quantize_grads": "yes"})
    with pytest.raises(ConfigError, match="unknown plan preset 'zero4'"):
        load_plan("zero4")


def test_deepspeed_zero_optimization_blocks():
    t = load_topology("frontier", nodes=2)
    zpp = plan_from_deepspeed(
        {
            "stage": 3,
            "zero_hpz_partition_size": 8,
            "zero_quantized_weights": True,
            "zero_quantized_gradients": True,
        }
    )
    assert zpp.name == "zeropp" and _deg(zpp, t) == (16, 8, 16, 16)
    assert zpp.quantize_weights and zpp.quantize_grads and zpp.secondary_dtype == "bf16"
    assert _deg(plan_from_deepspeed({"stage": 1}), t) == (1, None, 1, 16)
    assert _deg(plan_from_deepspeed({"stage": 2, "overlap_comm": True}), t) == (1, None, 16, 16)
    mics = plan_from_deepspeed({"stage": 3, "mics_shard_size": 8})
    assert _deg(mics, t) == (8, None, 8, 8)
    assert load_plan({"zero_optimization": {"stage": 0}}).name == "ddp"
    with pytest.raises(ConfigError, match="stage must be 0, 1, 2 or 3, found 4"):
        plan_from_deepspeed({"stage": 4})
    with pytest.raises(ConfigError, match="zero_hpz_partition_size needs stage 3, found stage 2"):
        plan_from_deepspeed({"stage": 2, "zero_hpz_partition_size": 8})
    with pytest.raises(ConfigError, match="mics_shard_size needs stage 3"):
        plan_from_deepspeed({"stage": 1, "mics_shard_size": 8})
    with pytest.raises(ConfigError, match="expected an integer"):
        plan_from_deepspeed({"stage": 3, "zero_hpz_partition_size": "8"})


@pytest.mark.parametrize(
    ("name", "nodes"), [("emulated", 1), ("frontier", 1), ("frontier", 2), ("dgx-a100", 3)]
)
def test_enumerated_plans_are_valid_distinct_and_complete(name, nodes):
    t = load_topology(name, nodes=nodes)
    plans = enumerate_plans(t)
    keys = set()
    for p in plans:
        d = p.degrees(t)  # raises if invalid
        assert d.grads % d.params == 0 and d.optim % d.grads == 0 and d.world % d.optim == 0
        keys.add(
            (
                d.params,
                d.secondary,
                p.secondary_dtype if d.secondary else None,
                d.grads,
                d.optim,
                p.quantize_weights,
                p.quantize_grads,
            )
        )
    assert len(keys) == len(plans)
    # an independent count of nested triples (with no secondary and no quantization)
    w = t.world_size
    triples = {
        (p, g, o) for p in divisors(w) for g in divisors(w) for o in divisors(w) if g % p == 0 and o % g == 0
    }
    plain = {(k[0], k[3], k[4]) for k in keys if k[1] is None and not k[5] and not k[6]}
    assert plain == triples


def test_inline_plan_flags():
    from zerotopo.placement.plan import load_plan
    from zerotopo.placement.topology import load_topology

    topo = load_topology("frontier", nodes=2)
    plan = load_plan("params=package,grads=node,optim=world,secondary=node/int8,quantize_grads=true")
    d = plan.degrees(topo)
    assert (d.params, d.secondary, d.grads, d.optim) == (2, 8, 8, 16)
    assert plan.secondary_dtype == "int8" and plan.quantize_grads and not plan.quantize_weights
    over = load_plan("zerotopo,sync=host,prefetch=2")
    assert (over.sync, over.prefetch, over.degrees(topo)) == ("host", 2, load_plan("zerotopo").degrees(topo))
    with pytest.raises(ConfigError, match="given twice"):
        load_plan("params=2,params=4")
    with pytest.raises(ConfigError, match="unknown key 'bogus'"):
        load_plan("params=2,bogus=1")
    with pytest.raises(ConfigError, match="KEY=VALUE after the preset"):
        load_plan("zero3,sync=host,zeropp")
