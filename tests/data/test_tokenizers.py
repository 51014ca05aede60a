"""Byte-level and Hugging Face tokenizers behind one interface."""

from __future__ import annotations

import pytest

from zerotopo.data.tokenizers import ByteTokenizer, HFTokenizer, build_tokenizer
from zerotopo.errors import ZerotopoError


def test_byte_tokenizer_round_trip():
    tok = build_tokenizer("ByteTokenizer")
    text = "naïve café → ok"
    ids = tok.encode(text)
    assert max(ids) < 256 and len(ids) == len(text.encode())
    assert tok.decode(ids + [tok.eod]) == text
    assert (tok.vocab_size, tok.eod) == (257, 256)
    assert ByteTokenizer().decode(ids[:2]) == "na"


def hf_file(tmp_path, eod: str = "<|endoftext|>") -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, eod: 1, "hello": 2, "world": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def test_hf_tokenizer(tmp_path):
    tok = build_tokenizer("HFTokenizer", hf_file(tmp_path))
    assert isinstance(tok, HFTokenizer)
    assert tok.encode("hello world hello") == [2, 3, 2]
    assert tok.eod == 1 and tok.vocab_size == 4
    assert tok.decode([2, 3]) == "hello world"


def test_hf_tokenizer_errors(tmp_path):
    with pytest.raises(ZerotopoError, match="not found"):
        HFTokenizer(tmp_path / "nope.json")
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(ZerotopoError, match="not a tokenizers JSON"):
        HFTokenizer(tmp_path / "junk.json")
    with pytest.raises(ZerotopoError, match="end-of-document"):
        HFTokenizer(hf_file(tmp_path, eod="<sep>"))
    with pytest.raises(ZerotopoError, match="vocab_file"):
        build_tokenizer("HFTokenizer", None)
    with pytest.raises(ZerotopoError, match="GPT2BPETokenizer, HFTokenizer, CharLevelTokenizer"):
        build_tokenizer("SentencePiece")
