"""The collectives' per-mesh context: what they learn about the backend while they run."""

from __future__ import annotations

import torch


class CommContext:
    """What the collectives learn while they run, per mesh: the ``(backend, op, dtype)`` triples a
    backend refused as unsupported (dtype None: the op itself), so later calls take the fallback at
    once (see [Note: gloo fallbacks]). Every :class:`~zerotopo.comm.mesh.GroupHandle` of a mesh holds
    the mesh's context; the collectives read it from the group they are given."""

    def __init__(self) -> None:
        self.unsupported: set[tuple[str, str, torch.dtype | None]] = set()

    def assume_unsupported(self, backend: str, op: str, dtype: torch.dtype | None = None) -> None:
        """Treat ``op`` (on ``dtype``, or any dtype) as unsupported by ``backend``: its fallback runs.

        Used when a backend is known to lack an op, and by the tests to exercise the fallbacks."""
        self.unsupported.add((backend, op, dtype))

    def clear_unsupported(self) -> None:
        """Forget every op found or declared unsupported."""
        self.unsupported.clear()

    def refused(self, backend: str, op: str, dtype: torch.dtype) -> bool:
        return (backend, op, dtype) in self.unsupported or (backend, op, None) in self.unsupported
