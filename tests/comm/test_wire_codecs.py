"""The codecs as objects: the placement description (bytes, temporary memory) and the comm side that
each plan's codec maps to (encode, refusals), single process."""

from __future__ import annotations

import pytest
import torch

from zerotopo.comm.qcollectives import Int4Codec, Int8Codec, WireCodec, wire_codec
from zerotopo.comm.quant import dequantize, quantize_int8
from zerotopo.placement import volume
from zerotopo.placement.codecs import CODECS, get_codec, plan_codecs
from zerotopo.placement.plan import get_preset


def test_codec_descriptions_count_wire_bytes_and_temporaries():
    n, block = 4096, 256
    assert [CODECS[k].wire_bytes for k in ("fp32", "bf16", "int8", "int4")] == [4.0, 2.0, 1.0, 0.5]
    assert CODECS["bf16"].temp_bytes(n, block) == 0  # a plain payload lands in its output
    assert CODECS["int8"].temp_bytes(n, block) == volume.int8_payload(n, block)
    assert CODECS["int4"].temp_bytes(n, block) == volume.int4_payload(n, block)
    with pytest.raises(ValueError, match="unknown codec 'int2'"):
        get_codec("int2")


def test_each_plan_codec_maps_to_its_comm_implementation():
    """The zerotopo preset's secondary is int8 and its gradients reduce in int4; zero3's are plain."""
    zt = plan_codecs(get_preset("zerotopo"), param_bytes=2, reduce_bytes=4, grad_shard_bytes=4)
    assert type(wire_codec(zt.secondary, 256)) is Int8Codec
    assert type(wire_codec(zt.reduce, 256)) is Int4Codec
    z3 = plan_codecs(get_preset("zero3"), param_bytes=2, reduce_bytes=4, grad_shard_bytes=4)
    assert type(wire_codec(z3.gather, 256)) is WireCodec and z3.gather.name == "bf16"
    assert z3.reduce.name == "fp32" and z3.secondary.name == "bf16"


@pytest.mark.parametrize("name", ["bf16", "int8"])
def test_secondary_encoding_round_trips_and_poisons(name):
    """A secondary partition in its codec: a poisoned fresh buffer reads NaN, the encoded one reads the
    weights back (bf16 rounding, or the block quantizer's)."""
    codec = wire_codec(get_codec(name), 64)
    src = torch.randn(256, generator=torch.Generator().manual_seed(0))
    dst = codec.encoded_empty(256, torch.device("cpu"), poison=True)
    fresh = dst.to(torch.float32) if name == "bf16" else dequantize(dst, torch.empty(256))
    assert torch.isnan(fresh).all()
    codec.encode_into(dst, src)
    if name == "bf16":
        assert torch.equal(dst, src.to(torch.bfloat16))
    else:
        want = quantize_int8(src, 64)
        assert torch.equal(dst.data, want.data) and torch.equal(dst.scales, want.scales)


def test_codecs_refuse_what_they_cannot_do():
    with pytest.raises(ValueError, match="'int4' has no all-gather"):
        wire_codec(CODECS["int4"], 64).all_gather(torch.empty(4), torch.empty(2), None)
    with pytest.raises(ValueError, match="'int8' has no reduce-scatter"):
        wire_codec(CODECS["int8"], 64).reduce_scatter(torch.empty(2), torch.empty(4), None)
    with pytest.raises(ValueError, match="'int4' cannot hold a partition"):
        wire_codec(CODECS["int4"], 64).encoded_empty(4, torch.device("cpu"), poison=False)
