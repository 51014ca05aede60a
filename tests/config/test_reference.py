"""docs/configs.md is generated from the NeoX key table and the config tree's field docstrings and must be
current."""

from __future__ import annotations

import dataclasses
import os

from zerotopo.config.reference import field_docstrings, render
from zerotopo.config.tree import SECTIONS, FP16Config, OptimizerConfig, TrainConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_field_documented():
    missing = []
    for cls in (TrainConfig, *SECTIONS.values(), FP16Config, OptimizerConfig):
        docs = field_docstrings(cls)
        missing += [f"{cls.__name__}.{f.name}" for f in dataclasses.fields(cls) if not docs.get(f.name)]
    assert missing == []


def test_docs_configs_md_is_current():
    with open(os.path.join(ROOT, "docs", "configs.md"), encoding="utf-8") as f:
        current = f.read()
    assert current == render(), "regenerate: python -m zerotopo.config.reference > docs/configs.md"
