"""The shard layout invariant: optimizer ⊆ gradient ⊆ parameter ownership, for every valid plan."""

from __future__ import annotations

import pytest

from zerotopo.placement.layout import (
    GROUP_KINDS,
    digits,
    grad_range,
    groups,
    optim_range,
    optim_scatter_order,
    padded_numel,
    param_gather_order,
    param_range,
    reduce_scatter_order,
    secondary_range,
)
from zerotopo.placement.plan import Degrees, divisors


def all_degrees(world: int):
    for p in divisors(world):
        for g in (x for x in divisors(world) if x % p == 0):
            for o in (x for x in divisors(world) if x % g == 0):
                yield Degrees(params=p, grads=g, optim=o, world=world)


def test_nesting_invariant_every_triple_up_to_64_ranks():
    checked = 0
    for world in range(1, 65):
        for d in all_degrees(world):
            numel = padded_numel(1, d)
            for t in range(world):
                ps, pe = param_range(t, d, numel)
                gs, ge = grad_range(t, d, numel)
                os_, oe = optim_range(t, d, numel)
                assert ps <= gs < ge <= pe, (world, d, t)
                assert gs <= os_ < oe <= ge, (world, d, t)
            checked += 1
    assert checked > 1000


@pytest.mark.parametrize("world", [1, 2, 6, 8, 12, 16])
def test_every_chunk_owned_once_per_group(world):
    for d in all_degrees(world):
        numel = padded_numel(7, d)
        for size, rng in ((d.params, param_range), (d.grads, grad_range), (d.optim, optim_range)):
            for base in range(0, world, size):
                covered = sorted(rng(t, d, numel) for t in range(base, base + size))
                # The chunks of one group tile the buffer exactly.
                assert covered[0][0] == 0 and covered[-1][1] == numel
                assert all(a[1] == b[0] for a, b in zip(covered, covered[1:]))


def test_padding_is_a_multiple_of_every_degree_and_even_per_chunk():
    d = Degrees(params=2, grads=8, optim=24, world=48, secondary=16)
    n = padded_numel(1001, d)
    assert n >= 1001
    for deg in (2, 8, 24, 16):
        assert n % deg == 0 and (n // deg) % 2 == 0


def test_reduce_scatter_order_delivers_each_rank_its_gradient_chunk():
    d = Degrees(params=2, grads=8, optim=16, world=16)
    order = reduce_scatter_order(d)
    assert sorted(order) == list(range(8))
    # Position i of the gradient group receives block i of the staged input = chunk order[i].
    numel = padded_numel(64, d)
    for t in range(16):
        i = t % d.grads
        size = numel // d.grads
        assert (order[i] * size, (order[i] + 1) * size) == grad_range(t, d, numel)
    assert order == [0, 4, 1, 5, 2, 6, 3, 7]


def test_param_gather_order_rebuilds_the_parameter_chunk():
    d = Degrees(params=2, grads=4, optim=16, world=16)
    numel = padded_numel(16, d)
    order = param_gather_order(d)
    sub = numel // d.optim
    for group in groups(d, "param_gather"):
        t0 = group[0]
        ps, _ = param_range(t0, d, numel)
        for k, t in enumerate(group):
            s, e = optim_range(t, d, numel)
            assert s == ps + order[k] * sub and e == s + sub
    assert optim_scatter_order(d) == list(range(d.optim // d.grads))


def test_groups_partition_the_world_and_are_tier_aligned():
    d = Degrees(params=2, grads=8, optim=16, world=32, secondary=8)
    for kind in GROUP_KINDS:
        gs = groups(d, kind)
        flat = sorted(t for g in gs for t in g)
        assert flat == list(range(32)), kind
        assert all(g == sorted(g) for g in gs)
    assert groups(d, "params")[1] == [2, 3]
    assert groups(d, "grad_replicas")[0] == [0, 8, 16, 24]
    assert groups(d, "optim_scatter")[0] == [0, 8]
    assert groups(d, "optim_replicas")[0] == [0, 16]
    assert groups(d, "param_gather")[1] == [1, 3, 5, 7, 9, 11, 13, 15]


def test_secondary_chunk_is_the_group_position():
    d = Degrees(params=2, grads=8, optim=8, world=8, secondary=4)
    numel = padded_numel(10, d)
    assert [secondary_range(t, d, numel)[0] // (numel // 4) for t in range(8)] == [0, 1, 2, 3] * 2


def test_digits_reconstruct_the_index_inside_the_optimizer_group():
    d = Degrees(params=2, grads=4, optim=8, world=16)
    for t in range(16):
        a, b, c = digits(t, d)
        assert a + d.params * b + d.grads * c == t % d.optim
