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
