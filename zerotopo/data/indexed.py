"""The GPT-NeoX / Megatron mmap indexed dataset: token documents in ``P.bin``, their index in ``P.idx``.

Index layout (little-endian), as ``megatron/data/indexed_dataset.py`` writes it::

    magic     b"MMIDIDX\\x00\\x00"   9 bytes
    version   u64 = 1
    dtype     u8  (DTYPE_CODES: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16)
    count     u64   number of sequences (NeoX's preprocessing writes one per document)
    doc_count u64   length of doc_idx
    sizes     int32[count]       tokens per sequence
    pointers  int64[count]       byte offset of each sequence in .bin
    doc_idx   int64[doc_count]   sequence index where each document starts, then ``count``

The data file is the sequences' tokens back to back, in ``dtype``. Both files are read with ``np.memmap``,
so a dataset larger than memory costs only what is touched.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Iterable

import numpy as np

from zerotopo.errors import ZerotopoError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
# Megatron's codes; 6 was written as np.float (float64) and 7 is float32 in Megatron-Core.
DTYPE_CODES: dict[int, type[np.generic]] = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}
_CODE_OF = {np.dtype(t): code for code, t in DTYPE_CODES.items()}


def index_path(prefix: str) -> str:
    return prefix + ".idx"


def data_path(prefix: str) -> str:
    return prefix + ".bin"


def best_dtype(vocab_size: int) -> type[np.generic]:
    """uint16 when every token id fits (as NeoX chooses), else int32."""
    return np.uint16 if vocab_size <= 65536 else np.int32


def dataset_exists(prefix: str) -> bool:
    return os.path.isfile(index_path(prefix)) and os.path.isfile(data_path(prefix))


class IndexedDatasetBuilder:
    """Writes documents to ``prefix.bin`` as they come and ``prefix.idx`` on :meth:`finalize`.

    Files are written under temporary names and renamed at the end, so a reader never sees half a dataset.
    """

    def __init__(self, prefix: str | os.PathLike, dtype: type[np.generic] | np.dtype = np.uint16):
        self.prefix = os.fspath(prefix)
        self.dtype = np.dtype(dtype)
        if self.dtype not in _CODE_OF:
            raise ZerotopoError(
                f"dtype {self.dtype} has no indexed-dataset code; use one of {sorted(map(str, _CODE_OF))}"
            )
        self._tmp_suffix = f".tmp{os.getpid()}"
        self._bin = open(data_path(self.prefix) + self._tmp_suffix, "wb")  # noqa: SIM115 - closed in finalize
        self._sizes: list[int] = []

    def add_document(self, tokens: Iterable[int] | np.ndarray) -> None:
        """Append one document (a sequence of token ids)."""
        arr = np.asarray(tokens)
        if (
            arr.size
            and self.dtype.kind in "iu"
            and (arr.min() < np.iinfo(self.dtype).min or arr.max() > np.iinfo(self.dtype).max)
        ):
            raise ZerotopoError(
                f"token ids in [{arr.min()}, {arr.max()}] do not fit {self.dtype}; build with a wider dtype (int32)"
            )
        self._bin.write(arr.astype(self.dtype, copy=False).tobytes(order="C"))
        self._sizes.append(int(arr.size))

    def abort(self) -> None:
        """Drop what was written (an error part-way): no file is left behind."""
        self._bin.close()
        with contextlib.suppress(FileNotFoundError):
            os.remove(data_path(self.prefix) + self._tmp_suffix)

    def finalize(self) -> None:
        """Write the index and move both files into place."""
        self._bin.close()
        sizes = np.asarray(self._sizes, dtype=np.int32)
        pointers = np.zeros(len(sizes), dtype=np.int64)
        if len(sizes) > 1:
            pointers[1:] = np.cumsum(sizes[:-1], dtype=np.int64) * self.dtype.itemsize
        doc_idx = np.arange(len(sizes) + 1, dtype=np.int64)  # one sequence per document, as NeoX writes
        tmp_idx = index_path(self.prefix) + self._tmp_suffix
        with open(tmp_idx, "wb") as f:
            f.write(MAGIC)
            f.write(struct.pack("<Q", VERSION))
            f.write(struct.pack("<B", _CODE_OF[self.dtype]))
            f.write(struct.pack("<Q", len(sizes)))
            f.write(struct.pack("<Q", len(doc_idx)))
            f.write(sizes.tobytes(order="C"))
            f.write(pointers.tobytes(order="C"))
            f.write(doc_idx.tobytes(order="C"))
        os.replace(data_path(self.prefix) + self._tmp_suffix, data_path(self.prefix))
        os.replace(tmp_idx, index_path(self.prefix))


class MMapIndexedDataset:
    """Reads a NeoX/Megatron mmap indexed dataset; ``ds[i]`` is document ``i`` as a numpy array."""

    def __init__(self, prefix: str | os.PathLike):
        self.prefix = os.fspath(prefix)
        if not dataset_exists(self.prefix):
            raise ZerotopoError(
                f"no indexed dataset at {self.prefix}: expected {index_path(self.prefix)} and "
                f"{data_path(self.prefix)}; give the prefix without .bin/.idx, or make one with "
                "`zerotopo data preprocess`"
            )
        idx = index_path(self.prefix)
        with open(idx, "rb") as f:
            header = f.read(len(MAGIC) + 8 + 1 + 8 + 8)
        if header[: len(MAGIC)] != MAGIC:
            raise ZerotopoError(
                f"{idx} is not an mmap indexed dataset (bad magic); was it written with data-impl mmap?"
            )
        version, code, count, doc_count = struct.unpack("<QBQQ", header[len(MAGIC) :])
        if version != VERSION or code not in DTYPE_CODES:
            raise ZerotopoError(f"{idx}: version {version}, dtype code {code}; expected version 1, codes 1-8")
        self.dtype = np.dtype(DTYPE_CODES[code])
        offset = len(header)
        self._index = np.memmap(idx, mode="r", dtype=np.uint8)
        self.sizes = np.frombuffer(self._index, dtype=np.int32, count=count, offset=offset)
        self.pointers = np.frombuffer(
            self._index, dtype=np.int64, count=count, offset=offset + self.sizes.nbytes
        )
        self.doc_idx = np.frombuffer(
            self._index,
            dtype=np.int64,
            count=doc_count,
            offset=offset + self.sizes.nbytes + self.pointers.nbytes,
        )
        size = os.path.getsize(data_path(self.prefix))
        self._data = (
            np.memmap(data_path(self.prefix), mode="r", dtype=np.uint8) if size else np.zeros(0, np.uint8)
        )
        if count and self.pointers[-1] + int(self.sizes[-1]) * self.dtype.itemsize > size:
            raise ZerotopoError(
                f"{data_path(self.prefix)} is shorter than its index says; the files do not match"
            )

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.get(i)

    def get(self, i: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens ``offset : offset + length`` of document ``i`` (a read-only view of the mmap)."""
        size = int(self.sizes[i])
        length = size - offset if length is None else length
        start = int(self.pointers[i]) + offset * self.dtype.itemsize
        return np.frombuffer(self._data, dtype=self.dtype, count=length, offset=start)

    def max_token_id(self, chunk_tokens: int = 1 << 24) -> int:
        """The largest token id in the data (-1 when empty), scanned in chunks so memory stays flat; a
        training run compares it with the model's vocabulary before starting."""
        flat = np.frombuffer(self._data, dtype=self.dtype) if len(self._data) else np.zeros(0, self.dtype)
        best = -1
        for start in range(0, len(flat), chunk_tokens):
            best = max(best, int(flat[start : start + chunk_tokens].max()))
        return best

    @property
    def num_tokens(self) -> int:
        return int(self.sizes.sum(dtype=np.int64))
