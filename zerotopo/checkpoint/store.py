"""Sharded checkpoints through ``torch.distributed.checkpoint``: each rank writes only its own shards.

Layout of ``<save>/step_<N>/``:

- ``__<rank>_0.distcp``: the tensors each rank wrote, and ``dcp_metadata.json``, DCP's description of
  them (JSON, see :mod:`zerotopo.checkpoint.dcpio`). Stored per parameter, as 1-D tensors of its flattened
  elements cut into the pieces the writing ranks held (see [Note: flat shards in DCP]):
  ``param/<name>`` (the fp32 master weights), ``<state>/<name>`` for each per-element state of the
  optimizer (AdamW's and Adam's ``exp_avg/`` and ``exp_avg_sq/``, SGD's ``momentum_buffer/``, ...; see
  :mod:`zerotopo.config.optimizers`), ``scaler/<key>`` (the fp16 loss scaler) and ``rng/<rank>/torch``
  (each rank's RNG state).
- ``checkpoint.json``: step, samples consumed, optimizer step count, the optimizer (``{"type", "states",
  "scalars"}``: its type, per-element state names and scalar states such as NAdam's ``mu_product``;
  absent in checkpoints of AdamW written before it was recorded), the model config and every parameter's
  shape, the world size and plan that wrote it, the tokenizer.
- ``config.json`` (Hugging Face's, for ``zerotopo export-hf``) and the run's tokenizer files.

What is saved is the state of the components registered with a
:class:`~zerotopo.checkpoint.components.Checkpointer` (:func:`standard_checkpointer` makes a run's set; see
[Note: checkpoint components]); the manifest's ``components`` entry records the key prefixes of each
component's tensors (absent in checkpoints written before it was recorded, which load as before).

[Note: atomic save] Ranks write into ``<save>/.step_<N>.tmp-<random>``; once every rank has finished
(DCP's final gather), rank 0 writes ``checkpoint.json``, renames the directory to ``step_<N>`` and then
replaces ``<save>/latest`` atomically (a new file renamed over the old one). A run killed at any moment
leaves ``latest`` naming the previous complete checkpoint; partial directories are hidden names that
are never loaded and are removed by the next save.

Loading reshards: a run with another plan or world size asks DCP for the pieces its own layout holds,
and DCP reads the overlaps from whichever files hold them. Only the RNG states need the same world size
(otherwise every rank reseeds from the config seed and the step, with a notice).
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shutil
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from zerotopo.checkpoint.retention import STEP_DIR, step_dir_name
from zerotopo.errors import EXIT_FAILURE, ZerotopoError, short
from zerotopo.fsutil import _umask, read_json_object, write_text_atomic
from zerotopo.models.neox import NeoXConfig

MANIFEST = "checkpoint.json"
FORMAT = "zerotopo-checkpoint"
VERSION = 1
# Model config fields that do not change the parameters or the function the model computes.
_NOT_ARCHITECTURE = {"init_method", "output_layer_init_method", "init_std", "checkpoint_activations"}


class NonFiniteError(ZerotopoError):
    """A loss, gradient or optimizer state went NaN or Inf; nothing was saved from it."""

    exit_code = EXIT_FAILURE


@dataclass
class ResumeState:
    """Where a loaded checkpoint leaves the run."""

    step: int
    consumed_samples: int
    source: Path


# -- what a rank stores -------------------------------------------------------------------------------


def _pieces(unit, chunk: torch.Tensor):
    """``(slot, offset in the parameter, view of chunk)`` for each parameter the optimizer chunk meets."""
    lo, hi = unit.o_range
    for s in unit.slots:
        a, b = max(lo, s.offset), min(hi, s.offset + s.numel)
        if a < b:
            yield s, a - s.offset, chunk[a - lo : b - lo]


def _shard_state(
    model, optimizer, *, weights_only: bool = False, states_only: bool = False
) -> dict[str, Any]:
    """This rank's shards as DCP entries: views of the optimizer's fp32 buffers, cut per parameter
    (``weights_only``: the master weights alone; ``states_only``: the per-element optimizer states alone)."""
    from zerotopo.checkpoint.dcpio import FlatPieces

    state: dict[str, Any] = {}
    kinds = [] if states_only else [("param", optimizer.master)]
    if not weights_only:
        kinds += list(optimizer.states.items())
    for i, u in enumerate(model.units):
        for kind, bufs in kinds:
            for s, off, view in _pieces(u, bufs[i]):
                state.setdefault(f"{kind}/{s.name}", FlatPieces(s.numel)).pieces.append((off, view))
    return state


def _scaler_tensors(scaler) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in scaler.state_dict().items():
        t = v.detach().reshape(-1).to(torch.float64).cpu() if isinstance(v, torch.Tensor) else None
        out[f"scaler/{k}"] = t if t is not None else torch.tensor([float(v)], dtype=torch.float64)
    return out


def _restore_scaler(scaler, loaded: dict[str, torch.Tensor]) -> None:
    template = scaler.state_dict()
    new: dict[str, Any] = {}
    for k, v in template.items():
        t = loaded.get(f"scaler/{k}")
        if t is None:
            new[k] = v
        elif isinstance(v, torch.Tensor):
            new[k] = t.to(dtype=v.dtype).reshape(v.shape).to(v.device)
        elif isinstance(v, bool):
            new[k] = bool(t.item())
        elif isinstance(v, int):
            new[k] = int(t.item())
        else:
            new[k] = float(t.item())
    scaler.load_state_dict(new)


def _rng_tensors(rank: int) -> dict[str, torch.Tensor]:
    out = {f"rng/{rank}/torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out[f"rng/{rank}/cuda"] = torch.cuda.get_rng_state()
    return out


def parameter_shapes(cfg: NeoXConfig) -> dict[str, list[int]]:
    """Every parameter's name and shape for ``cfg``, from a model built without storage."""
    from zerotopo.models.neox import GPTNeoX

    with torch.device("meta"):
        model = GPTNeoX(cfg)
    return {n: list(p.shape) for n, p in model.named_parameters()}


# -- save ---------------------------------------------------------------------------------------------


def previous_checkpoint(root: Path) -> str | None:
    """The step directory ``root/latest`` names when it is complete (what a failed save leaves in place)."""
    try:
        name = (Path(root) / "latest").read_bytes()[:200].decode("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return name if STEP_DIR.match(name) and (Path(root) / name / MANIFEST).is_file() else None


def _kept(root: Path) -> str:
    prev = previous_checkpoint(root)
    if prev:
        return f"the previous checkpoint is kept ({root / prev})"
    return f"there is no earlier checkpoint in {root}"


def check_finite_state(optimizer, *, step: int, root: Path) -> None:
    """Collective: refuse to save when any rank's master weights or optimizer states hold NaN or Inf."""
    bad = torch.zeros(1, dtype=torch.float64, device=optimizer.master[0].device)
    for bufs in (optimizer.master, *optimizer.states.values()):
        for t in bufs:
            bad += (~torch.isfinite(t)).sum()
    dist.all_reduce(bad)
    if bad.item():
        raise NonFiniteError(
            f"step {step}: {int(bad.item())} optimizer-state values are NaN or Inf, so no checkpoint was "
            f"written from them; {_kept(root)}. Resume from it with a lower lr or stronger clipping"
        )


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _broadcast_str(text: str, group: Any = None) -> str:
    obj = [text]
    dist.broadcast_object_list(obj, src=0 if group is None else dist.get_global_rank(group, 0), group=group)
    return obj[0]


SAVE_PHASES = ("copy", "write", "checksum", "metadata", "rename", "latest")
"""The phases of a save, in order: the shards copied off the training path (a background save only), this
rank's data file written, its pieces' checksums taken, the metadata and manifest written (rank 0), the
directory renamed into place, ``latest`` moved (see [Note: atomic save])."""


def save_phase(phase: str, step: int) -> None:
    """Called as a save of ``step`` reaches each of :data:`SAVE_PHASES`; does nothing. A fault-injection
    test replaces it to stop a rank or the job at a named phase."""


def _finalize(
    root: Path, tmp: str, final: Path, *, manifest: dict[str, Any], files: dict[str, str | Path]
) -> None:
    """Rank 0, once every rank's shards are written: the components' files (text, or a file copied) and
    the manifest, the rename, then ``latest``."""
    step = manifest["step"]
    tmp_dir = Path(tmp)
    for name, content in files.items():
        if isinstance(content, Path):
            shutil.copyfile(content, tmp_dir / name)
        else:
            write_text_atomic(tmp_dir / name, content, perms=0o666)
    write_text_atomic(tmp_dir / MANIFEST, json.dumps(manifest, indent=2) + "\n", perms=0o666)
    for f in tmp_dir.iterdir():  # every piece durable before the directory is renamed into place
        _fsync_file(f)
    _fsync_dir(tmp_dir)
    save_phase("metadata", step)
    old = None
    if final.exists():
        old = tempfile.mkdtemp(prefix=f".step_{step}.old-", dir=root)
        os.rename(final, Path(old) / final.name)
    os.rename(tmp_dir, final)
    _fsync_dir(root)
    save_phase("rename", step)
    if old:
        shutil.rmtree(old, ignore_errors=True)
    write_text_atomic(root / "latest", final.name + "\n", perms=0o666)
    _fsync_dir(root)
    save_phase("latest", step)


def _fsync_file(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@dataclass
class PendingSave:
    """A save taken at a step boundary, not yet written: what :func:`write_save` persists (see
    :meth:`zerotopo.checkpoint.components.Checkpointer.snapshot`). With ``copied`` its tensors are copies
    (training may go on); otherwise views of the live buffers. ``files``: written beside the shards by
    rank 0 (text, or a file to copy)."""

    root: Path
    step: int
    state: dict[str, Any]
    manifest: dict[str, Any]
    files: dict[str, str | Path]
    copied: bool

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data this rank writes."""
        return sum(t.numel() * t.element_size() for t in _tensors_of(self.state))


def standard_checkpointer(
    model,
    optimizer,
    *,
    consumed_samples: int = 0,
    cfg: NeoXConfig,
    plan_name: str = "",
    plan_label: str = "",
    seed: int = 0,
    tokenizer: dict[str, Any] | None = None,
    config_hash: str = "",
    lr_schedule: dict[str, Any] | None = None,
):
    """A :class:`~zerotopo.checkpoint.components.Checkpointer` of the components a training run saves:
    the model, optimizer, loss scaler and RNG (:func:`zerotopo.checkpoint.state.model_components`), the
    samples consumed (``data``), the run's seed and config hash (``run``) and the tokenizer."""
    from zerotopo.checkpoint.components import Checkpointer, Record, TokenizerFiles
    from zerotopo.checkpoint.state import model_components

    eod = (tokenizer or {}).get("eod")
    return Checkpointer(
        [
            *model_components(
                model, optimizer, cfg, plan_name=plan_name, plan_label=plan_label, seed=seed,
                lr_schedule=lr_schedule, eod=eod,
            ),
            Record("data", {"consumed_samples": consumed_samples}),
            Record("run", {"seed": seed, "config_hash": config_hash}),
            TokenizerFiles(tokenizer),
        ]
    )  # fmt: skip


def snapshot_save(
    root: Path, model, optimizer, *, step: int, copy: bool = False, **manifest: Any
) -> PendingSave:
    """Collective: the state of ``step`` to save, checked finite on every rank (:class:`NonFiniteError`
    otherwise, nothing written); ``manifest``: :func:`standard_checkpointer`'s keywords. ``copy``: the
    shards are copied off the optimizer's buffers (host memory), so the next step may change them while a
    background writer persists the copy."""
    return standard_checkpointer(model, optimizer, **manifest).snapshot(root, step=step, copy=copy)


def write_save(pending: PendingSave, group: Any = None) -> Path:
    """Collective over ``group`` (default: the whole job): every rank writes its shards of a
    :class:`PendingSave` under a hidden name, rank 0 finishes the checkpoint (manifest, rename, ``latest``)
    once every rank's pieces are durable; returns ``root/step_<step>``. Failures are one
    :class:`ZerotopoError` on every rank."""
    import torch.distributed.checkpoint as dcp

    from zerotopo.checkpoint.dcpio import FlatSavePlanner, SafeWriter

    root, step = pending.root, pending.step
    rank = dist.get_rank()
    final = root / step_dir_name(step)
    tmp = ""
    if rank == 0:
        try:
            root.mkdir(parents=True, exist_ok=True)
            for stale in [*root.glob(".step_*.tmp-*"), *root.glob(".step_*.old-*")]:
                shutil.rmtree(stale, ignore_errors=True)
            tmp = tempfile.mkdtemp(prefix=f".step_{step}.tmp-", dir=root)
            os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's 0700 would hide the checkpoint from the group
        except OSError as exc:
            tmp = f"!{root}: cannot write a checkpoint here ({exc.strerror or exc}); {_kept(root)}"
    tmp = _broadcast_str(tmp, group)
    if tmp.startswith("!"):
        raise ZerotopoError(tmp[1:])
    # What this rank writes: a failure with less than this left free is a full disk, whatever error the
    # writer raised (torch's zip writer reports a short write as "unexpected pos", not as ENOSPC).
    need = pending.nbytes
    try:
        _run_dcp(
            lambda: dcp.save(
                pending.state,
                storage_writer=SafeWriter(tmp, step=step),
                planner=FlatSavePlanner(),
                process_group=group,
            ),
            f"saving checkpoint {final}",
            space=(Path(tmp), need),
            kept=_kept(root),
        )
    except ZerotopoError:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    error = ""
    if rank == 0:
        try:
            _finalize(
                root,
                tmp,
                final,
                manifest=dict(pending.manifest),
                files=pending.files,
            )
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                error = _full_disk_message(f"saving checkpoint {final}", exc.strerror, _kept(root))
            else:
                error = f"{final}: finishing the checkpoint failed ({exc.strerror or exc}); {_kept(root)}"
    error = _broadcast_str(error, group)  # also the point where every rank knows the checkpoint is final
    if error:
        raise ZerotopoError(error)
    return final


def save_checkpoint(root: Path, model, optimizer, **manifest: Any) -> Path:
    """Collective: every rank writes its shards of ``step`` under ``root``; returns ``root/step_<step>``.

    ``manifest``: :func:`snapshot_save`'s keywords (``step`` and ``consumed_samples`` required; ``copy``
    is refused, this save is synchronous). ``tokenizer``: ``{"type", "eod", "files": [paths]}`` of the
    run's tokenizer (files are copied); ``config_hash``: the run's identity beside seed and plan (see
    :func:`check_identity`); ``lr_schedule``: the settings of the learning-rate schedule, recorded for the
    resume's check. Raises :class:`NonFiniteError` without writing anything when the optimizer state is
    not finite."""
    if manifest.get("copy"):
        raise ValueError(
            "save_checkpoint writes synchronously; use snapshot_save(copy=True) for a background save"
        )
    return write_save(snapshot_save(root, model, optimizer, **manifest))


def settle_optimizer(
    model, optimizer, *, step: int, zero_moments: bool = False, scalars: dict[str, float] | None = None
) -> None:
    """Make the optimizer take the master weights and states written into its tensors in place (by a
    checkpoint or a Hugging Face load) as its state at ``step``, with the scalar states ``scalars``;
    ``zero_moments`` starts the optimizer afresh (every state at its initial value)."""
    group = optimizer.param_groups[0]
    units = {}
    for i, u in enumerate(model.units):
        entry = {"range": u.o_range, "master": optimizer.master[i]}
        for name, bufs in optimizer.states.items():
            fresh = optimizer.spec.initial_value(name, group)
            entry[name] = torch.full_like(bufs[i], fresh) if zero_moments else bufs[i]
        units[u.name] = entry
    optimizer.load_state_dict(
        {
            "step": step,
            "optimizer": optimizer.spec.name,
            "scalars": None if zero_moments else scalars,
            "param_groups": [{k: v for k, v in group.items() if k != "params"}],
            "loss_scaler": None,
            "units": units,
        }
    )


def _first_failure(exc: BaseException) -> BaseException:
    """The first rank's own exception inside DCP's ``CheckpointException`` (which gathers them all)."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        _, err = sorted(failures.items())[0]
        return err[0] if isinstance(err, tuple) else err
    return exc


def _tensors_of(state: dict[str, Any]):
    """The tensors of a save state (a parameter's shard pieces yield each piece)."""
    for value in state.values():
        if isinstance(value, torch.Tensor):
            yield value
        for _, piece in getattr(value, "pieces", ()):
            yield piece


def _full_disk_message(what: str, strerror: str | None, kept: str) -> str:
    return (
        f"{what} failed: the disk is full ({strerror or 'no space left on the device'}); {kept} and the "
        "partial one removed; free space (keep_last_n_checkpoints bounds what a run keeps) or point save: "
        "at a larger file system"
    )


def _disk_full(path: Path, need: int) -> bool:
    """Whether the file system holding ``path`` has less room left than ``need`` bytes (or none)."""
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return False
    return free < max(need, 1 << 16)


def _run_dcp(
    fn, what: str, space: tuple[Path, int] | None = None, kept: str = "the previous checkpoint is kept"
) -> None:
    """Run a DCP save or load; any rank's failure becomes one :class:`ZerotopoError` on every rank.
    ``space``: (directory written, bytes the save needs), to name a full disk whatever error it caused."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        fn()
    except ZerotopoError:
        raise
    except (CheckpointException, Exception) as exc:  # noqa: BLE001 - CheckpointException is a BaseException
        inner = _first_failure(exc)
        if isinstance(inner, ZerotopoError):
            raise ZerotopoError(str(inner)) from None
        full = isinstance(inner, OSError) and inner.errno in (errno.ENOSPC, errno.EDQUOT)
        if full or (space is not None and _disk_full(*space)):
            strerror = inner.strerror if full else "no space left on the device"
            raise ZerotopoError(_full_disk_message(what, strerror, kept)) from None
        text = str(inner).strip().splitlines()[0][:300] if str(inner).strip() else type(inner).__name__
        if isinstance(inner, PermissionError):
            text = f"no permission to write ({inner.filename or text}); {kept}"
        raise ZerotopoError(f"{what} failed: {type(inner).__name__}: {text}") from None


# -- find and check -----------------------------------------------------------------------------------


@dataclass
class Checkpoint:
    """A complete checkpoint directory and what its manifest and DCP metadata say."""

    path: Path
    manifest: dict[str, Any]
    metadata: Any  # torch.distributed.checkpoint.metadata.Metadata

    @property
    def step(self) -> int:
        return int(self.manifest["step"])


def is_hf_directory(path: Path) -> bool:
    """A Hugging Face model directory: ``config.json`` and safetensors weights, no zerotopo manifest."""
    path = Path(path)
    return (
        path.is_dir()
        and (path / "config.json").is_file()
        and not (path / MANIFEST).exists()
        and any(path.glob("*.safetensors"))
    )


def find_checkpoint(path: str | os.PathLike) -> Path | None:
    """The step directory ``path`` means: ``path`` itself when it holds ``checkpoint.json``, else the one
    ``path/latest`` names. None when ``path`` does not exist or holds no checkpoint at all (no
    ``latest``, no ``step_<N>``); a ``latest`` naming nothing usable is an error."""
    path = Path(path)
    if not path.exists():
        return None
    if not path.is_dir():
        raise ZerotopoError(
            f"{path} is a file; load: names a checkpoint directory (the save: directory of a run)"
        )
    if (path / MANIFEST).exists():
        return path
    if STEP_DIR.match(path.name) or any(path.glob("*.distcp")):
        raise ZerotopoError(f"{path} is not a complete checkpoint (no {MANIFEST}){_old_format_hint(path)}")
    latest = path / "latest"
    if latest.exists() or latest.is_symlink():
        if not latest.is_file():
            raise ZerotopoError(f"{latest} is not a file; it should hold the name of a step directory")
        try:
            name = latest.read_bytes()[:200].decode("utf-8").strip()
        except UnicodeDecodeError:
            raise ZerotopoError(f"{latest} is not text; it should hold a name like step_100") from None
        m = re.fullmatch(r"step_(-?\d+)", name)
        if not m:
            raise ZerotopoError(
                f"{latest} names {name[:60]!r}; it should name a step directory like step_100 inside {path}"
            )
        if int(m.group(1)) < 0:
            raise ZerotopoError(f"{latest} names {name!r}, a negative step; steps count from 0")
        target = path / name
        if not (target / MANIFEST).is_file():
            have = sorted(
                p.name for p in path.iterdir() if STEP_DIR.match(p.name) and (p / MANIFEST).is_file()
            )
            hint = f"; complete checkpoints here: {', '.join(have[-3:])}" if have else ""
            raise ZerotopoError(
                f"{latest} names {name}, but {target} is not a complete checkpoint (no {MANIFEST}){hint}"
                f"{_old_format_hint(target)}; point load: at a complete checkpoint or fix {latest}"
            )
        return target
    steps = [p for p in path.iterdir() if STEP_DIR.match(p.name)]
    if steps:
        raise ZerotopoError(
            f"{path} holds {', '.join(sorted(p.name for p in steps)[:3])} but no latest file; "
            f"point load: at a step directory (e.g. {path / sorted(p.name for p in steps)[-1]})"
        )
    return None


def _old_format_hint(path: Path) -> str:
    if (path / "model.safetensors").is_file() and (path / "config.json").is_file():
        return (
            f"; it holds a Hugging Face model.safetensors (a checkpoint of an earlier zerotopo): "
            f"start from its weights with --from-hf {path}"
        )
    return ""


def _read_json(path: Path, what: str) -> dict[str, Any]:
    return read_json_object(path, what)


def _int_field(manifest: dict, key: str, path: Path) -> int:
    v = manifest.get(key)
    if type(v) is not int:
        raise ZerotopoError(f"{path}: {key!r} must be an integer, found {str(v)[:40]!r}")
    if v < 0:
        raise ZerotopoError(f"{path}: {key!r} is {v}; it cannot be negative")
    return v


def _model_config(model: dict[str, Any], mpath: Path) -> NeoXConfig:
    from dataclasses import MISSING, fields

    names = [f.name for f in fields(NeoXConfig)]
    # fields added since (norm, num_kv_heads, ...) take their defaults, which older checkpoints trained with
    missing = [f.name for f in fields(NeoXConfig) if f.name not in model and f.default is MISSING]
    extra = [k for k in model if k not in names]
    if missing or extra:
        what = f"lacks {missing[0]!r}" if missing else f"has an unknown field {str(extra[0])[:40]!r}"
        raise ZerotopoError(f"{mpath}: the model config {what}; the manifest is damaged")
    _check_model_bounds(model, mpath)
    try:
        return NeoXConfig(**model)
    except (TypeError, ValueError) as exc:
        raise ZerotopoError(f"{mpath}: bad model config ({str(exc)[:200]})") from None


#: Bounds of a checkpoint's model config, checked before anything is built from it: a damaged or hostile
#: ``checkpoint.json`` (``num_layers: 1e8``) must not make the reader build a model that exhausts memory.
MODEL_BOUNDS = {
    "vocab_size": (1, 2**24),
    "hidden_size": (1, 2**17),
    "num_layers": (1, 4096),
    "num_attention_heads": (1, 2**12),
    "intermediate_size": (1, 2**20),
    "max_position_embeddings": (1, 2**24),
    "rotary_emb_base": (1, 2**31),
}


def _check_model_bounds(model: dict[str, Any], mpath: Path) -> None:
    """Every size of the model config is an integer within :data:`MODEL_BOUNDS`, and the floats are finite."""
    for key, (lo, hi) in MODEL_BOUNDS.items():
        v = model.get(key)
        if v is None and key == "intermediate_size":
            continue
        if type(v) is not int or not lo <= v <= hi:
            raise ZerotopoError(
                f"{mpath}: the model's {key} is {short(v)}; expected an integer from {lo} to {hi} "
                "(the manifest is damaged)"
            )
    for key in ("rotary_pct", "layernorm_epsilon", "init_std"):
        v = model.get(key)
        if type(v) not in (int, float) or not math.isfinite(v):
            raise ZerotopoError(f"{mpath}: the model's {key} is {short(v)}; expected a finite number")


def _refuse_link(path: Path) -> None:
    """A checkpoint's own files are regular files inside its directory, never links out of it."""
    if path.is_symlink():
        raise ZerotopoError(
            f"{path} is a symbolic link; a checkpoint's files must be regular files inside its directory "
            "(copy the file there instead of linking it)"
        )


def open_checkpoint(step_dir: Path) -> Checkpoint:
    """Read and check ``checkpoint.json`` and the DCP metadata of a step directory; every data file the
    metadata names must exist and be long enough."""
    from zerotopo.checkpoint.dcpmeta import METADATA_FILE, read_metadata_file

    step_dir = Path(step_dir)
    mpath = step_dir / MANIFEST
    for name in (MANIFEST, METADATA_FILE):
        _refuse_link(step_dir / name)
    manifest = _read_json(mpath, "the checkpoint is incomplete (its save did not finish)")
    if manifest.get("format") != FORMAT:
        raise ZerotopoError(f'{mpath}: not a zerotopo checkpoint manifest ("format" is not {FORMAT!r})')
    if manifest.get("version") != VERSION:
        raise ZerotopoError(
            f"{mpath}: checkpoint format version {manifest.get('version')!r}, this zerotopo reads {VERSION}"
        )
    for key in ("step", "consumed_samples", "optimizer_steps", "world_size"):
        _int_field(manifest, key, mpath)
    m = STEP_DIR.match(step_dir.name)
    if m and int(m.group(1)) != manifest["step"]:
        raise ZerotopoError(f"{mpath}: step {manifest['step']} does not match its directory {step_dir.name}")
    if not isinstance(manifest.get("model"), dict) or not isinstance(manifest.get("parameters"), dict):
        raise ZerotopoError(f'{mpath}: "model" and "parameters" must be objects')
    manifest["config"] = _model_config(manifest["model"], mpath)
    manifest["optimizer"] = _optimizer_entry(manifest.get("optimizer"), mpath)
    md = read_metadata_file(step_dir)
    sizes: dict[str, int] = {}
    for info in md.storage_data.values():
        f = step_dir / info.relative_path
        if f.name not in sizes:
            _refuse_link(f)
            if not f.is_file():
                raise ZerotopoError(
                    f"{f} is missing: a shard of the checkpoint is gone (every file the metadata names is "
                    "needed, one per writing rank); restore it or load an earlier checkpoint"
                )
            sizes[f.name] = f.stat().st_size
        if info.offset + info.length > sizes[f.name]:
            raise ZerotopoError(
                f"{f} is truncated: it has {sizes[f.name]} bytes, the checkpoint needs {info.offset + info.length}; "
                "restore it or load an earlier checkpoint"
            )
    return Checkpoint(step_dir, manifest, md)


#: What a manifest without an ``optimizer`` entry holds: AdamW's moments (written before types were recorded).
_LEGACY_OPTIMIZER = {"type": "AdamW", "states": ["exp_avg", "exp_avg_sq"], "scalars": {}}


def _optimizer_entry(entry: Any, mpath: Path) -> dict[str, Any]:
    """The manifest's ``optimizer`` entry, checked: a type of the table, state names it keeps, finite
    scalars it has (see :mod:`zerotopo.config.optimizers`)."""
    from zerotopo.config.optimizers import spec_for

    if entry is None:
        return dict(_LEGACY_OPTIMIZER)
    if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
        raise ZerotopoError(f'{mpath}: "optimizer" must be an object with a "type"; the manifest is damaged')
    try:
        spec = spec_for(entry["type"])
    except ValueError as exc:
        raise ZerotopoError(f"{mpath}: optimizer type {short(entry['type'])}: {exc}") from None
    states, scalars = entry.get("states"), entry.get("scalars") or {}
    known = {n for n, _ in spec.states}
    if not isinstance(states, list) or not all(isinstance(n, str) and n in known for n in states):
        raise ZerotopoError(
            f"{mpath}: optimizer states {short(states)}: {spec.name} keeps some of {', '.join(sorted(known))}; "
            "the manifest is damaged"
        )
    names = {n for n, _ in spec.scalars}
    if not isinstance(scalars, dict) or any(
        k not in names or type(v) not in (int, float) or not math.isfinite(v) for k, v in scalars.items()
    ):
        raise ZerotopoError(
            f"{mpath}: optimizer scalars {short(scalars)} are not {spec.name}'s; the manifest is damaged"
        )
    return {"type": spec.name, "states": states, "scalars": dict(scalars)}


def saved_optimizer(ckpt: Checkpoint) -> dict[str, Any]:
    """``{"type", "states", "scalars"}`` of the optimizer that wrote ``ckpt``."""
    return ckpt.manifest["optimizer"]


def check_optimizer(ckpt: Checkpoint, name: str, states: list[str] | tuple[str, ...]) -> None:
    """The checkpoint holds the state of this run's optimizer ``name`` keeping ``states``; otherwise an
    error naming both (a weights-only load, ``finetune: true``, starts a fresh optimizer instead)."""
    from zerotopo.config.optimizers import spec_for

    saved = saved_optimizer(ckpt)
    ours = spec_for(name).name
    if saved["type"] != ours:
        raise ZerotopoError(
            f"{ckpt.path} holds the optimizer state of {saved['type']}, this run's optimizer is {ours}; "
            f"resume it with optimizer type {saved['type']}, or set finetune: true to start a fresh {ours} "
            "from its weights"
        )
    if list(saved["states"]) != list(states):
        raise ZerotopoError(
            f"{ckpt.path} holds {ours} state {', '.join(saved['states']) or '(none)'}, this run's {ours} keeps "
            f"{', '.join(states) or '(none)'} (another momentum / centered / amsgrad setting); resume with the "
            "hyperparameters it was written with, or set finetune: true to start afresh from its weights"
        )


def check_compatible(ckpt: Checkpoint, cfg: NeoXConfig) -> None:
    """The checkpoint holds exactly this model's tensors with its shapes, and its config matches."""
    from zerotopo.checkpoint.dcpmeta import TensorMeta

    mpath = ckpt.path / MANIFEST
    saved = asdict(ckpt.manifest["config"])  # fields added since the checkpoint at their defaults
    ours = asdict(cfg)
    diffs = [
        f"{k}: checkpoint {saved.get(k)!r}, this run {v!r}"
        for k, v in ours.items()
        if k not in _NOT_ARCHITECTURE and saved.get(k) != v
    ]
    if diffs:
        raise ZerotopoError(
            f"{ckpt.path} holds another model: {'; '.join(diffs[:6])}"
            f"{' ...' if len(diffs) > 6 else ''}; load it with the config it was trained with"
        )
    shapes = parameter_shapes(cfg)
    if ckpt.manifest["parameters"] != shapes:
        raise ZerotopoError(f"{mpath}: parameter shapes differ from the model's; the manifest is damaged")
    kinds = ("param", *saved_optimizer(ckpt)["states"])
    expected = {f"{kind}/{n}": math_prod(s) for n, s in shapes.items() for kind in kinds}
    stored = ckpt.metadata.state_dict_metadata
    missing = sorted(set(expected) - set(stored))
    if missing:
        raise ZerotopoError(
            f"{ckpt.path}: the checkpoint has no {missing[0]}"
            f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}; it is incomplete or of another model"
        )
    allowed = re.compile(r"^(scaler/[A-Za-z0-9_]+|rng/\d+/(torch|cuda))$")
    registered = _registered_prefixes(ckpt, {"param", "scaler", "rng", *saved_optimizer(ckpt)["states"]})
    extra = sorted(
        k
        for k in stored
        if k not in expected and not allowed.match(k) and k.split("/", 1)[0] not in registered
    )
    if extra:
        raise ZerotopoError(
            f"{ckpt.path}: unexpected tensor {extra[0]!r}{f' (and {len(extra) - 1} more)' if len(extra) > 1 else ''}; "
            "the checkpoint was not written by zerotopo for this model"
        )
    _check_small_states(ckpt, stored)
    index = {(i.fqn, tuple(i.offset or ())) for i in ckpt.metadata.storage_data}
    for key, numel in expected.items():
        md = stored[key]
        if not isinstance(md, TensorMeta) or tuple(md.size) != (numel,):
            got = tuple(md.size) if isinstance(md, TensorMeta) else "not a tensor"
            raise ZerotopoError(f"{ckpt.path}: {key} has shape {got}, this model needs ({numel},)")
        if md.properties.dtype != torch.float32:
            raise ZerotopoError(f"{ckpt.path}: {key} is {md.properties.dtype}, expected torch.float32")
        pos = 0
        for c in sorted(md.chunks, key=lambda c: c.offsets[0]):
            if c.offsets[0] != pos:
                raise ZerotopoError(
                    f"{ckpt.path}: {key}: elements {pos}..{c.offsets[0]} are in no shard (or shards overlap)"
                )
            if (key, (c.offsets[0],)) not in index:
                raise ZerotopoError(f"{ckpt.path}: {key}: the shard at {c.offsets[0]} is in no file")
            pos += c.sizes[0]
        if pos != numel:
            raise ZerotopoError(f"{ckpt.path}: {key}: shards cover {pos} of {numel} elements")


def _registered_prefixes(ckpt: Checkpoint, own: set[str]) -> set[str]:
    """The first key segments of the tensors the manifest's ``components`` entry says were saved by
    components beyond the model's, optimizer's, loss scaler's and RNG's (``own``, checked on their own);
    empty for a checkpoint written before components were recorded."""
    entry = ckpt.manifest.get("components")
    if entry is None:
        return set()
    if not isinstance(entry, dict) or not all(
        isinstance(v, list) and all(isinstance(p, str) and p for p in v) for v in entry.values()
    ):
        raise ZerotopoError(
            f'{ckpt.path / MANIFEST}: "components" must map each component to a list of key prefixes; '
            "the manifest is damaged"
        )
    return {p for prefixes in entry.values() for p in prefixes} - own


def _check_small_states(ckpt: Checkpoint, stored: dict[str, Any]) -> None:
    """The RNG states have this torch's size and the loss scaler's entries are small float64 vectors, so a
    damaged one is refused here, before any rank starts, not inside ``torch.set_rng_state``."""
    from zerotopo.checkpoint.dcpmeta import TensorMeta

    rng_bytes = torch.get_rng_state().numel()
    for key, md in stored.items():
        if not key.startswith(("rng/", "scaler/")):
            continue
        size = tuple(md.size) if isinstance(md, TensorMeta) else None
        dtype = md.properties.dtype if isinstance(md, TensorMeta) else None
        if key.endswith("/torch"):
            want, want_dtype = (rng_bytes,), torch.uint8
        elif key.startswith("rng/"):
            want, want_dtype = size, torch.uint8  # a CUDA generator's size depends on the device
        else:
            want, want_dtype = size if size and 1 <= size[0] <= 16 and len(size) == 1 else (1,), torch.float64
        if size != want or dtype != want_dtype:
            raise ZerotopoError(
                f"{ckpt.path}: {key} is {dtype} of shape {size}, expected {want_dtype} of shape {want}; "
                "the checkpoint is damaged; load an earlier checkpoint"
            )


def math_prod(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def check_identity(
    ckpt: Checkpoint, *, seed: int, plan: str, config_hash: str, continues: bool
) -> str | None:
    """Compare the run that wrote ``ckpt`` (seed, plan, config hash) with this one. ``continues``: this
    run saves into the directory it resumes from, so it continues that run, and a different seed or
    config hash (data, sequence length, tokenizer, model) is an error: its checkpoints would interleave
    with the other run's. Otherwise (a branch off a checkpoint, or another plan, which reshards) the
    differences come back as a notice; None when nothing differs."""
    saved = ckpt.manifest
    diffs = []
    if type(saved.get("seed")) is int and saved["seed"] != seed:
        diffs.append(f"seed {saved['seed']} -> {seed}")
    old_hash = saved.get("config_hash")
    if isinstance(old_hash, str) and old_hash and config_hash and old_hash != config_hash:
        diffs.append(f"data/tokenizer/sequence config {old_hash} -> {config_hash}")
    hard = list(diffs)
    if isinstance(saved.get("plan"), str) and saved["plan"] and saved["plan"] != plan:
        diffs.append(f"plan {saved['plan']} -> {plan}")
    if hard and continues:
        raise ZerotopoError(
            f"{ckpt.path} was written by another run ({'; '.join(hard)}), and this run would save its "
            "checkpoints next to it in the same directory; continue that run with its own settings, or set "
            "save: to a new directory to start a run from this checkpoint"
        )
    return f"{ckpt.path} was written with other settings: {'; '.join(diffs)}" if diffs else None


def preflight_load(
    path: str | os.PathLike, cfg: NeoXConfig, optimizer: tuple[str, tuple[str, ...]] | None = None
) -> Checkpoint | None:
    """Check what ``load:`` names before any rank starts: None when it holds no checkpoint yet (the run
    starts from step 0), else the checked checkpoint; ``optimizer`` (type, per-element state names): the
    run's optimizer, which must be the one that wrote it (None: a weights-only load). Hugging Face
    directories are checked by :func:`zerotopo.models.hf_load.check_hf_directory`."""
    step_dir = find_checkpoint(path)
    if step_dir is None:
        return None
    ckpt = open_checkpoint(step_dir)
    check_compatible(ckpt, cfg)
    if optimizer is not None:
        check_optimizer(ckpt, *optimizer)
    return ckpt


@dataclass
class VerifyReport:
    """What :func:`verify_checkpoint` read."""

    path: Path
    step: int
    files: int
    pieces: int
    bytes: int
    unchecked: int
    """Pieces without a checksum (written by an earlier zerotopo): only their dtype and size were checked."""
    read_s: float = 0.0
    """Seconds spent reading and checking the pieces (the command's start-up and the metadata excluded)."""


def verify_checkpoint(path: str | os.PathLike) -> VerifyReport:
    """Check a checkpoint without training (``zerotopo ckpt verify``): the manifest, the metadata against
    the manifest's model, and every stored piece's checksum, dtype, element count and values. Raises
    :class:`ZerotopoError` naming the file at the first fault."""
    from zerotopo.checkpoint.dcpmeta import open_data_file, read_piece

    step_dir = find_checkpoint(path)
    if step_dir is None:
        raise ZerotopoError(f"{path} holds no checkpoint (no checkpoint.json, latest or step_<N>)")
    ckpt = open_checkpoint(step_dir)
    check_compatible(ckpt, ckpt.manifest["config"])
    by_file: dict[str, list] = {}
    for index, info in ckpt.metadata.storage_data.items():
        by_file.setdefault(info.relative_path, []).append((index, info))
    pieces = nbytes = unchecked = 0
    t0 = time.perf_counter()
    for name, entries in sorted(by_file.items()):
        with open_data_file(step_dir / name) as f:
            for index, info in sorted(entries, key=lambda e: e[1].offset):
                read_piece(f, step_dir / name, index, info, ckpt.metadata)
                pieces += 1
                nbytes += info.length
                unchecked += getattr(info, "checksum", None) is None
    return VerifyReport(
        step_dir, ckpt.step, len(by_file), pieces, nbytes, unchecked, time.perf_counter() - t0
    )


def read_tensors(step_dir: Path, wanted: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """Whole tensors ``{name: shape}`` from a checkpoint, in this process alone (no process group):
    each assembled from the pieces every writing rank stored."""
    import torch.distributed.checkpoint as dcp

    from zerotopo.checkpoint.dcpio import FlatLoadPlanner, SafeReader
    from zerotopo.checkpoint.dcpmeta import read_metadata_file

    stored = read_metadata_file(Path(step_dir)).state_dict_metadata
    state = {}
    for name, shape in wanted.items():
        md = stored.get(name)
        if md is None:
            raise ZerotopoError(f"{step_dir}: the checkpoint has no tensor {name!r}")
        state[name] = torch.empty(shape, dtype=md.properties.dtype)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        warnings.filterwarnings("ignore", message="Detected pickle protocol")
        _run_dcp(
            lambda: dcp.load(
                state, storage_reader=SafeReader(step_dir), planner=FlatLoadPlanner(), no_dist=True
            ),
            f"reading {step_dir}",
        )
    return state


# -- load ---------------------------------------------------------------------------------------------


def load_checkpoint(
    path: str | os.PathLike, model, optimizer, *, cfg: NeoXConfig, seed: int = 0, weights_only: bool = False
) -> ResumeState:
    """Collective: load the checkpoint ``path`` names into a wrapped model, resharding as needed.
    ``weights_only``: the master weights alone, the optimizer starts afresh at step 0 (its type may
    differ from the one that wrote the checkpoint); otherwise the optimizer must be the writer's."""
    step_dir = find_checkpoint(path)
    if step_dir is None:
        raise ZerotopoError(f"no checkpoint at {path}")
    ckpt = open_checkpoint(step_dir)
    check_compatible(ckpt, cfg)
    if not weights_only:
        check_optimizer(ckpt, optimizer.spec.name, list(optimizer.states))
    checkpointer = standard_checkpointer(model, optimizer, cfg=cfg, seed=seed)
    only = ("model", "loss_scaler", "rng") if weights_only else ("model", "optimizer", "loss_scaler", "rng")
    ckpt = checkpointer.load(step_dir, only=only)
    if weights_only:
        settle_optimizer(model, optimizer, step=0, zero_moments=True)
    return ResumeState(
        step=ckpt.step, consumed_samples=int(ckpt.manifest["consumed_samples"]), source=step_dir
    )
