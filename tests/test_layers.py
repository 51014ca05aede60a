"""The package's layers (DESIGN.md, "Layers"): data flows down, and no module imports from a layer above
its own. Read from the source with :mod:`ast`, so a function-local import counts as much as a top-level one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "zerotopo"

# Lowest first. A module may import its own layer and any layer below it.
LAYERS: list[tuple[str, ...]] = [
    (
        "errors",
        "fsutil",
        "logs",
        "resources",
        "sizes",
        "dtypes",
    ),  # the foundation: no zerotopo imports but each other
    ("placement",),  # topology, plan, layout, schedule, codecs, volume, shape, yaml reader
    ("launch", "comm", "models", "data"),
    ("config", "engine", "cost"),
    ("checkpoint",),
    ("trainer",),
    ("bench",),
    ("cli",),
    ("__main__",),
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}


def _part(module: str) -> str | None:
    """The top-level part of ``zerotopo.X...`` (None for the package root, which only names a version)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "zerotopo":
                found += [(node.lineno, f"zerotopo.{a.name}") for a in node.names]
            elif node.module.startswith("zerotopo."):
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("zerotopo.")]
    return found


def _sources() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


def test_every_part_of_the_package_has_a_layer():
    parts = {p.relative_to(PKG).parts[0].removesuffix(".py") for p in _sources()}
    parts -= {"__init__"}
    assert parts - set(RANK) == set(), "give each new top-level module or folder a layer in LAYERS"


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(PKG)))
def test_no_import_goes_up_a_layer(path):
    own = path.relative_to(PKG).parts[0].removesuffix(".py")
    if own == "__init__":
        return
    up = []
    for line, module in _imports(path):
        other = _part(module)
        if other is None or other == "__version__" or other == own:
            continue
        if RANK[other] > RANK[own]:
            up.append(f"line {line}: {module} ({other} is above {own})")
    assert not up, f"{path.relative_to(PKG)} imports up a layer:\n" + "\n".join(up)


def test_placement_needs_nothing_but_the_foundation():
    """The placement layer is pure Python: plans are costed and checked without torch.distributed."""
    for path in (PKG / "placement").rglob("*.py"):
        text = path.read_text()
        assert "torch.distributed" not in text, path
        for _, module in _imports(path):
            assert _part(module) in {"placement", "errors", "resources", "__version__"}, (path, module)


# -- the lab beside the library -----------------------------------------------------------------------

LAB = "zerotopo_lab"
#: The one module of the package that names the lab: the command's loader, through an entry point.
LAB_LOADER = PKG / "cli" / "lab.py"


def _lab_imports(path: Path) -> list[str]:
    """Import statements of ``path`` that reach the lab (function-local ones included)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found += [f"line {node.lineno}: {n}" for n in names if n == LAB or n.startswith(LAB + ".")]
    return found


def _lab_names(path: Path) -> list[str]:
    """String constants of ``path`` naming a lab module, docstrings left out (an importlib call by name)."""
    tree = ast.parse(path.read_text(), str(path))
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    return [
        f"line {n.lineno}: {n.value!r}"
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
        and (n.value == LAB or n.value.startswith(LAB + "."))
    ]  # fmt: skip


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(PKG)))
def test_nothing_in_the_package_imports_the_lab(path):
    """The lab (benchmarks, other frameworks' schedules, paper bands) sits beside the library: no module of
    zerotopo imports it, and only the command's loader names it, to find its commands when installed."""
    assert not _lab_imports(path), f"{path.relative_to(PKG)} imports the lab: {_lab_imports(path)}"
    if path != LAB_LOADER:
        assert not _lab_names(path), f"{path.relative_to(PKG)} names a lab module: {_lab_names(path)}"


def test_the_lab_checks_catch_an_import_and_a_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        '"""zerotopo_lab in a docstring is fine."""\n'
        "def f():\n    from zerotopo_lab.bench import compare\n    import zerotopo_lab\n"
        "    return __import__('zerotopo_lab.presets')\n"
    )
    assert len(_lab_imports(bad)) == 2 and len(_lab_names(bad)) == 1
