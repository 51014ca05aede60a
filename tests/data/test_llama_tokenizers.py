"""The tokenizers a Llama user brings, offline: a SentencePiece ``tokenizer.model`` (NeoX's SPMTokenizer), a
``tokenizer.json`` whose end-of-document token is named (Llama 3's ``<|end_of_text|>``), and tiktoken's
encodings where the package has them; preprocessed ids equal the reference tokenizer's."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from zerotopo.cli.main import main
from zerotopo.data.indexed import MMapIndexedDataset
from zerotopo.data.tokenizers import SPMTokenizer, build_tokenizer
from zerotopo.errors import ZerotopoError

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Grouped-query attention shares keys and values between heads.",
    "naïve café, déjà vu: unicode survives tokenization",
    "Sharded data parallelism follows the machine's bandwidth tiers.",
] * 8


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory):
    """A tiny SentencePiece BPE model trained here, with Llama's special pieces (<unk>, <s>, </s>)."""
    spm = pytest.importorskip("sentencepiece")
    d = tmp_path_factory.mktemp("spm")
    corpus = d / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n")
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(d / "tokenizer"), vocab_size=120, model_type="bpe",
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, character_coverage=1.0, minloglevel=2,
    )  # fmt: skip
    return d / "tokenizer.model"


def jsonl(tmp_path, texts) -> str:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return str(path)


def documents(prefix: str) -> list[list[int]]:
    ds = MMapIndexedDataset(prefix)
    return [np.asarray(ds[i]).tolist() for i in range(len(ds))]


def test_spm_tokenizer_is_sentencepiece_and_its_eod_is_llamas_end_of_sentence(spm_model):
    import sentencepiece

    ref = sentencepiece.SentencePieceProcessor(model_file=str(spm_model))
    tok = build_tokenizer("SPMTokenizer", spm_model)
    assert isinstance(tok, SPMTokenizer) and tok.vocab_size == 120
    assert tok.eod == ref.eos_id() == 2  # no <|endoftext|> piece: </s>, not the unknown piece
    for text in TEXTS[:4]:
        assert tok.encode(text) == ref.encode(text)
        assert tok.decode(tok.encode(text)) == ref.decode(ref.encode(text))
    assert build_tokenizer("SPMTokenizer", spm_model, eod_token="<s>").eod == 1
    with pytest.raises(ZerotopoError, match="'<eot>' is not a piece"):
        build_tokenizer("SPMTokenizer", spm_model, eod_token="<eot>")
    with pytest.raises(ZerotopoError, match="not a SentencePiece model"):
        build_tokenizer("SPMTokenizer", __file__)


def test_preprocess_with_spm_gives_sentencepiece_ids(tmp_path, spm_model, capsys):
    import sentencepiece

    ref = sentencepiece.SentencePieceProcessor(model_file=str(spm_model))
    out = tmp_path / "out" / "llama"
    code = main(
        ["data", "preprocess", "--input", jsonl(tmp_path, TEXTS[:4]), "--output-prefix", str(out),
         "--tokenizer-type", "SPMTokenizer", "--vocab-file", str(spm_model), "--append-eod"]
    )  # fmt: skip
    assert code == 0, capsys.readouterr()
    assert documents(f"{out}_text_document") == [ref.encode(t) + [ref.eos_id()] for t in TEXTS[:4]]


def llama3_style_json(tmp_path) -> str:
    """A byte-level BPE tokenizer.json whose only end-of-document token is Llama 3's <|end_of_text|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(TEXTS, trainer)
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def test_llama3_end_of_text_is_found_or_named_and_preprocess_matches(tmp_path, capsys):
    from tokenizers import Tokenizer

    path = llama3_style_json(tmp_path)
    ref = Tokenizer.from_file(path)
    eot = ref.token_to_id("<|end_of_text|>")
    assert build_tokenizer("HFTokenizer", path).eod == eot  # a known name now
    named = build_tokenizer("HFTokenizer", path, eod_token="<|begin_of_text|>")
    assert named.eod == ref.token_to_id("<|begin_of_text|>")
    with pytest.raises(ZerotopoError, match="eod_token: '<\\|eot_id\\|>' is not a token"):
        build_tokenizer("HFTokenizer", path, eod_token="<|eot_id|>")
    with pytest.raises(ZerotopoError, match="fixed end-of-document token"):
        build_tokenizer("ByteTokenizer", eod_token="<|end_of_text|>")
    out = tmp_path / "out" / "l3"
    code = main(
        ["data", "preprocess", "--input", jsonl(tmp_path, TEXTS[:4]), "--output-prefix", str(out),
         "--tokenizer-type", "HFTokenizer", "--vocab-file", path, "--eod-token", "<|end_of_text|>",
         "--append-eod"]
    )  # fmt: skip
    assert code == 0, capsys.readouterr()
    want = [ref.encode(t, add_special_tokens=False).ids + [eot] for t in TEXTS[:4]]
    assert documents(f"{out}_text_document") == want


@pytest.mark.skipif(importlib.util.find_spec("tiktoken") is not None, reason="tiktoken is installed here")
def test_tiktoken_without_the_package_is_refused_with_the_way_out():
    with pytest.raises(ZerotopoError, match="TiktokenTokenizer needs the `tiktoken` package.*HFTokenizer"):
        build_tokenizer("TiktokenTokenizer", "cl100k_base")


@pytest.mark.skipif(importlib.util.find_spec("tiktoken") is None, reason="tiktoken is not installed")
def test_tiktoken_encoding_matches_tiktoken_where_it_is_available_offline():
    import tiktoken

    try:
        enc = tiktoken.get_encoding("cl100k_base")
    except Exception:  # noqa: BLE001 - no cached encoding offline: zerotopo must refuse, naming the cache
        with pytest.raises(ZerotopoError, match="TIKTOKEN_CACHE_DIR"):
            build_tokenizer("TiktokenTokenizer", "cl100k_base")
        return
    tok = build_tokenizer("TiktokenTokenizer", "cl100k_base")
    assert tok.eod == enc.eot_token and tok.encode(TEXTS[0]) == enc.encode(TEXTS[0])
