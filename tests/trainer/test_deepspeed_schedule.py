"""The DeepSpeed ``scheduler`` block (WarmupLR, WarmupDecayLR) gives the learning rates DeepSpeed's own
schedulers give, step for step, as DeepSpeed's engine steps them (scheduler stepped after each optimizer
step)."""

from __future__ import annotations

import pytest
import torch

from zerotopo.config.neox import load_neox_config
from zerotopo.errors import ConfigError
from zerotopo.trainer.lr_schedule import DeepSpeedWarmupSchedule, deepspeed_schedule, schedule_for

lr_schedules = pytest.importorskip("deepspeed.runtime.lr_schedules")


def deepspeed_lrs(kind: str, params: dict, lr: float, steps: int) -> list[float]:
    """The lr each optimizer step runs with under DeepSpeed's scheduler."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = getattr(lr_schedules, kind)(opt, **params)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])  # what optimizer.step() uses
        sched.step()
    return out


CASES = [
    ("WarmupLR", {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-3, "warmup_num_steps": 10}),
    ("WarmupLR", {"warmup_min_lr": 1e-5, "warmup_num_steps": 7, "warmup_type": "linear"}),
    ("WarmupLR", {"warmup_num_steps": 1}),
    (
        "WarmupDecayLR",
        {"total_num_steps": 40, "warmup_min_lr": 1e-5, "warmup_max_lr": 6e-4, "warmup_num_steps": 8},
    ),
    ("WarmupDecayLR", {"total_num_steps": 30, "warmup_num_steps": 5, "warmup_type": "linear"}),
]


@pytest.mark.parametrize("kind, params", CASES)
def test_matches_deepspeed(kind, params):
    lr = 3e-4
    ours = deepspeed_schedule({"type": kind, "params": params}, lr=lr)
    want = deepspeed_lrs(kind, params, lr, 50)
    assert [ours(step) for step in range(50)] == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_block_in_a_config_wins_over_neox_keys(tmp_path):
    path = tmp_path / "c.yml"
    path.write_text(
        "optimizer: {type: Adam, params: {lr: 0.0006}}\nlr_decay_style: cosine\ntrain_iters: 20\n"
        "scheduler: {type: WarmupDecayLR, params: {total_num_steps: 20, warmup_max_lr: 0.0006, "
        "warmup_num_steps: 4, warmup_type: linear}}\n"
    )
    args = load_neox_config([path])
    sched = schedule_for(args, 20)
    assert isinstance(sched, DeepSpeedWarmupSchedule)
    want = deepspeed_lrs("WarmupDecayLR", args.optim.scheduler["params"], 6e-4, 20)
    assert [sched(s) for s in range(20)] == pytest.approx(want)
    path.write_text("optimizer: {type: Adam, params: {lr: 0.0006}}\ntrain_iters: 20\n")
    assert not isinstance(schedule_for(load_neox_config([path]), 20), DeepSpeedWarmupSchedule)


@pytest.mark.parametrize(
    "block, fragment",
    [
        ({"type": "OneCycle", "params": {}}, "WarmupLR and WarmupDecayLR"),
        ({"type": "WarmupDecayLR", "params": {"warmup_num_steps": 5}}, "total_num_steps"),
        ({"type": "WarmupLR", "params": {"warmup_num_step": 5}}, "warmup_num_step"),
        ({"type": "WarmupLR", "params": {"warmup_type": "cosine"}}, "log or linear"),
        ({"type": "WarmupLR", "params": {"warmup_num_steps": 0}}, "positive"),
    ],
)
def test_bad_blocks(block, fragment):
    with pytest.raises(ConfigError, match=fragment):
        deepspeed_schedule(block, lr=1e-3)
