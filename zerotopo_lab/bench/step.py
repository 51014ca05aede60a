"""``zerotopo bench step``: step time, tokens/s and bytes per tier of every plan on local gloo ranks.

Each plan trains a small GPT-NeoX for a few steps on random tokens; rank 0 reports the median step time,
tokens per second, and the bytes one rank sent per tier in one step as the ledger counted them beside
the cost model's prediction (:func:`zerotopo.cost.comm.comm_per_step`). The ``sync`` rows run the
zerotopo plan with the emulated copy engine delayed (``--copy-delay-ms``) under ``none`` (stock hpZ
ordering, the race), ``event`` (zerotopo) and ``host`` (DeepSpeed's host block).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from typing import Any

from zerotopo.placement.plan import PRESETS

DEFAULT_PLANS = ",".join(PRESETS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--plans", default=DEFAULT_PLANS, help=f"comma-separated presets (default {DEFAULT_PLANS})"
    )
    parser.add_argument("--topology", default="emulated", help="topology (default: emulated, 8 ranks)")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per plan (default 4)")
    parser.add_argument("--micro-batches", type=int, default=2, help="micro-batches per step (default 2)")
    parser.add_argument("--batch", type=int, default=2, help="sequences per micro-batch (default 2)")
    parser.add_argument("--seq", type=int, default=64, help="sequence length (default 64)")
    parser.add_argument("--hidden", type=int, default=64, help="hidden size (default 64)")
    parser.add_argument("--layers", type=int, default=4, help="transformer layers (default 4)")
    parser.add_argument("--vocab", type=int, default=512, help="vocabulary (default 512)")
    parser.add_argument(
        "--copy-delay-ms", type=float, default=5.0, help="emulated copy delay for the sync rows"
    )
    parser.add_argument(
        "--grad-reduce", choices=("reduce_scatter", "allreduce"), help="override every plan's grad_reduce"
    )
    parser.add_argument("--no-sync-rows", action="store_true", help="skip the sync none/event/host rows")
    parser.add_argument(
        "--network-mbit",
        type=float,
        help="root: put each emulated node in its own network namespace, nodes joined by links shaped to "
        "this many Mbit/s (a bandwidth-starved inter-node tier; see zerotopo.launch.netem)",
    )


def _model(args: Any) -> Any:
    import torch

    from zerotopo.models.neox import GPTNeoX, NeoXConfig

    torch.manual_seed(0)
    cfg = NeoXConfig(
        vocab_size=args["vocab"],
        hidden_size=args["hidden"],
        num_layers=args["layers"],
        num_attention_heads=max(1, args["hidden"] // 16),
        max_position_embeddings=args["seq"],
    )
    return GPTNeoX(cfg)


def _worker(rank: int, world: int, args: dict[str, Any], rows: list[tuple[str, str, float]]) -> list[dict]:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from zerotopo.comm.ledger import Ledger
    from zerotopo.comm.mesh import build_mesh
    from zerotopo.cost.comm import bytes_by_tier, comm_per_step
    from zerotopo.engine import ShardedOptimizer, debug
    from zerotopo.placement.plan import get_preset
    from zerotopo.placement.topology import load_topology

    topo = load_topology(args["topology"])
    out = []
    g = torch.Generator().manual_seed(rank)
    M, B, S, V = args["micro_batches"], args["batch"], args["seq"], args["vocab"]
    for label, preset, delay in rows:
        plan = get_preset(preset)
        if args.get("grad_reduce"):
            plan = replace(plan, grad_reduce=args["grad_reduce"])
        unordered = label == "sync=none"  # the engine's race hook, not a plan option
        if label.startswith("sync=") and not unordered:
            plan = replace(plan, sync=label.split("=", 1)[1])
        mesh = build_mesh(topo, plan, topo_index=rank)
        ledger = Ledger()
        options = debug.DebugOptions(ledger=ledger, copy_delay_ms=delay, unordered_secondary=unordered)
        model = debug.parallelize(_model(args), mesh=mesh, options=options)
        opt = ShardedOptimizer(model, lr=1e-4)
        times = []
        for step in range(args["steps"] + 1):
            ledger.reset()
            dist.barrier()
            t0 = time.perf_counter()
            for k in range(M):
                ids = torch.randint(0, V, (B, S + 1), generator=g)
                logits = model(ids[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, V), ids[:, 1:].reshape(-1)) / M
                model.set_is_last_backward(k == M - 1)
                loss.backward()
            opt.step()
            opt.zero_grad()
            dist.barrier()
            if step:  # the first step records the forward order and warms up
                times.append(time.perf_counter() - t0)
        measured = ledger.bytes_by_tier()
        predicted = bytes_by_tier(
            comm_per_step(model.unit_numels(), topo, plan, micro_batches=M, param_bytes=4, reduce_bytes=4),
            topo,
        )
        step_s = statistics.median(times)
        out.append(
            {
                "plan": preset,
                "label": label,
                "degrees": plan.label(topo),
                "step_ms": 1e3 * step_s,
                "tokens_per_s": world * M * B * S / step_s,
                "measured": {k: v for k, v in measured.items() if v},
                "predicted": {k: v for k, v in predicted.items() if v},
            }
        )
        model.close()
    return out


def bench(args: dict[str, Any]) -> list[dict]:
    """Run the benchmark on local ranks; returns rank 0's rows."""
    from zerotopo.placement.topology import load_topology

    topo = load_topology(args["topology"])
    rows = [(p, p, 0.0) for p in args["plans"]]
    if args["sync_rows"]:
        rows += [(f"sync={s}", "zerotopo", args["copy_delay_ms"]) for s in ("none", "event", "host")]
    return run_local(_worker, topo, (args, rows), network_mbit=args.get("network_mbit"))


def run_local(
    fn: Any, topo: Any, fn_args: tuple, *, network_mbit: float | None = None, env: dict | None = None
):
    """Rank 0's result of ``fn`` on the topology's ranks spawned here, optionally over a shaped network."""
    from zerotopo.launch.spawn import spawn

    def go(network: Any = None) -> Any:
        return spawn(
            fn,
            topo.world_size,
            args=fn_args,
            ranks_per_node=topo.devices_per_node,
            timeout_s=3600,
            env=env,
            network=network,
        )[0]

    if network_mbit:
        from zerotopo.launch.netem import emulated_network

        with emulated_network(topo.nodes, rate_mbit=network_mbit) as net:
            return go(net)
    return go()


def _fmt_bytes(d: dict[str, int]) -> str:
    return " ".join(f"{k}:{v / 1024:.1f}K" for k, v in sorted(d.items())) or "-"


def table(results: list[dict]) -> str:
    lines = [
        f"{'plan':<14} {'degrees':<28} {'step ms':>8} {'tokens/s':>9}  {'ledger bytes/step':<40} cost model",
    ]
    for r in results:
        lines.append(
            f"{r['label']:<14} {r['degrees']:<28} {r['step_ms']:>8.1f} {r['tokens_per_s']:>9.0f}  "
            f"{_fmt_bytes(r['measured']):<40} {_fmt_bytes(r['predicted'])}"
            + ("" if r["measured"] == r["predicted"] else "  MISMATCH")
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    opts = {
        "plans": [p.strip() for p in args.plans.split(",") if p.strip()],
        "topology": args.topology,
        "steps": args.steps,
        "micro_batches": args.micro_batches,
        "batch": args.batch,
        "seq": args.seq,
        "hidden": args.hidden,
        "layers": args.layers,
        "vocab": args.vocab,
        "copy_delay_ms": args.copy_delay_ms,
        "sync_rows": not args.no_sync_rows,
        "grad_reduce": args.grad_reduce,
        "network_mbit": args.network_mbit,
    }
    if args.network_mbit:
        print(f"inter-node links shaped to {args.network_mbit:g} Mbit/s per node")
    print(table(bench(opts)))
    return 0
