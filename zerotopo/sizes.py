"""Byte sizes written by people: the one parser and convention for every flag, key and file that takes
a size (CLI flags, config keys, the bandwidth curve files).

- ``512``: bytes;
- ``64K``, ``4M``, ``2G`` (no ``B``) and ``1KiB``, ``4MiB``, ``2GiB``: powers of two, as message sizes
  are written for collective benchmarks (``nccl-tests -b 4M``);
- ``500KB``, ``5MB``, ``5GB``, ``1TB``: powers of ten (SI), as Hugging Face writes ``max_shard_size``:
  ``"5MB"`` is 5,000,000 bytes and ``"5MiB"`` 5,242,880, wherever a size is read.
"""

from __future__ import annotations

import re

from zerotopo.errors import ConfigError

_POWER = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*([KMGT]?)(I?B)?\s*", re.IGNORECASE)


def parse_size(
    text: str | int | float,
    *,
    key: str | None = None,
    example: str = "4M, 500MB, 2GiB",
    source: str | None = None,
) -> int:
    """Bytes of ``text`` (see the module docstring); a :class:`ConfigError` naming ``key`` (and the file
    ``source``, when read from one) otherwise."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        m = _SIZE.fullmatch(str(text))
        if not m or (m.group(2) == "" and (m.group(3) or "").upper() == "IB"):
            raise ConfigError(
                f"size {str(text)[:40]!r} is not a size in bytes; use a byte count or e.g. {example}",
                key=key,
                source=source,
            )
        prefix, suffix = m.group(2).upper(), (m.group(3) or "").upper()
        base = 1000 if suffix == "B" and prefix else 1024
        value = float(m.group(1)) * base ** _POWER[prefix]
    if not value >= 1:
        raise ConfigError(f"size {str(text)[:40]!r} must be at least one byte", key=key, source=source)
    return int(value)
