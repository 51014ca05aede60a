"""jsonl text to NeoX mmap indexed datasets, as GPT-NeoX's ``tools/preprocess_data.py`` does.

Each line of each input is a JSON object; each of its ``jsonl_keys`` fields (``text``) is tokenized as one
document, optionally followed by the end-of-document token, and appended to
``<prefix>_<key>_document.bin`` / ``.idx`` (NeoX's names). Inputs are read in the order given, plain or
compressed (``.jsonl.gz``, ``.jsonl.xz``, ``.jsonl.zst`` with the ``zstandard`` package); ``workers``
processes tokenize in parallel and the documents are written in input order, so the files are the same
for any worker count. :func:`preprocess_jsonl` is the one-file, one-key form with an exact output prefix.
"""

from __future__ import annotations

import gzip
import io
import itertools
import json
import lzma
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from zerotopo.data.indexed import IndexedDatasetBuilder, best_dtype
from zerotopo.data.tokenizers import Tokenizer, build_tokenizer
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


def open_text(path: str) -> io.TextIOBase:
    """A jsonl file, plain or compressed (by its suffix: ``.gz``, ``.xz``, ``.zst``), as text."""
    if not os.path.isfile(path):
        raise ZerotopoError(f"input {path} does not exist; give a .jsonl file with one JSON object per line")
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    if path.endswith(".xz"):
        return lzma.open(path, "rt", encoding="utf-8")
    if path.endswith(".zst"):
        try:
            import zstandard
        except ImportError:
            raise ZerotopoError(
                f"{path} is zstandard-compressed; reading it needs the zstandard package "
                "(pip install zstandard), or decompress it first (zstd -d)"
            ) from None
        raw = open(path, "rb")  # noqa: SIM115 - closed with the text wrapper
        return io.TextIOWrapper(
            zstandard.ZstdDecompressor().stream_reader(raw, closefd=True), encoding="utf-8"
        )
    return open(path, encoding="utf-8")


def _numbered_lines(path: str, f: io.TextIOBase) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of a text stream; bytes that are not UTF-8 end in one error naming the line."""
    lineno = 0
    try:
        for lineno, line in enumerate(f, start=1):  # noqa: B007 - lineno is read after a decode error
            yield lineno, line
    except UnicodeDecodeError as exc:
        raise ZerotopoError(
            f"{path}:{lineno + 1}: not UTF-8 text (byte {exc.start} of a read block); save the file as UTF-8"
        ) from None


def read_records(path: str, keys: Sequence[str]) -> Iterator[tuple[str, ...]]:
    """The ``keys`` texts of every line; errors name the file and line number."""
    with open_text(path) as f:
        for lineno, line in _numbered_lines(path, f):
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
            texts = []
            for key in keys:
                if not isinstance(record, dict) or key not in record:
                    found = (
                        short(", ".join(map(str, record)), 120).strip("'")
                        if isinstance(record, dict)
                        else type(record).__name__
                    )
                    raise ZerotopoError(
                        f"{path}:{lineno}: no {key!r} field (found: {found or 'nothing'}); pass --jsonl-keys to "
                        "name the fields that hold the text"
                    )
                text = record[key]
                if not isinstance(text, str):
                    raise ZerotopoError(
                        f"{path}:{lineno}: field {key!r} is {type(text).__name__}, expected a string"
                    )
                texts.append(text)
            yield tuple(texts)


def read_jsonl(path: str, json_key: str = "text") -> Iterator[str]:
    """The ``json_key`` text of every line; errors name the file and line number."""
    for (text,) in read_records(path, [json_key]):
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


# -- NeoX's tools/preprocess_data.py ------------------------------------------------------------------------

_WORKER_TOKENIZER: Tokenizer | None = None


def _init_worker(tokenizer_args: tuple) -> None:
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = build_tokenizer(*tokenizer_args)


def _encode(texts: tuple[str, ...]) -> list[list[int]]:
    assert _WORKER_TOKENIZER is not None
    return [_WORKER_TOKENIZER.encode(t) if t else [] for t in texts]


def output_prefix_for(prefix: str, key: str) -> str:
    """NeoX's name of the dataset for one jsonl key: ``<prefix>_<key>_document``."""
    return f"{prefix}_{key}_document"


def _check_inputs(inputs: Sequence[str], jsonl_keys: Sequence[str], tokenizer_args: tuple):
    """The tokenizer, once the inputs and keys are checked: errors here, before any output or worker."""
    if not inputs:
        raise ZerotopoError("no input: give --input FILE.jsonl[,FILE2.jsonl.gz,...]")
    if len(set(jsonl_keys)) != len(jsonl_keys) or not jsonl_keys:
        raise ZerotopoError(f"--jsonl-keys {list(jsonl_keys)}: give each key once")
    tokenizer = build_tokenizer(*tokenizer_args)  # errors here, not in a worker
    for path in inputs:
        open_text(path).close()  # a missing file or codec fails before any output exists
    return tokenizer


def _text_fixer():
    """ftfy's ``fix_text`` (``--ftfy``), or an error naming the package to install."""
    try:
        from ftfy import fix_text
    except ImportError:
        raise ZerotopoError("--ftfy needs the ftfy package (pip install ftfy)") from None
    return fix_text


def _encode_all(records, tokenizer_args: tuple, workers: int):
    """``(token ids per record in input order, the worker pool or None)``."""
    if workers > 1:
        import multiprocessing as mp

        pool = mp.get_context("spawn").Pool(workers, initializer=_init_worker, initargs=(tokenizer_args,))
        return pool.imap(_encode, records, chunksize=64), pool  # imap keeps input order
    _init_worker(tokenizer_args)
    return map(_encode, records), None


def _add_documents(
    encoded, builders, documents: list[int], tokens: list[int], eod: int | None, bar, log_interval: int
) -> None:
    """Each record's non-empty texts as documents of their key's dataset (with ``eod`` appended when
    given), counted in ``documents`` and ``tokens``; progress on ``bar`` or every ``log_interval``."""
    t0 = time.perf_counter()
    for n, per_key in enumerate(encoded, start=1):
        for i, ids in enumerate(per_key):
            if not ids:
                continue  # an empty text is no document, as in NeoX
            if eod is not None:
                ids.append(eod)
            builders[i].add_document(ids)
            documents[i] += 1
            tokens[i] += len(ids)
        if bar is not None:
            bar.update(1)
        elif log_interval and n % log_interval == 0:
            dt = time.perf_counter() - t0
            print(f"processed {n} documents ({n / dt:.0f} docs/s)", flush=True)


def preprocess_neox(
    inputs: Sequence[str],
    output_prefix: str,
    *,
    tokenizer_type: str,
    vocab_file: str | None = None,
    merge_file: str | None = None,
    eod_token: str | None = None,
    jsonl_keys: Sequence[str] = ("text",),
    append_eod: bool = False,
    workers: int = 1,
    ftfy: bool = False,
    log_interval: int = 10_000,
    progress: bool = False,
) -> list[PreprocessStats]:
    """Tokenize ``inputs`` (in order) into one dataset per key, named as NeoX names them."""
    tokenizer_args = (tokenizer_type, vocab_file, merge_file, eod_token)
    tokenizer = _check_inputs(inputs, jsonl_keys, tokenizer_args)
    fix = _text_fixer() if ftfy else None
    dtype = best_dtype(tokenizer.vocab_size)
    os.makedirs(os.path.dirname(os.path.abspath(output_prefix)), exist_ok=True)
    prefixes = [output_prefix_for(output_prefix, k) for k in jsonl_keys]
    builders = [IndexedDatasetBuilder(p, dtype) for p in prefixes]
    documents, tokens = [0] * len(jsonl_keys), [0] * len(jsonl_keys)

    records = itertools.chain.from_iterable(read_records(p, jsonl_keys) for p in inputs)
    if fix is not None:
        records = (tuple(fix(t) for t in r) for r in records)
    encoded, pool = _encode_all(records, tokenizer_args, workers)
    bar = None
    if progress and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(desc="tokenizing", unit=" docs")
    try:
        eod = tokenizer.eod if append_eod else None
        _add_documents(encoded, builders, documents, tokens, eod, bar, log_interval if progress else 0)
        for key, count in zip(jsonl_keys, documents):
            if count == 0:
                raise ZerotopoError(f"{', '.join(inputs)} has no non-empty {key!r} texts; nothing to write")
    except BaseException:
        for builder in builders:
            builder.abort()
        raise
    finally:
        if pool is not None:
            pool.terminate()
        if bar is not None:
            bar.close()
    out = []
    for i, builder in enumerate(builders):
        builder.finalize()
        out.append(PreprocessStats(prefixes[i], documents[i], tokens[i], str(builder.dtype)))
    return out
