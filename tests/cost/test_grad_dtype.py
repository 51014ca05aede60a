"""Gradient width: the plan's ``grad_dtype`` drives the cost model's memory and bytes, a NeoX config's
default is DeepSpeed's (the parameter dtype), and ``zerotopo plan`` then reproduces Xu et al.'s 2-node
maximum model sizes (§II: ZeRO-3 about 68B, ZeRO++ about 55B on 16 GCDs of 64 GiB)."""

from __future__ import annotations

import argparse
from dataclasses import replace

import pytest

from zerotopo.cli import plan as plan_cli
from zerotopo.cost.comm import comm_per_step, grad_width
from zerotopo.cost.memory import memory_per_device
from zerotopo.placement.plan import get_preset
from zerotopo.placement.topology import load_topology


def _estimates(*extra: str):
    parser = argparse.ArgumentParser()
    plan_cli.add_arguments(parser)
    args = parser.parse_args(
        ["--model", "neox-20b", "--topology", "frontier", "--nodes", "2", "--plans", "zero3,zeropp", *extra]
    )
    est, *_ = plan_cli.estimates(args)
    return {e.name: e for e in est}


def test_plan_reproduces_papers_003_two_node_maximum_sizes():
    est = _estimates()  # neox-20b is fp16: DeepSpeed keeps fp16 gradients, so 2 bytes per gradient
    assert est["zero3"].max_params == pytest.approx(68e9, rel=0.05)
    assert est["zeropp"].max_params == pytest.approx(55e9, rel=0.05)
    # the figures follow the gradient width: fp32 gradients leave room for less
    fp32 = _estimates("--grad-dtype", "fp32")
    assert fp32["zero3"].max_params < 0.95 * 68e9 and fp32["zeropp"].max_params < 0.95 * 55e9
    assert fp32["zero3"].memory.grads == 2 * est["zero3"].memory.grads


def test_grad_dtype_sets_memory_and_bytes():
    t = load_topology("frontier", nodes=2)
    units = [4096 * 1024] * 3
    base = get_preset("zero3")
    half, full = replace(base, grad_dtype="param"), replace(base, grad_dtype="fp32")
    assert grad_width(half, 2) == 2 and grad_width(full, 2) == 4 and grad_width(base, 2) == 4
    m_half = memory_per_device(units, t, half, param_bytes=2)
    m_full = memory_per_device(units, t, full, param_bytes=2)
    assert m_full.grads == 2 * m_half.grads and m_half.params == m_full.params

    def rs_bytes(plan):
        return sum(
            c.total_bytes for c in comm_per_step(units, t, plan, micro_batches=2) if c.phase == "grad_reduce"
        )

    def replica_bytes(plan):
        return sum(
            c.total_bytes
            for c in comm_per_step(units, t, plan, micro_batches=2)
            if c.phase == "replica_reduce"
        )

    assert rs_bytes(full) == 2 * rs_bytes(half) > 0
    mics = get_preset("mics")  # replicated across nodes: a cross-replica reduction exists
    assert (
        replica_bytes(replace(mics, grad_dtype="fp32"))
        == 2 * replica_bytes(replace(mics, grad_dtype="param"))
        > 0
    )


def test_neox_default_is_deepspeeds(tmp_path):
    from zerotopo.config.neox import load_neox_config
    from zerotopo.errors import ConfigError

    def args(text):
        f = tmp_path / "c.yml"
        f.write_text(text)
        return load_neox_config([str(f)])

    assert args("fp16: {enabled: true}\n").precision.grad_dtype == "param"
    assert args("bf16: {enabled: true}\n").precision.grad_dtype == "param"
    assert (
        args("bf16: {enabled: true}\ndata_types: {grad_accum_dtype: fp32}\n").precision.grad_dtype == "fp32"
    )
    assert (
        args("bf16: {enabled: true}\ndata_types: {grad_accum_dtype: bf16}\n").precision.grad_dtype == "param"
    )
    with pytest.raises(ConfigError, match="grad_accum_dtype"):
        args("bf16: {enabled: true}\ndata_types: {grad_accum_dtype: fp16}\n")
