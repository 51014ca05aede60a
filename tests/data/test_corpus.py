"""The bundled corpus built from the standard library's docstrings."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from zerotopo.data import corpus
from zerotopo.data.indexed import MMapIndexedDataset
from zerotopo.errors import ConfigError


def test_documents_are_docstrings(tmp_path):
    path = str(tmp_path / "c.jsonl")
    n = corpus.write_corpus_jsonl(path, max_bytes=50_000)
    texts = [json.loads(line)["text"] for line in Path(path).read_text(encoding="utf-8").splitlines()]
    assert n == len(texts) >= 3 and all(t.startswith("# ") for t in texts)
    assert sum(len(t.encode()) for t in texts) < 50_000 + max(len(t.encode()) for t in texts)
    again = str(tmp_path / "d.jsonl")
    corpus.write_corpus_jsonl(again, max_bytes=50_000)
    assert Path(path).read_bytes() == Path(again).read_bytes()  # deterministic


def test_default_prefix_builds_once(tmp_path, monkeypatch):
    monkeypatch.setenv("ZEROTOPO_CACHE", str(tmp_path))
    monkeypatch.setattr(corpus, "DEFAULT_MAX_BYTES", 100_000)
    prefix = corpus.default_corpus_prefix()
    assert prefix.startswith(str(tmp_path / "corpus"))
    ds = MMapIndexedDataset(prefix)
    assert len(ds) >= 5 and ds.num_tokens >= 100_000
    mtime = (tmp_path / "corpus" / (prefix.rsplit("/", 1)[1] + ".bin")).stat().st_mtime_ns
    assert corpus.default_corpus_prefix() == prefix
    assert (tmp_path / "corpus" / (prefix.rsplit("/", 1)[1] + ".bin")).stat().st_mtime_ns == mtime
    with pytest.raises(ConfigError, match="ByteTokenizer"):
        corpus.default_corpus_prefix("HFTokenizer")


def _build(cache: str) -> str:
    import os

    os.environ["ZEROTOPO_CACHE"] = cache
    return corpus.default_corpus_prefix()


@pytest.mark.slow
def test_full_corpus_concurrent_builders(tmp_path):
    """Three processes asking at once get one whole corpus (a few MB of text)."""
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        prefixes = pool.map(_build, [str(tmp_path)] * 3)
    assert len(set(prefixes)) == 1
    ds = MMapIndexedDataset(prefixes[0])
    assert 500_000 < ds.num_tokens < 6_000_000 and len(ds) > 100
    assert len(list((tmp_path / "corpus").glob("*.tmp*"))) == 0
