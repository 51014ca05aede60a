"""The config key reference (``docs/configs.md``), generated from the NeoX key table
(:data:`zerotopo.config.neox.KEYS`) and the field docstrings of the config tree (:mod:`zerotopo.config.tree`).

Each field's docstring is the string literal right under it in the class body; ``ast`` reads them from the
source, so the reference can never disagree with the code. Regenerate with
``python -m zerotopo.config.reference > docs/configs.md``; a test checks the file is current.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from typing import Any

from zerotopo.config.neox import (
    EQUIVALENT_VALUES,
    KEYS,
    NO_EFFECT_KEYS,
    REFUSED_UNLESS_DEFAULT,
    UNSUPPORTED_KEYS,
    ZERO_OFFLOAD_KEYS,
    ZERO_PLAN_KEYS,
    ZERO_TUNING_KEYS,
)
from zerotopo.config.neox_defaults import DIFFERS_FROM_NEOX
from zerotopo.config.optimizers import SPECS
from zerotopo.config.tree import SECTIONS, FP16Config, OptimizerConfig, TrainConfig, field_at


def field_docstrings(cls: type) -> dict[str, str]:
    """``{field name: docstring}`` for a dataclass whose fields carry a docstring right below them (those
    of its dataclass bases too)."""
    docs = {}
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base) and base.__module__.startswith("zerotopo"):
            docs.update(_own_docstrings(base))
    return docs


def _own_docstrings(cls: type) -> dict[str, str]:
    """The field docstrings in the body of ``cls`` itself."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, after in zip(body, body[1:]):
        is_doc = (
            isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        )
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and is_doc:
            docs[node.target.id] = " ".join(inspect.cleandoc(after.value.value).split()).replace("``", "`")
    return docs


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value: Any = f.default
    elif f.default_factory is not dataclasses.MISSING:
        return "see below"
    else:
        return "required"
    if isinstance(value, tuple) and f.name == "split":
        return '`"969,30,1"`'
    return "—" if value is None else f"`{value!r}`"


def _neox_default(name: str) -> str:
    """`` (NeoX: ...)`` after a default that is not GPT-NeoX's (see :mod:`zerotopo.config.neox_defaults`)."""
    if name not in DIFFERS_FROM_NEOX:
        return ""
    neox = DIFFERS_FROM_NEOX[name][0]
    return " (NeoX: " + ("required" if neox is None else f"`{neox!r}`") + ")"


def _table(cls: type, prefix: str = "", skip: tuple[str, ...] = ()) -> list[str]:
    """A block's keys: ``<prefix><field>`` for each field of ``cls``."""
    docs = field_docstrings(cls)
    rows = ["| key | default | meaning |", "| --- | --- | --- |"]
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        name = prefix + f.name
        doc = docs.get(f.name, "").replace("|", "\\|")
        rows.append(f"| `{name}` | {_default(f)}{_neox_default(name)} | {doc} |")
    return rows


def _tree_field(path: str) -> tuple[dataclasses.Field, str]:
    """The field at ``path`` in the tree (``model.num_layers``, ``seed``) and its docstring."""
    section, _, name = path.rpartition(".")
    cls = SECTIONS[section] if section else TrainConfig
    return field_at(path), field_docstrings(cls).get(name, "")


def _keys_table(skip: tuple[str, ...]) -> list[str]:
    """Every key of :data:`KEYS` but ``skip``: its field in the tree, default and meaning."""
    rows = ["| key | field | default | meaning |", "| --- | --- | --- | --- |"]
    for key, path in KEYS.items():
        if key in skip:
            continue
        f, doc = _tree_field(path)
        doc = doc.replace("|", "\\|")
        rows.append(f"| `{key}` | `{path}` | {_default(f)}{_neox_default(key)} | {doc} |")
    return rows


def _defaults_table() -> list[str]:
    """The defaults that are not GPT-NeoX's, with the reason."""
    return [
        "## Defaults that differ from GPT-NeoX's",
        "",
        "Every other default above is GPT-NeoX's (`megatron/neox_arguments/neox_args.py`, and DeepSpeed's for",
        "the blocks NeoX hands to DeepSpeed); a test compares them with a recorded copy of NeoX's. A config",
        "that leaves one of these keys out trains differently here than in GPT-NeoX:",
        "",
        "| key | GPT-NeoX's default | zerotopo's, and why |",
        "| --- | --- | --- |",
        *(
            f"| `{k}` | {'required' if d is None else f'`{d!r}`'} | {why} |"
            for k, (d, why) in DIFFERS_FROM_NEOX.items()
        ),
        "",
    ]


def render() -> str:
    """The whole ``docs/configs.md``."""
    return "\n".join([*_intro(), *_key_tables(), *_defaults_table(), *_refused_tables()])


def _intro() -> list[str]:
    """The title and how configs are read, merged, shipped and derived."""
    return [
        "# NeoX-style config keys",
        "",
        "<!-- Generated by `python -m zerotopo.config.reference > docs/configs.md`; edit the field docstrings in",
        "     zerotopo/config/tree.py and its section modules (the key table: zerotopo/config/neox.py). -->",
        "",
        "zerotopo reads GPT-NeoX YAML configs: `zerotopo train a.yml b.yml --set key=value`. Files are merged; a",
        "key in two files is an error naming both; `-` and `_` are the same in keys (`num-layers` = `num_layers`);",
        "a key that is neither zerotopo's nor a NeoX key listed below is an error naming it (with the key it most",
        "likely misspells); a bad value is an error naming the file, key,",
        "value and what is allowed. `--set` overrides win over files, and dotted keys reach into blocks",
        "(`--set optimizer.params.lr=3e-4`). Every key below is used by the trainer; NeoX keys that select",
        "kernels or bookkeeping are accepted without effect, and those zerotopo cannot honour are refused when",
        "they would change the result and reported when they would not (tables at the end). A test checks that",
        "no field is parsed and then ignored.",
        "",
        "Built-in configs (inside the package, so a name works from any directory: `zerotopo train neox-125m`,",
        "`zerotopo plan --model neox-20b`): `tiny` (the CPU default), `neox-125m`, `neox-1-3b`, `neox-10b`,",
        "`neox-20b` (NeoX shapes, fp16, `topology: frontier`, `plan: zerotopo`), and `llama-7b-shape`,",
        "`llama-13b-shape`, `llama-30b-shape` (Llama depths and widths on the NeoX architecture); in a checkout",
        "they are the files in `configs/`.",
        "",
        "A run's `config.yml` (in its run directory) holds every key of this reference as resolved, the plan",
        "written out, `topology` and `num_nodes`; passed back to `zerotopo train` it trains the same run.",
        "",
        "Derived values: `train_batch_size = train_micro_batch_size_per_gpu × gradient_accumulation_steps ×",
        "data-parallel ranks` (give any two, or micro alone for accumulation 1); the model's vocabulary is the",
        "tokenizer's rounded up to `make_vocab_size_divisible_by`; `lr_decay_iters` defaults to `train_iters`;",
        "precision comes from `precision` or else the `fp16` / `bf16` blocks.",
        "",
    ]


def _key_tables() -> list[str]:
    """One table per block of keys the trainer reads: top level, optimizer, fp16, scheduler, ZeRO."""
    return [
        "## Top-level keys",
        "",
        "Each key lands in one field of the config tree (`zerotopo.config.tree.TrainConfig`, the `field`",
        "column); a config built in code sets the fields and is validated by `zerotopo.config.validate`.",
        "The `optimizer` block is `optim.optimizer` (`OptimizerConfig`), the `fp16` block `precision.fp16`",
        "(`FP16Config`).",
        "",
        *_keys_table(skip=("optimizer", "fp16")),
        "",
        "## `optimizer` block",
        "",
        "Written as `optimizer: {type: Adam, params: {lr: 6.0e-4, betas: [0.9, 0.95], eps: 1.0e-8}}`.",
        "",
        *_table(OptimizerConfig, prefix="optimizer.params.", skip=("type", "options")),
        "| `optimizer.params.<other>` | torch's | " + field_docstrings(OptimizerConfig)["options"] + " |",
        "| `optimizer.type` | `'AdamW'`"
        + _neox_default("optimizer.type")
        + " | "
        + field_docstrings(OptimizerConfig)["type"]
        + " |",
        "",
        *_optimizer_types(),
        "",
        "## `fp16` block",
        "",
        "DeepSpeed's block, as NeoX configs write it; `enabled: true` turns fp16 on.",
        "",
        *_table(FP16Config, prefix="fp16."),
        "",
        "## `scheduler` block",
        "",
        "DeepSpeed's `scheduler: {type: WarmupLR | WarmupDecayLR, params: {...}}` with DeepSpeed's parameters",
        "(`warmup_min_lr`, `warmup_max_lr`, `warmup_num_steps`, `warmup_type: log | linear`, and",
        "`total_num_steps` for `WarmupDecayLR`) and formulas; when present it sets the learning rate instead of",
        "`lr_decay_style` / `warmup` / `min_lr`, as in DeepSpeed. Other scheduler types are refused.",
        "",
        "## `zero_optimization` block",
        "",
        "Mapped to a plan by " + ", ".join(f"`{k}`" for k in sorted(ZERO_PLAN_KEYS)) + " (see plans.md).",
        "Offload settings ("
        + ", ".join(f"`{k}`" for k in sorted(ZERO_OFFLOAD_KEYS))
        + ") warn once: zerotopo",
        "keeps every state on the device, which changes memory, not the result. DeepSpeed's tuning keys are",
        "accepted without effect: "
        + ", ".join(f"`{k}`" for k in sorted(ZERO_TUNING_KEYS))
        + ". Any other key",
        "is reported as unknown, with the key it most likely misspells.",
        "",
    ]


def _optimizer_types() -> list[str]:
    """The optimizer table (:mod:`zerotopo.config.optimizers`): what each type takes and keeps."""
    rows = [
        "Each type runs torch's own class on views of the flat fp32 master shards; its per-element states are",
        "flat buffers sharded like the master weights and stored in checkpoints as `<state>/<parameter>`.",
        "Weight decay applies to matrices only (biases and norms are not decayed) for every type; it is",
        "decoupled for AdamW and Adam and torch's L2 term for the others (NAdam and RAdam: decoupled with",
        "`decoupled_weight_decay: true`). A checkpoint resumes only with the type (and the states) that wrote",
        "it; `finetune: true` starts a fresh optimizer of any type from its weights. Where torch has a fused",
        "kernel of the class on the device, it runs (an fp16 overflow then skips the step on the device);",
        "elsewhere the foreach kernel runs and the host reads the overflow flag. SGD with `momentum` and",
        "`dampening` takes its momentum buffer from the first gradient, as torch does; under fp16 loss scaling",
        "it runs the foreach kernel.",
        "",
        "| type | torch class | params besides `lr`, `weight_decay` | per-element states | fused kernel |",
        "| --- | --- | --- | --- | --- |",
    ]
    for spec in SPECS.values():
        states = ", ".join(f"`{n}`" + (f" (with `{on}`)" if on else "") for n, on in spec.states)
        scalars = ", ".join(f"`{n}`" for n, _ in spec.scalars)
        fused = (
            "CUDA, CPU, torch's others" if spec.fused is None else ", ".join(d.upper() for d in spec.fused)
        )
        name = f"{spec.name}, Adam" if spec.name == "AdamW" else spec.name
        rows.append(
            f"| {name} | `torch.optim.{spec.torch_class}` | {', '.join(f'`{k}`' for k in spec.params) or '—'} | "
            f"{states}{f'; scalar {scalars}' if scalars else ''} | {fused or '—'} |"
        )
    return rows


def _refused_tables() -> list[str]:
    """The NeoX keys zerotopo refuses, accepts without effect, or accepts only at NeoX's default."""
    return [
        "## Keys zerotopo cannot honour",
        "",
        "| key | what happens |",
        "| --- | --- |",
        *(f"| `{k}` | {v} |" for k, v in UNSUPPORTED_KEYS.items()),
        *(f"| `{k}` | {v} |" for k, v in EQUIVALENT_VALUES.items()),
        "",
        "## NeoX keys accepted without effect",
        "",
        "| key | why it changes nothing here |",
        "| --- | --- |",
        *(f"| `{k}` | {v} |" for k, v in NO_EFFECT_KEYS.items()),
        "",
        "## NeoX keys refused unless they hold NeoX's default",
        "",
        "NeoX's default changes nothing and is accepted; any other value stops the run before any rank starts.",
        "`zerotopo config keys` prints this table and the one above.",
        "",
        "| key | NeoX's default | what to do instead |",
        "| --- | --- | --- |",
        *(f"| `{k}` | `{d!r}` | {fix} |" for k, (d, fix) in REFUSED_UNLESS_DEFAULT.items()),
        "",
    ]


if __name__ == "__main__":
    print(render(), end="")
