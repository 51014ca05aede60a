"""``zerotopo data``: turn jsonl text into NeoX mmap indexed datasets, or describe one.

zerotopo data preprocess --input corpus.jsonl --output-prefix data/corpus --tokenizer-type ByteTokenizer
zerotopo data info data/corpus_text_document
zerotopo data corpus            # build (or find) the bundled Python-docstring corpus
"""

from __future__ import annotations

import argparse

from zerotopo.data.tokenizers import TOKENIZER_TYPES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    pre = sub.add_parser("preprocess", help="tokenize a jsonl file into PREFIX.bin / PREFIX.idx")
    pre.add_argument("--input", required=True, help="jsonl file, one JSON object per line")
    pre.add_argument("--json-key", default="text", help="field holding the text (default: text)")
    pre.add_argument("--output-prefix", required=True, help="output path without .bin/.idx")
    pre.add_argument("--tokenizer-type", default="ByteTokenizer", choices=TOKENIZER_TYPES)
    pre.add_argument("--vocab-file", help="tokenizers JSON file (HFTokenizer)")
    pre.add_argument(
        "--append-eod",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="end every document with the end-of-document token (default: on)",
    )
    pre.add_argument("--no-progress", action="store_true", help="no progress bar")
    info = sub.add_parser("info", help="print the size and dtype of an indexed dataset")
    info.add_argument("prefix", help="dataset path without .bin/.idx")
    corpus = sub.add_parser(
        "corpus", help="build the bundled corpus from Python's docstrings and print its prefix"
    )
    corpus.add_argument("--tokenizer-type", default="ByteTokenizer", choices=["ByteTokenizer"])


def run(args: argparse.Namespace) -> int:
    if args.data_command == "preprocess":
        from zerotopo.data.preprocess import preprocess_jsonl
        from zerotopo.data.tokenizers import build_tokenizer

        tokenizer = build_tokenizer(args.tokenizer_type, args.vocab_file)
        stats = preprocess_jsonl(
            args.input,
            args.output_prefix,
            tokenizer,
            json_key=args.json_key,
            append_eod=args.append_eod,
            progress=not args.no_progress,
        )
        print(
            f"wrote {stats.prefix}.bin/.idx: {stats.documents} documents, {stats.tokens} tokens, {stats.dtype}"
        )
    elif args.data_command == "info":
        from zerotopo.data.indexed import MMapIndexedDataset

        ds = MMapIndexedDataset(args.prefix)
        sizes = ds.sizes
        print(f"{args.prefix}: {len(ds)} documents, {ds.num_tokens} tokens, dtype {ds.dtype}")
        if len(ds):
            print(f"document tokens: min {sizes.min()}, mean {sizes.mean():.1f}, max {sizes.max()}")
    elif args.data_command == "corpus":
        from zerotopo.data.corpus import default_corpus_prefix

        print(default_corpus_prefix(args.tokenizer_type))
    return 0
