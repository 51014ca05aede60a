"""``zerotopo plan``: rank sharding plans for a model on a machine by memory and predicted step time.

The model comes from NeoX-style YAML (``--model configs/neox-20b.yml`` or ``--model neox-20b``, several
files merge); its micro-batch size, gradient accumulation, activation checkpointing and precision are the
defaults of the matching flags. See docs/plans.md and docs/cost-model.md.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

from zerotopo.config.neox import NeoXArgs, load_neox_config
from zerotopo.cost.calibration import apply_calibration, load_calibration
from zerotopo.cost.comm import intra_inter_bytes
from zerotopo.cost.memory import GIB
from zerotopo.cost.planner import CostOptions, PlanEstimate, plan_candidates
from zerotopo.errors import ConfigError
from zerotopo.models.shape import ModelShape
from zerotopo.topology import Topology, load_topology

#: Embedding rows when the tokenizer is not at hand: GPT-NeoX-20B's padded vocabulary (50277 tokens).
DEFAULT_VOCAB = 50432


def configs_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "configs"


def resolve_model_paths(specs: list[str]) -> list[str]:
    """``neox-20b`` -> ``configs/neox-20b.yml``; paths pass through."""
    out = []
    for spec in specs:
        p = Path(spec)
        if p.exists():
            out.append(str(p))
            continue
        for ext in (".yml", ".yaml"):
            cand = configs_dir() / f"{spec}{ext}"
            if cand.exists():
                out.append(str(cand))
                break
        else:
            names = ", ".join(sorted(x.stem for x in configs_dir().glob("*.yml")))
            raise ConfigError(
                f"model {spec!r} is neither a file nor a config in configs/ ({names})", source="--model"
            )
    return out


def tokenizer_vocab(path: str | None) -> int | None:
    """Token count of a Hugging Face tokenizers JSON file, if it exists (vocabulary + added tokens)."""
    if not path or not Path(path).is_file():
        return None
    try:
        raw = json.loads(Path(path).read_text())
        ids = set(raw["model"]["vocab"].values()) | {t["id"] for t in raw.get("added_tokens", [])}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return max(ids) + 1 if ids else None


def load_model(specs: list[str], vocab_size: int | None) -> tuple[ModelShape, NeoXArgs]:
    """The model shape and training settings of NeoX-style config files."""
    paths = resolve_model_paths(specs)
    with warnings.catch_warnings():
        # keys of other subsystems are not this command's business
        warnings.simplefilter("ignore")
        args = load_neox_config(paths)
    vocab = vocab_size or tokenizer_vocab(args.vocab_file) or DEFAULT_VOCAB
    name = Path(paths[-1]).stem
    return args.model_shape(vocab, name=name), args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--topology", default="frontier", help="built-in name or YAML file (default frontier)"
    )
    parser.add_argument("--nodes", type=int, default=None, help="node count (default: the topology's)")
    parser.add_argument(
        "--model",
        nargs="+",
        required=True,
        help="NeoX-style YAML file(s), or a name from configs/ (neox-20b)",
    )
    parser.add_argument("--micro-batch", type=int, default=None, help="samples per device per micro-batch")
    parser.add_argument("--grad-accum", type=int, default=None, help="micro-batches per step")
    parser.add_argument(
        "--plans",
        default="auto",
        help="all | auto (presets + the best Lins-style plans) | presets | comma-separated preset names",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    parser.add_argument("--calibration", default=None, help="measured bandwidth table (zerotopo calibrate)")
    parser.add_argument("--efficiency", type=float, default=0.5, help="fraction of peak FLOPS reached (0.5)")
    parser.add_argument(
        "--vocab-size", type=int, default=None, help=f"tokenizer vocabulary (default {DEFAULT_VOCAB})"
    )
    parser.add_argument(
        "--memory-gib", type=float, default=None, help="device memory budget (default: device's)"
    )
    parser.add_argument(
        "--grad-dtype",
        choices=("param", "fp32"),
        default=None,
        help="gradient width for plans that do not set it: param (the parameter dtype, DeepSpeed's "
        "default) or fp32 (default: the config's data_types.grad_accum_dtype, else param)",
    )
    parser.add_argument("--top", type=int, default=None, help="print only the first N rows")
    parser.add_argument(
        "--all-degrees", action="store_true", help="search degrees that are not tier-aligned too"
    )


def _positive(name: str, value: int | float | None) -> None:
    if value is not None and value <= 0:
        raise ConfigError(f"expected a positive number, found {value}", source=name)


def estimates(args: argparse.Namespace) -> tuple[list[PlanEstimate], Topology, ModelShape, CostOptions]:
    """Run the planner for parsed arguments."""
    for flag in ("nodes", "micro_batch", "grad_accum", "vocab_size", "memory_gib", "top"):
        _positive(f"--{flag.replace('_', '-')}", getattr(args, flag))
    if not 0 < args.efficiency <= 1:
        raise ConfigError(f"expected a fraction in (0, 1], found {args.efficiency}", source="--efficiency")
    topo = load_topology(args.topology, nodes=args.nodes)
    if args.calibration:
        topo = apply_calibration(topo, load_calibration(args.calibration))
    shape, neox = load_model(args.model, args.vocab_size)
    precision = neox.resolved_precision
    options = CostOptions(
        micro_batch=args.micro_batch or neox.train_micro_batch_size_per_gpu or 1,
        grad_accum=args.grad_accum or neox.gradient_accumulation_steps or 1,
        efficiency=args.efficiency,
        checkpoint_activations=bool(neox.checkpoint_activations),
        param_bytes=4 if precision == "fp32" else 2,
        fp16=precision == "fp16",
        grad_dtype=args.grad_dtype or neox.grad_dtype,
        memory_limit_bytes=args.memory_gib * GIB if args.memory_gib else None,
    )
    est = plan_candidates(shape, topo, plans=args.plans, aligned=not args.all_degrees, options=options)
    if args.top:
        est = est[: args.top]
    return est, topo, shape, options


def table(est: list[PlanEstimate], topo: Topology, shape: ModelShape, options: CostOptions) -> str:
    """The human-readable ranking."""
    head = (
        f"{shape.name}: {shape.param_count() / 1e9:.2f}B parameters on {topo.name} x {topo.nodes} nodes "
        f"({topo.world_size} x {topo.device.name}, {topo.device.memory_gib:g} GiB); micro-batch "
        f"{options.micro_batch}, {options.grad_accum} micro-batches per step, efficiency {options.efficiency:g}"
    )
    cols = [
        "plan",
        "degrees",
        "params",
        "second",
        "grads",
        "optim",
        "total",
        "max B",
        "intra GB",
        "inter GB",
        "step s",
    ]
    cols += ["TFLOPS", "fits"]
    rows = [cols]
    for e in est:
        m = e.memory
        intra, inter = intra_inter_bytes(e.comm, topo)
        rows.append(
            [
                "lins" if e.name == e.plan.label() else e.name,  # enumerated plans are named by label
                e.plan.label(topo),
                *(f"{x / GIB:.2f}" for x in (m.params, m.secondary, m.grads, m.optim, m.total)),
                f"{e.max_params / 1e9:.1f}",
                f"{intra / 1e9:.1f}",
                f"{inter / 1e9:.1f}",
                f"{e.time.step_time_s:.3f}",
                f"{e.time.tflops_per_device:.1f}"
                if e.time.tflops_per_device >= 10
                else f"{e.time.tflops_per_device:.3g}",
                "yes" if e.fits else "NO",
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    lines = [
        head,
        "memory per device in GiB; max B: the largest model (billions of parameters) whose model states "
        "fit a device (no buffers or activations); bytes each device sends per step in GB",
        "",
    ]
    for r in rows:
        lines.append(
            "  ".join(c.rjust(w) if i >= 2 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    est, topo, shape, options = estimates(args)
    if args.json:
        print(json.dumps([e.to_json(topo) for e in est], indent=2))
    else:
        print(table(est, topo, shape, options))
    return 0
