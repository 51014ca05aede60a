"""Checkpoints written in the background (``async_save: true``).

At a save step every rank copies its shards off the training path (:func:`~zerotopo.checkpoint.store.
snapshot_save` with ``copy``: host memory) and training goes on; a writer thread on each rank then runs
:func:`~zerotopo.checkpoint.store.write_save` over a gloo process group of its own, so its collectives never
interleave with the training step's. At most one save is in flight: the next one waits for it, and says
so. The checkpoint is published as a synchronous one is ([Note: atomic save] in
:mod:`zerotopo.checkpoint.store`): ``latest`` moves only once every rank's pieces, the metadata and the
manifest are on disk and the directory is renamed into place, so a run killed at any moment resumes from
the newest complete checkpoint.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist

from zerotopo.checkpoint.store import PendingSave, write_save
from zerotopo.errors import ConfigError


class BackgroundSaver:
    """One rank's background checkpoint writer. Collective to build (it makes the writer's process group)."""

    def __init__(self) -> None:
        self._group = dist.new_group(backend="gloo")
        self._thread: threading.Thread | None = None
        self._step: int | None = None
        self._error: BaseException | None = None
        self.last_write_s: float | None = None
        """Seconds the last finished background write took."""

    @property
    def in_flight(self) -> int | None:
        """The step being written, None when no save is in flight."""
        return self._step if self._thread is not None else None

    def start(self, pending: PendingSave, on_done: Callable[[Path], None] | None = None) -> None:
        """Write ``pending`` in the background; ``on_done(step_dir)`` runs in the writer once it is
        complete. The previous save must have been waited for (:meth:`wait`)."""
        assert self._thread is None, "a background save is still in flight"
        self._step, self._error = pending.step, None
        self._thread = threading.Thread(
            target=self._run, args=(pending, on_done), name="zerotopo-checkpoint-writer", daemon=True
        )
        self._thread.start()

    def _run(self, pending: PendingSave, on_done: Callable[[Path], None] | None) -> None:
        t0 = time.perf_counter()
        try:
            final = write_save(pending, self._group)
            self.last_write_s = time.perf_counter() - t0
            if on_done is not None:
                on_done(final)
        except BaseException as exc:  # noqa: BLE001 - reported by wait() on the training thread
            self._error = exc

    def wait(self) -> BaseException | None:
        """Wait for the save in flight (if any); the error it ended with, None when it succeeded. Every
        rank returns the same verdict (the writer's last step is a broadcast from rank 0)."""
        if self._thread is None:
            return None
        self._thread.join()
        self._thread = None
        self._step = None
        error, self._error = self._error, None
        return error


def host_bytes_available() -> int | None:
    """``MemAvailable`` of this machine (Linux), None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def save_copy_bytes(optimizer) -> int:
    """Host bytes one rank's copy of its shards takes: the master weights and every optimizer state."""
    bufs = [*optimizer.master, *(t for ts in optimizer.states.values() for t in ts)]
    return sum(t.numel() * t.element_size() for t in bufs)


def check_host_memory(optimizer, *, is_main: bool, say: Callable[[str], None]) -> int:
    """Collective: the peak host memory a background save holds on this machine (every rank on it holds
    its copy at once), printed on rank 0 and refused with a :class:`ConfigError` when more than the
    machine has available. Returns this host's figure in bytes."""
    mine = save_copy_bytes(optimizer)
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, (socket.gethostname(), mine, host_bytes_available()))
    hosts: dict[str, list[int]] = {}
    free: dict[str, int | None] = {}
    for host, nbytes, available in every:
        hosts.setdefault(host, []).append(nbytes)
        free[host] = available
    # the host that needs the most of what it has (the same verdict on every rank)
    host = max(hosts, key=lambda h: sum(hosts[h]) / (free[h] or float("inf")))
    need, available = sum(hosts[host]), free[host]
    g = 2**30
    text = (
        f"async_save: a save holds a copy of the shards in host memory: {max(hosts[host]) / g:.3f} GiB per "
        f"rank, {need / g:.3f} GiB on host {host} ({len(hosts[host])} ranks)"
        + (f"; {available / g:.1f} GiB available" if available is not None else "")
    )
    if is_main:
        say(text)
    if available is not None and need > available:
        raise ConfigError(
            f"{text}: more than the machine has; set async_save: false (a save then writes from the "
            "optimizer's own buffers) or run fewer ranks per host",
            key="async_save",
        )
    return need
