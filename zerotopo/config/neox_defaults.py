"""Where a default of an honoured key is not GPT-NeoX's, and why.

Every other default of a key of :data:`zerotopo.config.neox.KEYS` (and of the ``optimizer`` and ``fp16``
blocks) equals GPT-NeoX's (``megatron/neox_arguments/neox_args.py``, and DeepSpeed's for the keys NeoX
passes on to it: ``deepspeed_args.py``). ``zerotopo config keys`` prints this table and docs/configs.md
is generated from it, so a config that leaves one of these keys out says, in both places, that it trains
differently here than in GPT-NeoX.
"""

from __future__ import annotations

from typing import Any

#: ``key: (GPT-NeoX's default, why zerotopo's differs and what it means)``. ``None`` as NeoX's default
#: of a model size means NeoX requires the key.
DIFFERS_FROM_NEOX: dict[str, tuple[Any, str]] = {
    "num_layers": (None, "zerotopo's default is a tiny model's, so that a few keys train"),
    "hidden_size": (None, "zerotopo's default is a tiny model's, so that a few keys train"),
    "num_attention_heads": (
        None,
        "zerotopo's default is a tiny model's, so that a few keys train",
    ),
    "seq_length": (None, "zerotopo's default is a tiny model's, so that a few keys train"),
    "train_iters": (None, "zerotopo trains 100 steps when it is not set (NeoX takes train_epochs instead)"),
    "pos_emb": (
        "learned",
        "zerotopo implements rotary position embeddings only; a config without pos_emb trains rotary here "
        "where NeoX would learn position embeddings (every published NeoX model config sets it)",
    ),
    "no_weight_tying": (
        False,
        "zerotopo's default stays untied so that configs and checkpoints written before tied embeddings "
        "trained here keep their meaning; set no_weight_tying: false for NeoX's tied default (every "
        "released NeoX/Pythia config sets no_weight_tying: true)",
    ),
    "mlp_multiple_of": (
        1,
        "not set means 1, as in NeoX, except with mlp_type llama, where it means 256: the rounding of the "
        "older NeoX LLaMAParallelMLP that mlp_type llama reproduces",
    ),
    "gradient_accumulation_steps": (
        1,
        "not set means derived from train_batch_size when that is given, else 1 (DeepSpeed's rule)",
    ),
    "optimizer.type": (
        "Adam",
        "AdamW trains the same: NeoX's Adam is FusedAdam in its default AdamW mode (decoupled weight decay)",
    ),
    "override_lr_scheduler": (
        False,
        "not set means the schedule follows the config on a resume and a notice names the keys that differ "
        "from the checkpoint's (a run resumed with more train_iters continues); set false for NeoX's check, "
        "which refuses such a resume",
    ),
    "wandb_host": ("https://api.wandb.ai", "not set means wandb's own server, which is that address"),
}


def neox_default_note(key: str) -> str | None:
    """The sentence ``zerotopo config keys`` prints for ``key``, or None when its default is NeoX's."""
    if key not in DIFFERS_FROM_NEOX:
        return None
    neox, why = DIFFERS_FROM_NEOX[key]
    shown = "GPT-NeoX requires it" if neox is None else f"GPT-NeoX's default {neox!r}"
    return f"{shown}: {why}"
