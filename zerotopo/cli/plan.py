"""``zerotopo plan``: rank sharding plans for a model on a machine by memory and predicted step time.

``python -m zerotopo.cli.plan docs/cost-model.md`` rewrites the document's generated sections: each
opens with a marker naming a ``zerotopo plan`` command (:data:`DOC_MARKER`) and holds its output.

The model comes from NeoX-style YAML (``--model configs/neox-20b.yml`` or ``--model neox-20b``, several
files merge); its micro-batch size, gradient accumulation, activation checkpointing and precision are the
defaults of the matching flags. See docs/plans.md and docs/cost-model.md.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from zerotopo.cli import lab
from zerotopo.config.model_files import DEFAULT_VOCAB, load_model, resolve_model_paths, tokenizer_vocab  # noqa: F401
from zerotopo.cost.bandwidth import curve_set
from zerotopo.cost.calibration import calibrated
from zerotopo.cost.comm import intra_inter_bytes
from zerotopo.cost.memory import GIB
from zerotopo.cost.planner import MODEL_ERROR, CostOptions, PlanEstimate, plan_candidates, recommendation
from zerotopo.cost.presets import resolve
from zerotopo.errors import ConfigError
from zerotopo.placement import numbers
from zerotopo.placement.plan import PRESETS
from zerotopo.placement.shape import ModelShape
from zerotopo.placement.topology import Topology, load_topology


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--topology", default="frontier", help="built-in name or YAML file (default frontier)"
    )
    parser.add_argument("--nodes", type=int, default=None, help="node count (default: the topology's)")
    parser.add_argument(
        "--model",
        nargs="+",
        default=None,
        help="NeoX-style YAML file(s), or a name from configs/ (neox-20b); required but with --validate",
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
    _add_input_arguments(parser)
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
    parser.add_argument(
        "--exact",
        action="store_true",
        help="with --plans auto: simulate every candidate that could be among the fastest, instead of "
        f"stopping where none left could beat those found by more than the model's measured error "
        f"({100 * MODEL_ERROR:g}%%); slow on large machines",
    )
    parser.add_argument(
        "--explain",
        metavar="PLAN",
        default=None,
        help="print where each second of PLAN's step goes and why it beats (or loses to) the others",
    )
    parser.add_argument(
        "--scaling",
        metavar="NODES",
        default=None,
        help="comma-separated node counts: predicted TFLOPS per device of the chosen plans at each",
    )
    parser.add_argument("--plot", metavar="PNG", default=None, help="with --scaling: draw the chart to PNG")
    parser.add_argument(
        "--unit-layers",
        metavar="K",
        default="1",
        help="layers per gather unit the planner may choose from, comma-separated (default 1, the "
        "engine's; larger units send larger messages and hold larger buffers)",
    )
    parser.add_argument(
        "--optimizer",
        default=None,
        help="adamw,muon: the ranking prices the first (default: the config's optimizer); after it, each "
        "plan under each optimizer side by side (Muon's state bytes, Newton-Schulz time and exchange; see "
        "docs/optimizers.md)",
    )


def _add_input_arguments(parser: argparse.ArgumentParser) -> None:
    """The measured inputs (compute rate, curve set) and the papers' validation."""
    parser.add_argument(
        "--tflops",
        type=float,
        default=None,
        help="TFLOPS per device the compute reaches (measured); replaces --efficiency",
    )
    parser.add_argument(
        "--curves",
        default=None,
        help="shipped bandwidth curve set of the topology: default, or another measured set (frontier: "
        "rdzv0, measured with FI_CXI_RDZV_*=0)",
    )
    parser.add_argument(
        "--validate",
        choices=("papers",),
        default=None,
        help="papers: each published figure of Xu et al. 2025 and Lins 2024 against the model's band over "
        "the inputs the papers leave out (micro-batch, efficiency, curve set); see docs/cost-model.md",
    )


def _positive(name: str, value: int | float | None, maximum: float = 2**40) -> None:
    if value is None:
        return
    bound = int(maximum) if float(maximum).is_integer() else maximum
    wording = f"expected a positive number up to {bound}, found {{found}}"
    numbers.number(
        value,
        above=0,
        maximum=maximum,
        messages=wording,
        error=lambda message: ConfigError(message, source=name),
    )


def named_plans(spec: str) -> str | list:
    """``--plans`` for the planner: ``auto``/``all``/``presets``, or each named plan as a preset name or, for
    another framework's cost preset (the lab's ``deepspeed-*``), its ``(Plan, ScheduleModel)`` pair."""
    if spec in ("all", "auto", "presets"):
        return spec
    names = [p.strip() for p in spec.split(",") if p.strip()]
    others = lab.cost_presets()
    out: list = []
    for name in names:
        key = name.lower().replace("_", "-")
        if key in others:
            out.append(others[key])
        else:
            try:
                resolve(name)  # an unknown name fails here, naming the presets (and the lab for deepspeed-*)
            except ConfigError:
                if not others:
                    raise
                raise ConfigError(
                    f"unknown plan preset {name!r}; presets are {', '.join(PRESETS)}, and for the cost model "
                    f"{', '.join(others)}",
                    key="plan",
                ) from None
            out.append(name)
    return out


def optimizer_pricing(optimizer: Any, kinds: str | None) -> dict[str, Any]:
    """The :class:`CostOptions` fields that price the ranking's optimizer: the first of ``--optimizer``'s
    ``kinds`` when given, else the config's ``optimizer`` block (Muon: its ``ns_steps`` and aux states)."""
    from zerotopo.cli.plan_optim import ADAMW_BYTES, parse_kinds
    from zerotopo.cost.muon import MuonPricing

    configured = optimizer.type.lower() == "muon"
    muon = parse_kinds(kinds)[0] == "muon" if kinds is not None else configured
    if not muon:
        return {"optim_bytes_per_param": ADAMW_BYTES if configured else optimizer.bytes_per_param()}
    if not configured:
        return {"muon": MuonPricing()}  # torch's 5 Newton-Schulz steps, an AdamW aux
    # the config's Muon: its Newton-Schulz steps; its states but the momentum are the aux's
    steps = int(optimizer.options.get("ns_steps", MuonPricing.ns_steps))
    return {"muon": MuonPricing(ns_steps=steps, aux_states=len(optimizer.state_names()) - 1)}


def estimates(args: argparse.Namespace) -> tuple[list[PlanEstimate], Topology, ModelShape, CostOptions]:
    """Run the planner for parsed arguments."""
    from zerotopo.placement.topology import MAX_NODES

    limits = {"nodes": MAX_NODES, "micro_batch": 1 << 20, "grad_accum": 1 << 20, "vocab_size": 1 << 24}
    for flag in ("nodes", "micro_batch", "grad_accum", "vocab_size", "memory_gib", "top"):
        _positive(f"--{flag.replace('_', '-')}", getattr(args, flag), limits.get(flag, 2**40))
    if not 0 < args.efficiency <= 1:
        raise ConfigError(f"expected a fraction in (0, 1], found {args.efficiency}", source="--efficiency")
    _positive("--tflops", getattr(args, "tflops", None), 1e7)
    topo = load_topology(args.topology, nodes=args.nodes)
    measured: dict = {}
    if getattr(args, "curves", None):
        if args.calibration:
            raise ConfigError("give --curves or --calibration, not both", source="--curves")
        measured["bandwidth"] = curve_set(topo.name, args.curves)
    if args.calibration:
        # a measured table replaces the topology's shipped curves and figures
        topo, measured = calibrated(topo, args.calibration)
    try:
        unit_layers = tuple(sorted({int(x) for x in str(args.unit_layers).split(",") if x.strip()}))
    except ValueError:
        unit_layers = ()
    if not unit_layers or min(unit_layers) < 1:
        raise ConfigError(
            f"expected positive layer counts, found {args.unit_layers!r}", source="--unit-layers"
        )
    shape, neox = load_model(args.model, args.vocab_size)
    precision = neox.precision.resolved
    options = CostOptions(
        micro_batch=args.micro_batch or neox.batch.micro_batch_size or 1,
        grad_accum=args.grad_accum or neox.batch.gradient_accumulation_steps or 1,
        efficiency=args.efficiency,
        achieved_tflops=getattr(args, "tflops", None) or measured.pop("achieved_tflops", None),
        checkpoint_activations=bool(neox.model.checkpoint_activations),
        param_bytes=4 if precision == "fp32" else 2,
        fp16=precision == "fp16",
        grad_dtype=args.grad_dtype or neox.precision.grad_dtype,
        **optimizer_pricing(neox.optim.optimizer, getattr(args, "optimizer", None)),
        memory_limit_bytes=args.memory_gib * GIB if args.memory_gib else None,
        unit_layers=unit_layers,
        search_tolerance=0.0 if getattr(args, "exact", False) else MODEL_ERROR,
        **measured,
    )
    est = plan_candidates(
        shape, topo, plans=named_plans(args.plans), aligned=not args.all_degrees, options=options
    )
    if args.top:
        est = est[: args.top]
    return est, topo, shape, options


def table(est: list[PlanEstimate], topo: Topology, shape: ModelShape, options: CostOptions) -> str:
    """The human-readable ranking."""
    head = (
        f"{shape.name}: {shape.param_count() / 1e9:.2f}B parameters on {topo.name} x {topo.nodes} nodes "
        f"({topo.world_size} x {topo.device.name}, {topo.device.memory_gib:g} GiB); micro-batch "
        f"{options.micro_batch}, {options.grad_accum} micro-batches per step, {_compute(options)}"
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
                e.plan.label(topo) + (f" u={e.unit_layers}" if e.unit_layers not in (None, 1) else ""),
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
    return columns(
        [
            head,
            "memory per device in GiB; max B: the largest model (billions of parameters) whose model states "
            "fit a device (no buffers or activations); bytes each device sends per step in GB",
        ],
        rows,
    )


def columns(head: list[str], rows: list[list[str]]) -> str:
    """``head``'s lines, a blank line, then ``rows`` in columns: the first two left-aligned (names),
    the rest right-aligned (figures)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [*head, ""]
    for r in rows:
        lines.append(
            "  ".join(c.rjust(w) if i >= 2 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
        )
    return "\n".join(lines)


def _compute(options: CostOptions) -> str:
    """How the compute is priced, and the curves when not the shipped default."""
    rate = (
        f"compute at {options.achieved_tflops:g} TFLOPS per device"
        if options.achieved_tflops
        else f"efficiency {options.efficiency:g}"
    )
    if options.bandwidth is not None:
        rate += f", curves {Path(options.bandwidth.source).name}"
    if options.muon is not None:
        m = options.muon
        rate += (
            f"; optimizer Muon ({m.state_bytes_per_param} B/param of state on the chunks and the owners' whole "
            f"matrices, {m.ns_steps} bf16 Newton-Schulz steps on each matrix's owner and the exchange added to "
            "the step)"
        )
    return rate


def _tflops(x: float) -> str:
    return f"{x:.1f}" if x >= 10 else f"{x:.3g}"


def _fmt_s(x: float) -> str:
    return f"{x:.3f}" if x < 100 else f"{x:.1f}"


def explain(e: PlanEstimate, others: list[PlanEstimate], topo: Topology) -> str:
    """Where each second of ``e``'s step goes, and how it compares with the other plans."""
    t = e.time
    busy = t.compute_s + t.optimizer_s + t.host_s  # the device's own work: FLOPs, optimizer step, host waits
    other = t.step_time_s - busy - t.slowdown_s - t.exposed_comm_s
    lines = [
        f"{e.name} ({e.plan.label(topo)}) on {topo.name} x {topo.nodes} nodes: step {t.step_time_s:.3f} s "
        f"= compute {busy:.3f} s + compute slowdown {t.slowdown_s:.3f} s + exposed communication "
        f"{t.exposed_comm_s:.3f} s" + (f" + {other:.3f} s" if abs(other) > 1e-6 else ""),
        f"  compute: {t.compute_s:.3f} s of FLOPs, optimizer step (unscale, clipping, AdamW; memory-bound) "
        f"{t.optimizer_s:.3f} s, framework host work beyond the FLOPs {t.host_s:.3f} s",
        f"  {t.tflops_per_device:.1f} TFLOPS per device, MFU {100 * t.mfu:.1f}%; communication "
        f"{t.comm_s:.3f} s in all, {t.comm_s - t.exposed_comm_s:.3f} s of it hidden under compute",
        "",
    ]
    rows = [["phase", "collective", "group", "tier", "calls", "total s", "hidden s", "exposed s"]]
    for sh in sorted(e.time.breakdown, key=lambda x: -x.seconds):
        rows.append(
            [sh.phase, sh.op, sh.group, sh.tier, str(sh.calls), _fmt_s(sh.seconds), _fmt_s(sh.hidden_s),
             _fmt_s(sh.exposed_s)]
        )  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        lines.append(
            "  " + "  ".join(c.rjust(w) if i >= 4 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
        )
    for o in others:
        if o is e:
            continue
        lines.append("")
        lines.append(compare(e, o))
    return "\n".join(lines)


def _exposed_by_phase(e: PlanEstimate) -> dict[str, tuple[float, str]]:
    out: dict[str, tuple[float, str]] = {}
    for sh in e.time.breakdown:
        x, where = out.get(sh.phase, (0.0, ""))
        label = f"{sh.op} over {sh.tier}"
        out[sh.phase] = (x + sh.exposed_s, where if where and x >= sh.exposed_s else label)
    return out


def compare(a: PlanEstimate, b: PlanEstimate) -> str:
    """One paragraph: why ``a`` is faster or slower than ``b``."""
    ta, tb = a.time.step_time_s, b.time.step_time_s
    verb = "faster" if ta < tb else "slower"
    head = f"vs {b.name} ({tb:.3f} s): {a.name} is {abs(tb - ta):.3f} s {verb} ({tb / ta:.2f}x throughput)"
    ea, eb = _exposed_by_phase(a), _exposed_by_phase(b)
    diffs = []
    for phase in sorted(set(ea) | set(eb), key=lambda p: -abs(ea.get(p, (0, ""))[0] - eb.get(p, (0, ""))[0])):
        xa, wa = ea.get(phase, (0.0, "-"))
        xb, wb = eb.get(phase, (0.0, "-"))
        if abs(xa - xb) < 1e-3:
            continue
        diffs.append(f"{phase} exposed {xa:.3f} s ({wa}) vs {xb:.3f} s ({wb})")
    ds = a.time.slowdown_s - b.time.slowdown_s
    if abs(ds) >= 1e-3:
        diffs.append(f"compute slowdown {a.time.slowdown_s:.3f} s vs {b.time.slowdown_s:.3f} s")
    return head + ("; " + "; ".join(diffs[:4]) if diffs else "")


def scaling(args: argparse.Namespace) -> tuple[list[int], dict[str, list[float]], str]:
    """TFLOPS per device of the chosen plans at each node count of ``--scaling``."""
    try:
        counts = [int(x) for x in args.scaling.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(
            f"expected comma-separated node counts, found {args.scaling!r}", source="--scaling"
        ) from None
    if not counts or any(n < 1 for n in counts):
        raise ConfigError(f"expected positive node counts, found {args.scaling!r}", source="--scaling")
    series: dict[str, list[float]] = {}
    if args.plans not in ("all", "auto", "presets"):  # keep the order the plans were named in
        for p in (x.strip() for x in args.plans.split(",") if x.strip()):
            (item,) = named_plans(p)
            plan = item[0] if isinstance(item, tuple) else resolve(item)[0]
            series[plan.name] = [float("nan")] * len(counts)
    for n in counts:
        args.nodes = n
        est, topo, shape, options = estimates(args)
        for e in est:
            series.setdefault(e.name, [float("nan")] * len(counts))[counts.index(n)] = (
                e.time.tflops_per_device if e.fits else float("nan")
            )
    name = shape.name
    rows = [["nodes", *series]]
    for i, n in enumerate(counts):
        rows.append([str(n), *(_tflops(v[i]) if v[i] == v[i] else "OOM" for v in series.values())])
    eff = ["scaling eff."]
    for v in series.values():
        ok = [i for i, x in enumerate(v) if x == x and x > 0]  # NaN: did not fit
        eff.append(
            f"{v[-1] / v[ok[0]]:.3f} ({counts[ok[0]]}->{counts[-1]})"
            if len(ok) > 1 and ok[-1] == len(v) - 1
            else "-"
        )
    rows.append(eff)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    text = [
        f"{name} on {args.topology}: predicted TFLOPS per device (scaling efficiency: the last node count "
        "over the first that fits)"
    ]
    text += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return counts, series, "\n".join(text)


def plot(path: str, counts: list[int], series: dict[str, list[float]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, values in series.items():
        ax.plot(counts, values, marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(counts, [str(c) for c in counts])
    ax.set_xlabel("nodes")
    ax.set_ylabel("predicted TFLOPS per device")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def validate(args: argparse.Namespace) -> int:
    """``--validate papers``: the papers' figures against the model's bands (the lab's)."""
    from zerotopo.cli import lab

    return lab.require("zerotopo plan --validate papers").validate_papers(args)


def run(args: argparse.Namespace) -> int:
    if args.validate:
        return validate(args)
    if not args.model:
        raise ConfigError(
            "give the model: --model configs/neox-20b.yml (or a name from configs/)", source="--model"
        )
    if args.plot and not args.scaling:
        raise ConfigError("--plot draws the --scaling chart; give --scaling NODES too", source="--plot")
    if args.scaling:
        counts, series, text = scaling(args)
        print(text)
        if args.plot:
            plot(args.plot, counts, series, text.splitlines()[0].split(":")[0])
            print(f"# chart written to {args.plot}")
        return 0
    started = time.perf_counter()
    est, topo, shape, options = estimates(args)
    searched = f"# planner: {time.perf_counter() - started:.2f} s for the search"
    if args.explain:
        key = args.explain.strip().lower()
        match = [e for e in est if e.name.lower() == key]
        if not match:
            extra = plan_candidates(shape, topo, plans=named_plans(args.explain), options=options)
            match, est = extra, est + extra
        print(explain(match[0], est[: max(3, len(est))] if len(est) <= 6 else est[:3], topo))
        return 0
    if args.json:
        print(json.dumps([e.to_json(topo) for e in est], indent=2))
        print(searched, file=sys.stderr)  # stdout stays pure JSON
    else:
        print(table(est, topo, shape, options))
        advice = recommendation(est, shape, topo, options, others=frozenset(lab.cost_presets()))
        if advice:
            print()
            print(advice)
        if args.optimizer:
            from zerotopo.cli.plan_optim import optimizer_table, parse_kinds

            print()
            print(optimizer_table(est, topo, shape, options, parse_kinds(args.optimizer)))
        print(searched)
    return 0


#: Opens a generated section of a document; the command's output follows, up to :data:`DOC_END`.
DOC_MARKER = re.compile(
    r"<!-- generated by `python -m zerotopo.cli.plan` from `zerotopo (plan[^`]*)`: do not edit -->"
)
DOC_END = "<!-- end of generated section -->"


def command_output(command: str) -> str:
    """What ``zerotopo COMMAND`` prints, less the search's timing line (it varies from run to run)."""
    import contextlib
    import io
    import shlex

    from zerotopo.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        if main(shlex.split(command)) != 0:
            raise ConfigError(f"`zerotopo {command}` failed", source="docs")
    return "\n".join(x for x in out.getvalue().splitlines() if not x.startswith("# planner:"))


def render_doc(doc: str, run=command_output) -> str:
    """``doc`` with each generated section holding its command's current output (``run``)."""
    parts, pos = [], 0
    for m in DOC_MARKER.finditer(doc):
        end = doc.index(DOC_END, m.end())
        body = f"\n\n```\n$ zerotopo {m.group(1)}\n{run(m.group(1))}\n```\n\n"
        parts += [doc[pos : m.end()], body]
        pos = end
    return "".join(parts) + doc[pos:]


if __name__ == "__main__":
    for name in sys.argv[1:] or ["docs/cost-model.md"]:
        path = Path(name)
        path.write_text(render_doc(path.read_text()))
        print(f"# {path} rewritten")
