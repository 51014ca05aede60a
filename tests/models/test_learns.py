"""The model, config reader and data pipeline together: a tiny NeoX learns from the bundled corpus."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from zerotopo.config import load_neox_config
from zerotopo.data import DistributedBatches, build_tokenizer, build_train_valid_test, corpus
from zerotopo.models.neox import GPTNeoX

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_tiny_model_learns_corpus(tmp_path, monkeypatch):
    monkeypatch.setenv("ZEROTOPO_CACHE", str(tmp_path))
    monkeypatch.setattr(corpus, "DEFAULT_MAX_BYTES", 100_000)
    overrides = {"num_layers": 2, "hidden_size": 64, "seq_length": 32, "optimizer.params.lr": 3e-3}
    args = load_neox_config([os.path.join(ROOT, "configs", "tiny.yml")], overrides)
    tokenizer = build_tokenizer(args.data.tokenizer_type, args.data.vocab_file)
    torch.manual_seed(args.seed)
    model = GPTNeoX(args.model.model_config(tokenizer.vocab_size))
    steps, micro = 25, 8
    train, valid, _ = build_train_valid_test(
        corpus.default_corpus_prefix(),
        args.data.split,
        args.model.seq_length,
        (steps * micro, 4 * micro, 0),
        args.seed,
    )
    opt = torch.optim.AdamW(model.parameters(), lr=args.optim.lr, betas=args.optim.optimizer.betas)

    def loss_of(tokens: torch.Tensor) -> torch.Tensor:
        logits = model(tokens[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())

    def valid_loss() -> float:
        with torch.no_grad():
            return sum(loss_of(t).item() for t in DistributedBatches(valid, micro, 0, 1)) / 4

    before = valid_loss()
    for tokens in DistributedBatches(train, micro, 0, 1):
        opt.zero_grad()
        loss_of(tokens).backward()
        opt.step()
    after = valid_loss()
    assert before > 5.0  # about ln(vocab) at init
    assert after < before - 1.5, (before, after)
