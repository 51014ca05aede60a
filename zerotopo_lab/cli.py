"""The lab's hooks in the ``zerotopo`` command (found through the ``zerotopo.lab`` entry point,
:mod:`zerotopo.cli.lab`): ``bench compare`` / ``scale`` / ``step``, the DeepSpeed cost presets of
``zerotopo plan --plans`` and ``zerotopo plan --validate papers``."""

from __future__ import annotations

import argparse
import importlib
import json
from types import ModuleType
from typing import Any

#: The ``zerotopo bench`` targets the lab adds.
BENCH_TARGETS = ("compare", "scale", "step")


def _step_module() -> ModuleType | None:
    try:
        return importlib.import_module("zerotopo_lab.bench.step")
    except ImportError:
        return None


def add_bench_targets(sub: Any) -> None:
    """Add ``compare``, ``scale`` and ``step`` to ``zerotopo bench``'s subparsers."""
    compare = sub.add_parser(
        "compare",
        help="zerotopo plans vs DeepSpeed ZeRO-3/hpZ vs FSDP2 on one emulated cluster",
        description="Train one model under every row on the same (emulated) cluster; see docs/bench.md.",
    )
    from zerotopo_lab.bench import compare as compare_module

    compare_module.add_arguments(compare)
    scale = sub.add_parser(
        "scale",
        help="the compare rows at 2-16 emulated nodes on the emulated device clock",
        description="bench compare --regime device-clock at each node count; see docs/bench.md.",
    )
    from zerotopo_lab.bench import scale as scale_module

    scale_module.add_arguments(scale)
    step = sub.add_parser("step", help="time training steps per plan")
    module = _step_module()
    if module is not None:
        module.add_arguments(step)


def run_bench(args: argparse.Namespace) -> int:
    """Run one of :data:`BENCH_TARGETS`."""
    from zerotopo.errors import ConfigError

    if args.bench_target == "compare":
        from zerotopo_lab.bench import compare

        return compare.run(args)
    if args.bench_target == "scale":
        from zerotopo_lab.bench import scale

        return scale.run(args)
    module = _step_module()
    if module is None:
        raise ConfigError(
            "bench step is not available in this installation (zerotopo_lab.bench.step is missing)"
        )
    return int(module.run(args) or 0)


def cost_presets() -> dict[str, Any]:
    """The DeepSpeed cost presets, name -> (Plan, schedule) (:data:`zerotopo_lab.presets.COST_PRESETS`)."""
    from zerotopo_lab.presets import COST_PRESETS

    return dict(COST_PRESETS)


def validate_papers(args: argparse.Namespace) -> int:
    """``zerotopo plan --validate papers``: the papers' figures against the model's bands."""
    from zerotopo_lab import papers

    bands, ranking = papers.validate()
    if args.json:
        print(json.dumps({"bands": [b.to_json() for b in bands], "ranking": ranking.to_json()}, indent=2))
    else:
        print(papers.report(bands, ranking))
    return 0
