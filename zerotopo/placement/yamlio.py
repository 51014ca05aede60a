"""The one strict YAML reader of zerotopo: topologies, plans, NeoX configs and calibration tables all
come through :func:`load_yaml_file`.

A file is refused, with a :class:`~zerotopo.errors.ConfigError` naming it, the key and the fix, when it
is missing, a directory or other non-regular file, larger than :data:`MAX_FILE_BYTES`, binary or not
UTF-8, empty, not valid YAML, nested deeper than :data:`MAX_DEPTH`, uses more than :data:`MAX_ALIASES`
aliases or would expand (aliases followed) to more than :data:`MAX_EXPANDED_NODES` nodes (an "alias
bomb"), refers to an anchor recursively, gives a key twice in one mapping, or uses a key that is not a
string (``[a, b]: 1``, ``null: 1``). Only YAML's plain data types are built (PyYAML's safe loader): a
``!!python/...`` tag is an error, never code.

GPT-NeoX config files are YAML flow mappings written like JSON with comments (``{ "num-layers": 24, ... }``,
Python's ``True``, trailing commas); PyYAML's safe loader reads them. For them ``-`` and ``_`` are the
same in keys (:func:`read_yaml`). Each value remembers the file it came from, so a later error can name
that file.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from zerotopo.errors import ConfigError, short

OVERRIDE_SOURCE = "--set"

#: Largest config file read, in bytes (the largest real NeoX config is a few KiB).
MAX_FILE_BYTES = 16 << 20
#: Deepest nesting of mappings and lists.
MAX_DEPTH = 32
#: Most aliases (``*name``) in one document.
MAX_ALIASES = 256
#: Most nodes one document may stand for with every alias followed.
MAX_EXPANDED_NODES = 200_000
#: Longest key.
MAX_KEY_CHARS = 200
#: Longest piece of a parser's message quoted in an error.
_MAX_PARSER_MESSAGE = 400


def normalize_key(key: Any) -> Any:
    """NeoX treats ``num-layers`` and ``num_layers`` as one key."""
    return key.replace("-", "_") if isinstance(key, str) else key


def _cut(text: str, limit: int = _MAX_PARSER_MESSAGE) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _StrictLoader(yaml.SafeLoader):
    """A safe loader with bounded depth and aliases that rejects repeated and non-string keys."""

    source = "<yaml>"
    normalize = False

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise ConfigError(
                    f"more than {MAX_ALIASES} aliases (line {mark.line + 1}); a config never needs that many: "
                    "write the values out or split the file",
                    source=self.source,
                )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise ConfigError(
                    f"nested more than {MAX_DEPTH} levels deep (line {mark.line + 1}); flatten the structure",
                    source=self.source,
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        self.flatten_mapping(node)
        out: dict[Any, Any] = {}
        lines: dict[Any, int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise ConfigError(
                    f"line {line}: key {short(key)} is a {type(key).__name__}, not a string; "
                    "keys must be plain names (quote it if it is meant as text)",
                    source=self.source,
                )
            if len(key) > MAX_KEY_CHARS:
                raise ConfigError(
                    f"line {line}: key {short(key, 60)} is {len(key)} characters long; keys are short names",
                    source=self.source,
                )
            if self.normalize:
                key = normalize_key(key)
            if key in lines:
                same = "; '-' and '_' are the same in keys" if self.normalize else ""
                raise ConfigError(
                    f"appears twice (lines {lines[key]} and {line}{same}); remove one of them",
                    source=self.source,
                    key=short(key, 60).strip("'\""),
                )
            lines[key] = line
            out[key] = self.construct_object(value_node, deep=True)
        return out


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _StrictLoader.construct_mapping)


def _expanded_size(root: yaml.Node, source: str) -> int:
    """Nodes the document stands for with every alias followed; refuses recursive anchors and bombs."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise ConfigError("an anchor refers to itself (recursive alias); remove the cycle", source=source)
        active.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        active.discard(key)
        sizes[key] = total
        if total > MAX_EXPANDED_NODES:
            raise ConfigError(
                f"its aliases expand to more than {MAX_EXPANDED_NODES} values (an alias bomb?); "
                "write the values out instead of nesting aliases",
                source=source,
            )
        return total

    return size(root)


def read_text_file(path: str | os.PathLike, *, what: str = "file", hint: str = "") -> str:
    """A small UTF-8 text file's contents; ConfigError naming ``path`` when it is missing, not a regular
    file, too large, binary, not UTF-8 or empty. ``what`` names it (``topology file``), ``hint`` says what
    to give instead."""
    source = os.fspath(path)
    fix = f"; {hint}" if hint else ""
    try:
        st = os.stat(source)
    except FileNotFoundError:
        raise ConfigError(f"{what} does not exist (file not found){fix}", source=source) from None
    except OSError as exc:
        raise ConfigError(f"{what} cannot be read ({exc.strerror}){fix}", source=source) from None
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"is a directory, expected a {what}{fix}", source=source)
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(
            f"is not a regular file (a device, pipe or socket), expected a {what}{fix}", source=source
        )
    if st.st_size > MAX_FILE_BYTES:
        raise ConfigError(
            f"is {st.st_size} bytes, more than the {MAX_FILE_BYTES >> 20} MiB a {what} may have; "
            "is it the right file?",
            source=source,
        )
    try:
        with open(source, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{what} cannot be read ({exc.strerror}){fix}", source=source) from None
    if b"\x00" in raw:
        raise ConfigError(
            f"is a binary file (it holds NUL bytes), expected a {what} in UTF-8 text{fix}", source=source
        )
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"is not UTF-8 text (byte {exc.start} is {raw[exc.start]:#04x}); save it as UTF-8{fix}",
            source=source,
        ) from None
    if not text.strip():
        raise ConfigError(f"is empty, expected a {what}{fix}", source=source)
    return text


def load_yaml_text(text: str, source: str = "<yaml>", *, normalize_keys: bool = False) -> Any:
    """Parse YAML text with the strict loader (see the module docstring); ``source`` names it in errors."""
    loader = _StrictLoader(text)
    loader.source = source
    loader.normalize = normalize_keys
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, source)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {_cut(exc)}", source=source) from None
    except RecursionError:
        raise ConfigError(
            f"nested too deeply; flatten the structure (at most {MAX_DEPTH} levels)", source=source
        ) from None
    finally:
        loader.dispose()


def _json_depth(value: Any, limit: int) -> int:
    stack = [(value, 1)]
    deepest = 0
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


def load_json_text(text: str, source: str = "<json>") -> Any:
    """Parse JSON as strictly as YAML: no repeated keys, no NaN/Infinity, bounded depth."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise ConfigError("appears twice; remove one of them", source=source, key=short(key, 60))
            out[key] = value
        return out

    def constant(name: str) -> Any:
        raise ConfigError(f"{name} is not a number JSON allows; give a finite value", source=source)

    try:
        value = json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not valid JSON: {_cut(exc)}", source=source) from None
    except RecursionError:
        raise ConfigError(f"nested too deeply (at most {MAX_DEPTH} levels)", source=source) from None
    if _json_depth(value, MAX_DEPTH) > MAX_DEPTH:
        raise ConfigError(f"nested more than {MAX_DEPTH} levels deep; flatten the structure", source=source)
    return value


def load_yaml_file(
    path: str | os.PathLike, *, what: str = "YAML file", hint: str = "", normalize_keys: bool = False
) -> Any:
    """Read one YAML (or, by a ``.json`` suffix, JSON) file strictly: see the module docstring. A file
    whose document is empty (only comments) is an error too."""
    source = os.fspath(path)
    text = read_text_file(source, what=what, hint=hint)
    if source.endswith(".json"):
        return load_json_text(text, source)
    data = load_yaml_text(text, source, normalize_keys=normalize_keys)
    if data is None:
        raise ConfigError(f"holds no YAML document (only comments?), expected a {what}", source=source)
    return data


def read_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """One NeoX config file as a dict with normalized keys; ConfigError when unreadable or not a mapping."""
    source = os.fspath(path)
    data = load_yaml_file(
        source,
        what="NeoX YAML config",
        hint="give the path of a NeoX YAML config (see configs/)",
        normalize_keys=True,
    )
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
    if not value.strip():
        return value
    try:
        return load_yaml_text(value, OVERRIDE_SOURCE)
    except ConfigError:
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
