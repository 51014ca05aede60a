"""``zerotopo export-hf``: a checkpoint as a Hugging Face directory: ``GPTNeoXForCausalLM``, or
``LlamaForCausalLM`` for a Llama- or Mistral-style model (RMSNorm, gated SiLU MLP, full rotary).

Reads the sharded checkpoint one output file at a time (no process builds the whole model) and writes
``model.safetensors`` or ``model-0000k-of-0000N.safetensors`` + ``model.safetensors.index.json``,
``config.json`` with the tokenizer's ``bos``/``eos`` ids, and the run's tokenizer files, so
``AutoModelForCausalLM.from_pretrained(OUT)`` (and ``AutoTokenizer`` for a Hugging Face or GPT-2 BPE
tokenizer) opens it.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="a step directory, or a save: directory (its latest is exported)")
    p.add_argument("out", help="new output directory (must not exist or be empty)")
    p.add_argument(
        "--max-shard-size",
        default="5GB",
        help="split the weights into files of at most this size, as transformers does (default 5GB)",
    )
    p.add_argument(
        "--dtype", default="fp32", choices=("fp32", "bf16", "fp16"), help="stored dtype (default fp32)"
    )


def run(args: argparse.Namespace) -> int:
    from zerotopo.checkpoint.hf import export_hf
    from zerotopo.sizes import parse_size

    files = export_hf(
        args.checkpoint, args.out, max_shard_bytes=parse_size(args.max_shard_size), dtype=args.dtype
    )
    print(f"wrote {args.out}: " + ", ".join(f.name for f in files))
    return 0
