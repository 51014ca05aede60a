"""Hugging Face GPT-NeoX, Llama, Qwen2, Mistral and OLMo-2 directories in and out, one parameter slice at a time.

In: ``config.json`` (GPT-NeoX: transformers <5 ``rotary_pct``/``rotary_emb_base`` or >=5 ``rope_parameters``;
Llama with default or ``llama3`` rope, Qwen2, Mistral with its sliding window, and every other family of
:data:`zerotopo.placement.hf_families.HF_FAMILIES`, such as OLMo-2) becomes a
:class:`NeoXConfig` (read by the one adapter, :func:`zerotopo.models.hf_config.hf_to_neox_config`); weights come from ``model.safetensors`` or the shards an index
(``model.safetensors.index.json``) names, and each rank reads only the elements of each parameter its
optimizer chunk holds (``safe_open(...).get_slice``: a few rows, never a whole file).

Out: :func:`export_hf` writes a zerotopo checkpoint as safetensors, assembling each output file's
parameters from the DCP shards (no process ever holds more than one output file), split into
``model-0000k-of-0000N.safetensors`` with an index past ``max_shard_bytes``, with ``config.json``
(``bos``/``eos`` ids) and the run's tokenizer files.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from zerotopo.dtypes import PRECISIONS
from zerotopo.errors import ZerotopoError
from zerotopo.fsutil import read_json_object
from zerotopo.models.config import NeoXConfig
from zerotopo.models.hf_config import HF_ROPE_TYPES as HF_ROPE_TYPES
from zerotopo.models.hf_config import hf_family, shown
from zerotopo.models.hf_config import hf_to_neox_config as hf_to_neox_config
from zerotopo.placement.architecture import Architecture
from zerotopo.placement.hf_families import HF_FAMILIES

INDEX_FILE = "model.safetensors.index.json"
DEFAULT_SHARD_BYTES = 5 * 10**9  # transformers' default max_shard_size, "5GB"
# NeoX YAML key, NeoXConfig field, Hugging Face name (for messages)
ARCH_KEYS = [
    ("num_layers", "num_layers", "num_hidden_layers"),
    ("hidden_size", "hidden_size", "hidden_size"),
    ("num_attention_heads", "num_attention_heads", "num_attention_heads"),
    ("intermediate_size", "intermediate_size", "intermediate_size"),
    ("rotary_pct", "rotary_pct", "partial_rotary_factor / rotary_pct"),
    ("rotary_emb_base", "rotary_emb_base", "rope_theta / rotary_emb_base"),
    ("gpt_j_residual", "gpt_j_residual", "use_parallel_residual"),
    ("layernorm_epsilon", "layernorm_epsilon", "layer_norm_eps"),
    ("use_bias_in_attn_linear", "use_bias_in_attn_linear", "attention_bias"),
    ("bias_gelu_fusion", "gelu_approximate", "hidden_act"),
    ("no_weight_tying", "tie_embeddings", "tie_word_embeddings"),
    ("norm", "norm", "model_type (llama: rmsnorm)"),
    ("rms_norm_epsilon", "rms_norm_epsilon", "rms_norm_eps"),
    ("use_bias_in_norms", "use_bias_in_norms", "model_type (llama: none)"),
    ("use_bias_in_mlp", "use_bias_in_mlp", "mlp_bias"),
    ("num_kv_heads", "kv_heads", "num_key_value_heads"),
    ("mlp_type", "gated_mlp", "model_type (llama: gated)"),
    ("activation", "activation", "hidden_act"),
]
ARCH_KEYS += [
    (f.metadata["neox_key"], f.name, f.metadata["hf"])
    for f in Architecture.switches()
    if f.metadata["neox_key"] and f.name not in {field for _, field, _ in ARCH_KEYS}
]
HF_MODEL_TYPES = tuple(HF_FAMILIES)


# -- config -------------------------------------------------------------------------------------------


def read_hf_config(directory: str | os.PathLike) -> dict[str, Any]:
    """The ``config.json`` of a Hugging Face directory, of a ``model_type`` zerotopo reads."""
    path = Path(directory) / "config.json"
    raw = read_json_object(
        path, "a Hugging Face model directory needs its config.json", "give the directory of a GPT-NeoX model"
    )
    hf_family(raw, str(path))
    return raw


def merge_hf_config(directory: str | os.PathLike, args, run_cfg: NeoXConfig) -> NeoXConfig:
    """The run's model from a Hugging Face directory: its architecture, with the run's own training
    settings (init, activation checkpointing). A key the run's config sets explicitly to another value
    is refused, naming both; the tokenizer's vocabulary must fit the model's embedding."""
    path = Path(directory) / "config.json"
    hf = hf_to_neox_config(read_hf_config(directory), source=str(path))
    sources = getattr(args, "sources", {}) or {}
    diffs = []
    for key, field, hf_name in ARCH_KEYS:
        ours, theirs = getattr(run_cfg, field), getattr(hf, field)
        if field == "intermediate_size":
            ours, theirs = run_cfg.ffn_size, hf.ffn_size
        if key in sources and ours != theirs:
            shown_ours, shown_theirs = shown(key, ours), shown(key, theirs)
            diffs.append(
                f"{key}: {shown_ours!r} in {sources[key]}, the model has {hf_name} = {shown_theirs!r}"
            )
    if diffs:
        raise ZerotopoError(
            f"{directory} is another architecture than the config asks for: {'; '.join(diffs)}; remove "
            "those keys from the config (the model's config.json decides) or load a matching model"
        )
    seq = getattr(args, "seq_length", None)
    if hf.sliding_window is not None and isinstance(seq, int) and hf.sliding_window >= seq:
        from zerotopo.logs import get_logger

        get_logger("train").info(
            f"{path}: sliding_window {hf.sliding_window} >= seq_length {seq}: every position attends to "
            "every earlier one, as full causal attention does (the window is kept for export)"
        )
    merged = asdict(hf)
    for keep in ("init_method", "output_layer_init_method", "checkpoint_activations"):
        merged[keep] = getattr(run_cfg, keep)
    return NeoXConfig(**merged)


# -- weights in ---------------------------------------------------------------------------------------


class HFWeights:
    """Tensor names and shapes of a Hugging Face directory's safetensors files, read lazily by slice."""

    def __init__(self, directory: str | os.PathLike) -> None:
        from safetensors import safe_open

        self.directory = Path(directory)
        index = self.directory / INDEX_FILE
        files: list[str]
        self.where: dict[str, str] = {}
        if index.is_file():
            try:
                raw = json.loads(index.read_bytes().decode("utf-8"))
                weight_map = raw["weight_map"]
                assert isinstance(weight_map, dict)
            except Exception:  # noqa: BLE001
                raise ZerotopoError(
                    f'{index}: not a safetensors index (needs a "weight_map" object)'
                ) from None
            for name, f in weight_map.items():
                if not isinstance(f, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+\.safetensors", f):
                    raise ZerotopoError(
                        f"{index}: {name!r} maps to {str(f)[:60]!r}, not a .safetensors file here"
                    )
            files = sorted(set(weight_map.values()))
        else:
            files = sorted(p.name for p in self.directory.glob("*.safetensors"))
            if not files:
                raise ZerotopoError(f"{self.directory} holds no .safetensors file and no {INDEX_FILE}")
        self.shapes: dict[str, tuple[int, ...]] = {}
        self._handles: dict[str, Any] = {}
        for f in files:
            p = self.directory / f
            if not p.is_file():
                raise ZerotopoError(f"{p} is missing (named by {INDEX_FILE})")
            try:
                h = safe_open(os.fspath(p), framework="pt")
                keys = list(h.keys())
                shapes = {k: tuple(h.get_slice(k).get_shape()) for k in keys}
            except Exception as exc:  # noqa: BLE001 - the Rust reader raises its own error types
                raise ZerotopoError(f"{p}: not a readable safetensors file ({str(exc)[:160]})") from None
            self._handles[f] = h
            for k in keys:
                if k in self.where:
                    raise ZerotopoError(f"{p}: tensor {k!r} is also in {self.where[k]}")
                self.where[k] = f
                self.shapes[k] = shapes[k]
        if index.is_file():
            for name, f in weight_map.items():
                if self.where.get(name) != f:
                    raise ZerotopoError(
                        f"{self.directory / f}: has no tensor {name!r}, which {INDEX_FILE} puts there"
                    )

    def read_param_flat(self, cfg: NeoXConfig, name: str, shape: Any, start: int, stop: int) -> torch.Tensor:
        """Elements ``[start, stop)`` of zerotopo parameter ``name`` (of ``shape``) flattened, as fp32, read
        from the Hugging Face tensors it is made of (see :func:`zerotopo.models.hf.hf_segments`)."""
        from zerotopo.models.hf import hf_segments

        shape = tuple(int(x) for x in shape)
        row = 1
        for x in shape[1:]:
            row *= x
        out, at = [], 0  # at: the first element of the current segment in the parameter
        for hf, row0, rows in hf_segments(cfg, name, shape[0]):
            lo, hi = max(start, at), min(stop, at + rows * row)
            if lo < hi:
                out.append(self.read_flat(hf, row0 * row + lo - at, row0 * row + hi - at))
            at += rows * row
        return torch.cat(out) if out else torch.empty(0)

    def read_flat(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Elements ``[start, stop)`` of tensor ``name`` flattened, as fp32, reading only the rows
        that hold them."""
        sl = self._handles[self.where[name]].get_slice(name)
        shape = self.shapes[name]
        if len(shape) <= 1:
            return sl[start:stop].to(torch.float32).reshape(-1)
        row = 1
        for s in shape[1:]:
            row *= s
        r0, r1 = start // row, -(-stop // row)
        rows = sl[r0:r1].to(torch.float32).reshape(-1)
        return rows[start - r0 * row : stop - r0 * row]


def check_hf_directory(directory: str | os.PathLike, cfg: NeoXConfig) -> HFWeights:
    """Every tensor of ``cfg``'s model is in the directory with its shape, and nothing else but HF's
    buffers; returns the opened weights."""
    from zerotopo.checkpoint.store import parameter_shapes
    from zerotopo.models.hf import IGNORABLE, hf_shapes, is_llama

    weights = HFWeights(directory)
    shapes = parameter_shapes(cfg)
    if cfg.tie_embeddings:
        shapes.pop("head.embed_out.weight", None)
    want = hf_shapes(cfg, shapes)
    missing = sorted(set(want) - set(weights.shapes))
    extra = sorted(k for k in weights.shapes if k not in want and not k.endswith(IGNORABLE))
    if missing or extra:
        raise ZerotopoError(
            f"{directory} does not hold this {'Llama' if is_llama(cfg) else 'GPT-NeoX'} model: missing {missing[:4]}, unexpected {extra[:4]}; "
            "check num_layers, tied embeddings, biases and key/value heads against its config.json"
        )
    for k, shape in want.items():
        if weights.shapes[k] != shape:
            raise ZerotopoError(
                f"{directory / weights.where[k]}: {k} has shape {weights.shapes[k]}, the model needs {shape}"
            )
    return weights


def load_hf_shards(directory: str | os.PathLike, model, optimizer, cfg: NeoXConfig) -> None:
    """Collective: fill the optimizer's fp32 master chunks from a Hugging Face directory, each rank reading
    only its own elements of each parameter, then rebuild the parameter shards (moments start at zero)."""
    from zerotopo.checkpoint.store import _pieces, settle_optimizer

    weights = check_hf_directory(directory, cfg)
    with torch.no_grad():
        for i, u in enumerate(model.units):
            for s, off, view in _pieces(u, optimizer.master[i]):
                view.copy_(weights.read_param_flat(cfg, s.name, s.shape, off, off + view.numel()))
    settle_optimizer(model, optimizer, step=0, zero_moments=True)


# -- weights out --------------------------------------------------------------------------------------


_OUT_DTYPES = PRECISIONS


def export_hf(
    checkpoint: str | os.PathLike,
    out: str | os.PathLike,
    *,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    dtype: str = "fp32",
) -> list[Path]:
    """Write a zerotopo checkpoint as a Hugging Face ``GPTNeoXForCausalLM`` or ``LlamaForCausalLM`` directory
    (see :func:`zerotopo.models.hf.export_architecture`); returns the files written.

    Parameters are read from the DCP shards one output file at a time; ``out`` must not exist or be
    empty (nothing is overwritten), and appears complete or not at all (written next to it, renamed)."""
    from zerotopo.checkpoint.store import check_compatible, find_checkpoint, open_checkpoint
    from zerotopo.models.hf import export_architecture

    if dtype not in _OUT_DTYPES:
        raise ZerotopoError(f"dtype {dtype!r}: expected one of {', '.join(_OUT_DTYPES)}")
    step_dir = find_checkpoint(checkpoint)
    if step_dir is None:
        raise ZerotopoError(
            f"no checkpoint at {checkpoint}: expected a step directory or a save: directory with latest"
        )
    ckpt = open_checkpoint(step_dir)
    cfg = ckpt.manifest["config"]
    check_compatible(ckpt, cfg)
    export_architecture(cfg)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ZerotopoError(
            f"{out} exists and is not empty; export into a new directory (nothing is overwritten)"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    torch_dtype = _OUT_DTYPES[dtype]
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        _write_weights(step_dir, tmp, cfg, ckpt.manifest["parameters"], torch_dtype, max_shard_bytes)
        tok = ckpt.manifest.get("tokenizer") or {}
        config = _export_config(step_dir, cfg, tok, torch_dtype)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        _write_tokenizer(step_dir, tmp, tok, config)
        if out.exists():
            out.rmdir()
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sorted(out.iterdir())


def _shard_groups(shapes: dict[str, list[int]], itemsize: int, max_shard_bytes: int) -> list[list[str]]:
    """Parameter names in their order, cut into files of at most ``max_shard_bytes`` (a larger tensor
    gets a file of its own)."""
    groups: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        nbytes = itemsize * int(torch.Size(shape).numel())
        if groups[-1] and size + nbytes > max_shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    return groups


def _write_weights(
    step_dir: Path,
    tmp: Path,
    cfg: NeoXConfig,
    shapes: dict[str, list[int]],
    torch_dtype: torch.dtype,
    max_shard_bytes: int,
) -> None:
    """The weights as Hugging Face safetensors files in ``tmp`` (with the index when there are several),
    read from the checkpoint one output file at a time."""
    from safetensors.torch import save_file

    from zerotopo.checkpoint.store import read_tensors
    from zerotopo.models.hf import split_to_hf

    groups = _shard_groups(shapes, torch.empty((), dtype=torch_dtype).element_size(), max_shard_bytes)
    weight_map: dict[str, str] = {}
    total = 0
    n = len(groups)
    for k, names in enumerate(groups):
        fname = "model.safetensors" if n == 1 else f"model-{k + 1:05d}-of-{n:05d}.safetensors"
        flat = read_tensors(step_dir, {f"param/{m}": (torch.Size(shapes[m]).numel(),) for m in names})
        tensors = {}
        for m in names:
            full = flat.pop(f"param/{m}").reshape(shapes[m]).to(torch_dtype)
            for hf, t in split_to_hf(cfg, m, full).items():
                tensors[hf] = t.contiguous()
                weight_map[hf] = fname
                total += t.numel() * t.element_size()
        save_file(tensors, os.fspath(tmp / fname), metadata={"format": "pt"})
        del tensors
    if n > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (tmp / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


def _export_config(step_dir: Path, cfg: NeoXConfig, tok: dict[str, Any], torch_dtype: torch.dtype) -> dict:
    """The exported ``config.json``: the architecture, the saved (or tokenizer's) special token ids, and
    the weights' dtype."""
    from zerotopo.models.hf import hf_config_dict

    config = hf_config_dict(cfg)
    saved_cfg = step_dir / "config.json"
    if saved_cfg.is_file():
        try:
            saved = json.loads(saved_cfg.read_text())
            for key in ("bos_token_id", "eos_token_id"):
                if type(saved.get(key)) is int:
                    config[key] = saved[key]
        except (UnicodeDecodeError, json.JSONDecodeError):
            pass
    if type(tok.get("eod")) is int:
        config["bos_token_id"] = config["eos_token_id"] = tok["eod"]
    config["torch_dtype"] = str(torch_dtype).removeprefix("torch.")
    return config


def _spm_piece(path: Path, token_id: Any) -> str | None:
    """The piece of ``token_id`` in a SentencePiece model (None when it cannot be read)."""
    try:
        import sentencepiece

        return sentencepiece.SentencePieceProcessor(model_file=os.fspath(path)).id_to_piece(int(token_id))
    except Exception:  # noqa: BLE001 - the token name is a convenience
        return None


def _write_tokenizer(step_dir: Path, out: Path, tok: dict[str, Any], config: dict[str, Any]) -> None:
    """Copy the run's tokenizer files and describe them for ``AutoTokenizer``."""
    files = [
        f for f in tok.get("files") or [] if isinstance(f, str) and "/" not in f and (step_dir / f).is_file()
    ]
    if not files:
        return
    for f in files:
        if (step_dir / f).is_symlink():  # only the checkpoint's own regular files are published
            raise ZerotopoError(
                f"{step_dir / f} is a symbolic link; export-hf copies only regular files from inside the "
                "checkpoint (copy the tokenizer file there instead of linking it)"
            )
        shutil.copyfile(step_dir / f, out / f)
    eos = None
    if "eos_token_id" in config:
        eos_id = config["eos_token_id"]
        try:
            if tok.get("type") == "HFTokenizer" and files:
                from tokenizers import Tokenizer

                eos = Tokenizer.from_file(os.fspath(out / files[0])).id_to_token(eos_id)
        except Exception:  # noqa: BLE001 - the token name is a convenience
            eos = None
    tc: dict[str, Any] = {"model_max_length": config.get("max_position_embeddings")}
    if tok.get("type") == "HFTokenizer" and files:
        if files[0] != "tokenizer.json":
            shutil.copyfile(out / files[0], out / "tokenizer.json")
        tc["tokenizer_class"] = "PreTrainedTokenizerFast"
    elif tok.get("type") == "GPT2BPETokenizer" and len(files) == 2:
        vocab = next((f for f in files if f.endswith(".json")), files[0])
        merges = next(f for f in files if f != vocab)
        for src, dst in ((vocab, "vocab.json"), (merges, "merges.txt")):
            if src != dst:
                shutil.copyfile(out / src, out / dst)
        tc["tokenizer_class"] = "GPT2Tokenizer"
    elif tok.get("type") == "SPMTokenizer" and len(files) == 1:
        if files[0] != "tokenizer.model":
            shutil.copyfile(out / files[0], out / "tokenizer.model")
        tc["tokenizer_class"] = "LlamaTokenizer"
        eos = eos or _spm_piece(out / "tokenizer.model", config.get("eos_token_id"))
    if eos:
        tc["eos_token"] = tc["bos_token"] = eos
    (out / "tokenizer_config.json").write_text(json.dumps(tc, indent=2) + "\n")
