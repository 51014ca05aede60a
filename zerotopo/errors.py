"""Errors a user can act on.

Every user-facing error in zerotopo is a :class:`ZerotopoError`: the CLI prints its message and exits
with its ``exit_code`` (2: bad input; 1: a failure while running) instead of showing a traceback.
Messages say what was given, what was expected and how to fix it; values quoted in them are cut by
:func:`short` so a hostile file can never make an error message unbounded. docs/errors.md lists the
classes and exit codes.
"""

from __future__ import annotations

import reprlib
from typing import Any

#: Exit status of the ``zerotopo`` command (docs/errors.md).
EXIT_OK = 0
EXIT_FAILURE = 1
"""A run failed while running: a rank crashed, was killed, or hit a bug (traceback in a log file)."""
EXIT_BAD_INPUT = 2
"""Bad input: a file, flag or environment variable is invalid; nothing ran."""
EXIT_INTERRUPTED = 130
"""SIGINT (Ctrl-C): every rank was stopped."""
EXIT_TERMINATED = 143
"""SIGTERM: every rank was stopped."""
EXIT_BROKEN_PIPE = 141
"""The reader of standard output went away (``zerotopo plan ... | head``): 128 + SIGPIPE, the status of
a Unix tool that SIGPIPE stopped."""

#: Longest quoted value in an error message.
SHORT_LIMIT = 80

_repr = reprlib.Repr()
_repr.maxlevel = 3
_repr.maxdict = 4
_repr.maxlist = 4
_repr.maxtuple = 4
_repr.maxset = 4
_repr.maxstring = SHORT_LIMIT
_repr.maxother = SHORT_LIMIT
_repr.maxlong = 40


def short(value: Any, limit: int = SHORT_LIMIT) -> str:
    """``repr(value)`` cut to about ``limit`` characters, without walking all of a huge or deeply nested
    value (a YAML alias bomb prints as a few elements and ``...``)."""
    try:
        text = _repr.repr(value)
    except Exception:  # noqa: BLE001 - a value whose repr fails must still be describable
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ZerotopoError(Exception):
    """An error caused by the user's input or environment, with a message that says how to fix it."""

    exit_code: int = EXIT_BAD_INPUT


class ConfigError(ZerotopoError):
    """A topology, plan or NeoX config file (or flag) is invalid.

    ``source`` names the file (or ``--flag``), ``key`` the dotted key path inside it.
    """

    def __init__(self, message: str, *, source: str | None = None, key: str | None = None):
        self.source = source
        self.key = key
        where = ""
        if source and key:
            where = f"{source}: {key}: "
        elif source:
            where = f"{source}: "
        elif key:
            where = f"{key}: "
        super().__init__(where + message)


class PlanError(ZerotopoError):
    """A sharding plan does not fit the topology or world size."""


class LaunchError(ZerotopoError):
    """The launcher's environment is incomplete or disagrees with the topology."""
