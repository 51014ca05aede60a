"""GPT training samples from indexed datasets: NeoX's packing, splits, shuffling, and per-rank micro-batches.

[Note: packing] As in NeoX's ``GPT2Dataset``, the documents of a split are shuffled (once per epoch, by
seed) and read as one token stream; sample ``i`` is stream positions ``i·s .. i·s + s`` inclusive, i.e.
``s + 1`` tokens (inputs and shifted targets), so consecutive samples share one token and documents are
cut across sample boundaries. Three index arrays describe it:

- ``doc_idx``    the epochs' shuffled document order;
- ``sample_idx`` ``[num_samples + 1, 2]``: (position in ``doc_idx``, token offset) where each sample starts;
- ``shuffle_idx`` a permutation of the samples.

They depend only on (documents, seed, seq_length, num_samples) and are cached as ``.npy`` files beside the
data, so every rank and every restart reads the same samples in the same order.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from zerotopo.data.indexed import MMapIndexedDataset
from zerotopo.errors import ZerotopoError
from zerotopo.fsutil import atomic_write

SPLIT_NAMES = ("train", "valid", "test")


def parse_split(split: str | Sequence[float]) -> tuple[float, ...]:
    """``"969,30,1"`` (or weights) to three fractions summing to 1."""
    parts = split.split(",") if isinstance(split, str) else list(split)
    try:
        weights = [float(p) for p in parts]
    except ValueError:
        raise ZerotopoError(f'split {split!r}: expected comma-separated weights like "969,30,1"') from None
    weights = (weights + [0.0, 0.0, 0.0])[:3]
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ZerotopoError(
            f'split {split!r}: expected non-negative weights with a positive sum, like "969,30,1"'
        )
    return tuple(w / sum(weights) for w in weights)


def split_documents(num_docs: int, split: str | Sequence[float]) -> list[tuple[int, int]]:
    """``[start, end)`` document ranges of train/valid/test, rounded as NeoX rounds them."""
    bounds = [0]
    for frac in parse_split(split):
        bounds.append(bounds[-1] + int(round(frac * num_docs)))
    diff = bounds[-1] - num_docs
    bounds = [0] + [b - diff for b in bounds[1:]]
    return [(bounds[i], bounds[i + 1]) for i in range(3)]


def _build_indices(
    sizes: np.ndarray, documents: np.ndarray, seq_length: int, num_samples: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """doc_idx, sample_idx and shuffle_idx (see [Note: packing])."""
    tokens_per_epoch = int(sizes[documents].sum(dtype=np.int64))
    if tokens_per_epoch <= 1:
        raise ZerotopoError(
            f"the split's {len(documents)} documents hold {tokens_per_epoch} tokens; need at least 2"
        )
    epochs = 1
    while (epochs * tokens_per_epoch - 1) // seq_length < num_samples:
        epochs += 1
    rng = np.random.RandomState(seed)
    doc_idx = np.concatenate([rng.permutation(documents) for _ in range(epochs)]).astype(np.int64)
    starts = np.zeros(len(doc_idx) + 1, dtype=np.int64)
    np.cumsum(sizes[doc_idx], out=starts[1:])
    positions = np.arange(num_samples + 1, dtype=np.int64) * seq_length
    # side="right" then -1: the last document starting at or before the position, skipping empty ones.
    where = np.searchsorted(starts, positions, side="right") - 1
    sample_idx = np.stack([where, positions - starts[where]], axis=1)
    shuffle_idx = rng.permutation(num_samples).astype(np.int64)
    return doc_idx, sample_idx, shuffle_idx


def _save_atomic(path: str, array: np.ndarray) -> None:
    # Concurrent ranks write identical files; the last rename wins, readers see whole files.
    with atomic_write(path, "wb") as f:
        np.save(f, array, allow_pickle=False)


class GPTDataset:
    """Samples of ``seq_length + 1`` token ids packed across the documents ``documents`` of ``indexed``."""

    def __init__(
        self,
        name: str,
        indexed: MMapIndexedDataset,
        documents: np.ndarray,
        seq_length: int,
        num_samples: int,
        seed: int,
        *,
        cache: bool = True,
    ):
        if num_samples < 1 or seq_length < 1:
            raise ZerotopoError(
                f"{name}: num_samples {num_samples} and seq_length {seq_length} must be positive"
            )
        self.name, self.indexed, self.seq_length, self.num_samples = name, indexed, seq_length, num_samples
        docs = np.asarray(documents, dtype=np.int64)
        self._documents = docs
        # The document range goes into the key too, so a different split never reuses another's indices.
        digest = hashlib.sha1(docs.tobytes()).hexdigest()[:10]
        self.cache_prefix = f"{indexed.prefix}_{name}_{num_samples}ns_{seq_length}sl_{seed}s_{digest}"
        arrays = self._load_cached() if cache else None
        self.cache_hit = arrays is not None
        if arrays is None:
            arrays = _build_indices(indexed.sizes, docs, seq_length, num_samples, seed)
            if cache:
                self._store(arrays)
        self.doc_idx, self.sample_idx, self.shuffle_idx = arrays

    def _paths(self) -> list[str]:
        return [f"{self.cache_prefix}_{part}.npy" for part in ("doc_idx", "sample_idx", "shuffle_idx")]

    def _load_cached(self) -> tuple[np.ndarray, ...] | None:
        """The cached index arrays if all three are there and valid for this dataset, else None (they
        are rebuilt): a stale, truncated or planted cache is never used."""
        paths = self._paths()
        if not all(os.path.isfile(p) for p in paths):
            return None
        try:
            arrays = tuple(np.load(p, mmap_mode="r", allow_pickle=False) for p in paths)
        except (OSError, ValueError, EOFError):
            return None
        return arrays if self._valid_cache(*arrays) else None

    def _valid_cache(self, doc_idx: np.ndarray, sample_idx: np.ndarray, shuffle_idx: np.ndarray) -> bool:
        """Shapes, dtypes and ranges of cached indices agree with this dataset and split."""
        n = self.num_samples
        if not (
            doc_idx.dtype == np.int64
            and doc_idx.ndim == 1
            and doc_idx.size > 0
            and sample_idx.dtype == np.int64
            and sample_idx.shape == (n + 1, 2)
            and shuffle_idx.dtype == np.int64
            and shuffle_idx.shape == (n,)
        ):
            return False
        docs = self._documents
        if len(docs) == 0 or doc_idx.min() < docs.min() or doc_idx.max() > docs.max():
            return False
        if shuffle_idx.min() < 0 or shuffle_idx.max() >= n:
            return False
        where, offset = sample_idx[:, 0], sample_idx[:, 1]
        if where.min() < 0 or where.max() >= len(doc_idx) or (np.diff(where) < 0).any():
            return False
        sizes = self.indexed.sizes[np.asarray(doc_idx[where])]
        return bool(((offset >= 0) & (offset <= sizes)).all())

    def _store(self, arrays: tuple[np.ndarray, ...]) -> None:
        try:
            for path, array in zip(self._paths(), arrays):
                _save_atomic(path, array)
        except OSError:
            pass  # a read-only data directory: the indices are rebuilt next time, which is only slower

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, i: int) -> np.ndarray:
        """Sample ``i`` (after shuffling): ``seq_length + 1`` token ids as int64."""
        j = int(self.shuffle_idx[i])
        (first, start), (last, end) = self.sample_idx[j], self.sample_idx[j + 1]
        docs = self.doc_idx
        if first == last:
            return self.indexed.get(int(docs[first]), int(start), int(end - start + 1)).astype(np.int64)
        pieces = [self.indexed.get(int(docs[first]), int(start))]
        pieces += [self.indexed.get(int(docs[k])) for k in range(first + 1, last)]
        pieces.append(self.indexed.get(int(docs[last]), 0, int(end) + 1))
        return np.concatenate(pieces).astype(np.int64)


class BlendedDataset:
    """Samples drawn from several :class:`GPTDataset` in proportion to ``weights``, interleaved evenly and
    deterministically (each dataset's ``j``-th sample sits at its ideal position ``(j + ½) / weight``)."""

    def __init__(self, name: str, datasets: Sequence[GPTDataset], weights: Sequence[float], num_samples: int):
        w = np.asarray(weights, dtype=np.float64)
        w = w / w.sum()
        counts = [min(len(ds), int(np.ceil(wk * num_samples))) for ds, wk in zip(datasets, w)]
        positions = np.concatenate([(np.arange(n) + 0.5) / wk for n, wk in zip(counts, w)])
        owners = np.concatenate([np.full(n, k, dtype=np.int64) for k, n in enumerate(counts)])
        local = np.concatenate([np.arange(n, dtype=np.int64) for n in counts])
        order = np.argsort(positions, kind="stable")[:num_samples]
        self.name, self.datasets = name, list(datasets)
        self.dataset_index, self.dataset_sample_index = owners[order], local[order]
        self.cache_hit = all(ds.cache_hit for ds in datasets)

    def __len__(self) -> int:
        return len(self.dataset_index)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.datasets[int(self.dataset_index[i])][int(self.dataset_sample_index[i])]


SampleDataset = GPTDataset | BlendedDataset


def _build_one(
    prefix: str, split, seq_length: int, num_samples, seed: int, cache: bool
) -> list[GPTDataset | None]:
    indexed = MMapIndexedDataset(prefix)
    out: list[GPTDataset | None] = []
    for name, (start, end), n in zip(SPLIT_NAMES, split_documents(len(indexed), split), num_samples):
        docs = np.arange(start, end, dtype=np.int64)
        # A validation or test split too small to hold one sample is skipped (None), as NeoX skips it;
        # an empty train split is an error (build_train_valid_test).
        if end <= start or n <= 0 or (name != "train" and indexed.sizes[docs].sum(dtype=np.int64) <= 1):
            out.append(None)
            continue
        out.append(GPTDataset(name, indexed, docs, seq_length, n, seed, cache=cache))
    return out


def build_train_valid_test(
    data_prefix: str | Sequence[str],
    split: str | Sequence[float],
    seq_length: int,
    num_samples: tuple[int, int, int],
    seed: int,
    *,
    cache: bool = True,
) -> tuple[SampleDataset | None, SampleDataset | None, SampleDataset | None]:
    """Train, valid and test datasets over consecutive document ranges (NeoX's ``split``) of one indexed
    dataset, or of several blended by their token counts; a split with no documents or no requested
    samples is None."""
    prefixes = [data_prefix] if isinstance(data_prefix, str) else list(data_prefix)
    if len(prefixes) == 1:
        out = _build_one(prefixes[0], split, seq_length, num_samples, seed, cache)
    else:
        # Each part is asked for its share with some slack, so rounding never leaves the blend short.
        indexed = [MMapIndexedDataset(p) for p in prefixes]
        total = sum(ix.num_tokens for ix in indexed)
        parts = [
            _build_one(
                p,
                split,
                seq_length,
                [int(n * ix.num_tokens / total * 1.005) + 1 if n else 0 for n in num_samples],
                seed,
                cache,
            )
            for p, ix in zip(prefixes, indexed)
        ]
        out = []
        for k, name in enumerate(SPLIT_NAMES):
            members = [(part[k], ix.num_tokens) for part, ix in zip(parts, indexed) if part[k] is not None]
            out.append(
                BlendedDataset(name, [m for m, _ in members], [w for _, w in members], num_samples[k])
                if members and num_samples[k] > 0
                else None
            )
    if num_samples[0] > 0 and out[0] is None:
        raise ZerotopoError(
            f"{data_prefix}: the train split {split!r} is empty; give the train split more weight or use more documents"
        )
    return out[0], out[1], out[2]


class DistributedBatches:
    """Micro-batches of one data-parallel rank: ``LongTensor[micro_batch, seq_length + 1]``.

    Global micro-batch ``t`` is samples ``start + t·B·W ... start + (t+1)·B·W - 1`` (``B`` micro-batch,
    ``W`` ranks); rank ``r`` reads the ``r``-th block of ``B``. So the ranks read disjoint samples, and
    ``W`` ranks see exactly the samples one rank sees over ``W`` consecutive micro-batches. Iteration stops
    when a whole global micro-batch no longer fits, unless ``cycle`` wraps around the dataset.
    """

    def __init__(
        self,
        dataset: SampleDataset,
        micro_batch: int,
        dp_rank: int,
        dp_world: int,
        start_sample: int = 0,
        *,
        cycle: bool = False,
    ):
        if not 0 <= dp_rank < dp_world or micro_batch < 1:
            raise ZerotopoError(
                f"rank {dp_rank} of {dp_world} with micro-batch {micro_batch}: not a valid layout"
            )
        if not cycle and len(dataset) < micro_batch * dp_world:
            raise ZerotopoError(
                f"{dataset.name} split has {len(dataset)} samples, fewer than one global micro-batch "
                f"({micro_batch} × {dp_world} ranks); use more data or a smaller batch"
            )
        self.dataset, self.micro_batch, self.dp_rank, self.dp_world = dataset, micro_batch, dp_rank, dp_world
        self.start_sample, self.cycle = start_sample, cycle

    def __len__(self) -> int:
        """Micro-batches left for this rank (without cycling)."""
        return max(0, (len(self.dataset) - self.start_sample) // (self.micro_batch * self.dp_world))

    def sample_indices(self, step: int) -> np.ndarray:
        """Dataset indices of this rank's ``step``-th micro-batch."""
        first = self.start_sample + step * self.micro_batch * self.dp_world + self.dp_rank * self.micro_batch
        idx = np.arange(first, first + self.micro_batch)
        return idx % len(self.dataset) if self.cycle else idx

    def __iter__(self) -> Iterator[torch.Tensor]:
        step = 0
        while self.cycle or step < len(self):
            rows = [self.dataset[int(i)] for i in self.sample_indices(step)]
            yield torch.from_numpy(np.stack(rows))
            step += 1


def blending_indices(weights: Sequence[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    """NeoX's ``build_blending_indices`` (megatron/data/helpers.cpp): sample ``i`` comes from the dataset
    furthest behind its share, ``argmax_k(weight_k · max(i, 1) - taken_k)`` (the first on ties), and is
    that dataset's next sample. Returns ``(dataset_index, dataset_sample_index)``."""
    w = [float(x) for x in weights]
    taken = [0] * len(w)
    dataset_index = np.empty(size, dtype=np.int64)
    sample_index = np.empty(size, dtype=np.int64)
    for i in range(size):
        scale = max(i, 1)
        errors = [wk * scale - tk for wk, tk in zip(w, taken)]
        k = errors.index(max(errors))
        dataset_index[i], sample_index[i] = k, taken[k]
        taken[k] += 1
    return dataset_index, sample_index


class BlendableDataset:
    """NeoX's ``BlendableDataset``: the datasets' samples interleaved by :func:`blending_indices` over the
    sum of their lengths (each was built with its share of the samples, see :func:`build_weighted_splits`)."""

    def __init__(self, name: str, datasets: Sequence[GPTDataset], weights: Sequence[float]):
        w = np.asarray(weights, dtype=np.float64)
        self.name, self.datasets, self.weights = name, list(datasets), w / w.sum()
        self.dataset_index, self.dataset_sample_index = blending_indices(
            self.weights, sum(len(d) for d in datasets)
        )
        self.cache_hit = all(ds.cache_hit for ds in datasets)

    def __len__(self) -> int:
        return len(self.dataset_index)

    def __getitem__(self, i: int) -> np.ndarray:
        ds = self.datasets[int(self.dataset_index[i])]
        return ds[int(self.dataset_sample_index[i]) % len(ds)]


def weighted_num_samples(weights: Sequence[float], num_samples: int) -> tuple[np.ndarray, list[int]]:
    """NeoX's ``get_normalized_weights_and_num_samples``: weights normalized, and each dataset asked for
    its share with 0.5% slack, ``ceil(num_samples · weight · 1.005)``."""
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    return w, [int(np.ceil(num_samples * wk * 1.005)) for wk in w]


def build_weighted_splits(
    paths: Sequence[Sequence[str] | None],
    weights: Sequence[Sequence[float] | None],
    seq_length: int,
    num_samples: tuple[int, int, int],
    seed: int,
    *,
    cache: bool = True,
) -> tuple[BlendableDataset | None, BlendableDataset | None, BlendableDataset | None]:
    """NeoX's ``build_weighted_datasets``: per split (train, valid, test) each prefix is one whole dataset
    (all its documents) asked for its weighted share of the split's samples, and the split is their
    :class:`BlendableDataset`. A split without paths, or asked for no samples, is None."""
    out: list[BlendableDataset | None] = []
    for k, name in enumerate(SPLIT_NAMES):
        prefixes, n = paths[k], num_samples[k]
        if not prefixes or n <= 0:
            out.append(None)
            continue
        w, counts = weighted_num_samples(weights[k] or [1.0] * len(prefixes), n)
        members = []
        for i, (prefix, count) in enumerate(zip(prefixes, counts)):
            indexed = MMapIndexedDataset(prefix)
            docs = np.arange(len(indexed), dtype=np.int64)
            members.append(
                GPTDataset(f"{name}_{i}", indexed, docs, seq_length, max(count, 1), seed, cache=cache)
            )
        out.append(BlendableDataset(name, members, w))
    return out[0], out[1], out[2]
