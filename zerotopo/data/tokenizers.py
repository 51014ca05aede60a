"""Tokenizers with one interface: ``encode(text) -> list[int]``, ``decode(ids)``, ``eod``, ``vocab_size``.

``ByteTokenizer`` needs no files (UTF-8 bytes 0-255 plus an end-of-document token 256), which is what the
default run uses. ``HFTokenizer`` reads a Hugging Face ``tokenizers`` JSON file, such as the
``20B_tokenizer.json`` GPT-NeoX-20B and Pythia were trained with.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Protocol

from zerotopo.errors import ConfigError, ZerotopoError

TOKENIZER_TYPES = ("ByteTokenizer", "HFTokenizer")


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


class HFTokenizer:
    """A Hugging Face ``tokenizers`` JSON file; end-of-document is ``<|endoftext|>`` (or ``</s>``)."""

    EOD_NAMES = ("<|endoftext|>", "</s>", "<eos>", "[SEP]")

    def __init__(self, vocab_file: str | os.PathLike):
        try:
            from tokenizers import Tokenizer as _Tokenizer
        except ImportError:
            raise ZerotopoError(
                "HFTokenizer needs the `tokenizers` package; install it with `pip install tokenizers` "
                "(or `pip install zerotopo[hf]`)"
            ) from None
        path = os.fspath(vocab_file)
        if not os.path.isfile(path):
            raise ConfigError(
                "tokenizer file not found; give vocab_file the path of a tokenizers JSON file "
                "(e.g. GPT-NeoX's 20B_tokenizer.json)",
                source=path,
                key="vocab_file",
            )
        try:
            self._tok = _Tokenizer.from_file(path)
        except Exception as exc:  # the Rust side raises a plain Exception subclass for any parse error
            raise ConfigError(f"not a tokenizers JSON file: {exc}", source=path, key="vocab_file") from None
        eod = next(
            (self._tok.token_to_id(n) for n in self.EOD_NAMES if self._tok.token_to_id(n) is not None), None
        )
        if eod is None:
            raise ConfigError(
                f"has none of the end-of-document tokens {', '.join(self.EOD_NAMES)}; add one to the vocabulary",
                source=path,
                key="vocab_file",
            )
        self._eod = eod

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


def build_tokenizer(
    tokenizer_type: str = "ByteTokenizer", vocab_file: str | os.PathLike | None = None
) -> Tokenizer:
    """The tokenizer a config names (``tokenizer_type`` / ``vocab_file`` keys)."""
    if tokenizer_type == "ByteTokenizer":
        return ByteTokenizer()
    if tokenizer_type == "HFTokenizer":
        if vocab_file is None:
            raise ConfigError(
                "HFTokenizer needs vocab_file, the path of a tokenizers JSON file", key="vocab_file"
            )
        return HFTokenizer(vocab_file)
    raise ConfigError(
        f"{tokenizer_type!r}: expected one of {', '.join(TOKENIZER_TYPES)}", key="tokenizer_type"
    )
