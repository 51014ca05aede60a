"""Every field of the config tree is used by the trainer or refused/reported as unsupported, so a
key that is parsed and then ignored cannot come back.

"Used" is read from the source: an attribute of the parsed config (``args.model.x``, or ``a =
args.precision.fp16; a.x``) in the trainer, the train and plan commands, or inside a method of the tree
that they call.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

from zerotopo.config.neox import (
    EQUIVALENT_VALUES,
    KEYS,
    NO_EFFECT_KEYS,
    UNSUPPORTED_KEYS,
    load_neox_config,
)
from zerotopo.config.tree import SECTIONS, FP16Config, OptimizerConfig, TrainConfig
from zerotopo.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
CONSUMERS = [
    *sorted((ROOT / "zerotopo" / "trainer").glob("*.py")),
    ROOT / "zerotopo" / "cli" / "plan.py",
]
ARGS_CLASSES = (TrainConfig, *SECTIONS.values(), FP16Config, OptimizerConfig)
# Methods that only validate or name a field in errors: a field read only there is not used.
NOT_USES = {"check", "_check_architecture", "_first", "where", "is_given"}


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


def _chain(node: ast.Attribute) -> list[str]:
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    return names


def _attributes_of(tree: ast.AST, roots: set[str]) -> set[str]:
    """Attribute names reached from a variable in ``roots`` (and from variables assigned from one)."""
    roots = set(roots)
    for node in ast.walk(tree):  # aliases: fp16 = args.precision.fp16
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute):
            base = _root(node.value)
            if isinstance(base, ast.Name) and base.id in roots:
                roots |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = _root(node)
            if isinstance(base, ast.Name) and base.id in roots:
                out.update(_chain(node))
    return out


def used_names() -> set[str]:
    used = set()
    for path in CONSUMERS:
        used |= _attributes_of(ast.parse(path.read_text()), {"args"})
    files = sorted({inspect.getsourcefile(cls) for cls in ARGS_CLASSES})
    bodies = [node for path in files for node in ast.parse(Path(path).read_text()).body]
    methods = {
        (cls.name, fn.name): fn
        for cls in bodies
        if isinstance(cls, ast.ClassDef) and cls.name in {c.__name__ for c in ARGS_CLASSES}
        for fn in cls.body
        if isinstance(fn, ast.FunctionDef) and fn.name not in NOT_USES
    }
    # A method or property the consumers reach uses what it reads from self, transitively.
    while True:
        grown = used.copy()
        for (_, name), fn in methods.items():
            if name in used:
                grown |= _attributes_of(fn, {"self"})
        if grown == used:
            return used
        used = grown


def _refused_unless_default(f: dataclasses.Field) -> bool:
    check = f.metadata.get("check")
    return check is not None and "const" in getattr(check, "__qualname__", "")


def test_every_field_is_used_or_declared_unsupported():
    used = used_names()
    ignored = []
    blocks = {FP16Config: "fp16.", OptimizerConfig: "optimizer."}
    for cls in ARGS_CLASSES:
        for f in dataclasses.fields(cls):
            if f.name == "origin" or f.name in used or f.name in UNSUPPORTED_KEYS:
                continue
            if blocks.get(cls, "") + f.name in EQUIVALENT_VALUES:
                continue
            if _refused_unless_default(f):
                continue  # any other value is refused with the reason (dropout, norm, ...)
            ignored.append(f"{cls.__name__}.{f.name}")
    assert ignored == [], f"parsed but neither used nor refused/reported: {ignored}"


def test_the_coverage_check_can_fail():
    # A field nobody reads is caught: drop the trainer's use of evaluation.iters and it shows up.
    assert {"evaluation", "iters"} <= used_names()
    tree = ast.parse("def f(args):\n    return args.seed\n")
    assert _attributes_of(tree, {"args"}) == {"seed"}


def test_behaviour_keys_are_not_silently_accepted():
    behaviour = {
        "checkpoint_factor",
        "keep_last_n_checkpoints",
        "tensorboard_dir",
        "log_dir",
        "use_wandb",
        "wandb_project",
        "wandb_group",
        "extra_save_iters",
        "attention_config",
        "sparsity_config",
        "scheduler",
        "pipe_parallel_size",
        "model_parallel_size",
    }
    assert not behaviour & set(NO_EFFECT_KEYS)
    fields = set(KEYS)
    assert not set(NO_EFFECT_KEYS) & fields
    for key in UNSUPPORTED_KEYS:
        assert (
            key in fields
            or key.split(".")[0] in fields
            or key
            in (
                "attention_config",
                "sparsity_config",
                "sliding_window_width",
                "deepspeed_extra_args",
            )
        )


@pytest.mark.parametrize(
    "text, outcome",
    [
        ('attention_config: [[["global"], 2]]\n', None),
        ('attention_config: [[["flash"], 2]]\n', "same dense attention"),
        ('attention_config: [[["sparse_fixed", "global"], 1]]\n', "sparse_fixed"),
        ('attention_config: [[["local"], 2]]\nsparsity_config: {block: 16}\n', "local"),
        ("sparsity_config: {block: 16}\n", "sparsity_config has no effect"),
        ("zero_optimization: {stage: 3, offload_optimizer: {device: cpu}}\n", "offload_optimizer"),
        ("zero_optimization: {stage: 3, offload_param: {device: none}}\n", None),
        (
            "zero_optimization: {stgae: 3, overlap_comm: true}\n",
            "zero_optimization.stgae (did you mean stage?)",
        ),
    ],
)
def test_unsupported_keys_refused_or_reported(tmp_path, text, outcome):
    path = tmp_path / "c.yml"
    path.write_text(text)
    import warnings

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        try:
            load_neox_config([path])
        except ConfigError as exc:
            assert outcome and outcome in str(exc) and "not implemented" in str(exc)
            return
    messages = " ".join(str(w.message) for w in record)
    if outcome is None:
        assert messages == ""
    else:
        assert outcome in messages
