"""NeoX's weighted datasets (``train/valid/test_data_paths`` with ``*_data_weights``): each path's share of
the samples and NeoX's BlendableDataset interleaving; ``eod_mask_loss``; and validation splits too small to
evaluate."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from zerotopo.data.dataset import (
    blending_indices,
    build_train_valid_test,
    build_weighted_splits,
    weighted_num_samples,
)
from zerotopo.data.indexed import IndexedDatasetBuilder
from zerotopo.trainer.steps import lm_loss, usable_valid_split


def _corpus(path, first_token: int, num_docs: int = 20) -> str:
    """Documents whose tokens all lie in [first_token, first_token + 1000): any token names its corpus."""
    builder = IndexedDatasetBuilder(str(path), np.int32)
    for d in range(num_docs):
        builder.add_document(first_token + np.arange(d * 10, d * 10 + 10))
    builder.finalize()
    return str(path)


def test_blending_indices_follow_neox_helpers():
    # Worked by hand from helpers.cpp: sample i goes to argmax(w * max(i, 1) - taken), first on ties.
    index, sample = blending_indices([0.5, 0.3, 0.2], 8)
    assert index.tolist() == [0, 1, 2, 0, 1, 0, 2, 0]
    assert sample.tolist() == [0, 0, 0, 1, 1, 2, 1, 3]
    index, _ = blending_indices([0.25, 0.75], 4000)
    counts = np.bincount(index)
    assert abs(counts[0] - 1000) <= 1 and abs(counts[1] - 3000) <= 1


def test_weights_normalized_and_each_share_with_neox_slack():
    w, n = weighted_num_samples([3, 1], 1000)
    assert w.tolist() == [0.75, 0.25] and n == [754, 252]  # ceil(1000 * w * 1.005)


def test_weighted_train_and_valid_paths_blend_as_neox(tmp_path):
    a, b = _corpus(tmp_path / "a", 0), _corpus(tmp_path / "b", 1000)
    v = _corpus(tmp_path / "v", 5000, num_docs=5)
    train, valid, test = build_weighted_splits(
        [[a, b], [v], None], [[3, 1], None, None], seq_length=8, num_samples=(200, 10, 0), seed=1
    )
    assert test is None
    assert len(train) == 151 + 51  # each path's share: ceil(200 * w * 1.005)
    owners = [int(train[i][0] >= 1000) for i in range(len(train))]
    assert sum(owners) == 51 and owners[:4] == [0, 1, 0, 0]
    assert all(valid[i].min() >= 5000 for i in range(len(valid)))


def test_eod_mask_loss_drops_the_positions_after_an_end_of_document():
    torch.manual_seed(0)
    logits = torch.randn(1, 6, 11)
    inputs = torch.tensor([[3, 4, 0, 5, 6, 0]])  # 0 is the end-of-document token
    labels = torch.tensor([[4, 0, 5, 6, 0, 7]])
    per_token = F.cross_entropy(logits.reshape(-1, 11), labels.reshape(-1), reduction="none")
    keep = torch.tensor([1, 1, 0, 1, 1, 0], dtype=torch.float32)
    assert torch.allclose(lm_loss(logits, inputs, labels, eod=0), (per_token * keep).sum() / 4)
    assert torch.equal(
        lm_loss(logits, inputs, labels), F.cross_entropy(logits.reshape(-1, 11), labels.reshape(-1))
    )


class _Ctx:
    is_main, world = True, 4


def _config():
    from zerotopo.config.run_sections import DataConfig, EvalConfig
    from zerotopo.config.tree import TrainConfig

    return TrainConfig(evaluation=EvalConfig(iters=2), data=DataConfig(split=(1.0, 0.0, 0.0)))


def test_an_empty_or_tiny_validation_split_skips_evaluation(tmp_path, monkeypatch):
    import zerotopo.trainer.steps as steps

    notices: list[str] = []
    monkeypatch.setattr(steps.log, "warning", notices.append)
    prefix = _corpus(tmp_path / "c", 0, num_docs=30)
    _, valid, _ = build_train_valid_test(prefix, "100,0,0", 8, (50, 8, 1), seed=1)
    assert valid is None
    _, tiny, _ = build_train_valid_test(prefix, "29,1,0", 8, (50, 1, 1), seed=1)
    assert len(tiny) == 1
    for split in (valid, tiny):
        assert usable_valid_split(split, 2, _Ctx(), _config()) is None
    assert len(notices) == 2 and all("evaluation is skipped" in n for n in notices)
