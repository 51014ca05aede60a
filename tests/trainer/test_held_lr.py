"""The learning rate holds on an fp16 step the loss scaler skipped, as DeepSpeed's scheduler (so NeoX's)
does not step then; without a scaler it is the schedule at the step."""

from __future__ import annotations

import types

import torch

from zerotopo.trainer.lr_schedule import LRSchedule, held_schedule


def test_lr_follows_applied_steps_under_a_loss_scaler():
    schedule = LRSchedule.from_args(lr=1e-3, min_lr=1e-4, warmup=0.2, decay_iters=10, style="cosine")
    applied = torch.zeros((), dtype=torch.float64)
    optimizer = types.SimpleNamespace(scaler=object(), _device_steps=applied)
    lr_at = held_schedule(schedule, 10, optimizer)
    seen = []
    for step, skipped in enumerate([False, True, True, False, False]):
        lr = lr_at(step)
        assert isinstance(lr, torch.Tensor)  # looked up on the device: no host wait for the flag
        seen.append(float(lr))
        applied += 0 if skipped else 1  # what the engine's step does with the overflow flag
    assert seen == [schedule(0), schedule(1), schedule(1), schedule(1), schedule(2)]


def test_without_a_scaler_the_schedule_is_used_as_is():
    schedule = LRSchedule.from_args(lr=1e-3, min_lr=0.0, warmup=0.0, decay_iters=10, style="linear")
    assert held_schedule(schedule, 10, types.SimpleNamespace(scaler=None)) is schedule


def _sgd(lr: float = 1e-3) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr)


def test_schedule_lr_sets_the_schedule_bit_for_bit_and_resumes_at_the_start_step():
    """The trainer's torch scheduler: step ``k`` runs with ``schedule(k)`` exactly (no peak x factor
    rounding), and a resumed run's first step with ``schedule(start_step)``."""
    from zerotopo.trainer.lr_schedule import ScheduleLR

    schedule = LRSchedule.from_args(lr=1e-3, min_lr=1e-4, warmup=0.3, decay_iters=10, style="cosine")
    opt = _sgd()
    sched = ScheduleLR(opt, schedule)
    seen = []
    for _ in range(10):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == [schedule(k) for k in range(10)]
    opt = _sgd()
    sched = ScheduleLR(opt, schedule, start_step=4)
    assert opt.param_groups[0]["lr"] == schedule(4)
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == schedule(5)


def test_schedule_lr_holds_on_skipped_steps_without_reading_the_flag():
    from zerotopo.trainer.lr_schedule import ScheduleLR

    schedule = LRSchedule.from_args(lr=1e-3, min_lr=1e-4, warmup=0.2, decay_iters=10, style="cosine")
    applied = torch.zeros((), dtype=torch.float64)
    opt = _sgd()
    opt.scaler, opt._device_steps = object(), applied
    sched = ScheduleLR(opt, held_schedule(schedule, 10, opt))
    seen = []
    for skipped in [False, True, True, False, False]:
        lr = opt.param_groups[0]["lr"]
        assert isinstance(lr, torch.Tensor)
        seen.append(float(lr))
        applied += 0 if skipped else 1
        opt.step()
        sched.step()
    assert seen == [schedule(0), schedule(1), schedule(1), schedule(1), schedule(2)]
