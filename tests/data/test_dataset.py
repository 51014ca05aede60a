"""Packed GPT samples: every token used in order, splits, shuffling, caching, data-parallel reading."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zerotopo.data.dataset import DistributedBatches, GPTDataset, build_train_valid_test, split_documents
from zerotopo.data.indexed import IndexedDatasetBuilder, MMapIndexedDataset
from zerotopo.errors import ZerotopoError


def make_dataset(tmp_path, num_docs: int = 40, seed: int = 0) -> str:
    """Documents of varied length whose tokens are distinct, so any token says where it came from."""
    rng = np.random.RandomState(seed)
    prefix = str(tmp_path / "docs")
    builder = IndexedDatasetBuilder(prefix, np.int32)
    next_token = 0
    for _ in range(num_docs):
        n = int(rng.randint(1, 30))
        builder.add_document(np.arange(next_token, next_token + n))
        next_token += n
    builder.finalize()
    return prefix


def test_packing_uses_every_token_in_stream_order(tmp_path):
    indexed = MMapIndexedDataset(make_dataset(tmp_path))
    docs = np.arange(len(indexed))
    s = 8
    n = (indexed.num_tokens - 1) // s  # exactly one epoch
    ds = GPTDataset("train", indexed, docs, s, n, seed=3)
    assert sorted(ds.doc_idx) == list(docs)  # one epoch: a permutation of the documents
    stream = np.concatenate([indexed[int(d)] for d in ds.doc_idx])
    unshuffled = [ds[int(np.where(ds.shuffle_idx == j)[0][0])] for j in range(n)]
    for j, sample in enumerate(unshuffled):
        assert sample.shape == (s + 1,) and sample.dtype == np.int64
        np.testing.assert_array_equal(sample, stream[j * s : j * s + s + 1])
        if j:
            assert sample[0] == unshuffled[j - 1][-1]  # consecutive samples share one boundary token
    assert len(stream) - (n * s + 1) < s  # all but the final partial sample's tokens are used


def test_multiple_epochs_each_a_permutation(tmp_path):
    indexed = MMapIndexedDataset(make_dataset(tmp_path, num_docs=10))
    n = 3 * indexed.num_tokens // 8
    ds = GPTDataset("train", indexed, np.arange(10), 8, n, seed=0, cache=False)
    epochs = len(ds.doc_idx) // 10
    assert epochs >= 3 and len(ds.doc_idx) % 10 == 0
    for e in range(epochs):
        assert sorted(ds.doc_idx[e * 10 : (e + 1) * 10]) == list(range(10))
    assert all(len(ds[i]) == 9 for i in range(n))


def test_split_documents_disjoint_and_cover():
    for num_docs in (1, 7, 100, 1001):
        for split in ("969,30,1", "949,50,1", "1,1,1", "100,0,0", "8,2"):
            ranges = split_documents(num_docs, split)
            assert ranges[0][0] == 0 and ranges[-1][1] == num_docs
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert split_documents(1000, "969,30,1") == [(0, 969), (969, 999), (999, 1000)]


def test_build_train_valid_test(tmp_path):
    prefix = make_dataset(tmp_path, num_docs=100)
    train, valid, test = build_train_valid_test(prefix, "80,15,5", 8, (50, 10, 0), seed=1)
    assert test is None and len(train) == 50 and len(valid) == 10
    assert set(train.doc_idx).isdisjoint(valid.doc_idx)
    assert set(train.doc_idx) == set(range(80)) and set(valid.doc_idx) == set(range(80, 95))
    with pytest.raises(ZerotopoError, match="train split"):
        build_train_valid_test(prefix, "0,1,0", 8, (5, 0, 0), seed=1)


def test_deterministic_shuffle(tmp_path):
    prefix = make_dataset(tmp_path)
    a, _, _ = build_train_valid_test(prefix, "1,0,0", 8, (30, 0, 0), seed=5, cache=False)
    b, _, _ = build_train_valid_test(prefix, "1,0,0", 8, (30, 0, 0), seed=5, cache=False)
    c, _, _ = build_train_valid_test(prefix, "1,0,0", 8, (30, 0, 0), seed=6, cache=False)
    np.testing.assert_array_equal(np.stack([a[i] for i in range(30)]), np.stack([b[i] for i in range(30)]))
    assert not np.array_equal(a.shuffle_idx, c.shuffle_idx)


def test_index_cache_reused(tmp_path):
    prefix = make_dataset(tmp_path)
    first, _, _ = build_train_valid_test(prefix, "9,1,0", 8, (20, 4, 0), seed=2)
    assert not first.cache_hit
    files = sorted(p.name for p in tmp_path.glob("*.npy"))
    assert len(files) == 6 and all("_8sl_2s_" in f for f in files)
    again, _, _ = build_train_valid_test(prefix, "9,1,0", 8, (20, 4, 0), seed=2)
    assert again.cache_hit
    np.testing.assert_array_equal(again.shuffle_idx, first.shuffle_idx)
    np.testing.assert_array_equal(again.sample_idx, first.sample_idx)
    other, _, _ = build_train_valid_test(prefix, "8,2,0", 8, (20, 4, 0), seed=2)  # other documents
    assert not other.cache_hit


def test_dp_ranks_disjoint_and_match_one_rank(tmp_path):
    indexed = MMapIndexedDataset(make_dataset(tmp_path))
    ds = GPTDataset("train", indexed, np.arange(len(indexed)), 8, 48, seed=0, cache=False)
    world, micro = 4, 2
    per_rank = [list(DistributedBatches(ds, micro, r, world, start_sample=4)) for r in range(world)]
    assert all(len(batches) == (48 - 4) // (micro * world) for batches in per_rank)
    seen = [set(DistributedBatches(ds, micro, r, world, 4).sample_indices(0)) for r in range(world)]
    assert all(a.isdisjoint(b) for i, a in enumerate(seen) for b in seen[i + 1 :])
    single = list(DistributedBatches(ds, micro, 0, 1, start_sample=4))
    for step in range(len(per_rank[0])):
        together = torch.cat([per_rank[r][step] for r in range(world)])
        one_rank = torch.cat(single[step * world : (step + 1) * world])
        assert together.dtype == torch.int64 and together.shape == (micro * world, 9)
        assert torch.equal(together, one_rank)


def test_dp_cycle_and_errors(tmp_path):
    indexed = MMapIndexedDataset(make_dataset(tmp_path))
    ds = GPTDataset("valid", indexed, np.arange(5), 8, 3, seed=0, cache=False)
    with pytest.raises(ZerotopoError, match="fewer than one global micro-batch"):
        DistributedBatches(ds, 2, 0, 2)
    it = iter(DistributedBatches(ds, 2, 1, 2, cycle=True))
    assert [next(it).shape for _ in range(4)] == [(2, 9)] * 4
    with pytest.raises(ZerotopoError, match="not a valid layout"):
        DistributedBatches(ds, 1, 2, 2)


def test_blended_datasets_by_token_count(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    big, small = (
        make_dataset(tmp_path / "a", num_docs=60, seed=1),
        make_dataset(tmp_path / "b", num_docs=20, seed=2),
    )
    train, valid, _ = build_train_valid_test([big, small], "9,1,0", 8, (100, 10, 0), seed=0)
    assert len(train) == 100 and len(valid) == 10
    share = np.bincount(train.dataset_index, minlength=2) / 100
    tokens = [MMapIndexedDataset(p).num_tokens for p in (big, small)]
    assert share[0] == pytest.approx(tokens[0] / sum(tokens), abs=0.02)
    for i in range(100):  # every sample is the one its source dataset holds at that index
        k, j = train.dataset_index[i], train.dataset_sample_index[i]
        np.testing.assert_array_equal(train[i], train.datasets[k][j])
    pairs = set(zip(train.dataset_index.tolist(), train.dataset_sample_index.tolist()))
    assert len(pairs) == 100
    assert len(list(DistributedBatches(train, 5, 1, 4))) == 5


@pytest.mark.parametrize(
    "part, bad",
    [
        ("shuffle_idx", lambda a: a + 10_000),  # samples that do not exist
        ("sample_idx", lambda a: a[:-1]),  # one row short
        ("doc_idx", lambda a: a + 1_000),  # documents of another split
        ("shuffle_idx", lambda a: a.astype(object)),  # an object array needs pickle
        ("doc_idx", None),  # not an .npy file at all
    ],
)
def test_bad_index_cache_is_rebuilt_not_used(tmp_path, part, bad):
    prefix = make_dataset(tmp_path)
    first, _, _ = build_train_valid_test(prefix, "1,0,0", 8, (20, 0, 0), seed=3)
    expected = [first[i].tolist() for i in range(len(first))]
    path = next(tmp_path.glob(f"*_{part}.npy"))
    if bad is None:
        path.write_bytes(b"garbage, not numpy")
    else:
        np.save(path, bad(np.load(path)), allow_pickle=True)
    again, _, _ = build_train_valid_test(prefix, "1,0,0", 8, (20, 0, 0), seed=3)
    assert not again.cache_hit
    assert [again[i].tolist() for i in range(len(again))] == expected
    third, _, _ = build_train_valid_test(prefix, "1,0,0", 8, (20, 0, 0), seed=3)
    assert third.cache_hit  # the rebuilt cache was written back
