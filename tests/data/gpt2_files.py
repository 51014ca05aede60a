"""A tiny GPT-2 style ``vocab.json`` / ``merges.txt`` pair, and GPT-2's own BPE algorithm (as in OpenAI's
``encoder.py``) as an independent reference for the tokenizer built from them."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import regex

MERGES = [
    ("Ġ", "t"),
    ("h", "e"),
    ("Ġt", "he"),
    ("l", "l"),
    ("ll", "o"),
    ("e", "r"),
    ("Ġ", "w"),
    ("o", "r"),
    ("Ġw", "or"),
    ("i", "n"),
    ("in", "g"),
    ("Ġ", "a"),
]
EOD = "<|endoftext|>"
PATTERN = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


@lru_cache
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map of the 256 bytes to printable characters."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def vocabulary() -> dict[str, int]:
    tokens = list(bytes_to_unicode().values()) + ["".join(m) for m in MERGES] + [EOD]
    return {t: i for i, t in enumerate(tokens)}


def write_gpt2_files(directory: Path) -> tuple[str, str]:
    """``vocab.json`` and ``merges.txt`` in ``directory``; returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    vocab, merges = directory / "vocab.json", directory / "merges.txt"
    vocab.write_text(json.dumps(vocabulary(), ensure_ascii=False))
    merges.write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in MERGES))
    return str(vocab), str(merges)


def reference_encode(text: str) -> list[int]:
    """GPT-2's encoder: split with its pattern, map bytes to characters, merge by rank."""
    vocab, ranks = vocabulary(), {m: i for i, m in enumerate(MERGES)}
    out = []
    for piece in PATTERN.findall(text):
        word = tuple(bytes_to_unicode()[b] for b in piece.encode("utf-8"))
        while len(word) > 1:
            pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
            best = min(pairs, key=lambda p: ranks.get(p, float("inf")))
            if best not in ranks:
                break
            merged, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and (word[i], word[i + 1]) == best:
                    merged.append(word[i] + word[i + 1])
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = tuple(merged)
        out += [vocab[t] for t in word]
    return out
