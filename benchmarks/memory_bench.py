"""Shard-only start-up and peak memory: train a NeoX model whose full fp32 weights exceed the memory
the plan predicts per rank, on 8 local CPU ranks, and compare each rank's measured peak with the cost
model's per-device total.

::

    python benchmarks/memory_bench.py                       # 24 x 768 NeoX, zero3, 3 steps
    python benchmarks/memory_bench.py --layers 12 --hidden 512 --plan zerotopo

Each run is ``zerotopo train`` in a subprocess (8 ranks on the emulated 2-node cluster, gloo). The
measured peak of a rank is its peak resident set above its resident set before any model state
existed (``zerotopo.trainer.peak``). A second, tiny run with the same batch and sequence measures the
fixed part of that figure that does not scale with the model (data pipeline, autograd and kernel
workspaces, allocator slack): ``fixed = measured - predicted`` of the tiny model. The large model's
figure is then ``(measured - fixed) / predicted``. Figures are printed; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30


def config(layers: int, hidden: int, heads: int, seq: int, steps: int, plan: str, precision: str) -> str:
    return f"""
num_layers: {layers}
hidden_size: {hidden}
num_attention_heads: {heads}
seq_length: {seq}
max_position_embeddings: {seq}
rotary_pct: 0.25
gpt_j_residual: true
no_weight_tying: true
init_method: small_init
output_layer_init_method: wang_init
checkpoint_activations: true
train_micro_batch_size_per_gpu: 1
gradient_accumulation_steps: 1
train_iters: {steps}
lr_decay_style: constant
warmup: 0.0
optimizer: {{type: AdamW, params: {{lr: 1.0e-4, betas: [0.9, 0.95], eps: 1.0e-8}}}}
weight_decay: 0.01
gradient_clipping: 1.0
precision: {precision}
tokenizer_type: ByteTokenizer
split: "949,50,1"
seed: 1234
eval_iters: 0
log_interval: 1
topology: emulated
plan: {plan}
"""


def train(workdir: Path, name: str, text: str) -> dict:
    cfg = workdir / f"{name}.yml"
    cfg.write_text(text)
    run = workdir / name
    cmd = [
        sys.executable,
        "-m",
        "zerotopo.cli.main",
        "train",
        str(cfg),
        "--run-dir",
        str(run),
        "--no-progress",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"{name}: zerotopo train failed ({proc.returncode})")
    for line in proc.stdout.splitlines():
        if line.startswith("peak memory per rank"):
            print(f"  [{name}] {line}")
    return json.loads((run / "summary.json").read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--plan", default="zero3")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--json", action="store_true", help="print the figures as JSON too")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="zerotopo-membench-") as tmp:
        work = Path(tmp)
        tiny = train(work, "tiny", config(2, 64, 4, a.seq, 2, a.plan, a.precision))
        big = train(work, "big", config(a.layers, a.hidden, a.heads, a.seq, a.steps, a.plan, a.precision))
    tp, bp = tiny["memory_peak"], big["memory_peak"]
    fixed = max(m - tp["predicted_bytes"] for m in tp["measured_bytes_per_rank"])
    pred = bp["predicted_bytes"]
    measured = bp["measured_bytes_per_rank"]
    full = 4 * big["parameters"]
    ratios = [(m - fixed) / pred for m in measured]
    print(
        f"model: {a.layers} layers x {a.hidden}, {big['parameters'] / 1e6:.1f}M parameters, full fp32 weights "
        f"{full / GIB:.3f} GiB; plan {big['plan']} ({big['degrees']}), {a.precision}, {big['world_size']} ranks, "
        f"{big['steps']} steps of 1 x {a.seq} tokens per rank"
    )
    p = bp["predicted"]
    print(
        f"cost model per device: {pred / GIB:.3f} GiB (params {p['params'] / GIB:.3f}, grads "
        f"{p['grads'] / GIB:.3f}, optim {p['optim'] / GIB:.3f}, secondary {p['secondary'] / GIB:.3f}, buffers "
        f"{p['buffers'] / GIB:.3f}, activations {p['activations'] / GIB:.3f})"
    )
    print(
        f"measured peak per rank: {', '.join(f'{m / GIB:.3f}' for m in measured)} GiB above baselines of "
        f"{min(bp['baseline_bytes_per_rank']) / GIB:.3f}-{max(bp['baseline_bytes_per_rank']) / GIB:.3f} GiB"
    )
    print(f"fixed part (tiny model's measured - predicted, max over ranks): {fixed / GIB:.3f} GiB")
    print(
        f"(measured - fixed) / predicted: {min(ratios):.3f} .. {max(ratios):.3f}; largest rank peak "
        f"{max(measured) / full:.2f} x the full fp32 model"
    )
    if a.json:
        print(
            json.dumps(
                {"tiny": tp, "big": bp, "fixed_bytes": fixed, "full_fp32_bytes": full, "ratios": ratios}
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
