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
import tempfile
from collections.abc import Iterable

import numpy as np

from zerotopo.errors import ZerotopoError
from zerotopo.fsutil import _umask, atomic_write

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
#: magic, version u64, dtype u8, count u64, doc_count u64.
HEADER_BYTES = len(MAGIC) + 8 + 1 + 8 + 8
#: Index entries checked per vectorized step (bounded temporary memory on huge datasets).
_CHUNK = 1 << 22


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
        target = data_path(self.prefix)
        fd, self._bin_tmp = tempfile.mkstemp(
            dir=os.path.dirname(os.path.abspath(target)),
            prefix=f".{os.path.basename(target)}.",
            suffix=".tmp",
        )
        self._bin = os.fdopen(fd, "wb")  # closed in finalize or abort
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

    def finalize(self) -> None:
        """Write the index and move both files into place."""
        self._bin.close()
        sizes = np.asarray(self._sizes, dtype=np.int32)
        pointers = np.zeros(len(sizes), dtype=np.int64)
        if len(sizes) > 1:
            pointers[1:] = np.cumsum(sizes[:-1], dtype=np.int64) * self.dtype.itemsize
        doc_idx = np.arange(len(sizes) + 1, dtype=np.int64)  # one sequence per document, as NeoX writes
        os.chmod(self._bin_tmp, 0o644 & ~_umask())
        os.replace(self._bin_tmp, data_path(self.prefix))
        with atomic_write(index_path(self.prefix), "wb") as f:
            f.write(MAGIC)
            f.write(struct.pack("<Q", VERSION))
            f.write(struct.pack("<B", _CODE_OF[self.dtype]))
            f.write(struct.pack("<Q", len(sizes)))
            f.write(struct.pack("<Q", len(doc_idx)))
            f.write(sizes.tobytes(order="C"))
            f.write(pointers.tobytes(order="C"))
            f.write(doc_idx.tobytes(order="C"))

    def abort(self) -> None:
        """Drop what was written (the temporary data file); the target files stay as they were."""
        self._bin.close()
        with contextlib.suppress(OSError):
            os.unlink(self._bin_tmp)


class MMapIndexedDataset:
    """Reads a NeoX/Megatron mmap indexed dataset; ``ds[i]`` is document ``i`` as a numpy array."""

    def __init__(self, prefix: str | os.PathLike):
        self.prefix = os.fspath(prefix)
        idx, bin_ = index_path(self.prefix), data_path(self.prefix)
        for path in (idx, bin_):
            if os.path.exists(path) and not os.path.isfile(path):
                raise ZerotopoError(
                    f"{path} is not a regular file (a directory?); give the prefix of a dataset made by "
                    "`zerotopo data preprocess`"
                )
        if not dataset_exists(self.prefix):
            raise ZerotopoError(
                f"no indexed dataset at {self.prefix}: expected {idx} and "
                f"{bin_}; give the prefix without .bin/.idx, or make one with "
                "`zerotopo data preprocess`"
            )
        remake = (
            "; the pair is damaged or was not written together: make it again with `zerotopo data preprocess`"
        )
        idx_size = os.path.getsize(idx)
        with open(idx, "rb") as f:
            header = f.read(HEADER_BYTES)
        if header[: len(MAGIC)] != MAGIC[: len(header)] or len(header) < len(MAGIC):
            raise ZerotopoError(
                f"{idx} is not an mmap indexed dataset (bad magic); was it written with data-impl mmap?"
            )
        if len(header) < HEADER_BYTES:
            raise ZerotopoError(
                f"{idx}: the header is cut short ({idx_size} of {HEADER_BYTES} bytes){remake}"
            )
        version, code, count, doc_count = struct.unpack("<QBQQ", header[len(MAGIC) :])
        if version != VERSION or code not in DTYPE_CODES:
            raise ZerotopoError(f"{idx}: version {version}, dtype code {code}; expected version 1, codes 1-8")
        self.dtype = np.dtype(DTYPE_CODES[code])
        # Sizes from the header are checked against the file before anything is mapped or allocated.
        expected = HEADER_BYTES + count * 4 + count * 8 + doc_count * 8
        if expected != idx_size:
            raise ZerotopoError(
                f"{idx}: the header says {count} sequences and {doc_count} document entries "
                f"({expected} bytes), but the file has {idx_size} bytes{remake}"
            )
        if doc_count < 1:
            raise ZerotopoError(f"{idx}: the document index is empty (it must end with {count}){remake}")
        bin_size = os.path.getsize(bin_)
        if bin_size % self.dtype.itemsize:
            raise ZerotopoError(
                f"{bin_}: {bin_size} bytes is not a whole number of {self.dtype} tokens{remake}"
            )
        offset = HEADER_BYTES
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
        self._validate(bin_size, remake)
        self._data = np.memmap(bin_, mode="r", dtype=np.uint8) if bin_size else np.zeros(0, np.uint8)

    def _validate(self, bin_size: int, remake: str) -> None:
        """Every sequence lies inside the ``.bin``, the document index is ordered and ends at ``count``."""
        idx, bin_ = index_path(self.prefix), data_path(self.prefix)
        count = len(self.sizes)
        item = self.dtype.itemsize
        for start in range(0, count, _CHUNK):
            sizes = self.sizes[start : start + _CHUNK]
            pointers = self.pointers[start : start + _CHUNK]
            bad = np.flatnonzero(sizes < 0)
            if bad.size:
                i = start + int(bad[0])
                raise ZerotopoError(f"{idx}: sequence {i} has a negative size {int(self.sizes[i])}{remake}")
            bad = np.flatnonzero((pointers < 0) | (pointers > bin_size) | (pointers % item != 0))
            if bad.size:
                i = start + int(bad[0])
                raise ZerotopoError(
                    f"{idx}: sequence {i} starts at byte {int(self.pointers[i])}, outside the {bin_size} bytes "
                    f"of {bin_} or not on a {self.dtype} boundary{remake}"
                )
            ends = pointers + sizes.astype(np.int64) * item
            bad = np.flatnonzero(ends > bin_size)
            if bad.size:
                i = start + int(bad[0])
                raise ZerotopoError(
                    f"{bin_} is shorter than its index says: sequence {i} ends at byte {int(ends[bad[0]])}, "
                    f"the file has {bin_size} bytes; the files do not match{remake}"
                )
        doc = self.doc_idx
        if int(doc[0]) != 0 or int(doc[-1]) != count:
            raise ZerotopoError(
                f"{idx}: the document index runs from {int(doc[0])} to {int(doc[-1])}, expected 0 to {count}{remake}"
            )
        for start in range(0, len(doc), _CHUNK):
            part = doc[start : start + _CHUNK + 1]
            if part.size > 1 and (np.diff(part) < 0).any():
                raise ZerotopoError(f"{idx}: the document index is not in increasing order{remake}")

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
        if self.dtype.kind == "f":
            raise ZerotopoError(
                f"{index_path(self.prefix)} stores {self.dtype} values, but token ids are integers; "
                "preprocess the data again (uint16 or int32 tokens)"
            )
        flat = np.frombuffer(self._data, dtype=self.dtype) if len(self._data) else np.zeros(0, self.dtype)
        best = -1
        for start in range(0, len(flat), chunk_tokens):
            chunk = flat[start : start + chunk_tokens]
            low = int(chunk.min())
            if low < 0:
                raise ZerotopoError(
                    f"{data_path(self.prefix)} holds a negative token id ({low}); token ids are 0 or more: "
                    "preprocess the data again"
                )
            best = max(best, int(chunk.max()))
        return best

    @property
    def num_tokens(self) -> int:
        return int(self.sizes.sum(dtype=np.int64))
