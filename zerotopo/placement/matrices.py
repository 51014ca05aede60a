"""Whole-matrix ownership inside an optimizer group, for matrix optimizers (Muon): which position of the
``optim`` group holds and updates each matrix, and which element pieces move to it and back.

[Note: whole-matrix owners] The optimizer chunks cut the flat unit buffers by element, so a chunk holds
slices of matrices. A matrix optimizer's update needs the whole matrix, so each matrix gets one *owner*
in the group (:func:`assign_owners`, balancing Newton-Schulz FLOPs, then bytes), which holds its fp32
master and its momentum whole. Each step every position sends its pieces of each matrix's gradient to
the owner and receives its pieces of the updated weights back (:func:`exchange`): one all-to-all each
way, each pair exchanging exactly its pieces (no padding). Pure Python: no torch, no process group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Matrix:
    """One 2-D parameter: its unit, its offset in the unit's flat buffer and its shape."""

    name: str
    unit: int
    offset: int
    rows: int
    cols: int

    @property
    def numel(self) -> int:
        return self.rows * self.cols

    def ns_flops(self, steps: int = 5) -> int:
        """FLOPs of ``steps`` Newton-Schulz iterations as torch's ``Muon`` runs them: on ``X`` of shape
        ``(m, n)``, ``m <= n`` (the matrix or its transpose), each step is ``A = X Xᵀ`` (``2m²n``),
        ``B = bA + cA²`` (``2m³``) and ``aX + BX`` (``2m²n``)."""
        m, n = sorted((self.rows, self.cols))
        return steps * (4 * m * m * n + 2 * m**3)


@dataclass(frozen=True)
class Ownership:
    """Owners of the matrices (group positions) and what each position carries."""

    owners: tuple[int, ...]
    """``owners[k]``: the position that orthogonalizes matrix ``k``."""
    flops: tuple[int, ...]
    """Newton-Schulz FLOPs per position per step."""
    elements: tuple[int, ...]
    """Matrix elements each position owns (it holds their fp32 master and momentum: 8 bytes each)."""

    @property
    def flops_imbalance(self) -> float:
        """Largest position's FLOPs over the mean (1.0: perfect); the step waits for the largest."""
        return _imbalance(self.flops)

    @property
    def bytes_imbalance(self) -> float:
        """Largest position's matrix elements (its owned state bytes) over the mean."""
        return _imbalance(self.elements)

    def state_bytes(self, position: int, bytes_per_element: int = 8) -> int:
        """Bytes of owned state ``position`` holds: fp32 master and momentum (8 per element) by default."""
        return self.elements[position] * bytes_per_element


def _imbalance(values: Sequence[int]) -> float:
    mean = sum(values) / len(values) if values else 0
    return max(values) / mean if mean else 1.0


def assign_owners(matrices: Sequence[Matrix], group: int, *, steps: int = 5) -> Ownership:
    """Longest-processing-time first: matrices by FLOPs (largest first, ties by position in the list),
    each to the position with the fewest FLOPs so far, ties broken by fewer elements, then by the lower
    position. Deterministic: every rank computes the same owners."""
    if group < 1:
        raise ValueError(f"an optimizer group has at least one position, got {group}")
    flops, elems = [0] * group, [0] * group
    owners = [0] * len(matrices)
    order = sorted(range(len(matrices)), key=lambda k: (-matrices[k].ns_flops(steps), -matrices[k].numel, k))
    for k in order:
        q = min(range(group), key=lambda i: (flops[i], elems[i], i))
        owners[k] = q
        flops[q] += matrices[k].ns_flops(steps)
        elems[q] += matrices[k].numel
    return Ownership(tuple(owners), tuple(flops), tuple(elems))


@dataclass(frozen=True)
class Piece:
    """Elements ``[lo, hi)`` of matrix ``matrix`` (flat, row-major), held by one position."""

    matrix: int
    lo: int
    hi: int

    @property
    def numel(self) -> int:
        return self.hi - self.lo


@dataclass(frozen=True)
class Exchange:
    """What moves between positions: ``pieces[src][dst]`` are the pieces position ``src`` holds of the
    matrices position ``dst`` owns, in a fixed order (unit, matrix, offset). Each direction is one
    all-to-all in which each (src, dst) pair exchanges exactly its pieces (:meth:`counts`); ``width`` is
    the largest pair, what an equal-chunk all-to-all would pad every pair to."""

    pieces: tuple[tuple[tuple[Piece, ...], ...], ...]
    width: int

    def counts(self, src: int) -> tuple[int, ...]:
        """Elements position ``src`` holds of each position's matrices (its own entry included): the
        split sizes of its send towards the owners, and of its receive on the way back."""
        return tuple(sum(p.numel for p in ps) for ps in self.pieces[src])

    def sent(self, src: int) -> int:
        """Elements position ``src`` sends to other positions (its own pieces stay)."""
        return sum(p.numel for dst, ps in enumerate(self.pieces[src]) if dst != src for p in ps)

    def received(self, dst: int) -> int:
        """Elements of ``dst``'s matrices the other positions hold (what it receives as their owner)."""
        return sum(p.numel for src, row in enumerate(self.pieces) if src != dst for p in row[dst])

    def step_bytes(self, position: int, element_size: int = 4) -> int:
        """Bytes ``position`` sends per step, both ways, without padding: its gradient pieces to the
        owners and, as an owner, the updated weights back to the positions that hold them
        (``element_size`` 4: both in fp32, see [Note: Muon with owner-held state] in
        ``zerotopo/engine/muon.py``). The busiest position: ``max(step_bytes(q) for q in range(group))``."""
        return (self.sent(position) + self.received(position)) * element_size

    def padded_bytes(self, element_size: int = 2) -> int:
        """Bytes one position would send in one direction of an equal-chunk all-to-all padded to the
        largest pair: ``(group - 1) × width`` (the layout before owner-held state; kept for comparison)."""
        return (len(self.pieces) - 1) * self.width * element_size


def exchange(
    matrices: Sequence[Matrix], owners: Sequence[int], ranges: Sequence[Sequence[tuple[int, int]]]
) -> Exchange:
    """The pieces each position sends to each owner: ``ranges[q][u]`` is position ``q``'s optimizer
    range ``(lo, hi)`` in unit ``u``'s flat buffer. A matrix's elements are covered exactly once by
    the ranges of the group (the optimizer chunks partition each unit)."""
    group = len(ranges)
    out: list[list[list[Piece]]] = [[[] for _ in range(group)] for _ in range(group)]
    for k in sorted(range(len(matrices)), key=lambda k: (matrices[k].unit, matrices[k].offset)):
        m = matrices[k]
        for q in range(group):
            lo, hi = ranges[q][m.unit]
            a, b = max(lo, m.offset), min(hi, m.offset + m.numel)
            if a < b:
                out[q][owners[k]].append(Piece(k, a - m.offset, b - m.offset))
    width = max((sum(p.numel for p in ps) for row in out for ps in row), default=0)
    return Exchange(tuple(tuple(tuple(ps) for ps in row) for row in out), width)
