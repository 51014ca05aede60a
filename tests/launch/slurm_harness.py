"""A real one-node Slurm on localhost for the launcher tests: munged, slurmctld and slurmd from Debian's
``slurm-wlm`` and ``munge``, configured in a temporary directory and stopped afterwards.

Everything the cluster writes (key, sockets, state, logs) stays in that directory and the daemons listen
on free ports, so the harness neither reads nor changes a Slurm or munge set up on the machine. The node
declares 8 CPUs whatever the machine has (``SlurmdParameters=config_overrides``), so ``srun -n8`` fits
on a 2-core runner.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.proc import alive

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("srun", "sinfo")


def unavailable_reason() -> str | None:
    """Why a local Slurm cannot be started here, or None when it can."""
    if os.geteuid() != 0:
        return "the local Slurm needs root (slurmd runs jobs as their users)"
    missing = [b for b in DAEMONS + CLIENTS if _find(b) is None]
    if missing:
        return (
            f"{', '.join(missing)} not installed (apt-get install slurm-wlm munge; see .ci/install-system.sh)"
        )
    return None


def _find(binary: str) -> str | None:
    return shutil.which(binary) or next(
        (str(p) for d in ("/usr/sbin", "/sbin", "/usr/bin") if (p := Path(d) / binary).exists()), None
    )


def _free_ports(count: int) -> list[int]:
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class LocalSlurm:
    """One slurmctld and one slurmd on this host, with their own munged. Use as a context manager."""

    def __init__(self, cpus: int = 8):
        self.cpus = cpus
        self.dir = Path(tempfile.mkdtemp(prefix="zerotopo-slurm-"))
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.dir / "slurm.conf"
        self._pids: dict[str, int] = {}

    # -- set-up -------------------------------------------------------------------------------------
    def _write_files(self) -> None:
        # munged refuses sockets in directories others cannot traverse, and keys others can read.
        self.dir.chmod(0o711)
        key = self.dir / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o600)
        for sub in ("state", "spool"):
            (self.dir / sub).mkdir()
        ctld_port, slurmd_port = _free_ports(2)
        d = self.dir
        self.conf.write_text(
            f"""\
ClusterName=zerotopo-test
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge.sock
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
# No cgroups, no accounting: a container has neither, and the tests need neither.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
# Trust the CPU count below rather than the hardware: 8 tasks on a 2-core runner.
SlurmdParameters=config_overrides
InactiveLimit=0
KillWait=5
MinJobAge=5
NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus} Sockets=1 CoresPerSocket={self.cpus} \
ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes={self.host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""
        )

    def env(self, **extra: str) -> dict[str, str]:
        """An environment for srun/sinfo against this cluster (no SLURM_* leaking in from outside)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SRUN_", "SBATCH_"))}
        env["SLURM_CONF"] = str(self.conf)
        env.update(extra)
        return env

    def _run_daemon(self, name: str, args: list[str], pid_file: Path) -> None:
        subprocess.run([_find(name), *args], check=True, env=self.env(), capture_output=True, timeout=60)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if pid_file.exists() and pid_file.read_text().strip().isdigit():
                self._pids[name] = int(pid_file.read_text().strip())
                return
            time.sleep(0.1)
        raise RuntimeError(f"{name} did not write {pid_file}; log:\n{self.logs()}")

    def start(self, timeout_s: float = 60.0) -> LocalSlurm:
        self._write_files()
        d = self.dir
        try:
            self._run_daemon(
                "munged",
                [
                    "--force",
                    f"--socket={d}/munge.sock",
                    f"--key-file={d}/munge.key",
                    f"--log-file={d}/munged.log",
                    f"--pid-file={d}/munged.pid",
                    f"--seed-file={d}/munged.seed",
                ],
                d / "munged.pid",
            )
            self._run_daemon("slurmctld", ["-f", str(self.conf)], d / "slurmctld.pid")
            self._run_daemon("slurmd", ["-f", str(self.conf), "-N", self.host], d / "slurmd.pid")
            self._wait_idle(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_idle(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        state = ""
        while time.monotonic() < deadline:
            out = subprocess.run(
                [_find("sinfo"), "-h", "-N", "-o", "%T"],
                env=self.env(),
                capture_output=True,
                text=True,
                timeout=30,
            )
            state = out.stdout.strip()
            if state == "idle":
                return
            time.sleep(0.5)
        raise RuntimeError(f"node not idle after {timeout_s:.0f}s (state {state!r}); logs:\n{self.logs()}")

    # -- use ----------------------------------------------------------------------------------------
    def srun(
        self, args: list[str], *, env: dict[str, str] | None = None, timeout_s: float = 300
    ) -> subprocess.CompletedProcess:
        """Run ``srun ARGS`` against this cluster; returns the completed process (text output)."""
        return subprocess.run(
            [_find("srun"), *args],
            env=self.env(**(env or {})),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )

    def logs(self) -> str:
        parts = []
        for name in ("munged.log", "slurmctld.log", "slurmd.log"):
            path = self.dir / name
            if path.exists():
                parts.append(f"--- {name} (tail)\n" + "\n".join(path.read_text().splitlines()[-15:]))
        return "\n".join(parts)

    # -- tear-down ----------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop the daemons this harness started (by their pids) and remove its directory."""
        for name in reversed(DAEMONS):
            pid = self._pids.pop(name, None)
            if pid is None:
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and alive(pid):
                time.sleep(0.1)
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalSlurm:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
