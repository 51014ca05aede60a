"""docs/configs.md is generated from the NeoXArgs field docstrings and must be current."""

from __future__ import annotations

import dataclasses
import os

from zerotopo.config.neox import NeoXArgs
from zerotopo.config.reference import field_docstrings, render

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_field_documented():
    docs = field_docstrings(NeoXArgs)
    missing = [f.name for f in dataclasses.fields(NeoXArgs) if not docs.get(f.name)]
    assert missing == []


def test_docs_configs_md_is_current():
    with open(os.path.join(ROOT, "docs", "configs.md"), encoding="utf-8") as f:
        current = f.read()
    assert current == render(), "regenerate: python -m zerotopo.config.reference > docs/configs.md"
