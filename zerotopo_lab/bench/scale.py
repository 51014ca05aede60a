"""``zerotopo bench scale``: the head-to-head at several emulated node counts, on the device clock.

At each node count the same emulated Frontier (``emulated-frontier``'s tree: 4 ranks per node, or 8
with ``--ranks-per-node 8``, Frontier's 8 GCDs a node, :func:`node_topology`) runs
``bench compare --regime device-clock`` (:mod:`zerotopo_lab.bench.clocked`) with the rows that decide how
to train at scale: the planner's pick, zero3, zeropp, mics, ``zerotopo``, DeepSpeed ZeRO-3, DeepSpeed
hpZ and FSDP2 HSDP (and the ``no-comm`` floor, for the measured R), with the shaped links alone and
with the Frontier curves replayed at that node count (``--curves``). The planner is asked again at each
count, on that count's machine. The workload at each count is stated (:func:`zerotopo_lab.bench.clocked.
target_workload`): by default NeoX-20B at configs/neox-20b.yml's global batch, fewer micro-batches per
rank as nodes grow; ``--mode micro-batch`` keeps a fixed number per rank.

Ranks start as forks of one fork server that imported torch once (``ZEROTOPO_START_METHOD=forkserver``,
:mod:`zerotopo.launch.spawn`), so tens of ranks share its pages; each rank's peak memory is in its row
(``peak_memory_bytes_per_rank``).

The JSON report holds, per node count, the rows as ``bench compare --json`` writes them, with the node
count, D, the regime and the workload; ``--plot`` draws step time against nodes per row, measured and
predicted. ``--predict`` runs no rank: the cost model prices every row at each count in the target's
seconds (:func:`predict`), up to :data:`MAX_PREDICT_NODES` nodes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from dataclasses import replace
from typing import Any

from zerotopo.errors import ConfigError
from zerotopo_lab.bench import FLOOR_ROW
from zerotopo_lab.bench.clocked import MODES, target_workload
from zerotopo_lab.bench.replay import CURVES

BASE_TOPOLOGY = "emulated-frontier"
RANKS_PER_NODE = (4, 8)
"""``--ranks-per-node``: ``emulated-frontier``'s own 2 packages of 2 dies, or 4 packages as a Frontier node."""
SCALE_ROWS = (FLOOR_ROW, "planner", "zero3", "zeropp", "mics", "zerotopo", "deepspeed-zero3", "deepspeed-hpz",
              "fsdp2-hsdp")  # fmt: skip
DEFAULT_NODES = (2, 4, 8, 16)
MAX_NODES = 16
MAX_RANKS = 64
"""What one machine holds (each rank a process of the fork server): 16 nodes of 4 or 8 of 8."""
MAX_PREDICT_NODES = 1024
"""``--predict`` runs no rank, so it prices node counts no machine here could run."""


def parse_nodes(text: str, limit: int = MAX_NODES) -> tuple[int, ...]:
    """``2,4,8,16`` -> (2, 4, 8, 16): distinct counts from 1 to ``limit``, in the order given."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit() or not 1 <= int(part) <= limit:
            raise ConfigError(f"expected node counts from 1 to {limit}, got {part!r}", key="--nodes")
        if int(part) not in out:
            out.append(int(part))
    if not out:
        raise ConfigError("give at least one node count, e.g. --nodes 2,4", key="--nodes")
    return tuple(out)


def node_topology(ranks_per_node: int, directory: str, base: str = BASE_TOPOLOGY) -> str:
    """The topology with ``ranks_per_node`` ranks a node: ``base`` itself when its nodes have that many,
    else ``base``'s tree with its outermost tier inside a node (the node's packages) widened to hold
    them and its network injection scaled with them (the same share per rank), written as a topology
    file into ``directory``; returns what ``--topology`` takes (a name or that file's path).

    Raises ConfigError when the tiers below the node's outermost do not divide ``ranks_per_node``."""
    import yaml

    from zerotopo import resources
    from zerotopo.placement.topology import load_topology

    topo = load_topology(base)
    if topo.devices_per_node == ranks_per_node:
        return base
    inner = topo.devices_per_node // topo.tiers[-1].fanout
    if ranks_per_node < 1 or ranks_per_node % inner:
        raise ConfigError(
            f"{base} cannot hold {ranks_per_node} ranks a node: its tiers below the node's {topo.tiers[-1].name} "
            f"hold {inner} ranks, so give a multiple of {inner}", key="--ranks-per-node",
        )  # fmt: skip
    raw = yaml.safe_load(resources.builtin_file("topologies", base).read_text())
    raw["name"] = f"{base}-{ranks_per_node}"
    raw["description"] = (
        f"{base} with {ranks_per_node} ranks a node ({ranks_per_node // inner} {topo.tiers[-1].name}s)"
    )
    raw["tiers"][-1]["fanout"] = ranks_per_node // inner
    raw["network"]["injection_gbps"] = topo.network.injection_gbps * ranks_per_node / topo.devices_per_node
    path = os.path.join(directory, f"{raw['name']}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(raw, f, sort_keys=False)
    return path


def count_options(base: Any, nodes: int, mode: str, micro_batches: int, curves: str | None = None) -> Any:
    """``base`` (:class:`zerotopo_lab.bench.compare.CompareOptions`) at ``nodes`` nodes: the device clock,
    the stated workload's micro-batches per rank, and ``curves`` replayed at this node count (None:
    the links alone)."""
    from zerotopo.placement.topology import load_topology

    per_node = load_topology(base.topology).devices_per_node
    work = target_workload(nodes, per_node, mode, micro_batches)
    return replace(base, regime="device-clock", nodes=nodes, micro_batches=work.micro_batches, workload=work,
                   curves=curves, replay=None)  # fmt: skip


def count_entry(nodes: int, report: dict[str, Any], curves: str | None = None) -> dict[str, Any]:
    """One node count's entry of the scale report: its node count, D, regime, workload and curve replay
    beside the rows and settings ``bench compare`` reported."""
    clock = report.get("device_clock") or {}
    return {
        "nodes": nodes,
        "curves": curves,
        "topology": report.get("topology"),
        "world_size": report["world_size"],
        "ranks_per_node": report["world_size"] // nodes,
        "dilation": clock.get("dilation"),
        "regime": report.get("regime"),
        "workload": clock.get("workload"),
        "device_clock": clock,
        "planner_pick": report.get("planner_pick"),
        "fastest_zerotopo_row": report.get("fastest_zerotopo_row"),
        "losses_agree": report.get("losses_agree"),
        "void": report.get("void"),
        "tier_rates_mbit": report.get("tier_rates_mbit"),
        "deepspeed_buckets": report.get("deepspeed_buckets"),
        "wall_s": report.get("wall_s"),
        "rows": report["rows"],
    }


def scale(base: Any, nodes: tuple[int, ...], mode: str = "global-batch", micro_batches: int = 1,
          command: str = "", run_compare: Any = None, curves: tuple[str | None, ...] = (None,),
          partial: str | None = None, entry: Any = None) -> dict[str, Any]:  # fmt: skip
    """Run ``bench compare`` on the device clock at each of ``nodes``, once per entry of ``curves``
    (None: the shaped links alone; a :data:`zerotopo_lab.bench.replay.CURVES` name: replayed at that node
    count); ``run_compare(opts) -> report``, default :func:`zerotopo_lab.bench.compare.compare`. Returns
    the scale report. ``partial``: a file that holds the report of the counts done so far after each one
    (a run of hours that stops at its last count keeps the others; ``--from`` merges it with a rerun).
    ``entry(nodes, opts, curves) -> count entry``: in place of running ``run_compare`` (:func:`predict`)."""
    from zerotopo_lab.bench.compare import compare, write_report

    run_compare = run_compare or (lambda opts: compare(opts, command=command))
    entry = entry or (lambda n, opts, c: count_entry(n, run_compare(opts), c))
    os.environ.setdefault("ZEROTOPO_START_METHOD", "forkserver")
    counts: list[dict[str, Any]] = []

    def report(done: list[int]) -> dict[str, Any]:
        return {"command": command, "mode": mode, "nodes": done, "counts": counts}

    for n in nodes:
        for c in curves:
            print(f"bench scale: {n} nodes" + (f", curves {c}" if c else ""), file=sys.stderr, flush=True)
            counts.append(entry(n, count_options(base, n, mode, micro_batches, c), c))
            if partial:  # the counts run so far
                write_report(partial, report(list(dict.fromkeys(e["nodes"] for e in counts))))
    return report(list(nodes))


def merge_reports(paths: list[str]) -> dict[str, Any]:
    """One scale report from the JSON reports of earlier runs (``-o FILE``), e.g. one node count per run:
    their counts in node order, their commands listed. The runs must share a mode. A node count (with
    the same curves) in several reports is pooled (:func:`pool_counts`) when they ran it at one D
    (``--dilation``) with the same workload, their rows joined, and refused otherwise."""
    reports = []
    for path in paths:
        try:
            with open(path) as f:
                report = json.load(f)
        except (OSError, ValueError) as e:
            raise ConfigError(f"cannot read the scale report {path}: {e}", key="--from") from None
        if not isinstance(report, dict) or not isinstance(report.get("counts"), list) or "mode" not in report:
            raise ConfigError(f"{path} is not a `bench scale` JSON report (written by -o FILE)", key="--from")
        reports.append(report)
    modes = {r["mode"] for r in reports}
    if len(modes) > 1:
        raise ConfigError(f"the reports mix modes ({', '.join(sorted(modes))}); merge one mode", key="--from")
    if len({bool(r.get("predicted")) for r in reports}) > 1:
        raise ConfigError("the reports mix runs and --predict reports; merge one kind", key="--from")
    if len(set(paths)) < len(paths):
        twice = next(p for p in paths if paths.count(p) > 1)
        raise ConfigError(f"{twice} is given twice: its repeats would count twice", key="--from")
    groups: dict[tuple[int, str], list[tuple[str, str, dict[str, Any]]]] = {}
    for path, r in zip(paths, reports):
        for e in r["counts"]:
            groups.setdefault((e["nodes"], e.get("curves") or ""), []).append((path, r.get("command", ""), e))
    counts = []
    for key in sorted(groups):
        group = groups[key]
        if len(group) > 1 and reports[0].get("predicted"):
            raise ConfigError(
                f"node count {key[0]} appears in more than one --predict report (a prediction has no repeats "
                "to pool)", key="--from",
            )  # fmt: skip
        counts.append(group[0][2] if len(group) == 1 else pool_counts(group))
    merged = {
        "command": "; ".join(r.get("command", "") for r in reports),
        "mode": modes.pop(),
        "nodes": sorted({e["nodes"] for e in counts}),
        "counts": counts,
    }
    if reports[0].get("predicted"):
        merged["predicted"] = True
    return merged


POOL_MATCH = ("world_size", "workload", "deepspeed_buckets", "topology")
"""What runs of one node count must share to be pooled, beside D (and the planner's pick, where each
asked the planner)."""
POOL_MEAN = (
    "setup_s", "clock_slept_s_per_step", "clock_arithmetic_s_per_step", "arithmetic_fraction",
    "clock_device_s_per_step", "host_cpu_s_per_step", "run_delay_s_per_step", "others_cpu_s_per_step",
    "others_run_delay_s_per_step", "host_over_device_s_per_step", "clock_overshoot_s_per_step",
    "blocked_s_per_step", "cpu_s_per_step", "replay_wait_s_per_step",
)  # fmt: skip
"""A row's per-step figures that a pooled row gives as the mean of its runs'."""


def pool_counts(group: list[tuple[str, str, dict[str, Any]]]) -> dict[str, Any]:
    """One count entry from several runs of the same node count, ``(path, command, entry)`` each: every
    row's repeats pooled over the runs that ran it (its step the median of their repeats, with their min
    and max, as one run of as many repeats reports it), its per-step figures the runs' means, its peak
    memory the largest; the rows are the union of the runs' rows in the order a run of every row has
    them (:data:`SCALE_ROWS`; other names after, as they first appear), so
    rows run apart at one D (``--rows no-comm,zeropp,mics`` beside an earlier ``--rows
    no-comm,zero3,...``) make one table. The count's verdicts come from the pooled rows and its measured
    R from each run's own zero3/floor pairs (``pooled_from``: each run's file, command, wall time, rows
    and repeats). Raises ConfigError, naming the files, when the runs differ in D (give the later run
    the earlier's with ``--dilation``), workload, topology or planner's pick (where both asked the
    planner): their step seconds would not be one quantity."""
    from zerotopo_lab.bench.compare import _verdicts, check_losses, loss_tolerance
    from zerotopo_lab.bench.regime import measured_ratios

    (first_path, _, first), rest = group[0], group[1:]
    seen = list(dict.fromkeys(r["name"] for _, _, e in group for r in e["rows"]))
    # in the order a run of every row runs them; a row of no such name after, as it first appears
    names = sorted(
        seen, key=lambda n: (SCALE_ROWS.index(n) if n in SCALE_ROWS else len(SCALE_ROWS), seen.index(n))
    )
    for path, _, e in rest:
        D0, D = first.get("dilation") or 1.0, e.get("dilation") or 1.0
        if abs(D - D0) > 1e-9 * D0:
            raise ConfigError(
                f"{path} ran {e['nodes']} nodes at D {D:.10g} and {first_path} at D {D0:.10g}: their steps are "
                f"not one quantity; run it again with --dilation {D0!r} to pool them",
                key="--from",
            )  # fmt: skip
        for key in POOL_MATCH:
            if e.get(key) != first.get(key):
                raise ConfigError(
                    f"{path} and {first_path} ran {e['nodes']} nodes with different {key} "
                    f"({e.get(key)!r} vs {first.get(key)!r}); pool only runs of one setting",
                    key="--from",
                )  # fmt: skip
    # the planner's pick must agree between the runs that asked the planner (a run without its row asked none)
    asked = [(path, e) for path, _, e in group if e.get("planner_pick")]
    for path, e in asked[1:]:
        if e["planner_pick"] != asked[0][1]["planner_pick"]:
            raise ConfigError(
                f"{path} and {asked[0][0]} ran {e['nodes']} nodes with different planner_pick "
                f"({e['planner_pick']!r} vs {asked[0][1]['planner_pick']!r}); pool only runs of one setting",
                key="--from",
            )  # fmt: skip
    entries = [e for _, _, e in group]
    by_name = [{r["name"]: r for r in e["rows"]} for e in entries]
    runs_of = {name: [rows[name] for rows in by_name if name in rows] for name in names}
    rows = [_pool_row(runs_of[name]) for name in names]
    _, void = check_losses(rows)
    voids = [e.get("void") for e in entries if e.get("void")] + ([void] if void else [])
    for name in names:  # a row's runs compute the same steps: their losses agree
        losses = [r.get("final_loss") for r in runs_of[name]]
        if None in losses or len(losses) < 2:
            continue
        tol = loss_tolerance(runs_of[name][0])
        if max(abs(x - losses[0]) for x in losses) > tol * max(abs(losses[0]), 1e-12):
            voids.append(f"{name}'s final losses differ between the runs pooled: {losses}")
    regime = dict(first.get("regime") or {})
    if regime:
        pairs = [x for e in entries for x in measured_ratios(e["rows"])]  # each run's own repeats
        regime.update(measured_R=statistics.median(pairs) if pairs else None, measured_R_repeats=pairs)
    return {
        **first,
        "wall_s": sum(e.get("wall_s") or 0.0 for e in entries),
        "losses_agree": all(e.get("losses_agree") for e in entries) and not voids,
        "void": "; ".join(voids) or None,
        "planner_pick": asked[0][1]["planner_pick"] if asked else None,
        "fastest_zerotopo_row": _verdicts(rows)["fastest_zerotopo_row"],
        "regime": regime,
        "pooled_from": [
            {
                "file": path,
                "command": command,
                "wall_s": e.get("wall_s"),
                "flops_per_rank": (e.get("device_clock") or {}).get("flops_per_rank"),
                "rows": [r["name"] for r in e["rows"]],
                "repeats": max((len(r.get("repeat_step_times_s") or []) for r in e["rows"]), default=0),
            }
            for path, command, e in group
        ],  # fmt: skip
        "rows": rows,
    }


def _pool_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row of :func:`pool_counts` from the same row in each run (a row that failed or did not fit
    in any run stays so, with that run's figures)."""
    from zerotopo_lab.bench.compare import _mean_dict, row_ratios

    bad = next((r for r in runs if not r.get("step_time_s")), None)
    if bad is not None:
        return dict(bad)
    repeats = [t for r in runs for t in (r.get("repeat_step_times_s") or [r["step_time_s"]])]
    step = statistics.median(repeats)
    row = dict(runs[0])
    tokens_per_step = (
        runs[0]["tokens_per_s"] * runs[0]["step_time_s"] if runs[0].get("tokens_per_s") else None
    )
    row.update(
        step_time_s=step, repeat_step_times_s=repeats, step_time_min_s=min(repeats),
        step_time_max_s=max(repeats), peak_memory_bytes=_max_or_none([r.get("peak_memory_bytes") for r in runs]),
        peak_memory_bytes_per_rank=[_max_or_none(p) for p in zip(*(r.get("peak_memory_bytes_per_rank") or []
                                                                     for r in runs))],
        process_groups=[g for r in runs for g in (r.get("process_groups") or [])],
    )  # fmt: skip
    if tokens_per_step:
        row["tokens_per_s"] = tokens_per_step / step
    for key in POOL_MEAN:
        values = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
        if len(values) == len(runs):
            row[key] = sum(values) / len(values)
    for key in ("tier_bytes_per_step", "tier_payload_bytes_per_step"):
        if all(r.get(key) for r in runs):
            row[key] = _mean_dict([r[key] for r in runs])
    if not row.get("ring_tier_messages"):  # the schedule's, one at a count: from a run that counted it
        row["ring_tier_messages"] = next(
            (r["ring_tier_messages"] for r in runs if r.get("ring_tier_messages")), None
        )
    ring = row.get("ring_tier_bytes") or {}
    row_ratios(row, next(reversed(ring), ""))  # the ring's tiers run innermost first: the network last
    return row


def _max_or_none(values: Any) -> Any:
    values = list(values)
    return None if not values or None in values else max(values)


def _no_arithmetic(*_: Any) -> float:
    """The device clock's arithmetic rate under ``--predict``: none is measured, so D is 1."""
    return float("inf")


def predict_count(opts: Any) -> dict[str, Any]:
    """One node count priced by the cost model alone, no rank started: each row's predicted step in the
    target's seconds (the device clock at D = 1: every device wait and link time the target's own, as
    a run's predictions divided by its D, but for the DeepSpeed rows' host work per module, this
    machine's processor time, which no D stretches, under a millisecond a step; and under ``--curves``
    the links' own time at their fastest, which a run's D makes next to nothing), beside the step's
    device time of the units (the floor's compute) and each row's prediction over the planner's pick.
    ``opts``: :func:`count_options`'s."""
    from zerotopo_lab.bench.compare import model_config, priced, resolve_rows

    opts, topo, _, _, clocked, cost_topo, measured = priced(opts, measure=_no_arithmetic)
    cfg, seq = model_config(opts)
    _, meta = resolve_rows(opts, cost_topo, cfg.shape(seq, name=opts.model), measured)
    units_s = clocked.device_s
    planner = meta.get("planner") or {}
    pick = planner.get("predicted")
    rows = []
    for name in opts.rows:
        m = meta[name]
        pred = m.get("predicted")
        row = {"name": name, "kind": m["kind"], "plan": m.get("plan"), "predicted_step_time_s": pred}
        if pred:
            row["over_units"] = pred / units_s
            if pick:
                row["over_pick"] = pred / pick
        # the ring's bytes and messages: what a run's links carry
        for key in ("same_as", "does_not_fit", "ring_tier_bytes", "ring_tier_messages"):
            if m.get(key):
                row[key] = m[key]
        rows.append(row)
    return {
        "nodes": topo.nodes,
        "curves": opts.curves,
        "topology": topo.name,
        "world_size": topo.world_size,
        "ranks_per_node": topo.devices_per_node,
        "dilation": 1.0,
        "workload": opts.workload.describe() if opts.workload else None,
        "deepspeed_buckets": opts.deepspeed_buckets,
        "units_device_s_per_step": units_s,
        "planner_pick": planner.get("plan"),
        "rows": rows,
    }


def predict(base: Any, nodes: tuple[int, ...], mode: str = "global-batch", micro_batches: int = 1,
            command: str = "", curves: tuple[str | None, ...] = (None,)) -> dict[str, Any]:  # fmt: skip
    """``--predict``: :func:`scale` with :func:`predict_count` at each of ``nodes`` and ``curves`` in place
    of a run (``predicted``: true; no measured field)."""
    report = scale(base, nodes, mode, micro_batches, command, curves=curves,
                   entry=lambda n, opts, c: predict_count(opts))  # fmt: skip
    return {**report, "predicted": True}


def _count_title(e: dict[str, Any]) -> str:
    """A count's heading in the tables: its nodes and ranks, the curves replayed, DeepSpeed's buckets."""
    replay = f", curves {e['curves']} replayed" if e.get("curves") else ""
    replay += f", DeepSpeed buckets {e['deepspeed_buckets']}" if e.get("deepspeed_buckets") else ""
    return f"{e['nodes']} nodes ({e['world_size']} ranks){replay}"


def format_predicted(report: dict[str, Any]) -> str:
    """The ``--predict`` report as a table: per count, each row's predicted step in target seconds, over
    the units' device time and over the planner's pick."""
    lines = [f"bench scale --predict ({report['mode']}): the cost model alone, nothing run; target seconds "
             "(D = 1)"]  # fmt: skip
    for e in report["counts"]:
        lines.append("")
        lines.append(f"{_count_title(e)}: {e['workload']}")
        lines.append(
            f"  units' device time {e['units_device_s_per_step']:.3f} s a step (the floor's compute)"
        )
        lines.append(f"  {'row':<16} {'plan':<16} {'pred s':>8} {'/ units':>8} {'/ pick':>7}")
        for r in e["rows"]:
            pred = r.get("predicted_step_time_s")
            if not pred:
                why = "does not fit" if r.get("does_not_fit") else "no model (measured only)"
                why = "no prediction (the floor)" if r["kind"] == "floor" else why
                lines.append(f"  {r['name']:<16} {why}")
                continue
            over = r.get("over_pick")
            lines.append(
                f"  {r['name']:<16} {r.get('plan') or '-':<16} {pred:>8.3f} {r['over_units']:>8.3f} "
                f"{'-' if over is None else f'{over:.3f}':>7}"
            )
        lines.append(f"  planner's pick {e['planner_pick']}")
    return "\n".join(lines)


def series(report: dict[str, Any]) -> dict[str, dict[str, list[tuple[float, ...]]]]:
    """Per row: (nodes, seconds) of its measured median step and of its prediction, in node order, as
    the target's seconds (over each count's own D: the counts' dilations differ); ``spread`` holds
    (nodes, min, max) of the measured repeats where the count ran more than one."""
    out: dict[str, dict[str, list[tuple[float, ...]]]] = {}
    for entry in sorted(report["counts"], key=lambda e: e["nodes"]):
        for r in entry["rows"]:
            name = r["name"] + (f" ({entry['curves']})" if entry.get("curves") else "")
            s = out.setdefault(name, {"measured": [], "predicted": [], "spread": []})
            D = entry.get("dilation") or 1.0
            if r.get("step_time_s"):
                s["measured"].append((entry["nodes"], r["step_time_s"] / D))
                lo, hi = r.get("step_time_min_s"), r.get("step_time_max_s")
                if lo is not None and hi is not None and hi > lo:
                    s["spread"].append((entry["nodes"], lo / D, hi / D))
            if r.get("predicted_step_time_s"):
                s["predicted"].append((entry["nodes"], r["predicted_step_time_s"] / D))
    return out


def format_scale(report: dict[str, Any]) -> str:
    """The scale report as a table: per row, step seconds measured (min-max) and predicted at each count."""
    lines = [f"bench scale ({report['mode']}): nodes {', '.join(map(str, report['nodes']))}"]
    for e in report["counts"]:
        lines.append("")
        given = " (given)" if (e.get("device_clock") or {}).get("dilation_given") else ""
        pooled = f", the repeats of {len(e['pooled_from'])} runs pooled" if e.get("pooled_from") else ""
        lines.append(f"{_count_title(e)}, D {e['dilation']:.3g}{given}{pooled}: {e['workload']}")
        lines.append(
            f"  {'row':<16} {'step s':>8} {'min-max':>15} {'pred s':>8} {'peak MiB/rank':>13}  cross-node MB"
        )
        for r in e["rows"]:
            if not r.get("step_time_s"):
                why = "does not fit" if r.get("does_not_fit") else r.get("error", "did not run")
                lines.append(f"  {r['name']:<16} {why}")
                continue
            lo, hi = r.get("step_time_min_s"), r.get("step_time_max_s")
            pred = r.get("predicted_step_time_s")
            peak = r.get("peak_memory_bytes")
            net = (r.get("tier_bytes_per_step") or {}).get("network")
            lines.append(
                f"  {r['name']:<16} {r['step_time_s']:>8.3f} {f'{lo:.3f}-{hi:.3f}':>15} "
                f"{'-' if pred is None else f'{pred:.3f}':>8} {'-' if peak is None else f'{peak / 2**20:.0f}':>13}  "
                f"{'-' if net is None else f'{net / 1e6:.2f}'}"
            )
        lines.append(f"  planner's pick {e['planner_pick']}; fastest zerotopo row {e['fastest_zerotopo_row']}; "
                     + ("losses agree" if e["losses_agree"] else f"COMPARISON VOID: {e['void']}"))  # fmt: skip
    return "\n".join(lines)


def format_merged(report: dict[str, Any]) -> str:
    """``--from``'s table: :func:`format_predicted` for ``--predict`` reports, else :func:`format_scale`."""
    return format_predicted(report) if report.get("predicted") else format_scale(report)


def plot(report: dict[str, Any], path: str) -> None:
    """A PNG of step time against nodes per row: measured (solid, markers, a bar over the repeats'
    min-max) and predicted (dashed); the global batch's on a log scale, its step falling as the nodes
    split it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (name, s) in enumerate(series(report).items()):
        color = f"C{i % 10}"
        if s["measured"]:
            ax.plot(*zip(*s["measured"]), "o-", color=color, label=f"{name} measured")
        if s["spread"]:  # the repeats' min-max, where a count has several
            x, lo, hi = zip(*s["spread"])
            ax.vlines(x, lo, hi, color=color, linewidth=3, alpha=0.5)
        if s["predicted"]:
            ax.plot(*zip(*s["predicted"]), "x--", color=color, label=f"{name} predicted")
    ax.set_xscale("log", base=2)
    if report["mode"] == "global-batch":  # the step falls with nodes: a log axis keeps the rows apart
        ax.set_yscale("log")
    ax.set_xlabel("emulated nodes")
    ax.set_ylabel("target step time, s (step / D)")
    ax.set_title(f"bench scale ({report['mode']})")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from zerotopo_lab.bench.compare import add_clock_arguments

    p.add_argument("--nodes", default=",".join(map(str, DEFAULT_NODES)),
                   help=f"emulated node counts (default 2,4,8,16; at most {MAX_RANKS} ranks in all)")  # fmt: skip
    p.add_argument("--ranks-per-node", type=int, choices=RANKS_PER_NODE, default=4,
                   help="ranks per emulated node: 4 (default; emulated-frontier's 2 packages of 2) or 8 "
                   "(4 packages, as Frontier's 8 GCDs a node)")  # fmt: skip
    p.add_argument("--mode", choices=MODES, default="global-batch",
                   help="global-batch (default): NeoX-20B's global batch (configs/neox-20b.yml) split over the "
                   "ranks; micro-batch: --micro-batches per rank at every count")  # fmt: skip
    p.add_argument(
        "--micro-batches", type=int, default=1, help="micro-batch mode: per rank per step (default 1)"
    )
    p.add_argument("--rows", default=",".join(SCALE_ROWS), help="comma-separated rows (default: all)")
    p.add_argument("--curves", choices=("both", "off", *CURVES), default="both",
                   help="at each count, the shaped links alone (off), the Frontier curves replayed at that node "
                   "count in place of the links' times (frontier-48), or both (default)")  # fmt: skip
    p.add_argument("--steps", type=int, default=2, help="timed steps per row (default 2)")
    p.add_argument("--warmup", type=int, default=2,
                   help="untimed steps first (default 2: DeepSpeed records its parameter trace in its first "
                   "step and checks it across ranks at the start of its second, 6 broadcasts it never sends again)")  # fmt: skip
    p.add_argument("--repeat", type=int, default=3, help="runs of every row at each count (default 3)")
    add_clock_arguments(p)
    p.add_argument("--model", default="wide", help="the bench model (default wide)")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="wire dtype (default bf16)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds one run's ranks may take")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of the table")
    p.add_argument("-o", "--output", metavar="FILE", help="also write the JSON report to FILE")
    p.add_argument("--plot", metavar="PNG", help="step time against nodes per row (needs matplotlib)")
    p.add_argument("--log", metavar="FILE", help="with --json: where the ranks' output goes")
    p.add_argument("--predict", action="store_true",
                   help="run nothing: each row's step as the cost model predicts it at each count, in the "
                   f"target's seconds, and over the planner's pick (up to {MAX_PREDICT_NODES} nodes)")  # fmt: skip
    p.add_argument("--from", dest="reports", metavar="FILE[,FILE...]",
                   help="run nothing: merge the JSON reports of earlier runs (-o FILE, e.g. one node count "
                   "each) and print, write or plot them as one")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from zerotopo_lab.bench.compare import (
        CLOCK_BATCH,
        CLOCK_SEQ,
        CompareOptions,
        dilation_from_args,
        emit,
        share_from_args,
        target_buckets_from_args,
    )

    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ConfigError("--plot needs matplotlib: pip install matplotlib", key="--plot") from None
    if args.reports:
        paths = [p.strip() for p in args.reports.split(",") if p.strip()]
        report = emit(args, lambda: merge_reports(paths), plot, format_merged, ranks=False)
        return 0 if all(e.get("losses_agree", True) for e in report["counts"]) else 1
    nodes = parse_nodes(args.nodes, MAX_PREDICT_NODES if args.predict else MAX_NODES)
    too_many = [n for n in nodes if n * args.ranks_per_node > MAX_RANKS and not args.predict]
    if too_many:
        raise ConfigError(
            f"{too_many[0]} nodes of {args.ranks_per_node} ranks are {too_many[0] * args.ranks_per_node} ranks, "
            f"more than the {MAX_RANKS} one machine holds; give at most {MAX_RANKS // args.ranks_per_node} nodes",
            key="--nodes",
        )
    rows = tuple(r.strip() for r in args.rows.split(",") if r.strip())
    if not rows:
        raise ConfigError("no rows given", key="--rows")
    dilation = dilation_from_args(args)
    if dilation is not None and (len(nodes) > 1 or args.predict):
        raise ConfigError(
            "a D belongs to one node count's run (its arithmetic and links differ with the count): give one "
            "count, e.g. --nodes 8 --dilation D with the D of an earlier 8-node report; --predict runs at D 1",
            key="--dilation",
        )
    for key in ("steps", "repeat", "micro_batches"):
        if getattr(args, key) < 1:
            raise ConfigError(
                f"expected a positive number, got {getattr(args, key)}", key="--" + key.replace("_", "-")
            )
    base = CompareOptions(regime="device-clock", model=args.model, rows=rows, steps=args.steps, warmup=args.warmup,
                          repeat=args.repeat, dtype=args.dtype, batch=CLOCK_BATCH, seq=CLOCK_SEQ,
                          timeout_s=args.timeout, arithmetic_share=share_from_args(args),
                          dilation=dilation, target_buckets=target_buckets_from_args(args))  # fmt: skip
    command = "zerotopo " + " ".join(sys.argv[1:]) if sys.argv[1:] else "zerotopo bench scale"
    curves = {"both": (None, *CURVES), "off": (None,)}.get(args.curves, (args.curves,))
    with tempfile.TemporaryDirectory(prefix="zerotopo-scale-") as directory:
        base = replace(base, topology=node_topology(args.ranks_per_node, directory))
        if args.predict:
            emit(args, lambda: predict(base, nodes, args.mode, args.micro_batches, command, curves), plot,
                 format_predicted, ranks=False)  # fmt: skip
            return 0
        report = emit(
            args,
            lambda: scale(
                base, nodes, args.mode, args.micro_batches, command, curves=curves, partial=args.output
            ),
            plot,
            format_scale,
        )
    return 0 if all(e["losses_agree"] for e in report["counts"]) else 1
