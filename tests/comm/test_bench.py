"""bench collectives and calibrate: rows and table on 4 gloo ranks, size parsing, CLI wiring."""

from __future__ import annotations

import argparse

import pytest

from zerotopo.bench import collectives as bench
from zerotopo.cli import bench as cli_bench
from zerotopo.errors import ConfigError
from zerotopo.launch.spawn import spawn
from zerotopo.placement import volume


def test_parse_size() -> None:
    assert bench.parse_size("4M") == 4 << 20
    assert bench.parse_size("64k") == 64 << 10
    assert bench.parse_size("1GiB") == 1 << 30
    assert bench.parse_size("512") == 512
    assert bench.format_size(3 << 20) == "3M"
    for bad in ("lots", "0", "M"):
        with pytest.raises(ConfigError):
            bench.parse_size(bad)


def test_cli_parses_collectives_and_step() -> None:
    parser = argparse.ArgumentParser()
    cli_bench.add_arguments(parser)
    args = parser.parse_args(["collectives", "--sizes", "1K", "--ops", "all_gather,bogus"])
    with pytest.raises(ConfigError, match="unknown op 'bogus'"):
        cli_bench.run(args)
    args = parser.parse_args([])
    with pytest.raises(ConfigError, match="bench collectives"):
        cli_bench.run(args)


def _bench(rank: int, world: int, spec: bench.BenchSpec) -> list:
    return bench.bench_rank(spec, rank)


@pytest.mark.slow
def test_bench_rows_count_the_bytes_of_every_op() -> None:
    spec = bench.BenchSpec(
        nodes=1,
        ops=(
            "all_gather",
            "reduce_scatter",
            "all_reduce",
            "broadcast",
            "all_gather_int8",
            "reduce_scatter_int4",
        ),
        sizes=(4096,),
        iters=2,
        warmup=1,
        block=64,
    )
    results = spawn(_bench, 4, args=(spec,), ranks_per_node=4, timeout_s=240)
    rows = results[0]
    assert [r["seconds"] for r in rows] == [r["seconds"] for r in results[1]], "rows agree on all ranks"
    # emulated with one node: tier groups of 2 (package) and 4 (node, also the whole job).
    assert {(r["degree"], r["tier"]) for r in rows} == {(2, "package"), (4, "node")}
    n = 4096 // 4
    expected = {
        "all_gather": lambda d: volume.all_gather_bytes(n, d, 4),
        "reduce_scatter": lambda d: volume.reduce_scatter_bytes(n, d, 4),
        "all_reduce": lambda d: volume.all_reduce_bytes(n, d, 4),
        "broadcast": lambda d: volume.broadcast_bytes(n, d, 4, is_root=True),
        "all_gather_int8": lambda d: volume.int8_all_gather_bytes(n, d, 64),
        "reduce_scatter_int4": lambda d: volume.int4_reduce_scatter_bytes(n, d, 64),
    }
    for r in rows:
        assert r["size_bytes"] == 4096 and r["seconds"] > 0
        assert r["bytes_sent"] == expected[r["op"]](r["degree"]), r
        assert r["algbw_gbps"] == pytest.approx(r["bytes_sent"] / r["seconds"] / 1e9)
    assert "algbw_GB/s" in bench.format_table(rows)
