"""Every default of an honoured key is GPT-NeoX's, or is listed (with the reason) as one that differs."""

from __future__ import annotations

import dataclasses

import pytest

from zerotopo.config.neox import KEYS
from zerotopo.config.neox_defaults import DIFFERS_FROM_NEOX
from zerotopo.config.neox_keys import keys_table
from zerotopo.config.reference import render
from zerotopo.config.tree import FP16Config, OptimizerConfig, TrainConfig, field_at

# GPT-NeoX's defaults, recorded from EleutherAI/gpt-neox (Apache-2.0) at commit ea7aefd8f8e1:
# megatron/neox_arguments/neox_args.py, and deepspeed_args.py for the keys NeoX hands to DeepSpeed. The
# optimizer block's are arguments.py's OPT_DEFAULT / OPT_PARAMS_DEFAULTS (lr; betas and eps are
# FusedAdam's, the same); the fp16 block's are DeepSpeed's. None: not set (for a model size: required).
NEOX_DEFAULTS: dict[str, object] = {
    # neox_args.py, NeoXArgsParallelism
    "pipe_parallel_size": 0,
    "model_parallel_size": 1,
    # neox_args.py, NeoXArgsModel
    "precision": None,
    "num_layers": None,
    "hidden_size": None,
    "intermediate_size": None,
    "mlp_multiple_of": 1,
    "num_attention_heads": None,
    "num_kv_heads": None,
    "seq_length": None,
    "max_position_embeddings": None,
    "norm": "layernorm",
    "use_bias_in_norms": True,
    "layernorm_epsilon": 1.0e-5,
    "rms_norm_epsilon": 1.0e-8,
    "pos_emb": "learned",
    "no_weight_tying": False,
    "make_vocab_size_divisible_by": 128,
    "activation": "gelu",
    "rotary_pct": 1.0,
    "rotary_emb_base": 10000,
    "init_method": "normal",
    "output_layer_init_method": "scaled_normal",
    "init_method_std": 0.02,
    "bias_gelu_fusion": False,
    "gpt_j_residual": False,
    "use_bias_in_attn_linear": True,
    "use_bias_in_mlp": True,
    # neox_args.py, NeoXArgsLRScheduler
    "lr_decay_style": "linear",
    "lr_decay_iters": None,
    "min_lr": 0.0,
    "warmup": 0.01,
    "override_lr_scheduler": False,
    # neox_args.py, NeoXArgsLogging
    "use_wandb": None,
    "wandb_group": None,
    "wandb_team": None,
    "wandb_project": "neox",
    "wandb_host": "https://api.wandb.ai",
    "log_dir": None,
    "tensorboard_dir": None,
    "log_interval": 100,
    # neox_args.py, NeoXArgsOther
    "eod_mask_loss": False,
    "seed": 1234,
    # neox_args.py, NeoXArgsTokenizer
    "tokenizer_type": "GPT2BPETokenizer",
    # neox_args.py, NeoXArgsTraining
    "data_path": None,
    "train_data_paths": None,
    "valid_data_paths": None,
    "test_data_paths": None,
    "train_data_weights": None,
    "valid_data_weights": None,
    "test_data_weights": None,
    "vocab_file": None,
    "merge_file": None,
    "split": "969, 30, 1",
    "save": None,
    "load": None,
    "checkpoint_factor": None,
    "checkpoint_scale": "linear",
    "extra_save_iters": None,
    "keep_last_n_checkpoints": None,
    "finetune": False,
    "train_iters": None,
    "eval_iters": 100,
    "eval_interval": 1000,
    "weight_decay": 0.1,
    "checkpoint_activations": False,
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
    # deepspeed_args.py
    "train_batch_size": None,
    "train_micro_batch_size_per_gpu": None,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 1.0,
    "zero_optimization": None,
    "scheduler": None,
    "bf16.enabled": False,
    "data_types.grad_accum_dtype": None,
    # arguments.py (OPT_DEFAULT, OPT_PARAMS_DEFAULTS)
    "optimizer.type": "Adam",
    "optimizer.params.lr": 0.001,
    "optimizer.params.betas": (0.9, 0.999),
    "optimizer.params.eps": 1.0e-8,
    # DeepSpeed's fp16 block
    "fp16.enabled": False,
    "fp16.loss_scale": 0.0,
    "fp16.initial_scale_power": 16,
    "fp16.loss_scale_window": 1000,
    "fp16.hysteresis": 2,
    "fp16.min_loss_scale": 1.0,
}

# Honoured keys GPT-NeoX does not have: zerotopo's own (OLMo-2's qk_norm and post_norm among them),
# DeepSpeed's scheduler spelling, the older save_interval and the older mlp_type.
ZEROTOPO_ONLY = {
    "mlp_type", "eod_token", "save_interval", "strict_saves", "async_save", "fresh_start", "topology", "plan", "num_nodes",
    "optimizer.params.weight_decay", "qk_norm", "post_norm",
}  # fmt: skip


def zerotopo_defaults() -> dict[str, object]:
    """Every honoured key with zerotopo's default, named as a config writes it."""
    out: dict[str, object] = {}
    for key, path in KEYS.items():
        if key in ("optimizer", "fp16"):
            continue
        out[key] = field_at(path).default
    for f in dataclasses.fields(OptimizerConfig):
        if f.name != "options":
            out["optimizer.type" if f.name == "type" else f"optimizer.params.{f.name}"] = f.default
    for f in dataclasses.fields(FP16Config):
        out[f"fp16.{f.name}"] = f.default
    return out


def _same(ours: object, neox: object) -> bool:
    if isinstance(neox, str) and isinstance(ours, tuple):  # split: NeoX's string, normalized here
        weights = [float(x) for x in neox.split(",")]
        return all(abs(a - w / sum(weights)) < 1e-12 for a, w in zip(ours, weights))
    return ours == neox and type(ours) is not bool or ours is neox


@pytest.mark.parametrize("key", sorted(zerotopo_defaults()))
def test_default_is_neox_or_listed_as_differing(key):
    ours = zerotopo_defaults()[key]
    if key in ZEROTOPO_ONLY:
        assert key not in NEOX_DEFAULTS
        return
    assert key in NEOX_DEFAULTS, f"{key}: record GPT-NeoX's default or list it as zerotopo's own"
    neox = NEOX_DEFAULTS[key]
    if key in DIFFERS_FROM_NEOX:
        assert DIFFERS_FROM_NEOX[key][0] == neox, f"{key}: the listed NeoX default is not NeoX's"
        # None here means zerotopo derives the value (train_iters: 100 steps), which is the difference
        assert ours is None or not _same(ours, neox), f"{key}: listed as differing but equals NeoX's {neox!r}"
    else:
        assert _same(ours, neox), f"{key}: zerotopo {ours!r}, GPT-NeoX {neox!r}; match it or list it"


def test_rotary_pct_and_weight_decay_follow_neox_when_not_set():
    args = TrainConfig()
    assert (args.model.rotary_pct, args.optim.weight_decay, args.optim.lr, args.optim.optimizer.betas) == (
        1.0,
        0.1,
        1e-3,
        (0.9, 0.999),
    )
    assert args.model.model_config(256).rotary_pct == 1.0


def test_differing_defaults_are_printed_and_documented():
    table, doc = keys_table(), render()
    assert "Defaults that differ from GPT-NeoX's" in table and "Defaults that differ from GPT-NeoX's" in doc
    for key in DIFFERS_FROM_NEOX:
        assert key in table.split("Defaults that differ")[1].split("Accepted without effect")[0]
        assert f"| `{key}` |" in doc.split("## Defaults that differ")[1]
    assert "| `rotary_pct` | `model.rotary_pct` | `1.0` |" in doc
    assert "`'rotary'` (NeoX: `'learned'`)" in doc
