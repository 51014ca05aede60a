"""What every section of the config tree shares: a field with its check (:func:`setting`), a nested
block (:func:`block`), and :class:`Section`, which records where each field's value came from so that
an error names the user's key and file."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from zerotopo.config import checks as c

#: Other spellings of the three dtypes.
DTYPE_ALIASES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def setting(check: c.Check, default: Any = None) -> Any:
    """A config field with the check of its value."""
    return field(default=default, metadata={"check": check})


def block(factory: type) -> Any:
    """A field that is a nested block (a dataclass of its own checked fields)."""
    return field(default_factory=factory, metadata={"block": True})


@dataclass(frozen=True)
class Section:
    """What every section has: the record of which fields were given, and where."""

    NAME: ClassVar[str] = ""

    origin: dict[str, tuple[str, str | None]] = field(
        default_factory=dict, compare=False, repr=False, kw_only=True
    )
    """``{field: (its key in the files read, the file or ``--set`` that set it, or None)}``, filled by a
    reader of config files so that errors name the user's key and file; empty for a config built in code."""

    def where(self, name: str) -> dict[str, str | None]:
        """``source`` and ``key`` of a :class:`ConfigError` about field ``name``: the file that set it (or
        None) and its key in the files read, else its path in the tree."""
        key, source = self.origin.get(name, (None, None))
        return {"source": source, "key": key or f"{self.NAME}.{name}"}

    def is_given(self, name: str) -> bool:
        """Whether a file or ``--set`` set field ``name``."""
        return self.where(name)["source"] is not None

    @property
    def sources(self) -> dict[str, str]:
        """``{key as written: file}`` of the fields a file or ``--set`` set."""
        return {key: source for key, source in self.origin.values() if source is not None}

    def check(self) -> None:
        """The rules between this section's fields (none by default)."""
