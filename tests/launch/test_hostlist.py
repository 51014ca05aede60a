"""Slurm host lists and per-node task counts."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zerotopo.errors import LaunchError
from zerotopo.launch.hostlist import expand_hostlist, first_host, parse_tasks_per_node


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        (
            "frontier[00012-00015,00020]",
            ["frontier00012", "frontier00013", "frontier00014", "frontier00015", "frontier00020"],
        ),
        ("a[1-3],b5", ["a1", "a2", "a3", "b5"]),
        ("node[01-02]-ib", ["node01-ib", "node02-ib"]),
        ("vm", ["vm"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("r[1-2]n[1,3]", ["r1n1", "r1n3", "r2n1", "r2n3"]),
        ("x1,y[2],z", ["x1", "y2", "z"]),
    ],
)
def test_expand(text, hosts):
    assert expand_hostlist(text) == hosts
    assert first_host(text) == hosts[0]


@pytest.mark.parametrize("bad", ["", "a[1-", "a]1[", "a[]", "a[3-1]", "a[1-2-3]", "a[[1]]", "a,,b", "a[x]"])
def test_expand_rejects(bad):
    with pytest.raises(LaunchError, match="SLURM_JOB_NODELIST=.* is not a Slurm host list"):
        expand_hostlist(bad, variable="SLURM_JOB_NODELIST")


@given(st.lists(st.integers(0, 99999), min_size=1, max_size=20, unique=True), st.integers(1, 6))
def test_expand_roundtrip(numbers, width):
    """A bracket list of zero-padded numbers expands to exactly those host names, in order."""
    padded = [str(n).zfill(width) for n in numbers]
    assert expand_hostlist(f"frontier[{','.join(padded)}]") == [f"frontier{p}" for p in padded]


@pytest.mark.parametrize(
    ("text", "counts"),
    [("8(x2)", [8, 8]), ("8,8", [8, 8]), ("8(x2),4", [8, 8, 4]), ("1", [1]), ("2,3(x2),1", [2, 3, 3, 1])],
)
def test_tasks_per_node(text, counts):
    assert parse_tasks_per_node(text) == counts


@pytest.mark.parametrize("bad", ["", "8(x)", "x8", "8(2)", "0", "8(x0)", "8,,8"])
def test_tasks_per_node_rejects(bad):
    with pytest.raises(LaunchError, match="is not a per-node task count list"):
        parse_tasks_per_node(bad)


def test_huge_host_lists_are_read_lazily():
    import time

    from zerotopo.launch.hostlist import count_hosts

    start = time.monotonic()
    assert first_host("nid[0-99999999]") == "nid0"
    assert first_host("r[7-99999999]n[0042-99999999]") == "r7n0042"
    assert count_hosts("nid[0-99999999],x[1-3]") == 100_000_003
    assert time.monotonic() - start < 1.0
    with pytest.raises(LaunchError, match="more than"):
        expand_hostlist("nid[0-99999999]")
