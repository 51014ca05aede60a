"""A corpus of bad inputs: each case builds its input in a fresh directory and names the command to run.

Every case must end in one clean error: a non-zero exit status, an ``error:`` line, no Python traceback,
no "internal error", a bounded message, and no sign that anything in the input was executed (cases with
a hostile payload name a ``marker`` file the payload would create). ``tests/badinput/test_badinput_corpus.py``
runs the fast cases in-process; ``benchmarks/badinput_corpus.py`` runs all of them as subprocesses with a
timeout and prints the summary line.

Adding cases: append :class:`Case` objects to :data:`CASES` (or a list that is added to it at the end of
this module, like :data:`EXTRA_CASES`). ``build(tmp)`` writes the input under ``tmp`` (a ``Path``) and
returns an :class:`Invocation`: the ``zerotopo`` arguments, extra environment variables, and optionally a
marker file. ``fast=False`` keeps a case out of the in-process test (large files, training runs).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from zerotopo.data.indexed import DTYPE_CODES

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "tiny.yml")
EMULATED_TOPOLOGY = (ROOT / "topologies" / "emulated.yaml").read_text()

#: Environment variables of launchers; every case starts without them (then adds its own).
LAUNCHER_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GROUP_RANK",
    "ZEROTOPO_EMULATED_NODE",
    "ZEROTOPO_EMULATED_NODES",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
)
LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_")


@dataclass
class Invocation:
    argv: list[str]
    """Arguments of the ``zerotopo`` command."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables set for the run (on top of one without launcher variables)."""
    marker: Path | None = None
    """A file the hostile payload would create if it ran: it must not exist afterwards."""


@dataclass
class Case:
    name: str
    category: str
    build: Callable[[Path], Invocation]
    fast: bool = True


CASES: list[Case] = []


def case(name: str, category: str, *, fast: bool = True):
    def register(build: Callable[[Path], Invocation]) -> Callable[[Path], Invocation]:
        CASES.append(Case(name, category, build, fast))
        return build

    return register


def add(name: str, category: str, build: Callable[[Path], Invocation], *, fast: bool = True) -> None:
    CASES.append(Case(name, category, build, fast))


# -- the four YAML readers ------------------------------------------------------------------------------
# Each takes the path of the file under test and returns the command that reads it.


def _topology_cmd(path: Path) -> list[str]:
    return ["topo", "validate", str(path)]


def _neox_cmd(path: Path) -> list[str]:
    return ["plan", "--model", str(path), "--topology", "emulated", "--plans", "presets"]


def _calibration_cmd(path: Path) -> list[str]:
    return [
        "plan",
        "--model",
        TINY,
        "--topology",
        "emulated",
        "--plans",
        "presets",
        "--calibration",
        str(path),
    ]


def _plan_cmd(path: Path) -> list[str]:
    return ["train", TINY, "--plan", str(path), "--no-progress"]


READERS = {
    "topology": (_topology_cmd, ".yaml", True),
    "neox": (_neox_cmd, ".yml", True),
    "calibration": (_calibration_cmd, ".yaml", True),
    "plan": (_plan_cmd, ".yaml", True),
}


def _bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    lines.append(f"name: *a{levels - 1}")
    return "\n".join(lines) + "\n"


def _deep(levels: int = 200) -> str:
    return "name: " + "[" * levels + "]" * levels + "\n"


def _file_case(kind: str, defect: str, write: Callable[[Path], None], *, fast: bool = True) -> None:
    cmd, suffix, _ = READERS[kind]

    def build(tmp: Path) -> Invocation:
        path = tmp / f"input{suffix}"
        write(path)
        marker = tmp / "EXECUTED"
        return Invocation(cmd(path), marker=marker)

    add(f"{kind}-{defect}", f"yaml:{defect}", build, fast=fast)


def _text(text: str) -> Callable[[Path], None]:
    return lambda p: p.write_text(text)


def _bytes(data: bytes) -> Callable[[Path], None]:
    return lambda p: p.write_bytes(data)


def _dir(p: Path) -> None:
    p.mkdir()


def _fifo(p: Path) -> None:
    os.mkfifo(p)


def _missing(p: Path) -> None:
    pass


def _huge(p: Path) -> None:
    with open(p, "w") as f:
        f.write("name: x\n")
        f.write("# " + "x" * (17 << 20) + "\n")


def _payload(p: Path) -> None:
    marker = p.parent / "EXECUTED"
    p.write_text(f'name: !!python/object/apply:os.system ["touch {marker}"]\n')


def _payload_new(p: Path) -> None:
    marker = p.parent / "EXECUTED"
    p.write_text(f"name: !!python/object/new:subprocess.check_output\n  args: [[touch, {marker}]]\n")


GENERIC_DEFECTS: dict[str, Callable[[Path], None]] = {
    "binary": _bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00" + bytes(range(256))),
    "not-utf8": _bytes("name: caf\xe9\nnodes: 2\n".encode("latin-1")),
    "utf16": _bytes("name: x\n".encode("utf-16")),
    "directory": _dir,
    "fifo": _fifo,
    "missing": _missing,
    "empty": _text(""),
    "comments-only": _text("# nothing here\n\n   \n"),
    "duplicate-key": _text("name: a\nname: b\n"),
    "unhashable-key": _text("? [a, b]\n: 1\nname: x\n"),
    "mapping-key": _text("{a: 1}: 2\n"),
    "null-key": _text("null: 3\nname: x\n"),
    "deep-nesting": _text(_deep()),
    "alias-bomb": _text(_bomb()),
    "recursive-alias": _text("name: &a [*a]\n"),
    "python-tag": _payload,
    "python-new-tag": _payload_new,
    "syntax-error": _text("name: [unclosed\n  tiers: {\n"),
    "tab-indent": _text("name: x\n\tfoo: 1\n"),
    "top-level-list": _text("- a\n- b\n"),
    "top-level-scalar": _text("just a string\n"),
    "long-key": _text("k" * 100_000 + ": 1\n"),
    "huge-file": _huge,
}

for _kind in READERS:
    for _defect, _write in GENERIC_DEFECTS.items():
        _file_case(_kind, _defect, _write, fast=_defect != "huge-file")


# -- topology values ------------------------------------------------------------------------------------


def _topo_with(old: str, new: str) -> str:
    assert old in EMULATED_TOPOLOGY, old
    return EMULATED_TOPOLOGY.replace(old, new, 1)


TOPOLOGY_VALUES = {
    "bandwidth-nan": ("bandwidth_gbps: 4.0", "bandwidth_gbps: .nan"),
    "bandwidth-inf": ("bandwidth_gbps: 4.0", "bandwidth_gbps: .inf"),
    "bandwidth-negative": ("bandwidth_gbps: 4.0", "bandwidth_gbps: -4.0"),
    "bandwidth-zero": ("bandwidth_gbps: 4.0", "bandwidth_gbps: 0"),
    "bandwidth-string": ("bandwidth_gbps: 4.0", "bandwidth_gbps: fast"),
    "bandwidth-huge": ("bandwidth_gbps: 4.0", "bandwidth_gbps: 1e300"),
    "latency-negative": ("latency_us: 20", "latency_us: -20"),
    "latency-inf": ("latency_us: 20", "latency_us: .inf"),
    "latency-bool": ("latency_us: 20", "latency_us: true"),
    "injection-nan": ("injection_gbps: 2.0", "injection_gbps: .nan"),
    "injection-negative": ("injection_gbps: 2.0", "injection_gbps: -1"),
    "memory-nan": ("memory_gib: 2", "memory_gib: .nan"),
    "memory-negative": ("memory_gib: 2", "memory_gib: -2"),
    "memory-list": ("memory_gib: 2", "memory_gib: [2]"),
    "tflops-string": ("peak_tflops: 0.05 ", "peak_tflops: lots "),
    "host-reduce-string": ("host_reduce: true", "host_reduce: sometimes"),
    "fanout-zero": ("fanout: 2\n    bandwidth_gbps: 4.0", "fanout: 0\n    bandwidth_gbps: 4.0"),
    "fanout-negative": ("fanout: 2\n    bandwidth_gbps: 4.0", "fanout: -2\n    bandwidth_gbps: 4.0"),
    "fanout-fraction": ("fanout: 2\n    bandwidth_gbps: 4.0", "fanout: 2.5\n    bandwidth_gbps: 4.0"),
    "fanout-bool": ("fanout: 2\n    bandwidth_gbps: 4.0", "fanout: true\n    bandwidth_gbps: 4.0"),
    "fanout-string": ("fanout: 2\n    bandwidth_gbps: 4.0", "fanout: 'two'\n    bandwidth_gbps: 4.0"),
    "fanout-absurd": ("fanout: 2\n    bandwidth_gbps: 4.0", "fanout: 1000000000\n    bandwidth_gbps: 4.0"),
    "fanout-product-absurd": (
        "fanout: 2\n    bandwidth_gbps: 2.0",
        "fanout: 4000\n    bandwidth_gbps: 2.0",
    ),
    "nodes-zero": ("nodes: 2", "nodes: 0"),
    "nodes-negative": ("nodes: 2", "nodes: -2"),
    "nodes-absurd": ("nodes: 2", "nodes: 1000000000000"),
    "nodes-fraction": ("nodes: 2", "nodes: 1.5"),
    "nodes-string": ("nodes: 2", "nodes: two"),
    "name-list": ("name: emulated", "name: [emulated, other]"),
    "name-number": ("name: emulated", "name: 42"),
    "name-empty": ("name: emulated", "name: ''"),
    "name-long": ("name: emulated", "name: " + "n" * 50_000),
    "tier-name-reserved": ("name: package", "name: world"),
    "tier-name-duplicate": ("name: node", "name: package"),
    "tier-unknown-key": ("latency_us: 20", "latency_us: 20\n    colour: blue"),
    "tier-not-mapping": (
        "  - name: package\n    fanout: 2\n    bandwidth_gbps: 4.0\n    latency_us: 20\n",
        "  - 7\n",
    ),
    "tiers-empty": ("tiers:\n", "tiers: []\nx_tiers:\n"),
    "unknown-top-key": ("nodes: 2", "nodes: 2\nnode: 3"),
    "device-order-wrong": ("nodes: 2", "nodes: 2\ndevice_order: [0, 1, 2]"),
    "device-order-duplicate": ("nodes: 2", "nodes: 2\ndevice_order: [0, 0, 1, 2]"),
    "device-order-bools": ("nodes: 2", "nodes: 2\ndevice_order: [true, false, 2, 3]"),
    "device-order-string": ("nodes: 2", "nodes: 2\ndevice_order: '0,1,2,3'"),
    "description-list": ("description: 2 nodes", "description: [2 nodes]\nx: "),
    "network-missing": ("network:\n  name: network", "x_network:\n  name: network"),
    "device-missing-key": ("  memory_gib: 2\n", ""),
}


def _topology_value(old: str, new: str) -> Callable[[Path], Invocation]:
    def build(tmp: Path) -> Invocation:
        path = tmp / "topo.yaml"
        path.write_text(_topo_with(old, new))
        return Invocation(_topology_cmd(path))

    return build


for _name, (_old, _new) in TOPOLOGY_VALUES.items():
    add(f"topology-{_name}", "topology-value", _topology_value(_old, _new))


def _many_tiers(tmp: Path) -> Invocation:
    tiers = "".join(f"  - {{name: t{i}, fanout: 1, bandwidth_gbps: 1, latency_us: 1}}\n" for i in range(40))
    path = tmp / "topo.yaml"
    path.write_text(
        "name: x\ndevice: {name: d, memory_gib: 1, peak_tflops: 1}\ntiers:\n"
        + tiers
        + "network: {name: net, injection_gbps: 1, latency_us: 1}\n"
    )
    return Invocation(_topology_cmd(path))


add("topology-too-many-tiers", "topology-value", _many_tiers)

for _flag in ("0", "-3", "1000000000000"):
    add(
        f"topo-show-nodes-{_flag}",
        "flag",
        lambda tmp, f=_flag: Invocation(["topo", "show", "emulated", "--nodes", f]),
    )
add("topo-show-unknown", "flag", lambda tmp: Invocation(["topo", "show", "no-such-machine"]))
add("topo-show-empty-name", "flag", lambda tmp: Invocation(["topo", "show", ""]))


# -- NeoX config values (read by `zerotopo plan --model`) ------------------------------------------------

NEOX_VALUES = {
    "train-iters-nan": "train_iters: .nan",
    "train-iters-negative": "train_iters: -1",
    "train-iters-absurd": "train_iters: 1000000000000000000000000000000",
    "train-iters-string": "train_iters: many",
    "train-iters-bool": "train_iters: true",
    "train-iters-fraction": "train_iters: 2.5",
    "hidden-size-absurd": "hidden_size: 1000000000000",
    "num-layers-zero": "num_layers: 0",
    "num-layers-list": "num_layers: [4]",
    "seq-length-negative": "seq_length: -128",
    "lr-nan": "optimizer: {type: AdamW, params: {lr: .nan}}",
    "lr-inf": "optimizer: {type: AdamW, params: {lr: .inf}}",
    "lr-negative": "optimizer: {type: AdamW, params: {lr: -0.001}}",
    "lr-string-nan": "optimizer: {type: AdamW, params: {lr: 'nan'}}",
    "betas-nan": "optimizer: {type: AdamW, params: {betas: [.nan, 0.95]}}",
    "optimizer-list": "optimizer: [AdamW]",
    "optimizer-type-number": "optimizer: {type: 3}",
    "split-garbage": "split: 'a,b,c'",
    "split-nan": "split: [.nan, 1, 1]",
    "split-negative": "split: '-1,1,1'",
    "data-path-number": "data_path: 5",
    "data-path-empty-list": "data_path: []",
    "data-path-empty-string": "data_path: ''",
    "vocab-file-list": "vocab_file: [a, b]",
    "precision-number": "precision: 16",
    "fp16-loss-scale-nan": "fp16: {enabled: true, loss_scale: .nan}",
    "fp16-not-mapping": "fp16: yes please",
    "topology-number": "topology: 3",
    "plan-number": "plan: 3.5",
    "plan-list": "plan: [zero3]",
    "seed-negative": "seed: -1",
    "eval-iters-negative": "eval_iters: -1",
    "warmup-inf": "warmup: .inf",
    "min-lr-nan": "min_lr: .nan",
    "clipping-negative": "gradient_clipping: -1",
    "zero-stage-bool": "zero_optimization: {stage: true}",
    "zero-stage-float": "zero_optimization: {stage: 3.0}",
    "zero-stage-string": "zero_optimization: {stage: '3'}",
    "zero-stage-seven": "zero_optimization: {stage: 7}",
    "zero-not-mapping": "zero_optimization: 3",
    "model-parallel-nan": "model_parallel_size: .nan",
    "heads-not-dividing": "num_attention_heads: 7",
}


def _neox_value(line: str, command: str) -> Callable[[Path], Invocation]:
    def build(tmp: Path) -> Invocation:
        path = tmp / "model.yml"
        path.write_text(
            "num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nseq_length: 64\n" + line + "\n"
        )
        if command == "plan":
            return Invocation(_neox_cmd(path))
        return Invocation(["train", path.as_posix(), "--no-progress"])

    return build


#: Keys the plan command does not use (it reads the model and batch only): checked through train only.
TRAIN_ONLY = ("zero-stage-bool", "zero-stage-float", "zero-stage-string", "zero-stage-seven")
for _name, _line in NEOX_VALUES.items():
    if _name not in TRAIN_ONLY:
        add(f"neox-{_name}", "neox-value", _neox_value(_line, "plan"))
# The same values through `zerotopo train`'s pre-flight (only the ones the plan command does not read).
for _name in (
    "zero-stage-bool",
    "zero-stage-float",
    "zero-stage-string",
    "zero-stage-seven",
    "plan-number",
    "topology-number",
    "data-path-number",
    "split-garbage",
    "lr-nan",
    "train-iters-nan",
):
    add(f"train-neox-{_name}", "neox-value", _neox_value(NEOX_VALUES[_name], "train"))


def _two_files_same_key(tmp: Path) -> Invocation:
    (tmp / "a.yml").write_text("num_layers: 2\n")
    (tmp / "b.yml").write_text("num-layers: 3\n")
    return Invocation(["plan", "--model", str(tmp / "a.yml"), str(tmp / "b.yml"), "--topology", "emulated"])


add("neox-same-key-two-files", "neox-value", _two_files_same_key)

SET_VALUES = {
    "set-no-equals": "train_iters",
    "set-empty-key": "=5",
    "set-nan": "train_iters=nan",
    "set-inf-lr": "optimizer.params.lr=inf",
    "set-negative-iters": "train_iters=-5",
    "set-bool-layers": "num_layers=true",
    "set-list-seq": "seq_length=[1,2]",
    "set-alias-bomb": "num_layers=" + _bomb().replace("\n", " "),
}
for _name, _item in SET_VALUES.items():
    add(
        f"train-{_name}",
        "flag",
        lambda tmp, item=_item: Invocation(["train", TINY, "--set", item, "--no-progress"]),
    )


# -- calibration values -------------------------------------------------------------------------------------

CALIBRATION_VALUES = {
    "bandwidth-nan": "tiers: {node: {bandwidth_gbps: .nan}}",
    "bandwidth-negative": "tiers: {node: {bandwidth_gbps: -3}}",
    "bandwidth-zero": "tiers: {node: {bandwidth_gbps: 0}}",
    "latency-inf": "tiers: {node: {latency_us: .inf}}",
    "latency-string": "tiers: {node: {latency_us: slow}}",
    "unknown-tier": "tiers: {rack: {latency_us: 3}}",
    "tiers-empty": "tiers: {}",
    "tiers-list": "tiers: [node]",
    "tier-entry-string": "tiers: {node: fast}",
    "tier-unknown-key": "tiers: {node: {speed: 3}}",
}


def _calibration_value(body: str, topology: str = "emulated") -> Callable[[Path], Invocation]:
    def build(tmp: Path) -> Invocation:
        path = tmp / "cal.yaml"
        path.write_text(f"topology: {topology}\n{body}\n")
        return Invocation(_calibration_cmd(path))

    return build


for _name, _body in CALIBRATION_VALUES.items():
    add(f"calibration-{_name}", "calibration-value", _calibration_value(_body))
for _name, _body in (
    ("nodes-negative", "nodes: -2"),
    ("nodes-float", "nodes: 2.5"),
    ("notes-list", "notes: [a]"),
):
    add(
        f"calibration-{_name}",
        "calibration-value",
        _calibration_value(_body + "\ntiers: {node: {latency_us: 3}}"),
    )
add(
    "calibration-other-machine",
    "calibration-value",
    _calibration_value("tiers: {node: {latency_us: 3}}", "frontier"),
)
add(
    "calibration-topology-list",
    "calibration-value",
    _calibration_value("tiers: {node: {latency_us: 3}}", "[a]"),
)


def _calibration_json_nan(tmp: Path) -> Invocation:
    path = tmp / "cal.json"
    path.write_text('{"topology": "emulated", "tiers": {"node": {"bandwidth_gbps": NaN}}}')
    return Invocation(_calibration_cmd(path))


def _calibration_json_dup(tmp: Path) -> Invocation:
    path = tmp / "cal.json"
    path.write_text('{"topology": "emulated", "topology": "frontier", "tiers": {}}')
    return Invocation(_calibration_cmd(path))


add("calibration-json-nan", "calibration-value", _calibration_json_nan)
add("calibration-json-duplicate", "calibration-value", _calibration_json_dup)


# -- plan values (read by `zerotopo train --plan`'s pre-flight) -----------------------------------------------

PLAN_FILES = {
    "preset-number": "preset: 3",
    "preset-list": "preset: [zero3]",
    "preset-unknown": "preset: zero9",
    "top-level-number": "plan: 3",
    "name-list": "name: [a, b]",
    "name-number": "name: 5",
    "params-bool": "params: true",
    "params-float": "params: 3.0",
    "params-negative": "params: -2",
    "params-zero": "params: 0",
    "params-unknown-tier": "params: rack",
    "params-not-divisor": "params: 3",
    "params-list": "params: [2]",
    "grads-not-nested": "params: 4\ngrads: 2\noptim: 8",
    "secondary-bad-dtype": "preset: zerotopo\nsecondary: {degree: node, dtype: fp8}",
    "secondary-unknown-key": "preset: zerotopo\nsecondary: {degree: node, colour: red}",
    "sync-number": "preset: zerotopo\nsync: 5",
    "sync-unknown": "preset: zerotopo\nsync: sometimes",
    "grad-reduce-list": "preset: zerotopo\ngrad_reduce: [allreduce]",
    "quant-block-odd": "preset: zerotopo\nquant_block: 3",
    "quant-block-absurd": "preset: zerotopo\nquant_block: 1000000000000",
    "quant-block-float": "preset: zerotopo\nquant_block: 256.0",
    "prefetch-negative": "preset: zerotopo\nprefetch: -1",
    "prefetch-absurd": "preset: zerotopo\nprefetch: 1000000000",
    "quantize-weights-string": "preset: zerotopo\nquantize_weights: 'yes'",
    "unknown-key": "preset: zerotopo\nturbo: true",
}


def _plan_value(body: str) -> Callable[[Path], Invocation]:
    def build(tmp: Path) -> Invocation:
        path = tmp / "plan.yaml"
        path.write_text(body + "\n")
        return Invocation(_plan_cmd(path))

    return build


for _name, _body in PLAN_FILES.items():
    add(f"plan-{_name}", "plan-value", _plan_value(_body))

PLAN_FLAGS = {
    "unknown-key": "zerotopo,bogus=1",
    "key-twice": "params=world,params=node",
    "two-presets": "zerotopo,zero3",
    "empty-value": "zerotopo,sync=",
    "params-nan": "params=nan",
    "prefetch-bool": "zerotopo,prefetch=true",
    "secondary-dtype": "zerotopo,secondary=node/fp4",
}
for _name, _text_value in PLAN_FLAGS.items():
    add(
        f"plan-flags-{_name}",
        "plan-value",
        lambda tmp, v=_text_value: Invocation(["train", TINY, "--plan", v, "--no-progress"]),
    )
add("plan-preset-unknown-flag", "plan-value", lambda tmp: Invocation(["train", TINY, "--plan", "zero9"]))


# -- command-line flags -------------------------------------------------------------------------------------

FLAGS = {
    "plan-nodes-zero": ["plan", "--model", TINY, "--topology", "emulated", "--nodes", "0"],
    "plan-nodes-negative": ["plan", "--model", TINY, "--topology", "emulated", "--nodes", "-1"],
    "plan-nodes-absurd": ["plan", "--model", TINY, "--topology", "emulated", "--nodes", "1000000000000"],
    "plan-efficiency-nan": ["plan", "--model", TINY, "--topology", "emulated", "--efficiency", "nan"],
    "plan-efficiency-big": ["plan", "--model", TINY, "--topology", "emulated", "--efficiency", "7"],
    "plan-memory-nan": ["plan", "--model", TINY, "--topology", "emulated", "--memory-gib", "nan"],
    "plan-memory-inf": ["plan", "--model", TINY, "--topology", "emulated", "--memory-gib", "inf"],
    "plan-memory-negative": ["plan", "--model", TINY, "--topology", "emulated", "--memory-gib", "-4"],
    "plan-micro-batch-zero": ["plan", "--model", TINY, "--topology", "emulated", "--micro-batch", "0"],
    "plan-vocab-zero": ["plan", "--model", TINY, "--topology", "emulated", "--vocab-size", "0"],
    "plan-model-unknown": ["plan", "--model", "no-such-model", "--topology", "emulated"],
    "plan-unknown-preset-list": ["plan", "--model", TINY, "--topology", "emulated", "--plans", "zero9"],
    "train-nodes-zero": ["train", TINY, "--nodes", "0"],
    "train-nodes-negative": ["train", TINY, "--nodes", "-2"],
    "train-network-nan": ["train", TINY, "--network-mbit", "nan"],
    "train-network-inf": ["train", TINY, "--network-mbit", "inf"],
    "train-network-negative": ["train", TINY, "--network-mbit", "-100"],
    "train-network-zero": ["train", TINY, "--network-mbit", "0"],
    "train-prefetch-negative": ["train", TINY, "--prefetch", "-1"],
    "train-topology-unknown": ["train", TINY, "--topology", "no-such-machine"],
    "train-config-missing": ["train", "/nonexistent/config.yml"],
    "bench-sizes-nan": ["bench", "collectives", "--sizes", "nan"],
    "bench-sizes-garbage": ["bench", "collectives", "--sizes", "lots"],
    "bench-sizes-absurd": ["bench", "collectives", "--sizes", "1000000G"],
    "bench-ranks-zero": ["bench", "collectives", "--ranks", "0"],
    "bench-iters-zero": ["bench", "collectives", "--iters", "0"],
    "bench-unknown-op": ["bench", "collectives", "--ops", "all_party"],
    "calibrate-iters-negative": ["calibrate", "--iters", "-1"],
    "calibrate-nodes-zero": ["calibrate", "--nodes", "0"],
    "env-unknown-topology": ["env", "--topology", "no-such-machine"],
}
for _name, _argv in FLAGS.items():
    add(f"flag-{_name}", "flag", lambda tmp, a=_argv: Invocation(list(a)))


# -- data: .idx/.bin pairs ------------------------------------------------------------------------------------

MAGIC = b"MMIDIDX\x00\x00"


def _write_pair(
    prefix: Path,
    sizes=(3, 2),
    *,
    code=8,
    version=1,
    magic=MAGIC,
    pointers=None,
    doc_idx=None,
    count=None,
    doc_count=None,
    bin_bytes=None,
    tokens=None,
) -> None:
    sizes = np.asarray(sizes, dtype=np.int32)
    itemsize = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 8, 7: 4, 8: 2}.get(code, 2)
    if pointers is None:
        pointers = np.concatenate([[0], np.cumsum(sizes[:-1].astype(np.int64))]) * itemsize
    pointers = np.asarray(pointers, dtype=np.int64)
    doc_idx = np.arange(len(sizes) + 1, dtype=np.int64) if doc_idx is None else np.asarray(doc_idx, np.int64)
    with open(f"{prefix}.idx", "wb") as f:
        f.write(magic)
        f.write(struct.pack("<Q", version))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(sizes) if count is None else count))
        f.write(struct.pack("<Q", len(doc_idx) if doc_count is None else doc_count))
        f.write(sizes.tobytes())
        f.write(pointers.tobytes())
        f.write(doc_idx.tobytes())
    if bin_bytes is None:
        dtype = DTYPE_CODES.get(code, np.uint16)
        data = np.arange(1, int(sizes.clip(min=0).sum()) + 1) if tokens is None else np.asarray(tokens)
        bin_bytes = data.astype(dtype).tobytes()
    Path(f"{prefix}.bin").write_bytes(bin_bytes)


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


DATA_DEFECTS: dict[str, Callable[[Path], None]] = {
    "bad-magic": lambda p: _write_pair(p, magic=b"NOTANIDX\x00"),
    "version-2": lambda p: _write_pair(p, version=2),
    "dtype-code-0": lambda p: _write_pair(p, code=0),
    "dtype-code-9": lambda p: _write_pair(p, code=9),
    "count-too-large": lambda p: _write_pair(p, count=2**40),
    "count-max": lambda p: _write_pair(p, count=2**64 - 1),
    "doc-count-too-large": lambda p: _write_pair(p, doc_count=10**12),
    "doc-count-zero": lambda p: _write_pair(p, doc_count=0, doc_idx=[]),
    "pointer-beyond-bin": lambda p: _write_pair(p, pointers=[0, 10**9]),
    "pointer-negative": lambda p: _write_pair(p, pointers=[0, -8]),
    "pointer-misaligned": lambda p: _write_pair(p, pointers=[0, 3]),
    "size-negative": lambda p: _write_pair(p, sizes=(3, -2)),
    "size-beyond-bin": lambda p: _write_pair(p, sizes=(3, 2000), tokens=[1, 2, 3, 4, 5]),
    "doc-idx-not-ending-at-count": lambda p: _write_pair(p, doc_idx=[0, 1, 7]),
    "doc-idx-decreasing": lambda p: _write_pair(p, sizes=(1, 1, 1), doc_idx=[0, 2, 1, 3]),
    "doc-idx-not-starting-at-0": lambda p: _write_pair(p, doc_idx=[1, 1, 2]),
    "bin-odd-bytes": lambda p: _write_pair(p, bin_bytes=b"\x01\x00\x02\x00\x03\x00\x04\x00\x05\x00\x06"),
    "bin-truncated": lambda p: _write_pair(p, bin_bytes=b"\x01\x00"),
    "bin-missing": lambda p: (_write_pair(p), os.unlink(f"{p}.bin")),
    "idx-missing": lambda p: (_write_pair(p), os.unlink(f"{p}.idx")),
    "idx-directory": lambda p: (_write_pair(p), os.unlink(f"{p}.idx"), os.mkdir(f"{p}.idx")),
    "bin-directory": lambda p: (_write_pair(p), os.unlink(f"{p}.bin"), os.mkdir(f"{p}.bin")),
    "idx-empty": lambda p: (_write_pair(p), Path(f"{p}.idx").write_bytes(b"")),
    "idx-header-cut": lambda p: (_write_pair(p), Path(f"{p}.idx").write_bytes(MAGIC + b"\x01\x00")),
    "idx-text": lambda p: (_write_pair(p), Path(f"{p}.idx").write_text("hello, I am not an index\n" * 3)),
    "idx-trailing-garbage": lambda p: (_write_pair(p), _append(Path(f"{p}.idx"), b"garbage")),
    "idx-fifo": lambda p: (_write_pair(p), os.unlink(f"{p}.idx"), os.mkfifo(f"{p}.idx")),
}


def _data_info(write: Callable[[Path], None]) -> Callable[[Path], Invocation]:
    def build(tmp: Path) -> Invocation:
        prefix = tmp / "ds"
        write(prefix)
        return Invocation(["data", "info", str(prefix)])

    return build


def _data_train(write: Callable[[Path], None]) -> Callable[[Path], Invocation]:
    def build(tmp: Path) -> Invocation:
        prefix = tmp / "ds"
        write(prefix)
        return Invocation(["train", TINY, "--set", f"data_path={prefix}", "--no-progress"])

    return build


for _name, _write in DATA_DEFECTS.items():
    add(f"data-info-{_name}", "data", _data_info(_write))
for _name in ("pointer-beyond-bin", "doc-idx-decreasing", "size-negative", "bad-magic", "bin-truncated"):
    add(f"data-train-{_name}", "data", _data_train(DATA_DEFECTS[_name]))
# Valid pairs whose tokens cannot train the model.
add(
    "data-train-negative-token",
    "data",
    _data_train(lambda p: _write_pair(p, code=3, tokens=[1, -5, 2, 3, 4])),
)
add("data-train-float-tokens", "data", _data_train(lambda p: _write_pair(p, code=7)))
add(
    "data-train-token-beyond-vocab",
    "data",
    _data_train(lambda p: _write_pair(p, code=4, tokens=[1, 2, 3, 4, 99999])),
)


def _jsonl(content: bytes | None, *, directory: bool = False) -> Callable[[Path], Invocation]:
    def build(tmp: Path) -> Invocation:
        path = tmp / "in.jsonl"
        if directory:
            path.mkdir()
        elif content is not None:
            path.write_bytes(content)
        return Invocation(
            ["data", "preprocess", "--input", str(path), "--output-prefix", str(tmp / "out"), "--no-progress"]
        )

    return build


PREPROCESS = {
    "not-utf8": _jsonl(b'{"text": "caf\xe9"}\n'),
    "not-json": _jsonl(b"this is not json\n"),
    "deep-json": _jsonl(b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"),
    "no-text-field": _jsonl(b'{"body": "x"}\n'),
    "text-not-string": _jsonl(b'{"text": 5}\n'),
    "list-line": _jsonl(b"[1, 2]\n"),
    "all-empty": _jsonl(b'{"text": ""}\n'),
    "missing": _jsonl(None),
    "directory": _jsonl(None, directory=True),
}
for _name, _build in PREPROCESS.items():
    add(f"data-preprocess-{_name}", "data", _build)


def _vocab(content: bytes | None) -> Callable[[Path], Invocation]:
    def build(tmp: Path) -> Invocation:
        argv = ["train", TINY, "--set", "tokenizer_type=HFTokenizer", "--no-progress"]
        if content is not None:
            (tmp / "tok.json").write_bytes(content)
            argv += ["--set", f"vocab_file={tmp / 'tok.json'}"]
        return Invocation(argv)

    return build


add("tokenizer-vocab-binary", "data", _vocab(b"\x00\x01\x02garbage"))
add("tokenizer-vocab-wrong-json", "data", _vocab(b'{"model": {"vocab": 5}}'))
add("tokenizer-vocab-empty", "data", _vocab(b""))
add("tokenizer-vocab-missing", "data", _vocab(None))
add(
    "train-run-dir-unwritable",
    "flag",
    lambda tmp: Invocation(["train", TINY, "--run-dir", "/proc/zerotopo-run"]),
)
add(
    "train-save-unwritable",
    "flag",
    lambda tmp: Invocation(["train", TINY, "--set", "save=/proc/zerotopo-save", "--no-progress"]),
)
add(
    "train-run-dir-is-file",
    "flag",
    lambda tmp: (tmp / "f").write_text("x") and Invocation(["train", TINY, "--run-dir", str(tmp / "f")]),
)


# -- launcher environments (read by `zerotopo env`) -----------------------------------------------------------

SLURM_OK = {
    "SLURM_PROCID": "1",
    "SLURM_STEP_ID": "0",
    "SLURM_NTASKS": "2",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "0",
    "SLURM_STEP_NUM_NODES": "1",
    "SLURM_STEP_TASKS_PER_NODE": "2",
    "SLURM_STEP_NODELIST": "nid0001",
    "SLURM_JOB_ID": "5",
}
TORCHRUN_OK = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1"}

LAUNCH_ENVS: dict[str, dict[str, str]] = {
    "slurm-nodeid-negative": {**SLURM_OK, "SLURM_NODEID": "-1"},
    "slurm-nodeid-beyond": {**SLURM_OK, "SLURM_NODEID": "5"},
    "slurm-nodeid-garbage": {**SLURM_OK, "SLURM_NODEID": "zero"},
    "slurm-procid-negative": {**SLURM_OK, "SLURM_PROCID": "-1"},
    "slurm-procid-beyond": {**SLURM_OK, "SLURM_PROCID": "2"},
    "slurm-procid-huge": {**SLURM_OK, "SLURM_PROCID": "99999999999999999999999"},
    "slurm-procid-float": {**SLURM_OK, "SLURM_PROCID": "1.0"},
    "slurm-localid-negative": {**SLURM_OK, "SLURM_LOCALID": "-1"},
    "slurm-ntasks-zero": {**SLURM_OK, "SLURM_NTASKS": "0"},
    "slurm-ntasks-absurd": {**SLURM_OK, "SLURM_NTASKS": "100000000000"},
    "slurm-nnodes-zero": {**SLURM_OK, "SLURM_STEP_NUM_NODES": "0"},
    "slurm-tasks-per-node-absurd": {**SLURM_OK, "SLURM_STEP_TASKS_PER_NODE": "2(x99999999999)"},
    "slurm-tasks-per-node-garbage": {**SLURM_OK, "SLURM_STEP_TASKS_PER_NODE": "two"},
    "slurm-nodelist-huge": {**SLURM_OK, "SLURM_STEP_NODELIST": "nid[0-99999999]"},
    "slurm-nodelist-huge-product": {**SLURM_OK, "SLURM_STEP_NODELIST": "r[0-99999999]n[0-99999999]"},
    "slurm-nodelist-unbalanced": {**SLURM_OK, "SLURM_STEP_NODELIST": "nid[0-3"},
    "slurm-nodelist-backwards": {**SLURM_OK, "SLURM_STEP_NODELIST": "nid[5-3]"},
    "slurm-nodelist-empty-brackets": {**SLURM_OK, "SLURM_STEP_NODELIST": "nid[]"},
    "slurm-nodelist-commas": {**SLURM_OK, "SLURM_STEP_NODELIST": ",,"},
    "slurm-master-port-zero": {**SLURM_OK, "MASTER_PORT": "0"},
    "slurm-master-port-high": {**SLURM_OK, "MASTER_PORT": "70000"},
    "slurm-master-port-negative": {**SLURM_OK, "MASTER_PORT": "-1"},
    "slurm-master-port-garbage": {**SLURM_OK, "MASTER_PORT": "http"},
    "torchrun-port-high": {**TORCHRUN_OK, "MASTER_PORT": "65536"},
    "torchrun-rank-negative": {**TORCHRUN_OK, "RANK": "-1"},
    "torchrun-world-zero": {**TORCHRUN_OK, "WORLD_SIZE": "0"},
    "torchrun-world-absurd": {**TORCHRUN_OK, "WORLD_SIZE": "1000000000000", "LOCAL_WORLD_SIZE": "1"},
    "torchrun-no-master": {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"},
    "torchrun-local-world-zero": {**TORCHRUN_OK, "LOCAL_WORLD_SIZE": "0"},
    "rocr-garbage": {**SLURM_OK, "ROCR_VISIBLE_DEVICES": "gpu-please"},
    "cuda-garbage": {**SLURM_OK, "CUDA_VISIBLE_DEVICES": "0,x,1"},
    "cuda-huge-list": {**SLURM_OK, "CUDA_VISIBLE_DEVICES": ",".join(["0"] * 10_000)},
    "emulated-nodes-zero": {**TORCHRUN_OK, "ZEROTOPO_EMULATED_NODES": "0"},
    "emulated-nodes-garbage": {**TORCHRUN_OK, "ZEROTOPO_EMULATED_NODES": "many"},
}


for _var, _value in (
    ("ZEROTOPO_THREADS_PER_RANK", "lots"),
    ("ZEROTOPO_THREADS_PER_RANK", "-4"),
    ("ZEROTOPO_LOCAL_TIMEOUT_S", "nan"),
    ("ZEROTOPO_LOCAL_TIMEOUT_S", "-1"),
):
    add(
        f"train-env-{_var.lower()}-{_value}",
        "launcher-env",
        lambda tmp, v=_var, x=_value: Invocation(["train", TINY, "--no-progress"], env={v: x}),
    )


def _launch_env(env: dict[str, str], check: bool) -> Callable[[Path], Invocation]:
    return lambda tmp: Invocation(["env", "--check"] if check else ["env"], env=dict(env))


for _name, _env in LAUNCH_ENVS.items():
    add(f"env-{_name}", "launcher-env", _launch_env(_env, check=False))
for _name in ("slurm-nodeid-negative", "slurm-master-port-high", "rocr-garbage", "slurm-nodelist-huge"):
    add(f"env-check-{_name}", "launcher-env", _launch_env(LAUNCH_ENVS[_name], check=True))


# -- more classes are appended here (checkpoint cases, ...) ---------------------------------------------------

EXTRA_CASES: list[Case] = []

# -- checkpoints (load: and export-hf), built synthetically: no training run needed -------------------------

_CKPT_MANIFEST = {
    "format": "zerotopo-checkpoint", "version": 1, "step": 1, "consumed_samples": 64, "optimizer_steps": 1,
    "world_size": 8, "plan": "zerotopo", "degrees": "", "seed": 1234, "loss_scaler": None,
    "model": {
        "vocab_size": 384, "hidden_size": 64, "num_layers": 2, "num_attention_heads": 2,
        "intermediate_size": None, "max_position_embeddings": 128, "rotary_pct": 0.25, "rotary_emb_base": 10000,
        "gpt_j_residual": True, "layernorm_epsilon": 1e-05, "use_bias_in_attn_linear": True,
        "use_bias_in_mlp": True, "gelu_approximate": False, "tie_embeddings": False, "init_method": "normal",
        "output_layer_init_method": "scaled_normal", "init_std": 0.02, "checkpoint_activations": False,
    },
    "parameters": {}, "tokenizer": None,
}  # fmt: skip
_CKPT_METADATA = {"format": "zerotopo-dcp-metadata", "dcp_version": "1", "tensors": {}, "storage": []}
_PICKLE = "cos\nsystem\n(S'touch {marker}'\ntR."


def _checkpoint_case(name: str, edit: Callable[[Path, Path], None], *, export: bool = False) -> None:
    """A save directory with ``latest`` -> ``step_1`` (a plausible manifest and metadata), changed by
    ``edit(save, step_dir)``; run as ``train --set load=...`` (or ``export-hf``)."""

    def build(tmp: Path) -> Invocation:
        import json

        save, step = tmp / "save", tmp / "save" / "step_1"
        step.mkdir(parents=True)
        (save / "latest").write_text("step_1\n")
        (step / "checkpoint.json").write_text(json.dumps(_CKPT_MANIFEST))
        (step / "dcp_metadata.json").write_text(json.dumps(_CKPT_METADATA))
        edit(save, step)
        if export:
            return Invocation(["export-hf", str(save), str(tmp / "out")], marker=tmp / "EXECUTED")
        return Invocation(["train", TINY, "--set", f"load={save}", "--no-progress"], marker=tmp / "EXECUTED")

    add(f"checkpoint-{name}" + ("-export" if export else ""), "checkpoint", build)


def _json_edit(name: str, change: Callable[[dict], None]) -> Callable[[Path, Path], None]:
    def edit(save: Path, step: Path) -> None:
        import json

        obj = json.loads((step / name).read_text())
        change(obj)
        (step / name).write_text(json.dumps(obj))

    return edit


def _pickle_into(name: str) -> Callable[[Path, Path], None]:
    return lambda save, step: (step / name).write_text(_PICKLE.format(marker=save.parent / "EXECUTED"))


def _shard(size: int, length: int, file: str = "__0_0.distcp") -> Callable[[Path, Path], None]:
    def edit(save: Path, step: Path) -> None:
        import json

        md = dict(_CKPT_METADATA)
        md["tensors"] = {
            "param/x": {"dtype": "float32", "size": [4], "chunks": [{"offsets": [0], "sizes": [4]}]}
        }
        md["storage"] = [{"fqn": "param/x", "offset": [0], "file": file, "byte_offset": 0, "length": length}]
        (step / "dcp_metadata.json").write_text(json.dumps(md))
        if size >= 0:
            (step / "__0_0.distcp").write_bytes(b"\0" * size)

    return edit


CHECKPOINT_DEFECTS: dict[str, Callable[[Path, Path], None]] = {
    "latest-names-nothing": lambda save, step: (save / "latest").write_text("step_99\n"),
    "latest-negative": lambda save, step: (save / "latest").write_text("step_-5\n"),
    "latest-binary": lambda save, step: (save / "latest").write_bytes(b"\x89PNG\xff\xfe\x00"),
    "latest-traversal": lambda save, step: (save / "latest").write_text("../../etc\n"),
    "latest-empty": lambda save, step: (save / "latest").write_text(""),
    "latest-directory": lambda save, step: ((save / "latest").unlink(), (save / "latest").mkdir()),
    "no-latest": lambda save, step: (save / "latest").unlink(),
    "manifest-missing": lambda save, step: (step / "checkpoint.json").unlink(),
    "manifest-binary": lambda save, step: (step / "checkpoint.json").write_bytes(bytes(range(256))),
    "manifest-pickle": _pickle_into("checkpoint.json"),
    "manifest-list": lambda save, step: (step / "checkpoint.json").write_text("[1, 2]"),
    "manifest-wrong-format": _json_edit("checkpoint.json", lambda m: m.update(format="safetensors")),
    "manifest-negative-step": _json_edit("checkpoint.json", lambda m: m.update(step=-1)),
    "manifest-step-text": _json_edit("checkpoint.json", lambda m: m.update(step="one")),
    "manifest-step-mismatch": _json_edit("checkpoint.json", lambda m: m.update(step=7)),
    "manifest-negative-samples": _json_edit("checkpoint.json", lambda m: m.update(consumed_samples=-64)),
    "manifest-model-not-object": _json_edit("checkpoint.json", lambda m: m.update(model=[1])),
    "manifest-model-field-missing": _json_edit("checkpoint.json", lambda m: m["model"].pop("hidden_size")),
    "manifest-model-bad-value": _json_edit(
        "checkpoint.json", lambda m: m["model"].update(num_attention_heads=7)
    ),
    "another-model": lambda save, step: None,  # the manifest's model is not the tiny config's
    "metadata-missing": lambda save, step: (step / "dcp_metadata.json").unlink(),
    "metadata-binary": lambda save, step: (step / "dcp_metadata.json").write_bytes(b"\x00\xff" * 50),
    "metadata-pickle": _pickle_into("dcp_metadata.json"),
    "metadata-wrong-format": _json_edit("dcp_metadata.json", lambda m: m.update(format="dcp")),
    "metadata-bad-dtype": _json_edit(
        "dcp_metadata.json",
        lambda m: m["tensors"].update(x={"dtype": "object", "size": [1], "chunks": []}),
    ),
    "metadata-chunk-outside": _json_edit(
        "dcp_metadata.json",
        lambda m: m["tensors"].update(
            x={"dtype": "float32", "size": [4], "chunks": [{"offsets": [3], "sizes": [9]}]}
        ),
    ),
    "metadata-negative-size": _json_edit(
        "dcp_metadata.json", lambda m: m["tensors"].update(x={"dtype": "float32", "size": [-4], "chunks": []})
    ),
    "shard-missing": _shard(-1, 100),
    "shard-truncated": _shard(10, 100),
    "shard-path-traversal": _shard(100, 10, file="../../../etc/passwd.distcp"),
    "shard-absolute-path": _shard(100, 10, file="/etc/passwd"),
    "dcp-pickle-metadata-only": lambda save, step: (
        (step / "dcp_metadata.json").unlink(),
        (step / ".metadata").write_text(_PICKLE.format(marker=save.parent / "EXECUTED")),
    ),
}

for _name, _edit in CHECKPOINT_DEFECTS.items():
    _checkpoint_case(_name, _edit)
for _name in (
    "latest-names-nothing",
    "manifest-pickle",
    "metadata-pickle",
    "shard-truncated",
    "another-model",
):
    _checkpoint_case(_name, CHECKPOINT_DEFECTS[_name], export=True)


def _load_is_a_file(tmp: Path) -> Invocation:
    (tmp / "ckpt.pt").write_text(_PICKLE.format(marker=tmp / "EXECUTED"))
    return Invocation(
        ["train", TINY, "--set", f"load={tmp / 'ckpt.pt'}", "--no-progress"], marker=tmp / "EXECUTED"
    )


def _export_into_busy_dir(tmp: Path) -> Invocation:
    (tmp / "out").mkdir()
    (tmp / "out" / "mine.txt").write_text("keep")
    return Invocation(["export-hf", str(tmp / "nothing"), str(tmp / "out")])


add("checkpoint-load-is-a-pickle-file", "checkpoint", _load_is_a_file)
add(
    "checkpoint-export-nothing",
    "checkpoint",
    lambda tmp: Invocation(["export-hf", str(tmp / "x"), str(tmp / "o")]),
)
add("checkpoint-export-busy-dir", "checkpoint", _export_into_busy_dir)
add(
    "checkpoint-export-bad-shard-size",
    "checkpoint",
    lambda tmp: Invocation(["export-hf", str(tmp), str(tmp / "o"), "--max-shard-size", "lots"]),
)
add(
    "hf-from-missing-dir",
    "checkpoint",
    lambda tmp: Invocation(["train", TINY, "--from-hf", str(tmp / "none")]),
)


# -- long runs: load: naming nothing, unbounded model configs, links out of a checkpoint, device lists -------


def _link_out(save: Path, step: Path) -> None:
    _shard(100, 10)(save, step)
    (step / "__0_0.distcp").unlink()
    (step / "__0_0.distcp").symlink_to("/etc/passwd")


LONG_RUN_DEFECTS: dict[str, Callable[[Path, Path], None]] = {
    "model-zero-heads": _json_edit("checkpoint.json", lambda m: m["model"].update(num_attention_heads=0)),
    "model-1e8-layers": _json_edit("checkpoint.json", lambda m: m["model"].update(num_layers=10**8)),
    "model-float-layers": _json_edit("checkpoint.json", lambda m: m["model"].update(num_layers=1e8)),
    "model-nan-epsilon": _json_edit(
        "checkpoint.json", lambda m: m["model"].update(layernorm_epsilon=float("nan"))
    ),
    "shard-linked-out": _link_out,
    "metadata-bad-checksum": lambda save, step: (
        _shard(100, 10)(save, step),
        _json_edit("dcp_metadata.json", lambda m: m["storage"][0].update(crc32c="ffff"))(save, step),
    ),
}
for _name, _edit in LONG_RUN_DEFECTS.items():
    _checkpoint_case(_name, _edit)
for _name in ("model-1e8-layers", "shard-linked-out"):
    _checkpoint_case(_name, LONG_RUN_DEFECTS[_name], export=True)


def _load_nothing(kind: str) -> Callable[[Path], Invocation]:
    def build(tmp: Path) -> Invocation:
        target = tmp / "checkpints"  # a typo of the real directory
        if kind == "empty":
            target.mkdir()
        return Invocation(["train", TINY, "--set", f"load={target}", "--no-progress"])

    return build


add("checkpoint-load-does-not-exist", "checkpoint", _load_nothing("missing"))
add("checkpoint-load-empty-directory", "checkpoint", _load_nothing("empty"))
for _var, _value in (
    ("ROCR_VISIBLE_DEVICES", "-1"),
    ("CUDA_VISIBLE_DEVICES", ""),
    ("HIP_VISIBLE_DEVICES", "-1,0"),
):
    add(
        f"train-gpu-topology-{_var.lower()}-hides-all",
        "launcher-env",
        lambda tmp, v=_var, x=_value: Invocation(
            ["train", TINY, "--topology", "frontier", "--nodes", "1", "--no-progress"], env={v: x}
        ),
    )
CASES.extend(EXTRA_CASES)


def base_environment() -> dict[str, str]:
    """This process's environment without any launcher's variables."""
    return {
        k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith(LAUNCHER_PREFIXES)
    }


# -- judging an outcome -----------------------------------------------------------------------------------------

#: Longest output a clean error may print (the message of a hostile value is cut).
MAX_OUTPUT_CHARS = 8000


def classify(returncode: int | None, output: str, marker: Path | None) -> str:
    """``clean``, ``traceback``, ``hang``, ``accepted`` or ``executed`` (see the module docstring)."""
    if marker is not None and marker.exists():
        return "executed"
    if returncode is None:
        return "hang"
    if "Traceback (most recent call last)" in output or "internal error" in output:
        return "traceback"
    if returncode == 0:
        return "accepted"
    if "error" not in output or len(output) > MAX_OUTPUT_CHARS:
        return "traceback"
    return "clean"


OUTCOMES = ("clean", "traceback", "hang", "accepted", "executed")


def summary_line(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    return (
        f"{total} cases: {counts.get('clean', 0)} clean errors, {counts.get('traceback', 0)} tracebacks, "
        f"{counts.get('hang', 0)} hangs, {counts.get('accepted', 0)} accepted, {counts.get('executed', 0)} executed"
    )
