"""The strict YAML reader every config file goes through."""

from __future__ import annotations

import os

import pytest

from zerotopo.errors import ConfigError, short
from zerotopo.placement.yamlio import MAX_ALIASES, load_yaml_file, load_yaml_text, read_yaml


def test_plain_yaml_reads(tmp_path):
    p = tmp_path / "a.yaml"
    p.write_text("name: x\nlist: [1, 2]\nnested: {a: {b: 3}}\nanchor: &v 5\nuse: *v\n")
    assert load_yaml_file(p) == {
        "name": "x",
        "list": [1, 2],
        "nested": {"a": {"b": 3}},
        "anchor": 5,
        "use": 5,
    }


@pytest.mark.parametrize(
    "content, match",
    [
        (b"\x00\x01\x02", "binary"),
        ("café".encode("latin-1"), "not UTF-8"),
        (b"", "is empty"),
        (b"# only a comment\n", "no YAML document"),
        (b"a: 1\na: 2\n", "appears twice"),
        (b"? [a, b]\n: 1\n", "not a string"),
        (b"1: x\n", "not a string"),
        (b"a: " + b"[" * 100 + b"]" * 100, "nested more than"),
        (b"a: &a [*a]\n", "refers to itself"),
        (b"a: !!python/object/apply:os.system ['true']\n", "not valid YAML"),
        (b"a: [\n", "not valid YAML"),
    ],
)
def test_defects_name_the_file(tmp_path, content, match):
    p = tmp_path / "bad.yaml"
    p.write_bytes(content)
    with pytest.raises(ConfigError, match=match) as info:
        load_yaml_file(p)
    assert str(p) in str(info.value)


def test_alias_bomb_is_refused_quickly():
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    with pytest.raises(ConfigError, match="alias bomb"):
        load_yaml_text("\n".join(lines), "bomb.yaml")
    many = "a: &a 1\nb: [" + ", ".join(["*a"] * (MAX_ALIASES + 1)) + "]\n"
    with pytest.raises(ConfigError, match="aliases"):
        load_yaml_text(many, "many.yaml")


def test_not_a_file(tmp_path):
    with pytest.raises(ConfigError, match="is a directory"):
        load_yaml_file(tmp_path)
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_yaml_file(fifo)
    with pytest.raises(ConfigError, match="does not exist"):
        load_yaml_file(tmp_path / "none.yaml")


def test_neox_keys_normalize_and_collide(tmp_path):
    p = tmp_path / "c.yml"
    p.write_text("num-layers: 2\nnum_layers: 3\n")
    with pytest.raises(ConfigError, match="'-' and '_' are the same"):
        read_yaml(p)


def test_json_is_as_strict(tmp_path):
    p = tmp_path / "t.json"
    p.write_text('{"a": NaN}')
    with pytest.raises(ConfigError, match="NaN"):
        load_yaml_file(p)
    p.write_text('{"a": 1, "a": 2}')
    with pytest.raises(ConfigError, match="appears twice"):
        load_yaml_file(p)


def test_short_cuts_values():
    bomb: list = ["x"] * 10
    for _ in range(30):
        bomb = [bomb] * 10  # 10**30 leaves, shared
    assert len(short(bomb)) <= 80
    assert len(short("y" * 10**6)) <= 80
