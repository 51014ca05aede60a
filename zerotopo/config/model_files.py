"""NeoX-style model files read into a model shape: what ``zerotopo plan``, ``zerotopo bench`` and the
calibration share (a name from configs/ or a path; the vocabulary from the tokenizer file when it is at
hand)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from zerotopo.config.neox import load_neox_config
from zerotopo.config.tree import TrainConfig
from zerotopo.placement.shape import ModelShape
from zerotopo.resources import resolve_config_paths

#: Embedding rows when the tokenizer is not at hand: GPT-NeoX-20B's padded vocabulary (50277 tokens).
DEFAULT_VOCAB = 50432


def resolve_model_paths(specs: list[str]) -> list[str]:
    """``neox-20b`` -> the built-in ``neox-20b.yml``; paths pass through."""
    return resolve_config_paths(specs, source="--model")


def tokenizer_vocab(path: str | None) -> int | None:
    """Token count of a Hugging Face tokenizers JSON file (vocabulary + added tokens), a GPT-2
    ``vocab.json`` or a SentencePiece ``.model``, if it exists."""
    if not path or not Path(path).is_file():
        return None
    if str(path).endswith(".model"):  # a SentencePiece model (SPMTokenizer)
        from zerotopo.data.tokenizers import SPMTokenizer

        try:
            return SPMTokenizer(path).vocab_size
        except Exception:  # noqa: BLE001 - an unreadable file says nothing about the vocabulary
            return None
    try:
        raw = json.loads(Path(path).read_text())
        if isinstance(raw, dict) and "model" not in raw and all(isinstance(v, int) for v in raw.values()):
            return len(raw)  # a GPT-2 vocab.json (GPT2BPETokenizer)
        ids = set(raw["model"]["vocab"].values()) | {t["id"] for t in raw.get("added_tokens", [])}
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
    # Ids that are not non-negative integers (a hostile or broken file) say nothing about the vocabulary.
    if not ids or not all(type(i) is int and 0 <= i < 1 << 24 for i in ids):
        return None
    return max(ids) + 1


def load_model(specs: list[str], vocab_size: int | None) -> tuple[ModelShape, TrainConfig]:
    """The model shape and training settings of NeoX-style config files."""
    paths = resolve_model_paths(specs)
    with warnings.catch_warnings():
        # keys of other subsystems are not this command's business
        warnings.simplefilter("ignore")
        args = load_neox_config(paths)
    vocab = vocab_size or tokenizer_vocab(args.data.vocab_file) or DEFAULT_VOCAB
    name = Path(paths[-1]).stem
    return args.model.model_shape(vocab, name=name), args
