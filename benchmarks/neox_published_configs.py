"""Run GPT-NeoX's published configs through zerotopo and print the table of docs/neox-configs.md.

    python benchmarks/neox_published_configs.py /path/to/gpt-neox/configs [--no-train] [--only NAME ...]

For each config of GPT-NeoX's ``configs/`` (the top level, ``llama/``, ``llama2/``, ``mistral/``,
``pythia/``) as its repository publishes it: does it parse, does ``zerotopo plan --topology frontier
--nodes 48 --model FILES`` plan it, and does ``zerotopo train FILES`` train it on the emulated 8-rank cluster
with only ``--set`` shrinking sizes, iterations and data, or is it refused before any rank starts, and
why. A config whose shrunk run resolves to the config of one trained before it, up to paths and
hyperparameter values (:data:`_SAME_PATH_KEYS`), is reported as training as that one (it takes the same
code path; the parse checked its values). A model file of ``llama/`` is used with ``llama/train_config.yml`` (as NeoX's llama README says); a
file that sets no model (``local_setup.yml``, ``text_generation.yml``, ...) with ``125M.yml``, as NeoX's
``deepy.py`` merges them. Every run trains on a small byte-level dataset made once in a temporary
directory, which is also each run's working directory (the configs' relative paths land there).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("", "llama", "llama2", "mistral", "pythia")
TRAIN_TIMEOUT_S = 900

#: What ``--set`` shrinks: sizes (the model, batch, sequence), iterations and data.
SHRINK = {
    "num_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "seq_length": 32,
    "max_position_embeddings": 32,
    "train_micro_batch_size_per_gpu": 2,
    "train_iters": 2,
    "lr_decay_iters": 2,
    "eval_iters": 0,
    "log_interval": 1,
}


def config_sets(configs: Path) -> list[tuple[str, list[Path]]]:
    """``(name, files)`` for each published config, with the file it is used with."""
    out = []
    for folder in FOLDERS:
        for path in sorted((configs / folder).glob("*.yml")):
            rel = str(path.relative_to(configs))
            keys = _keys(path)
            if folder == "llama" and path.name != "train_config.yml":
                files = [path, configs / "llama" / "train_config.yml"]
            elif path.name == "train_config.yml":
                files = [configs / "llama" / "7B.yml", path]
            elif "num_layers" not in keys:
                files = [configs / "125M.yml", path]
            else:
                files = [path]
            out.append((rel, files))
    return out


def _keys(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError:
        return {}
    return {str(k).replace("-", "_"): v for k, v in data.items()} if isinstance(data, dict) else {}


def parse(files: list[Path]) -> str | None:
    """None when the files load, else the refusal's first line."""
    from zerotopo.config.neox import load_neox_config
    from zerotopo.errors import ConfigError

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            load_neox_config(files)
        except ConfigError as exc:
            return str(exc).splitlines()[0]
    return None


def run(cmd: list[str], cwd: Path, timeout: float) -> tuple[int, str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout:.0f} s", time.perf_counter() - t0
    return p.returncode, p.stdout + p.stderr, time.perf_counter() - t0


def plan(files: list[Path], cwd: Path) -> str:
    cmd = [sys.executable, "-m", "zerotopo", "plan", "--topology", "frontier", "--nodes", "48", "--plans",
           "presets", "--model", *map(str, files)]  # fmt: skip
    code, out, _ = run(cmd, cwd, 300)
    if code:
        return "refused: " + _error_line(out)
    m = re.search(r"^recommended: (\S+)", out, re.M)
    if m:
        return f"plans; recommended {m.group(1)}"
    if "no plan fits" in out:
        return "plans; none fits 48 nodes at micro-batch 1 as written"
    return "plans"


def shrink_overrides(files: list[Path], data_prefix: str) -> dict:
    """``--set`` values: :data:`SHRINK` plus the sizes and data keys these files set."""
    keys: dict = {}
    for f in files:
        keys.update(_keys(f))
    sets = dict(SHRINK)
    if keys.get("num_kv_heads"):
        sets["num_kv_heads"] = 2
    if keys.get("intermediate_size"):
        sets["intermediate_size"] = 256
    if keys.get("train_batch_size"):
        sets["train_batch_size"] = 2 * int(keys.get("gradient_accumulation_steps") or 1) * 8
    sets.update(tokenizer_type="ByteTokenizer", vocab_file=None, merge_file=None, save="save")
    if keys.get("train_data_paths"):
        for kind in ("train", "valid", "test"):
            if keys.get(f"{kind}_data_paths"):
                sets[f"{kind}_data_paths"] = [data_prefix]
                sets[f"{kind}_data_weights"] = None
    else:
        sets["data_path"] = data_prefix
    if keys.get("load"):
        sets["load"] = "save"
    return sets


#: Keys that say where a run writes, logs or reads its data, or set a hyperparameter's value: two shrunk
#: runs that differ only in these take the same code path (the parse already checked each value).
_SAME_PATH_KEYS = (
    "save", "load", "log_dir", "tensorboard_dir", "use_wandb", "wandb_project", "wandb_group", "wandb_team",
    "wandb_host", "keep_last_n_checkpoints", "checkpoint_factor", "save_interval", "extra_save_iters",
    "checkpoint_scale", "eval_interval", "strict_saves", "data_path", "train_data_paths", "valid_data_paths",
    "test_data_paths", "train_data_weights", "valid_data_weights", "test_data_weights", "split", "min_lr",
    "warmup", "weight_decay", "gradient_clipping", "init_method_std", "seed", "lr_decay_style",
    "rotary_emb_base", "layernorm_epsilon", "rms_norm_epsilon", "optimizer.params", "fp16.initial_scale_power",
    "zero_optimization.<tuning>",
)  # fmt: skip


def resolved(files: list[Path], data_prefix: str) -> dict | None:
    """The shrunk run's resolved config without :data:`_SAME_PATH_KEYS`; None when it does not load."""
    from zerotopo.config.neox import ZERO_PLAN_KEYS, load_neox_config, to_neox_dict
    from zerotopo.errors import ConfigError

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            values = to_neox_dict(load_neox_config(files, shrink_overrides(files, data_prefix)))
        except ConfigError:
            return None
    out = {k: v for k, v in values.items() if k not in _SAME_PATH_KEYS}
    out["optimizer"] = {"type": values["optimizer"]["type"], "params": sorted(values["optimizer"]["params"])}
    out["fp16"] = {k: v for k, v in values["fp16"].items() if k != "initial_scale_power"}
    zero = values.get("zero_optimization") or {}
    out["zero_optimization"] = {k: v for k, v in zero.items() if k in ZERO_PLAN_KEYS}
    return out


def train(files: list[Path], cwd: Path, data_prefix: str) -> tuple[str, float]:
    sets = shrink_overrides(files, data_prefix)
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    run_dir = cwd / "run"
    cmd = [sys.executable, "-m", "zerotopo", "train", *map(str, files), "--no-progress", "--run-dir",
           str(run_dir), *args]  # fmt: skip
    code, out, wall = run(cmd, cwd, TRAIN_TIMEOUT_S)
    summary = run_dir / "summary.json"
    if code == 0 and summary.is_file():
        s = json.loads(summary.read_text())
        return f"trained ({s['steps']} steps, loss {s['first_loss']:.3f} -> {s['final_loss']:.3f})", wall
    ranks = "rank" in out.lower() and "spawn" in out.lower()
    return ("failed after ranks started: " if ranks else "refused: ") + _error_line(out), wall


def _error_line(out: str) -> str:
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith(("error", "zerotopo: error", "ConfigError"))]
    line = (errors or lines or ["no output"])[-1]
    return line.replace("|", "\\|")[:300]


def make_data(work: Path) -> str:
    docs = work / "docs.jsonl"
    text = (ROOT / "README.md").read_text().split("\n\n")
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in text * 4 if t.strip()))
    prefix = work / "data" / "bytes"
    code, out, _ = run(
        [sys.executable, "-m", "zerotopo", "data", "preprocess", "--input", str(docs), "--output-prefix",
         str(prefix), "--tokenizer-type", "ByteTokenizer", "--append-eod"],
        work, 300,
    )  # fmt: skip
    if code:
        raise SystemExit(f"preprocessing the test data failed:\n{out}")
    return f"{prefix}_text_document"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", type=Path, help="GPT-NeoX's configs/ directory")
    ap.add_argument("--no-train", action="store_true", help="parse and plan only")
    ap.add_argument("--only", nargs="*", default=None, help="config names (as in the table) to run")
    a = ap.parse_args()
    rows = ["| config | with | parse, plan (Frontier, 48 nodes) | 8 ranks, shrunk with --set | wall s |",
            "| --- | --- | --- | --- | --- |"]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="neox-configs-") as tmp:
        work = Path(tmp)
        data = None if a.no_train else make_data(work)
        seen: dict[str, str] = {}
        for name, files in config_sets(a.configs):
            if a.only and name not in a.only:
                continue
            cwd = Path(tempfile.mkdtemp(dir=work))
            with_ = (
                ", ".join(str(f.relative_to(a.configs)) for f in files if f.name != Path(name).name) or "—"
            )
            why = parse(files)
            planned = plan(files, cwd) if why is None else f"refused: {why}"
            trained, wall = ("—", 0.0)
            if not a.no_train:
                mine = resolved(files, data)
                same = json.dumps(mine, sort_keys=True, default=str) if mine is not None else None
                if same is not None and same in seen:
                    trained = (
                        f"as `{seen[same]}` (the same model, precision, batch and plan after shrinking; "
                        "other hyperparameter values or paths)"
                    )
                else:
                    trained, wall = train(files, cwd, data)
                    if same is not None and trained.startswith("trained"):
                        seen[same] = name
            row = f"| `{name}` | {with_} | {planned} | {trained} | {wall:.0f} |"
            rows.append(row.replace(f"{a.configs.resolve()}/", "").replace(f"{a.configs}/", ""))
            print(rows[-1], file=sys.stderr, flush=True)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
