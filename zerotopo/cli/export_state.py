"""``zerotopo export``: a checkpoint as one consolidated safetensors state dict or a standard torch DCP
directory, for tools outside zerotopo (``export-hf`` writes a Hugging Face directory instead).

  zerotopo export checkpoints model.safetensors --format safetensors
  zerotopo export checkpoints/step_100 model_dcp --format dcp --optimizer
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = __doc__.split("\n\n", 1)[1]
    p.add_argument("checkpoint", help="a step directory, or a save: directory (its latest is exported)")
    p.add_argument("out", help="new output file (safetensors) or directory (dcp); never overwritten")
    p.add_argument(
        "--format",
        required=True,
        choices=("safetensors", "dcp"),
        help="safetensors: one file of whole weights; dcp: a torch.distributed.checkpoint directory that "
        "dcp.load and format_utils.dcp_to_torch_save read",
    )
    p.add_argument(
        "--dtype", default="fp32", choices=("fp32", "bf16", "fp16"), help="stored dtype (default fp32)"
    )
    p.add_argument(
        "--optimizer",
        action="store_true",
        help="dcp: also the optimizer's per-element states, as <state>/<name> (AdamW: exp_avg/, exp_avg_sq/; "
        "SGD: momentum_buffer/; ...: those of the optimizer that wrote the checkpoint)",
    )


def run(args: argparse.Namespace) -> int:
    from zerotopo.errors import ConfigError
    from zerotopo.trainer.export_state import export_dcp, export_safetensors

    if args.format == "safetensors":
        if args.optimizer:
            raise ConfigError(
                "--optimizer goes with --format dcp; safetensors holds the weights", source="--optimizer"
            )
        path = export_safetensors(args.checkpoint, args.out, dtype=args.dtype)
    else:
        path = export_dcp(args.checkpoint, args.out, dtype=args.dtype, optimizer=args.optimizer)
    print(f"wrote {path}")
    return 0
