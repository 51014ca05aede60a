"""The ledger's bookkeeping (single process: handles without process groups)."""

from __future__ import annotations

import torch

from zerotopo.comm import collectives as C
from zerotopo.comm.ledger import Ledger
from zerotopo.comm.mesh import GroupHandle

PKG = GroupHandle("params", (0, 1), 0, "package")
NET = GroupHandle("grad_replicas", (0, 4), 0, "network")
SOLO = GroupHandle("params", (0,), 0, None)


def test_tiers_ops_steps_and_scalars() -> None:
    led = Ledger()
    led.record("all_gather", PKG, dtype=torch.bfloat16, numel=1024, bytes_sent=1024, seconds=0.5, tag="l0")
    led.record("all_reduce", NET, dtype="float32", numel=1, bytes_sent=8, seconds=0.25)
    first = led.mark_step()
    assert first["bytes_by_tier"] == {"package": 1024, "network": 8}
    assert first["seconds_by_op"] == {"all_gather": 0.5, "all_reduce": 0.25}
    assert first["calls"] == 2 and first["bytes"] == 1032
    led.record("all_gather", PKG, dtype="bfloat16", numel=64, bytes_sent=64, seconds=0.1)
    second = led.step_summary()
    assert second["bytes_by_tier"] == {"package": 64} and second["calls"] == 1
    assert led.mark_step() == second and led.steps_marked == 2
    assert led.bytes_by_tier() == {"package": 1088, "network": 8}
    assert led.bytes_by_tier(include_scalar=False) == {"package": 1088}
    assert led.bytes_by_op() == {("all_gather", "package"): 1088, ("all_reduce", "network"): 8}
    rec = led.records()[0]
    assert (rec.kind, rec.size, rec.dtype, rec.tag) == ("params", 2, "bfloat16", "l0")
    led.reset()
    assert led.records() == [] and led.step_summary()["calls"] == 0


def test_single_rank_groups_copy_and_count_as_local() -> None:
    led = Ledger()
    x = torch.arange(6.0)
    out = torch.empty(6)
    C.all_gather(out, x, SOLO, ledger=led)
    assert torch.equal(out, x)
    shard = torch.empty(6)
    p = C.reduce_scatter(shard, x, SOLO, ledger=led, async_op=True)
    assert p is not None and p.is_completed()
    p.wait()
    assert torch.equal(shard, x)
    C.all_reduce(x, SOLO, ledger=led)
    C.broadcast(x, 0, SOLO, ledger=led)
    assert led.bytes_by_tier() == {"local": 0}
    assert [r.op for r in led.records()] == ["all_gather", "reduce_scatter", "all_reduce", "broadcast"]
    assert all(r.seconds >= 0 for r in led.records())


def test_retains_recent_steps_but_keeps_totals() -> None:
    led = Ledger(keep_steps=2)
    for step in range(5):
        for _ in range(step + 1):
            led.record(
                "all_gather", PKG, dtype="float32", numel=64, bytes_sent=10, seconds=0.0, tag=str(step)
            )
        assert led.mark_step()["bytes"] == 10 * (step + 1)
    led.record("all_gather", PKG, dtype="float32", numel=64, bytes_sent=10, seconds=0.0, tag="5")
    # Steps 3 and 4 closed and retained, step 5 in progress.
    assert [r.tag for r in led.records()] == ["3"] * 4 + ["4"] * 5 + ["5"]
    assert led.step_summary()["bytes"] == 10
    assert led.bytes_by_tier() == {"package": 10 * (1 + 2 + 3 + 4 + 5 + 1)}


class _FakeEvent:
    """A device event stand-in: counts waits and queries; ``done`` says whether the work finished."""

    def __init__(self, t: float, log: list[str], done: bool = True) -> None:
        self.t, self.log, self.done = t, log, done

    def query(self) -> bool:
        self.log.append("query")
        return self.done

    def synchronize(self) -> None:
        self.log.append("synchronize")
        self.done = True

    def elapsed_time(self, end: _FakeEvent) -> float:
        return (end.t - self.t) * 1e3  # milliseconds, as torch.cuda.Event


def test_ledger_resolves_events_lazily_and_never_waits_in_mark_step() -> None:
    log: list[str] = []
    led = Ledger()
    a = led.record("all_gather", PKG, dtype="float32", numel=64, bytes_sent=10, seconds=0.0)
    b = led.record("all_gather", PKG, dtype="float32", numel=64, bytes_sent=10, seconds=0.0)
    a.timing = (_FakeEvent(0.0, log), _FakeEvent(0.25, log, done=True))
    b.timing = (_FakeEvent(0.0, log), _FakeEvent(0.5, log, done=False))
    summary = led.mark_step()
    assert log == []  # no event touched: no wait, no query
    assert summary["bytes"] == 20 and summary["pending"] == 2 and summary["seconds"] == 0
    assert led.poll() == 1  # the logging interval: a completed, b still running
    assert log == ["query", "query"] and a.seconds == 0.25 and b.pending
    assert "synchronize" not in log
    assert [r.seconds for r in led.records()] == [0.25, 0.5]  # reading every time waits
    assert log.count("synchronize") == 1
