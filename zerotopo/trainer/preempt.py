"""Preemption: a signal asks the run to save at the next step boundary and exit with :data:`EXIT_PREEMPTED`.

Slurm sends SIGTERM before a preemption or the time limit, and the signal ``--signal=USR1@<seconds>``
names ahead of it; every rank of an ``srun`` step gets it. A rank only records the signal in its handler;
at the end of each step the ranks agree on it (one small all-reduce on a CPU group, so the device is never
waited on), every rank saves the same step, and the run exits with :data:`EXIT_PREEMPTED`, which a batch
script can turn into ``scontrol requeue`` (launch/frontier.sbatch). Ranks of the local launcher handle
SIGUSR1 only (the launcher forwards it to them); SIGTERM to the local launcher still stops every rank at
once.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

import torch
import torch.distributed as dist

from zerotopo.errors import ZerotopoError

EXIT_PREEMPTED = 75
"""Exit status of a run that saved on a preemption signal and stopped (``EX_TEMPFAIL``: try again)."""


class Preempted(ZerotopoError):
    """The run saved a checkpoint on a preemption signal and stopped; start it again to continue."""

    exit_code = EXIT_PREEMPTED


class Preemption:
    """The signals a rank turns into a save at the next step boundary, and the ranks' agreement on them."""

    def __init__(self, signals: tuple[int, ...]) -> None:
        self.signum = 0
        self.saved_at: int | None = None
        self.stopped_by = 0
        """The signal the ranks agreed to stop on (0: the run was not stopped)."""
        self._old: dict[int, Any] = {}
        self._group: Any = None
        self._work: Any = None
        self._flag = torch.zeros(1, dtype=torch.int64)
        if threading.current_thread() is threading.main_thread():
            for s in signals:
                self._old[s] = signal.signal(s, self._record)

    def _record(self, signum: int, frame: Any) -> None:
        self.signum = self.signum or signum  # the first signal names the cause

    def agreed(self) -> int:
        """Collective, once per step: the signal any rank had received by the end of the step before
        (0: none), the same on every rank.

        [Note: preemption flag off the step path] The all-reduce of a step's flag is started at the end of
        that step and read at the end of the next one, so it runs on gloo's thread while the step computes
        and the step never waits for the ranks to meet: a stop comes one step later than the signal, which
        costs one step of a preemption's grace time (Slurm gives tens of seconds)."""
        if not dist.is_initialized():
            return self.signum
        if self._group is None:
            # A group of its own, on the host (gloo): agreeing on a flag must not make the host wait on a
            # GPU stream, nor interleave with collectives the engine's threads issue on other groups.
            self._group = dist.new_group(backend="gloo")
        agreed = self.settle()
        self._flag = torch.tensor([self.signum], dtype=torch.int64)
        self._work = dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        return agreed

    def settle(self) -> int:
        """Wait for the all-reduce :meth:`agreed` started, if any; its agreed signal (0: none)."""
        if self._work is None:
            return 0
        self._work.wait()
        self._work = None
        return int(self._flag.item())

    def restore(self) -> None:
        """Put back the handlers that were there before."""
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old.clear()


def preemption_signals(launched_externally: bool) -> tuple[int, ...]:
    """SIGTERM and SIGUSR1 under a launcher (srun, mpiexec, torchrun); SIGUSR1 alone under the local one."""
    if launched_externally:
        return (signal.SIGTERM, signal.SIGUSR1)
    return (signal.SIGUSR1,)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
