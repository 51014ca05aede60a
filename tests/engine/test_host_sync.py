"""Steady-state steps of every preset make no host-synchronizing call (DESIGN.md rule 3).

One spawn of 4 gloo ranks (2 nodes x 2 ranks, launched in the closest binding's order, so the
launcher's rank order is not topological) trains every preset, fp16 loss scaling with an overflow,
and the sorted-group fallback of the mesh. After two warm-up steps (which record the unit order and
make the index tensors of the groups), :class:`~tests.engine.hostsync.HostSyncCounter` counts the
calls that would make the host wait on an accelerator during the next steps: forward, backward,
``optimizer.step()``, ``zero_grad()`` and ``ledger.mark_step()`` — everything a step does outside the
logging interval. The test's own reading of the losses happens after the counted window.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.engine.cases import MICRO, batch, loss_fn, make_model
from zerotopo.launch.spawn import spawn
from zerotopo.placement.plan import PRESETS

pytestmark = pytest.mark.slow

WARMUP, COUNTED = 2, 3
CASES: list[dict[str, Any]] = [{"plan": name} for name in PRESETS] + [
    {"plan": "zero3", "name": "zero3-fp16-overflow", "param_dtype": torch.float16, "overflow_at": WARMUP + 1},
    {"plan": "zerotopo", "name": "zerotopo-bf16-clip", "param_dtype": torch.bfloat16, "clip": 0.5},
    {"plan": "zerotopo", "name": "zerotopo-sorted-groups", "sorted_groups": True},
]


def _topology():
    from zerotopo.placement.topology import topology_from_mapping

    return topology_from_mapping(
        {
            "name": "two-by-two",
            "nodes": 2,
            "device": {"name": "CPU rank", "memory_gib": 2, "peak_tflops": 0.05},
            "tiers": [{"name": "node", "fanout": 2, "bandwidth_gbps": 4.0, "latency_us": 20}],
            "network": {"name": "network", "injection_gbps": 2.0, "latency_us": 100},
        }
    )


def _worker(rank: int, world: int) -> list[dict[str, Any]]:
    from tests.engine.hostsync import HostSyncCounter
    from zerotopo.comm import mesh as mesh_mod
    from zerotopo.comm.ledger import Ledger
    from zerotopo.engine import MixedPrecision, ShardedOptimizer, debug
    from zerotopo.placement.plan import get_preset

    topo = _topology()
    node, local = divmod(rank, 2)
    index = node * 2 + (1 - local)  # the closest binding's order: local rank 0 drives device 1
    out = []
    supported = mesh_mod._sort_ranks_supported
    for case in CASES:
        mesh_mod._sort_ranks_supported = (lambda: False) if case.get("sorted_groups") else supported
        mesh = mesh_mod.build_mesh(topo, get_preset(case["plan"]), topo_index=index)
        mesh_mod._sort_ranks_supported = supported
        ledger = Ledger()
        model = debug.parallelize(
            make_model({}),
            mesh=mesh,
            mp_policy=MixedPrecision(case.get("param_dtype", torch.float32)),
            options=debug.DebugOptions(ledger=ledger, sanitize=True),
        )
        optimizer = ShardedOptimizer(model, lr=1e-2, max_grad_norm=case.get("clip"))
        losses, stats, counts, report = [], [], {}, ""
        for s in range(WARMUP + COUNTED):
            counter = HostSyncCounter()
            counting = s >= WARMUP
            with counter if counting else _Nothing():
                loss_sum = torch.zeros(())
                for m in range(MICRO):
                    x, y = batch(s, rank, m)
                    loss = loss_fn(model(x), y) / MICRO
                    boost = 1e30 if case.get("overflow_at") == s else 1.0
                    model.scale_loss(loss * boost).backward()
                    loss_sum += loss.detach()
                st = optimizer.step()
                optimizer.zero_grad()
                ledger.mark_step()
            if counting:
                for k, v in counter.counts.items():
                    counts[k] = counts.get(k, 0) + v
                if counter.total:
                    report += counter.report() + "\n"
            losses.append(loss_sum)
            stats.append(st)
        model.close()
        out.append(
            {
                "name": case.get("name", case["plan"]),
                "counts": counts,
                "report": report,
                "losses": [float(v) for v in losses],  # the logging interval: read after the window
                "skipped": [bool(st["skipped"]) for st in stats],
                "in_order": all(mesh.group(k).in_order for k in mesh.kinds),
            }
        )
    return out


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


@pytest.fixture(scope="module")
def results() -> list[list[dict[str, Any]]]:
    return spawn(_worker, 4, ranks_per_node=2, timeout_s=600)


def test_host_sync_zero_in_steady_state_steps_of_every_preset(results) -> None:
    names = [r["name"] for r in results[0]]
    assert set(PRESETS) <= set(names)
    for rank, per_rank in enumerate(results):
        for res in per_rank:
            assert res["counts"] == {}, f"rank {rank}, {res['name']}:\n{res['report']}"
            assert all(v == v and abs(v) < 1e3 for v in res["losses"]), (res["name"], res["losses"])


def test_host_sync_fp16_overflow_skips_without_reading_the_flag(results) -> None:
    for per_rank in results:
        res = next(r for r in per_rank if r["name"] == "zero3-fp16-overflow")
        assert res["skipped"] == [False, False, False, True, False]
        assert res["counts"] == {}


def test_host_sync_groups_follow_topological_order(results) -> None:
    """Launched out of topological order, every group is still numbered by position (no permutation),
    except in the sorted-group fallback, which permutes with index tensors made once."""
    for per_rank in results:
        for res in per_rank:
            assert res["in_order"] == (res["name"] != "zerotopo-sorted-groups"), res["name"]


def test_host_sync_counter_sees_the_calls_it_counts() -> None:
    """The counter is not blind: each kind of host sync it claims to count is counted."""
    from tests.engine.hostsync import HostSyncCounter

    x = torch.arange(6.0)
    with HostSyncCounter() as c:
        x.sum().item()
        x.tolist()
        bool(x[0] > 0)
        float(x[1])
        x[[0, 2]]
        torch.tensor([1.0, 2.0])
        torch.as_tensor(x)  # a tensor already: no copy, not counted
        x.cpu()
    assert dict(c.counts) == {
        "Tensor.item": 1,
        "Tensor.tolist": 1,
        "Tensor.__bool__": 1,
        "Tensor.__float__": 1,
        "Tensor[list]": 1,
        "torch.tensor(python data)": 1,
        "Tensor.cpu": 1,
    }
    x.sum().item()  # restored on exit
    assert c.total == 7
