"""A checkpoint's stored description, read without ``torch.distributed.checkpoint``: the metadata file
(:data:`METADATA_FILE`, JSON) as plain dataclasses, and each stored piece read and checked (see [Note:
checked pieces] in :mod:`zerotopo.checkpoint.dcpio`). What ``zerotopo ckpt verify`` and the pre-flight
checks of a resume need: importing DCP (and the DTensor stack under it) would cost more start-up than
reading the checkpoint."""

from __future__ import annotations

import io
import math
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from zerotopo.config.optimizers import NON_NEGATIVE, state_names
from zerotopo.dtypes import STORED, STORED_NAMES
from zerotopo.errors import ZerotopoError
from zerotopo.fsutil import read_json_object

METADATA_FILE = "dcp_metadata.json"
METADATA_FORMAT = "zerotopo-dcp-metadata"
_DTYPES = STORED
_DTYPE_NAMES = STORED_NAMES
_DATA_FILE = re.compile(r"^[A-Za-z0-9_.-]+\.distcp$")
CHECKSUM = "crc32c"
"""The checksum of every stored piece (see [Note: checked pieces])."""


@dataclass(frozen=True)
class PieceIndex:
    """Which stored piece: a tensor's name and the offset of its chunk (None: the whole tensor). Equal to
    DCP's ``MetadataIndex`` in what it names."""

    fqn: str
    offset: tuple[int, ...] | None = None


@dataclass(frozen=True)
class ChunkMeta:
    """One chunk of a stored tensor: where it starts in each dimension and its sizes."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]


@dataclass(frozen=True)
class TensorProps:
    dtype: torch.dtype


@dataclass
class TensorMeta:
    """A stored tensor: its whole size, dtype (``properties.dtype``, as DCP spells it) and chunks."""

    size: tuple[int, ...]
    properties: TensorProps
    chunks: list[ChunkMeta] = field(default_factory=list)


@dataclass(frozen=True)
class PieceInfo:
    """Where a piece's bytes are: file, byte range, checksum (None: an earlier version wrote it)."""

    relative_path: str
    offset: int
    length: int
    checksum: int | None = None


@dataclass
class StoredMetadata:
    """A checkpoint's metadata file: every tensor, and where each of its pieces is stored."""

    state_dict_metadata: dict[str, TensorMeta]
    storage_data: dict[PieceIndex, PieceInfo]
    version: Any = None


def piece_checksum(fqn: str, offset: Any, data: bytes | memoryview) -> int:
    """CRC32C of a stored piece's bytes, seeded with its name and offset (so a piece moved to another name
    or offset no longer matches)."""
    import crc32c

    key = f"{fqn}@{list(offset) if offset is not None else None}".encode()
    return crc32c.crc32c(data, crc32c.crc32c(key))


def _ints(value: Any, what: str, path: Path) -> list[int]:
    if not isinstance(value, list) or not all(type(v) is int and v >= 0 for v in value):
        raise ZerotopoError(
            f"{path}: {what} must be a list of non-negative integers, found {str(value)[:80]}"
        )
    return value


def metadata_from_json(raw: Any, path: Path) -> StoredMetadata:
    """The metadata from :func:`zerotopo.checkpoint.dcpio.metadata_to_json`'s dict, every field checked."""
    if not isinstance(raw, dict) or raw.get("format") != METADATA_FORMAT:
        raise ZerotopoError(f'{path}: not a zerotopo DCP metadata file (no "format": "{METADATA_FORMAT}")')
    tensors, storage = raw.get("tensors"), raw.get("storage")
    if not isinstance(tensors, dict) or not isinstance(storage, list):
        raise ZerotopoError(f'{path}: "tensors" must be an object and "storage" a list')
    sd_md: dict[str, Any] = {}
    for fqn, m in tensors.items():
        if not isinstance(m, dict) or m.get("dtype") not in _DTYPES or not isinstance(m.get("chunks"), list):
            raise ZerotopoError(f'{path}: tensor {fqn!r}: needs a known "dtype", "size" and "chunks"')
        size = _ints(m.get("size"), f"tensor {fqn!r} size", path)
        chunks = []
        for c in m["chunks"]:
            if not isinstance(c, dict):
                raise ZerotopoError(f"{path}: tensor {fqn!r}: a chunk is not an object")
            offs = _ints(c.get("offsets"), f"tensor {fqn!r} chunk offsets", path)
            sizes = _ints(c.get("sizes"), f"tensor {fqn!r} chunk sizes", path)
            if (
                len(offs) != len(size)
                or len(sizes) != len(size)
                or any(o + s > n for o, s, n in zip(offs, sizes, size))
            ):
                raise ZerotopoError(
                    f"{path}: tensor {fqn!r}: chunk at {offs} of {sizes} does not lie inside its size {size}"
                )
            chunks.append(ChunkMeta(offsets=tuple(offs), sizes=tuple(sizes)))
        sd_md[fqn] = TensorMeta(size=tuple(size), properties=TensorProps(_DTYPES[m["dtype"]]), chunks=chunks)
    storage_data = {}
    for s in storage:
        if not isinstance(s, dict) or not isinstance(s.get("fqn"), str) or s["fqn"] not in sd_md:
            raise ZerotopoError(f"{path}: a storage entry names no stored tensor: {str(s)[:80]}")
        file = s.get("file")
        if not isinstance(file, str) or not _DATA_FILE.match(file):
            raise ZerotopoError(
                f"{path}: storage entry of {s['fqn']!r} names file {str(file)[:60]!r}; "
                "data files are plain *.distcp names inside the checkpoint directory"
            )
        offset = (
            _ints(s.get("offset"), f"storage offset of {s['fqn']!r}", path)
            if s.get("offset") is not None
            else None
        )
        (byte_offset, length) = (s.get("byte_offset"), s.get("length"))
        if type(byte_offset) is not int or type(length) is not int or byte_offset < 0 or length < 0:
            raise ZerotopoError(f"{path}: storage entry of {s['fqn']!r} has a bad byte range")
        transforms = s.get("transforms") or []
        if transforms:
            raise ZerotopoError(
                f"{path}: storage entry of {s['fqn']!r} names stream transforms; none are supported"
            )
        checksum = s.get(CHECKSUM)
        if checksum is not None and (type(checksum) is not int or not 0 <= checksum < 2**32):
            raise ZerotopoError(
                f"{path}: storage entry of {s['fqn']!r} has a bad {CHECKSUM} {str(checksum)[:20]!r}"
            )
        index = PieceIndex(s["fqn"], tuple(offset) if offset is not None else None)
        storage_data[index] = PieceInfo(file, byte_offset, length, checksum=checksum)
    return StoredMetadata(
        state_dict_metadata=sd_md, storage_data=storage_data, version=raw.get("dcp_version")
    )


def read_metadata_file(directory: Path) -> StoredMetadata:
    path = Path(directory) / METADATA_FILE
    raw = read_json_object(path, "the checkpoint is incomplete (its save did not finish)")
    return metadata_from_json(raw, path)


def open_data_file(path: Path):
    """A checkpoint data file opened for reading; refused when it is a link or not a regular file (a
    checkpoint never points outside its directory)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        if os.path.islink(path):
            raise ZerotopoError(
                f"{path} is a symbolic link; a checkpoint's files must be regular files inside its "
                "directory (copy the file there instead of linking it)"
            ) from None
        raise ZerotopoError(f"{path}: cannot open checkpoint data ({exc.strerror or exc})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ZerotopoError(f"{path} is not a regular file; a checkpoint's data files are regular files")
    return os.fdopen(fd, "rb")


def read_piece(f, path: Path, index: Any, info: Any, md: Any) -> torch.Tensor:
    """One stored piece from the open data file ``f``: its checksum, then its dtype and element count
    against the metadata ``md`` (see [Note: checked pieces])."""
    where = f"{path}: piece {index.fqn}" + (f" at {index.offset[0]}" if index.offset else "")
    f.seek(info.offset)
    data = f.read(info.length)
    if len(data) != info.length:
        raise ZerotopoError(f"{where} is truncated ({len(data)} of {info.length} bytes); the file is damaged")
    checksum = getattr(info, "checksum", None)
    if checksum is not None and piece_checksum(index.fqn, index.offset, data) != checksum:
        raise ZerotopoError(
            f"{where}: the {CHECKSUM} checksum does not match; the file is damaged (restore it or load an "
            "earlier checkpoint)"
        )
    try:
        tensor = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a damaged piece becomes one error naming the file
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        if "Weights only load failed" in first or "weights_only" in first:
            first = "it holds objects other than tensors, which zerotopo never unpickles"
        raise ZerotopoError(f"{where}: cannot read checkpoint data ({first}); the file is damaged") from None
    if not isinstance(tensor, torch.Tensor):
        raise ZerotopoError(f"{where} is not a tensor; the file is damaged")
    tmd = md.state_dict_metadata[index.fqn]
    sizes = _chunk_sizes(tmd, index)
    if tensor.dtype != tmd.properties.dtype:
        raise ZerotopoError(
            f"{where} holds {str(tensor.dtype).removeprefix('torch.')}, the metadata says "
            f"{_DTYPE_NAMES[tmd.properties.dtype]}; the file is damaged or not this checkpoint's"
        )
    if tuple(tensor.shape) != sizes:
        raise ZerotopoError(
            f"{where} holds {tensor.numel()} elements (shape {tuple(tensor.shape)}), the metadata says "
            f"{sizes}; the file is damaged or not this checkpoint's"
        )
    _check_values(where, index.fqn, tensor)
    return tensor


def _check_values(where: str, fqn: str, tensor: torch.Tensor) -> None:
    """Optimizer state (``param/`` and every per-element state of the optimizer table) is finite (no
    checkpoint is written from non-finite state), and the states that are never negative by construction
    (Adam's second moment ``exp_avg_sq``, Adagrad's ``sum``, RMSprop's ``square_avg``, Adamax's
    ``exp_inf``, ...) hold no negative value (one means the states were swapped or damaged)."""
    kind = fqn.split("/", 1)[0]
    if (kind != "param" and kind not in state_names()) or not tensor.is_floating_point():
        return
    if tensor.numel() == 0:
        return
    # One pass (aminmax propagates NaN, and an Inf is an extreme): the exact count only for the message.
    lo, hi = (float(v) for v in torch.aminmax(tensor))
    if not (math.isfinite(lo) and math.isfinite(hi)):
        bad = int((~torch.isfinite(tensor)).sum())
        raise ZerotopoError(f"{where} holds {bad} non-finite values (NaN or Inf); the checkpoint is damaged")
    if kind in NON_NEGATIVE and lo < 0:
        raise ZerotopoError(
            f"{where} holds negative values, impossible for {NON_NEGATIVE[kind]} (swapped with another "
            "state or damaged); the checkpoint is damaged"
        )


def _chunk_sizes(tmd: Any, index: Any) -> tuple[int, ...]:
    """The sizes of the chunk a storage entry holds (the whole tensor for an entry without offset)."""
    if index.offset is None:
        return tuple(tmd.size)
    for c in tmd.chunks:
        if tuple(c.offsets) == tuple(index.offset):
            return tuple(c.sizes)
    raise ZerotopoError(f"the checkpoint metadata has no chunk of {index.fqn} at {list(index.offset)}")
