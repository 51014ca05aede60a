"""NeoX/Megatron mmap indexed dataset: round-trip per dtype, header bytes, errors."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from zerotopo.data.indexed import DTYPE_CODES, MAGIC, IndexedDatasetBuilder, MMapIndexedDataset, best_dtype
from zerotopo.errors import ZerotopoError


@pytest.mark.parametrize("code, dtype", sorted(DTYPE_CODES.items()))
def test_round_trip_each_dtype(tmp_path, code, dtype):
    prefix = str(tmp_path / "ds")
    docs = [np.arange(5) % 100, np.array([], dtype=np.int64), np.array([7, 1, 99]), np.arange(40) % 100]
    builder = IndexedDatasetBuilder(prefix, dtype)
    for d in docs:
        builder.add_document(d)
    builder.finalize()
    ds = MMapIndexedDataset(prefix)
    assert len(ds) == 4 and ds.dtype == np.dtype(dtype) and ds.num_tokens == 48
    for i, d in enumerate(docs):
        np.testing.assert_array_equal(ds[i], d.astype(dtype))
    np.testing.assert_array_equal(ds.get(3, offset=10, length=5), np.arange(10, 15).astype(dtype))
    with open(prefix + ".idx", "rb") as f:
        head = f.read(34)
    assert head[:9] == MAGIC and struct.unpack("<QBQQ", head[9:]) == (1, code, 4, 5)
    np.testing.assert_array_equal(ds.doc_idx, np.arange(5))
    assert (tmp_path / "ds.bin").stat().st_size == 48 * np.dtype(dtype).itemsize


def test_reads_hand_written_neox_files(tmp_path):
    """Files laid out byte by byte as Megatron's writer lays them out, including a doc_idx that groups two
    sequences into one document, read back here."""
    seqs = [
        np.array([3, 4, 5], dtype=np.uint16),
        np.array([9], dtype=np.uint16),
        np.array([1, 2], dtype=np.uint16),
    ]
    (tmp_path / "neox.bin").write_bytes(b"".join(s.tobytes() for s in seqs))
    sizes = np.array([3, 1, 2], dtype=np.int32)
    pointers = np.array([0, 6, 8], dtype=np.int64)
    doc_idx = np.array([0, 2, 3], dtype=np.int64)
    header = (
        b"MMIDIDX\x00\x00"
        + struct.pack("<Q", 1)
        + struct.pack("<B", 8)
        + struct.pack("<Q", 3)
        + struct.pack("<Q", 3)
    )
    (tmp_path / "neox.idx").write_bytes(header + sizes.tobytes() + pointers.tobytes() + doc_idx.tobytes())
    ds = MMapIndexedDataset(str(tmp_path / "neox"))
    assert ds.dtype == np.uint16 and list(ds.sizes) == [3, 1, 2] and list(ds.doc_idx) == [0, 2, 3]
    assert ds.max_token_id() == 9 and ds.max_token_id(chunk_tokens=2) == 9
    assert [list(ds[i]) for i in range(3)] == [[3, 4, 5], [9], [1, 2]]


def test_errors(tmp_path):
    with pytest.raises(ZerotopoError, match="no indexed dataset"):
        MMapIndexedDataset(str(tmp_path / "missing"))
    (tmp_path / "bad.idx").write_bytes(b"TNTIDX\x00\x00" + bytes(30))
    (tmp_path / "bad.bin").write_bytes(b"")
    with pytest.raises(ZerotopoError, match="bad magic"):
        MMapIndexedDataset(str(tmp_path / "bad"))
    builder = IndexedDatasetBuilder(str(tmp_path / "short"), np.int32)
    builder.add_document([1, 2, 3])
    builder.finalize()
    (tmp_path / "short.bin").write_bytes(b"\x00" * 4)
    with pytest.raises(ZerotopoError, match="shorter"):
        MMapIndexedDataset(str(tmp_path / "short"))
    with pytest.raises(ZerotopoError, match="do not fit"):
        IndexedDatasetBuilder(str(tmp_path / "narrow"), np.uint8).add_document([300])


def test_best_dtype():
    assert best_dtype(257) == np.uint16 and best_dtype(50277) == np.uint16 and best_dtype(100_000) == np.int32
