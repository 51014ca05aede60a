"""Training data: NeoX mmap indexed datasets, tokenizers, preprocessing, packed samples, the bundled corpus.

The names below load on first use (PEP 562): the tokenizer table is read by the config parser, which
``zerotopo plan`` runs without torch, while the datasets need torch."""

from __future__ import annotations

import importlib

_WHERE = {
    "BlendedDataset": "dataset",
    "DistributedBatches": "dataset",
    "GPTDataset": "dataset",
    "build_train_valid_test": "dataset",
    "IndexedDatasetBuilder": "indexed",
    "MMapIndexedDataset": "indexed",
    "ByteTokenizer": "tokenizers",
    "HFTokenizer": "tokenizers",
    "build_tokenizer": "tokenizers",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
