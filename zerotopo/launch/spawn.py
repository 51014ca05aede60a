"""Spawn gloo ranks on this machine: the emulated local cluster and the multi-process tests.

:func:`spawn` starts ``world_size`` processes, initialises ``torch.distributed`` in each (gloo on CPU),
runs ``fn(rank, world_size, *args)`` and returns every rank's return value in rank order. A failure is
one :class:`SpawnError` naming the rank that failed first and how: its message for a bad-input error
(:class:`~zerotopo.errors.ZerotopoError`), its exception and the path of a log file holding every rank's
traceback for a bug, or the signal or exit code of a rank that died. The other ranks (which would block in
a collective) are then stopped; a rank that hangs past ``timeout_s`` is killed and reported. SIGINT and
SIGTERM to the parent stop every rank, and a rank dies with the launcher however it ends (:func:`_die_with`),
so no rank outlives it. Ranks of an emulated node share ``ZEROTOPO_EMULATED_NODE`` so the mesh's start-up
check sees them as one host. With ``preempt_on_sigterm`` (``zerotopo train``) SIGTERM is passed on to the
ranks instead, which save at the next step boundary and stop; a second SIGTERM or SIGINT lets them finish,
a third stops them at once (see :class:`_Stops`).

Ranks start as forks of a fork server that has imported torch once (``forkserver`` with
:data:`PRELOAD`), which starts them far faster than new interpreters that each import it
(docs/launch.md gives the measured start-up times and their command). A forked rank still starts clean
(the server only imported modules) and gets the launcher's environment, working directory, ``sys.path``
and standard output and error as they are at the start, as a spawned one would.
``ZEROTOPO_START_METHOD=spawn`` starts every rank as a new interpreter instead (a hook that must run when
an interpreter starts, such as a ``sitecustomize`` on ``PYTHONPATH``, needs it).

Note (SIGINT that "hung" a launcher): a launcher whose SIGINT is ignored when it starts keeps ignoring
it. A process inherits ignored signals across ``exec``, and a non-interactive shell starts a command put
in the background (``cmd &``) with SIGINT and SIGQUIT ignored; Python then installs no
``KeyboardInterrupt`` handler (it does so only where SIGINT is at its default). Such a launcher sent
SIGINT sleeps on with its ranks, whichever way they started, while SIGTERM, whose handler this module
installs, still stops it. That is what was seen when the fork server was first the default: in one run of
the whole test suite the two tests that send a launcher SIGINT (tests/test_spawn_faults.py,
tests/test_netem.py) timed out while those sending SIGTERM passed, and both passed when run alone, the
signature of a suite started with SIGINT ignored. It reproduces with either start method (run those tests under
``(python -m pytest ... &)``) and has nothing to do with the fork server. The launcher honours an
ignored SIGINT, as shells and Python do (that is how a background job is kept from a terminal's
Ctrl-C); tests/conftest.py restores the default SIGINT in the test process, so the processes the suite
starts can be interrupted however the suite itself was started.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

from zerotopo.errors import ZerotopoError


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: Seconds the other ranks get to report their own errors after the first rank failed.
GRACE_S = 1.0
#: Seconds between SIGTERM and SIGKILL when ranks are stopped.
STOP_S = 3.0
#: First lines of a rank's error that mark it as a consequence of another rank's failure.
COLLATERAL = ("Connection closed", "Connection reset", "Broken pipe", "Timed out", "gloo", "timed out")


#: Modules the fork server imports before it forks any rank: torch, and what a rank of the engine or of
#: ``zerotopo train`` imports next, so no rank imports them again. A name that does not import is
#: skipped (the server's own rule). ``torch._dynamo`` is imported by torch itself the first time a rank
#: initialises a parameter on the meta device, as the models build their units: about 1.5 s of one core
#: per rank on a 2-core machine, paid once by the server instead. It is the one module here that reads the
#: environment when imported (its ``TORCHDYNAMO_*`` / ``TORCH_COMPILE_*`` settings): a rank sees them
#: as they were when the server started, at the launcher's first start of ranks; every other variable
#: as it is at the rank's own start.
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch._dynamo",
    "zerotopo.launch.spawn",
    "zerotopo.engine.api",
    "zerotopo.trainer.loop",
)
#: ``ZEROTOPO_START_METHOD``: how ranks start (``forkserver``, the default, or ``spawn``).
START_METHODS = ("forkserver", "spawn")


def start_method() -> str:
    """How ranks start: ``ZEROTOPO_START_METHOD``, ``forkserver`` by default; ZerotopoError for another."""
    method = os.environ.get("ZEROTOPO_START_METHOD", "forkserver")
    if method not in START_METHODS:
        raise ZerotopoError(
            f"ZEROTOPO_START_METHOD={method!r} is not a start method; use {' or '.join(START_METHODS)}"
        )
    return method


def _context() -> Any:
    """The multiprocessing context ranks start from (see the module docstring)."""
    import torch.multiprocessing as mp

    method = start_method()
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


class _Stdio:
    """The launcher's standard output and error as they are when a rank starts: pickled into the rank's
    start as the two file descriptors, which the fork server passes on (a forked rank would otherwise
    write to the server's, fixed when it started). Unpickles as their ``DupFd`` handles."""

    def __reduce__(self) -> tuple[Any, tuple]:
        from multiprocessing.reduction import DupFd

        return tuple, ([DupFd(1), DupFd(2)],)


def _inherit(environ: dict[str, str], stdio: tuple[Any, Any]) -> None:
    """In a rank: the launcher's environment and standard streams at the start."""
    os.environ.clear()
    os.environ.update(environ)
    for target, fd in zip((1, 2), stdio):
        fd = fd.detach()
        if fd != target:
            os.dup2(fd, target)
            os.close(fd)


def _die_with(launcher: int) -> None:
    """This process gets SIGKILL when ``launcher`` exits, so no rank outlives it, however it ends.

    A spawned rank's parent is the launcher: the kernel sends the signal (Linux ``PR_SET_PDEATHSIG``). A
    forked rank's parent is the fork server, which lives as long as any of its children holds its
    liveness pipe, the ranks included: a daemon thread waits on the launcher's pidfd (Linux 5.3 and later;
    elsewhere it polls once a second) and sends the signal."""
    import ctypes
    import signal
    import threading

    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    if os.getppid() == launcher:
        return
    try:
        fd = os.pidfd_open(launcher)
    except ProcessLookupError:  # gone already
        os.kill(os.getpid(), signal.SIGKILL)
        return
    except (AttributeError, OSError):
        fd = None

    def watch() -> None:
        if fd is not None:
            import select

            select.select([fd], [], [])
        else:
            while pid_alive(launcher):
                time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="zerotopo-launcher-watch", daemon=True).start()


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _rank_main(
    rank: int,
    world_size: int,
    fn: Callable[..., Any],
    args: tuple,
    port: int,
    result_dir: str,
    backend: str,
    ranks_per_node: int | None,
    env: dict[str, str],
    threads: int,
    netns: tuple[str, ...] | None,
    master_addr: str,
    stdio: tuple[Any, Any] | None,
    launcher: int,
) -> None:
    import signal

    # The launcher alone handles Ctrl-C and stops every rank: a rank never prints a traceback for it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with(launcher)
    if stdio is not None:
        _inherit(env, stdio)
    else:
        os.environ.update(env)
    result: Any
    try:
        if netns:
            from zerotopo.launch.netem import enter_namespace

            # Before any socket exists: this rank (or its node) lives in its own network namespace.
            enter_namespace(netns[rank])
            os.environ["GLOO_SOCKET_IFNAME"] = "eth0"
        import torch
        import torch.distributed as dist

        # Started from inside a torchrun job (a job of one rank runs its tools locally), the rank must not
        # take torchrun's agent store for its own: torch's rendezvous would wait on a store no one serves.
        for name in [n for n in os.environ if n.startswith("TORCHELASTIC_")]:
            del os.environ[name]
        os.environ.update(
            {
                "RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_RANK": str(rank % ranks_per_node if ranks_per_node else rank),
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(port),
            }
        )
        if ranks_per_node:
            os.environ["ZEROTOPO_EMULATED_NODE"] = str(rank // ranks_per_node)
            os.environ["LOCAL_WORLD_SIZE"] = str(ranks_per_node)
        torch.set_num_threads(threads)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent
        _write_result(result_dir, rank, ("error", _describe(exc)))
        return
    # torch's TCP store does not come up across namespaces here; a file store on the shared disk does.
    init = f"file://{result_dir}/store" if netns else f"tcp://{master_addr}:{port}"
    try:
        dist.init_process_group(backend, rank=rank, world_size=world_size, init_method=init)
        result = ("ok", fn(rank, world_size, *args))
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent
        result = ("error", _describe(exc))
    finally:
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
    _write_result(result_dir, rank, result)


def _describe(exc: BaseException) -> dict[str, Any]:
    """What the parent needs to report a rank's exception: a user error's message, or a bug's traceback."""
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "user": isinstance(exc, ZerotopoError) and not isinstance(exc, SpawnError),
        "exit_code": getattr(exc, "exit_code", 1),
        "traceback": traceback.format_exc(),
    }


def _write_result(result_dir: str, rank: int, result: Any) -> None:
    out = os.path.join(result_dir, f"rank{rank}.pkl")
    try:
        payload = pickle.dumps(result)
    except Exception as exc:  # noqa: BLE001 - an unpicklable result is a bug to report, not a hang
        payload = pickle.dumps(("error", _describe(exc)))
    fd, tmp = tempfile.mkstemp(dir=result_dir, prefix=f".rank{rank}.", suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(payload)
    os.replace(tmp, out)


def _read_result(result_dir: str, rank: int) -> Any:
    path = os.path.join(result_dir, f"rank{rank}.pkl")
    if not os.path.exists(path):
        return None
    # Written by our own ranks in a private (0700) directory this process created.
    with open(path, "rb") as f:
        return pickle.load(f)


def _signal_name(code: int) -> str:
    import signal

    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


class _Stop(BaseException):
    """SIGTERM reached the launcher: stop the ranks and exit."""


class _Stops:
    """The launcher's stop signals when its ranks save on SIGTERM (``preempt_on_sigterm``): the first
    SIGTERM or SIGUSR1 is passed on to every rank, which saves at the next step boundary and stops; a
    second (or a Ctrl-C after the first) lets the save finish; a third stops the ranks at once. A Ctrl-C
    before any of them stops the ranks at once, as it always did."""

    ABORT_AT = 3

    def __init__(self, procs: list[Any]) -> None:
        self.procs = procs
        self.count = 0

    def forward(self, signum: int) -> None:
        for p in self.procs:
            if p.pid is not None and p.is_alive():
                with contextlib.suppress(OSError):
                    os.kill(p.pid, signum)

    def on_signal(self, signum: int, frame: Any) -> None:
        import signal
        import sys

        if signum == signal.SIGINT and self.count == 0:
            raise KeyboardInterrupt
        self.count += 1
        name = _signal_name(signum)
        if self.count == 1:
            self.forward(signum)
            print(
                f"{name}: every rank saves at the next step boundary and stops; a third stop signal "
                "(SIGTERM or Ctrl-C) stops them at once, without saving",
                file=sys.stderr,
                flush=True,
            )
        elif self.count < self.ABORT_AT:
            print(
                f"{name} received again: the ranks finish their save and stop; one more stop signal stops "
                "them at once, without saving",
                file=sys.stderr,
                flush=True,
            )
        else:
            raise _Stop(signum)


def _spawn_once(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple = (),
    *,
    backend: str = "gloo",
    ranks_per_node: int | None = None,
    env: dict[str, str] | None = None,
    timeout_s: float = 600.0,
    threads_per_rank: int = 1,
    network: Any = None,
    log_dir: str | os.PathLike | None = None,
    preempt_on_sigterm: bool = False,
) -> list[Any]:
    """One start of :func:`spawn` (see there)."""
    import signal
    import threading

    ctx = _context()
    forked = ctx.get_start_method() == "forkserver"
    port = free_port()
    netns = network.rank_namespaces(world_size, ranks_per_node) if network is not None else None
    master_addr = network.addresses[0] if network is not None else "127.0.0.1"
    main_thread = threading.current_thread() is threading.main_thread()
    old_term = old_int = old_usr1 = None
    procs: list[Any] = []
    if main_thread and preempt_on_sigterm:
        stops = _Stops(procs)
        old_term = signal.signal(signal.SIGTERM, stops.on_signal)
        old_int = signal.signal(signal.SIGINT, stops.on_signal)
        old_usr1 = signal.signal(signal.SIGUSR1, stops.on_signal)
    elif main_thread:

        def on_term(signum: int, frame: Any) -> None:
            raise _Stop(signum)

        old_term = signal.signal(signal.SIGTERM, on_term)
        old_usr1 = _forward_sigusr1(procs)
    with tempfile.TemporaryDirectory(prefix="zerotopo-spawn-") as result_dir:
        try:
            for rank in range(world_size):
                p = ctx.Process(
                    target=_rank_main,
                    args=(
                        rank,
                        world_size,
                        fn,
                        args,
                        port,
                        result_dir,
                        backend,
                        ranks_per_node,
                        {**os.environ, **(env or {})} if forked else dict(env or {}),
                        threads_per_rank,
                        netns,
                        master_addr,
                        _Stdio() if forked else None,
                        os.getpid(),
                    ),
                    daemon=False,
                )
                p.start()
                procs.append(p)
            first, timed_out = _wait(procs, result_dir, world_size, timeout_s)
            # Exit codes before any rank is stopped: a rank that died by now died on its own.
            died = [p.exitcode for p in procs]
        except KeyboardInterrupt:
            _stop(procs, kill=preempt_on_sigterm)
            raise
        except _Stop as stop:
            _stop(procs, kill=preempt_on_sigterm)
            signum = stop.args[0] if stop.args else signal.SIGTERM
            saving = " (without saving)" if preempt_on_sigterm else ""
            raise SpawnError(
                f"stopped by {_signal_name(signum)}; every rank was stopped{saving}", exit_code=128 + signum
            ) from None
        finally:
            # ranks that handle SIGTERM (they save on it) are stopped with SIGKILL
            _stop(procs, kill=preempt_on_sigterm)
            for signum, old in (
                (signal.SIGTERM, old_term),
                (signal.SIGINT, old_int),
                (signal.SIGUSR1, old_usr1),
            ):
                if old is not None:
                    signal.signal(signum, old)
        return _collect(procs, died, result_dir, world_size, first, timed_out, timeout_s, log_dir)


def _forward_sigusr1(procs: list[Any]) -> Any:
    """Pass SIGUSR1 on to every rank (a training rank saves at the next step boundary and stops, see
    zerotopo.trainer.preempt); returns the handler it replaced."""
    import signal

    def forward(signum: int, frame: Any) -> None:
        for p in procs:
            if p.pid is not None and p.is_alive():
                with contextlib.suppress(OSError):
                    os.kill(p.pid, signal.SIGUSR1)

    return signal.signal(signal.SIGUSR1, forward)


def _wait(procs: list[Any], result_dir: str, world_size: int, timeout_s: float) -> tuple[int | None, bool]:
    """Wait for every rank; returns (first rank seen failing or None, whether the time ran out). After a
    failure the others get :data:`GRACE_S` to report, then are stopped (they would block in a collective)."""
    deadline = time.monotonic() + timeout_s
    first: int | None = None
    failed_at = 0.0
    while True:
        alive = [p for p in procs if p.is_alive()]
        if first is None:
            for rank, p in enumerate(procs):
                if (p.exitcode not in (None, 0)) or _is_error(result_dir, rank):
                    first, failed_at = rank, time.monotonic()
                    break
        if not alive:
            return first, False
        if first is not None and time.monotonic() - failed_at > GRACE_S:
            return first, False
        if time.monotonic() >= deadline:
            return first, True
        alive[0].join(timeout=0.1)


def _stop(procs: list[Any], *, kill: bool = False) -> None:
    """SIGTERM every rank still running, then SIGKILL what is left after :data:`STOP_S` (``kill``: SIGKILL
    at once, for ranks that save on SIGTERM)."""
    for p in procs:
        if p.is_alive():
            with contextlib.suppress(Exception):
                p.kill() if kill else p.terminate()
    deadline = time.monotonic() + STOP_S
    for p in procs:
        with contextlib.suppress(Exception):
            p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            with contextlib.suppress(Exception):
                p.kill()
                p.join()


def _is_error(result_dir: str, rank: int) -> bool:
    try:
        result = _read_result(result_dir, rank)
    except (EOFError, pickle.UnpicklingError, OSError):
        return False
    return result is not None and result[0] == "error"


def _collect(
    procs: list[Any],
    died: list[int | None],
    result_dir: str,
    world_size: int,
    first: int | None,
    timed_out: bool,
    timeout_s: float,
    log_dir: str | os.PathLike | None,
) -> list[Any]:
    results: list[Any] = []
    failures: dict[int, dict[str, Any]] = {}
    for rank in range(len(procs)):
        try:
            result = _read_result(result_dir, rank)
        except (EOFError, pickle.UnpicklingError, OSError):
            result = None
        if result is not None and result[0] == "ok":
            results.append(result[1])
            continue
        results.append(None)
        if result is not None:
            failures[rank] = result[1]
        elif timed_out and first is None:
            failures[rank] = {"died": f"did not finish within {timeout_s:.0f}s and was killed"}
        elif died[rank] is not None and died[rank] < 0:
            failures[rank] = {"died": f"exited with signal {-died[rank]} ({_signal_name(-died[rank])})"}
        elif died[rank] not in (None, 0):
            failures[rank] = {"died": f"exited with code {died[rank]} without a result"}
        else:
            failures[rank] = {"died": "was stopped", "stopped": True}
    if not failures:
        return results
    raise _failure_error(failures, first, world_size, log_dir)


def _failure_error(
    failures: dict[int, dict[str, Any]], first: int | None, world_size: int, log_dir: str | os.PathLike | None
) -> SpawnError:
    """One message for the user: the rank whose failure caused the others', and what it was."""

    def collateral(info: dict[str, Any]) -> bool:
        if info.get("stopped"):
            return True
        head = info.get("message", info.get("died", "")).split("\n", 1)[0]
        return not info.get("user") and any(c in head for c in COLLATERAL)

    def priority(info: dict[str, Any]) -> int:
        # A rank that died on its own is the cause; the others' errors are its consequences.
        if "died" in info and not info.get("stopped"):
            return 0
        return 2 if collateral(info) else 1

    order = sorted(failures, key=lambda r: (priority(failures[r]), r != first, r))
    rank = order[0]
    info = failures[rank]
    failed = [r for r in failures if not failures[r].get("stopped")]
    others = len(failures) - 1
    tail = f" ({others} other rank{'s' if others != 1 else ''} stopped or failed with it)" if others else ""
    if "died" in info:
        return SpawnError(f"rank {rank} of {world_size} {info['died']}{tail}", exit_code=1)
    if info["user"]:
        same = [r for r in failed if r != rank and failures[r].get("message") == info["message"]]
        also = f" (ranks {_ranks(same)} reported the same)" if same else tail
        return SpawnError(f"rank {rank}: {info['message']}{also}", exit_code=int(info["exit_code"]) or 2)
    log = _write_log(failures, log_dir)
    where = f"; tracebacks of every rank in {log}" if log else ""
    first_line = info["message"].split("\n", 1)[0]
    first_line = first_line if len(first_line) <= 300 else first_line[:297] + "..."
    return SpawnError(f"rank {rank} failed: {info['type']}: {first_line}{where}{tail}", exit_code=1)


def _ranks(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:8]))
    return shown + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


def _write_log(failures: dict[int, dict[str, Any]], log_dir: str | os.PathLike | None) -> str | None:
    """Every rank's traceback in ``log_dir/rank-errors.log`` (else a new file in the temp directory)."""
    text = "".join(
        f"=== rank {rank} ===\n{info.get('traceback') or info.get('died', '')}\n"
        for rank, info in sorted(failures.items())
    )
    try:
        if log_dir is not None:
            os.makedirs(log_dir, exist_ok=True)
            path = os.path.join(os.fspath(log_dir), "rank-errors.log")
            from zerotopo.fsutil import write_text_atomic

            write_text_atomic(path, text)
            return path
        fd, path = tempfile.mkstemp(prefix="zerotopo-rank-errors-", suffix=".log")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        return path
    except OSError:
        return None


class SpawnError(ZerotopoError):
    """One or more spawned ranks failed; the message names the rank that failed first and how.

    ``exit_code`` is 2 when that rank raised a bad-input error, 1 when it crashed, was killed or hit a
    bug (its traceback is in the log file the message names), 128 + the signal when the launcher was
    stopped by one (143: SIGTERM)."""

    def __init__(self, message: str, *, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def spawn(fn: Callable[..., Any], world_size: int, args: tuple = (), **kwargs: Any) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` local ranks and return their results.

    ``fn`` must be importable (a module-level function) and its results picklable. Keyword arguments:
    ``backend`` (gloo), ``ranks_per_node`` (groups consecutive ranks into emulated nodes: sets
    ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and ``ZEROTOPO_EMULATED_NODE``), ``env``, ``timeout_s``,
    ``threads_per_rank``, ``network`` (a :class:`zerotopo.launch.netem.EmulatedNetwork`: each rank in its own
    network namespace, or each emulated node's ranks in that node's), and ``log_dir`` (where
    ``rank-errors.log`` with the ranks' tracebacks goes when a rank hits a bug; default a new file in the
    temp directory) and ``preempt_on_sigterm`` (SIGTERM and SIGUSR1 are passed on to ranks that save on
    them; see :class:`_Stops`). A start that lost its rendezvous port to another process between choosing and binding
    it is retried once on a new port.
    """
    try:
        return _spawn_once(fn, world_size, args, **kwargs)
    except SpawnError as exc:
        if "address already in use" not in str(exc).lower() and "EADDRINUSE" not in str(exc):
            raise
        return _spawn_once(fn, world_size, args, **kwargs)
