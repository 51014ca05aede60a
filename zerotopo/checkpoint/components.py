"""A checkpoint is the state of the components registered with a :class:`Checkpointer`.

[Note: checkpoint components] A component is any object with a ``name`` and torch's ``Stateful`` pair,
``state_dict()`` and ``load_state_dict(state)``. Its state dict maps keys to values: a tensor, or a
:class:`~zerotopo.checkpoint.dcpio.FlatPieces` (one rank's pieces of a 1-D tensor), is stored in the ranks'
shard files under that key; any other value is a JSON value of ``checkpoint.json`` under that key. Keys are
shared by every component of the set, so two components may not claim one; ``format``, ``version``, ``step``
and ``components`` are the checkpointer's own. A component may also have:

- ``load_targets(ckpt) -> dict``: the tensors a load reads into (default: the tensor entries of
  ``state_dict()``; views of live buffers are loaded in place). It is given the opened checkpoint first.
- ``files() -> dict[str, str | Path]``: files written beside the shards (text, or a file to copy).
- ``before_save(step, root)``: a collective check before anything of a save is taken (refusing NaN state).
- ``after_load()``: called once every component of the load has had its ``load_state_dict``, for work
  that needs what several of them loaded (the optimizer settles once on the loaded weights and states).

A load hands ``load_state_dict`` the keys of its ``state_dict()`` that the checkpoint holds, so a component
registered after a checkpoint was written sees its keys missing and decides itself (start fresh, or refuse).
The manifest's ``components`` entry records each component's name and the first path segment of its
tensors' keys, so ``zerotopo ckpt verify`` knows which stored tensors were written on purpose.

Adding checkpointed state is one :meth:`Checkpointer.register` call; nothing here or in
:mod:`zerotopo.checkpoint.store` changes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from zerotopo.errors import ZerotopoError


@runtime_checkable
class Component(Protocol):
    """What a :class:`Checkpointer` saves and loads (see [Note: checkpoint components])."""

    name: str

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


#: Manifest keys the checkpointer writes itself; no component may claim them.
OWN_KEYS = ("format", "version", "step", "components")
#: Names a component's file may not take (the checkpoint's own files).
RESERVED_FILES = ("checkpoint.json", "dcp_metadata.json", "latest")


def is_stored_tensor(value: Any) -> bool:
    """Whether a state-dict value goes to the shard files (else it is a JSON value of the manifest)."""
    from zerotopo.checkpoint.dcpio import FlatPieces

    return isinstance(value, (torch.Tensor, FlatPieces))


def _copied(value: Any) -> Any:
    """A host copy of a stored tensor value, which later steps do not change."""
    from zerotopo.checkpoint.dcpio import FlatPieces

    if isinstance(value, FlatPieces):
        return FlatPieces(value.numel, [(off, t.to("cpu", copy=True)) for off, t in value.pieces])
    return value.detach().to("cpu", copy=True)


class Checkpointer:
    """The registered components of a run, saved and loaded as one checkpoint.

    Components save and load in registration order. Errors name the component and the key at fault."""

    def __init__(self, components: Iterable[Any] = ()) -> None:
        self.components: dict[str, Any] = {}
        for c in components:
            self.register(c)

    def register(self, component: Any) -> Any:
        """Add ``component`` to the saved set; returns it. Raises :class:`ValueError` for a second component
        of the same name or an object without ``name``, ``state_dict`` and ``load_state_dict``."""
        if not isinstance(component, Component):
            raise ValueError(
                f"{type(component).__name__} is not a checkpoint component: it needs a name, state_dict() and "
                "load_state_dict(state) (see zerotopo.checkpoint.components)"
            )
        if component.name in self.components:
            raise ValueError(f"a checkpoint component named {component.name!r} is already registered")
        self.components[component.name] = component
        return component

    def __getitem__(self, name: str) -> Any:
        return self.components[name]

    # -- save -------------------------------------------------------------------------------------------

    def snapshot(self, root: str | os.PathLike, *, step: int, copy: bool = False):
        """Collective: every component's state at ``step`` as a
        :class:`~zerotopo.checkpoint.store.PendingSave` (nothing written yet). ``copy``: stored tensors are
        copied to host memory, so training may go on while a background writer persists them."""
        from zerotopo.checkpoint.store import FORMAT, VERSION, PendingSave, save_phase

        root = Path(root)
        for c in self.components.values():
            if hasattr(c, "before_save"):
                c.before_save(step, root)
        manifest: dict[str, Any] = {"format": FORMAT, "version": VERSION, "step": step}
        state: dict[str, Any] = {}
        files: dict[str, str | Path] = {}
        owner: dict[str, str] = {k: "the checkpointer" for k in OWN_KEYS}
        prefixes: dict[str, list[str]] = {}
        if copy:
            save_phase("copy", step)
        for name, c in self.components.items():
            mine = set()
            for key, value in c.state_dict().items():
                if key in owner:
                    raise ValueError(f"checkpoint components {owner[key]!r} and {name!r} both save {key!r}")
                owner[key] = name
                if is_stored_tensor(value):
                    state[key] = _copied(value) if copy else value
                    mine.add(key.split("/", 1)[0])
                else:
                    manifest[key] = value
            prefixes[name] = sorted(mine)
            for fname, content in (c.files() if hasattr(c, "files") else {}).items():
                if fname in RESERVED_FILES or fname in files or "/" in fname:
                    raise ValueError(f"checkpoint component {name!r} may not write a file named {fname!r}")
                files[fname] = content
        manifest["components"] = prefixes
        return PendingSave(root, step, state, manifest, files, copy)

    def save(self, root: str | os.PathLike, *, step: int) -> Path:
        """Collective: write the checkpoint of ``step`` under ``root`` now; returns ``root/step_<step>``."""
        from zerotopo.checkpoint.store import write_save

        return write_save(self.snapshot(root, step=step))

    # -- load -------------------------------------------------------------------------------------------

    def load(self, path: str | os.PathLike, *, only: Iterable[str] | None = None):
        """Collective: load the checkpoint ``path`` names (``root``, ``root/latest`` or a step directory)
        into the components named by ``only`` (default: every one), resharding as the stored pieces allow;
        returns the opened :class:`~zerotopo.checkpoint.store.Checkpoint`. The caller has checked the
        checkpoint against its model (:func:`~zerotopo.checkpoint.store.check_compatible`)."""
        import warnings

        import torch.distributed.checkpoint as dcp

        from zerotopo.checkpoint.dcpio import FlatLoadPlanner, SafeReader
        from zerotopo.checkpoint.store import _run_dcp, find_checkpoint, open_checkpoint

        step_dir = find_checkpoint(path)
        if step_dir is None:
            raise ZerotopoError(f"no checkpoint at {path}")
        ckpt = open_checkpoint(step_dir)
        wanted = self._chosen(only)
        stored = ckpt.metadata.state_dict_metadata
        targets: dict[str, Any] = {}
        plans = []
        for c in wanted:
            template = c.state_dict()
            reads = c.load_targets(ckpt) if hasattr(c, "load_targets") else template
            reads = {k: v for k, v in reads.items() if is_stored_tensor(v) and k in stored}
            targets.update(reads)
            plans.append((c, [k for k, v in template.items() if not is_stored_tensor(v)], reads))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            _run_dcp(
                lambda: dcp.load(targets, storage_reader=SafeReader(step_dir), planner=FlatLoadPlanner()),
                f"loading {step_dir}",
            )
        for c, json_keys, reads in plans:
            c.load_state_dict({**{k: ckpt.manifest[k] for k in json_keys if k in ckpt.manifest}, **reads})
        for c, _, _ in plans:
            if hasattr(c, "after_load"):
                c.after_load()
        return ckpt

    def _chosen(self, only: Iterable[str] | None) -> list[Any]:
        if only is None:
            return list(self.components.values())
        names = list(only)
        unknown = [n for n in names if n not in self.components]
        if unknown:
            raise ValueError(
                f"no checkpoint component named {unknown[0]!r}; registered: {', '.join(self.components)}"
            )
        return [c for n, c in self.components.items() if n in names]


class Record:
    """A component holding fixed JSON values (the run's seed, the samples consumed, ...): saved as they are,
    and ``loaded`` holds what a checkpoint had (a key it lacks is absent)."""

    def __init__(self, name: str, values: dict[str, Any]) -> None:
        self.name = name
        self.values = dict(values)
        self.loaded: dict[str, Any] = {}

    def state_dict(self) -> dict[str, Any]:
        return dict(self.values)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loaded = dict(state)


class TokenizerFiles:
    """The run's tokenizer: ``{"type", "eod", "files"}`` in the manifest, its files copied beside the shards
    (a file that is missing, or named like one of the checkpoint's own, is not copied)."""

    name = "tokenizer"

    def __init__(self, info: dict[str, Any] | None) -> None:
        self.info = info

    def _sources(self) -> dict[str, Path]:
        out: dict[str, Path] = {}
        for f in (self.info or {}).get("files") or []:
            if f and os.path.isfile(f) and Path(f).name not in (*RESERVED_FILES, "config.json"):
                out[Path(f).name] = Path(f)
        return out

    def files(self) -> dict[str, str | Path]:
        return dict(self._sources())

    def state_dict(self) -> dict[str, Any]:
        if not self.info:
            return {"tokenizer": None}
        entry = {"type": self.info.get("type"), "eod": self.info.get("eod"), "files": list(self._sources())}
        return {"tokenizer": entry}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore: the run builds its tokenizer from its config (the identity check compares)."""
