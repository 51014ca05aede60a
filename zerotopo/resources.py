"""Where the built-in topologies (``topologies/*.yaml``) and configs (``configs/*.yml``) live.

[Note: built-in files] The files are kept once, at the repository root, where users of a checkout pass
them by path (``configs/tiny.yml``). The wheel build copies them into the package as
``zerotopo/builtin/topologies`` and ``zerotopo/builtin/configs`` (``setup.py``), so an installed
zerotopo finds them through :mod:`importlib.resources` from any directory. A checkout or an editable
install has no ``builtin/`` inside the package and falls back to the repository root.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from zerotopo.errors import ConfigError

#: kind -> file suffixes, in order of preference
KINDS = {"topologies": (".yaml", ".yml"), "configs": (".yml", ".yaml")}


def builtin_dir(kind: str) -> Path:
    """The directory of the built-in ``kind`` files (``topologies`` or ``configs``)."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind of built-in file {kind!r}; expected one of {', '.join(KINDS)}")
    packaged = resources.files("zerotopo") / "builtin" / kind
    if packaged.is_dir():
        # A regular (not zipped) install: the traversable is a real directory.
        return Path(str(packaged))
    return Path(__file__).resolve().parent.parent / kind


def builtin_names(kind: str) -> list[str]:
    """Names (file stems) of the built-in ``kind`` files."""
    d = builtin_dir(kind)
    return sorted({p.stem for suffix in KINDS[kind] for p in d.glob(f"*{suffix}")})


def builtin_file(kind: str, name: str) -> Path | None:
    """The built-in file called ``name`` (no suffix), or None."""
    for suffix in KINDS[kind]:
        path = builtin_dir(kind) / f"{name}{suffix}"
        if path.is_file():
            return path
    return None


def resolve_config_paths(specs: list[str] | tuple[str, ...], *, source: str = "config") -> list[str]:
    """NeoX config arguments as paths: an existing file passes through, a bare name (``neox-20b``) is a
    built-in config; anything else is an error listing the built-ins."""
    out = []
    for spec in specs:
        path = Path(spec)
        if path.is_file():
            out.append(str(path))
            continue
        found = builtin_file("configs", spec) if not path.suffix and "/" not in spec else None
        if found is None:
            names = ", ".join(builtin_names("configs"))
            raise ConfigError(
                f"{spec!r} is neither a config file nor a built-in config ({names})", source=source
            )
        out.append(str(found))
    return out
