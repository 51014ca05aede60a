"""Count the calls that make the host wait on the device, on any machine (CPU included).

On an accelerator a few Python-level calls block the host until the device caught up: reading a value
(``.item()``, ``.tolist()``, ``bool(t)``, ``float(t)``, ``.cpu()``, ``.numpy()``), waiting on an event
or a stream, building a tensor from Python data (a host-to-device copy from pageable memory), indexing
with a Python list (the same copy), and the object collectives and barriers of ``torch.distributed``.
:class:`HostSyncCounter` replaces those entry points with counting wrappers while it is active, so a
test can prove on CPU that a training step calls none of them (DESIGN.md rule 3); the GPU lane checks
the same with ``torch.cuda.set_sync_debug_mode("error")``, which also sees the waits inside kernels.

Only calls made on the thread that entered the counter are counted (the CPU copy engine's worker thread
is the emulated device, not the host). Every hit keeps the innermost frame of ``zerotopo`` code (or
the caller's) that made it, so a failure names the line.
"""

from __future__ import annotations

import threading
import traceback
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

_TENSOR_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")
_DIST_FUNCS = (
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "scatter_object_list",
    "barrier",
)


def _is_python_data(x: Any) -> bool:
    return not isinstance(x, torch.Tensor)


def _has_list_index(idx: Any) -> bool:
    items = idx if isinstance(idx, tuple) else (idx,)
    return any(isinstance(i, list) for i in items)


class HostSyncCounter:
    """Context manager: ``counts`` (name -> calls) and ``where`` (name -> call sites) of host syncs."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.where: dict[str, list[str]] = {}
        self._saved: list[tuple[Any, str, Any]] = []
        self._thread: int | None = None
        self._depth = threading.local()

    # -- bookkeeping ------------------------------------------------------------------------------------
    def _hit(self, name: str) -> None:
        self.counts[name] += 1
        frames = traceback.extract_stack()[:-2]  # leave out this method and the wrapper
        mine = [f for f in frames if "/zerotopo/" in f.filename.replace("\\", "/")]
        f = (mine or frames)[-1]
        self.where.setdefault(name, []).append(f"{f.filename}:{f.lineno} ({f.name})")

    def _counting(self) -> bool:
        # Nested calls (tolist calling item, say) count once: only the outermost wrapper records.
        return threading.get_ident() == self._thread and not getattr(self._depth, "n", 0)

    def _wrap(self, owner: Any, attr: str, name: str, when: Callable[..., bool] | None = None) -> None:
        original = getattr(owner, attr, None)
        if original is None:
            return
        counter = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if counter._counting() and (when is None or when(*args, **kwargs)):
                counter._hit(name)
            counter._depth.n = getattr(counter._depth, "n", 0) + 1
            try:
                return original(*args, **kwargs)
            finally:
                counter._depth.n -= 1

        self._saved.append((owner, attr, original))
        setattr(owner, attr, wrapper)

    # -- context ----------------------------------------------------------------------------------------
    def __enter__(self) -> HostSyncCounter:
        self._thread = threading.get_ident()
        for m in _TENSOR_METHODS:
            self._wrap(torch.Tensor, m, f"Tensor.{m}")
        self._wrap(
            torch.Tensor,
            "__getitem__",
            "Tensor[list]",
            when=lambda self_, idx: _has_list_index(idx),
        )
        for fn in ("tensor", "as_tensor"):
            self._wrap(
                torch, fn, f"torch.{fn}(python data)", when=lambda data, *a, **k: _is_python_data(data)
            )
        for fn in _DIST_FUNCS:
            self._wrap(dist, fn, f"dist.{fn}")
        self._wrap(torch.cuda, "synchronize", "torch.cuda.synchronize")
        self._wrap(torch.cuda.Event, "synchronize", "Event.synchronize")
        self._wrap(torch.cuda.Event, "elapsed_time", "Event.elapsed_time")
        self._wrap(torch.cuda.Stream, "synchronize", "Stream.synchronize")
        from zerotopo.engine.streams import Ready

        self._wrap(Ready, "host_wait", "Ready.host_wait")
        return self

    def __exit__(self, *exc: Any) -> None:
        for owner, attr, original in reversed(self._saved):
            setattr(owner, attr, original)
        self._saved.clear()
        self._thread = None

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def report(self) -> str:
        """One line per kind of call with its call sites (for an assertion message)."""
        if not self.counts:
            return "no host synchronization"
        lines = []
        for name, n in self.counts.most_common():
            sites = Counter(self.where.get(name, []))
            lines.append(f"{name}: {n} call(s) at " + "; ".join(f"{s} x{k}" for s, k in sites.most_common(3)))
        return "\n".join(lines)
