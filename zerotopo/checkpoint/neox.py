"""GPT-NeoX (DeepSpeed pipeline) checkpoints as initial weights.

NeoX saves ``SAVE/global_stepN/`` with ``SAVE/latest`` naming it. With pipeline parallelism (NeoX's
default, also for ``pipe_parallel_size: 1``) DeepSpeed writes one file per layer that has parameters,
``layer_XX-model_YY-model_states.pt`` (XX the pipeline layer, YY the model-parallel rank): the embedding
is layer 00 (``word_embeddings.weight``), layer 01 is a function without parameters, the transformer layers
are 02 .. num_layers+1 (``attention.query_key_value.weight``, ``mlp.dense_h_to_4h.weight``, ...), then a
function, the final norm (``norm.weight``) and the output head (``final_linear.weight``, absent with tied
embeddings). With ``norm: rmsnorm`` GPT-NeoX's RMSNorm names its gain ``scale`` (and a bias, where it has
one, ``offset``): ``input_layernorm.scale``, ``norm.scale``, read as zerotopo's ``weight`` and ``bias``. ``mp_rank_00_model_states.pt`` holds DeepSpeed's bookkeeping; without pipeline parallelism
(``pipe_parallel_size: 0``) its ``module`` entry holds every weight as ``sequential.XX.<name>``.

Every file is read with ``torch.load(weights_only=True)``: tensors and plain containers only, so no pickled
object ever runs. Only model-parallel size 1 is read (one file per layer). The query-key-value layout of
NeoX (per head: q, k, v) is the one zerotopo's model and Hugging Face's GPT-NeoX use, so weights copy
over by name.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from zerotopo.errors import ZerotopoError
from zerotopo.placement.architecture import from_neox

GLOBAL_STEP = re.compile(r"global_step(\d+)")
LAYER_FILE = re.compile(r"layer_(\d+)-model_(\d+)-model_states\.pt")
MP_FILE = re.compile(r"mp_rank_(\d+)_model_states\.pt")
_IGNORED_SUFFIXES = (".inv_freq", ".attention.bias", ".attention.masked_bias", "._extra_state")
#: GPT-NeoX's RMSNorm parameters (megatron/model/norms.py) under the names of zerotopo's norms.
_RMSNORM_NAMES = {"scale": "weight", "offset": "bias"}


def neox_step_dir(path: str | os.PathLike) -> Path | None:
    """The ``global_stepN`` directory ``path`` means (itself, or the one its ``latest`` names), or None
    when ``path`` is not a GPT-NeoX checkpoint."""
    path = Path(path)
    if not path.is_dir():
        return None
    if GLOBAL_STEP.fullmatch(path.name) and _has_model_files(path):
        return path
    latest = path / "latest"
    if latest.is_file():
        name = latest.read_bytes()[:200].decode("utf-8", "replace").strip()
        if GLOBAL_STEP.fullmatch(name):
            target = path / name
            if not _has_model_files(target):
                raise ZerotopoError(
                    f"{latest} names {name}, but {target} holds no layer_XX-model_00-model_states.pt or "
                    "mp_rank_00_model_states.pt; point load: at a complete GPT-NeoX checkpoint"
                )
            return target
    return None


def _has_model_files(step_dir: Path) -> bool:
    return step_dir.is_dir() and any(
        LAYER_FILE.fullmatch(p.name) or MP_FILE.fullmatch(p.name) for p in step_dir.iterdir()
    )


def _load(path: Path) -> object:
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is one clear error naming it
        raise ZerotopoError(
            f"{path}: not readable as a weights-only torch file ({type(exc).__name__}: {str(exc)[:200]}); "
            "zerotopo reads tensors only and never runs pickled objects"
        ) from None


def _state_dict(obj: object, path: Path) -> dict[str, torch.Tensor]:
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ZerotopoError(f"{path}: expected a state dict of tensors (a DeepSpeed layer file)")
    return {str(k): v for k, v in obj.items()}


def read_layers(step_dir: Path) -> dict[int, dict[str, torch.Tensor]]:
    """``{pipeline layer: {parameter name: tensor}}`` of a ``global_stepN`` directory (model-parallel 1)."""
    files = {p.name: p for p in step_dir.iterdir()}
    mp = sorted({int(m.group(2)) for n in files if (m := LAYER_FILE.fullmatch(n))})
    mp += [int(m.group(1)) for n in files if (m := MP_FILE.fullmatch(n))]
    if any(r > 0 for r in mp):
        raise ZerotopoError(
            f"{step_dir} was written with model-parallel size {max(mp) + 1}; zerotopo reads model-parallel "
            "size 1 (merge the tensor-parallel shards first, e.g. with NeoX's tools/ckpts scripts)"
        )
    layers: dict[int, dict[str, torch.Tensor]] = {}
    for name, path in sorted(files.items()):
        m = LAYER_FILE.fullmatch(name)
        if m:
            layers[int(m.group(1))] = _state_dict(_load(path), path)
    if not layers and "mp_rank_00_model_states.pt" in files:
        path = files["mp_rank_00_model_states.pt"]
        states = _load(path)
        module = states.get("module") if isinstance(states, dict) else None
        for key, tensor in _state_dict(module or {}, path).items():
            m = re.fullmatch(r"sequential\.(\d+)\.(.+)", key)
            if m:
                layers.setdefault(int(m.group(1)), {})[m.group(2)] = tensor
    if not layers:
        raise ZerotopoError(f"{step_dir}: no weights found (no layer_XX-model_00-model_states.pt files)")
    return layers


def rmsnorm_key(name: str) -> str | None:
    """The name zerotopo's norm gives the parameter ``name`` of a GPT-NeoX RMSNorm (``scale`` ->
    ``weight``, ``offset`` -> ``bias``), or None when ``name`` is not one."""
    module, _, leaf = name.rpartition(".")
    if leaf in _RMSNORM_NAMES and module.rpartition(".")[2].endswith("norm"):
        return f"{module}.{_RMSNORM_NAMES[leaf]}"
    return None


def to_zerotopo_names(layers: dict[int, dict[str, torch.Tensor]], num_layers: int) -> dict[str, torch.Tensor]:
    """NeoX pipeline-layer names to zerotopo's parameter names (the description's
    :func:`~zerotopo.placement.architecture.from_neox`, with an RMSNorm's parameters renamed by
    :func:`rmsnorm_key`; see the module docstring)."""
    out: dict[str, torch.Tensor] = {}
    for idx, params in layers.items():
        for name, t in params.items():
            if name.endswith(_IGNORED_SUFFIXES):
                continue
            zerotopo = from_neox(idx, rmsnorm_key(name) or name, num_layers)
            if zerotopo is not None:
                out[zerotopo] = t
            else:
                raise ZerotopoError(
                    f"pipeline layer {idx:02d} holds {name!r}, which a {num_layers}-layer GPT-NeoX model "
                    "does not have; check num_layers against the checkpoint's config"
                )
    return out


def check_neox_checkpoint(step_dir: Path, cfg) -> dict[str, torch.Tensor]:
    """The checkpoint's weights under zerotopo's names, checked against ``cfg``'s parameters (every one
    present, shapes equal); a ZerotopoError naming the first difference otherwise."""
    from zerotopo.checkpoint.store import parameter_shapes

    layers = read_layers(step_dir)
    rms = [f"{name} (pipeline layer {i:02d})" for i, ps in layers.items() for name in ps if rmsnorm_key(name)]
    if rms and cfg.norm != "rmsnorm":
        raise ZerotopoError(
            f"{step_dir} holds {rms[0]}, a parameter of GPT-NeoX's RMSNorm, but the config's model has norm: "
            f"{cfg.norm}; set norm: rmsnorm (and rms_norm_epsilon) as the checkpoint's run did"
        )
    weights = to_zerotopo_names(layers, cfg.num_layers)
    shapes = parameter_shapes(cfg)
    if cfg.tie_embeddings:
        weights.pop("head.embed_out.weight", None)
    missing = [
        n for n in shapes if n not in weights and not (cfg.tie_embeddings and n == "head.embed_out.weight")
    ]
    if missing:
        hint = ""
        if rms and all(n.endswith("norm.bias") for n in missing):
            hint = " (GPT-NeoX builds its RMSNorm without a bias: set use_bias_in_norms: false)"
        raise ZerotopoError(
            f"{step_dir} has no weights for {', '.join(missing[:4])}; the config's model (num_layers "
            f"{cfg.num_layers}, biases, weight tying) must match the checkpoint's{hint}"
        )
    extra = sorted(set(weights) - set(shapes))
    if extra:
        raise ZerotopoError(
            f"{step_dir} holds {', '.join(extra[:4])}, which the config's model does not have"
        )
    for name, shape in shapes.items():
        if name in weights and list(weights[name].shape) != shape:
            raise ZerotopoError(
                f"{step_dir}: {name} has shape {list(weights[name].shape)}, the config's model {shape}; set "
                "the model keys (hidden_size, num_layers, vocabulary and its padding) as the checkpoint's run"
            )
    return weights


def load_neox_weights(step_dir: Path, model, optimizer, cfg) -> None:
    """Collective: the weights of a ``global_stepN`` directory into a wrapped model (weights only: moments
    zero, step 0), each rank copying only its own elements."""
    from zerotopo.checkpoint.store import _pieces, settle_optimizer

    weights = check_neox_checkpoint(step_dir, cfg)
    with torch.no_grad():
        for i, u in enumerate(model.units):
            for s, off, view in _pieces(u, optimizer.master[i]):
                name = s.name if s.name in weights else "embed_in.weight"  # tied head reads the embedding
                flat = weights[name].reshape(-1)
                view.copy_(flat[off : off + view.numel()].to(view.dtype))
    settle_optimizer(model, optimizer, step=0, zero_moments=True)
