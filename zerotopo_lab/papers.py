"""The cost model against the papers' published figures, each as a band over the inputs they leave out.

Xu et al., "Scaling Large Language Model Training on Frontier with Low-Bandwidth Partitioning"
(arXiv:2501.04266; GPT-NeoX-20B on Frontier) publishes neither its
micro-batch nor the TFLOPS its kernels reach, and Frontier's bandwidth curves depend on libfabric's
rendezvous settings, which it does not give either.
So each of its figures is compared with the *band* the model gives over those inputs: micro-batch
:data:`MICRO_BATCHES`, compute efficiency :data:`EFFICIENCIES` (fraction of the GCD's peak) and both
shipped Frontier curve sets (:data:`CURVE_SETS`: the libfabric defaults and ``FI_CXI_RDZV_*=0``). A figure
inside its band is one the model reaches at some of those inputs (reported with them); one outside is a
miss whatever the inputs. Chen et al., "Lins: Reducing Communication Overhead of ZeRO for Efficient LLM
Training" (IWQoS 2024, doi:10.1109/IWQoS61813.2024.10682856; LLaMA-7B on 1,024 A800s) publishes its micro-batch (1) and there are no measured curves of its cluster, so its
figures are banded over the efficiency alone.

``zerotopo plan --validate papers`` prints the bands; ``python -m zerotopo.cli.plan docs/cost-model.md``
rewrites the document's generated sections from the same commands, so its figures cannot go stale.
Every schedule is built once and re-timed at each input (:func:`zerotopo.cost.planner.retime`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from zerotopo.cost.bandwidth import curve_set
from zerotopo.cost.planner import CostOptions, retime
from zerotopo.placement.plan import Plan
from zerotopo.placement.shape import ModelShape
from zerotopo.placement.topology import load_topology
from zerotopo_lab.presets import estimate

MICRO_BATCHES = (1, 2, 3, 4)
EFFICIENCIES = (0.3, 0.4, 0.5, 0.6)
CURVE_SETS = ("default", "rdzv0")

#: Xu et al. (arXiv:2501.04266) §VI, Fig. 7 (GPT-NeoX-20B, TFLOPS per GCD on 384 GCDs), and the abstract.
PAPER_003 = {
    "zeropp/zero3": 1.405,  # "a 40.5% increase in TFLOPS per GPU over naive ZeRO-3"
    "topo/zero3": 2.398,  # "up to 139.8% ... increases in TFLOPS per GPU over ZeRO-3"
    "topo/zeropp": 1.707,  # "an additional 70.7% increase in TFLOPS per GPU over ZeRO++"
    "scaling": 0.94,  # "a scaling efficiency of 0.94 for up to 384 GCDs"
}
#: Lins (Chen et al., IWQoS 2024) §VI-B: MFU on 1,024 A800 GPUs (LLaMA-7B, sequence 4096, micro-batch 1).
PAPER_004 = {"lins": 0.51, "deepspeed-zero1": 0.36, "deepspeed-mics": 0.35}


@dataclass(frozen=True)
class Point:
    """One choice of the inputs a paper does not publish."""

    micro_batch: int
    efficiency: float
    curves: str

    def label(self) -> str:
        return f"mb {self.micro_batch}, eff {self.efficiency:g}, {self.curves}"


@dataclass(frozen=True)
class Band:
    """A published figure and the model's values for it at every :class:`Point`."""

    paper: str
    figure: str
    published: float
    values: tuple[tuple[Point, float], ...]

    @property
    def low(self) -> tuple[Point, float]:
        return min(self.values, key=lambda pv: pv[1])

    @property
    def high(self) -> tuple[Point, float]:
        return max(self.values, key=lambda pv: pv[1])

    @property
    def inside(self) -> bool:
        return self.low[1] <= self.published <= self.high[1]

    @property
    def closest(self) -> tuple[Point, float]:
        return min(self.values, key=lambda pv: abs(pv[1] - self.published))

    def line(self, digits: int) -> str:
        (lp, lv), (hp, hv), (cp, cv) = self.low, self.high, self.closest
        f = f"{{:.{digits}f}}"
        verdict = "inside" if self.inside else "OUTSIDE"
        return (
            f"{self.figure}: paper {f.format(self.published)}, model {f.format(lv)} ({lp.label()}) to "
            f"{f.format(hv)} ({hp.label()}): {verdict}; closest {f.format(cv)} at {cp.label()}"
        )

    def to_json(self) -> dict:
        return {
            "paper": self.paper,
            "figure": self.figure,
            "published": self.published,
            "low": self.low[1],
            "low_at": self.low[0].label(),
            "high": self.high[1],
            "high_at": self.high[0].label(),
            "inside": self.inside,
            "closest": self.closest[1],
            "closest_at": self.closest[0].label(),
        }


@dataclass(frozen=True)
class Ranking:
    """A published ranking and the inputs at which the model ranks the same way."""

    paper: str
    figure: str
    order: tuple[str, ...]
    matches: tuple[Point, ...]
    points: int
    model_orders: tuple[tuple[str, ...], ...]

    def line(self) -> str:
        paper = " > ".join(self.order)
        if self.matches:
            where = f"at {len(self.matches)} of {self.points} inputs: {'; '.join(p.label() for p in self.matches)}"
        else:
            model = " | ".join(" > ".join(o) for o in self.model_orders)
            where = f"at none of the {self.points} inputs (the model ranks {model})"
        return f"{self.figure}: paper {paper}; the model agrees {where}"

    def to_json(self) -> dict:
        return {
            "paper": self.paper,
            "figure": self.figure,
            "order": list(self.order),
            "matches": [p.label() for p in self.matches],
            "points": self.points,
            "model_orders": [list(o) for o in self.model_orders],
        }


def _sweep(shape, topology, plans, base: CostOptions, points: list[Point]) -> dict[str, list]:
    """Each plan's step time at every point: ``{plan name: [StepTime per point]}``; the schedules are
    built once (at the first point's options) and re-timed."""
    out: dict[str, list] = {}
    for plan in plans:
        e = estimate(plan, shape, topology, base)
        times = []
        for p in points:
            table = curve_set(topology.name, p.curves) if p.curves != "alpha-beta" else None
            o = replace(
                base, micro_batch=p.micro_batch, efficiency=p.efficiency, bandwidth=table,
                default_bandwidth=p.curves != "alpha-beta",
            )  # fmt: skip
            times.append(retime(e.plan, e.degrees, e.schedule, shape, topology, o))
        out[e.name] = times
    return out


def papers_003(shape: ModelShape, base: CostOptions) -> list[Band]:
    """Xu et al.'s four figures as bands (``base``: NeoX-20B's precision and checkpointing)."""
    points = [Point(m, e, c) for c in CURVE_SETS for m in MICRO_BATCHES for e in EFFICIENCIES]
    names = ("deepspeed-zero3", "deepspeed-zeropp", "deepspeed-zerotopo")
    at48 = _sweep(shape, load_topology("frontier", nodes=48), names, base, points)
    at2 = _sweep(shape, load_topology("frontier", nodes=2), names[2:], base, points)

    def tf(runs: dict, name: str) -> list[float]:
        return [t.tflops_per_device for t in runs[name]]

    z3, zpp, topo = (tf(at48, n) for n in names)
    topo2 = tf(at2, "deepspeed-zerotopo")
    figures = {
        "zeropp/zero3": ("ZeRO++ over ZeRO-3, TFLOPS per GCD at 384 GCDs (Fig. 7)", zpp, z3),
        "topo/zero3": ("ZeRO-topo over ZeRO-3, TFLOPS per GCD at 384 GCDs (Fig. 7)", topo, z3),
        "topo/zeropp": ("ZeRO-topo over ZeRO++, TFLOPS per GCD at 384 GCDs (Fig. 7)", topo, zpp),
        "scaling": ("ZeRO-topo scaling efficiency, 16 to 384 GCDs (TFLOPS per GCD, Fig. 7)", topo, topo2),
    }
    return [
        Band("Xu et al.", text, PAPER_003[key], tuple(zip(points, (a / b for a, b in zip(num, den)))))
        for key, (text, num, den) in figures.items()
    ]


LLAMA_7B = ModelShape(
    num_layers=32, hidden_size=4096, num_attention_heads=32, seq_length=4096, vocab_size=32000
)
#: Lins' Lins placement: no parameter or gradient sharding, optimizer states over the node,
#: the gradients all-reduced then selected (its Table III choice for LLaMA-7B on 1,024 GPUs).
LINS = Plan("lins", params=1, grads=1, optim="node", grad_reduce="allreduce", grad_dtype="param")


def papers_004() -> tuple[list[Band], Ranking]:
    """Lins' MFUs on 1,024 A800s (128 nodes) as bands over the efficiency, and its ranking."""
    points = [Point(1, e, "alpha-beta") for e in EFFICIENCIES]
    base = CostOptions(micro_batch=1, grad_accum=1, checkpoint_activations=False)
    runs = _sweep(
        LLAMA_7B, load_topology("a800", nodes=128), [LINS, "deepspeed-zero1", "deepspeed-mics"], base, points
    )
    mfu = {name: [t.mfu for t in runs[name]] for name in PAPER_004}
    labels = {"lins": "Lins", "deepspeed-zero1": "DeepSpeed ZeRO-1", "deepspeed-mics": "DeepSpeed MiCS"}
    bands = [
        Band(
            "Lins (Chen et al.)",
            f"{labels[n]} MFU on 1,024 A800s (§VI-B)",
            PAPER_004[n],
            tuple(zip(points, mfu[n])),
        )
        for n in PAPER_004
    ]
    order = tuple(sorted(PAPER_004, key=PAPER_004.__getitem__, reverse=True))
    model_orders = [
        tuple(sorted(PAPER_004, key=lambda n: mfu[n][i], reverse=True)) for i in range(len(points))
    ]
    ranking = Ranking(
        "Lins (Chen et al.)",
        "ranking by MFU on 1,024 A800s (§VI-B)",
        order,
        tuple(p for p, o in zip(points, model_orders) if o == order),
        len(points),
        tuple(dict.fromkeys(model_orders)),
    )
    return bands, ranking


def neox_20b() -> tuple[ModelShape, CostOptions]:
    """GPT-NeoX-20B as configs/neox-20b.yml gives it, with the options ``zerotopo plan`` derives from it
    (precision, gradient width, checkpointing), one micro-batch per step as Xu et al.'s runs."""
    from zerotopo.config.model_files import load_model

    shape, neox = load_model(["neox-20b"], None)
    precision = neox.precision.resolved
    options = CostOptions(
        grad_accum=1,
        checkpoint_activations=bool(neox.model.checkpoint_activations),
        param_bytes=4 if precision == "fp32" else 2,
        fp16=precision == "fp16",
        grad_dtype=neox.precision.grad_dtype,
    )
    return shape, options


def validate() -> tuple[list[Band], Ranking]:
    """Every paper figure's band, and Lins' ranking."""
    shape, base = neox_20b()
    bands004, ranking = papers_004()
    return papers_003(shape, base) + bands004, ranking


def report(bands: list[Band], ranking: Ranking) -> str:
    """The plain-text report ``zerotopo plan --validate papers`` prints."""
    lines = [
        "Xu et al.: GPT-NeoX-20B on Frontier (configs/neox-20b.yml, one micro-batch per step); DeepSpeed "
        "ZeRO-3, ZeRO++ and the paper's placement on DeepSpeed (cost presets deepspeed-zero3, "
        "deepspeed-zeropp, deepspeed-zerotopo) at 48 nodes, and at 2 for the scaling; bands over "
        f"micro-batch {MICRO_BATCHES[0]}-{MICRO_BATCHES[-1]}, efficiency {EFFICIENCIES[0]:g}-"
        f"{EFFICIENCIES[-1]:g} and the curve sets {', '.join(CURVE_SETS)} "
        f"({len(MICRO_BATCHES) * len(EFFICIENCIES) * len(CURVE_SETS)} inputs)",
    ]
    lines += [f"  {b.line(3)}" for b in bands if b.paper == "Xu et al."]
    lines += [
        "Lins (Chen et al.): LLaMA-7B (sequence 4096, micro-batch 1, bf16, no recomputation) on 128 A800 nodes; "
        "Lins (p=1 g=1 o=8, all-reduce) on the engine's schedule, DeepSpeed ZeRO-1 and MiCS on DeepSpeed's; "
        "no measured curves (alpha-beta); bands over efficiency "
        f"{EFFICIENCIES[0]:g}-{EFFICIENCIES[-1]:g}",
    ]
    lines += [f"  {b.line(3)}" for b in bands if b.paper == "Lins (Chen et al.)"]
    lines.append(f"  {ranking.line()}")
    inside = sum(b.inside for b in bands)
    lines.append(f"{inside} of {len(bands)} published figures inside the model's band")
    return "\n".join(lines)
