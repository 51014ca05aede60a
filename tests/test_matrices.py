"""Whole-matrix ownership (zerotopo/placement/matrices.py): owners balance Newton-Schulz FLOPs, and the
exchange moves every element of every matrix exactly once, from the position that holds it to its owner."""

from __future__ import annotations

import pytest

from zerotopo.placement.layout import optim_range, padded_numel
from zerotopo.placement.matrices import Matrix, assign_owners, exchange
from zerotopo.placement.plan import Degrees


def test_ns_flops_count_the_short_side():
    # X is (m, n) with m <= n: per step 4 m^2 n + 2 m^3, whichever way the matrix is stored
    assert Matrix("a", 0, 0, 4, 8).ns_flops(1) == 4 * 16 * 8 + 2 * 64
    assert Matrix("a", 0, 0, 8, 4).ns_flops(5) == Matrix("b", 0, 0, 4, 8).ns_flops(5) == 5 * (512 + 128)


def test_owners_balance_flops_and_are_deterministic():
    # a NeoX-like layer: fused QKV (3h, h), dense (h, h), MLP up (4h, h) and down (h, 4h), 4 layers
    h = 64
    mats = [
        Matrix(f"l{i}.{n}", i, 0, r, c)
        for i in range(4)
        for n, r, c in (("qkv", 3 * h, h), ("dense", h, h), ("up", 4 * h, h), ("down", h, 4 * h))
    ]
    own = assign_owners(mats, 4)
    assert own == assign_owners(mats, 4)
    assert sorted(set(own.owners)) == [0, 1, 2, 3]
    assert sum(own.flops) == sum(m.ns_flops() for m in mats)
    assert sum(own.elements) == sum(m.numel for m in mats)
    assert own.flops_imbalance < 1.1
    # one position: it owns everything, no imbalance; more positions than matrices: some own nothing
    assert assign_owners(mats, 1).flops_imbalance == 1.0
    few = assign_owners(mats[:2], 4)
    assert few.flops.count(0) == 2 and few.flops_imbalance > 1.9
    with pytest.raises(ValueError, match="at least one position"):
        assign_owners(mats, 0)


def _two_units(degrees):
    """Two units whose matrices straddle optimizer chunks, with non-matrix elements between them: the
    matrices, their owners, each position's chunk ranges and the exchange."""
    units = [[("w1", 5, 7, 3), ("w2", 4, 4, 40)], [("w3", 9, 2, 0), ("w4", 3, 11, 30)]]
    numels = [padded_numel(80, degrees), padded_numel(70, degrees)]
    mats = [Matrix(n, u, off, r, c) for u, ms in enumerate(units) for n, r, c, off in ms]
    own = assign_owners(mats, degrees.optim)
    ranges = [[optim_range(t, degrees, n) for n in numels] for t in range(degrees.optim)]
    return mats, own, ranges, exchange(mats, own.owners, ranges)


@pytest.mark.parametrize("degrees", [Degrees(1, 1, 8, 8), Degrees(2, 4, 8, 8), Degrees(4, 4, 4, 8)])
def test_exchange_covers_each_matrix_once(degrees):
    # two units whose matrices straddle optimizer chunks, with non-matrix elements between them
    mats, own, ranges, ex = _two_units(degrees)
    covered = {k: [] for k in range(len(mats))}
    for src, row in enumerate(ex.pieces):
        for dst, pieces in enumerate(row):
            assert sum(p.numel for p in pieces) <= ex.width
            for p in pieces:
                assert own.owners[p.matrix] == dst
                m = mats[p.matrix]
                lo, hi = ranges[src][m.unit]
                assert lo <= m.offset + p.lo and m.offset + p.hi <= hi  # src really holds it
                covered[p.matrix].append((p.lo, p.hi))
    for k, spans in covered.items():
        spans.sort()
        assert spans[0][0] == 0 and spans[-1][1] == mats[k].numel
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert ex.padded_bytes(2) == (degrees.optim - 1) * ex.width * 2
    assert all(ex.sent(q) <= sum(hi - lo for lo, hi in ranges[q]) for q in range(degrees.optim))


@pytest.mark.parametrize("degrees", [Degrees(1, 1, 8, 8), Degrees(4, 4, 4, 8)])
def test_exchange_counts_each_pair_exactly_and_prices_both_directions(degrees):
    # the owners receive exactly their matrices' elements held elsewhere, and each rank's traffic per
    # step is its pieces out (gradients) plus, as an owner, the others' pieces back (weights), unpadded
    mats, own, ranges, ex = _two_units(degrees)
    o = degrees.optim
    counts = [ex.counts(q) for q in range(o)]
    assert all(len(c) == o for c in counts)
    for dst in range(o):
        assert sum(counts[src][dst] for src in range(o)) == own.elements[dst]
        assert ex.received(dst) == own.elements[dst] - counts[dst][dst]
    for q in range(o):
        assert ex.sent(q) == sum(counts[q]) - counts[q][q]
        assert ex.step_bytes(q) == 4 * (ex.sent(q) + ex.received(q))
        assert ex.step_bytes(q, 2) == 2 * (ex.sent(q) + ex.received(q))
    assert sum(sum(c) for c in counts) == sum(m.numel for m in mats)
    # the unpadded exchange never moves more than the padded one did (bf16 both ways, per rank)
    assert max(ex.step_bytes(q, 2) for q in range(o)) <= 2 * ex.padded_bytes(2)
    assert max(counts[s][d] for s in range(o) for d in range(o)) == ex.width
    assert [own.state_bytes(q) for q in range(o)] == [8 * e for e in own.elements]
    assert own.bytes_imbalance == max(own.elements) / (sum(own.elements) / o)
