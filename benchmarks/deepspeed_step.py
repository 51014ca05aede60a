"""DeepSpeed ZeRO-3 and ZeRO++ hpZ beside zerotopo's zero3/zeropp on the same model, batch and ranks.

    DS_ACCELERATOR=cpu python benchmarks/deepspeed_step.py [--steps 4]

``zerotopo bench compare`` (benchmarks/compare.py, docs/bench.md) supersedes this script: the same
DeepSpeed rows beside FSDP2 and every zerotopo preset, on the emulated Frontier with every tier shaped.

DeepSpeed runs with ``stage3_param_persistence_threshold: 0`` and ``stage3_max_reuse_distance: 0`` so
that it shards every parameter and gathers it again for the backward, as zerotopo's zero3 does (its
defaults keep parameters under 100k elements whole, most of a model this small, and keep gathered
parameters alive between forward and backward). Each configuration trains the small NeoX of ``zerotopo bench step`` on 8 local gloo ranks (2 emulated
nodes of 4), inside the same processes, one after the other; rank 0 prints the median step time and
tokens/s. DeepSpeed's quantized collectives (qwZ/qgZ) need its CUDA kernels, so its hpZ row runs the
secondary partition alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

MICRO, BATCH = 2, 2


def _tx_bytes() -> int | None:
    """Bytes sent so far on ``eth0``, the node's link inside an emulated network (``/proc/self/net/dev``
    is per network namespace; sysfs is not)."""
    try:
        with open("/proc/self/net/dev") as f:
            for line in f:
                name, _, fields = line.partition(":")
                if name.strip() == "eth0":
                    return int(fields.split()[8])
    except OSError:
        pass
    return None


def _timed(step, steps: int) -> tuple[float, float | None]:
    """Median step seconds, and the bytes per step that left this rank's node over its link (when the
    run is on an emulated network: what really crossed the slow tier, whoever sent it)."""
    import torch.distributed as dist

    times = []
    for i in range(steps + 1):
        dist.barrier()
        if i == 1:
            tx0 = _tx_bytes()
        t0 = time.perf_counter()
        step()
        dist.barrier()
        if i:
            times.append(time.perf_counter() - t0)
    tx1 = _tx_bytes()
    per_step = (tx1 - tx0) / steps if tx0 is not None and tx1 is not None else None
    return statistics.median(times), per_step


def _worker(rank: int, world: int, args: dict[str, Any]) -> list[tuple[str, tuple[float, float | None]]]:
    import torch
    import torch.nn.functional as F

    from zerotopo.comm.mesh import build_mesh
    from zerotopo.engine import ShardedOptimizer, parallelize
    from zerotopo.placement.plan import get_preset
    from zerotopo.placement.topology import load_topology
    from zerotopo_lab.bench.step import _model

    V, S = args["vocab"], args["seq"]
    g = torch.Generator().manual_seed(rank)

    def data():
        ids = torch.randint(0, V, (BATCH, S + 1), generator=g)
        return ids[:, :-1], ids[:, 1:].reshape(-1)

    rows = []
    topo = load_topology("emulated")
    for preset in args["plans"].split(","):
        model = parallelize(_model(args), mesh=build_mesh(topo, get_preset(preset), topo_index=rank))
        opt = ShardedOptimizer(model, lr=1e-4)

        def step(model=model, opt=opt):
            for _ in range(MICRO):
                x, y = data()
                (F.cross_entropy(model(x).reshape(-1, V), y) / MICRO).backward()
            opt.step()
            opt.zero_grad()

        rows.append((f"zerotopo {preset}", _timed(step, args["steps"])))

    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo", dist_init_required=False)
    for label, extra in (("deepspeed zero3", {}), ("deepspeed hpZ (s=4)", {"zero_hpz_partition_size": 4})):
        model = _model(args)
        config = {
            "train_micro_batch_size_per_gpu": BATCH,
            "gradient_accumulation_steps": MICRO,
            # DeepSpeed keeps parameters under 1e5 elements whole on every rank by default
            # (stage3_param_persistence_threshold) and keeps gathered parameters that are reused soon
            # (stage3_max_reuse_distance): 0 for both shards every parameter and frees it after use, the
            # ZeRO-3 schedule zerotopo's zero3 runs (gather in the forward, again in the backward).
            "zero_optimization": {
                "stage": 3,
                "stage3_param_persistence_threshold": 0,
                "stage3_max_reuse_distance": 0,
                **extra,
            },
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 10**9,
        }
        optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
        engine, *_ = deepspeed.initialize(
            model=model, optimizer=optim, config=config, dist_init_required=False
        )

        def step(engine=engine):
            for _ in range(MICRO):
                x, y = data()
                engine.backward(F.cross_entropy(engine(x).reshape(-1, V), y))
                engine.step()

        rows.append((label, _timed(step, args["steps"])))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument(
        "--plans", default="zero3,zeropp,zerotopo", help="zerotopo presets to run beside DeepSpeed"
    )
    parser.add_argument(
        "--network-mbit", type=float, help="root: emulated nodes joined by links shaped to this many Mbit/s"
    )
    a = parser.parse_args()
    from zerotopo.placement.topology import load_topology
    from zerotopo_lab.bench.step import run_local

    args = vars(a)
    if a.network_mbit:
        print(f"inter-node links shaped to {a.network_mbit:g} Mbit/s per node")
    rows = run_local(
        _worker,
        load_topology("emulated"),
        (args,),
        network_mbit=a.network_mbit,
        env={"DS_ACCELERATOR": "cpu"},
    )
    tokens = 8 * MICRO * BATCH * a.seq
    print(f"{'run':<22} {'step ms':>8} {'tokens/s':>9} {'MB/step out of node 0':>22}")
    for label, (sec, tx) in rows:
        sent = f"{tx / 1e6:.2f}" if tx is not None and a.network_mbit else "-"
        print(f"{label:<22} {1e3 * sec:>8.1f} {tokens / sec:>9.0f} {sent:>22}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    raise SystemExit(main())
