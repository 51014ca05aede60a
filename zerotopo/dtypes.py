"""The one dtype table: the short precision names configs, flags and codecs use (``fp32``, ``bf16``,
``fp16``) and the torch names checkpoints store (``float32``, ``bfloat16``, ``int64``, ...)."""

from __future__ import annotations

import torch

PRECISIONS: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
"""Short precision name -> torch dtype (a config's ``precision``, ``--dtype`` flags, plain codecs)."""

STORED: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
    "int8": torch.int8,
    "bool": torch.bool,
}
"""torch's own dtype name (``str(dtype)`` without ``torch.``) -> dtype, for every dtype a checkpoint
stores."""

STORED_NAMES: dict[torch.dtype, str] = {v: k for k, v in STORED.items()}
"""The inverse of :data:`STORED`."""
