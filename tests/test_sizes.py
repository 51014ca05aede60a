"""One size convention for every flag and key (zerotopo/sizes.py)."""

from __future__ import annotations

import pytest

from zerotopo.errors import ConfigError
from zerotopo.sizes import parse_size


def test_binary_without_b_or_with_ib_and_decimal_with_b():
    assert parse_size("4M") == parse_size("4MiB") == 4 << 20
    assert parse_size("5MB") == 5 * 10**6 and parse_size("5GB") == 5 * 10**9
    assert parse_size("512") == parse_size("512B") == parse_size(512) == 512
    assert parse_size("1.5K") == 1536 and parse_size("2gib") == 2 << 30


@pytest.mark.parametrize("bad", ["lots", "0", "M", "iB", "-1", "nan", "", "5 parsecs", True])
def test_a_bad_size_is_one_error_naming_the_key(bad):
    with pytest.raises(ConfigError) as err:
        parse_size(bad, key="--max-shard-size")
    assert "--max-shard-size" in str(err.value)


def test_mb_means_the_same_in_every_reader():
    """``5MB`` is 5,000,000 bytes (SI) and ``5MiB`` 5,242,880 in a CLI flag and in a bandwidth curve file
    alike: the curve reader uses the one parser."""
    from zerotopo.cost.bandwidth import curves_from_list

    entry = {"op": "all_gather", "tier": "network", "nodes": 2, "ranks_per_node": 8}
    raw = [{**entry, "sizes": ["5MB", "5MiB", "64M"], "busbw_gbps": [1.0, 2.0, 3.0]}]
    (curve,) = curves_from_list(raw, "curves.yaml")
    assert curve.sizes == (5 * 10**6, 5 * 2**20, 64 * 2**20)
    assert curve.sizes == tuple(parse_size(s) for s in ("5MB", "5MiB", "64M"))
    with pytest.raises(ConfigError, match=r"curves.yaml: bandwidth\[0\].sizes\[1\]"):
        curves_from_list([{**entry, "sizes": [1024, "lots"], "busbw_gbps": [1.0, 2.0]}], "curves.yaml")
