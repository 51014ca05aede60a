"""How ranks start: by default forks of a fork server that imported torch once, each with the launcher's
environment, working directory and standard streams as they are at the start (as a spawned rank has
them); new interpreters under ``ZEROTOPO_START_METHOD=spawn``; none outliving a launcher that is killed,
either way; the processes the suite starts can be interrupted (SIGINT at its default)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.proc import alive
from zerotopo.errors import ZerotopoError
from zerotopo.launch.spawn import spawn

pytestmark = pytest.mark.slow  # each test spawns ranks

ROOT = Path(__file__).resolve().parents[1]
MARK = "ZEROTOPO_TEST_START_MARK"


def _seen(rank, world, name):
    import torch.distributed as dist

    print(f"rank {rank} out", flush=True)
    print(f"rank {rank} err", file=sys.stderr, flush=True)
    dist.barrier()
    return os.environ.get(name), os.getcwd(), os.environ["RANK"]


def test_a_forked_rank_gets_the_launchers_environment_directory_and_streams_as_they_are_now(
    monkeypatch, tmp_path, capfd
):
    monkeypatch.delenv("ZEROTOPO_START_METHOD", raising=False)  # the default
    monkeypatch.setenv(MARK, "before")
    spawn(_seen, 2, args=(MARK,), timeout_s=120)  # the fork server runs from here on, with "before"
    capfd.readouterr()
    monkeypatch.setenv(MARK, "after")
    monkeypatch.chdir(tmp_path)
    assert spawn(_seen, 2, args=(MARK,), timeout_s=120) == [
        ("after", str(tmp_path), "0"),
        ("after", str(tmp_path), "1"),
    ]
    out, err = capfd.readouterr()
    assert "rank 0 out" in out and "rank 1 out" in out, out
    assert "rank 0 err" in err and "rank 1 err" in err, err
    monkeypatch.delenv(MARK)
    assert [r[0] for r in spawn(_seen, 2, args=(MARK,), timeout_s=120)] == [None, None]


def _torch_modules_a_first_layer_imports(rank, world):
    import torch
    import torch.distributed as dist

    before = set(sys.modules)
    # the models build on meta: the first parameter initialised there imports torch._dynamo (1.5 s)
    torch.nn.Embedding(10, 4, device="meta")
    dist.barrier()
    return sorted(m for m in set(sys.modules) - before if m.startswith("torch"))


def test_a_forked_rank_builds_its_first_layer_on_meta_without_importing_more_of_torch(monkeypatch):
    monkeypatch.delenv("ZEROTOPO_START_METHOD", raising=False)
    assert spawn(_torch_modules_a_first_layer_imports, 2, timeout_s=120) == [[], []]


def _parent(rank, world):
    import torch.distributed as dist

    dist.barrier()  # no rank leaves (and closes its connections) while another still connects
    return os.getppid()


def test_ranks_are_forks_of_the_fork_server_by_default_and_a_wrong_method_is_named(monkeypatch):
    monkeypatch.delenv("ZEROTOPO_START_METHOD", raising=False)
    assert os.getpid() not in spawn(_parent, 2, timeout_s=120)  # the fork server's
    monkeypatch.setenv("ZEROTOPO_START_METHOD", "spawn")
    assert spawn(_parent, 2, timeout_s=120) == [os.getpid()] * 2  # new interpreters: the launcher's children
    monkeypatch.setenv("ZEROTOPO_START_METHOD", "fork")
    with pytest.raises(
        ZerotopoError, match="ZEROTOPO_START_METHOD='fork' is not a start method; use forkserver or spawn"
    ):
        spawn(_parent, 2, timeout_s=120)


def test_a_process_the_suite_starts_has_sigint_at_its_default():
    # tests/conftest.py: a launcher a test sends SIGINT must turn it into KeyboardInterrupt, even when
    # the suite itself was started with SIGINT ignored (see the Note in zerotopo/launch/spawn.py).
    code = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"


LAUNCHER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {root!r})
    from tests.test_spawn_start import _sleeper
    from zerotopo.launch.spawn import spawn

    if __name__ == "__main__":
        spawn(_sleeper, 2, args=({pids!r},), timeout_s=600)
    """
)


def _sleeper(rank, world, pid_dir):
    with open(os.path.join(pid_dir, f"{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_no_rank_outlives_a_killed_launcher(tmp_path, method):
    script = tmp_path / "launch.py"
    script.write_text(LAUNCHER.format(root=str(ROOT), pids=str(tmp_path)))
    env = {**os.environ, "ZEROTOPO_START_METHOD": method}
    proc = subprocess.Popen(
        [sys.executable, str(script)], stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env
    )
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("*.pid"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    assert len(pids) == 2, proc.stderr.read() if proc.poll() is not None else "ranks did not start"
    proc.send_signal(signal.SIGKILL)  # no handler runs: the ranks must go by themselves
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(pid) for pid in pids)
