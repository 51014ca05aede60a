"""Process helpers shared by the tests that start and stop processes."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs; a zombie (exited, not yet reaped) answers ``kill(0)`` but counts dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            # the state follows the command name, which may hold spaces: read after its ") "
            return f.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


#: What a launcher (Slurm, MPI, torchrun, a zerotopo rank) leaves in a process's environment.
LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "PMI_")
LAUNCHER_NAMES = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "ZEROTOPO_EMULATED_NODES",
)  # fmt: skip


def launcher_free_env(*also: str) -> dict[str, str]:
    """This process's environment without any launcher's variables (nor the names in ``also``): a
    command started with it discovers itself as a plain local job, whatever ran the tests."""
    drop = {*LAUNCHER_NAMES, *also}
    return {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES) and k not in drop}
