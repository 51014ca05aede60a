"""What one training run needs, resolved once from config files, flags and the launcher.

A :class:`TrainJob` is plain data (picklable) so the local emulated cluster can hand it to every
spawned rank; each rank re-reads the config files itself, so ranks launched by ``srun`` and ranks
spawned locally resolve exactly the same run.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zerotopo.config.neox import load_neox_config
from zerotopo.config.tree import TrainConfig
from zerotopo.errors import ConfigError
from zerotopo.placement.plan import Plan, load_plan, plan_from_deepspeed
from zerotopo.placement.topology import Topology, load_topology
from zerotopo.resources import resolve_config_paths

DEFAULT_CONFIG = "tiny"
"""The built-in config a run with no config files trains."""


@dataclass(frozen=True)
class TrainJob:
    """A training run as the user asked for it, before any process group exists."""

    configs: tuple[str, ...] = ()
    """NeoX-style YAML files or built-in config names, merged in order (none: ``tiny``)."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """``--set key=value`` overrides of config keys."""
    topology: str | None = None
    """Topology name or file; else the config's ``topology:``; else ``emulated``."""
    nodes: int | None = None
    """Node count; else the launcher's; else the topology file's."""
    plan: str | None = None
    """Plan preset or file; else the config's ``plan:`` or ``zero_optimization``; else ``zerotopo``."""
    plan_overrides: dict[str, Any] = field(default_factory=dict)
    """Plan fields set by flags (``--sync``, ``--grad-reduce``, ``--prefetch``)."""
    launcher: str = "auto"
    """auto | local | slurm | mpi | torchrun."""
    run_dir: str | None = None
    """Where metrics, plots and checkpoints go (default ``runs/<time>-<plan>``)."""
    progress: bool = True
    """Show a progress bar on rank 0."""
    config_warnings_shown: bool = False
    """The launching process has already shown the config's warnings on the console (local runs): the
    ranks write them to the run's log file only."""
    network_mbit: float | None = None
    """Local runs only: put each emulated node in its own network namespace, nodes joined by links
    shaped to this many Mbit/s (root; see :mod:`zerotopo.launch.netem`)."""
    from_hf: str | None = None
    """A Hugging Face GPT-NeoX directory to start from (its config.json sets the architecture)."""
    save_locked: bool = False
    """The launching process holds the lock of ``save:`` (the local launcher takes it before any rank
    starts): the ranks do not take it again."""

    def config_paths(self) -> list[str]:
        """The config files, built-in names (``neox-125m``) resolved to their paths."""
        return resolve_config_paths(list(self.configs) or [DEFAULT_CONFIG])

    def load_args(self, *, quiet: bool = False) -> TrainConfig:
        with warnings.catch_warnings():
            if quiet:
                warnings.simplefilter("ignore")
            return load_neox_config(self.config_paths(), self.overrides or None)

    def load_topology(self, args: TrainConfig, nodes: int | None = None) -> Topology:
        name = self.topology or args.sharding.topology or "emulated"
        config_nodes = (
            args.sharding.num_nodes if args.sharding.num_nodes and args.sharding.num_nodes > 0 else None
        )
        return load_topology(name, nodes=self.nodes or nodes or config_nodes)

    def load_plan(self, args: TrainConfig) -> Plan:
        if self.plan is not None:
            plan = load_plan(self.plan, source="--plan")
        elif args.sharding.plan is not None:
            plan = load_plan(args.sharding.plan, source=args.sharding.where("plan")["source"] or "config")
        elif args.sharding.zero_optimization is not None:
            plan = plan_from_deepspeed(
                args.sharding.zero_optimization,
                source=args.sharding.where("zero_optimization")["source"] or "zero_optimization",
            )
        else:
            plan = load_plan("zerotopo")
        from dataclasses import replace

        if self.plan_overrides:
            try:
                plan = replace(plan, **self.plan_overrides)
                plan._validate_options()
            except (TypeError, ValueError) as exc:
                raise ConfigError(str(exc), source="plan flags") from None
        if plan.grad_dtype is None:
            # what DeepSpeed gives this config: gradients in the model dtype unless data_types says fp32
            plan = replace(plan, grad_dtype=args.precision.grad_dtype)
        return plan

    def resolve_run_dir(self, plan_name: str) -> Path:
        if self.run_dir:
            return Path(self.run_dir)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return Path(os.environ.get("ZEROTOPO_RUNS", "runs")) / f"{stamp}-{plan_name}"
