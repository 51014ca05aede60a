"""Bytes each rank sends in one collective: the one accounting shared by the ledger and the cost model.

Ring/direct algorithms are assumed, as NCCL and RCCL use for large messages (and as Xu et al.
(arXiv:2501.04266) Tables
VII-VIII and Lins (Chen et al., IWQoS 2024) count): in a group of ``d`` ranks, each rank sends ``d-1``
chunks of the
message's per-rank share. An all-reduce is a reduce-scatter plus an all-gather. Quantized payloads
carry one fp32 scale per block of ``block`` elements, per chunk (each destination chunk is quantized on
its own, so its blocks never straddle two ranks).

All functions take element counts of the *whole* message (the gathered output, the reduce-scatter input)
and return integers.
"""

from __future__ import annotations

SCALE_BYTES = 4  # one fp32 scale per block


def _per_rank(numel: int, d: int) -> int:
    if numel % d:
        raise ValueError(f"a message of {numel} elements does not split over {d} ranks")
    return numel // d


def all_gather_bytes(numel_out: int, d: int, elem_bytes: int) -> int:
    """All-gather into ``numel_out`` elements: each rank sends its share to the ``d-1`` others."""
    return (d - 1) * _per_rank(numel_out, d) * elem_bytes if d > 1 else 0


def reduce_scatter_bytes(numel_in: int, d: int, elem_bytes: int) -> int:
    """Reduce-scatter of ``numel_in`` elements: ``d-1`` partial chunks leave each rank."""
    return (d - 1) * _per_rank(numel_in, d) * elem_bytes if d > 1 else 0


def all_reduce_bytes(numel: int, d: int, elem_bytes: int) -> int:
    """All-reduce of ``numel`` elements = reduce-scatter + all-gather: ``2(d-1)/d`` of the message
    (rounded up per rank, so a scalar all-reduce still counts its bytes)."""
    return 2 * (d - 1) * (-(-numel // d)) * elem_bytes if d > 1 else 0


def all_to_all_bytes(numel: int, d: int, elem_bytes: int) -> int:
    """All-to-all of ``numel`` elements split into ``d`` chunks: ``d-1`` chunks leave each rank."""
    return (d - 1) * _per_rank(numel, d) * elem_bytes if d > 1 else 0


def broadcast_bytes(numel: int, d: int, elem_bytes: int, *, is_root: bool) -> int:
    """Broadcast: the root sends the message once per tree edge; counted as the message, root only."""
    return numel * elem_bytes if d > 1 and is_root else 0


def int8_payload(numel: int, block: int) -> int:
    """Bytes of ``numel`` values quantized to int8 in blocks of ``block`` (values + fp32 scales)."""
    return numel + SCALE_BYTES * (-(-numel // block))


def int4_payload(numel: int, block: int) -> int:
    """Bytes of ``numel`` values quantized to int4, two per byte, in blocks of ``block``."""
    return -(-numel // 2) + SCALE_BYTES * (-(-numel // block))


def int8_all_gather_bytes(numel_out: int, d: int, block: int) -> int:
    """int8 all-gather (qwZ): each rank sends its quantized share to ``d-1`` ranks."""
    return (d - 1) * int8_payload(_per_rank(numel_out, d), block) if d > 1 else 0


def int4_reduce_scatter_bytes(numel_in: int, d: int, block: int) -> int:
    """One-hop int4 all-to-all reduce-scatter (qgZ): ``d-1`` quantized chunks leave each rank."""
    return (d - 1) * int4_payload(_per_rank(numel_in, d), block) if d > 1 else 0


def int4_reduce_scatter_2hop_bytes(numel_in: int, d_intra: int, d_inter: int, block: int) -> tuple[int, int]:
    """Two-hop int4 reduce-scatter (inside the node, then across nodes): bytes of each hop.

    Hop 1 is an all-to-all over the ``d_intra`` ranks of the node on the whole message; hop 2 an
    all-to-all over the ``d_inter`` nodes on the ``1/d_intra`` share each rank reduced in hop 1.
    """
    hop1 = int4_reduce_scatter_bytes(numel_in, d_intra, block)
    hop2 = int4_reduce_scatter_bytes(_per_rank(numel_in, d_intra), d_inter, block)
    return hop1, hop2


# -- the quantizer's memory traffic (the roofline of zerotopo.comm.triton_quant) -------------------------


def quantize_traffic(numel: int, payload: int, value_bytes: int) -> int:
    """Bytes a quantize kernel moves through device memory: it reads ``numel`` values of ``value_bytes``
    once and writes their ``payload`` (codes and scales). (It reads each block a second time for the
    codes, right after the scale pass, from cache.)"""
    return numel * value_bytes + payload


def dequantize_traffic(numel: int, payload: int, value_bytes: int) -> int:
    """Bytes a dequantize kernel moves: it reads the ``payload`` and writes ``numel`` values."""
    return payload + numel * value_bytes


def dequantize_reduce_traffic(numel: int, rows: int, payload: int) -> int:
    """Bytes the fused int4 dequantize-and-reduce moves: it reads the ``payload`` of ``rows`` rows of
    ``numel // rows`` values and writes their fp32 sum once."""
    return payload + (numel // rows) * 4
