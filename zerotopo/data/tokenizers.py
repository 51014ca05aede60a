"""Tokenizers with one interface: ``encode(text) -> list[int]``, ``decode(ids)``, ``eod``, ``vocab_size``.

The names and behaviour follow GPT-NeoX's ``megatron/tokenizer``:

- ``GPT2BPETokenizer`` (NeoX's default): GPT-2's byte-level BPE from ``vocab_file`` (``vocab.json``) and
  ``merge_file`` (``merges.txt``), through the ``tokenizers`` library; end-of-document ``<|endoftext|>``.
- ``HFTokenizer``: a Hugging Face ``tokenizers`` JSON file, such as the ``20B_tokenizer.json`` GPT-NeoX-20B
  and Pythia were trained with, or a Llama ``tokenizer.json``; end-of-document is ``eod_token`` when the
  config names it, else the first of :data:`EOD_NAMES` the vocabulary has.
- ``SPMTokenizer``: a SentencePiece ``tokenizer.model`` (Llama, Llama 2, Mistral) through the
  ``sentencepiece`` package, ids as ``SentencePieceProcessor.encode`` gives them (no BOS), as NeoX's.
- ``TiktokenTokenizer``: a ``tiktoken`` encoding by name (``vocab_file: cl100k_base``), when the package and
  its encoding file are on this machine (tiktoken downloads encodings on first use; offline it needs
  ``TIKTOKEN_CACHE_DIR`` holding them).
- ``CharLevelTokenizer``: NeoX's character-level tokenizer: UTF-8 bytes as ids, id 0 as end-of-document,
  512 embedding rows.
- ``ByteTokenizer`` (zerotopo's): UTF-8 bytes 0-255 plus an end-of-document token 256; needs no files,
  which is what the default run and the bundled corpus use.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Protocol

from zerotopo.errors import ConfigError, ZerotopoError

TOKENIZER_TYPES = (
    "GPT2BPETokenizer",
    "HFTokenizer",
    "CharLevelTokenizer",
    "ByteTokenizer",
    "SPMTokenizer",
    "TiktokenTokenizer",
)
EOD_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "[SEP]")
"""End-of-document tokens looked for, in order, when the config names none (``<|end_of_text|>``: Llama 3)."""
DEFAULT_TOKENIZER = "GPT2BPETokenizer"
"""What NeoX uses when a config names no tokenizer."""


class Tokenizer(Protocol):
    """What preprocessing and training need from a tokenizer."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def eod(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens 0-255 and end-of-document as 256: any text, no vocabulary file."""

    @property
    def vocab_size(self) -> int:
        return 257

    @property
    def eod(self) -> int:
        return 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        # Special tokens (and ids out of range, e.g. from a padded vocabulary) are dropped, and a multi-byte
        # character cut at a sample boundary decodes to U+FFFD rather than failing.
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")


class CharLevelTokenizer:
    """GPT-NeoX's ``CharLevelTokenizer``: the UTF-8 bytes of the text as ids (so 1-255), end-of-document
    0, and ``vocab_size`` (NeoX builds it with 512) embedding rows."""

    def __init__(self, vocab_size: int = 512):
        self._vocab_size = vocab_size

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def eod(self) -> int:
        return 0

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        # NeoX maps each id to one character; decoding the bytes keeps multi-byte characters whole.
        return bytes(int(i) for i in ids if 0 < int(i) < 256).decode("utf-8", errors="replace")


class _TokenizersFile:
    """Shared by the tokenizers-backed types: encode/decode and the end-of-document id."""

    EOD_NAMES = EOD_NAMES

    def _find_eod(self, source: str, eod_token: str | None = None) -> int:
        if eod_token is not None:
            eod = self._tok.token_to_id(eod_token)
            if eod is None:
                raise ConfigError(
                    f"{eod_token!r} is not a token of {source}; name one of its special tokens (e.g. "
                    f"{', '.join(repr(n) for n in self.EOD_NAMES)})",
                    source=source,
                    key="eod_token",
                )
            return eod
        eod = next(
            (self._tok.token_to_id(n) for n in self.EOD_NAMES if self._tok.token_to_id(n) is not None), None
        )
        if eod is None:
            raise ConfigError(
                f"has none of the end-of-document tokens {', '.join(self.EOD_NAMES)}; name the one it has "
                "with eod_token (config) or --eod-token (preprocess), or add one to the vocabulary",
                source=source,
                key="vocab_file",
            )
        return eod

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def eod(self) -> int:
        return self._eod

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids])


def _tokenizers_module():
    try:
        import tokenizers
    except ImportError:
        raise ZerotopoError(
            "this tokenizer needs the `tokenizers` package; install it with `pip install tokenizers` "
            "(or `pip install zerotopo[hf]`)"
        ) from None
    return tokenizers


def _need_file(path: str | os.PathLike | None, key: str, what: str) -> str:
    if path is None:
        raise ConfigError(f"{what} is not set", key=key)
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ConfigError(f"file not found; {key} must be {what}", source=path, key=key)
    return path


class GPT2BPETokenizer(_TokenizersFile):
    """GPT-2's byte-level BPE (GPT-NeoX's default tokenizer) from ``vocab.json`` and ``merges.txt``.

    Built with the ``tokenizers`` library as GPT-2 defines it: byte-level pre-tokenization with GPT-2's
    split pattern and no prefix space, BPE over the merges, byte-level decoding. End-of-document is
    ``<|endoftext|>``."""

    def __init__(self, vocab_file: str | os.PathLike | None, merge_file: str | os.PathLike | None):
        tk = _tokenizers_module()
        hint = "(GPT-2's vocab.json; NeoX's GPT2BPETokenizer needs vocab_file and merge_file)"
        vocab = _need_file(vocab_file, "vocab_file", f"the path of a GPT-2 vocab.json {hint}")
        merges = _need_file(
            merge_file,
            "merge_file",
            "the path of GPT-2's merges.txt, next to vocab_file (if vocab_file is a tokenizers JSON file, "
            "set tokenizer_type: HFTokenizer)",
        )
        try:
            model = tk.models.BPE.from_file(vocab, merges)
        except Exception as exc:  # the Rust side raises a plain Exception for any parse error
            raise ConfigError(
                f"not a GPT-2 vocab.json / merges.txt pair: {exc}", source=vocab, key="vocab_file"
            ) from None
        self._tok = tk.Tokenizer(model)
        self._tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
        self._tok.decoder = tk.decoders.ByteLevel()
        self._eod = self._find_eod(vocab)


class HFTokenizer(_TokenizersFile):
    """A Hugging Face ``tokenizers`` JSON file; end-of-document is ``<|endoftext|>`` (or ``</s>``)."""

    def __init__(self, vocab_file: str | os.PathLike, eod_token: str | None = None):
        tk = _tokenizers_module()
        path = os.fspath(vocab_file)
        if not os.path.isfile(path):
            raise ConfigError(
                "tokenizer file not found; give vocab_file the path of a tokenizers JSON file "
                "(e.g. GPT-NeoX's 20B_tokenizer.json)",
                source=path,
                key="vocab_file",
            )
        try:
            self._tok = tk.Tokenizer.from_file(path)
        except Exception as exc:  # the Rust side raises a plain Exception subclass for any parse error
            raise ConfigError(f"not a tokenizers JSON file: {exc}", source=path, key="vocab_file") from None
        self._eod = self._find_eod(path, eod_token)


class SPMTokenizer:
    """GPT-NeoX's ``SPMTokenizer``: a SentencePiece model file (Llama's ``tokenizer.model``).

    End-of-document: ``eod_token`` when given, else ``<|endoftext|>`` when the model has it, else the
    model's own end-of-sentence piece (``</s>`` for Llama). NeoX takes ``<|endoftext|>`` unconditionally,
    which on Llama's model is the unknown piece (id 0); the end-of-sentence piece is what Llama was
    trained with."""

    def __init__(self, vocab_file: str | os.PathLike | None, eod_token: str | None = None):
        path = _need_file(vocab_file, "vocab_file", "the path of a SentencePiece tokenizer.model")
        try:
            import sentencepiece
        except ImportError:
            raise ZerotopoError(
                "SPMTokenizer needs the `sentencepiece` package; install it with `pip install sentencepiece` "
                "(or `pip install zerotopo[hf]`)"
            ) from None
        try:
            self._sp = sentencepiece.SentencePieceProcessor(model_file=path)
        except Exception as exc:  # noqa: BLE001 - the C++ side raises OSError or RuntimeError
            raise ConfigError(f"not a SentencePiece model: {exc}", source=path, key="vocab_file") from None
        self._eod = self._find_eod(path, eod_token)

    def _find_eod(self, path: str, eod_token: str | None) -> int:
        sp = self._sp
        for name in [eod_token] if eod_token is not None else ["<|endoftext|>"]:
            i = sp.piece_to_id(name)
            if i != sp.unk_id() or name == sp.id_to_piece(sp.unk_id()):
                return i
        if eod_token is not None:
            raise ConfigError(f"{eod_token!r} is not a piece of {path}", source=path, key="eod_token")
        if sp.eos_id() < 0:
            raise ConfigError(
                "has no <|endoftext|> and no end-of-sentence piece; name one with eod_token",
                source=path,
                key="vocab_file",
            )
        return sp.eos_id()

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    @property
    def eod(self) -> int:
        return self._eod

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self._sp.decode([int(i) for i in ids if 0 <= int(i) < self.vocab_size])


class TiktokenTokenizer:
    """GPT-NeoX's ``TiktokenTokenizer``: a ``tiktoken`` encoding named by ``vocab_file`` (``cl100k_base``);
    end-of-document is the encoding's end-of-text token (or ``eod_token``)."""

    def __init__(self, vocab_file: str | os.PathLike | None, eod_token: str | None = None):
        name = os.fspath(vocab_file) if vocab_file is not None else "cl100k_base"
        try:
            import tiktoken
        except ImportError:
            raise ZerotopoError(
                "TiktokenTokenizer needs the `tiktoken` package, which is not installed; install it and make "
                "its encoding available offline (TIKTOKEN_CACHE_DIR), or use the model's tokenizer.json with "
                "tokenizer_type: HFTokenizer"
            ) from None
        try:
            self._enc = tiktoken.get_encoding(name)
        except Exception as exc:  # noqa: BLE001 - an unknown name (ValueError) or a failed download
            raise ConfigError(
                f"tiktoken cannot load encoding {name!r} ({str(exc)[:120]}); tiktoken downloads encodings on "
                "first use, so offline set TIKTOKEN_CACHE_DIR to a directory holding it, or use the model's "
                "tokenizer.json with tokenizer_type: HFTokenizer",
                source=name,
                key="vocab_file",
            ) from None
        self._eod = self._enc.eot_token if eod_token is None else self._enc.encode_single_token(eod_token)

    @property
    def vocab_size(self) -> int:
        return self._enc.n_vocab

    @property
    def eod(self) -> int:
        return self._eod

    def encode(self, text: str) -> list[int]:
        return self._enc.encode(text, allowed_special="all")

    def decode(self, ids: Sequence[int]) -> str:
        return self._enc.decode([int(i) for i in ids])


def build_tokenizer(
    tokenizer_type: str = DEFAULT_TOKENIZER,
    vocab_file: str | os.PathLike | None = None,
    merge_file: str | os.PathLike | None = None,
    eod_token: str | None = None,
) -> Tokenizer:
    """The tokenizer a config names (``tokenizer_type`` / ``vocab_file`` / ``merge_file`` / ``eod_token``
    keys)."""
    if eod_token is not None and tokenizer_type not in ("HFTokenizer", "SPMTokenizer", "TiktokenTokenizer"):
        raise ConfigError(
            f"eod_token applies to HFTokenizer, SPMTokenizer and TiktokenTokenizer; {tokenizer_type} has a "
            "fixed end-of-document token, so remove eod_token",
            key="eod_token",
        )
    if tokenizer_type == "ByteTokenizer":
        return ByteTokenizer()
    if tokenizer_type == "CharLevelTokenizer":
        return CharLevelTokenizer(512)
    if tokenizer_type == "GPT2BPETokenizer":
        if vocab_file is None and merge_file is None:
            raise ConfigError(
                "GPT2BPETokenizer (GPT-NeoX's default when no tokenizer_type is given) needs vocab_file "
                "(GPT-2's vocab.json) and merge_file (merges.txt); set them, or name another tokenizer_type "
                "(HFTokenizer with a tokenizers JSON, CharLevelTokenizer, ByteTokenizer)",
                key="tokenizer_type",
            )
        return GPT2BPETokenizer(vocab_file, merge_file)
    if tokenizer_type == "HFTokenizer":
        if vocab_file is None:
            raise ConfigError(
                "HFTokenizer needs vocab_file, the path of a tokenizers JSON file", key="vocab_file"
            )
        return HFTokenizer(vocab_file, eod_token)
    if tokenizer_type == "SPMTokenizer":
        return SPMTokenizer(vocab_file, eod_token)
    if tokenizer_type == "TiktokenTokenizer":
        return TiktokenTokenizer(vocab_file, eod_token)
    raise ConfigError(
        f"{tokenizer_type!r}: expected one of {', '.join(TOKENIZER_TYPES)}", key="tokenizer_type"
    )
