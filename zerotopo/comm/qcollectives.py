"""Quantized collectives: int8 all-gather (ZeRO++ qwZ, and the int8 secondary partition of Xu et al.,
"Scaling Large Language Model Training on Frontier with Low-Bandwidth Partitioning" (arXiv:2501.04266)) and
the
int4 all-to-all reduce-scatter (ZeRO++ qgZ), in one hop or two.

[Note: qgZ] A ring reduce-scatter would requantize partial sums at every hop, compounding the error over
``d - 1`` steps. qgZ instead quantizes each destination's chunk once, exchanges them with one all-to-all,
and reduces in fp32 after dequantizing. Across nodes the two-hop form first reduces inside the node
(all-to-all over the node's ranks of the group), then exchanges the node's partial sums with the ranks of
the same position on the other nodes, so only ``1/devices_per_node`` of the message crosses the network.
The node is the topology's (the mesh's ``grads_intra``/``grads_inter`` groups), never the number of
visible devices: DeepSpeed's qgZ derives it from ``torch.cuda.device_count()``, which is 1 under
``srun --gpus-per-task=1``, and then reduces the wrong chunks.

Ledger records use the quantized byte counts of :mod:`zerotopo.placement.volume` (codes plus scales), one
record per hop, each on its own group so the tier is the one that hop crosses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from zerotopo.comm.collectives import (
    Finish,
    Pending,
    all_gather,
    issue_all_gather,
    issue_all_to_all,
    reduce_scatter,
    run_collective,
    stream_context,
    use_on_current_stream,
)
from zerotopo.comm.ledger import Ledger
from zerotopo.comm.quant import (
    Quantized,
    dequantize,
    dequantize_reduce,
    pack_payload,
    quantize_int8,
    quantize_rows,
    unpack_payload,
)
from zerotopo.dtypes import PRECISIONS
from zerotopo.placement import volume
from zerotopo.placement.codecs import Codec


def gather_quantized(
    out: torch.Tensor,
    q_local: Quantized,
    group: Any,
    *,
    ledger: Ledger | None = None,
    async_op: bool = False,
    stream: Any = None,
    tag: str = "",
    op: str = "all_gather_int8",
) -> Pending | None:
    """Gather every position's quantized shard (codes + scales) and dequantize them into ``out`` in
    position order. Used for a secondary partition that is stored quantized."""
    d = group.size
    if q_local.rows != 1:
        raise ValueError("gather_quantized expects one quantized shard (rows == 1)")
    if out.numel() != q_local.numel * d:
        raise ValueError(f"{op}: output has {out.numel()} elements, expected {d} shards of {q_local.numel}")
    payload = volume.int8_payload if q_local.bits == 8 else volume.int4_payload
    payload_bytes = payload(q_local.numel, q_local.block)  # one position's codes and scales
    nbytes = (d - 1) * payload_bytes  # sent to the d - 1 others (volume.int8_all_gather_bytes for int8)

    def issue() -> tuple[Any, list[Finish]]:
        # Runs on ``stream``: the packing is ordered with the collective, the dequantization with wait().
        payload = pack_payload(q_local).view(-1)
        recv = torch.empty(d * payload.numel(), dtype=torch.uint8, device=payload.device)
        work, finish = issue_all_gather(recv, payload, group)

        def dequant() -> None:
            use_on_current_stream(recv)
            q_all = unpack_payload(
                recv.view(d, -1), numel=out.numel(), bits=q_local.bits, block=q_local.block, dtype=out.dtype
            )
            dequantize(q_all, out=out)

        return work, [*finish, dequant]

    return run_collective(
        op, group, out, numel=out.numel(), nbytes=nbytes, dtype=f"int{q_local.bits}", ledger=ledger,
        tag=tag, async_op=async_op, stream=stream, issue=issue, wire_message_bytes=d * payload_bytes,
    )  # fmt: skip


def all_gather_int8(
    out: torch.Tensor,
    inp: torch.Tensor,
    group: Any,
    *,
    block: int,
    ledger: Ledger | None = None,
    async_op: bool = False,
    stream: Any = None,
    tag: str = "",
) -> Pending | None:
    """int8 all-gather: quantize the local shard in blocks of ``block``, gather codes and scales,
    dequantize into ``out`` (``out``'s dtype, normally the parameters')."""
    if out.numel() != inp.numel() * group.size:
        raise ValueError(
            f"all_gather_int8: output has {out.numel()} elements, expected {group.size} x {inp.numel()}"
        )
    with stream_context(stream, inp.device):
        q = quantize_int8(inp, block)  # on ``stream``, ordered after the work queued there
    return gather_quantized(out, q, group, ledger=ledger, async_op=async_op, stream=stream, tag=tag)


def _all_to_all_reduce(
    rows: torch.Tensor, group: Any, *, block: int, ledger: Ledger | None, tag: str
) -> torch.Tensor:
    """Row ``i`` of ``rows`` (``(d, n)``) goes to position ``i`` as int4; returns the fp32 sum (``n``)
    of the rows every position sent here."""
    d, n = rows.shape
    payload = pack_payload(quantize_rows(rows, 4, block))
    recv = torch.empty_like(payload)
    run_collective(
        "reduce_scatter_int4", group, rows, numel=rows.numel(),
        nbytes=volume.int4_reduce_scatter_bytes(rows.numel(), d, block), dtype="int4", ledger=ledger,
        tag=tag, async_op=False, stream=None, issue=lambda: issue_all_to_all(recv, payload, group),
        wire_message_bytes=payload.numel() * payload.element_size(),
    )  # fmt: skip
    q = unpack_payload(recv, numel=rows.numel(), bits=4, block=block, dtype=torch.float32)
    return dequantize_reduce(q)  # (d, n) codes -> their fp32 sum, in position order


def _check_hops(group: Any, intra: Any, inter: Any) -> None:
    a, b = intra.size, inter.size
    ok = (
        a * b == group.size
        and all(group.ranks[k * a + intra.position] == inter.ranks[k] for k in range(b))
        and all(group.ranks[inter.position * a + j] == intra.ranks[j] for j in range(a))
    )
    if not ok:
        raise ValueError(
            f"two-hop reduce-scatter: intra group {intra.ranks} and inter group {inter.ranks} do not tile "
            f"the {group.kind} group {group.ranks} as nodes x ranks per node; pass the mesh's grads_intra "
            f"and grads_inter groups of a group made of whole nodes (or neither, for one hop)"
        )


def reduce_scatter_int4(
    out: torch.Tensor,
    inp: torch.Tensor,
    group: Any,
    *,
    block: int,
    order: Sequence[int] | None = None,
    intra: Any = None,
    inter: Any = None,
    ledger: Ledger | None = None,
    tag: str = "",
) -> None:
    """int4 all-to-all reduce-scatter (qgZ), summing in fp32: position ``i`` receives chunk ``order[i]``
    (default ``i``) of the sum of every position's ``inp`` in ``out``.

    With ``intra`` and ``inter`` (the mesh's ``grads_intra``/``grads_inter`` groups) and a group that
    spans several nodes, runs in two hops: inside the node, then across nodes. Synchronous.
    """
    d = group.size
    if inp.numel() != out.numel() * d:
        raise ValueError(
            f"reduce_scatter_int4: input has {inp.numel()} elements, expected {d} x {out.numel()}"
        )
    order = tuple(order) if order is not None else tuple(range(d))
    if sorted(order) != list(range(d)):
        raise ValueError(f"reduce_scatter_int4: order {order} is not a permutation of the {d} positions")
    n = out.numel()
    chunks = inp.reshape(d, n)
    if d == 1:
        out.copy_(chunks[order[0]].view(out.shape))
        return
    # Row i: the chunk position i receives. The index tensor is the group's, made once (a list index
    # would be copied to the device on every call).
    staged = chunks if order == tuple(range(d)) else chunks.index_select(0, group.index(order, inp.device))
    if intra is None or inter is None or intra.size == 1 or inter.size == 1:
        total = _all_to_all_reduce(staged, group, block=block, ledger=ledger, tag=tag)
    else:
        _check_hops(group, intra, inter)
        a, b = intra.size, inter.size
        # Position k*a + j is rank j of node k. Hop 1 sends rank j of this node the chunks of every
        # position j on each node; it returns the node's partial sums of those b chunks.
        bundles = staged.view(b, a, n).transpose(0, 1).reshape(a, b * n)
        partial = _all_to_all_reduce(bundles, intra, block=block, ledger=ledger, tag=tag)
        # Hop 2: partial sum k belongs to rank k*a + j, position j on node k: the inter group's position k.
        total = _all_to_all_reduce(partial.view(b, n), inter, block=block, ledger=ledger, tag=tag)
    out.copy_(total.view(out.shape))


# -- wire codecs ---------------------------------------------------------------------------------------

_PLAIN_DTYPES = PRECISIONS


class WireCodec:
    """The comm side of a :class:`~zerotopo.placement.codecs.Codec` (FSDP2's pluggable all-gather and
    reduce-scatter): how a payload in this format is quantized (encoded), communicated and dequantized.
    :func:`wire_codec` picks the implementation once, when a unit is built; callers never ask which
    format they hold. This base class sends the payload as it is.

    ``**comm`` of every collective: ``ledger``, ``stream`` and ``tag``, as the collectives take them (a
    reduce-scatter also ``order`` and ``hops``)."""

    def __init__(self, spec: Codec, block: int) -> None:
        self.spec = spec
        self.block = block

    @property
    def name(self) -> str:
        return self.spec.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec.name!r}, block={self.block})"

    def all_gather(self, out: torch.Tensor, shard: torch.Tensor, group: Any, **comm: Any) -> Pending:
        """Asynchronous all-gather of every position's ``shard`` into ``out`` (``out``'s dtype)."""
        return all_gather(out, shard, group, async_op=True, **comm)  # type: ignore[return-value]

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, group: Any, **comm: Any) -> None:
        """Sum ``inp`` over ``group`` and keep this position's chunk (of ``comm["order"]``) in ``out``;
        ``comm["hops"]`` (the node's and the cross-node group, or ``(None, None)``) is read by the two-hop
        codecs only."""
        comm.pop("hops", None)
        reduce_scatter(out, inp, group, **comm)

    def encoded_empty(self, numel: int, device: torch.device, *, poison: bool) -> Any:
        """A fresh buffer for ``numel`` encoded elements; ``poison`` fills it with NaN (a read before it
        is written then shows up as NaN instead of stale values)."""
        dtype = _PLAIN_DTYPES.get(self.spec.name)
        if dtype is None:
            raise ValueError(
                f"codec {self.spec.name!r} cannot hold a partition; use one of {', '.join(_PLAIN_DTYPES)}"
            )
        dst = torch.empty(numel, dtype=dtype, device=device)
        if poison:
            dst.fill_(float("nan"))
        return dst

    def encode_into(self, dst: Any, src: torch.Tensor) -> None:
        """Write ``src`` into ``dst`` (a buffer of :meth:`encoded_empty`) in this format."""
        dst.copy_(src)

    def gather_encoded(
        self, out: torch.Tensor, held: Any, group: Any, **comm: Any
    ) -> tuple[Pending, torch.Tensor | None]:
        """Asynchronous all-gather of every position's encoded ``held`` into ``out``: the pending
        collective and the buffer it lands in (copied into ``out`` once waited when not ``out``)."""
        tmp = (
            out if out.dtype == held.dtype else torch.empty(out.numel(), dtype=held.dtype, device=out.device)
        )
        return all_gather(tmp, held, group, async_op=True, **comm), tmp  # type: ignore[return-value]


class Int8Codec(WireCodec):
    """int8 codes with a scale per block (ZeRO++ qwZ, the int8 secondary partition)."""

    def all_gather(self, out: torch.Tensor, shard: torch.Tensor, group: Any, **comm: Any) -> Pending:
        return all_gather_int8(out, shard, group, block=self.block, async_op=True, **comm)  # type: ignore[return-value]

    def reduce_scatter(self, *args: Any, **kwargs: Any) -> None:
        raise ValueError("codec 'int8' has no reduce-scatter (gradients reduce in a plain format or int4)")

    def encoded_empty(self, numel: int, device: torch.device, *, poison: bool) -> Quantized:
        dst = quantize_int8(torch.zeros(numel, dtype=torch.float32, device=device), self.block)
        if poison:
            dst.scales.fill_(float("nan"))
        return dst

    def encode_into(self, dst: Any, src: torch.Tensor) -> None:
        q = quantize_int8(src, self.block)
        dst.data.copy_(q.data)
        dst.scales.copy_(q.scales)

    def gather_encoded(
        self, out: torch.Tensor, held: Any, group: Any, **comm: Any
    ) -> tuple[Pending, torch.Tensor | None]:
        return gather_quantized(out, held, group, async_op=True, **comm), None  # type: ignore[return-value]


class Int4Codec(WireCodec):
    """int4 codes with a scale per block, reduced by all-to-all (ZeRO++ qgZ, see [Note: qgZ])."""

    def all_gather(self, *args: Any, **kwargs: Any) -> Pending:
        raise ValueError("codec 'int4' has no all-gather (weights gather in a plain format or int8)")

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, group: Any, **comm: Any) -> None:
        # the all-to-all form runs on the calling stream: the stream argument is not used
        intra, inter = comm.get("hops") or (None, None)
        reduce_scatter_int4(
            out, inp, group, block=self.block, order=comm.get("order"), intra=intra, inter=inter,
            ledger=comm.get("ledger"), tag=comm.get("tag", ""),
        )  # fmt: skip

    def encoded_empty(self, numel: int, device: torch.device, *, poison: bool) -> Any:
        raise ValueError("codec 'int4' cannot hold a partition; secondary partitions are bf16 or int8")


_IMPLS: dict[str, type[WireCodec]] = {"int8": Int8Codec, "int4": Int4Codec}


def wire_codec(spec: Codec, block: int) -> WireCodec:
    """The comm implementation of the placement codec ``spec`` (quantizing in blocks of ``block``)."""
    return _IMPLS.get(spec.name, WireCodec)(spec, block)
