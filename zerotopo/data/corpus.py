"""A small real-text corpus that needs no download: the docstrings of this Python's standard library.

Every module of the standard library (tests and site-packages left out) becomes one document holding its
module, class and function docstrings, about 2 MB of English technical prose in all. Documents are
shuffled with a fixed seed so the validation split is not just the modules late in the alphabet. It is
written as jsonl and preprocessed into a NeoX indexed dataset in ``$ZEROTOPO_CACHE/corpus`` (default
``~/.cache/zerotopo/corpus``) the first time it is asked for; later calls return the cached prefix.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import random
import sys
import sysconfig
from collections.abc import Iterator

from zerotopo.data.indexed import dataset_exists
from zerotopo.data.preprocess import preprocess_jsonl
from zerotopo.data.tokenizers import build_tokenizer
from zerotopo.errors import ConfigError
from zerotopo.fsutil import atomic_write

CORPUS_VERSION = 1
SKIP_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})
DEFAULT_MAX_BYTES = 4_000_000


def cache_dir() -> str:
    """``$ZEROTOPO_CACHE/corpus``, else ``~/.cache/zerotopo/corpus``."""
    base = os.environ.get("ZEROTOPO_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "zerotopo")
    return os.path.join(base, "corpus")


def _module_document(path: str, module: str) -> str | None:
    """The docstrings of one module as a document, headed by the names they belong to."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return None  # a few stdlib files are templates or in other encodings
    parts: list[str] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                doc = ast.get_docstring(child)
                if doc:
                    kind = "class" if isinstance(child, ast.ClassDef) else "def"
                    parts.append(f"{kind} {name}\n{doc}")
                visit(child, name + ".")

    module_doc = ast.get_docstring(tree)
    if module_doc:
        parts.append(module_doc)
    visit(tree, "")
    return f"# {module}\n\n" + "\n\n".join(parts) if parts else None


def stdlib_documents(root: str | None = None) -> Iterator[str]:
    """One document per standard-library module with docstrings, in sorted path order."""
    root = root or sysconfig.get_paths()["stdlib"]
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            module = os.path.relpath(path, root)[:-3].replace(os.sep, ".").removesuffix(".__init__")
            doc = _module_document(path, module)
            if doc:
                yield doc


def write_corpus_jsonl(path: str, *, max_bytes: int | None = None, seed: int = 0) -> int:
    """Write the corpus as jsonl (``{"text": ...}`` per line), stopping after ``max_bytes`` of text
    (``DEFAULT_MAX_BYTES``); returns the number of documents."""
    max_bytes = DEFAULT_MAX_BYTES if max_bytes is None else max_bytes
    docs: list[str] = []
    total = 0
    for doc in stdlib_documents():
        if total >= max_bytes:
            break
        docs.append(doc)
        total += len(doc.encode("utf-8"))
    random.Random(seed).shuffle(docs)
    with atomic_write(path, "w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps({"text": doc}) + "\n")
    return len(docs)


@contextlib.contextmanager
def _file_lock(path: str) -> Iterator[None]:
    """An exclusive lock across processes (ranks started at once build the corpus once)."""
    with open(path, "a+b") as f:
        try:
            import fcntl
        except ImportError:  # Windows: the atomic renames alone keep the files whole
            yield
            return
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def default_corpus_prefix(tokenizer_type: str = "ByteTokenizer", *, progress: bool = False) -> str:
    """The prefix of the bundled corpus as an indexed dataset, built on first use (safe to call from many
    processes at once)."""
    if tokenizer_type != "ByteTokenizer":
        raise ConfigError(
            f"the bundled corpus is prepared with ByteTokenizer, not {tokenizer_type}; set data_path to a dataset "
            "made with `zerotopo data preprocess --tokenizer-type HFTokenizer`, or use ByteTokenizer",
            key="data_path",
        )
    directory = cache_dir()
    os.makedirs(directory, exist_ok=True)
    name = f"pydoc{sys.version_info.major}{sys.version_info.minor}_v{CORPUS_VERSION}"
    prefix = os.path.join(directory, f"{name}_byte_text_document")
    if dataset_exists(prefix):
        return prefix
    with _file_lock(os.path.join(directory, f"{name}.lock")):
        if not dataset_exists(prefix):  # another process may have built it while this one waited
            jsonl = os.path.join(directory, f"{name}.jsonl")
            write_corpus_jsonl(jsonl)
            preprocess_jsonl(jsonl, prefix, build_tokenizer("ByteTokenizer"), progress=progress)
    return prefix
