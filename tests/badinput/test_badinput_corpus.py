"""The fast cases of the bad-input corpus, in-process: each ends in one clean error (tests/badinput/corpus.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from corpus import CASES, OUTCOMES, classify  # noqa: E402
from runner import run_in_process  # noqa: E402

FAST = [c for c in CASES if c.fast]


def test_corpus_is_broad():
    assert len(CASES) >= 150
    assert len({c.name for c in CASES}) == len(CASES), "case names must be unique"
    categories = {c.category.split(":")[0] for c in CASES}
    assert {
        "yaml",
        "topology-value",
        "neox-value",
        "plan-value",
        "calibration-value",
        "flag",
        "data",
        "launcher-env",
    } <= categories


def test_classify_tells_outcomes_apart(tmp_path):
    marker = tmp_path / "m"
    assert classify(2, "zerotopo topo: error: x.yaml: bad", None) == "clean"
    assert classify(1, "Traceback (most recent call last):\n ...", None) == "traceback"
    assert classify(1, "zerotopo x: internal error: TypeError", None) == "traceback"
    assert classify(0, "OK", None) == "accepted"
    assert classify(None, "", None) == "hang"
    assert classify(2, "error: " + "x" * 100_000, None) == "traceback"  # unbounded message
    marker.touch()
    assert classify(2, "error: x", marker) == "executed"
    assert set(OUTCOMES) == {"clean", "traceback", "hang", "accepted", "executed"}


@pytest.mark.parametrize("case", FAST, ids=[c.name for c in FAST])
def test_bad_input_is_one_clean_error(case, tmp_path):
    outcome, output = run_in_process(case, tmp_path)
    assert outcome == "clean", f"{case.name}: {outcome}\n{output[-3000:]}"
