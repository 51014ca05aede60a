"""The engine's debug and testing surface: instrumentation and test hooks kept out of the public
:func:`~zerotopo.engine.api.parallelize` signature.

::

    from zerotopo.engine import debug

    ledger = Ledger()
    model = debug.parallelize(module, mesh=mesh, options=debug.DebugOptions(ledger=ledger, sanitize=True))
    optimizer = ShardedOptimizer(model, torch.optim.AdamW, lr=1e-3)  # records into the same ledger

Gloo ops the backend is to be treated as lacking (to exercise the fallbacks of
:mod:`zerotopo.comm.collectives`) are declared on the mesh's collective context:
:func:`assume_unsupported`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from zerotopo.comm.mesh import Mesh
from zerotopo.engine.api import MixedPrecision, shard_module


@dataclass(frozen=True)
class DebugOptions:
    """Instrumentation and test hooks of one parallelized model.

    ``ledger``: a :class:`~zerotopo.comm.ledger.Ledger` that records every collective the model and
    its optimizer issue (default: none). ``sanitize``: check the ordering rules on every collective that
    reads a buffer another stream wrote (raises :class:`~zerotopo.engine.streams.OrderingError`).
    ``copy_delay_ms``: delay the CPU emulated copy engine (on a device: a spin kernel before each copy)
    (default ``$ZEROTOPO_EMULATED_COPY_DELAY_MS`` or 0). ``unordered_secondary``: reproduce the race of stock
    ZeRO++ hpZ (Wang et al., "ZeRO++: Extremely Efficient Collective Communication for Giant Model
    Training", arXiv:2306.10209) that Dai et al., "Enhancing Stability for Large Models Training in
    Constrained Bandwidth Networks" (ICML 2024 ES-FoMo workshop) found: the backward all-gather does not
    wait for the secondary partition's copy. No plan or CLI option selects it."""

    ledger: Any = None
    sanitize: bool = False
    copy_delay_ms: float | None = None
    unordered_secondary: bool = False


def parallelize(
    module: nn.Module,
    *,
    mesh: Mesh,
    options: DebugOptions,
    mp_policy: MixedPrecision | None = None,
    units: list[tuple[str, nn.Module]] | None = None,
    init: Callable[[nn.Module], None] | None = None,
) -> nn.Module:
    """:func:`zerotopo.engine.parallelize` with the instrumentation and test hooks of ``options``
    (``mp_policy`` None: :class:`~zerotopo.engine.api.MixedPrecision`'s defaults)."""
    policy = mp_policy or MixedPrecision()
    return shard_module(module, mesh=mesh, mp_policy=policy, units=units, init=init, debug=options)


def assume_unsupported(mesh: Mesh, backend: str, op: str, dtype: torch.dtype | None = None) -> None:
    """Treat ``op`` (on ``dtype``, or any dtype) as unsupported by ``backend`` on ``mesh``'s groups: the
    fallback of :mod:`zerotopo.comm.collectives` runs instead."""
    mesh.comm.assume_unsupported(backend, op, dtype)
