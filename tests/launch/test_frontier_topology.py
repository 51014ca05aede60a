"""A Frontier job that names no topology: the mismatch error names ``--topology frontier`` (not
``--emulated-nodes``), and a rank on a Frontier node (Slingshot, ROCm devices, 8 per node) is recognised."""

from __future__ import annotations

from dataclasses import replace

from tests.launch.test_emulated_nodes_flag import info
from zerotopo.launch.advice import recognised_topology, topology_mismatch_advice
from zerotopo.placement.topology import load_topology


def test_sixteen_frontier_nodes_on_the_emulated_topology_are_told_to_pass_topology_frontier():
    emulated = load_topology("emulated")  # 4 devices per node
    rocm = replace(info(128, 8, 16), device_kind="rocm", backend="nccl", launcher="slurm")
    advice = topology_mismatch_advice(rocm, emulated)
    assert "--topology frontier" in advice and "--emulated-nodes" not in advice
    # CUDA hosts of 8 devices: several topologies fit, each is named with --topology
    cuda = replace(info(16, 8, 2), device_kind="cuda", backend="nccl")
    advice = topology_mismatch_advice(cuda, emulated)
    assert "--topology" in advice and "dgx-h100" in advice and "--emulated-nodes" not in advice


def test_a_frontier_node_is_recognised_only_when_unambiguous():
    rocm = replace(info(16, 8, 2), device_kind="rocm", backend="nccl", launcher="slurm")
    assert recognised_topology(rocm, {"LMOD_SYSTEM_NAME": "frontier"}) == "frontier"
    assert recognised_topology(rocm, {}) is None  # not a Slingshot system
    cuda = replace(rocm, device_kind="cuda")
    assert recognised_topology(cuda, {"LMOD_SYSTEM_NAME": "frontier"}) is None
    four = replace(info(8, 4, 2), device_kind="rocm")
    assert recognised_topology(four, {"LMOD_SYSTEM_NAME": "frontier"}) is None
