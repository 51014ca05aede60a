"""One writer per save directory: a lock file that a second job meets at start.

``<save>/.zerotopo-lock`` holds the writer's host, process id, Slurm job id and start time as JSON, created
with ``O_EXCL`` by rank 0 before the run builds anything and removed when it ends. A thread refreshes its
modification time every :data:`HEARTBEAT_S` seconds. A lock is stale, and taken over with a notice, when
its process is gone (same host), when it belongs to this Slurm job (a requeued job continues its own
run), or when its heartbeat is older than :data:`STALE_S` (another host, which cannot be asked).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from zerotopo.errors import ConfigError
from zerotopo.logs import get_logger

LOCK_FILE = ".zerotopo-lock"
HEARTBEAT_S = 60.0
STALE_S = 600.0

log = get_logger("train")


@dataclass(frozen=True)
class Holder:
    """Who holds a save directory's lock."""

    host: str
    pid: int
    job: str
    started: float

    def describe(self) -> str:
        job = f", Slurm job {self.job}" if self.job else ""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"host {self.host}, process {self.pid}{job}, since {when}"


def _me() -> Holder:
    return Holder(socket.gethostname(), os.getpid(), os.environ.get("SLURM_JOB_ID", ""), time.time())


def read_holder(root: Path) -> Holder | None:
    """The lock's holder, None without a lock; a damaged lock reads as a holder that is long gone."""
    path = Path(root) / LOCK_FILE
    try:
        raw = json.loads(path.read_bytes()[:4096])
        return Holder(
            str(raw["host"])[:200], int(raw["pid"]), str(raw.get("job", ""))[:40], float(raw["started"])
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return Holder("?", 0, "", 0.0)


def stale_reason(root: Path, holder: Holder) -> str | None:
    """Why ``holder``'s lock no longer protects anything, or None when its job may still be writing."""
    me = _me()
    if holder.pid <= 0:
        return "the lock file is damaged"
    if holder.job and holder.job == me.job:
        return f"it belongs to this Slurm job ({holder.job}), started again"
    if holder.host == me.host:
        if holder.pid == me.pid:
            return "this process holds it"
        try:
            os.kill(holder.pid, 0)
        except ProcessLookupError:
            return f"process {holder.pid} is gone"
        except PermissionError:
            return None
        return None
    try:
        age = time.time() - (Path(root) / LOCK_FILE).stat().st_mtime
    except OSError:
        return "it is gone"
    return f"its heartbeat is {age:.0f}s old" if age > STALE_S else None


def check_unlocked(root: str | os.PathLike, source: str | None = None) -> None:
    """ConfigError when another live job holds ``root`` (run before any rank starts)."""
    holder = read_holder(Path(root))
    if holder is not None and stale_reason(Path(root), holder) is None:
        raise ConfigError(
            f"save directory {root} is in use by another run ({holder.describe()}); two runs writing one "
            f"directory overwrite each other's checkpoints: wait for it, stop it, or save to another "
            f"directory (a lock left by a job that died is taken over once its process is gone, or after "
            f"{STALE_S:.0f}s without a heartbeat from another host)",
            source=source,
            key="save",
        )


class SaveLock:
    """The lock of one save directory, held by this process until :meth:`release`."""

    def __init__(self, root: str | os.PathLike, source: str | None = None) -> None:
        self.path = Path(root) / LOCK_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.me = _me()
        text = json.dumps(vars(self.me))
        for _ in range(5):
            if self._create(text):
                break
            holder = read_holder(self.path.parent)
            if holder is None:
                continue  # released between our try and the read
            reason = stale_reason(self.path.parent, holder)
            if reason is None:
                check_unlocked(self.path.parent, source)  # raises, naming the holder
            log.warning(f"taking over the lock of {self.path.parent} from {holder.describe()}: {reason}")
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        else:
            raise ConfigError(
                f"cannot take the lock {self.path}; remove it if no run uses {root}", key="save"
            )
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name="zerotopo-save-lock", daemon=True)
        self._beat.start()

    def _create(self, text: str) -> bool:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return True

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def release(self) -> None:
        """Stop the heartbeat and remove the lock if it is still this process's."""
        self._stop.set()
        holder = read_holder(self.path.parent)
        if holder is not None and (holder.host, holder.pid) == (self.me.host, self.me.pid):
            with contextlib.suppress(OSError):
                self.path.unlink()
