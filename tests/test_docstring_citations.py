"""Docstrings and comments cite papers by authors, title and id, and documents by their path in this
repository: none names a file a clone does not have (the papers' local copies, the design notes), and
none quotes a one-off timing."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "zerotopo"
OUTSIDE = re.compile(r"papers/0\d|DESIGN\.md")
TIMING = re.compile(r"median of \d|took \d+(\.\d+)? ?s\b")


def _texts(path: Path) -> list[tuple[int, str]]:
    """Every docstring and comment of ``path`` with its line."""
    source = path.read_text()
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append((getattr(node, "lineno", 1), doc))
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
    return out


def test_no_docstring_or_comment_cites_a_file_outside_the_repository():
    found = [
        f"{path.relative_to(PKG.parent)}:{line}: {pattern.search(text).group(0)}"
        for path in sorted(PKG.rglob("*.py"))
        for line, text in _texts(path)
        for pattern in (OUTSIDE, TIMING)
        if pattern.search(text)
    ]
    assert found == []
