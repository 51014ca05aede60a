"""A zerotopo checkpoint as files other tools read: one consolidated safetensors state dict, or a standard
torch.distributed.checkpoint directory (``.metadata`` in DCP's own format, which
``torch.distributed.checkpoint.format_utils.dcp_to_torch_save`` and ``dcp.load`` read).

Reading stays pickle-free: the checkpoint's tensors come through zerotopo's JSON metadata
(:func:`zerotopo.checkpoint.store.read_tensors`). The DCP directory written here is for other tools;
zerotopo itself never loads a pickled ``.metadata``.
"""

from __future__ import annotations

import math
import os
import shutil
import warnings
from pathlib import Path

import torch

from zerotopo.dtypes import PRECISIONS
from zerotopo.errors import ZerotopoError

DTYPES = PRECISIONS


def optimizer_kinds(checkpoint: str | os.PathLike) -> tuple[str, ...]:
    """What a DCP export with ``optimizer`` holds: ``("param", <state>, ...)``, the weights and the
    per-element states of the optimizer that wrote ``checkpoint`` (its manifest says which: AdamW's
    ``exp_avg`` and ``exp_avg_sq``, SGD's ``momentum_buffer``, ...)."""
    from zerotopo.checkpoint.store import open_checkpoint, saved_optimizer

    return ("param", *saved_optimizer(open_checkpoint(_step_dir(checkpoint)))["states"])


def _step_dir(checkpoint: str | os.PathLike) -> Path:
    from zerotopo.checkpoint.store import find_checkpoint

    step_dir = find_checkpoint(checkpoint)
    if step_dir is None:
        raise ZerotopoError(
            f"no checkpoint at {checkpoint}: expected a step directory or a save: directory with latest"
        )
    return step_dir


def _fresh_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ZerotopoError(f"{out} exists; name a new path (nothing is overwritten)")


def read_state(
    checkpoint: str | os.PathLike, *, kinds=("param",), dtype: str = "fp32"
) -> dict[str, torch.Tensor]:
    """``{name: whole tensor}`` of a checkpoint: the weights under the model's parameter names, and with
    more ``kinds`` the optimizer's states as ``<state>/<name>`` (``exp_avg/<name>``, ...)."""
    from zerotopo.checkpoint.store import check_compatible, open_checkpoint, read_tensors

    if dtype not in DTYPES:
        raise ZerotopoError(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    step_dir = _step_dir(checkpoint)
    ckpt = open_checkpoint(step_dir)
    check_compatible(ckpt, ckpt.manifest["config"])
    shapes: dict[str, list[int]] = ckpt.manifest["parameters"]
    # Stored flat (each rank's pieces of a parameter are ranges of its flat view): read flat, reshape.
    wanted = {f"{k}/{n}": (math.prod(s),) for k in kinds for n, s in shapes.items()}
    tensors = read_tensors(step_dir, wanted)
    out = {}
    for key, t in tensors.items():
        kind, name = key.split("/", 1)
        out[name if kind == "param" else key] = t.reshape(shapes[name]).to(DTYPES[dtype]).contiguous()
    return out


def export_safetensors(checkpoint: str | os.PathLike, out: str | os.PathLike, *, dtype: str = "fp32") -> Path:
    """The checkpoint's weights as one safetensors file (model parameter names, e.g.
    ``layers.0.attention.query_key_value.weight``); written beside ``out`` and renamed into place."""
    from safetensors.torch import save_file

    out = Path(out)
    _fresh_out(out)
    state = read_state(checkpoint, dtype=dtype)
    tmp = out.with_name(out.name + ".partial")
    save_file(state, str(tmp), metadata={"format": "pt", "source": str(_step_dir(checkpoint))})
    os.replace(tmp, out)
    return out


def export_dcp(
    checkpoint: str | os.PathLike, out: str | os.PathLike, *, dtype: str = "fp32", optimizer: bool = False
) -> Path:
    """The checkpoint as a standard DCP directory of whole tensors, as ``dcp.save`` writes it in one
    process; with ``optimizer`` the optimizer's per-element states too (``<state>/<name>``: AdamW's
    ``exp_avg``/``exp_avg_sq``, SGD's ``momentum_buffer``, ...). Written beside ``out`` and renamed into
    place."""
    import torch.distributed.checkpoint as dcp

    out = Path(out)
    _fresh_out(out)
    state = read_state(
        checkpoint, kinds=optimizer_kinds(checkpoint) if optimizer else ("param",), dtype=dtype
    )
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp)), no_dist=True)
    if out.exists():
        out.rmdir()
    os.replace(tmp, out)
    return out
