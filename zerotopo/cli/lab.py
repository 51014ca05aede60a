"""How the ``zerotopo`` command finds the lab (the ``zerotopo_lab`` package: the head-to-head benchmark,
DeepSpeed's cost presets, the papers' bands), which the library never imports.

The lab names its command hooks in the ``zerotopo.lab`` entry point group (``commands``: a module with
``add_bench_targets``, ``run_bench``, ``cost_presets`` and ``validate_papers``); a source tree run without
installing (the package beside ``zerotopo/`` on ``PYTHONPATH``) has no entry points, so the hooks' module
is then looked up by name. Without the lab every caller says how to get it (:data:`INSTALL`).
"""

from __future__ import annotations

import importlib
from functools import lru_cache
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

from zerotopo.errors import ConfigError

GROUP = "zerotopo.lab"
"""The entry point group the lab registers its command hooks under."""
HOOKS = "zerotopo_lab.cli"
"""The hooks' module, for a source tree without installed entry points."""
INSTALL = "pip install 'zerotopo[lab]'"
"""What installs the lab and its dependencies."""


@lru_cache(maxsize=1)
def load() -> ModuleType | None:
    """The lab's command hooks, or None when the lab is not installed."""
    hooks = [ep for ep in entry_points(group=GROUP) if ep.name == "commands"]
    try:
        return hooks[0].load() if hooks else importlib.import_module(HOOKS)
    except ModuleNotFoundError as exc:
        if exc.name and HOOKS.startswith(exc.name):
            return None  # the lab itself is missing (not one of its own imports)
        raise


def require(what: str) -> ModuleType:
    """The lab's hooks, or a :class:`ConfigError` saying that ``what`` needs the lab and how to get it."""
    lab = load()
    if lab is None:
        raise ConfigError(f"{what} comes with the lab, which is not installed: {INSTALL}")
    return lab


def cost_presets() -> dict[str, Any]:
    """Other frameworks' cost presets, name -> (Plan, ScheduleModel); empty without the lab."""
    lab = load()
    return {} if lab is None else lab.cost_presets()
