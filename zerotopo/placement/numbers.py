"""One check for numbers read from user input (YAML values, command-line flags, environment variables).

:func:`number` refuses booleans (``True`` is an ``int`` to Python, never a count to a user), parses text
only where the caller says strings are allowed, and checks finiteness, wholeness and bounds in that order.
Each way a value can fail has a message key (:data:`PROBLEMS`); a caller keeps its own wording by passing
templates for the keys it cares about, and its own error class through ``error``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping
from typing import Any

from zerotopo.errors import short

#: The ways a value can fail, in the order they are checked. ``bool`` falls back to ``type``'s template.
PROBLEMS = ("bool", "type", "finite", "whole", "low", "high")

#: Default templates. Fields: ``what`` (the input's name), ``found`` (the value, shortened), ``kind``
#: ("an integer" or "a number"), ``minimum``/``above``/``maximum`` (the bounds given) and ``rule`` (the
#: lower bound as ``> 0`` or ``>= 0``). Range problems show the value as parsed, the others as given.
MESSAGES: Mapping[str, str] = {
    "type": "{what}: expected {kind}, found {found}",
    "finite": "{what}: expected a finite number, found {found}",
    "whole": "{what}: expected a whole number, found {found}",
    "low": "{what}: expected a value {rule}, found {found}",
    "high": "{what}: expected a value <= {maximum}, found {found}",
}

#: Longest text parsed as a number: longer text is a mistake, and int() on it costs quadratic time.
MAX_TEXT = 100

_MAX_FLOAT = int(sys.float_info.max)


def _parse(text: str, integer: bool) -> int | float | None:
    s = text.strip()
    if not s or len(s) > MAX_TEXT or not s.isascii():
        return None
    try:
        return int(s) if integer else float(s)
    except ValueError:
        return None


def _problem(value: Any, integer: bool, strings: bool, whole_floats: bool) -> tuple[str | None, Any]:
    """The first problem of ``value`` as a number (None when it is one) and the value, parsed from text."""
    if isinstance(value, bool):
        return "bool", value
    if isinstance(value, str) and strings:
        parsed = _parse(value, integer)
        if parsed is None:
            return "type", value
        value = parsed
    if not isinstance(value, (int, float)) or (integer and not whole_floats and isinstance(value, float)):
        return "type", value
    if isinstance(value, int):
        # an int is whole, and finite unless it is too large for the float the caller asked for
        return ("finite" if not integer and abs(value) > _MAX_FLOAT else None), value
    if not math.isfinite(value):
        return "finite", value
    if integer and not value.is_integer():
        return "whole", value
    return None, value


def number(
    value: Any,
    what: str = "value",
    *,
    integer: bool = False,
    strings: bool = False,
    whole_floats: bool = True,
    minimum: float | None = None,
    above: float | None = None,
    maximum: float | None = None,
    messages: Mapping[str, str] | str | None = None,
    error: Callable[[str], Exception] = ValueError,
) -> Any:
    """``value`` as an ``int`` (``integer=True``: a whole float counts) or a ``float``, or ``error(message)``.

    ``strings`` lets text such as ``"6e-4"`` (which YAML 1.1 reads as a string) or an environment variable
    stand for its number; ``whole_floats=False`` refuses ``3.0`` where an integer is asked for, as
    the type it is not. ``minimum`` and ``maximum`` are inclusive bounds, ``above`` an exclusive lower one.
    ``messages`` maps keys of :data:`PROBLEMS` to templates (see :data:`MESSAGES` for the fields); one
    template alone words every problem.
    """
    problem, parsed = _problem(value, integer, strings, whole_floats)
    if problem is None:
        if (minimum is not None and parsed < minimum) or (above is not None and parsed <= above):
            problem = "low"
        elif maximum is not None and parsed > maximum:
            problem = "high"
    if problem is None:
        return int(parsed) if integer else float(parsed)
    given = dict.fromkeys(PROBLEMS, messages) if isinstance(messages, str) else messages or {}
    table = {**MESSAGES, **given}
    template = table.get(problem) or table["type"]
    rule = f"> {above:g}" if above is not None else f">= {minimum:g}" if minimum is not None else ""
    shown = short(parsed if problem in ("low", "high") else value)
    raise error(
        template.format(
            what=what,
            found=shown,
            kind="an integer" if integer else "a number",
            minimum=minimum,
            above=above,
            maximum=maximum,
            rule=rule,
        )
    )
