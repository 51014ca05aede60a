"""GPT-NeoX's tokenizer types: GPT2BPETokenizer from vocab.json + merges.txt (NeoX's default),
CharLevelTokenizer, and the default a config without tokenizer keys gets."""

from __future__ import annotations

import pytest

from tests.data.gpt2_files import EOD, reference_encode, vocabulary, write_gpt2_files
from zerotopo.config.neox import load_neox_config
from zerotopo.data.tokenizers import CharLevelTokenizer, GPT2BPETokenizer, build_tokenizer
from zerotopo.errors import ConfigError

TEXTS = [
    "hello the world",
    "the weather in the north, 42 ways\n\n  tabs\tand spaces ",
    "naïve café — it's done; we'll see ✓",
    "",
]


@pytest.mark.parametrize("text", TEXTS)
def test_gpt2_bpe_matches_gpt2s_own_algorithm(tmp_path, text):
    vocab, merges = write_gpt2_files(tmp_path)
    tok = build_tokenizer("GPT2BPETokenizer", vocab, merges)
    assert isinstance(tok, GPT2BPETokenizer)
    ids = tok.encode(text)
    assert ids == reference_encode(text)
    assert tok.decode(ids) == text


def test_gpt2_bpe_merges_apply_and_eod(tmp_path):
    tok = build_tokenizer("GPT2BPETokenizer", *write_gpt2_files(tmp_path))
    v = vocabulary()
    assert tok.encode(" the hello") == [v["Ġthe"], v["Ġ"], v["he"], v["llo"]]
    assert tok.eod == v[EOD] and tok.vocab_size == len(v)


def test_gpt2_bpe_errors(tmp_path):
    vocab, merges = write_gpt2_files(tmp_path)
    with pytest.raises(ConfigError, match="merge_file"):
        build_tokenizer("GPT2BPETokenizer", vocab, None)
    with pytest.raises(ConfigError, match="vocab.json"):
        build_tokenizer("GPT2BPETokenizer", tmp_path / "missing.json", merges)
    with pytest.raises(ConfigError, match="NeoX's default"):
        build_tokenizer("GPT2BPETokenizer")


def test_char_level_is_neox_s():
    tok = build_tokenizer("CharLevelTokenizer")
    assert isinstance(tok, CharLevelTokenizer)
    assert (tok.vocab_size, tok.eod) == (512, 0)
    assert tok.encode("aé") == [97, 0xC3, 0xA9]
    assert tok.decode(tok.encode("aé\n") + [tok.eod]) == "aé\n"


def test_default_tokenizer_is_neox_s(tmp_path):
    vocab, merges = write_gpt2_files(tmp_path)
    cfg = tmp_path / "c.yml"
    cfg.write_text(f"vocab_file: {vocab}\nmerge_file: {merges}\n")
    args = load_neox_config([cfg])
    assert args.data.tokenizer_type == "GPT2BPETokenizer"
    tok = build_tokenizer(args.data.tokenizer_type, args.data.vocab_file, args.data.merge_file)
    assert tok.encode("the world") == reference_encode("the world")
    # vocab_file alone (say, a tokenizers JSON without tokenizer_type) is caught when the tokenizer is built
    cfg.write_text(f"vocab_file: {vocab}\n")
    args = load_neox_config([cfg])
    with pytest.raises(ConfigError, match="merges.txt.*tokenizer_type: HFTokenizer"):
        build_tokenizer(args.data.tokenizer_type, args.data.vocab_file, args.data.merge_file)


def test_plan_reads_the_vocabulary_size_of_a_gpt2_vocab(tmp_path):
    from zerotopo.config.model_files import tokenizer_vocab

    vocab, _ = write_gpt2_files(tmp_path)
    assert tokenizer_vocab(vocab) == len(vocabulary())
