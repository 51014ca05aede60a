"""Training data: NeoX mmap indexed datasets, tokenizers, preprocessing, packed samples, the bundled corpus."""

from zerotopo.data.dataset import BlendedDataset, DistributedBatches, GPTDataset, build_train_valid_test
from zerotopo.data.indexed import IndexedDatasetBuilder, MMapIndexedDataset
from zerotopo.data.tokenizers import ByteTokenizer, HFTokenizer, build_tokenizer

__all__ = [
    "BlendedDataset",
    "ByteTokenizer",
    "DistributedBatches",
    "GPTDataset",
    "HFTokenizer",
    "IndexedDatasetBuilder",
    "MMapIndexedDataset",
    "build_tokenizer",
    "build_train_valid_test",
]
