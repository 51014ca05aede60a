"""``torch.distributed.checkpoint`` (DCP) for flat shards: planners, and storage that never unpickles.

[Note: flat shards in DCP] A rank's optimizer chunk is a contiguous range of its unit's flat buffer, so
its intersection with each parameter is a contiguous range of that parameter flattened to 1-D. Each such
piece is stored as one DCP chunk of a 1-D tensor named after the parameter (``offsets=[start]``,
``sizes=[length]``, tensor size ``[numel]``): the checkpoint describes every parameter, whatever plan or
world size wrote it, and DCP's resharding (the overlap of the saved chunks with the chunks a loading
rank asks for) hands any other layout its pieces. :class:`FlatPieces` carries a rank's pieces of one
tensor; :class:`FlatSavePlanner` and :class:`FlatLoadPlanner` turn them into DCP write and read items.
Ranks that hold the same piece (optimizer replicas) plan the same item and DCP keeps one writer.

DCP's own ``FileSystemReader`` unpickles the checkpoint's ``.metadata`` (and its planner unpickles
non-tensor items). :class:`SafeWriter` writes the metadata as JSON (``dcp_metadata.json``) and
:class:`SafeReader` parses it back with every field checked; only tensors are stored, and DCP reads them
with ``torch.load(weights_only=True)``. Nothing in a checkpoint directory can run code.

[Note: checked pieces] Each rank computes, right after writing, the CRC32C (the ``crc32c`` package) of
every stored piece's bytes, seeded with the piece's name and offset, and the metadata keeps it with the
piece's byte range. A read recomputes it before anything is deserialized, then checks that the piece
holds a tensor of the metadata's dtype and element count, so a flipped bit, a piece moved to another
name (swapped Adam moments), a blob of another dtype or length all stop with an error naming the file.
Checkpoints of earlier versions carry no checksums; they are still read, with the dtype and size checks.
"""

from __future__ import annotations

import io
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadPlan,
    SavePlan,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.planner_helpers import (
    _create_chunk_list,
    _create_write_item_for_tensor,
    create_read_items_for_chunk_list,
)
from torch.futures import Future

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


@dataclass
class CheckedStorageInfo(_StorageInfo):
    """DCP's storage entry of a piece, with the checksum of its bytes (None: an earlier version wrote it)."""

    checksum: int | None = None


def piece_checksum(fqn: str, offset: Any, data: bytes | memoryview) -> int:
    """CRC32C of a stored piece's bytes, seeded with its name and offset (so a piece moved to another name
    or offset no longer matches)."""
    import crc32c

    key = f"{fqn}@{list(offset) if offset is not None else None}".encode()
    return crc32c.crc32c(data, crc32c.crc32c(key))


@dataclass
class FlatPieces:
    """This rank's pieces of a 1-D tensor of ``numel`` elements: ``(offset, tensor)`` pairs (views
    into the rank's buffers, so a load writes straight into them)."""

    numel: int
    pieces: list[tuple[int, torch.Tensor]] = field(default_factory=list)

    def piece(self, offset: int) -> torch.Tensor:
        for off, t in self.pieces:
            if off == offset:
                return t
        raise KeyError(offset)


def narrow_tensor_by_index(t: torch.Tensor, offsets, sizes) -> torch.Tensor:
    """The view of ``t`` at ``offsets`` of ``sizes`` (one per dimension)."""
    for dim, (off, size) in enumerate(zip(offsets, sizes)):
        if off != 0 or size != t.size(dim):
            t = t.narrow(dim, off, size)
    return t


def _piece_chunk(offset: int, t: torch.Tensor) -> ChunkStorageMetadata:
    return ChunkStorageMetadata(offsets=torch.Size([offset]), sizes=torch.Size([t.numel()]))


class FlatSavePlanner(DefaultSavePlanner):
    """Write items for :class:`FlatPieces` (one SHARD item per piece) and whole tensors."""

    def __init__(self) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)

    def create_local_plan(self) -> SavePlan:
        items: list[WriteItem] = []
        for fqn, obj in self.state_dict.items():
            if isinstance(obj, FlatPieces):
                for off, t in obj.pieces:
                    items.append(
                        WriteItem(
                            index=MetadataIndex(fqn, torch.Size([off])),
                            type=WriteItemType.SHARD,
                            tensor_data=TensorWriteData(
                                chunk=_piece_chunk(off, t),
                                properties=TensorProperties.create_from_tensor(t),
                                size=torch.Size([obj.numel]),
                            ),
                        )
                    )
            elif isinstance(obj, torch.Tensor):
                items.append(_create_write_item_for_tensor(fqn, obj))
            else:
                raise TypeError(
                    f"checkpoint entry {fqn!r}: only tensors are stored, got {type(obj).__name__}"
                )
        self.plan = SavePlan(items)
        return self.plan

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor:
        obj = self.state_dict[write_item.index.fqn]
        if isinstance(obj, FlatPieces):
            return obj.piece(write_item.index.offset[0]).detach().contiguous()
        return obj.detach().contiguous()


class FlatLoadPlanner(DefaultLoadPlanner):
    """Read items for :class:`FlatPieces` and whole tensors; every requested key must be stored with the
    requested size (the trainer's pre-flight checks this before any rank starts)."""

    def __init__(self) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)

    def set_up_planner(self, state_dict, metadata=None, is_coordinator: bool = False) -> None:
        self.original_state_dict = state_dict
        self.state_dict = state_dict
        self.metadata = metadata
        self.is_coordinator = is_coordinator

    def create_local_plan(self) -> LoadPlan:
        assert self.metadata is not None
        stored = self.metadata.state_dict_metadata
        requests = []
        for fqn, obj in self.state_dict.items():
            md = stored.get(fqn)
            if not isinstance(md, TensorStorageMetadata):
                raise ZerotopoError(f"the checkpoint has no tensor {fqn!r}")
            if isinstance(obj, FlatPieces):
                if tuple(md.size) != (obj.numel,):
                    raise ZerotopoError(
                        f"checkpoint tensor {fqn!r} has shape {tuple(md.size)}, this model needs ({obj.numel},)"
                    )
                chunks = [_piece_chunk(off, t) for off, t in obj.pieces]
            else:
                if tuple(md.size) != tuple(obj.shape):
                    raise ZerotopoError(
                        f"checkpoint tensor {fqn!r} has shape {tuple(md.size)}, expected {tuple(obj.shape)}"
                    )
                chunks = _create_chunk_list(obj)
            requests += create_read_items_for_chunk_list(fqn, md, chunks)
        return LoadPlan(requests)

    def resolve_tensor(self, read_item) -> torch.Tensor:
        obj = self.state_dict[read_item.dest_index.fqn]
        t = obj.piece(read_item.dest_index.offset[0]) if isinstance(obj, FlatPieces) else obj
        return narrow_tensor_by_index(t, read_item.dest_offsets, read_item.lengths)

    def load_bytes(self, read_item, value) -> None:
        raise ZerotopoError(f"checkpoint entry {read_item.dest_index.fqn!r} is not a tensor; refused")


# -- JSON metadata ------------------------------------------------------------------------------------


def metadata_to_json(md: Metadata) -> dict[str, Any]:
    tensors = {}
    for fqn, m in md.state_dict_metadata.items():
        if not isinstance(m, TensorStorageMetadata):
            raise ZerotopoError(f"checkpoint entry {fqn!r} is not a tensor; zerotopo stores tensors only")
        tensors[fqn] = {
            "dtype": _DTYPE_NAMES[m.properties.dtype],
            "size": list(m.size),
            "chunks": [{"offsets": list(c.offsets), "sizes": list(c.sizes)} for c in m.chunks],
        }
    storage = []
    for index, info in (md.storage_data or {}).items():
        storage.append(
            {
                "fqn": index.fqn,
                "offset": list(index.offset) if index.offset is not None else None,
                "file": info.relative_path,
                "byte_offset": info.offset,
                "length": info.length,
                "transforms": list(info.transform_descriptors or ()),
                CHECKSUM: getattr(info, "checksum", None),
            }
        )
    return {"format": METADATA_FORMAT, "dcp_version": md.version, "tensors": tensors, "storage": storage}


def _ints(value: Any, what: str, path: Path) -> list[int]:
    if not isinstance(value, list) or not all(type(v) is int and v >= 0 for v in value):
        raise ZerotopoError(
            f"{path}: {what} must be a list of non-negative integers, found {str(value)[:80]}"
        )
    return value


def metadata_from_json(raw: Any, path: Path) -> Metadata:
    """Rebuild DCP's :class:`Metadata` from :func:`metadata_to_json`'s dict, checking every field."""
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
            chunks.append(ChunkStorageMetadata(offsets=torch.Size(offs), sizes=torch.Size(sizes)))
        sd_md[fqn] = TensorStorageMetadata(
            properties=TensorProperties(dtype=_DTYPES[m["dtype"]]), size=torch.Size(size), chunks=chunks
        )
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
        index = MetadataIndex(s["fqn"], torch.Size(offset) if offset is not None else None)
        storage_data[index] = CheckedStorageInfo(file, byte_offset, length, checksum=checksum)
    return Metadata(state_dict_metadata=sd_md, storage_data=storage_data, version=raw.get("dcp_version"))


def read_metadata_file(directory: Path) -> Metadata:
    path = Path(directory) / METADATA_FILE
    raw = read_json_object(path, "the checkpoint is incomplete (its save did not finish)")
    return metadata_from_json(raw, path)


def _fsync_write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


class SafeWriter(FileSystemWriter):
    """DCP's file-system writer, with the metadata as JSON instead of a pickle."""

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__(path, single_file_per_rank=True, sync_files=True)

    def write_data(self, plan, planner):
        results = super().write_data(plan, planner).wait()
        checked = _with_checksums(Path(self.path), results)
        fut: Future = Future()
        fut.set_result(checked)
        return fut

    def finish(self, metadata: Metadata, results) -> None:
        storage: dict[Any, Any] = {}
        for wr_list in results:
            storage.update({wr.index: wr.storage_data for wr in wr_list})
        metadata.storage_data = storage
        metadata.storage_meta = StorageMeta()
        data = json.dumps(metadata_to_json(metadata), separators=(",", ":")).encode()
        _fsync_write(Path(self.path) / METADATA_FILE, data)


class SafeReader(FileSystemReader):
    """DCP's file-system reader, reading :data:`METADATA_FILE` (JSON) and naming the file of any failed
    read."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        md = read_metadata_file(Path(self.path))
        md.storage_meta = StorageMeta(load_id=self.load_id)
        return md

    def set_up_storage_reader(self, metadata: Metadata, *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_reader(metadata, *args, **kwargs)
        self._md = metadata

    def read_data(self, plan, planner):
        by_file: dict[str, list] = {}
        for item in plan.items:
            by_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        step_dir = Path(self.path)
        for name, items in by_file.items():
            with open_data_file(step_dir / name) as f:
                pieces: dict[Any, torch.Tensor] = {}  # each stored piece read and checked once
                for item in items:
                    index = item.storage_index
                    if index not in pieces:
                        pieces[index] = read_piece(
                            f, step_dir / name, index, self.storage_data[index], self._md
                        )
                    src = narrow_tensor_by_index(pieces[index], item.storage_offsets, item.lengths)
                    target = planner.resolve_tensor(item).detach()
                    target.copy_(src)
                    planner.commit_tensor(item, target)
        fut: Future = Future()
        fut.set_result(None)
        return fut


def _with_checksums(directory: Path, results: list) -> list:
    """``results`` (this rank's DCP write results) with the checksum of each piece's bytes, read back
    from the files just written (still in the page cache)."""
    out = []
    handles: dict[str, Any] = {}
    try:
        for wr in results:
            info = wr.storage_data
            f = handles.get(info.relative_path)
            if f is None:
                f = handles[info.relative_path] = open(directory / info.relative_path, "rb")  # noqa: SIM115
            f.seek(info.offset)
            data = f.read(info.length)
            checked = CheckedStorageInfo(
                info.relative_path, info.offset, info.length, info.transform_descriptors,
                checksum=piece_checksum(wr.index.fqn, wr.index.offset, data),
            )  # fmt: skip
            out.append(type(wr)(index=wr.index, size_in_bytes=wr.size_in_bytes, storage_data=checked))
    finally:
        for f in handles.values():
            f.close()
    return out


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


def read_piece(f, path: Path, index: MetadataIndex, info: Any, md: Metadata) -> torch.Tensor:
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
    bad = int((~torch.isfinite(tensor)).sum())
    if bad:
        raise ZerotopoError(f"{where} holds {bad} non-finite values (NaN or Inf); the checkpoint is damaged")
    if kind in NON_NEGATIVE and bool((tensor < 0).any()):
        raise ZerotopoError(
            f"{where} holds negative values, impossible for {NON_NEGATIVE[kind]} (swapped with another "
            "state or damaged); the checkpoint is damaged"
        )


def _chunk_sizes(tmd: TensorStorageMetadata, index: MetadataIndex) -> tuple[int, ...]:
    """The sizes of the chunk a storage entry holds (the whole tensor for an entry without offset)."""
    if index.offset is None:
        return tuple(tmd.size)
    for c in tmd.chunks:
        if tuple(c.offsets) == tuple(index.offset):
            return tuple(c.sizes)
    raise ZerotopoError(f"the checkpoint metadata has no chunk of {index.fqn} at {list(index.offset)}")
