"""``zerotopo data``: turn jsonl text into NeoX mmap indexed datasets, or describe one.

``preprocess`` takes GPT-NeoX's ``tools/preprocess_data.py`` arguments and names its outputs as NeoX does,
so NeoX recipes work with the command renamed:

zerotopo data preprocess --input pile_00.jsonl.gz,pile_01.jsonl.gz --output-prefix data/pile \\
    --tokenizer-type GPT2BPETokenizer --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt \\
    --append-eod --workers 8          # writes data/pile_text_document.bin/.idx
zerotopo data info data/pile_text_document
zerotopo data corpus            # build (or find) the bundled Python-docstring corpus
"""

from __future__ import annotations

import argparse

from zerotopo.data.tokenizers import TOKENIZER_TYPES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    pre = sub.add_parser(
        "preprocess",
        help="tokenize jsonl files into <prefix>_<key>_document.bin/.idx (NeoX's preprocess_data.py)",
    )
    pre.add_argument(
        "--input",
        required=True,
        help="comma-separated jsonl files (.jsonl, .jsonl.gz, .jsonl.xz, .jsonl.zst), read in order",
    )
    pre.add_argument(
        "--jsonl-keys",
        nargs="+",
        default=None,
        help="fields to tokenize, one dataset each (default: text)",
    )
    pre.add_argument("--json-key", help=argparse.SUPPRESS)  # older spelling of one --jsonl-keys key
    pre.add_argument("--num-docs", type=int, help="accepted for NeoX compatibility (a progress hint)")
    pre.add_argument("--output-prefix", required=True, help="outputs are <prefix>_<key>_document.bin/.idx")
    pre.add_argument("--tokenizer-type", default="ByteTokenizer", choices=TOKENIZER_TYPES)
    pre.add_argument(
        "--vocab-file",
        help="tokenizers JSON (HFTokenizer), GPT-2 vocab.json (GPT2BPETokenizer), SentencePiece "
        "tokenizer.model (SPMTokenizer) or a tiktoken encoding name (TiktokenTokenizer)",
    )
    pre.add_argument("--merge-file", help="GPT-2 merges.txt (GPT2BPETokenizer)")
    pre.add_argument(
        "--eod-token",
        default=None,
        help="name of the end-of-document token (HFTokenizer, SPMTokenizer, TiktokenTokenizer), e.g. "
        "'<|end_of_text|>' for Llama 3 (default: the first known end-of-document token the vocabulary has)",
    )
    pre.add_argument(
        "--append-eod",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="end every document with the end-of-document token (default off, as in NeoX)",
    )
    pre.add_argument("--ftfy", action="store_true", help="fix text with ftfy first (needs ftfy)")
    pre.add_argument("--dataset-impl", default="mmap", choices=["mmap"], help="only mmap (NeoX's default)")
    pre.add_argument("--workers", type=int, default=1, help="tokenizing processes (default 1)")
    pre.add_argument("--log-interval", type=int, default=10_000, help="documents between progress lines")
    pre.add_argument("--no-progress", action="store_true", help="no progress output")
    info = sub.add_parser("info", help="print the size and dtype of an indexed dataset")
    info.add_argument("prefix", help="dataset path without .bin/.idx")
    corpus = sub.add_parser(
        "corpus", help="build the bundled corpus from Python's docstrings and print its prefix"
    )
    corpus.add_argument("--tokenizer-type", default="ByteTokenizer", choices=["ByteTokenizer"])


def run(args: argparse.Namespace) -> int:
    if args.data_command == "preprocess":
        from zerotopo.data.preprocess import preprocess_neox
        from zerotopo.errors import ZerotopoError

        if args.workers < 1 or args.log_interval < 1:
            raise ZerotopoError("--workers and --log-interval must be at least 1")
        keys = list(args.jsonl_keys or []) + ([args.json_key] if args.json_key else [])
        stats = preprocess_neox(
            [p.strip() for p in args.input.split(",") if p.strip()],
            args.output_prefix,
            tokenizer_type=args.tokenizer_type,
            vocab_file=args.vocab_file,
            merge_file=args.merge_file,
            eod_token=args.eod_token,
            jsonl_keys=keys or ["text"],
            append_eod=args.append_eod,
            workers=args.workers,
            ftfy=args.ftfy,
            log_interval=args.log_interval,
            progress=not args.no_progress,
        )
        for s in stats:
            print(f"wrote {s.prefix}.bin/.idx: {s.documents} documents, {s.tokens} tokens, {s.dtype}")
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
