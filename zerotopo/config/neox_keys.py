"""GPT-NeoX keys that are no field of the config tree, in one place.

Every NeoX key is honoured (a key of :data:`zerotopo.config.neox.KEYS`: a field of the tree or one of its
blocks), accepted without effect
(:data:`NO_EFFECT_KEYS`, with the reason), or refused before any rank starts unless it holds NeoX's
default, where it changes nothing (:data:`REFUSED_UNLESS_DEFAULT`, with what to do instead). Any other
key is an error naming it. ``zerotopo config keys`` prints these tables; docs/configs.md is generated
from them.
"""

from __future__ import annotations

from typing import Any

# NeoX keys that select kernels, launchers or bookkeeping but not what is computed.
NO_EFFECT_KEYS: dict[str, str] = {
    "data_impl": "zerotopo reads mmap indexed datasets only (NeoX's default)",
    "distributed_backend": "the backend follows the device (NCCL/RCCL on GPUs, gloo on CPU)",
    "steps_per_print": "DeepSpeed's own print interval; log_interval sets zerotopo's",
    "wall_clock_breakdown": "DeepSpeed's timers; zerotopo's ledger times every collective",
    "scaled_upper_triang_masked_softmax_fusion": "a fused kernel of the same softmax",
    "scaled_masked_softmax_fusion": "a fused kernel of the same softmax",
    "rope_fusion": "a fused kernel of the same rotary embedding",
    "layernorm_fusion": "a fused kernel of the same LayerNorm",
    "bias_dropout_fusion": "a fused kernel of bias and dropout (dropout is 0 here)",
    "apply_query_key_layer_scaling": "a rescaling of the same attention scores for fp16 range",
    "checkpoint_num_layers": "activation checkpointing recomputes one layer at a time",
    "partition_activations": "model-parallel activation partitioning; zerotopo has no model parallelism",
    "synchronize_each_layer": "a debugging barrier",
    "output_layer_parallelism": "model-parallel layout of the output layer",
    "contiguous_checkpointing": "memory layout of checkpointed activations",
    "num_workers": "data-loader worker processes; zerotopo reads the mmap files in the training process",
    "launcher": "NeoX's deepy.py launcher choice; zerotopo detects srun, mpiexec and torchrun",
    "deepspeed_mpi": "NeoX's deepy.py launcher choice; zerotopo detects srun, mpiexec and torchrun",
    "deepspeed_slurm": "NeoX's deepy.py launcher choice; zerotopo detects srun, mpiexec and torchrun",
    "hostfile": "launcher host list; the launcher (srun, mpiexec, torchrun) places the ranks",
    "include": "launcher host filter; the launcher places the ranks",
    "exclude": "launcher host filter; the launcher places the ranks",
    "num_gpus": "launcher device count; the launcher's task count sets the ranks",
    "master_port": "launcher rendezvous; zerotopo takes MASTER_PORT or derives it from the job",
    "master_addr": "launcher rendezvous; zerotopo takes MASTER_ADDR or the launcher's first host",
    "force_multi": "launcher switch",
    "detect_nvlink_pairs": "launcher device grouping; the topology file describes the tiers",
    "comment": "free text",
    "config_files": "the config texts NeoX stores in its saved configs",
    "git_hash": "NeoX's code version, stored for reference",
    "mmap_warmup": "page-cache warm-up of the data files",
    "skip_warmup": "page-cache warm-up of the data files",
    "zero_allow_untested_optimizer": "a DeepSpeed safety switch for custom optimizers",
    "log_grad_norm": "extra logging; metrics.csv has the gradient norm of every step",
    "log_param_norm": "extra logging",
    "log_optimizer_states": "extra logging",
    "log_grad_pct_zeros": "extra logging",
    "log_gradient_noise_scale": "extra logging",
    "memory_profiling": "NeoX's memory snapshots; metrics.csv has a per-step peak memory column",
    "profile": "NeoX's profiler switch; `zerotopo bench` profiles the step",
    "profile_step_start": "NeoX's profiler window",
    "profile_step_stop": "NeoX's profiler window",
    "wandb_init_all_ranks": "W&B is written by rank 0 only",
    "eval_tasks": "NeoX's evaluation-harness tasks (run by NeoX's eval.py, not during training)",
    "eval_results_prefix": "NeoX's evaluation-harness output name",
    "checkpoint_validation_with_forward_pass": "a check NeoX runs at save time",
    "rotary_save_freqs_buffer": "whether NeoX stores the rotary frequencies in checkpoints",
    "global_num_gpus": "launcher device count; the launcher's task count sets the ranks",
    "memory_profiling_path": "where NeoX writes its memory snapshots (memory_profiling has no effect either)",
    "use_comet": "Comet logging is not implemented; metrics.csv, TensorBoard and W&B carry the metrics",
    "comet_workspace": "Comet logging (not implemented)",
    "comet_project": "Comet logging (not implemented)",
    "comet_experiment_name": "Comet logging (not implemented)",
    "comet_tags": "Comet logging (not implemented)",
    "comet_others": "Comet logging (not implemented)",
    "text_gen_type": "read by NeoX's generate.py, not by training",
    "maximum_tokens": "read by NeoX's generate.py, not by training",
    "prompt_end": "read by NeoX's generate.py, not by training",
    "temperature": "read by NeoX's generate.py, not by training",
    "top_p": "read by NeoX's generate.py, not by training",
    "top_k": "read by NeoX's generate.py, not by training",
    "recompute": "read by NeoX's generate.py, not by training",
    "num_samples": "read by NeoX's generate.py, not by training",
    "sample_input_file": "read by NeoX's generate.py, not by training",
    "sample_output_file": "read by NeoX's generate.py, not by training",
    "allow_chopped": "only read with pack_impl other than packed (refused)",
    "weighted_sampler_alpha": "only read with weight_by_num_documents (refused)",
}

# NeoX keys with a behaviour zerotopo does not implement: NeoX's default value changes nothing and is
# accepted; any other value is refused, saying what to do. ``key: (NeoX's default, what to do)``.
REFUSED_UNLESS_DEFAULT: dict[str, tuple[Any, str]] = {
    "fp16_lm_cross_entropy": (False, "zerotopo computes the loss in fp32; drop the key"),
    "use_bnb_optimizer": (False, "8-bit Adam is not implemented; drop the key to train with AdamW"),
    "use_mup": (False, "muP is not implemented; drop the key"),
    "gradient_predivide_factor": (1.0, "gradients are averaged once after the reduction; drop the key"),
    "prescale_gradients": (False, "gradients are averaged once after the reduction; drop the key"),
    "amp": (None, "use precision: fp16 or bf16 (or the fp16/bf16 blocks)"),
    "no_load_optim": (False, "use finetune: true to load the weights only"),
    "no_load_rng": (False, "drop the key: the data order follows seed and the consumed sample count"),
    "no_save_optim": (False, "drop the key: zerotopo checkpoints always hold the optimizer state"),
    "no_save_rng": (False, "drop the key"),
    "use_checkpoint_lr_scheduler": (
        False,
        "the schedule follows the config's keys (override_lr_scheduler: true); a resume checks that they "
        "are the checkpoint's",
    ),
    "weight_by_num_documents": (False, "give train_data_weights explicitly"),
    "label_data_paths": (None, "separate label datasets are not implemented; drop the key"),
    "pack_impl": ("packed", "zerotopo packs documents as NeoX's packed mode does; drop the key"),
    "dataset_impl": ("gpt2", "only NeoX's gpt2 dataset is implemented; drop the key"),
    "reset_position_ids": (False, "positions run across document boundaries here; drop the key"),
    "reset_attention_mask": (False, "attention runs across document boundaries here; drop the key"),
    "short_seq_prob": (0.0, "drop the key"),
    "char_level_ppl": (False, "drop the key"),
    "soft_prompt_tuning": (None, "soft prompts are not implemented; drop the key"),
    "num_unique_layers": (None, "layer sharing is not implemented; drop the key"),
    "param_sharing_style": ("grouped", "layer sharing is not implemented; drop the key"),
    "opt_pos_emb_offset": (0, "learned OPT position embeddings are not implemented; drop the key"),
    "exit_interval": (None, "set train_iters to the step to stop at"),
    "s3_path": (None, "checkpoints are written to save: only; copy them to S3 afterwards"),
    "use_shared_fs": (True, "save: must be one directory every rank can reach"),
    "padded_vocab_size": (None, "drop the key: the vocabulary is padded by make_vocab_size_divisible_by"),
    "lr_decay_fraction": (None, "use lr_decay_iters"),
    "clip_grad": (1.0, "use gradient_clipping"),
    "zero_stage": (None, "use the zero_optimization block (or plan:)"),
    "moe_num_experts": (1, "mixture of experts is not implemented; drop the key for a dense MLP"),
    "moe_top_k": (1, "mixture of experts is not implemented; drop the key"),
    "moe_router_type": ("sinkhorn", "mixture of experts is not implemented; drop the key"),
    "moe_expert_interval": (1, "mixture of experts is not implemented; drop the key"),
    "moe_lbl_in_fp32": (False, "mixture of experts is not implemented; drop the key"),
    "moe_jitter_eps": (None, "mixture of experts is not implemented; drop the key"),
    "te_columnparallel": (False, "Transformer Engine layers are not implemented; drop the key"),
    "te_rowparallel": (False, "Transformer Engine layers are not implemented; drop the key"),
    "te_layernorm_mlp": (False, "Transformer Engine layers are not implemented; drop the key"),
    "te_mha": (False, "Transformer Engine layers are not implemented; drop the key"),
    "te_fp8_mha": (False, "fp8 (Transformer Engine) is not implemented; drop the key"),
    "te_fp8_format": ("hybrid", "fp8 (Transformer Engine) is not implemented; drop the key"),
    "te_fp8_wgrad": (True, "fp8 (Transformer Engine) is not implemented; drop the key"),
    "te_fp8_amax_history_len": (1, "fp8 (Transformer Engine) is not implemented; drop the key"),
    "te_fp8_amax_compute_algo": ("most_recent", "fp8 (Transformer Engine) is not implemented; drop the key"),
    "te_fp8_margin": (0, "fp8 (Transformer Engine) is not implemented; drop the key"),
}


def refused_value(key: str, value: Any) -> str | None:
    """The reason ``value`` of a :data:`REFUSED_UNLESS_DEFAULT` key is refused, or None when it holds
    NeoX's default (which changes nothing)."""
    default, fix = REFUSED_UNLESS_DEFAULT[key]
    same = value == default or (
        isinstance(default, float) and isinstance(value, (int, float)) and value == default
    )
    if same or (default is None and value in ("", [], {})):
        return None
    return f"{value!r} is not implemented by zerotopo (NeoX's default {default!r} is accepted); {fix}"


def keys_table() -> str:
    """The three tables as text, for ``zerotopo config keys``."""
    from zerotopo.config.neox import KEYS
    from zerotopo.config.neox_defaults import DIFFERS_FROM_NEOX, neox_default_note

    honoured = sorted(KEYS)
    lines = ["Honoured (see docs/configs.md):", "  " + ", ".join(honoured), ""]
    lines.append("Where each honoured key lands in the config tree (zerotopo.config.tree.TrainConfig):")
    lines += [f"  {k:<44} {path}" for k, path in KEYS.items()]
    lines.append("")
    lines.append("Honoured as another key:")
    lines.append(
        f"  {'fp32_allreduce':<44} true is data_types: {{grad_accum_dtype: fp32}} (false: NeoX's default)"
    )
    lines.append("")
    lines.append("Defaults that differ from GPT-NeoX's (every other default is NeoX's):")
    lines += [f"  {k:<44} {neox_default_note(k)}" for k in DIFFERS_FROM_NEOX]
    lines.append("")
    from zerotopo.config.neox import EQUIVALENT_VALUES, UNSUPPORTED_KEYS

    lines.append("Refused where they would change what is trained (what happens):")
    lines += [f"  {k:<44} {v}" for k, v in {**UNSUPPORTED_KEYS, **EQUIVALENT_VALUES}.items()]
    lines.append("")
    lines.append("Accepted without effect:")
    lines += [f"  {k:<44} {v}" for k, v in NO_EFFECT_KEYS.items()]
    lines += ["", "Refused unless NeoX's default (default: what to do):"]
    lines += [f"  {k:<44} {d!r}: {fix}" for k, (d, fix) in REFUSED_UNLESS_DEFAULT.items()]
    return "\n".join(lines)
