"""Reading NeoX-style YAML files: ``-`` and ``_`` are the same in keys, no key may be given twice.

GPT-NeoX config files are YAML flow mappings written like JSON with comments (``{ "num-layers": 24, ... }``,
Python's ``True``, trailing commas); PyYAML's safe loader reads them. Each value remembers the file it came
from, so a later error can name that file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from zerotopo.errors import ConfigError

OVERRIDE_SOURCE = "--set"


def normalize_key(key: Any) -> Any:
    """NeoX treats ``num-layers`` and ``num_layers`` as one key."""
    return key.replace("-", "_") if isinstance(key, str) else key


class _StrictLoader(yaml.SafeLoader):
    """A safe loader that normalizes keys and rejects a key given twice in one mapping."""

    source = "<yaml>"

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        self.flatten_mapping(node)
        out: dict[Any, Any] = {}
        lines: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = normalize_key(self.construct_object(key_node, deep=True))
            line = key_node.start_mark.line + 1
            if key in lines:
                raise ConfigError(
                    f"appears twice (lines {lines[key]} and {line}; '-' and '_' are the same in keys); "
                    "remove one of them",
                    source=self.source,
                    key=str(key),
                )
            lines[key] = line
            out[key] = self.construct_object(value_node, deep=True)
        return out


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _StrictLoader.construct_mapping)


def read_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """One config file as a dict with normalized keys; ConfigError when unreadable or not a mapping."""
    source = os.fspath(path)
    if not os.path.isfile(source):
        raise ConfigError("file not found; give the path of a NeoX YAML config (see configs/)", source=source)
    with open(source, encoding="utf-8") as f:
        text = f.read()
    loader = _StrictLoader(text)
    loader.source = source
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {exc}", source=source) from None
    finally:
        loader.dispose()
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"expected a mapping of keys to values at the top, got {type(data).__name__}", source=source
        )
    return data


def merge_files(paths: Sequence[str | os.PathLike]) -> tuple[dict[str, Any], dict[str, str]]:
    """Merge several files into ``(values, source_of_each_key)``; a key in two files is an error."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for path in paths:
        source = os.fspath(path)
        for key, value in read_yaml(source).items():
            if key in sources:
                raise ConfigError(
                    f"is set in both {sources[key]} and {source}; keep it in one file "
                    "(use --set key=value to override a file)",
                    source=source,
                    key=str(key),
                )
            values[key] = value
            sources[key] = source
    return values, sources


def parse_override_value(value: Any) -> Any:
    """A ``--set key=value`` value as YAML would read it (``4`` -> int, ``true`` -> bool, ``[1, 2]`` -> list)."""
    if not isinstance(value, str):
        return value
    try:
        return yaml.safe_load(value) if value.strip() else value
    except yaml.YAMLError:
        return value


def apply_overrides(
    values: dict[str, Any], sources: dict[str, str], overrides: Mapping[str, Any] | None
) -> None:
    """Set ``overrides`` over the merged files in place; dotted keys reach into blocks
    (``optimizer.params.lr=3e-4``). Overrides win over files without counting as duplicates."""
    for raw_key, raw_value in (overrides or {}).items():
        path = [normalize_key(part) for part in str(raw_key).split(".")]
        value = parse_override_value(raw_value)
        top = path[0]
        sources[top] = OVERRIDE_SOURCE
        if len(path) == 1:
            values[top] = value
            continue
        block = values.get(top)
        block = dict(block) if isinstance(block, dict) else {}
        values[top] = block
        for part in path[1:-1]:
            inner = block.get(part)
            block[part] = dict(inner) if isinstance(inner, dict) else {}
            block = block[part]
        block[path[-1]] = value
