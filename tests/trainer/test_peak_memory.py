"""Measured peak memory per rank next to the cost model's prediction: the probe itself, and a 2-step
tiny ``zerotopo train`` that reports both in ``summary.json``."""

from __future__ import annotations

import json

import pytest
import torch

from zerotopo.cli.main import main
from zerotopo.trainer.peak import PeakMemory


def test_probe_sees_an_allocation_above_its_baseline():
    probe = PeakMemory(torch.device("cpu"))
    assert probe.baseline > 0
    before = probe.peak()
    x = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    grown = probe.peak() - before
    del x
    assert 60 * 2**20 <= grown <= 100 * 2**20, grown / 2**20
    # a peak: freeing does not lower it (the kernel syncs per-thread RSS counters lazily: ~1 MiB slack)
    assert probe.peak() >= grown - 2**20


@pytest.mark.slow
def test_train_reports_measured_and_predicted_peak(tmp_path, capsys):
    run = tmp_path / "run"
    sets = ["train_iters=2", "log_interval=1", "eval_iters=0", "num_layers=2", "hidden_size=64"]
    argv = ["train", "--run-dir", str(run), "--no-progress", "--json"]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == 0
    capsys.readouterr()
    summary = json.loads((run / "summary.json").read_text())
    peak = summary["memory_peak"]
    assert len(peak["measured_bytes_per_rank"]) == len(peak["baseline_bytes_per_rank"]) == 8
    # every rank measured something above its baseline, and far below a GiB for this model
    assert all(0 < m < 2**30 for m in peak["measured_bytes_per_rank"])
    assert all(b > 50 * 2**20 for b in peak["baseline_bytes_per_rank"])  # interpreter + torch
    # the prediction is the cost model's for this run's units, plan and batch
    from zerotopo.cost.memory import memory_per_device
    from zerotopo.trainer.job import TrainJob

    job = TrainJob(overrides=dict(s.split("=") for s in sets))
    args = job.load_args(quiet=True)
    topo = job.load_topology(args)
    plan = job.load_plan(args)
    from zerotopo.data.tokenizers import build_tokenizer

    cfg = args.model.model_config(build_tokenizer(args.data.tokenizer_type, args.data.vocab_file).vocab_size)
    shape = cfg.shape(args.model.seq_length)
    micro, _, _ = args.batch.batch_sizes(topo.world_size)
    pred = memory_per_device(
        shape.unit_params(), topo, plan, param_bytes=4, micro_batch=micro, shape=shape,
        checkpoint_activations=args.model.checkpoint_activations,
    )  # fmt: skip
    assert peak["predicted_bytes"] == pytest.approx(pred.total)
    assert peak["predicted"]["grads"] == pred.grads > 0
