"""Spawn gloo ranks on this machine: the emulated local cluster and the multi-process tests.

:func:`spawn` starts ``world_size`` processes, initialises ``torch.distributed`` in each (gloo on CPU),
runs ``fn(rank, world_size, *args)`` and returns every rank's return value in rank order. An exception in
any rank is re-raised in the parent with that rank's traceback; a rank that hangs past ``timeout_s`` is
killed and reported. Ranks of an emulated node share ``ZEROTOPO_EMULATED_NODE`` so the mesh's start-up
check sees them as one host.
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
) -> None:
    os.environ.update(env)
    if netns:
        from zerotopo.netem import enter_namespace

        # Before any socket exists: this rank (or its node) lives in its own network namespace.
        enter_namespace(netns[rank])
        os.environ["GLOO_SOCKET_IFNAME"] = "eth0"
    import torch
    import torch.distributed as dist

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
    out = os.path.join(result_dir, f"rank{rank}.pkl")
    # torch's TCP store does not come up across namespaces here; a file store on the shared disk does.
    init = f"file://{result_dir}/store" if netns else f"tcp://{master_addr}:{port}"
    try:
        dist.init_process_group(backend, rank=rank, world_size=world_size, init_method=init)
        result: Any = ("ok", fn(rank, world_size, *args))
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent
        result = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    finally:
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
    with open(out + ".tmp", "wb") as f:
        pickle.dump(result, f)
    os.replace(out + ".tmp", out)


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
) -> list[Any]:
    """One start of :func:`spawn` (see there)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    port = free_port()
    netns = network.rank_namespaces(world_size, ranks_per_node) if network is not None else None
    master_addr = network.addresses[0] if network is not None else "127.0.0.1"
    with tempfile.TemporaryDirectory(prefix="zerotopo-spawn-") as result_dir:
        procs = []
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
                    dict(env or {}),
                    threads_per_rank,
                    netns,
                    master_addr,
                ),
                daemon=False,
            )
            p.start()
            procs.append(p)
        deadline = time.monotonic() + timeout_s
        failed_early = False
        for p in procs:
            while p.is_alive() and time.monotonic() < deadline:
                p.join(timeout=0.2)
                # One dead rank with an error leaves the others blocked in a collective: stop them.
                if any(q.exitcode not in (None, 0) for q in procs) or _any_error(result_dir, world_size):
                    failed_early = True
                    break
            if failed_early:
                break
        if failed_early:
            time.sleep(1.0)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        results: list[Any] = []
        errors: list[str] = []
        for rank, p in enumerate(procs):
            path = os.path.join(result_dir, f"rank{rank}.pkl")
            if os.path.exists(path):
                with open(path, "rb") as f:
                    status, value = pickle.load(f)
                if status == "ok":
                    results.append(value)
                    continue
                errors.append(f"rank {rank} failed: {value}")
            elif not failed_early and time.monotonic() >= deadline:
                errors.append(f"rank {rank} did not finish within {timeout_s:.0f}s and was killed")
            else:
                errors.append(f"rank {rank} exited with code {p.exitcode} without a result")
            results.append(None)
        if errors:
            # The first error is usually the cause; the rest are ranks stuck in a collective with it.
            real = [e for e in errors if "failed:" in e] or errors
            collateral = ("Connection closed", "Connection reset", "Broken pipe", "Timed out", "gloo")
            real.sort(key=lambda e: any(c in e.split("\n", 1)[0] for c in collateral))
            raise SpawnError(f"{len(errors)} of {world_size} ranks failed.\n" + "\n".join(real[:2]))
        return results


def _any_error(result_dir: str, world_size: int) -> bool:
    for rank in range(world_size):
        path = os.path.join(result_dir, f"rank{rank}.pkl")
        if os.path.exists(path):
            try:
                with open(path, "rb") as f:
                    if pickle.load(f)[0] == "error":
                        return True
            except (EOFError, pickle.UnpicklingError):
                continue
    return False


class SpawnError(ZerotopoError):
    """One or more spawned ranks failed; the message carries the first real error."""


def spawn(fn: Callable[..., Any], world_size: int, args: tuple = (), **kwargs: Any) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` local ranks and return their results.

    ``fn`` must be importable (a module-level function) and its results picklable. Keyword arguments:
    ``backend`` (gloo), ``ranks_per_node`` (groups consecutive ranks into emulated nodes: sets
    ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and ``ZEROTOPO_EMULATED_NODE``), ``env``, ``timeout_s``,
    ``threads_per_rank``, and ``network`` (a :class:`zerotopo.netem.EmulatedNetwork`: each rank in its own
    network namespace, or each emulated node's ranks in that node's). A start that lost its rendezvous
    port to another process between choosing and binding it is retried once on a new port.
    """
    try:
        return _spawn_once(fn, world_size, args, **kwargs)
    except SpawnError as exc:
        if "address already in use" not in str(exc).lower() and "EADDRINUSE" not in str(exc):
            raise
        return _spawn_once(fn, world_size, args, **kwargs)
