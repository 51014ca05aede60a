"""Preemption: a signal asks the run to save at the next step boundary and exit with :data:`EXIT_PREEMPTED`.

Slurm sends SIGTERM before a preemption or the time limit, and the signal ``--signal=USR1@<seconds>``
names ahead of it; every rank of an ``srun`` step gets it, as every process of a container or a systemd
unit gets SIGTERM when it is stopped. A rank only records the signal in its handler; at the end of each
step the ranks agree on it (one small all-reduce on a CPU group, so the device is never waited on), every
rank saves the same step, and the run exits with :data:`EXIT_PREEMPTED`, which a batch script can turn
into ``scontrol requeue`` (launch/frontier.sbatch). Under every launcher a rank handles SIGTERM and
SIGUSR1; the local launcher passes both on to its ranks (:mod:`zerotopo.launch.spawn`).

[Note: a second signal during the save] Once a rank has recorded a preemption signal, a second SIGTERM
(or SIGINT, a Ctrl-C) lets the save finish and says so; a third stops the rank at once, without saving
(:data:`SIGNALS_TO_ABORT`). Schedulers repeat SIGTERM, and a user presses Ctrl-C twice, well before the
save of a large model has finished.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from zerotopo.errors import ZerotopoError

EXIT_PREEMPTED = 75
"""Exit status of a run that saved on a preemption signal and stopped (``EX_TEMPFAIL``: try again)."""
SIGNALS_TO_ABORT = 3
"""Stop signals (SIGTERM, SIGUSR1, SIGINT once one of them came) after which a rank stops without saving."""


class Preempted(ZerotopoError):
    """The run saved a checkpoint on a preemption signal and stopped; start it again to continue."""

    exit_code = EXIT_PREEMPTED


class Preemption:
    """The signals a rank turns into a save at the next step boundary, and the ranks' agreement on them."""

    def __init__(self, signals: tuple[int, ...], *, counts: bool = True) -> None:
        """``signals``: the signals that stop the run; ``counts``: this process counts repeated signals
        itself (a rank under srun, mpiexec or torchrun; under the local launcher the launcher counts, as
        a signal to the whole process group reaches the ranks twice, directly and forwarded)."""
        self.signum = 0
        self._counts = counts
        self.saved_at: int | None = None
        self.saved_to: str | None = None
        """The checkpoint directory the stop saved (None: nothing was saved)."""
        self.stopped_by = 0
        """The signal the ranks agreed to stop on (0: the run was not stopped)."""
        self.received = 0
        """Stop signals this process received (see [Note: a second signal during the save])."""
        self.on_abort: list[Callable[[], None]] = []
        """Run before the process exits on the third signal (the save directory's lock is released)."""
        self._old: dict[int, Any] = {}
        self._group: Any = None
        self._work: Any = None
        self._flag = torch.zeros(1, dtype=torch.int64)
        if threading.current_thread() is threading.main_thread():
            for s in signals:
                self._old[s] = signal.signal(s, self._record)

    def _record(self, signum: int, frame: Any) -> None:
        self.signum = self.signum or signum  # the first signal names the cause
        if not self._counts:
            return
        self.received += 1
        if self.received == 1 and signal.SIGINT not in self._old:
            # from now on a Ctrl-C counts as the second or third signal instead of a traceback in the save
            self._old[signal.SIGINT] = signal.signal(signal.SIGINT, self._record)
        elif self.received == SIGNALS_TO_ABORT:
            self._abort(signum)
        elif self.received > 1:
            print(
                f"{signal_name(signum)} received again: the run finishes its save and stops; one more "
                "stop signal stops it at once without saving",
                file=sys.stderr,
                flush=True,
            )

    def _abort(self, signum: int) -> None:
        print(
            f"{signal_name(signum)} received a third time: stopping now, without saving",
            file=sys.stderr,
            flush=True,
        )
        for fn in self.on_abort:
            with contextlib.suppress(Exception):  # the process exits whatever a clean-up hook does
                fn()
        os._exit(128 + signum)

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


def preemption_signals(launched_externally: bool = True) -> tuple[int, ...]:
    """SIGTERM and SIGUSR1, under every launcher (the local one passes both on to its ranks)."""
    return (signal.SIGTERM, signal.SIGUSR1)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
