"""Starting zerotopo under a launcher: rank discovery (srun, mpiexec, torchrun, local), device binding,
the rank's topological index, and advice on known-bad settings."""

from zerotopo.launch.advice import warnings_for
from zerotopo.launch.discovery import (
    RankInfo,
    check_against_topology,
    detect_launcher,
    discover,
    init_distributed,
    topological_index,
)
from zerotopo.launch.hostlist import expand_hostlist, first_host, parse_tasks_per_node

__all__ = [
    "RankInfo",
    "check_against_topology",
    "detect_launcher",
    "discover",
    "expand_hostlist",
    "first_host",
    "init_distributed",
    "parse_tasks_per_node",
    "topological_index",
    "warnings_for",
]
