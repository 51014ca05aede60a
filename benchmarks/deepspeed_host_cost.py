"""DeepSpeed ZeRO-3's host work per module, with no compute and no network to hide it.

    DS_ACCELERATOR=cpu python benchmarks/deepspeed_host_cost.py [--modules 32,128] [--repeats 5]

One process, one gloo rank: a stack of ``--modules`` bias-free ``Linear(64, 64)`` modules trains one
sample per step under DeepSpeed stage 0 (no sharding) and stage 3 (every parameter sharded and fetched:
``stage3_param_persistence_threshold: 0``). The matrices are so small that a step is the host's work:
the hooks, the fetch and release of each module's parameters, the gradient hooks and bucket copies.
The difference per module between the two stages is what stage 3 adds on the host for each module in
each step (one forward fetch, one backward fetch, one gradient reduction). Prints the best of
``--repeats`` timings of 10 steps each.

docs/cost-model.md (papers/004) compares this with the device time of LLaMA-7B's modules: a GPU's
host runs ahead of its device when its work per module is shorter than the module's compute.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
import warnings

from zerotopo.launch.spawn import free_port


def step_seconds(stage: int, modules: int, width: int, repeats: int) -> float:
    """Best seconds per training step of ``modules`` Linear layers under DeepSpeed ZeRO ``stage``."""
    import deepspeed
    import torch
    from torch import nn

    config = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0, "overlap_comm": True},
        "optimizer": {"type": "SGD", "params": {"lr": 1e-4}},
        "zero_allow_untested_optimizer": True,
    }

    def build() -> nn.Module:
        return nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(modules)])

    torch.manual_seed(0)
    if stage == 3:
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = build()
    else:
        model = build()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    x = torch.randn(1, width)

    def step() -> None:
        engine.backward(engine(x).sum())
        engine.step()

    for _ in range(5):  # DeepSpeed records its module trace in the first steps, then prefetches by it
        step()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(10):
            step()
        best = min(best, (time.perf_counter() - t0) / 10)
    engine.destroy()
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modules", default="32,128", help="comma-separated module counts (default 32,128)")
    p.add_argument("--width", type=int, default=64, help="features of each Linear (default 64)")
    p.add_argument("--repeats", type=int, default=5, help="timings of 10 steps; the best is kept")
    args = p.parse_args(argv)
    try:
        counts = [int(x) for x in args.modules.split(",")]
        if not counts or min(counts) < 1:
            raise ValueError
    except ValueError:
        p.error(f"--modules must be positive integers separated by commas, got {args.modules!r}")

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    os.environ.update(LOCAL_RANK="0")
    try:
        import deepspeed
    except ImportError:
        print("DeepSpeed is not installed: DS_BUILD_OPS=0 pip install deepspeed")
        return 2
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's notes on DeepSpeed's collectives
    deepspeed.init_distributed(dist_backend="gloo")

    print(
        f"{'modules':>8} {'stage 0 ms':>11} {'stage 3 ms':>11} {'stage 3 adds, us per module per step':>38}"
    )
    for n in counts:
        s0 = step_seconds(0, n, args.width, args.repeats)
        s3 = step_seconds(3, n, args.width, args.repeats)
        print(f"{n:>8} {s0 * 1e3:>11.2f} {s3 * 1e3:>11.2f} {(s3 - s0) / n * 1e6:>38.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
