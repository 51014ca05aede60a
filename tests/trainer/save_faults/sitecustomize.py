"""Fault injection into the saves of the ranks a test starts, kept out of the package.

A test puts this directory first on ``PYTHONPATH`` and sets :data:`FAULT_ENV` (see
``tests/trainer/save_faults/__init__.py``); every interpreter that starts then imports this module and
patches the checkpoint writer: a rank spawned as a new interpreter, or the fork server a new launcher
process starts, whose forked ranks inherit the patch:

- ``<step>:write`` kills rank 0 once its shards of ``step`` are written, before any rename;
- ``<step>:rename`` kills rank 0 after ``step_<step>`` is renamed into place, before ``latest`` moves;
- ``<step>:<phase>:<who>`` stops the save of ``step`` as it reaches ``phase`` (one of
  ``zerotopo.checkpoint.store.SAVE_PHASES``): ``who`` is a rank number (that rank alone is killed) or
  ``job`` (the rank that gets there kills the launching process and itself; the other ranks die with
  the launcher).

The launching process is the first interpreter that loads this module: it records its pid in
:data:`LAUNCHER_ENV`, which its fork server and ranks inherit (a forked rank's parent is the fork
server, not the launcher).
"""

from __future__ import annotations

import os
import signal

FAULT_ENV = "ZEROTOPO_FAULT_IN_SAVE"
LAUNCHER_ENV = "ZEROTOPO_FAULT_LAUNCHER_PID"


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _install(step: str, where: str) -> None:
    import torch.distributed as dist

    from zerotopo.checkpoint import dcpio, store

    if where == "write":
        write_data = dcpio.SafeWriter.write_data

        def write_then_die(self, plan, planner):
            fut = write_data(self, plan, planner)
            if dist.get_rank() == 0 and os.path.basename(str(self.path)).startswith(f".step_{step}.tmp-"):
                _kill()
            return fut

        dcpio.SafeWriter.write_data = write_then_die
    elif where == "rename":
        write_text_atomic = store.write_text_atomic

        def die_before_latest(path, text, **kwargs):
            if os.path.basename(path) == "latest" and text.strip() == f"step_{step}":
                _kill()
            return write_text_atomic(path, text, **kwargs)

        store.write_text_atomic = die_before_latest


def _install_phase(step: str, phase: str, who: str) -> None:
    import torch.distributed as dist

    from zerotopo.checkpoint import store

    assert phase in store.SAVE_PHASES, phase

    def stop_at(name: str, at: int) -> None:
        if name != phase or str(at) != step or not dist.is_initialized():
            return
        if who == "job":
            os.kill(int(os.environ[LAUNCHER_ENV]), signal.SIGKILL)
            _kill()
        elif dist.get_rank() == int(who):
            _kill()

    store.save_phase = stop_at


_spec = os.environ.get(FAULT_ENV, "")
if _spec:
    os.environ.setdefault(LAUNCHER_ENV, str(os.getpid()))
if _spec.count(":") == 2:
    _install_phase(*_spec.split(":"))
elif _spec:
    _install(*_spec.split(":", 1))
