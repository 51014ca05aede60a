"""Tokenizers with one interface: ``encode(text) -> list[int]``, ``decode(ids)``, ``eod``, ``vocab_size``.

The names and behaviour follow GPT-NeoX's ``megatron/tokenizer``:

- ``GPT2BPETokenizer`` (NeoX's default): GPT-2's byte-level BPE from ``vocab_file`` (``vocab.json``) and
  ``merge_file`` (``merges.txt``), through the ``tokenizers`` library; end-of-document ``<|endoftext|>``.
- ``HFTokenizer``: a Hugging Face ``tokenizers`` JSON file, such as the ``20B_tokenizer.json`` GPT-NeoX-20B
  and Pythia were trained with.
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

TOKENIZER_TYPES = ("GPT2BPETokenizer", "HFTokenizer", "CharLevelTokenizer", "ByteTokenizer")
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

    EOD_NAMES = ("<|endoftext|>", "</s>", "<eos>", "[SEP]")

    def _find_eod(self, source: str) -> int:
        eod = next(
            (self._tok.token_to_id(n) for n in self.EOD_NAMES if self._tok.token_to_id(n) is not None), None
        )
        if eod is None:
            raise ConfigError(
                f"has none of the end-of-document tokens {', '.join(self.EOD_NAMES)}; add one to the vocabulary",
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

    def __init__(self, vocab_file: str | os.PathLike):
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
        self._eod = self._find_eod(path)


def build_tokenizer(
    tokenizer_type: str = DEFAULT_TOKENIZER,
    vocab_file: str | os.PathLike | None = None,
    merge_file: str | os.PathLike | None = None,
) -> Tokenizer:
    """The tokenizer a config names (``tokenizer_type`` / ``vocab_file`` / ``merge_file`` keys)."""
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
        return HFTokenizer(vocab_file)
    raise ConfigError(
        f"{tokenizer_type!r}: expected one of {', '.join(TOKENIZER_TYPES)}", key="tokenizer_type"
    )
