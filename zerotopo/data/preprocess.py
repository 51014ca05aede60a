"""jsonl text to a NeoX mmap indexed dataset (what NeoX's ``tools/preprocess_data.py`` does, one process).

Each line of the input is a JSON object; its ``json_key`` field (``text``) is tokenized as one document,
optionally followed by the end-of-document token, and appended to ``PREFIX.bin`` / ``PREFIX.idx``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass

from zerotopo.data.indexed import IndexedDatasetBuilder, best_dtype
from zerotopo.data.tokenizers import Tokenizer
from zerotopo.errors import ZerotopoError, short


@dataclass(frozen=True)
class PreprocessStats:
    """What a preprocessing run wrote."""

    prefix: str
    """Output prefix (``.bin`` / ``.idx`` appended)."""
    documents: int
    """Documents written (empty texts are skipped, as NeoX does)."""
    tokens: int
    """Tokens written, end-of-document tokens included."""
    dtype: str
    """numpy dtype of the token ids on disk."""


def read_jsonl(path: str, json_key: str = "text") -> Iterator[str]:
    """The ``json_key`` text of every line; errors name the file and line number."""
    if not os.path.isfile(path):
        raise ZerotopoError(f"input {path} does not exist; give a .jsonl file with one JSON object per line")
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ZerotopoError(
                    f"{path}:{lineno}: not UTF-8 text (byte {exc.start} of the line); save the file as UTF-8"
                ) from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ZerotopoError(
                    f"{path}:{lineno}: not valid JSON ({exc.msg}); each line must be one JSON object"
                ) from None
            except RecursionError:
                raise ZerotopoError(
                    f"{path}:{lineno}: JSON nested too deeply; each line must be one flat object"
                ) from None
            if not isinstance(record, dict) or json_key not in record:
                found = (
                    short(", ".join(map(str, record)), 120).strip("'")
                    if isinstance(record, dict)
                    else type(record).__name__
                )
                raise ZerotopoError(
                    f"{path}:{lineno}: no {json_key!r} field (found: {found or 'nothing'}); pass --json-key to name "
                    "the field that holds the text"
                )
            text = record[json_key]
            if not isinstance(text, str):
                raise ZerotopoError(
                    f"{path}:{lineno}: field {json_key!r} is {type(text).__name__}, expected a string"
                )
            yield text


def preprocess_jsonl(
    input_path: str | os.PathLike,
    output_prefix: str | os.PathLike,
    tokenizer: Tokenizer,
    *,
    json_key: str = "text",
    append_eod: bool = True,
    progress: bool = False,
) -> PreprocessStats:
    """Tokenize ``input_path`` into ``output_prefix.{bin,idx}``; returns what was written."""
    input_path, output_prefix = os.fspath(input_path), os.fspath(output_prefix)
    texts = read_jsonl(input_path, json_key)
    if progress:
        from tqdm import tqdm

        texts = tqdm(texts, desc=f"tokenizing {os.path.basename(input_path)}", unit=" docs")
    dtype = best_dtype(tokenizer.vocab_size)
    parent = os.path.dirname(os.path.abspath(output_prefix))
    os.makedirs(parent, exist_ok=True)
    builder = IndexedDatasetBuilder(output_prefix, dtype)
    documents = tokens = 0
    try:
        for text in texts:
            ids = tokenizer.encode(text)
            if not ids:
                continue
            if append_eod:
                ids.append(tokenizer.eod)
            builder.add_document(ids)
            documents += 1
            tokens += len(ids)
        if documents == 0:
            raise ZerotopoError(f"{input_path} has no non-empty {json_key!r} texts; nothing to write")
    except BaseException:
        builder.abort()
        raise
    builder.finalize()
    return PreprocessStats(prefix=output_prefix, documents=documents, tokens=tokens, dtype=str(builder.dtype))
