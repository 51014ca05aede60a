"""Topology descriptors: built-ins, sizes and tiers, rank placement, and every bad-input path."""

from __future__ import annotations

import copy

import pytest
import yaml

from zerotopo.errors import ConfigError
from zerotopo.placement.topology import builtin_topologies, load_topology, topology_from_mapping

GOOD = {
    "name": "mini",
    "description": "two packages of two devices",
    "device": {"name": "toy", "memory_gib": 16, "peak_tflops": 100},
    "tiers": [
        {"name": "package", "fanout": 2, "bandwidth_gbps": 100, "latency_us": 1},
        {"name": "node", "fanout": 2, "bandwidth_gbps": 50, "latency_us": 2},
    ],
    "network": {"name": "network", "injection_gbps": 40, "latency_us": 5},
    "nodes": 2,
    "device_order": [2, 3, 0, 1],
}


def test_builtins_load_and_have_the_documented_shape():
    assert {"frontier", "dgx-a100", "dgx-h100", "dgx-h200", "emulated"} <= set(builtin_topologies())
    f = load_topology("frontier", nodes=48)
    assert (f.devices_per_node, f.world_size, f.tier_names) == (8, 384, ("package", "node", "network"))
    assert f.device.memory_gib == 64 and f.device.peak_tflops == pytest.approx(191.5)
    assert f.bandwidth_gbps("network") == pytest.approx(100 / 8)  # 4 x 25 GB/s NICs shared by 8 GCDs
    assert f.device_order == (4, 5, 2, 3, 6, 7, 0, 1)
    e = load_topology("emulated")
    assert (e.nodes, e.world_size, [t.fanout for t in e.tiers]) == (2, 8, [2, 2])
    for name in ("dgx-a100", "dgx-h100", "dgx-h200"):
        t = load_topology(name, nodes=2)
        assert (t.devices_per_node, t.world_size, t.tier_names) == (8, 16, ("node", "network"))
    h100, h200 = load_topology("dgx-h100"), load_topology("dgx-h200")
    # the same node and fabric, the larger and faster memory
    assert (h200.tiers, h200.network) == (h100.tiers, h100.network)
    assert (h200.device.memory_gib, h200.device.memory_bandwidth_gbps) == (141, 4800)
    assert h200.device.peak_tflops == h100.device.peak_tflops == 989


def test_tier_sizes_degrees_and_groups_crossing_tiers():
    t = load_topology("frontier", nodes=2)
    assert [t.tier_size(x) for x in t.tier_names] == [2, 8, 16]
    assert [t.degree(x) for x in ("device", "inner", "package", "node", "world", 4, "8")] == [
        1,
        2,
        2,
        8,
        16,
        4,
        8,
    ]
    assert t.tier_of_group([5]) is None
    assert t.tier_of_group([0, 1]) == "package"
    assert t.tier_of_group([1, 2]) == "node"  # neighbours in index, different packages
    assert t.tier_of_group(range(8)) == "node"
    assert t.tier_of_group([7, 8]) == "network"
    with pytest.raises(ConfigError, match="unknown degree 'rack'"):
        t.degree("rack")


def test_rank_placement_follows_the_device_order():
    t = load_topology("frontier", nodes=2)
    # srun --gpu-bind=closest: local rank 0 sits on GCD 4, local rank 6 on GCD 0
    assert [t.topological_index(1, lr) for lr in range(8)] == [12, 13, 10, 11, 14, 15, 8, 9]
    assert t.topological_index(0, 3, physical_device=7) == 7  # a known physical device wins
    with pytest.raises(ConfigError, match="outside the 8 devices"):
        t.topological_index(0, 0, physical_device=8)


def test_a_custom_topology_from_a_mapping():
    t = topology_from_mapping(GOOD, source="mini.yaml")
    assert (t.world_size, t.devices_per_node, t.device_order) == (8, 4, (2, 3, 0, 1))
    assert t.bandwidth_gbps("network") == 10 and t.latency_us("node") == 2
    assert t.with_nodes(3).world_size == 12


def _broken(path: str, value=None, *, delete: bool = False) -> dict:
    raw = copy.deepcopy(GOOD)
    keys = path.split(".")
    node = raw
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    last = keys[-1]
    if isinstance(node, list):
        last = int(last)
    if delete:
        del node[last]
    else:
        node[last] = value
    return raw


@pytest.mark.parametrize(
    ("raw", "key", "words"),
    [
        (_broken("racks", 4), "racks", "unknown key"),
        (_broken("device.hbm", 3), "device.hbm", "unknown key 'hbm'"),
        (_broken("tiers.0.speed", 3), "tiers[0].speed", "unknown key 'speed'"),
        (_broken("network.nics", 4), "network.nics", "unknown key 'nics'"),
        (_broken("network", delete=True), "network", "missing required key 'network'"),
        (_broken("device.memory_gib", delete=True), "device.memory_gib", "missing required key 'memory_gib'"),
        (_broken("tiers.1.fanout", delete=True), "tiers[1].fanout", "missing required key 'fanout'"),
        (_broken("tiers.0.fanout", "two"), "tiers[0].fanout", "expected a number, found 'two'"),
        (_broken("tiers.0.fanout", 2.5), "tiers[0].fanout", "expected a whole number"),
        (_broken("tiers.0.fanout", True), "tiers[0].fanout", "expected a number"),
        (_broken("device.name", 7), "device.name", "expected a non-empty string"),
        (_broken("tiers.0.fanout", 0), "tiers[0].fanout", "expected a value > 0, found 0"),
        (_broken("device.memory_gib", -16), "device.memory_gib", "expected a value > 0, found -16"),
        (_broken("network.injection_gbps", 0), "network.injection_gbps", "> 0"),
        (_broken("tiers.0.latency_us", -1), "tiers[0].latency_us", "expected a value >= 0"),
        (_broken("nodes", 0), "nodes", "expected a value > 0"),
        (_broken("tiers", []), "tiers", "non-empty list of tiers"),
        (_broken("device", "fast"), "device", "expected a mapping"),
        (_broken("device_order", [0, 1, 2, 2]), "device_order", "exactly once"),
        (_broken("device_order", [0, 1, 2]), "device_order", "each of the 4 devices"),
        (_broken("device_order", "0123"), "device_order", "expected a list of device ids"),
        (_broken("tiers.1.name", "package"), "tiers", "used twice"),
        (_broken("tiers.0.name", "world"), "tiers[0].name", "reserved"),
        (_broken("description", 5), "description", "expected a string"),
        (_broken("device.host_reduce", "yes"), "device.host_reduce", "expected true or false, found 'yes'"),
        (_broken("device.host_reduce", 1), "device.host_reduce", "expected true or false"),
    ],
)
def test_every_bad_input_names_file_key_and_expectation(raw, key, words):
    with pytest.raises(ConfigError) as info:
        topology_from_mapping(raw, source="mini.yaml")
    msg = str(info.value)
    assert msg.startswith("mini.yaml: ")
    assert info.value.key == key
    assert words in msg


def test_cpu_ranks_say_they_reduce_on_the_computing_thread():
    from zerotopo.cost.time import OverlapModel, step_time
    from zerotopo.placement.plan import get_preset
    from zerotopo.placement.schedule import engine_units, step_schedule
    from zerotopo.placement.shape import ModelShape

    assert load_topology("emulated-frontier").device.host_reduce
    assert not load_topology("frontier").device.host_reduce
    raw = dict(GOOD, device=dict(GOOD["device"], host_reduce=True))
    cpu = topology_from_mapping(raw, source="mini.yaml")
    gpu = topology_from_mapping(GOOD, source="mini.yaml")
    assert cpu.device.host_reduce and not gpu.device.host_reduce
    # the cost model reads it as OverlapModel(host_reduce=True): the backward waits for each reduction
    shape = ModelShape(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=16, vocab_size=128)
    plan = get_preset("zero2")
    sched = step_schedule(engine_units(shape), gpu, plan, micro_batches=2)
    kw = {"micro_batch": 1, "checkpoint_activations": False}
    on_cpu = step_time(sched, cpu, shape, **kw).step_time_s
    told = step_time(sched, gpu, shape, overlap=OverlapModel(host_reduce=True), **kw).step_time_s
    assert on_cpu == pytest.approx(told) and on_cpu > step_time(sched, gpu, shape, **kw).step_time_s


def test_files_yaml_errors_and_unknown_names(tmp_path):
    good = tmp_path / "mini.yaml"
    good.write_text(yaml.safe_dump(GOOD))
    assert load_topology(str(good), nodes=5).world_size == 20
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntiers: [\n")
    with pytest.raises(ConfigError, match="not valid YAML") as info:
        load_topology(str(bad))
    assert str(bad) in str(info.value)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just text\n")
    with pytest.raises(ConfigError, match="must be a mapping, found str"):
        load_topology(str(scalar))
    with pytest.raises(ConfigError, match="unknown topology 'summit'.*frontier"):
        load_topology("summit")
    with pytest.raises(ConfigError, match="does not exist"):
        load_topology(str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="positive integer"):
        load_topology("frontier", nodes=0)
