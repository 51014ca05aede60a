"""Errors a user can act on.

Every user-facing error in zerotopo is a :class:`ZerotopoError`: the CLI prints its message and exits
with status 2 instead of showing a traceback. Messages say what was given, what was expected and how to
fix it.
"""

from __future__ import annotations


class ZerotopoError(Exception):
    """An error caused by the user's input or environment, with a message that says how to fix it."""


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
