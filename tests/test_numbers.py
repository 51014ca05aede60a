"""The one check for numbers from user input: what it accepts, what it refuses, and the words it refuses with."""

from __future__ import annotations

import math

import pytest

from zerotopo.errors import ConfigError
from zerotopo.placement.numbers import PROBLEMS, number


@pytest.mark.parametrize(
    ("value", "kwargs", "expected"),
    [
        (3, {}, 3.0),
        (3.0, {"integer": True}, 3),
        ("6e-4", {"strings": True}, 6e-4),
        (" 12 ", {"strings": True, "integer": True}, 12),
        (0, {"minimum": 0}, 0.0),
        (5, {"maximum": 5, "integer": True}, 5),
        (2**80, {"integer": True}, 2**80),
    ],
)
def test_accepts_numbers_and_returns_the_asked_type(value, kwargs, expected):
    out = number(value, "x", **kwargs)
    assert out == expected and type(out) is type(expected)


@pytest.mark.parametrize(
    ("value", "kwargs", "problem"),
    [
        (True, {}, "bool"),
        (False, {"integer": True}, "bool"),
        ("3", {}, "type"),  # text only where the caller says so
        ("three", {"strings": True}, "type"),
        ("3.5", {"strings": True, "integer": True}, "type"),
        ("٣", {"strings": True, "integer": True}, "type"),  # a non-ASCII digit is not a number a user typed
        ("1" * 200, {"strings": True, "integer": True}, "type"),
        ([1], {}, "type"),
        (None, {}, "type"),
        (math.nan, {}, "finite"),
        ("inf", {"strings": True}, "finite"),
        (10**400, {}, "finite"),  # no float holds it
        (2.5, {"integer": True}, "whole"),
        (0, {"above": 0}, "low"),
        (-1, {"minimum": 0}, "low"),
        (6, {"maximum": 5}, "high"),
    ],
)
def test_each_problem_has_its_own_message_key(value, kwargs, problem):
    messages = {p: f"<{p}>" for p in PROBLEMS}
    with pytest.raises(ValueError, match=f"^<{problem}>$"):
        number(value, "x", messages=messages, **kwargs)


def test_a_boolean_falls_back_to_the_type_message():
    with pytest.raises(ValueError, match="^flag: expected an integer, found True$"):
        number(True, "flag", integer=True)


def test_default_messages_name_the_input_the_value_and_the_rule():
    with pytest.raises(ValueError, match=r"^--nodes: expected a value > 0, found -2$"):
        number(-2, "--nodes", above=0)
    with pytest.raises(ValueError, match=r"^lr: expected a value >= 0, found -0\.5$"):
        number("-0.5", "lr", strings=True, minimum=0)
    with pytest.raises(ValueError, match=r"^n: expected a value <= 8, found 9$"):
        number(9, "n", maximum=8)
    with pytest.raises(ValueError, match=r"^n: expected a whole number, found 1\.5$"):
        number(1.5, "n", integer=True)


def test_the_callers_error_class_and_wording_are_used():
    with pytest.raises(ConfigError, match="tiers.fanout") as info:
        number(
            "two",
            messages={"type": "expected {kind} for {what}, found {found}"},
            what="tiers.fanout",
            integer=True,
            error=lambda message: ConfigError(message, source="t.yaml", key="tiers.fanout"),
        )
    assert "expected an integer for tiers.fanout, found 'two'" in str(info.value)
    assert info.value.source == "t.yaml"


def test_a_long_value_is_shown_shortened():
    with pytest.raises(ValueError) as info:
        number("x" * 10_000, "key")
    assert len(str(info.value)) < 200


def test_one_template_words_every_problem():
    for value in (True, "x", math.inf, 0):
        with pytest.raises(ValueError, match=r"^bad k: "):
            number(value, "k", above=0, messages="bad {what}: {found}")


def test_whole_floats_can_be_refused_where_only_an_int_is_right():
    assert number(256.0, "quant_block", integer=True) == 256
    with pytest.raises(ValueError, match="expected an integer, found 256.0"):
        number(256.0, "quant_block", integer=True, whole_floats=False)
